#!/usr/bin/env python3
"""ferry's tokenizers against independent implementations.

Builds tokenizer.json files with Hugging Face `tokenizers` (small BPE models trained here on
generated text, in the styles of GPT-2, Llama 3, Qwen2, Llama 2 and Mistral, with added and special
tokens), then compares `ferry tokenize --jsonl` with `tokenizers` on thousands of strings (ids,
byte offsets, decode), and compares ferry on a GPT-2 tokenizer.json built from the real GPT-2
ranks (gpt2.tiktoken from the openai-whisper package) with `tiktoken`.

Exit codes: 0 all equal, 1 a mismatch or failure, 77 skipped (the Python packages or the
whisper archive are unavailable; the reason is printed).
"""
import base64
import json
import os
import random
import resource
import subprocess
import sys
import tarfile
import zipfile

from test_venv import Tally, argument_parser, reexec_or_skip, skip

ap = argument_parser("tokenizers and tiktoken")
ap.add_argument("--strings", type=int, default=1000, help="test strings per tokenizer")
args = ap.parse_args()

try:
    import tiktoken
    import tokenizers
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors
    from tokenizer_fixtures import (LLAMA3_PAT, QWEN_PAT, add_byte_fallback_tokens,
                                    split_then_byte_level)
    import tokenizer_fixtures
except ImportError as e:
    reexec_or_skip(args.venv, e, "tokenizers/tiktoken")

os.makedirs(args.work, exist_ok=True)
rng = random.Random(1234)

# ---- test text -----------------------------------------------------------------------------
WORDS = ("the quick brown fox jumps over a lazy dog I'm you're they'll we've she's don't "
         "HELLO World THEY'RE naïve café résumé Straße Ωmega ÅNGSTRÖM fine-tune GPU tokens "
         "hello_world foo_bar x").split()
CJK = "中文字符测试日本語のテキスト한국어텍스트汉字"
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖", "🦀"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "\u0915\u094d\u0937", "\u212b", "o\u0302\u0323"]
SPACES = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
          "\u2009", "    \n"]
PUNCT = list(".,;:!?()[]{}\"'-_/\\@#$%^&*+=<>|~`") + ["...", "--", "'s", "'LL"]


def piece(specials):
    r = rng.random()
    if r < 0.40:
        return rng.choice(WORDS)
    if r < 0.50:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 6)))
    if r < 0.56:
        return rng.choice(EMOJI)
    if r < 0.62:
        return rng.choice(WORDS)[:3] + rng.choice(COMBINING)
    if r < 0.72:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if r < 0.84:
        return rng.choice(PUNCT)
    if r < 0.92 or not specials:
        return rng.choice(SPACES)
    return rng.choice(specials)


def make_string(specials):
    out = []
    for _ in range(rng.randint(0, 14)):
        out.append(piece(specials))
        if rng.random() < 0.6:
            out.append(" ")
    return "".join(out)


def corpus(n):
    return [make_string([]) for _ in range(n)]


TRAIN = corpus(3000) + ["The quick brown fox jumps over the lazy dog. " * 3] * 50

# ---- tokenizers built here -----------------------------------------------------------------
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def train(tok, vocab_size, specials, byte_level=True, limit_alphabet=None):
    tokenizer_fixtures.train(tok, TRAIN, vocab_size, specials, byte_level, limit_alphabet)


def edit_json(tok, fn):
    j = json.loads(tok.to_str())
    fn(j)
    # Through tokenizers once more: the file then holds the ids tokenizers itself assigns.
    tok = Tokenizer.from_str(json.dumps(j))
    return tok, json.loads(tok.to_str())


def gpt2_style():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    train(t, 700, ["<|endoftext|>"])
    t.add_tokens([AddedToken("foo_bar", single_word=True, normalized=False)])

    def strings(j):  # merges written as "a b" strings, as older files do
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    return edit_json(t, strings)


def gpt2_prefix_space():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    train(t, 600, ["<|endoftext|>", "<mask>"])
    t.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=False),
                          AddedToken("<|user|>", rstrip=True)])
    t.add_tokens([AddedToken(" the fox", normalized=False)])

    def pairs(j):  # merges as ["a", "b"] pairs
        j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    return edit_json(t, pairs)


