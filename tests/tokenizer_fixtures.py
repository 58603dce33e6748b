"""Tokenizer fixtures the Python reference checks share (tokenizer_check.py, dataset_check.py):
the pre-tokenizer split patterns of Llama 3 and Qwen2, BPE training on a corpus, the split-then-
byte-level pre-tokenizer of those models, and the <0xXX> tokens of byte fallback.

Needs Hugging Face `tokenizers`: import it where the script imports tokenizers (after
test_venv.reexec_or_skip has had its chance), so a missing package is reported the same way."""
from tokenizers import Regex, pre_tokenizers, trainers

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(tok, corpus, vocab_size, specials, byte_level=True, limit_alphabet=None):
    """Trains `tok`'s BPE model on `corpus` (a list of strings); byte-level models start from the
    256 byte symbols."""
    kw = dict(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if limit_alphabet:
        kw["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(corpus, trainers.BpeTrainer(**kw))


def split_then_byte_level(pat):
    """Llama 3's and Qwen2's pre-tokenizer: split by `pat`, then map bytes (no regex of its own)."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def add_byte_fallback_tokens(j):
    """Adds the 256 <0xXX> tokens byte fallback needs to tokenizer.json `j`, after every id in
    use."""
    vocab = j["model"]["vocab"]
    nxt = max(max(vocab.values()), max((a["id"] for a in j["added_tokens"]), default=0)) + 1
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = nxt
            nxt += 1
