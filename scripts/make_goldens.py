#!/usr/bin/env python3
"""Writes ferry's PyTorch goldens: tiny Llama, Qwen3, GPT-2 (and Llama + LoRA) models with random
weights, one forward + backward on fixed tokens, and a few AdamW + warm-up/cosine steps.

Python is tooling only: ferry's tests read the committed outputs under tests/goldens/ and never run
this script. To regenerate (CPU only, a few seconds once the packages are installed):

    python3 -m venv /tmp/goldens-venv
    /tmp/goldens-venv/bin/pip install torch transformers peft safetensors numpy bitsandbytes \
        accelerate
    /tmp/goldens-venv/bin/python scripts/make_goldens.py            # writes tests/goldens/
    /tmp/goldens-venv/bin/python scripts/make_goldens.py --out DIR   # somewhere else

Everything is float32 with attn_implementation="eager" and dropout 0; seeds are fixed, so a rerun
with the same package versions (recorded in each golden.json) gives the same files.

Layout, for each MODEL in llama, qwen3, gpt2 and the architecture quirks llama3_rope (Llama 3
RoPE scaling past its original context, head_dim 64), mistral_window (sliding window 4 < the
sequence, head_dim 128) and qwen2 (q/k/v biases) (tests/goldens/MODEL/):
  config.json          the config transformers wrote (Hugging Face format; ferry parses it)
  model.safetensors    the initial weights as save_pretrained writes them (tied copies dropped)
  io.safetensors       input_ids I64 (B, T); targets I64 (B, T), -100 = masked, target[b, t] is
                       the label of position t (already shifted); logits F32 (B, T, V) of the
                       initial weights
  grads.safetensors    d loss / d param for every trainable parameter, F32, Hugging Face names
                       (a tied embedding's gradient holds both uses, under the embedding's name)
  final.safetensors    every parameter after the AdamW steps (same names)
  golden.json          configs, hyperparameters, counts, per-step lr / loss / grad norm
and tests/goldens/adamw/ (the optimizer alone: clipping + schedule + torch.optim.AdamW on three
tensors with given gradients, so the trainer's update can be checked without a model):
  steps.safetensors    init.{w,b,e}; step{k}.grad.{w,b,e} (the raw gradient of update k, before
                       clipping); step{k}.param.{w,b,e} (the parameters after update k)
  golden.json          hyperparameters, per-step lr, grad_norm, clip coefficient
and tests/goldens/llama_lora/ (base weights: ../llama/model.safetensors):
  adapter_config.json, adapter_model.safetensors   PEFT's own output: initial LoRA A/B
  io.safetensors       input_ids, targets, logits (with the adapter applied)
  grads.safetensors    gradients of the LoRA A/B matrices only (PEFT adapter names)
  final.safetensors    LoRA A/B after the AdamW steps; the base weights do not move
  golden.json

and tests/goldens/llama_bnb4/ and gpt2_bnb4/ (pre-quantized `*-bnb-4bit` folders: the weights of
../llama (../gpt2) loaded by transformers with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16) on the CPU, which recent
bitsandbytes supports (pip install bitsandbytes accelerate too), and written by save_pretrained;
its NF4 codes are bitsandbytes' CPU quantization of the f32 weights; GPT-2's Conv1D weights, stored
(in, out), are quantized transposed, with logical shape (out, in)):
  config.json          with transformers' quantization_config
  model.safetensors    embeddings, norms and lm_head as f32; every decoder-block projection W as
                       W (U8 packed codes, (numel/2, 1)), W.absmax (U8, double-quantized),
                       W.quant_map (F32 16), W.nested_absmax (F32), W.nested_quant_map (F32 256),
                       W.quant_state.bitsandbytes__nf4 (U8: JSON quant_type, blocksize, dtype,
                       shape, nested_blocksize, nested_dtype, nested_offset)
  dequant.safetensors  bitsandbytes' dequantize_4bit of every W as F32 (out, in), under W's name
                       (its device-independent implementation: make_bnb4 says why): what a
                       reader + NF4 dequantizer must give bit for bit
  io.safetensors       input_ids, targets (the fixed tokens above) and the F32 logits of the
                       folder reloaded by transformers (bf16 compute in the projections); llama
                       only: bitsandbytes 0.50's CPU 4-bit matmul asserts on GPT-2's widths
  golden.json          versions, the quantization settings, the quantized weights and shapes

The loss is the mean cross-entropy over all non-masked targets of the batch:
    loss = sum_{(b,t): target != -100} -log softmax(logits[b, t])[target[b, t]] / count

Training step k (k = 0 .. steps-1), in this order:
  1. forward + backward at the current parameters; the loss is recorded as steps[k].loss
  2. global-norm clipping (torch.nn.utils.clip_grad_norm_):
         norm = sqrt(sum over all trainable parameters of sum(g^2))
         if max_norm > 0: g *= min(1, max_norm / (norm + 1e-6))
  3. lr_k = lr * f(k), the warm-up + cosine schedule (ferry's own, written here explicitly):
         f(k) = (k + 1) / warmup                                   if k < warmup
         f(k) = min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * p)),
                p = (k - warmup) / max(1, total - warmup)          otherwise
     so the first step already has a non-zero rate and the last one (k = total - 1) too.
  4. torch.optim.AdamW (decoupled weight decay, bias correction), for each parameter, t = k + 1:
         w = w * (1 - lr_k * wd)            wd = weight_decay if w.ndim >= 2 else 0
         m = b1 * m + (1 - b1) * g
         v = b2 * v + (1 - b2) * g^2
         w = w - (lr_k / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
     (no decay on norm weights and biases, i.e. on every 1-D parameter; embeddings decay).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

BATCH = 2
SEQ = 11
VOCAB = 97
SEED = 1234

OPT = {
    "lr": 1e-2,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
    "warmup_steps": 2,
    "total_steps": 5,
    "min_lr_ratio": 0.0,
}


def lr_factor(k, warmup, total, min_ratio):
    """The schedule above: f(k) for the k-th update (0-based)."""
    if warmup > 0 and k < warmup:
        return (k + 1) / warmup
    p = (k - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


def make_tokens():
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    input_ids = ids[:, :-1].clone()
    targets = ids[:, 1:].clone()
    targets[0, :3] = -100  # a masked prompt
    targets[1, -2:] = -100  # masked padding at the end
    return input_ids, targets


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100, reduction="mean")


def randomize(model, seed):
    """Replaces transformers' init (ones for norms, zeros for biases) with values that make every
    parameter matter: matrices ~ N(0, 0.08^2), embeddings ~ N(0, 0.3^2), norm weights ~ 1 + N(0,
    0.1^2), biases ~ N(0, 0.05^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                std = 0.3 if ("wte" in name or "wpe" in name or "embed" in name) else 0.08
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


def tied_names(model):
    """Pairs (alias, owner) of parameters that are one tensor."""
    seen, tied = {}, []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append([name, seen[id(p)]])
        else:
            seen[id(p)] = name
    return tied


def f32(x):
    """A float32 value as a JSON number that round-trips (9 significant digits)."""
    return float(f"{float(x):.9g}")


def train(model, params, input_ids, targets):
    """Runs OPT["total_steps"] steps; returns (per-step records, first logits, first grads)."""
    named = list(params)
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": OPT["weight_decay"]}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=OPT["lr"], betas=tuple(OPT["betas"]), eps=OPT["eps"],
                            foreach=False, fused=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: lr_factor(k, OPT["warmup_steps"], OPT["total_steps"], OPT["min_lr_ratio"]))
    steps, first_logits, first_grads = [], None, None
    for k in range(OPT["total_steps"]):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=input_ids).logits
        loss = loss_fn(logits, targets)
        loss.backward()
        if k == 0:
            first_logits = logits.detach().clone()
            first_grads = {n: p.grad.detach().clone() for n, p in named}
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in named], OPT["max_grad_norm"])
        lr = opt.param_groups[0]["lr"]
        steps.append({"step": k, "lr": f32(lr), "loss": f32(loss.item()),
                      "grad_norm": f32(norm.item()),
                      "clipped": bool(norm.item() > OPT["max_grad_norm"])})
        opt.step()
        sched.step()
    return steps, first_logits, first_grads


