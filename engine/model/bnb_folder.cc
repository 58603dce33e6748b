#include "engine/model/bnb_folder.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "engine/json.h"
#include "engine/model/model_stack.h"
#include "engine/model/weights_io.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::pair<DType, const char*> kComputeDTypes[] = {
    {DType::kF32, "float32"}, {DType::kBF16, "bfloat16"}, {DType::kF16, "float16"}};

// The torch dtypes bitsandbytes may view the packed bytes as (bnb_4bit_quant_storage).
constexpr const char* kStorageDTypes[] = {"uint8",   "int8",    "bfloat16", "float16",
                                          "float32", "float64", "int16",    "int32",
                                          "int64",   "uint16",  "uint32",   "uint64"};

// The tensors bitsandbytes writes beside a quantized weight "W" (as "W" + suffix).
constexpr const char* kAbsmax = ".absmax";
constexpr const char* kQuantMap = ".quant_map";
constexpr const char* kNestedAbsmax = ".nested_absmax";
constexpr const char* kNestedQuantMap = ".nested_quant_map";
constexpr const char* kFp4State = ".quant_state.bitsandbytes__fp4";
constexpr const char* kCompanions[] = {kAbsmax,         kQuantMap, kNestedAbsmax,
                                       kNestedQuantMap, kFp4State, kBnbQuantStateSuffix.data()};

constexpr int64_t kNf4CodeSize = 16;
constexpr int64_t kNestedCodeSize = 256;

Status BadSetting(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("config.json: quantization_config." + field + " " + what);
}

// "torch.bfloat16" and "bfloat16" both name bfloat16.
std::string TorchDTypeName(std::string name) {
  if (name.starts_with("torch.")) name = name.substr(6);
  return name;
}

// Where the companion tensors of one quantized weight are read, and how its errors read.
class WeightTensors {
 public:
  WeightTensors(const FolderWeights& folder, const std::string& name)
      : folder_(folder), name_(name) {}

  bool Has(std::string_view suffix) const {
    return folder_.FileOf(name_ + std::string(suffix)) != nullptr;
  }

  // The tensor "<weight><suffix>" ("" for the packed weight itself) and its file.
  Result<std::pair<const SafetensorsFile*, const SafetensorsTensorInfo*>> Get(
      std::string_view suffix) const {
    const std::string tensor = name_ + std::string(suffix);
    const SafetensorsFile* file = folder_.FileOf(tensor);
    if (file == nullptr) {
      return Status::NotFound(
          "model folder " + folder_.dir() + ": quantized weight '" + name_ +
          "' lacks its companion tensor '" + tensor +
          "' (bitsandbytes writes the packed weight with .absmax, .quant_map, "
          "[.nested_absmax, .nested_quant_map,] and .quant_state.bitsandbytes__nf4; is the "
          "folder complete?)");
    }
    return std::make_pair(file, file->Find(tensor));
  }

  // An error about the tensor "<weight><suffix>": Corruption, or InvalidArgument for what ferry
  // does not support or what disagrees with config.json (`unsupported`).
  Status Bad(std::string_view suffix, const std::string& what, bool unsupported = false) const {
    const std::string tensor = name_ + std::string(suffix);
    const SafetensorsFile* file = folder_.FileOf(tensor);
    const std::string where = file != nullptr ? " in " + file->path() : "";
    std::string msg = "tensor '" + tensor + "'" + where + " " + what;
    return unsupported ? Status::InvalidArgument(std::move(msg))
                       : Status::Corruption(std::move(msg));
  }

