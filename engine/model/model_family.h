// ModelFamilyDescription: everything ferry knows of one family of models, in one place: how its
// config.json is read, checked and written, the Hugging Face names of its tensors outside the
// blocks, its block's parameters (with their projections) and buffer layouts, and its blocks.
//
// Each family's block file defines its description next to the blocks it describes
// (decoder_block.cc: Llama, Mistral, Qwen2 and Qwen3; gpt2_block.cc: GPT-2), and Families()
// (model_stack.cc) lists them. Adding a family is its block file, a ModelFamily value and one
// line in that list; everything else (config.json, names, parameter specs, PEFT names, the memory
// model's buffers, the stack builder) reads the description.
//
// Internal to engine/model: model_config.h and model_stack.h are the interfaces the rest of the
// engine uses. Descriptions are immutable; thread-safe.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json.h"
#include "engine/model/decoder_blocks.h"
#include "engine/model/model_config.h"
#include "engine/model/model_stack.h"
#include "kernels/status.h"

namespace ferry {

// Typed access to config.json fields; every error names the field.
class ConfigFields {
 public:
  explicit ConfigFields(const nlohmann::json& j) : j_(j) {}

  bool Has(const char* key) const;
  Result<int64_t> Int(const char* key) const;
  Result<int64_t> Int(const char* key, int64_t dflt) const;
  Result<double> Number(const char* key, double dflt) const;
  Result<bool> Bool(const char* key, bool dflt) const;
  Result<std::string> String(const char* key, std::string dflt) const;

 private:
  const nlohmann::json& j_;
};

// InvalidArgument "config.json: <field> <why>".
Status ConfigUnsupported(const std::string& field, const std::string& why);
// rope_theta and its scaling from the older fields (rope_theta, rope_scaling) or transformers 5's
// rope_parameters: default RoPE or Llama 3's scaling.
Status ParseConfigRope(const nlohmann::json& j, const ConfigFields& f, ModelConfig* c);

struct ModelFamilyDescription {
  ModelFamily family;
  std::string_view name;  // ModelFamilyName
  // config.json: the model types the family reads, the class transformers names when the file
  // names none, and its fields read (after model_type and architectures; the weights' dtype is
  // read for every family), checked beyond ValidateModelConfig's shared checks (or null) and
  // written as parsing reads them.
  std::vector<std::string_view> model_types;
  std::string_view architecture;
  Status (*parse)(const nlohmann::json&, const ConfigFields&, ModelConfig*);
  Status (*validate)(const ModelConfig&);
  void (*write)(const ModelConfig&, nlohmann::json&);
  // Names outside the blocks; the blocks, their parameters in Hugging Face order (names under the
  // block prefix) and their buffers' bytes.
  FamilyNames names;
  Result<std::unique_ptr<DecoderBlocks>> (*create_blocks)(const BlocksContext&);
  BlockParams (*block_params)(const ModelConfig&);
  BlockBufferBytes (*buffer_bytes)(const BlockBufferArgs&);
  // Why its projections cannot be held in NF4, or nullptr: they can.
  const char* no_nf4 = nullptr;
};

// decoder_block.cc: Llama, Mistral, Qwen2, Qwen3. RMSNorm, q/k/v (+ biases), optional Qwen3 q/k
// RMSNorm, RoPE, GQA attention, o_proj, residual, RMSNorm, fused gate/up, SwiGLU, down, residual.
const ModelFamilyDescription& LlamaFamily();
// gpt2_block.cc: LayerNorm, fused c_attn with bias, attention, c_proj, residual, LayerNorm, c_fc,
// GELU, c_proj, residual.
const ModelFamilyDescription& Gpt2Family();

// Every family ferry runs.
std::span<const ModelFamilyDescription* const> Families();
// The description of `family`.
const ModelFamilyDescription& FamilyOf(ModelFamily family);

}  // namespace ferry
