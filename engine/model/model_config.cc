#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "engine/json.h"
#include "kernels/ops/rope_math.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

using nlohmann::json;

// Typed access to config.json fields; every error names the field.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  bool Has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  Result<int64_t> Int(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, "an integer");
    if (!it->is_number_integer()) return WrongType(key, "an integer");
    return it->get<int64_t>();
  }
  Result<int64_t> Int(const char* key, int64_t dflt) const {
    return Has(key) ? Int(key) : Result<int64_t>(dflt);
  }
  Result<double> Number(const char* key, double dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_number()) return WrongType(key, "a number");
    return v.get<double>();
  }
  Result<bool> Bool(const char* key, bool dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) return WrongType(key, "true or false");
    return v.get<bool>();
  }
  Result<std::string> String(const char* key, std::string dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) return WrongType(key, "a string");
    return v.get<std::string>();
  }

 private:
  static Status Missing(const char* key, const char* what) {
    return Status::InvalidArgument(std::string("config.json: field '") + key + "' is missing (" +
                                   what + " is required)");
  }
  static Status WrongType(const char* key, const char* what) {
    return Status::InvalidArgument(std::string("config.json: field '") + key + "' must be " + what);
  }
  const json& j_;
};

Status Unsupported(const std::string& field, const std::string& why) {
  return Status::InvalidArgument("config.json: " + field + " " + why);
}

// One RoPE description: null, {"rope_type"|"type": "default"} or a llama3 scaling; transformers
// 5's rope_parameters also carries rope_theta.
Status ParseRopeObject(const json& obj, const std::string& field, ModelConfig* c) {
  if (obj.is_null()) return Status::Ok();
  if (!obj.is_object()) return Unsupported("field '" + field + "'", "must be an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto t = obj.find(key);
    if (t == obj.end()) continue;
    if (!t->is_string())
      return Unsupported("field '" + field + "." + key + "'", "must be a string");
    type = t->get<std::string>();
  }
  Fields f(obj);
  FERRY_ASSIGN_OR_RETURN(c->rope_theta, f.Number("rope_theta", c->rope_theta));
  if (type == "default") return Status::Ok();
  if (type != "llama3") {
    return Unsupported("field '" + field + "' has rope type \"" + type + "\"",
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
    return Unsupported("field '" + field + "'",
                       "needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings > 0 for llama3 scaling");
  }
  return Status::Ok();
}

// rope_theta and scaling from the older fields or transformers 5's rope_parameters.
Status ParseRope(const json& j, const Fields& f, ModelConfig* c) {
  FERRY_ASSIGN_OR_RETURN(c->rope_theta, f.Number("rope_theta", 10000.0));
  if (auto it = j.find("rope_scaling"); it != j.end()) {
    FERRY_RETURN_IF_ERROR(ParseRopeObject(*it, "rope_scaling", c));
  }
  if (auto it = j.find("rope_parameters"); it != j.end()) {
    FERRY_RETURN_IF_ERROR(ParseRopeObject(*it, "rope_parameters", c));
  }
  return Status::Ok();
}

// Hugging Face's names of the checkpoint dtypes.
constexpr std::pair<DType, const char*> kTorchDTypes[] = {
    {DType::kF32, "float32"}, {DType::kBF16, "bfloat16"}, {DType::kF16, "float16"}};

// torch_dtype (transformers 4) or dtype (transformers 5); float32 when absent.
Status ParseWeightsDType(const Fields& f, ModelConfig* c) {
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
      return Unsupported(std::string("field '") + key + "' = \"" + name + "\"",
                         "is not supported (float32, bfloat16 or float16)");
    }
  }
  return Status::Ok();
}

