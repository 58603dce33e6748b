#!/usr/bin/env python3
"""Writes ferry's LoRA merge golden: the tiny Llama of make_goldens.py (tests/goldens/llama/) with
the PEFT adapter of tests/goldens/llama_lora/ (its initial A and B, B not zero) merged by PEFT's
own merge_and_unload, in fp32 and with the base loaded in bf16.

Python is tooling only: ferry's tests read the committed outputs and never run this script. To
regenerate (CPU only, seconds once the packages are installed):

    /tmp/goldens-venv/bin/pip install torch transformers peft safetensors numpy
    /tmp/goldens-venv/bin/python scripts/make_merge_goldens.py            # tests/goldens/
    /tmp/goldens-venv/bin/python scripts/make_merge_goldens.py --out DIR  # somewhere else

tests/goldens/llama_lora/ gains:
  merged.safetensors       every weight of the merged fp32 model (Hugging Face names), as
                           save_pretrained would write them (the untied lm_head included)
  merged_bf16.safetensors  the same with the base loaded in bf16: PEFT adds its fp32 delta
                           (B A * scaling) to the bf16 weight, rounded once to bf16
  merge.json               the package versions and what was merged
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402


def merged_weights(base_dir, adapter_dir, dtype):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
    model = PeftModel.from_pretrained(model, adapter_dir)
    merged = model.merge_and_unload()
    return {n: t.detach().clone().contiguous() for n, t in merged.state_dict().items()}


def main():
    out = mg.golden_setup(__doc__)
    base = os.path.join(out, "llama")
    d = os.path.join(out, "llama_lora")
    f32 = merged_weights(base, d, torch.float32)
    bf16 = merged_weights(base, d, torch.bfloat16)
    save_file(f32, os.path.join(d, "merged.safetensors"), metadata={"format": "pt"})
    save_file(bf16, os.path.join(d, "merged_bf16.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "merge.json"), "w") as f:
        json.dump({"versions": mg.versions(), "base": "../llama", "adapter": "adapter_model",
                   "merge": "PeftModel.merge_and_unload()", "tensors": sorted(f32)}, f, indent=1)
    print(f"llama_lora merge: {len(f32)} tensors, fp32 and bf16")


if __name__ == "__main__":
    main()