  // The floats of "<weight><suffix>", which must hold `count` finite values.
  Result<std::vector<float>> Floats(std::string_view suffix, int64_t count,
                                    const std::string& what) const {
    FERRY_ASSIGN_OR_RETURN(auto t, Get(suffix));
    FERRY_ASSIGN_OR_RETURN(std::vector<float> v, t.first->ReadFloats(t.second->name));
    if (int64_t(v.size()) != count) {
      return Bad(suffix, "has " + std::to_string(v.size()) + " values " +
                             ShapeToString(t.second->shape) + ", expected " +
                             std::to_string(count) + " (" + what + ")");
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        return Bad(suffix, "holds a non-finite value at index " + std::to_string(i));
      }
    }
    return v;
  }

  // The bytes of a U8 tensor "<weight><suffix>".
  Result<std::vector<uint8_t>> Bytes(std::string_view suffix) const {
    FERRY_ASSIGN_OR_RETURN(auto t, Get(suffix));
    if (t.second->dtype != SafetensorsDType::kU8) {
      return Bad(suffix,
                 "is " + std::string(SafetensorsDTypeName(t.second->dtype)) + ", expected U8");
    }
    return RawBytes(*t.first, *t.second);
  }

  // The bytes of any tensor, reinterpreted (the packed weight in any quant storage).
  static std::vector<uint8_t> RawBytes(const SafetensorsFile& file,
                                       const SafetensorsTensorInfo& info) {
    std::span<const std::byte> data = file.Data(info);
    std::vector<uint8_t> out(data.size());
    if (!out.empty()) std::memcpy(out.data(), data.data(), data.size());
    ReleaseMappedPages(data);  // read once per packing: the pages leave the resident set
    return out;
  }

 private:
  const FolderWeights& folder_;
  const std::string& name_;
};

// The quant-state JSON's fields, typed, every error naming the tensor.
class QuantStateFields {
 public:
  QuantStateFields(const json& j, const WeightTensors& w) : j_(j), w_(w) {}

  bool Has(const char* key) const { return j_.contains(key); }

  Result<int64_t> Int(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key);
    if (!it->is_number_integer()) return Bad(key, "must be an integer");
    return it->get<int64_t>();
  }
  Result<std::string> String(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key);
    if (!it->is_string()) return Bad(key, "must be a string");
    return it->get<std::string>();
  }
  Result<double> Number(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key);
    if (!it->is_number() || !std::isfinite(it->get<double>())) {
      return Bad(key, "must be a finite number");
    }
    return it->get<double>();
  }
  Result<std::vector<int64_t>> Shape(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key);
    std::vector<int64_t> shape;
    if (it->is_array() && !it->empty()) {
      for (const json& d : *it) {
        if (!d.is_number_integer() || d.get<int64_t>() <= 0) return Bad(key, BadShapeText());
        shape.push_back(d.get<int64_t>());
      }
      return shape;
    }
    return Bad(key, BadShapeText());
  }

  Status Bad(const char* key, const std::string& what, bool unsupported = false) const {
    return w_.Bad(kBnbQuantStateSuffix, std::string("(quant state): field '") + key + "' " + what,
                  unsupported);
  }

 private:
  static std::string BadShapeText() { return "must be a non-empty list of positive integers"; }
  Status Missing(const char* key) const {
    return Bad(key, "is missing (a truncated or inconsistent quant state)");
  }
  const json& j_;
  const WeightTensors& w_;
};

int64_t Numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