def add_whole_words(j, words):
    """Adds whole byte-level words to the vocabulary without merges (what ignore_merges acts on)."""
    enc = bytes_to_unicode()
    vocab = j["model"]["vocab"]
    nxt = max(max(vocab.values()), max((a["id"] for a in j["added_tokens"]), default=0)) + 1
    for w in words:
        s = "".join(enc[b] for b in w.encode())
        if s not in vocab:
            vocab[s] = nxt
            nxt += 1


def llama3_style():
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = split_then_byte_level(LLAMA3_PAT)
    t.decoder = decoders.ByteLevel()
    train(t, 900, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])

    def edit(j):
        add_whole_words(j, ["Straße", " résumé", "中文字", " jumps", "quick", " ÅNGSTRÖM"])
        bos = next(a["id"] for a in j["added_tokens"] if a["content"] == "<|begin_of_text|>")
        j["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    return edit_json(t, edit)


def qwen_style():
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = split_then_byte_level(QWEN_PAT)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    train(t, 800, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    t.add_tokens([AddedToken("cafe\u0301", normalized=True)])  # matched after NFC
    return edit_json(t, lambda j: add_whole_words(j, ["fox", " lazy", "テキスト"]))


def template(j, bos, eos=None):
    ids = {a["content"]: a["id"] for a in j["added_tokens"]}
    single = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    st = {bos: {"id": bos, "ids": [ids[bos]], "tokens": [bos]}}
    if eos:
        single.append({"SpecialToken": {"id": eos, "type_id": 0}})
        st[eos] = {"id": eos, "ids": [ids[eos]], "tokens": [eos]}
    j["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": single,
                           "special_tokens": st}


def llama2_style():
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    train(t, 500, ["<unk>", "<s>", "</s>"], byte_level=False, limit_alphabet=60)
    t.add_special_tokens([AddedToken("[INST]", normalized=False), AddedToken("[/INST]")])
    t.add_tokens([AddedToken("hello_world", normalized=True)])  # looked for as "▁hello_world"

    def edit(j):
        add_byte_fallback_tokens(j)
        template(j, "<s>", "</s>")
    return edit_json(t, edit)


def metaspace_style(scheme, split, specials, bos):
    """Mistral ("first", no split, [INST] tokens, BOS) and older Metaspace files ("always")."""
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    train(t, 500, ["<unk>", "<s>", "</s>"], byte_level=False, limit_alphabet=60)
    t.add_special_tokens([AddedToken(x) for x in specials])

    def edit(j):
        add_byte_fallback_tokens(j)
        if bos:
            template(j, bos)
    return edit_json(t, edit)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---- running ferry -------------------------------------------------------------------------
def ferry(model_dir, lines, *flags):
    inp = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
    def cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    t0 = cpu()
    p = subprocess.run([args.ferry, "tokenize", "--model", model_dir, "--jsonl", *flags],
                       input=inp, capture_output=True)
    dt = cpu() - t0  # CPU seconds of the ferry process (wall time varies on a shared machine)
    if p.returncode != 0:
        print(f"FAIL: ferry tokenize --model {model_dir} {' '.join(flags)}: "
              f"{p.stderr.decode(errors='replace').strip()}")
        sys.exit(1)
    return [json.loads(l) for l in p.stdout.decode().splitlines()], dt


def char_to_byte_offsets(s):
    pos = [0]
    for c in s:
        pos.append(pos[-1] + len(c.encode()))
    return pos


tally = Tally(shown=12)
report = tally.report


def check(name, tok, j, config=None, offsets=False):
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(j, f, ensure_ascii=False)
    if config:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
    specials = [a["content"] for a in j["added_tokens"]]
    strings = [make_string(specials) for _ in range(args.strings)] + ["", " ", "\n", "  \n\n  "]
    for add_special in (True, False):
        flags = [] if add_special else ["--no-special"]
        got, _ = ferry(d, strings, *flags)
        for s, g in zip(strings, got):
            tally.compared += 1
            e = tok.encode(s, add_special_tokens=add_special)
            if e.ids != g["ids"]:
                report("ids", name, s, e.ids, g["ids"])
                continue
            if offsets:
                pos = char_to_byte_offsets(s)
                # Tokens the post-processor adds cover an empty range: tokenizers puts it at 0,
                # ferry at the token's position (tokenizer.h); either is "no input bytes".
                def norm(offs):
                    return [o if o[0] < o[1] else "empty" for o in offs]
                want = [[pos[a], pos[b]] for a, b in e.offsets]
                if norm(want) != norm(g["offsets"]):
                    report("offsets", name, s, want, g["offsets"])
    # Decode what the reference encoded (with and without special tokens) and round trips.
    id_lists = [tok.encode(s).ids for s in strings]
    for skip_special in (False, True):
        flags = ["--decode"] + (["--skip-special"] if skip_special else [])
        got, _ = ferry(d, id_lists, *flags)
        for s, ids, g in zip(strings, id_lists, got):
            tally.compared += 1
            want = tok.decode(ids, skip_special_tokens=skip_special)
            if want != g:
                report("decode", name, s, repr(want), repr(g))
    print(f"{name}: {len(strings)} strings, encode x2 and decode x2 compared with tokenizers")


def whisper_ranks():
    root = os.path.join(args.venv or args.work, "downloads")
    for fn in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, fn)
        if fn.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                return z.read("whisper/assets/gpt2.tiktoken")
        if fn.endswith(".tar.gz"):
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    if m.name.endswith("whisper/assets/gpt2.tiktoken"):
                        return t.extractfile(m).read()
    return None


def check_tiktoken():
    raw = whisper_ranks()
    if raw is None:
        print("tiktoken: SKIPPED part: no openai-whisper archive in <venv>/downloads "
              "(scripts/test.sh downloads it)")
        return False
    ranks = {}
    for line in raw.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    # tokenizer.json from the ranks, as Hugging Face's tiktoken converter builds it.
    b2u = bytes_to_unicode()
    def s(b): return "".join(b2u[x] for x in b)
    vocab, merges = {}, []
    for tok, rank in ranks.items():
        vocab[s(tok)] = rank
        local = [(tok[:i], tok[i:], rank) for i in range(1, len(tok))
                 if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    j = {"version": "1.0", "truncation": None, "padding": None,
         "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
         "normalizer": None,
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                           "use_regex": True},
         "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                            "use_regex": True},
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                     "use_regex": True},
         "model": {"type": "BPE", "dropout": None, "unk_token": None,
                   "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                   "byte_fallback": False, "ignore_merges": False,
                   "vocab": vocab, "merges": [[s(a), s(b)] for a, b, _ in merges]}}
    d = os.path.join(args.work, "gpt2-tiktoken")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"bos_token_id": 50256, "eos_token_id": 50256}, f)
    strings = [make_string(["<|endoftext|>"]) for _ in range(args.strings)]
    got, _ = ferry(d, strings, "--no-special")
    for x, g in zip(strings, got):
        tally.compared += 1
        want = enc.encode(x, allowed_special="all")
        if want != g["ids"]:
            report("ids", "gpt2-tiktoken", x, want, g["ids"])
    got, _ = ferry(d, [enc.encode(x, allowed_special="all") for x in strings], "--decode")
    for x, g in zip(strings, got):
        tally.compared += 1
        if g != x:
            report("round trip", "gpt2-tiktoken", x, repr(x), repr(g))
    # Encode speed (printed, not asserted): ~1 MB of text as one line, minus the load time, in
    # CPU seconds; it includes reading and writing the JSON lines.
    big = " ".join(strings) * max(1, (1 << 20) // max(1, len(" ".join(strings).encode())))
    _, t_empty = ferry(d, [""], "--no-special")
    _, t_big = ferry(d, [big], "--no-special")
    mb = len(big.encode()) / 1e6
    print(f"gpt2-tiktoken: {len(strings)} strings compared with tiktoken (real GPT-2 ranks, "
          f"{len(merges)} merges); encode {mb:.1f} MB in {t_big - t_empty:.2f} s "
          f"CPU ({mb / max(1e-9, t_big - t_empty):.1f} MB/s, one thread)")
    return True


check("gpt2-style", *gpt2_style(), offsets=True)
check("gpt2-prefix-space", *gpt2_prefix_space())
check("llama3-style", *llama3_style(), offsets=True,
      config={"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})
check("qwen-style", *qwen_style())
check("llama2-style", *llama2_style(), offsets=True)
check("mistral-style", *metaspace_style("first", False, ["[INST]", "[/INST]"], "<s>"), offsets=True)
check("metaspace-split", *metaspace_style("always", True, [], None), offsets=True)
tiktoken_done = check_tiktoken()
print(f"{tally.compared} comparisons, {tally.mismatches} mismatches "
      f"(tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__})")
if tally.mismatches:
    sys.exit(1)
if not tiktoken_done:
    skip("the tokenizers comparisons passed, but the tiktoken comparison could not run")
