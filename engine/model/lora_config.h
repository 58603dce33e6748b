// LoraConfig: which linear projections get a LoRA adapter, its rank and alpha.
//
// A LoRA'd projection computes y = x W^T + scaling * (x A^T) B^T with A (r, in), B (out, r) and
// scaling = alpha / r (PEFT's convention; with rsLoRA alpha / sqrt(r)); the base weight W is frozen
// (no gradient, no optimizer state), A and B train. Targets are named by the Llama projection they
// wrap; on GPT-2, q, k or v select the fused c_attn, o selects attn.c_proj, up mlp.c_fc, down
// mlp.c_proj (GPT-2 has no gate projection).
//
// Plain value type; thread-compatible.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/status.h"

namespace ferry {

enum LoraTarget : uint32_t {
  kLoraQ = 1u << 0,
  kLoraK = 1u << 1,
  kLoraV = 1u << 2,
  kLoraO = 1u << 3,
  kLoraGate = 1u << 4,
  kLoraUp = 1u << 5,
  kLoraDown = 1u << 6,
  kLoraAll = (1u << 7) - 1,
};

// How the frozen base's linear weights are stored. kNf4 is QLoRA's (kernels/nf4.h): every
// decoder-block projection weight in 4-bit NormalFloat, blocks of 64, as bitsandbytes stores it;
// embeddings, norms, biases and the head stay in the compute dtype. A quantized base is frozen:
// training needs LoRA on it (ValidateTrainingLora); inference (eval, generate) runs it with or
// without an adapter.
enum class BaseQuant : uint8_t { kNone, kNf4 };

struct LoraConfig {
  int64_t rank = 0;  // 0: no LoRA, full fine-tuning
  double alpha = 16.0;
  uint32_t targets = kLoraAll;  // a set of LoraTarget bits
  BaseQuant quantize = BaseQuant::kNone;
  // NF4's absmax itself 8-bit quantized (bitsandbytes' bnb_4bit_use_double_quant) in the host
  // tiers; the device copy keeps fp32 absmax.
  bool double_quant = true;
  // rsLoRA (PEFT's use_rslora): the adapter scaled by alpha / sqrt(rank) instead of alpha / rank,
  // so an update's size does not shrink as the rank grows (arXiv 2312.03732).
  bool rslora = false;

  bool enabled() const { return rank > 0; }
  // The base weights do not train: they are under LoRA, or stored quantized.
  bool base_frozen() const { return enabled() || quantize != BaseQuant::kNone; }
  // REQUIRES: enabled()
  double scaling() const { return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank); }
  bool Targets(LoraTarget t) const { return enabled() && (targets & t) != 0; }
  friend bool operator==(const LoraConfig&, const LoraConfig&) = default;
};

// Parses a comma-separated list: q,k,v,o,gate,up,down (the Hugging Face names q_proj, ...,
// down_proj work too) or "all". Errors name the unknown entry and list the valid ones.
Result<uint32_t> ParseLoraTargets(std::string_view list);
// "q,k,v,o,gate,up,down" order; "all" when every target is set.
std::string LoraTargetsToString(uint32_t targets);

// "none" or "nf4" (the --quantize values); "fp4" is refused as not supported yet.
Result<BaseQuant> ParseBaseQuant(std::string_view name);
std::string_view BaseQuantName(BaseQuant q);

// rank >= 0, alpha > 0 when rank > 0, at least one target. A quantized base without LoRA is
// valid: a model to run, with nothing to train.
Status ValidateLoraConfig(const LoraConfig& c);

// ValidateLoraConfig, and for a run that trains: a quantized base needs LoRA (QLoRA).
Status ValidateTrainingLora(const LoraConfig& c);

}  // namespace ferry
