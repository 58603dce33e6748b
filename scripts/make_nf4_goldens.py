#!/usr/bin/env python3
"""Writes ferry's NF4 goldens (tests/goldens/nf4/): bitsandbytes' own 4-bit NormalFloat codec
(QLoRA) run on the CPU, which ferry's codec (kernels/nf4.h) must reproduce bit for bit.

Python is tooling only: ferry's tests (kernels/nf4_test.cc) read the committed outputs and never
run this script. To regenerate (CPU only, a few seconds once the packages are installed):

    python3 -m venv /tmp/goldens-venv
    /tmp/goldens-venv/bin/pip install torch safetensors numpy bitsandbytes
    /tmp/goldens-venv/bin/python scripts/make_nf4_goldens.py            # writes tests/goldens/nf4/
    /tmp/goldens-venv/bin/python scripts/make_nf4_goldens.py --out DIR   # somewhere else

Every case is quantized by bitsandbytes.functional.quantize_4bit(x, blocksize=64,
quant_type="nf4", compress_statistics=nested) and dequantized by dequantize_4bit with the
state's dtype set to f32 and to bf16. On the CPU bitsandbytes picks each 4-bit code by
bucketize over the fp32 midpoints of the code table (the nearest code; a value on a midpoint goes
to the lower one), not by the CUDA kernel's threshold tree: ferry's Nf4Rounding::kNearest. The
nested (double) quantization quantizes absmax - mean(absmax) with quantize_blockwise(blocksize=256)
and the signed dynamic map, on the CPU through bitsandbytes' native 65536-bin lookup table.
Inputs come from a seeded torch generator (normal, scaled per row, so blocks have different
absmax); a rerun with the same package versions (golden.json) gives the same files.

Layout (tests/goldens/nf4/):
  nf4.safetensors   code F32 (16): the NF4 table (quant_map); nested_code F32 (256):
                    create_dynamic_map(signed=True); and for every CASE:
                      CASE.input         F32 or BF16, the case's shape: what was quantized (a
                                         nested case reads its plain twin's: golden.json's input)
                      CASE.packed        U8 ((numel + 1) / 2): two codes a byte, high nibble first
                      CASE.absmax        F32 (blocks)                     (not nested)
                      CASE.absmax_q      U8 (blocks)                      (nested)
                      CASE.nested_absmax F32 (ceil(blocks / 256))         (nested)
                      CASE.nested_offset F32 (1)                          (nested)
                      CASE.dequant_f32   F32 (shape)   dequantize_4bit to f32 (not for "big")
                      CASE.dequant_bf16  BF16 (shape)  dequantize_4bit to bf16 (not for "big",
                                         only for its nested twin)
  golden.json       versions; cases: name, input (the tensor), shape, dtype, nested, and which
                    dequantized outputs were written (dequant_f32, dequant_bf16). The C++ test
                    finds the same from the tensor names (kernels/ tests use no JSON library).
Cases: shapes (3, 5) (odd numel), (64,), (65,), (130, 7) in f32 and bf16, nested and not; big:
(300, 128) in bf16 (600 blocks, so three nested blocks, the last short); thresholds (64,) f32:
1.0 (absmax, so the scale is exactly 1), each fp32 midpoint of the table and each threshold of
bitsandbytes' CUDA tree (dQuantizeNF4, read as a C compiler reads them), where the two roundings
can disagree; zeros (130,) f32:
a whole block of zeros and a zero 2-element tail (bitsandbytes' absmax clamps: the tail's absmax
is stored as 1e-38).
"""

import argparse
import json
import os
from fractions import Fraction

import numpy as np
import torch
from safetensors.torch import save_file

import bitsandbytes
import bitsandbytes.functional as F

SEED = 4242
# bitsandbytes' CUDA threshold tree (csrc/kernels.cu, dQuantizeNF4): the decimals as written
# there, which the CUDA compiler rounds to fp32 directly (f32() below; going through a Python float
# first would round twice and give the fp32 midpoint instead, for four of them).
TREE = ["-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906",
        "-0.33967943489551544", "-0.23460740596055984", "-0.13791173323988914",
        "-0.045525018125772476", "0.03979014977812767", "0.1202552504837513", "0.2035212516784668",
        "0.2920137718319893", "0.3893125355243683", "0.5016634166240692", "0.6427869200706482",
        "0.8614784181118011"]


