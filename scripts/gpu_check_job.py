#!/usr/bin/env python3
"""The GPU check's model job (scripts/gpu_check.sh): a randomly initialised Llama folder for ferry
to probe, plan and train, a token file to score, and transformers' verdict on what ferry trained.

  make DIR --config CFG [--tokens N] [--text FILE]
      DIR/model: config.json (CFG), model.safetensors (bf16, N(0, 0.02) weights, norms 1, seed 0),
      a byte-level tokenizer.json (ids 0-255 are the bytes; ferry's built-in training text is
      byte ids too) and tokenizer_config.json; DIR/tokens.tok: ferry's token file holding one
      document, the first N bytes of FILE (English text: what training on the built-in text
      teaches shows in its loss).
  compare --tokens F --seq-len T --init DIR NAME=RUN_DIR:FERRY_LOSS ...
      transformers (the device's PyTorch, fp32) loads the initial folder and each run folder
      ferry wrote, scores F as `ferry eval --seq-len T` does (pieces of T tokens overlapping by
      one, positions from 0 in each, every next token a target), and prints each run's loss
      beside ferry eval's, and how far each run's logits moved from the initial model's and from
      the first run's. Fails when a folder does not load or a loss differs from ferry eval's by
      more than --tolerance (relative; bf16 on the GPU against fp32 here).

make needs only the standard library when torch is absent (a pure-Python writer, slow: for small
configs on a machine without PyTorch); compare needs torch and transformers.
"""
import argparse
import json
import math
import os
import random
import struct
import sys


def llama_tensors(c):
    """(name, shape, is_norm) of a Llama checkpoint as transformers names it."""
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim", h // heads)
    out = [("model.embed_tokens.weight", [v, h], False)]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", [h], True),
            (p + "self_attn.q_proj.weight", [heads * hd, h], False),
            (p + "self_attn.k_proj.weight", [kv * hd, h], False),
            (p + "self_attn.v_proj.weight", [kv * hd, h], False),
            (p + "self_attn.o_proj.weight", [h, heads * hd], False),
            (p + "post_attention_layernorm.weight", [h], True),
            (p + "mlp.gate_proj.weight", [inter, h], False),
            (p + "mlp.up_proj.weight", [inter, h], False),
            (p + "mlp.down_proj.weight", [h, inter], False),
        ]
    out.append(("model.norm.weight", [h], True))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [v, h], False))
    return out


def bf16_bytes(shape, is_norm, rng, torch):
    n = math.prod(shape)
    if torch is not None:
        t = torch.ones(n) if is_norm else torch.empty(n).normal_(0, 0.02, generator=rng)
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    out = bytearray()
    for _ in range(n):
        x = 1.0 if is_norm else rng.gauss(0.0, 0.02)
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        out += struct.pack("<H", bits)
    return bytes(out)