Result<std::optional<Bnb4bitSettings>> ParseBnb4bitSettings(std::string_view config_json_text) {
  const json j = json::parse(config_json_text.begin(), config_json_text.end(), nullptr,
                             /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("config.json is not a well-formed JSON object");
  }
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return std::optional<Bnb4bitSettings>();
  if (!q->is_object()) {
    return Status::InvalidArgument("config.json: quantization_config must be an object");
  }
  auto get = [&](const char* key) -> const json* {
    auto it = q->find(key);
    return it == q->end() || it->is_null() ? nullptr : &*it;
  };
  auto flag = [&](const char* key) -> Result<bool> {
    const json* v = get(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) return BadSetting(key, "must be true or false");
    return v->get<bool>();
  };
  const json* method = get("quant_method");
  if (method != nullptr && !method->is_string()) {
    return BadSetting("quant_method", "must be a string");
  }
  // Folders written before transformers named the method have only the load_in_* flags.
  const bool legacy = method == nullptr && (get("load_in_4bit") || get("load_in_8bit"));
  if (!legacy && (method == nullptr || *method != "bitsandbytes")) {
    const std::string name = method != nullptr ? "= \"" + method->get<std::string>() + "\"" : "";
    return BadSetting("quant_method", (name.empty() ? "is missing" : name + " is not supported") +
                                          ": ferry reads bitsandbytes 4-bit (nf4) folders; give "
                                          "the unquantized model instead");
  }
  FERRY_ASSIGN_OR_RETURN(bool load_in_8bit, flag("load_in_8bit"));
  FERRY_ASSIGN_OR_RETURN(bool load_in_4bit, flag("load_in_4bit"));
  if (load_in_8bit) {
    return BadSetting("load_in_8bit",
                      "= true: 8-bit bitsandbytes folders are not supported (ferry "
                      "reads 4-bit nf4 ones); give the unquantized model instead");
  }
  if (!load_in_4bit) {
    return BadSetting("load_in_4bit", "must be true (ferry reads bitsandbytes 4-bit folders)");
  }
  Bnb4bitSettings s;
  // transformers' BitsAndBytesConfig defaults to fp4 when the field is absent.
  s.quant_type = "fp4";
  if (const json* t = get("bnb_4bit_quant_type"); t != nullptr) {
    if (!t->is_string()) return BadSetting("bnb_4bit_quant_type", "must be a string");
    s.quant_type = t->get<std::string>();
  }
  if (s.quant_type == "fp4") {
    return BadSetting("bnb_4bit_quant_type",
                      "= \"fp4\" is not supported yet (ferry reads nf4 only); quantize with "
                      "bnb_4bit_quant_type=\"nf4\" or give the unquantized model");
  }
  if (s.quant_type != "nf4") {
    return BadSetting("bnb_4bit_quant_type", "= \"" + s.quant_type + "\" must be \"nf4\"");
  }
  FERRY_ASSIGN_OR_RETURN(s.double_quant, flag("bnb_4bit_use_double_quant"));
  if (const json* d = get("bnb_4bit_compute_dtype"); d != nullptr) {
    if (!d->is_string()) return BadSetting("bnb_4bit_compute_dtype", "must be a string");
    const std::string name = TorchDTypeName(d->get<std::string>());
    bool known = false;
    for (auto [dtype, torch_name] : kComputeDTypes) {
      if (name == torch_name) {
        s.compute_dtype = dtype;
        known = true;
      }
    }
    if (!known) {
      return BadSetting("bnb_4bit_compute_dtype",
                        "= \"" + name + "\" must be float32, bfloat16 or float16");
    }
  }
  if (const json* st = get("bnb_4bit_quant_storage"); st != nullptr) {
    if (!st->is_string()) return BadSetting("bnb_4bit_quant_storage", "must be a string");
    s.quant_storage = TorchDTypeName(st->get<std::string>());
    bool known = false;
    for (const char* name : kStorageDTypes) known = known || s.quant_storage == name;
    if (!known) {
      return BadSetting(
          "bnb_4bit_quant_storage",
          "= \"" + s.quant_storage + "\" is not a torch dtype bitsandbytes stores in");
    }
  }
  if (const json* skip = get("llm_int8_skip_modules"); skip != nullptr) {
    if (!skip->is_array()) return BadSetting("llm_int8_skip_modules", "must be a list of names");
    for (const json& m : *skip) {
      if (!m.is_string()) return BadSetting("llm_int8_skip_modules", "must be a list of names");
      s.skip_modules.push_back(m.get<std::string>());
    }
  }
  return std::optional<Bnb4bitSettings>(std::move(s));
}