def make_optimizer(out):
    """AdamW + clipping + schedule on fixed tensors with fixed gradients; w and e decay, b not."""
    d = os.path.join(out, "adamw")
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(SEED + 3)
    shapes = {"w": (7, 5), "b": (5,), "e": (11, 3)}
    params = {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.5) for n, s in shapes.items()}
    tensors = {f"init.{n}": p.detach().clone() for n, p in params.items()}
    groups = [{"params": [params["w"], params["e"]], "weight_decay": OPT["weight_decay"]},
              {"params": [params["b"]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=OPT["lr"], betas=tuple(OPT["betas"]), eps=OPT["eps"],
                            foreach=False, fused=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: lr_factor(k, OPT["warmup_steps"], OPT["total_steps"], OPT["min_lr_ratio"]))
    # Gradient scales chosen so that some updates clip (norm > 1) and some do not.
    scales = [0.05, 0.5, 0.02, 1.0, 0.1]
    steps = []
    for k in range(OPT["total_steps"]):
        for n, p in params.items():
            p.grad = torch.randn(p.shape, generator=g) * scales[k]
            tensors[f"step{k}.grad.{n}"] = p.grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), OPT["max_grad_norm"])
        coef = min(1.0, OPT["max_grad_norm"] / (norm.item() + 1e-6))
        steps.append({"step": k, "lr": f32(opt.param_groups[0]["lr"]),
                      "grad_norm": f32(norm.item()), "clip_coef": f32(coef),
                      "clipped": bool(norm.item() > OPT["max_grad_norm"])})
        opt.step()
        sched.step()
        for n, p in params.items():
            tensors[f"step{k}.param.{n}"] = p.detach().clone()
    save_file(tensors, os.path.join(d, "steps.safetensors"))
    info = {"versions": versions(), "seed": SEED + 3,
            "optimizer": dict(OPT, no_decay="b (1-D)",
                              clip="g *= min(1, max_grad_norm / (norm + 1e-6))"),
            "decay": {"w": True, "b": False, "e": True}, "steps": steps}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def versions():
    import peft
    import safetensors
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "safetensors": safetensors.__version__,
            "numpy": np.__version__, "python": sys.version.split()[0]}