def write_safetensors(path, tensors):
    """tensors: (name, shape, bytes) in bf16."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors:
            f.write(data)


def byte_level_tokenizer():
    # GPT-2's byte-to-unicode alphabet: printable bytes stand for themselves, the rest map to
    # U+0100 onwards.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    eos = "<|end_of_text|>"
    return {
        "version": "1.0",
        "added_tokens": [{"id": 256, "content": eos, "special": True, "lstrip": False,
                          "rstrip": False, "single_word": False, "normalized": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "trim_offsets": False},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    }, eos


def write_token_file(path, ids):
    with open(path, "wb") as f:
        f.write(b"FERRYTOK")
        f.write(struct.pack("<IIQ", 1, 4, 1))
        f.write(struct.pack("<QQ", 0, len(ids)))
        f.write(struct.pack("<%dI" % len(ids), *ids))


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"FERRYTOK":
        raise SystemExit("%s: not a ferry token file" % path)
    version, width, docs = struct.unpack_from("<IIQ", data, 8)
    offsets = struct.unpack_from("<%dQ" % (docs + 1), data, 24)
    start = 24 + 8 * (docs + 1)
    fmt = "<%d%s" % (offsets[-1], "H" if width == 2 else "I")
    ids = struct.unpack_from(fmt, data, start)
    return [list(ids[offsets[d]:offsets[d + 1]]) for d in range(docs)]


def pieces_of(docs, seq_len):
    """The pieces `ferry eval --seq-len T` scores (engine/train/packed_dataset.cc, split mode):
    from each document, T tokens starting every T - 1, the last one reaching its end."""
    pieces = []
    for d in docs:
        for b in range(0, len(d), max(1, seq_len - 1)):
            p = d[b:b + seq_len]
            if len(p) > 1:
                pieces.append(p)
            if b + seq_len >= len(d):
                break
    return pieces


def make(args):
    try:
        import torch
    except ImportError:
        torch = None
    with open(args.config) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        raise SystemExit("%s: make writes Llama folders only" % args.config)
    model = os.path.join(args.dir, "model")
    os.makedirs(model, exist_ok=True)
    cfg["torch_dtype"] = "bfloat16"
    tok, eos = byte_level_tokenizer()
    cfg["eos_token_id"] = 256
    cfg.pop("bos_token_id", None)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(model, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": eos, "bos_token": None, "model_max_length": 131072}, f)
    if torch is not None:
        rng = torch.Generator().manual_seed(0)
    else:
        rng = random.Random(0)
    tensors = [(name, shape, bf16_bytes(shape, norm, rng, torch))
               for name, shape, norm in llama_tensors(cfg)]
    write_safetensors(os.path.join(model, "model.safetensors"), tensors)
    with open(args.text, "rb") as f:
        text = f.read()
    while len(text) < args.tokens:
        text += text
    write_token_file(os.path.join(args.dir, "tokens.tok"), list(text[:args.tokens]))
    params = sum(math.prod(s) for _, s, _ in tensors)
    print("gpu_check_job: %s: %.1fM parameters (%s), %d tokens in %s" % (
        model, params / 1e6, "torch" if torch is not None else "pure Python", args.tokens,
        os.path.join(args.dir, "tokens.tok")))


def compare(args):
    import torch
    from transformers import AutoModelForCausalLM
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pieces = pieces_of(read_token_file(args.tokens), args.seq_len)

    def score(folder):
        m = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(dev).eval()
        total, count, first = 0.0, 0, None
        with torch.no_grad():
            for p in pieces:
                ids = torch.tensor([p], device=dev)
                logits = m(ids).logits[0].float()
                total += torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:],
                                                           reduction="sum").item()
                count += len(p) - 1
                if first is None:
                    first = logits.cpu()
        del m
        if dev == "cuda":
            torch.cuda.empty_cache()
        return total / count, first

    failures = []
    init_loss, init_logits = score(args.init)
    print("transformers: initial model loss %.4f on %d pieces of %s" % (
        init_loss, len(pieces), args.tokens))
    first_logits = None
    for spec in args.runs:
        name, rest = spec.split("=", 1)
        folder, ferry_loss = rest.rsplit(":", 1)
        ferry_loss = float(ferry_loss)
        try:
            loss, logits = score(folder)
        except Exception as e:  # a folder transformers cannot load is the failure to report
            failures.append("%s: transformers cannot load %s: %s" % (name, folder, e))
            continue
        rel = abs(loss - ferry_loss) / abs(loss)
        moved = (logits - init_logits).abs().max().item()
        line = "%s: transformers loss %.4f, ferry eval %.4f (rel diff %.2e); logits moved %.3g " \
               "from the initial model" % (name, loss, ferry_loss, rel, moved)
        if first_logits is None:
            first_logits = logits
        else:
            line += ", %.3g from the first run" % (logits - first_logits).abs().max().item()
        print(line)
        if rel > args.tolerance:
            failures.append("%s: ferry eval's loss %.4f and transformers' %.4f differ by %.2e "
                            "(more than %.0e)" % (name, ferry_loss, loss, rel, args.tolerance))
    for f in failures:
        print("gpu_check_job: FAILED: " + f, file=sys.stderr)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--config", required=True)
    m.add_argument("--tokens", type=int, default=8161)
    m.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    c = sub.add_parser("compare")
    c.add_argument("--tokens", required=True)
    c.add_argument("--seq-len", type=int, required=True)
    c.add_argument("--init", required=True)
    c.add_argument("--tolerance", type=float, default=2e-2)
    c.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR:FERRY_LOSS")
    args = ap.parse_args()
    if args.cmd == "make":
        make(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
