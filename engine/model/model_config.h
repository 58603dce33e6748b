// ModelConfig: the architecture of a decoder language model, everything the layers, the
// parameter specs and the planner need to know about its shapes and numerics.
//
// Two families:
//  - Llama family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM): RMSNorm, RoPE (rotate-half),
//    SwiGLU MLP, grouped KV heads, optional q/k RMSNorm (Qwen3), optional q/k/v (Qwen2) or
//    q/k/v/o (Llama attention_bias) biases, tied or untied embeddings.
//  - GPT-2: LayerNorm with biases, learned positions, tanh GELU MLP, biases everywhere, Conv1D
//    weights stored (in, out), tied embeddings.
//
// A config comes from a Hugging Face config.json (ParseHfConfig; the presets in configs/models/
// are such files) or a built-in preset. Parsing refuses what ferry cannot describe with an
// InvalidArgument naming the field or the architecture. Llama 3 RoPE scaling (RopeInvFreq) and
// sliding windows (Mistral; Qwen2 with use_sliding_window) are trained as transformers runs them.
//
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_fwd.h"
#include "engine/text/byte_tokenizer.h"
#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry {

enum class ModelFamily { kLlama, kGpt2 };
enum class NormKind { kRmsNorm, kLayerNorm };
enum class Activation { kSiluGlu, kGeluTanh, kGeluExact };  // SwiGLU | GPT-2 "gelu_new" | "gelu"

std::string_view ModelFamilyName(ModelFamily f);  // "llama", "gpt2"

// The name config.json's torch_dtype gives `d`: "float32", "bfloat16" or "float16"; nullptr for
// any other dtype.
const char* TorchDTypeName(DType d);
// Every family ferry describes, in its schema table's order (model_config.cc).
std::vector<ModelFamily> ModelFamilies();
// The model types (config.json's model_type) family `f` reads: "llama", "mistral", "qwen2",
// "qwen3" for kLlama.
const std::vector<std::string_view>& ModelTypesOf(ModelFamily f);
// The model types of `families` as a message lists them: "llama, mistral, qwen2 and qwen3".
std::string ModelTypesList(const std::vector<ModelFamily>& families);

// Llama 3's RoPE frequency scaling (rope_type "llama3"); kind kNone: plain RoPE.
struct RopeScaling {
  enum class Kind { kNone, kLlama3 } kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 1.0;
  int64_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string architecture;  // Hugging Face class, e.g. "LlamaForCausalLM", "GPT2LMHeadModel"
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3", "gpt2"
  ModelFamily family = ModelFamily::kLlama;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // C
  int64_t intermediate_size = 0;  // MLP width (GPT-2: n_inner, default 4 C)
  int64_t num_layers = 0;
  int64_t num_heads = 0;                // query heads H
  int64_t num_kv_heads = 0;             // KV heads, divides H
  int64_t head_dim = 0;                 // need not be C / H (Qwen3, Gemma-style configs)
  int64_t max_position_embeddings = 0;  // GPT-2: n_positions (the learned table's rows)

  NormKind norm = NormKind::kRmsNorm;
  double norm_eps = 1e-5;
  Activation activation = Activation::kSiluGlu;
  bool tie_word_embeddings = false;
  bool qk_norm = false;            // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool qkv_bias = false;           // q/k/v projections have biases (Qwen2; Llama attention_bias)
  bool o_bias = false;             // output projection has a bias (Llama attention_bias)
  bool mlp_bias = false;           // Llama mlp_bias
  bool learned_positions = false;  // GPT-2's wpe table instead of RoPE
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t sliding_window = 0;  // attention window in tokens (Mistral); 0: full causal attention
  DType weights_dtype = DType::kF32;  // the checkpoint's torch_dtype / dtype

  // Recorded, not yet supported beyond "off": dropout is run at 0 (DESIGN.md, "Model").
  double dropout = 0.0;

  int64_t q_dim() const { return num_heads * head_dim; }      // width of q and of o's input
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // width of k and v
};

// Parses a Hugging Face config.json. Accepts model_type llama, mistral (without a sliding window
// shorter than max_position_embeddings), qwen2, qwen3 and gpt2; RoPE given either as the older
// `rope_theta` / `rope_scaling` fields or transformers 5's `rope_parameters`.
Result<ModelConfig> ParseHfConfig(std::string_view json_text);
// Reads and parses `path` (errors name the file).
Result<ModelConfig> LoadHfConfig(const std::string& path);

// Ok when ferry can train this config now; otherwise InvalidArgument naming the field that is
// not supported yet (every config ParseHfConfig accepts is trainable today).
Status CheckTrainable(const ModelConfig& c);

// The head_dim / 2 RoPE inverse frequencies of a Llama-family config, in fp32 as transformers
// computes them: plain 1 / theta^(2i / D), or for rope_type "llama3" the scaled table of
// transformers' _compute_llama3_parameters (long wavelengths divided by `factor`, short ones kept,
// the band between low_freq_factor and high_freq_factor interpolated), with the same fp32
// operations in the same order. REQUIRES: ValidateModelConfig(c) is ok and c has RoPE.
std::vector<float> RopeInvFreq(const ModelConfig& c);

// Shapes and values that make sense: positive sizes, heads dividing evenly, eps > 0, ...
// Errors name the field and say what to change.
Status ValidateModelConfig(const ModelConfig& c);

// The config as a Hugging Face config.json object (what transformers needs to load the weights
// ferry writes).
nlohmann::json ToHfConfigJson(const ModelConfig& c);

// Byte-level vocabulary of the built-in tiny model (engine/text/byte_tokenizer.h): 256 bytes,
// then the special tokens.
inline constexpr int64_t kTinyVocabSize = ByteTokenizer::kVocabSize;

// `ferry train`'s default model: a small Llama-style model (about 1.7 M parameters) that learns
// the built-in byte-level dataset on the CPU in a minute or two.
ModelConfig TinyLlamaPreset();

}  // namespace ferry