Result<std::optional<Bnb4bitSettings>> LoadBnb4bitSettings(const std::string& dir) {
  const std::string path = dir + "/config.json";
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  Result<std::optional<Bnb4bitSettings>> s = ParseBnb4bitSettings(text);
  if (!s.ok()) return s.status().WithContext(path);
  return s;
}

bool IsBnbQuantized(const FolderWeights& folder, std::string_view param_name) {
  for (const char* suffix : kCompanions) {
    if (folder.FileOf(std::string(param_name) + suffix) != nullptr) return true;
  }
  return false;
}

Result<Nf4Host> ReadBnb4bitWeight(const FolderWeights& folder, const std::string& name,
                                  std::span<const int64_t> shape) {
  const WeightTensors w(folder, name);
  const std::string_view state_suffix = kBnbQuantStateSuffix;
  if (!w.Has(state_suffix) && w.Has(kFp4State)) {
    return w.Bad(kFp4State,
                 "quantizes '" + name + "' to fp4, which ferry does not support yet (nf4 only)",
                 /*unsupported=*/true);
  }
  // The JSON quant state first: it says what the tensors must be.
  FERRY_ASSIGN_OR_RETURN(std::vector<uint8_t> state_bytes, w.Bytes(state_suffix));
  const json j = json::parse(state_bytes.begin(), state_bytes.end(), nullptr,
                             /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return w.Bad(state_suffix, "does not hold a well-formed JSON object (" +
                                   std::to_string(state_bytes.size()) +
                                   " bytes): the quant state is truncated or corrupt");
  }
  const QuantStateFields f(j, w);
  FERRY_ASSIGN_OR_RETURN(std::string quant_type, f.String("quant_type"));
  if (quant_type != "nf4") {
    return f.Bad("quant_type",
                 "= \"" + quant_type + "\": ferry reads nf4 only" +
                     (quant_type == "fp4" ? " (fp4 is not supported yet)" : ""),
                 /*unsupported=*/true);
  }
  FERRY_ASSIGN_OR_RETURN(int64_t blocksize, f.Int("blocksize"));
  if (blocksize != kNf4Block) {
    return f.Bad("blocksize",
                 "= " + std::to_string(blocksize) + " is not supported: ferry " +
                     "computes with blocks of " + std::to_string(kNf4Block) +
                     " (bitsandbytes' default); requantize with blocksize " +
                     std::to_string(kNf4Block),
                 /*unsupported=*/true);
  }
  FERRY_ASSIGN_OR_RETURN(std::string dtype, f.String("dtype"));
  bool float_dtype = false;
  for (auto [d, torch_name] : kComputeDTypes) float_dtype = float_dtype || dtype == torch_name;
  if (!float_dtype) {
    return f.Bad("dtype", "= \"" + dtype + "\" must be float32, bfloat16 or float16");
  }
  Nf4Host out;
  FERRY_ASSIGN_OR_RETURN(out.shape, f.Shape("shape"));
  if (!std::equal(out.shape.begin(), out.shape.end(), shape.begin(), shape.end())) {
    return f.Bad("shape",
                 "= " + ShapeToString(out.shape) + " but config.json implies " +
                     ShapeToString(shape) + " for '" + name +
                     "'; is config.json the one of these weights?",
                 /*unsupported=*/true);
  }
  out.block = blocksize;
  const int64_t numel = Numel(out.shape);
  const int64_t blocks = (numel + blocksize - 1) / blocksize;

  // The packed codes, whatever dtype they were stored as.
  FERRY_ASSIGN_OR_RETURN(auto packed, w.Get(""));
  out.packed = WeightTensors::RawBytes(*packed.first, *packed.second);
  if (int64_t(out.packed.size()) != (numel + 1) / 2) {
    return w.Bad("", "holds " + std::to_string(out.packed.size()) + " bytes (" +
                         std::string(SafetensorsDTypeName(packed.second->dtype)) + " " +
                         ShapeToString(packed.second->shape) + "), expected " +
                         std::to_string((numel + 1) / 2) + " for the NF4 codes of shape " +
                         ShapeToString(out.shape));
  }
  FERRY_ASSIGN_OR_RETURN(out.code, w.Floats(kQuantMap, kNf4CodeSize, "the 4-bit code table"));

  const bool nested_fields =
      f.Has("nested_blocksize") || f.Has("nested_dtype") || f.Has("nested_offset");
  const bool nested_tensors = w.Has(kNestedAbsmax) || w.Has(kNestedQuantMap);
  if (!nested_fields && nested_tensors) {
    return w.Bad(state_suffix,
                 "has no nested_* fields, but '" + name + "' has double-quantization tensors " +
                     "(nested_absmax / nested_quant_map): an inconsistent quant state");
  }
  const std::string block_text = "one per block of " + std::to_string(blocksize) + " of the " +
                                 std::to_string(numel) + "-element weight";
  if (!nested_fields) {
    FERRY_ASSIGN_OR_RETURN(out.absmax, w.Floats(kAbsmax, blocks, block_text));
    return out;
  }
  FERRY_ASSIGN_OR_RETURN(out.nested_block, f.Int("nested_blocksize"));
  if (out.nested_block <= 0) return f.Bad("nested_blocksize", "must be positive");
  FERRY_ASSIGN_OR_RETURN(std::string nested_dtype, f.String("nested_dtype"));
  if (nested_dtype != "float32") {
    return f.Bad("nested_dtype", "= \"" + nested_dtype + "\" must be float32");
  }
  FERRY_ASSIGN_OR_RETURN(double offset, f.Number("nested_offset"));
  out.nested_offset = float(offset);
  FERRY_ASSIGN_OR_RETURN(out.absmax_q, w.Bytes(kAbsmax));
  if (int64_t(out.absmax_q.size()) != blocks) {
    return w.Bad(kAbsmax, "has " + std::to_string(out.absmax_q.size()) + " values, expected " +
                              std::to_string(blocks) + " (" + block_text + ")");
  }
  const int64_t nested_blocks = (blocks + out.nested_block - 1) / out.nested_block;
  FERRY_ASSIGN_OR_RETURN(
      out.nested_absmax,
      w.Floats(kNestedAbsmax, nested_blocks,
               "one per nested block of " + std::to_string(out.nested_block) + " of the " +
                   std::to_string(blocks) + " block absmax values"));
  FERRY_ASSIGN_OR_RETURN(out.nested_code,
                         w.Floats(kNestedQuantMap, kNestedCodeSize, "the 8-bit dynamic map"));
  return out;
}