def build(kind):
    import transformers as tf
    if kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                             max_position_embeddings=64, tie_word_embeddings=False,
                             attention_bias=False, mlp_bias=False, hidden_act="silu")
        cls = tf.LlamaForCausalLM
    elif kind == "qwen3":
        # head_dim 16 with hidden 48 and 4 heads: the attention width (64) is not the hidden size.
        cfg = tf.Qwen3Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=80,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                             max_position_embeddings=64, tie_word_embeddings=True,
                             attention_bias=False, use_sliding_window=False, hidden_act="silu")
        cls = tf.Qwen3ForCausalLM
    elif kind == "llama3_rope":
        # Llama 3 RoPE scaling with a short original context (8 < SEQ = 11, so positions run past
        # it) and factors chosen so that the head_dim 64 table has kept (wavelength < 8), smoothed
        # (8..32) and divided (> 32) frequencies.
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                           "low_freq_factor": 0.25, "high_freq_factor": 1.0,
                                           "original_max_position_embeddings": 8},
                             max_position_embeddings=64, tie_word_embeddings=False,
                             attention_bias=False, mlp_bias=False, hidden_act="silu")
        cls = tf.LlamaForCausalLM
    elif kind == "mistral_window":
        # head_dim 128 and a sliding window of 4 keys, shorter than the sequence (SEQ = 11).
        cfg = tf.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                               sliding_window=4, max_position_embeddings=64,
                               tie_word_embeddings=False, hidden_act="silu")
        cls = tf.MistralForCausalLM
    elif kind == "qwen2":
        # q/k/v biases (no o bias), tied embeddings.
        cfg = tf.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=64,
                             tie_word_embeddings=True, use_sliding_window=False,
                             hidden_act="silu")
        cls = tf.Qwen2ForCausalLM
    elif kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=48, n_layer=2, n_head=4,
                            n_inner=128, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                            tie_word_embeddings=True)
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = cls(cfg).float()
    model.config._attn_implementation = "eager"
    randomize(model, SEED + 1)
    return model


def write_config(model, d):
    model.config.save_pretrained(d)


