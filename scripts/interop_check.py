#!/usr/bin/env python3
"""Interop proof: transformers and peft load the model folders and LoRA adapters ferry writes, and
their logits match ferry's.

Runs ferry_interop_tool (built with the tests: build/tests/ferry_interop_tool), which writes, for
every tiny model of engine/testing/tiny_models.h (Llama, Llama 3 RoPE scaling, Mistral sliding
window with head_dim 128, Qwen2 biases, Qwen3, GPT-2), a model folder (single file and sharded),
a PEFT adapter and ferry's logits on fixed tokens. This script loads each folder with
transformers.AutoModelForCausalLM (fp32, eager attention) and each adapter with
peft.PeftModel.from_pretrained, compares the logits with ferry's, and writes what transformers
computed to tests/goldens/interop/<name>.safetensors (tokens, logits, lora_logits) plus
tests/goldens/interop/golden.json (package versions, worst differences). tests/interop_test.cc
recomputes ferry's logits for the same deterministic weights and compares them with those files,
so CI checks the interop without torch.

    python3 -m venv /tmp/interop-venv
    /tmp/interop-venv/bin/pip install torch transformers peft safetensors numpy
    cmake --build build --target ferry_interop_tool
    /tmp/interop-venv/bin/python scripts/interop_check.py --tool build/tests/ferry_interop_tool

Exits non-zero when a folder does not load or a logit differs by more than --atol.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file


def versions():
    import peft
    import safetensors
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "safetensors": safetensors.__version__,
            "python": sys.version.split()[0]}


def load(folder):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens], dtype=torch.long)).logits[0].float()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", default=os.path.join(here, "..", "build", "tests",
                                                   "ferry_interop_tool"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "goldens", "interop"))
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    from peft import PeftModel
    os.makedirs(args.out, exist_ok=True)
    report = {"versions": versions(), "models": {}}
    failed = False
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([args.tool, work], check=True)
        for name in sorted(os.listdir(work)):
            d = os.path.join(work, name)
            ferry = json.load(open(os.path.join(d, "ferry_logits.json")))
            tokens, vocab = ferry["tokens"], ferry["vocab_size"]
            want = np.array(ferry["logits"], dtype=np.float32).reshape(len(tokens), vocab)
            want_lora = np.array(ferry["lora_logits"], dtype=np.float32).reshape(len(tokens),
                                                                                   vocab)
            base = load(os.path.join(d, "model"))
            logits = logits_of(base, tokens)
            sharded = logits_of(load(os.path.join(d, "model_sharded")), tokens)
            adapted = PeftModel.from_pretrained(base, os.path.join(d, "adapter"))
            adapted.eval()
            lora_logits = logits_of(adapted, tokens)
            diffs = {
                "max_abs_diff": float(np.abs(logits.numpy() - want).max()),
                "max_abs_diff_sharded": float(np.abs(sharded.numpy() - want).max()),
                "max_abs_diff_lora": float(np.abs(lora_logits.numpy() - want_lora).max()),
                "max_abs_logit": float(np.abs(want).max()),
                "lora_changes_logits_by": float(np.abs(want_lora - want).max()),
            }
            report["models"][name] = diffs
            ok = all(v <= args.atol for k, v in diffs.items() if k.startswith("max_abs_diff"))
            failed |= not ok
            print(f"{name}: {'ok' if ok else 'MISMATCH'} {diffs}")
            save_file({"tokens": torch.tensor(tokens, dtype=torch.int64),
                       "logits": logits.contiguous(), "lora_logits": lora_logits.contiguous()},
                      os.path.join(args.out, f"{name}.safetensors"))
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
