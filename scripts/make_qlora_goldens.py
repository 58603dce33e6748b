#!/usr/bin/env python3
"""Writes ferry's QLoRA golden: the tiny Llama of make_goldens.py with its block projections
quantized by bitsandbytes (Linear4bit, NF4, blocks of 64, double quantization) and a PEFT LoRA
adapter on every projection, one forward + backward and five AdamW steps of the adapter.

Python is tooling only: ferry's tests read the committed outputs and never run this script. To
regenerate (CPU only; bitsandbytes quantizes on the CPU with its nearest-code rounding):

    /tmp/goldens-venv/bin/pip install torch transformers peft safetensors numpy bitsandbytes
    /tmp/goldens-venv/bin/python scripts/make_qlora_goldens.py            # tests/goldens/
    /tmp/goldens-venv/bin/python scripts/make_qlora_goldens.py --out DIR  # somewhere else

tests/goldens/llama_qlora/ (base: ../llama/model.safetensors, fp32, quantized here):
  adapter_config.json, adapter_model.safetensors   PEFT's own output: the initial LoRA A/B (the
                       same init as llama_lora: A ~ N(0, 0.1^2), B ~ N(0, 0.02^2))
  base_nf4.safetensors every quantized weight as bitsandbytes holds it: NAME.packed (U8, numel/2,
                       element 2i in the high nibble), NAME.absmax_q (U8), NAME.nested_absmax
                       (F32), NAME.nested_code (F32, 256), NAME.nested_offset (F32, 1),
                       NAME.code (F32, 16) and NAME.dequantized (F32, the weight the matmul uses)
  io.safetensors       input_ids, targets, logits (quantized base + adapter)
  grads.safetensors    gradients of the LoRA A/B matrices only (PEFT adapter names)
  final.safetensors    LoRA A/B after the AdamW steps
  golden.json          as llama_lora's, plus lora.quantize = "nf4", lora.double_quant = true

Compute is fp32 (Linear4bit's compute_dtype float32: each product dequantizes the weight to fp32,
then multiplies), attention "eager", dropout 0; the loss, schedule, clipping and AdamW are those of
make_goldens.py (its docstring states them).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

TARGETS = mg.LORA_TARGETS


def quantize_linears(model):
    """Replaces every block projection by a bitsandbytes Linear4bit holding its weight in NF4
    (double-quantized), fp32 compute; returns {HF weight name: the Params4bit}."""
    import bitsandbytes as bnb
    quantized = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear) or child_name not in TARGETS:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=torch.float32, compress_statistics=True,
                                  quant_type="nf4")
            q.weight = bnb.nn.Params4bit(child.weight.data.clone(), requires_grad=False,
                                         compress_statistics=True, quant_type="nf4",
                                         blocksize=64)
            q = q.to("cpu")  # quantizes
            if child.bias is not None:
                q.bias = child.bias
            setattr(module, child_name, q)
            quantized[f"{name}.{child_name}.weight"] = q.weight
    return quantized


def base_state(quantized):
    """The quantized weights as the flat tensors base_nf4.safetensors holds."""
    import bitsandbytes.functional as F
    out = {}
    for name, w in quantized.items():
        s = w.quant_state
        assert s.nested and s.blocksize == 64 and s.quant_type == "nf4", name
        out[name + ".packed"] = w.data.reshape(-1).contiguous()
        out[name + ".absmax_q"] = s.absmax.reshape(-1).contiguous()
        out[name + ".nested_absmax"] = s.state2.absmax.float().reshape(-1).contiguous()
        out[name + ".nested_code"] = s.state2.code.float().contiguous()
        out[name + ".nested_offset"] = torch.tensor([float(s.offset)], dtype=torch.float32)
        out[name + ".code"] = s.code.float().contiguous()
        out[name + ".dequantized"] = F.dequantize_4bit(w.data, s).float().contiguous()
    return out


def make_qlora(out):
    d = os.path.join(out, "llama_qlora")
    os.makedirs(d, exist_ok=True)
    model = mg.build("llama")
    quantized = quantize_linears(model)
    base = base_state(quantized)
    model = mg.attach_lora(model, d)  # llama_lora's adapter and init
    save_file(base, os.path.join(d, "base_nf4.safetensors"))
    input_ids, targets = mg.make_tokens()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def peft_name(n):
        return n.replace(".default", "")

    steps, logits, grads = mg.train(model, params, input_ids, targets)
    save_file({"input_ids": input_ids, "targets": targets, "logits": logits.contiguous()},
              os.path.join(d, "io.safetensors"))
    save_file({peft_name(n): gr.contiguous() for n, gr in grads.items()},
              os.path.join(d, "grads.safetensors"))
    save_file({peft_name(n): p.detach().clone().contiguous() for n, p in params},
              os.path.join(d, "final.safetensors"))
    info = mg.common_json(model, input_ids, targets, steps)
    import bitsandbytes
    info["versions"]["bitsandbytes"] = bitsandbytes.__version__
    info.update({
        "model": "llama_qlora",
        "base": "../llama",
        "lora": {"r": 4, "alpha": 8, "scaling": 2.0, "targets": TARGETS,
                 "init": "A ~ N(0, 0.1^2), B ~ N(0, 0.02^2)",
                 "quantize": "nf4", "double_quant": True, "blocksize": 64,
                 "rounding": "bitsandbytes CPU quantize_4bit: nearest code"},
        "num_trainable": sum(p.numel() for _, p in params),
        "parameters": [{"name": peft_name(n), "shape": list(p.shape), "decay": p.ndim >= 2}
                       for n, p in params],
    })
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def main():
    out = mg.golden_setup(__doc__)
    info = make_qlora(out)
    print(f"llama_qlora: {info['num_trainable']} trainable, loss {info['loss']}, "
          f"final loss {info['steps'][-1]['loss']}")


if __name__ == "__main__":
    main()