Status ForEachBnb4bitWeight(const FolderWeights& folder, const Bnb4bitSettings& settings,
                            const std::vector<LayerSpec>& layers,
                            const std::function<Status(const ParamSpec&, Nf4Host)>& fn) {
  bool any = false;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.tied_to.empty() || p.lora || !IsBnbQuantized(folder, p.name)) continue;
      if (l.kind != LayerKind::kBlock || p.shape.size() != 2) {
        return Status::InvalidArgument(
            "model folder " + folder.dir() + ": '" + p.name +
            "' is stored quantized, but ferry reads quantized decoder-block projections only "
            "(bitsandbytes' default leaves embeddings, norms and lm_head unquantized)");
      }
      FERRY_ASSIGN_OR_RETURN(Nf4Host w, ReadBnb4bitWeight(folder, p.name, MasterShape(p)));
      if (w.nested() != settings.double_quant) {
        return Status::InvalidArgument(
            "model folder " + folder.dir() + ": config.json says bnb_4bit_use_double_quant = " +
            (settings.double_quant ? "true" : "false") + " but '" + p.name + "' is " +
            (w.nested() ? "" : "not ") + "double-quantized: an inconsistent quant state");
      }
      any = true;
      FERRY_RETURN_IF_ERROR(fn(p, std::move(w)));
    }
  }
  if (!any) {
    return Status::InvalidArgument("model folder " + folder.dir() +
                                   ": config.json has a bitsandbytes 4-bit quantization_config "
                                   "but no weight is stored quantized");
  }
  return Status::Ok();
}