def common_json(model, input_ids, targets, steps):
    return {
        "versions": versions(),
        "seed": SEED,
        "batch": BATCH,
        "seq_len": SEQ,
        "valid_targets": int((targets != -100).sum().item()),
        "loss": steps[0]["loss"],
        "optimizer": dict(OPT, no_decay="parameters with ndim < 2 (norm weights, biases)",
                          clip="g *= min(1, max_grad_norm / (norm + 1e-6))"),
        "schedule": "f(k) = (k+1)/warmup if k < warmup else min_ratio + (1-min_ratio)*0.5*"
                    "(1+cos(pi*(k-warmup)/max(1,total-warmup))); lr_k = lr*f(k)",
        "steps": steps,
    }


def make_full(kind, out):
    d = os.path.join(out, kind)
    os.makedirs(d, exist_ok=True)
    model = build(kind)
    model.train()
    input_ids, targets = make_tokens()
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    params = list(model.named_parameters())
    steps, logits, grads = train(model, params, input_ids, targets)
    save_file({"input_ids": input_ids, "targets": targets, "logits": logits.contiguous()},
              os.path.join(d, "io.safetensors"))
    save_file({n: g.contiguous() for n, g in grads.items()}, os.path.join(d, "grads.safetensors"))
    save_file({n: p.detach().clone().contiguous() for n, p in model.named_parameters()},
              os.path.join(d, "final.safetensors"))
    info = common_json(model, input_ids, targets, steps)
    info.update({
        "model": kind,
        "architecture": model.config.architectures[0] if model.config.architectures
        else type(model).__name__,
        "num_parameters": model.num_parameters(),
        "num_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "tied": tied_names(model),
        # RoPE's inverse frequencies as transformers computed them (Llama 3 scaling included).
        "rope_inv_freq": [f32(x) for x in model.model.rotary_emb.inv_freq.tolist()]
        if hasattr(getattr(model, "model", None), "rotary_emb") else None,
        "parameters": [{"name": n, "shape": list(p.shape), "decay": p.ndim >= 2}
                       for n, p in model.named_parameters()],
    })
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def attach_lora(model, d):
    """PEFT's LoRA (r 4, alpha 8) on every projection of `model`; A ~ N(0, 0.1^2) and B ~ N(0,
    0.02^2) (PEFT's default B is zero, which would make A's gradient trivially zero). Saves the
    initial adapter into `d` (target_modules sorted, as PEFT writes them from a set) and returns the
    PEFT model in train mode."""
    from peft import LoraConfig, get_peft_model
    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                      target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    g = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_A" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    model.train()
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("README.md",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    cfg_path = os.path.join(d, "adapter_config.json")
    with open(cfg_path) as f:
        adapter_cfg = json.load(f)
    adapter_cfg["target_modules"] = sorted(adapter_cfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(adapter_cfg, f, indent=2, sort_keys=True)
    return model


def make_lora(out):
    d = os.path.join(out, "llama_lora")
    os.makedirs(d, exist_ok=True)
    model = attach_lora(build("llama"), d)
    targets_list = LORA_TARGETS
    input_ids, targets = make_tokens()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def peft_name(n):  # the names PEFT writes to adapter_model.safetensors
        return n.replace(".default", "")

    steps, logits, grads = train(model, params, input_ids, targets)
    save_file({"input_ids": input_ids, "targets": targets, "logits": logits.contiguous()},
              os.path.join(d, "io.safetensors"))
    save_file({peft_name(n): gr.contiguous() for n, gr in grads.items()},
              os.path.join(d, "grads.safetensors"))
    save_file({peft_name(n): p.detach().clone().contiguous() for n, p in params},
              os.path.join(d, "final.safetensors"))
    info = common_json(model, input_ids, targets, steps)
    info.update({
        "model": "llama_lora",
        "base": "../llama",
        "lora": {"r": 4, "alpha": 8, "scaling": 2.0, "targets": targets_list,
                 "init": "A ~ N(0, 0.1^2), B ~ N(0, 0.02^2)"},
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "num_trainable": sum(p.numel() for _, p in params),
        "parameters": [{"name": peft_name(n), "shape": list(p.shape), "decay": p.ndim >= 2}
                       for n, p in params],
    })
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def make_bnb4(out, base):
    """<base> quantized to NF4 by transformers + bitsandbytes on the CPU (docstring above)."""
    import bitsandbytes as bnb
    import transformers as tf
    src = os.path.join(out, base)
    d = os.path.join(out, base + "_bnb4")
    if not os.path.exists(os.path.join(src, "model.safetensors")):
        raise SystemExit(f"{base}_bnb4 quantizes {src}: write it first (--only {base},{base}_bnb4)")
    os.makedirs(d, exist_ok=True)
    qcfg = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                 bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
    model = tf.AutoModelForCausalLM.from_pretrained(src, quantization_config=qcfg,
                                                    device_map="cpu")
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))

    def dequantize(w):
        """bitsandbytes' dequantize_4bit, through its device-independent implementation
        (backends/default/ops.py, which its CUDA kernel matches): on an AVX-512 CPU its own CPU
        kernel (0.50.2) takes the wrong block scales when a row is not a multiple of the block
        size (GPT-2's 48-wide rows); where rows are, the two are checked to agree bit for bit."""
        from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
        qs = w.quant_state
        absmax = qs.absmax
        if qs.nested:  # as dequantize_4bit does
            absmax = bnb.functional.dequantize_blockwise(qs.absmax, qs.state2)
            absmax += qs.offset
        out = _dequantize_4bit_compute(w.data.reshape(-1), absmax.float(), qs.code, qs.blocksize,
                                       qs.shape, torch.float32)
        if qs.shape[-1] % qs.blocksize == 0:
            assert torch.equal(out, bnb.functional.dequantize_4bit(w.data, qs).float())
        return out.contiguous()

    def dequantized(m):
        return {f"{n}.weight": dequantize(mod.weight)
                for n, mod in m.named_modules() if isinstance(mod, bnb.nn.Linear4bit)}

    weights = dequantized(model)
    # The folder as transformers reads it back: same codes, and the logits to match.
    reloaded = tf.AutoModelForCausalLM.from_pretrained(d, device_map="cpu")
    reloaded.config._attn_implementation = "eager"
    again = dequantized(reloaded)
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k])
                                                  for k in weights), "reload changed the codes"
    save_file(weights, os.path.join(d, "dequant.safetensors"))
    info = {
        "versions": dict(versions(), bitsandbytes=bnb.__version__),
        "base": "../" + base,
        "quantization_config": reloaded.config.quantization_config.to_dict(),
        "loss": None,
        "quantized": [{"name": n, "shape": list(w.shape)} for n, w in weights.items()],
    }
    if base == "llama":
        input_ids, targets = make_tokens()
        with torch.no_grad():
            logits = reloaded(input_ids=input_ids).logits.float()
        save_file({"input_ids": input_ids, "targets": targets, "logits": logits.contiguous()},
                  os.path.join(d, "io.safetensors"))
        info["loss"] = f32(loss_fn(logits, targets).item())
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
    return info


