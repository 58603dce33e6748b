#include "engine/model/model_config.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "engine/json.h"
#include "engine/model/model_family.h"
#include "kernels/ops/rope_math.h"
#include "offload/file_io.h"

namespace ferry {

using nlohmann::json;

namespace {

Status Missing(const char* key, const char* what) {
  return Status::InvalidArgument(std::string("config.json: field '") + key + "' is missing (" +
                                 what + " is required)");
}
Status WrongType(const char* key, const char* what) {
  return Status::InvalidArgument(std::string("config.json: field '") + key + "' must be " + what);
}

}  // namespace

bool ConfigFields::Has(const char* key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}
Result<int64_t> ConfigFields::Int(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return Missing(key, "an integer");
  if (!it->is_number_integer()) return WrongType(key, "an integer");
  return it->get<int64_t>();
}
Result<int64_t> ConfigFields::Int(const char* key, int64_t dflt) const {
  return Has(key) ? Int(key) : Result<int64_t>(dflt);
}
Result<double> ConfigFields::Number(const char* key, double dflt) const {
  if (!Has(key)) return dflt;
  const json& v = j_.at(key);
  if (!v.is_number()) return WrongType(key, "a number");
  return v.get<double>();
}
Result<bool> ConfigFields::Bool(const char* key, bool dflt) const {
  if (!Has(key)) return dflt;
  const json& v = j_.at(key);
  if (!v.is_boolean()) return WrongType(key, "true or false");
  return v.get<bool>();
}
Result<std::string> ConfigFields::String(const char* key, std::string dflt) const {
  if (!Has(key)) return dflt;
  const json& v = j_.at(key);
  if (!v.is_string()) return WrongType(key, "a string");
  return v.get<std::string>();
}

Status ConfigUnsupported(const std::string& field, const std::string& why) {
  return Status::InvalidArgument("config.json: " + field + " " + why);
}

namespace {

// One RoPE description: null, {"rope_type"|"type": "default"} or a llama3 scaling; transformers
// 5's rope_parameters also carries rope_theta.
Status ParseRopeObject(const json& obj, const std::string& field, ModelConfig* c) {
  if (obj.is_null()) return Status::Ok();
  if (!obj.is_object())
    return ConfigUnsupported("field '" + field + "'", "must be an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto t = obj.find(key);
    if (t == obj.end()) continue;
    if (!t->is_string())
      return ConfigUnsupported("field '" + field + "." + key + "'", "must be a string");
    type = t->get<std::string>();
  }
  ConfigFields f(obj);
  FERRY_ASSIGN_OR_RETURN(c->rope_theta, f.Number("rope_theta", c->rope_theta));
  if (type == "default") return Status::Ok();
  if (type != "llama3") {
    return ConfigUnsupported("field '" + field + "' has rope type \"" + type + "\"",
                             "which ferry does not support (default and llama3 are)");
  }
  RopeScaling& r = c->rope_scaling;
  r.kind = RopeScaling::Kind::kLlama3;
  FERRY_ASSIGN_OR_RETURN(r.factor, f.Number("factor", 0.0));
  FERRY_ASSIGN_OR_RETURN(r.low_freq_factor, f.Number("low_freq_factor", 0.0));
  FERRY_ASSIGN_OR_RETURN(r.high_freq_factor, f.Number("high_freq_factor", 0.0));
  FERRY_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                         f.Int("original_max_position_embeddings"));
  if (!(r.factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
      r.original_max_position_embeddings <= 0) {
    return ConfigUnsupported("field '" + field + "'",
                             "needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                             "original_max_position_embeddings > 0 for llama3 scaling");
  }
  return Status::Ok();
}

}  // namespace

Status ParseConfigRope(const json& j, const ConfigFields& f, ModelConfig* c) {
  FERRY_ASSIGN_OR_RETURN(c->rope_theta, f.Number("rope_theta", 10000.0));
  if (auto it = j.find("rope_scaling"); it != j.end()) {
    FERRY_RETURN_IF_ERROR(ParseRopeObject(*it, "rope_scaling", c));
  }
  if (auto it = j.find("rope_parameters"); it != j.end()) {
    FERRY_RETURN_IF_ERROR(ParseRopeObject(*it, "rope_parameters", c));
  }
  return Status::Ok();
}

namespace {

// Hugging Face's names of the checkpoint dtypes.
constexpr std::pair<DType, const char*> kTorchDTypes[] = {
    {DType::kF32, "float32"}, {DType::kBF16, "bfloat16"}, {DType::kF16, "float16"}};

// torch_dtype (transformers 4) or dtype (transformers 5); float32 when absent.
Status ParseWeightsDType(const ConfigFields& f, ModelConfig* c) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!f.Has(key)) continue;
    FERRY_ASSIGN_OR_RETURN(std::string name, f.String(key, ""));
    bool known = false;
    for (auto [dtype, torch_name] : kTorchDTypes) {
      if (name == torch_name) {
        c->weights_dtype = dtype;
        known = true;
      }
    }
    if (!known) {
      return ConfigUnsupported(std::string("field '") + key + "' = \"" + name + "\"",
                               "is not supported (float32, bfloat16 or float16)");
    }
  }
  return Status::Ok();
}