Result<QuantizedWeights> ReadBnb4bitWeights(const FolderWeights& folder,
                                            const Bnb4bitSettings& settings,
                                            const std::vector<LayerSpec>& layers) {
  QuantizedWeights q;
  q.settings = settings;
  FERRY_RETURN_IF_ERROR(
      ForEachBnb4bitWeight(folder, settings, layers, [&](const ParamSpec& p, Nf4Host w) {
        q.weights.emplace(p.name, std::move(w));
        return Status::Ok();
      }));
  return q;
}

Status LoadBnb4bitBase(const FolderWeights& folder, const ModelConfig& config,
                       const Bnb4bitSettings& settings, const std::vector<LayerSpec>& layers,
                       HostTensors& weights, ServedBase served) {
  std::set<std::string, std::less<>> held;
  // Each weight is checked here, one at a time, and read again from the folder when it is packed
  // (HostTensors::nf4_served): the upload mirrors are the only copy of the base in RAM.
  auto shared = std::make_shared<const FolderWeights>(folder);
  FERRY_RETURN_IF_ERROR(
      ForEachBnb4bitWeight(folder, settings, layers, [&](const ParamSpec& p, Nf4Host w) -> Status {
        if (!p.nf4) {
          return Status::InvalidArgument(
              "model folder " + folder.dir() + " is pre-quantized by bitsandbytes (NF4, '" +
              p.name +
              "'), but the model was set up to hold that weight unquantized: ferry keeps NF4 the "
              "block projections of " +
              Nf4ModelTypes() +
              " models only, with --quantize nf4 (training: with --lora-rank N too)");
        }
        FERRY_RETURN_IF_ERROR(ValidateNf4(w, p.name));
        held.insert(p.name);
        weights.nf4_served[p.name] =
            Nf4Source{.shape = w.shape, .make = [shared, name = p.name, shape = w.shape]() {
                        return ReadBnb4bitWeight(*shared, name, shape);
                      }};
        return Status::Ok();
      }));
  return LoadBaseWeights(folder, config, layers, weights, held, served);
}

Result<Bnb4bitModel> LoadBnb4bitFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("model folder " + dir + " does not exist or is not a folder");
  }
  Bnb4bitModel m;
  FERRY_ASSIGN_OR_RETURN(m.config, LoadHfConfig(dir + "/config.json"));
  FERRY_ASSIGN_OR_RETURN(std::optional<Bnb4bitSettings> settings, LoadBnb4bitSettings(dir));
  if (!settings.has_value()) {
    return Status::InvalidArgument("model folder " + dir +
                                   ": config.json has no quantization_config (not a "
                                   "pre-quantized folder: load it as a model folder)");
  }
  m.layers = BuildLayerSpecs(m.config, LoraConfig{});
  FERRY_ASSIGN_OR_RETURN(FolderWeights folder, FolderWeights::Open(dir));
  FERRY_ASSIGN_OR_RETURN(m.quantized, ReadBnb4bitWeights(folder, *settings, m.layers));
  std::set<std::string, std::less<>> held;
  for (const auto& [name, w] : m.quantized.weights) held.insert(name);
  FERRY_RETURN_IF_ERROR(LoadBaseWeights(folder, m.config, m.layers, m.weights, held));
  return m;
}

Status UnexpectedQuantizedTensor(const std::string& dir, const std::string& name) {
  return Status::FailedPrecondition(
      "model folder " + dir + " stores '" + name +
      "' quantized by bitsandbytes (4-bit) but is read as an unquantized folder: its config.json "
      "needs the quantization_config the folder was saved with (transformers writes it)");
}

}  // namespace ferry