Status ParseLlamaFamily(const json& j, const Fields& f, ModelConfig* c) {
  c->norm = NormKind::kRmsNorm;
  FERRY_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size"));
  FERRY_ASSIGN_OR_RETURN(c->hidden_size, f.Int("hidden_size"));
  FERRY_ASSIGN_OR_RETURN(c->intermediate_size, f.Int("intermediate_size"));
  FERRY_ASSIGN_OR_RETURN(c->num_layers, f.Int("num_hidden_layers"));
  FERRY_ASSIGN_OR_RETURN(c->num_heads, f.Int("num_attention_heads"));
  FERRY_ASSIGN_OR_RETURN(c->num_kv_heads, f.Int("num_key_value_heads", c->num_heads));
  const int64_t default_head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
  FERRY_ASSIGN_OR_RETURN(c->head_dim, f.Int("head_dim", default_head_dim));
  FERRY_ASSIGN_OR_RETURN(c->max_position_embeddings, f.Int("max_position_embeddings", 2048));
  FERRY_ASSIGN_OR_RETURN(c->norm_eps, f.Number("rms_norm_eps", 1e-6));
  FERRY_ASSIGN_OR_RETURN(c->tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  FERRY_ASSIGN_OR_RETURN(c->dropout, f.Number("attention_dropout", 0.0));
  FERRY_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu") {
    return Unsupported("field 'hidden_act' = \"" + act + "\"",
                       "is not supported for " + c->model_type + " (ferry runs SwiGLU: \"silu\")");
  }
  c->activation = Activation::kSiluGlu;
  FERRY_RETURN_IF_ERROR(ParseRope(j, f, c));

  FERRY_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  FERRY_ASSIGN_OR_RETURN(c->mlp_bias, f.Bool("mlp_bias", false));
  if (c->model_type == "qwen2") {
    c->qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
    c->o_bias = false;
  } else {
    c->qkv_bias = attention_bias;
    c->o_bias = attention_bias;
  }
  c->qk_norm = c->model_type == "qwen3";

  // Mistral applies sliding_window whenever it is set; Qwen2/3 only with use_sliding_window.
  bool windowed = c->model_type == "mistral";
  if (c->model_type == "qwen2" || c->model_type == "qwen3") {
    FERRY_ASSIGN_OR_RETURN(windowed, f.Bool("use_sliding_window", false));
  }
  if (windowed && f.Has("sliding_window")) {
    FERRY_ASSIGN_OR_RETURN(c->sliding_window, f.Int("sliding_window"));
    if (c->sliding_window <= 0) {
      return Unsupported("field 'sliding_window'", "must be positive or null");
    }
    if (c->sliding_window >= c->max_position_embeddings) c->sliding_window = 0;  // no effect
  }
  if (c->sliding_window > 0 && c->model_type != "mistral") {
    // Qwen2/3 window only the blocks from max_window_layers on (transformers' layer_types);
    // ferry windows all blocks or none.
    FERRY_ASSIGN_OR_RETURN(int64_t first, f.Int("max_window_layers", 28));
    if (first >= c->num_layers) {
      c->sliding_window = 0;  // no block is windowed
    } else if (first > 0) {
      return Unsupported(
          "fields 'use_sliding_window' with 'max_window_layers' = " + std::to_string(first) +
              " of " + std::to_string(c->num_layers) + " layers",
          "(a window on some blocks only) are not supported; ferry windows all "
          "blocks (max_window_layers 0) or none");
    }
  }
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    for (const json& t : *it) {
      const bool sliding = t == "sliding_attention";
      if ((!sliding && t != "full_attention") || sliding != (c->sliding_window > 0)) {
        return Unsupported("field 'layer_types' = " + it->dump(),
                           "is not supported: ferry runs every block with the same attention "
                           "(all \"full_attention\", or all \"sliding_attention\" with a window)");
      }
    }
  }
  return Status::Ok();
}

