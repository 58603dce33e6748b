// Test helper: tiny configs of every architecture and quirk ferry reads from Hugging Face folders
// (Llama, Llama 3 RoPE scaling with head_dim 64, Mistral sliding window with head_dim 128, Qwen2
// biases, Qwen3, GPT-2), deterministic weights for them, and ferry's logits on a CpuDevice.
//
// Shared by the model folder round-trip tests, the interop tool (tests/interop_tool.cc, which
// writes these models for scripts/interop_check.py) and the interop test that compares ferry's
// logits with the transformers logits the script committed: all three must see the same weights.
#pragma once

#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/model/param_spec.h"
#include "engine/model/weights_io.h"
#include "engine/testing/reference_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry::testing {

struct TinyModel {
  const char* name;
  const char* config_json;  // a Hugging Face config.json
};

// gtest prints a parameter by its name.
inline void PrintTo(const TinyModel& m, std::ostream* os) { *os << m.name; }

inline constexpr TinyModel kTinyModels[] = {
    {"llama", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
      "tie_word_embeddings": false})"},
    {"llama3", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
      "max_position_embeddings": 32, "rope_scaling": {"rope_type": "llama3", "factor": 4.0,
      "low_freq_factor": 0.25, "high_freq_factor": 1.0, "original_max_position_embeddings": 4}})"},
    {"mistral", R"({"model_type": "mistral", "architectures": ["MistralForCausalLM"],
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
      "max_position_embeddings": 32, "sliding_window": 3})"},
    {"qwen2", R"({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
      "tie_word_embeddings": true})"},
    {"qwen3", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
      "max_position_embeddings": 32, "tie_word_embeddings": true})"},
    {"gpt2", R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 40,
      "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 16})"},
};

// Fixed input: 12 tokens below every tiny vocabulary (40), longer than the Llama 3 original
// context (4) and the Mistral window (3).
inline const std::vector<int32_t>& TinyTokens() {
  static const std::vector<int32_t> kTokens = {1, 7, 3, 39, 0, 12, 5, 5, 22, 9, 30, 2};
  return kTokens;
}

// The LoRA the interop adapters use: rank 4, alpha 8, every projection.
inline LoraConfig TinyLora() { return {.rank = 4, .alpha = 8.0, .targets = kLoraAll}; }

// Every storage-owning parameter of `layers`, N(0, 0.3^2) from InitParameter (norm weights,
// biases and LoRA B too, so that a swapped, missing or ignored tensor changes the logits).
inline HostTensors TinyWeights(const std::vector<LayerSpec>& layers, uint64_t seed) {
  HostTensors w;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.tied_to.empty()) continue;
      std::vector<float>& t = w.tensors[p.name];
      t.resize(size_t(p.numel()));
      ParamSpec plain = p;
      plain.shape = {1, p.numel()};  // drawn as a matrix: normal values, never constant
      plain.lora = false;
      InitParameter(plain, seed, t, 0.3);
    }
  }
  return w;
}

// ferry's logits (T, V) for `tokens` as one sequence, computed in f32 on a CpuDevice.
inline Result<std::vector<float>> TinyLogits(const ModelConfig& c, const LoraConfig& lora,
                                             const HostTensors& w,
                                             std::span<const int32_t> tokens) {
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<CpuDevice> device,
      CpuDevice::Create({.memory_bytes = size_t(32) << 20, .compute_threads = 1}));
  ReferenceRunnerOptions o;
  o.shape = {1, int64_t(tokens.size())};
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                         CreateReferenceRunner(*device, c, lora, o));
  FERRY_RETURN_IF_ERROR(runner->UploadWeights(w));
  return runner->Logits(tokens);
}

}  // namespace ferry::testing
