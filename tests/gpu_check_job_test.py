#!/usr/bin/env python3
"""The GPU check's model job (scripts/gpu_check_job.py), checked where it can be without a GPU or
PyTorch: `make` writes a small Llama folder and token file (its pure-Python writer) that ferry
reads, the weights are what make says (a model of N(0, 0.02) weights and unit norms scores about
ln(vocab) on any text), and `ferry eval` scores exactly the pieces `compare` scores transformers
on (same count, same targets), so the device's comparison compares like with like.

Usage: gpu_check_job_test.py --ferry BIN --work DIR
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_check_job  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    with open(os.path.join(ROOT, "configs/models/llama-3.2-1b.json")) as f:
        cfg = json.load(f)
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)
    config = os.path.join(args.work, "small.json")
    with open(config, "w") as f:
        json.dump(cfg, f)
    job = os.path.join(args.work, "job")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts/gpu_check_job.py"), "make", job,
                    "--config", config], check=True)
    seq_len = 256
    out = subprocess.run([args.ferry, "eval", "--model", os.path.join(job, "model"), "--data",
                          os.path.join(job, "tokens.tok"), "--seq-len", str(seq_len),
                          "--batch-size", "8", "--devices", "cpu", "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("ferry eval failed: " + out.stderr)
    r = json.loads(out.stdout)
    pieces = gpu_check_job.pieces_of(
        gpu_check_job.read_token_file(os.path.join(job, "tokens.tok")), seq_len)
    failures = []
    if r["rows"] != len(pieces):
        failures.append("ferry eval scored %d rows, compare scores %d pieces" %
                        (r["rows"], len(pieces)))
    targets = sum(len(p) - 1 for p in pieces)
    if r["targets"] != targets:
        failures.append("ferry eval scored %d targets, compare %d" % (r["targets"], targets))
    if abs(r["loss"] - math.log(512)) > 0.05:
        failures.append("the fresh model's loss %.4f is not about ln(512) = %.4f: are the weights "
                        "N(0, 0.02) with unit norms?" % (r["loss"], math.log(512)))
    for f in failures:
        print("FAILED: " + f)
    if not failures:
        print("ok: %d pieces, %d targets, loss %.4f" % (len(pieces), targets, r["loss"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