Status ParseGpt2(const json& j, const Fields& f, ModelConfig* c) {
  c->norm = NormKind::kLayerNorm;
  c->learned_positions = true;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  FERRY_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size"));
  FERRY_ASSIGN_OR_RETURN(c->hidden_size, f.Int("n_embd"));
  FERRY_ASSIGN_OR_RETURN(c->num_layers, f.Int("n_layer"));
  FERRY_ASSIGN_OR_RETURN(c->num_heads, f.Int("n_head"));
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
  // n_inner defaults to 4 C; a C so large that 4 C overflows is refused by validation below.
  constexpr int64_t kQuarter = std::numeric_limits<int64_t>::max() / 4;
  const int64_t default_inner = c->hidden_size >= -kQuarter && c->hidden_size <= kQuarter
                                    ? 4 * c->hidden_size
                                    : c->hidden_size;
  FERRY_ASSIGN_OR_RETURN(c->intermediate_size, f.Int("n_inner", default_inner));
  FERRY_ASSIGN_OR_RETURN(c->max_position_embeddings, f.Int("n_positions"));
  FERRY_ASSIGN_OR_RETURN(c->norm_eps, f.Number("layer_norm_epsilon", 1e-5));
  FERRY_ASSIGN_OR_RETURN(c->tie_word_embeddings, f.Bool("tie_word_embeddings", true));
  FERRY_ASSIGN_OR_RETURN(std::string act, f.String("activation_function", "gelu_new"));
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c->activation = Activation::kGeluTanh;
  } else if (act == "gelu") {
    c->activation = Activation::kGeluExact;
  } else {
    return Unsupported("field 'activation_function' = \"" + act + "\"",
                       "is not supported (use gelu_new, gelu_pytorch_tanh or gelu)");
  }
  FERRY_ASSIGN_OR_RETURN(bool scale, f.Bool("scale_attn_weights", true));
  FERRY_ASSIGN_OR_RETURN(bool inverse_idx, f.Bool("scale_attn_by_inverse_layer_idx", false));
  FERRY_ASSIGN_OR_RETURN(bool cross, f.Bool("add_cross_attention", false));
  if (!scale) return Unsupported("field 'scale_attn_weights' = false", "is not supported");
  if (inverse_idx) {
    return Unsupported("field 'scale_attn_by_inverse_layer_idx' = true", "is not supported");
  }
  if (cross) return Unsupported("field 'add_cross_attention' = true", "is not supported");
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    FERRY_ASSIGN_OR_RETURN(double p, f.Number(key, 0.0));
    c->dropout = std::max(c->dropout, p);
  }
  (void)j;
  return Status::Ok();
}

// GPT-2's head_dim is n_embd / n_head: the heads must tile the hidden size.
Status ValidateGpt2(const ModelConfig& c) {
  if (c.num_heads * c.head_dim == c.hidden_size) return Status::Ok();
  return Status::InvalidArgument("model config: n_embd = " + std::to_string(c.hidden_size) +
                                 " must be a multiple of n_head = " + std::to_string(c.num_heads));
}