def golden_setup(doc):
    """The --out folder of a golden script described by `doc` (default tests/goldens/), parsed from
    the command line, with torch made deterministic on one thread as every golden is written."""
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "goldens"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    return args.out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "goldens"))
    ap.add_argument("--only", default="",
                    help="comma-separated models to write (e.g. llama3_rope,qwen2); default all")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    kinds = ("llama", "qwen3", "gpt2", "llama3_rope", "mistral_window", "qwen2")
    if args.only:
        kinds = tuple(k for k in kinds if k in args.only.split(","))
    for kind in kinds:
        info = make_full(kind, args.out)
        print(f"{kind}: {info['num_parameters']} parameters, loss {info['loss']}, "
              f"final loss {info['steps'][-1]['loss']}")
    for base in ("llama", "gpt2"):  # reads <out>/<base>
        if not args.only or f"{base}_bnb4" in args.only.split(","):
            info = make_bnb4(args.out, base)
            print(f"{base}_bnb4: {len(info['quantized'])} NF4 weights, loss {info['loss']}")
    if args.only:
        return
    info = make_optimizer(args.out)
    print(f"adamw: clipped {[s['clipped'] for s in info['steps']]}")
    info = make_lora(args.out)
    print(f"llama_lora: {info['num_trainable']} trainable, loss {info['loss']}, "
          f"final loss {info['steps'][-1]['loss']}")
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total {total / 1024:.0f} KiB in {args.out}")


if __name__ == "__main__":
    main()