Status Positive(const char* field, int64_t v) {
  if (v > 0) return Status::Ok();
  return Status::InvalidArgument(std::string("model config: ") + field + " = " + std::to_string(v) +
                                 " must be positive");
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily f) { return FamilyOf(f).name; }

Result<ModelConfig> ParseHfConfig(std::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("config.json is not well-formed JSON");
  if (!j.is_object()) return Status::InvalidArgument("config.json is not a JSON object");
  ConfigFields f(j);
  ModelConfig c;
  FERRY_ASSIGN_OR_RETURN(c.model_type, f.String("model_type", ""));
  if (auto it = j.find("architectures");
      it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    c.architecture = (*it)[0].get<std::string>();
  }
  if (c.model_type.empty()) {
    return Status::InvalidArgument("config.json: field 'model_type' is missing");
  }
  const ModelFamilyDescription* schema = nullptr;
  std::string known;  // "llama, mistral, qwen2, qwen3 and gpt2"
  for (const ModelFamilyDescription* sc : Families()) {
    for (std::string_view type : sc->model_types) {
      if (type == c.model_type) schema = sc;
      known += (known.empty() ? "" : ", ") + std::string(type);
    }
  }
  if (const size_t last = known.rfind(", "); last != std::string::npos) {
    known.replace(last, 2, " and ");
  }
  if (schema == nullptr) {
    std::string arch = c.architecture.empty() ? "" : " (" + c.architecture + ")";
    return Status::InvalidArgument("config.json: model_type '" + c.model_type + "'" + arch +
                                   " is not supported; ferry runs " + known);
  }
  c.family = schema->family;
  FERRY_RETURN_IF_ERROR(schema->parse(j, f, &c));
  FERRY_RETURN_IF_ERROR(ParseWeightsDType(f, &c));
  if (c.architecture.empty()) c.architecture = schema->architecture;
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

Result<ModelConfig> LoadHfConfig(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status().WithContext("model config");
  Result<ModelConfig> c = ParseHfConfig(*text);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Status CheckTrainable(const ModelConfig& c) {
  (void)c;  // RoPE scaling and sliding windows are trainable; the hook stays for what comes next
  return Status::Ok();
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  std::vector<float> f = RopeInverseFrequencies(float(c.rope_theta), c.head_dim);
  if (c.rope_scaling.kind != RopeScaling::Kind::kLlama3) return f;
  // transformers' fp32 tensor arithmetic, Python scalars taken to fp32 (as torch does for a
  // float tensor): `s / t` is t.reciprocal() * s (Tensor.__rtruediv__).
  const RopeScaling& r = c.rope_scaling;
  const float factor = float(r.factor), low = float(r.low_freq_factor);
  const float band = float(r.high_freq_factor - r.low_freq_factor);
  const double old_len = double(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor;  // Python floats: double
  const double high_wavelen = old_len / r.high_freq_factor;
  const float two_pi = float(2.0 * std::numbers::pi);
  for (float& inv : f) {
    const float wavelen = (1.0f / inv) * two_pi;
    // torch compares the fp32 tensor with the double scalar cast to fp32.
    const bool long_wave = wavelen > float(low_wavelen);
    const bool short_wave = wavelen < float(high_wavelen);
    const float scaled = long_wave ? inv / factor : inv;
    if (long_wave || short_wave) {
      inv = scaled;
      continue;
    }
    const float smooth = ((1.0f / wavelen) * float(old_len) - low) / band;
    inv = (1.0f - smooth) * scaled / factor + smooth * scaled;
  }
  return f;
}

Status ValidateModelConfig(const ModelConfig& c) {
  FERRY_RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  FERRY_RETURN_IF_ERROR(Positive("hidden_size", c.hidden_size));
  FERRY_RETURN_IF_ERROR(Positive("intermediate_size", c.intermediate_size));
  FERRY_RETURN_IF_ERROR(Positive("num_hidden_layers", c.num_layers));
  FERRY_RETURN_IF_ERROR(Positive("num_attention_heads", c.num_heads));
  FERRY_RETURN_IF_ERROR(Positive("num_key_value_heads", c.num_kv_heads));
  FERRY_RETURN_IF_ERROR(Positive("head_dim", c.head_dim));
  FERRY_RETURN_IF_ERROR(Positive("max_position_embeddings", c.max_position_embeddings));
  if (c.num_heads % c.num_kv_heads != 0) {
    return Status::InvalidArgument(
        "model config: num_attention_heads = " + std::to_string(c.num_heads) +
        " must be a multiple of num_key_value_heads = " + std::to_string(c.num_kv_heads));
  }
  if (const ModelFamilyDescription& family = FamilyOf(c.family); family.validate != nullptr) {
    FERRY_RETURN_IF_ERROR(family.validate(c));
  }
  if (!c.learned_positions && c.head_dim % 2 != 0) {
    return Status::InvalidArgument("model config: head_dim = " + std::to_string(c.head_dim) +
                                   " must be even for RoPE");
  }
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
    return Status::InvalidArgument("model config: the norm epsilon must be a positive number");
  }
  if (!c.learned_positions && !(c.rope_theta > 0 && std::isfinite(c.rope_theta))) {
    return Status::InvalidArgument("model config: rope_theta must be a positive number");
  }
  if (!(c.dropout >= 0 && c.dropout < 1)) {
    return Status::InvalidArgument("model config: dropout must lie in [0, 1)");
  }
  // Keeps every size product (params, activations) far from int64 overflow.
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                    c.head_dim, c.max_position_embeddings}) {
    if (v > kMaxDim) {
      return Status::InvalidArgument("model config: a dimension of " + std::to_string(v) +
                                     " exceeds ferry's limit of " + std::to_string(kMaxDim));
    }
  }
  return Status::Ok();
}

nlohmann::json ToHfConfigJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  for (auto [dtype, torch_name] : kTorchDTypes) {
    if (dtype == c.weights_dtype) j["torch_dtype"] = torch_name;
  }
  FamilyOf(c.family).write(c, j);
  return j;
}

ModelConfig TinyLlamaPreset() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.family = ModelFamily::kLlama;
  c.vocab_size = kTinyVocabSize;
  c.hidden_size = 192;
  c.intermediate_size = 512;
  c.num_layers = 4;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 512;
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = 1e-5;
  c.activation = Activation::kSiluGlu;
  c.tie_word_embeddings = false;
  c.rope_theta = 10000.0;
  return c;
}

}  // namespace ferry