// config.json of the Llama family: the fields parsing read, as transformers writes them.
void WriteLlamaFamily(const ModelConfig& c, json& j) {
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  if (c.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  if (c.sliding_window > 0) {
    j["sliding_window"] = c.sliding_window;
    if (c.model_type != "mistral") {
      j["use_sliding_window"] = true;
      j["max_window_layers"] = 0;  // every block windowed, as ferry runs it
    }
  }
  j["hidden_act"] = "silu";
  j["attention_dropout"] = c.dropout;
  if (c.model_type != "qwen2") j["attention_bias"] = c.qkv_bias;
  if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
}

void WriteGpt2(const ModelConfig& c, json& j) {
  j["n_embd"] = c.hidden_size;
  j["n_layer"] = c.num_layers;
  j["n_head"] = c.num_heads;
  j["n_inner"] = c.intermediate_size;
  j["n_positions"] = c.max_position_embeddings;
  j["layer_norm_epsilon"] = c.norm_eps;
  j["activation_function"] = c.activation == Activation::kGeluExact ? "gelu" : "gelu_new";
  j["resid_pdrop"] = j["embd_pdrop"] = j["attn_pdrop"] = c.dropout;
}

// One family's config.json schema: the model types it reads, the class transformers names when
// the file names none, and how its fields are read, checked and written.
struct ConfigSchema {
  ModelFamily family;
  std::string_view name;
  std::vector<std::string_view> model_types;
  std::string_view architecture;
  Status (*parse)(const json&, const Fields&, ModelConfig*);
  Status (*validate)(const ModelConfig&);  // beyond ValidateModelConfig's shared checks, or null
  void (*write)(const ModelConfig&, json&);
};

const std::vector<ConfigSchema>& Schemas() {
  static const std::vector<ConfigSchema> kSchemas = {
      {ModelFamily::kLlama,
       "llama",
       {"llama", "mistral", "qwen2", "qwen3"},
       "LlamaForCausalLM",
       &ParseLlamaFamily,
       nullptr,
       &WriteLlamaFamily},
      {ModelFamily::kGpt2,
       "gpt2",
       {"gpt2"},
       "GPT2LMHeadModel",
       &ParseGpt2,
       &ValidateGpt2,
       &WriteGpt2},
  };
  return kSchemas;
}

const ConfigSchema& SchemaOf(ModelFamily f) {
  for (const ConfigSchema& s : Schemas()) {
    if (s.family == f) return s;
  }
  return Schemas().front();
}

Status Positive(const char* field, int64_t v) {
  if (v > 0) return Status::Ok();
  return Status::InvalidArgument(std::string("model config: ") + field + " = " + std::to_string(v) +
                                 " must be positive");
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily f) { return SchemaOf(f).name; }

std::vector<ModelFamily> ModelFamilies() {
  std::vector<ModelFamily> out;
  for (const ConfigSchema& s : Schemas()) out.push_back(s.family);
  return out;
}

const std::vector<std::string_view>& ModelTypesOf(ModelFamily f) { return SchemaOf(f).model_types; }

std::string ModelTypesList(const std::vector<ModelFamily>& families) {
  std::vector<std::string_view> types;
  for (ModelFamily f : families) {
    types.insert(types.end(), ModelTypesOf(f).begin(), ModelTypesOf(f).end());
  }
  std::string out;
  for (size_t i = 0; i < types.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == types.size() ? " and " : ", ") + std::string(types[i]);
  }
  return out;
}

Result<ModelConfig> ParseHfConfig(std::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("config.json is not well-formed JSON");
  if (!j.is_object()) return Status::InvalidArgument("config.json is not a JSON object");
  Fields f(j);
  ModelConfig c;
  FERRY_ASSIGN_OR_RETURN(c.model_type, f.String("model_type", ""));
  if (auto it = j.find("architectures");
      it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    c.architecture = (*it)[0].get<std::string>();
  }
  if (c.model_type.empty()) {
    return Status::InvalidArgument("config.json: field 'model_type' is missing");
  }
  const ConfigSchema* schema = nullptr;
  for (const ConfigSchema& sc : Schemas()) {
    if (std::ranges::find(sc.model_types, c.model_type) != sc.model_types.end()) schema = &sc;
  }
  if (schema == nullptr) {
    std::string arch = c.architecture.empty() ? "" : " (" + c.architecture + ")";
    return Status::InvalidArgument("config.json: model_type '" + c.model_type + "'" + arch +
                                   " is not supported; ferry runs " +
                                   ModelTypesList(ModelFamilies()));
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
  if (const ConfigSchema& schema = SchemaOf(c.family); schema.validate != nullptr) {
    FERRY_RETURN_IF_ERROR(schema.validate(c));
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

const char* TorchDTypeName(DType d) {
  for (auto [dtype, torch_name] : kTorchDTypes) {
    if (dtype == d) return torch_name;
  }
  return nullptr;
}

nlohmann::json ToHfConfigJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (const char* torch_name = TorchDTypeName(c.weights_dtype)) j["torch_dtype"] = torch_name;
  SchemaOf(c.family).write(c, j);
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