def versions():
    return {"torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__,
            "numpy": np.__version__}


def random_input(shape, dtype, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    rows = x.reshape(shape[0], -1) if len(shape) > 1 else x.reshape(1, -1)
    scale = torch.rand(rows.shape[0], 1, generator=gen) * 4 + 0.01
    return (rows * scale).reshape(shape).to(dtype)


def f32(decimal):
    """The fp32 value nearest the decimal string (as a C compiler reads 0.123f)."""
    exact = Fraction(decimal)
    guess = np.float32(float(exact))
    near = [np.nextafter(guess, np.float32(-2)), guess, np.nextafter(guess, np.float32(2))]
    return float(min(near, key=lambda v: (abs(Fraction(float(v)) - exact),
                                          int(np.array(v).view(np.int32)) & 1)))


def thresholds_input():
    code = F.get_4bit_type("nf4", device="cpu").float()
    mids = ((code[:-1] + code[1:]) / 2).tolist()
    vals = [1.0] + mids + [f32(t) for t in TREE]
    vals += [0.0] * (64 - len(vals))
    return torch.tensor(vals, dtype=torch.float32)


def zeros_input(gen):
    x = torch.randn(130, generator=gen)
    x[64:128] = 0
    x[128:] = 0
    return x


def add_case(tensors, cases, name, x, nested, dequant_f32=True, input_of=None, dequant_bf16=True):
    packed, state = F.quantize_4bit(x, blocksize=64, compress_statistics=nested, quant_type="nf4")
    t = {"packed": packed.reshape(-1).contiguous()}
    if input_of is None:
        t["input"] = x.contiguous()
    if nested:
        t["absmax_q"] = state.absmax.reshape(-1)
        t["nested_absmax"] = state.state2.absmax.reshape(-1).float()
        t["nested_offset"] = state.offset.reshape(1).float()
        assert torch.equal(state.state2.code, F.create_dynamic_map(signed=True))
        assert state.state2.blocksize == 256
    else:
        t["absmax"] = state.absmax.reshape(-1).float()
    outs = ([("bf16", torch.bfloat16)] if dequant_bf16 else []) + \
        ([("f32", torch.float32)] if dequant_f32 else [])
    for suffix, dt in outs:
        state.dtype = dt
        t["dequant_" + suffix] = F.dequantize_4bit(packed, quant_state=state).contiguous()
        assert t["dequant_" + suffix].dtype == dt
    for k, v in t.items():
        tensors[name + "." + k] = v.contiguous()
    cases.append({"name": name, "input": (input_of or name) + ".input", "shape": list(x.shape),
                  "dtype": str(x.dtype).split(".")[-1], "nested": nested,
                  "dequant_f32": dequant_f32, "dequant_bf16": dequant_bf16})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "goldens", "nf4"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)

    tensors = {"code": F.get_4bit_type("nf4", device="cpu").float().contiguous(),
               "nested_code": F.create_dynamic_map(signed=True).contiguous()}
    cases = []
    for shape in [(3, 5), (64,), (65,), (130, 7)]:
        for dtype in [torch.float32, torch.bfloat16]:
            x = random_input(shape, dtype, gen)
            tag = "x".join(map(str, shape)) + "_" + str(dtype).split(".")[-1]
            add_case(tensors, cases, tag, x, False)
            add_case(tensors, cases, tag + "_nested", x, True, input_of=tag)
    big = random_input((300, 128), torch.bfloat16, gen)
    add_case(tensors, cases, "big", big, False, dequant_f32=False, dequant_bf16=False)
    add_case(tensors, cases, "big_nested", big, True, dequant_f32=False, input_of="big")
    add_case(tensors, cases, "thresholds", thresholds_input(), False)
    add_case(tensors, cases, "zeros", zeros_input(gen), False)
    add_case(tensors, cases, "zeros_nested", zeros_input(gen), True)

    save_file(tensors, os.path.join(args.out, "nf4.safetensors"))
    info = {"versions": versions(), "seed": SEED, "blocksize": 64, "nested_blocksize": 256,
            "cases": cases}
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
