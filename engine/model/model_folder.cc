#include "engine/model/model_folder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "engine/json.h"
#include "engine/model/bnb_folder.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_stack.h"
#include "engine/model/weights_io.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kAdapterConfig = "adapter_config.json";
constexpr const char* kAdapterWeights = "adapter_model.safetensors";

// Buffers transformers keeps out of the parameters (and ignores when a checkpoint has them).
bool IsHarmlessBuffer(const ModelConfig& c, const std::string& name) {
  const std::vector<std::string>& ignored = NamesOf(c).ignored_buffers;
  return std::any_of(ignored.begin(), ignored.end(),
                     [&](const std::string& end) { return name.ends_with(end); });
}

// The name a parameter may have in a checkpoint saved from the bare model (GPT2Model: "h.0...",
// "wte.weight" without "transformer."); empty when there is no such alternative.
std::string BareName(const ModelConfig& c, const std::string& name) {
  const std::string& prefix = NamesOf(c).bare_prefix;
  if (prefix.empty() || !name.starts_with(prefix)) return {};
  return name.substr(prefix.size());
}

std::vector<const ParamSpec*> StorageParamsOf(const std::vector<LayerSpec>& layers, bool lora) {
  std::vector<const ParamSpec*> out;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty() && p.lora == lora) out.push_back(&p);
    }
  }
  return out;
}

// Loads `p` from whichever file of `folder` holds it (under its name or its bare name).
Status LoadOne(const FolderWeights& folder, const ModelConfig& c, const ParamSpec& p,
               ServedBase served, std::set<std::string>& used, HostTensors& weights) {
  std::string stored = p.name;
  const SafetensorsFile* file = folder.FileOf(stored);
  if (file == nullptr) {
    stored = BareName(c, p.name);
    if (!stored.empty()) file = folder.FileOf(stored);
  }
  if (file == nullptr) {
    return Status::NotFound("model folder " + folder.dir() + ": tensor '" + p.name +
                            "' is missing (a " + c.model_type + " model with this config.json " +
                            "needs it; is config.json the one of these weights?)");
  }
  if (IsBnbQuantized(folder, stored)) return UnexpectedQuantizedTensor(folder.dir(), stored);
  used.insert(stored);
  ParamSpec as_stored = p;
  as_stored.name = stored;
  if (!p.trainable || served == ServedBase::kAll) {  // read when it is packed
    FERRY_ASSIGN_OR_RETURN(FileTensor t, ServeParameter(folder.Owner(), *file, as_stored));
    if (!t.bytes.empty() && p.nf4) {  // QLoRA: quantized when packed
      weights.nf4_served[p.name] = QuantizeWhenPacked(std::move(t), p);
      return Status::Ok();
    }
    if (!t.bytes.empty()) {
      weights.files[p.name] = std::move(t);
      return Status::Ok();
    }
  }
  std::vector<float>& out = weights.tensors[p.name];
  out.resize(size_t(p.numel()));
  return LoadParameter(*file, as_stored, out);
}

// True when `name` is one of `held` or a tensor of one ("<held>.absmax", ...).
bool HeldElsewhere(const std::set<std::string, std::less<>>& held, std::string_view name) {
  for (size_t end = name.size(); end != std::string_view::npos && end > 0;
       end = name.rfind('.', end - 1)) {
    if (held.contains(name.substr(0, end))) return true;
  }
  return false;
}

}  // namespace

Result<FolderWeights> FolderWeights::Open(const std::string& dir) {
  FolderWeights w;
  w.dir_ = dir;
  const std::string index_path = dir + "/" + kIndexFile;
  const std::string single_path = dir + "/" + kSingleFile;
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      const bool bin = fs::exists(dir + "/pytorch_model.bin", ec) ||
                       fs::exists(dir + "/pytorch_model.bin.index.json", ec);
      return Status::NotFound(
          "model folder " + dir + " has no " + kSingleFile + " or " + kIndexFile +
          (bin ? " (only PyTorch .bin weights: convert them to safetensors)" : ""));
    }
    FERRY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single_path));
    for (const SafetensorsTensorInfo& t : f.tensors()) w.index_[t.name] = 0;
    w.files_->push_back(std::move(f));
    return w;
  }
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(index_path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(index_path + ": " + what);
  };
  if (j.is_discarded() || !j.is_object()) return bad("is not a well-formed JSON object");
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object() || map->empty()) {
    return bad("field 'weight_map' must be a non-empty object {tensor: shard file}");
  }
  std::map<std::string, size_t> shard_of_file;
  std::map<std::string, std::string> listed;  // tensor -> shard
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) return bad("weight_map['" + it.key() + "'] must be a file name");
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return bad("weight_map['" + it.key() + "'] = \"" + shard +
                 "\" must be a file name in the folder");
    }
    listed[it.key()] = shard;
    if (shard_of_file.contains(shard)) continue;
    const std::string path = dir + "/" + shard;
    if (!fs::exists(path, ec)) {
      return Status::NotFound("shard " + shard + " listed in " + index_path + " (for tensor '" +
                              it.key() + "') is missing from the folder");
    }
    FERRY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
    shard_of_file[shard] = w.files_->size();
    w.files_->push_back(std::move(f));
  }
  // Each tensor in exactly one shard, the one the index names.
  for (const auto& [shard, k] : shard_of_file) {
    for (const SafetensorsTensorInfo& t : (*w.files_)[k].tensors()) {
      auto [it, inserted] = w.index_.emplace(t.name, k);
      if (!inserted) {
        return Status::Corruption("tensor '" + t.name + "' is stored in both " +
                                  (*w.files_)[it->second].path() + " and " + (*w.files_)[k].path());
      }
      auto l = listed.find(t.name);
      if (l == listed.end()) {
        return Status::Corruption("tensor '" + t.name + "' in " + (*w.files_)[k].path() +
                                  " is not listed in " + index_path);
      }
      if (l->second != shard) {
        return Status::Corruption("tensor '" + t.name + "' is listed in " + index_path + " for " +
                                  l->second + " but stored in " + shard);
      }
    }
  }
  for (const auto& [name, shard] : listed) {
    if (!w.index_.contains(name)) {
      return Status::Corruption("tensor '" + name + "' listed in " + index_path + " is not in " +
                                dir + "/" + shard);
    }
  }
  return w;
}

const SafetensorsFile* FolderWeights::FileOf(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &(*files_)[it->second];
}

std::vector<std::string> FolderWeights::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, k] : index_) out.push_back(name);
  return out;
}

TensorFileLayout FolderWeights::TensorLayout() const {
  TensorFileLayout out;
  for (const auto& [name, k] : index_) {
    if (const SafetensorsTensorInfo* t = (*files_)[k].Find(name)) {
      out.emplace(name, FileExtent{.offset = t->offset, .bytes = t->bytes});
    }
  }
  return out;
}

Result<std::shared_ptr<const TensorFileLayout>> FolderTensorLayout(const std::string& dir,
                                                                   const ModelConfig& config) {
  std::error_code ec;
  if (!fs::exists(dir + "/" + kIndexFile, ec) && !fs::exists(dir + "/" + kSingleFile, ec)) {
    return std::shared_ptr<const TensorFileLayout>();
  }
  FERRY_ASSIGN_OR_RETURN(const FolderWeights folder, FolderWeights::Open(dir));
  const TensorFileLayout stored = folder.TensorLayout();
  TensorFileLayout layout = stored;
  // A bare checkpoint's names, as LoadOne falls back to them: under the full name too, unless the
  // folder has a tensor of that name (which LoadOne takes first).
  const std::string& prefix = NamesOf(config).bare_prefix;
  if (!prefix.empty()) {
    for (const auto& [name, extent] : stored) {
      if (!name.starts_with(prefix)) layout.emplace(prefix + name, extent);
    }
  }
  return std::make_shared<const TensorFileLayout>(std::move(layout));
}

Status LoadBaseWeights(const FolderWeights& folder, const ModelConfig& config,
                       const std::vector<LayerSpec>& layers, HostTensors& weights,
                       const std::set<std::string, std::less<>>& held_elsewhere,
                       ServedBase served) {
  std::set<std::string> used;
  for (const ParamSpec* p : StorageParamsOf(layers, /*lora=*/false)) {
    if (held_elsewhere.contains(p->name)) continue;
    FERRY_RETURN_IF_ERROR(LoadOne(folder, config, *p, served, used, weights));
    // QLoRA: an NF4 parameter not served (F64) is quantized as soon as it is read, so the base
    // never exists in fp32 as a whole (a 70B base is 280 GB in fp32, 36 GB in NF4).
    FERRY_RETURN_IF_ERROR(QuantizeParameter(*p, weights));
  }
  for (const std::string& name : folder.Names()) {
    if (used.contains(name) || IsHarmlessBuffer(config, name)) continue;
    if (HeldElsewhere(held_elsewhere, name)) continue;
    const SafetensorsFile* file = folder.FileOf(name);
    if (config.tie_word_embeddings && name == "lm_head.weight") {
      const std::vector<int64_t> want = {config.vocab_size, config.hidden_size};
      if (file->Find(name)->shape == want) continue;  // transformers ties it to the embedding
      return Status::InvalidArgument("tensor 'lm_head.weight' in " + file->path() + " has shape " +
                                     ShapeToString(file->Find(name)->shape) + ", expected " +
                                     ShapeToString(want) + " (tied to the embedding)");
    }
    return Status::InvalidArgument("tensor '" + name + "' in " + file->path() +
                                   " is not a parameter of the " + config.model_type +
                                   " model config.json describes; check that config.json belongs "
                                   "to these weights");
  }
  return Status::Ok();
}

Result<LoraConfig> ParsePeftAdapterConfig(std::string_view json_text, const ModelConfig& model) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument(std::string(kAdapterConfig) + ": " + what);
  };
  if (j.is_discarded() || !j.is_object()) return bad("is not a well-formed JSON object");
  auto get = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* t = get("peft_type"); t == nullptr || *t != "LORA") {
    return bad("field 'peft_type' must be \"LORA\" (ferry loads LoRA adapters only)");
  }
  LoraConfig lora;
  const json* r = get("r");
  if (r == nullptr || !r->is_number_integer() || r->get<int64_t>() <= 0) {
    return bad("field 'r' must be a positive integer");
  }
  lora.rank = r->get<int64_t>();
  const json* alpha = get("lora_alpha");
  if (alpha == nullptr || !alpha->is_number() || !(alpha->get<double>() > 0)) {
    return bad("field 'lora_alpha' must be a positive number");
  }
  lora.alpha = alpha->get<double>();
  if (const json* f = get("use_rslora"); f != nullptr) {
    if (!f->is_boolean()) return bad("field 'use_rslora' must be true or false");
    lora.rslora = f->get<bool>();
  }
  if (const json* f = get("use_dora"); f != nullptr && (!f->is_boolean() || f->get<bool>())) {
    return bad("field 'use_dora' = true is not supported (DoRA)");
  }
  if (const json* b = get("bias"); b != nullptr && *b != "none") {
    return bad("field 'bias' must be \"none\" (ferry's LoRA trains no biases)");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (const json* p = get(key); p != nullptr && !(p->is_object() && p->empty())) {
      return bad(std::string("field '") + key + "' is not supported (one rank and alpha only)");
    }
  }
  for (const char* key : {"layers_to_transform", "modules_to_save"}) {
    if (const json* p = get(key); p != nullptr && !(p->is_array() && p->empty())) {
      return bad(std::string("field '") + key + "' is not supported");
    }
  }
  const json* targets = get("target_modules");
  std::vector<std::string> modules;
  if (targets != nullptr && targets->is_array()) {
    for (const json& t : *targets) {
      if (!t.is_string()) return bad("field 'target_modules' must list strings");
      modules.push_back(t.get<std::string>());
    }
  }
  if (modules.empty()) {
    return bad("field 'target_modules' must be a non-empty list of module names");
  }
  lora.targets = 0;
  for (const std::string& m : modules) {
    Result<uint32_t> bits = PeftTargetBits(model, m);
    if (!bits.ok()) return bits.status().WithContext(kAdapterConfig);
    lora.targets |= *bits;
  }
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(lora));
  return lora;
}

Status LoadAdapterWeights(const std::string& adapter_dir, const std::vector<LayerSpec>& layers,
                          HostTensors& weights) {
  const std::string path = adapter_dir + "/" + kAdapterWeights;
  FERRY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  std::set<std::string> expected;
  for (const ParamSpec* p : StorageParamsOf(layers, /*lora=*/true)) {
    std::vector<float>& out = weights.tensors[p->name];
    out.resize(size_t(p->numel()));
    FERRY_RETURN_IF_ERROR(LoadParameter(file, *p, out));
    expected.insert(p->name);
  }
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    if (!expected.contains(t.name)) {
      return Status::InvalidArgument("tensor '" + t.name + "' in " + path +
                                     " is not a LoRA matrix of the targets " + kAdapterConfig +
                                     " names");
    }
  }
  return Status::Ok();
}

Result<LoadedModel> LoadModelFolder(const std::string& dir, const std::string& adapter_dir,
                                    BaseQuant quantize, bool double_quant) {
  LoadedModel m;
  const std::string config_path = dir + "/config.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("model folder " + dir + " does not exist or is not a folder");
  }
  FERRY_ASSIGN_OR_RETURN(m.config, LoadHfConfig(config_path));
  FERRY_ASSIGN_OR_RETURN(std::optional<Bnb4bitSettings> bnb, LoadBnb4bitSettings(dir));
  if (!adapter_dir.empty()) {
    const std::string path = adapter_dir + "/" + kAdapterConfig;
    FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
    Result<LoraConfig> lora = ParsePeftAdapterConfig(text, m.config);
    if (!lora.ok()) return lora.status().WithContext(adapter_dir);
    m.lora = *lora;
  }
  // The base in NF4: as a pre-quantized folder stores it, or quantized here when asked.
  m.lora.quantize = bnb.has_value() ? BaseQuant::kNf4 : quantize;
  m.lora.double_quant = bnb.has_value() ? bnb->double_quant : double_quant;
  if (Status q = CheckBaseQuant(m.config, m.lora.quantize); !q.ok()) {
    return Status::InvalidArgument("model folder " + dir +
                                   (bnb.has_value() ? " is pre-quantized by bitsandbytes" : "") +
                                   ": " + q.message() + ": give the unquantized model" +
                                   (bnb.has_value() ? "" : " and drop --quantize"));
  }
  m.layers = BuildLayerSpecs(m.config, m.lora);
  FERRY_ASSIGN_OR_RETURN(FolderWeights folder, FolderWeights::Open(dir));
  FERRY_RETURN_IF_ERROR(
      bnb.has_value()
          ? LoadBnb4bitBase(folder, m.config, *bnb, m.layers, m.weights, ServedBase::kAll)
          : LoadBaseWeights(folder, m.config, m.layers, m.weights, {}, ServedBase::kAll));
  // --quantize nf4 (and a projection a pre-quantized folder left in floats): NF4 from here on.
  FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(m.layers, m.weights));
  if (!adapter_dir.empty()) {
    FERRY_RETURN_IF_ERROR(LoadAdapterWeights(adapter_dir, m.layers, m.weights));
  }
  return m;
}

Status WriteModelFolder(const std::string& dir, const ModelConfig& config,
                        const std::vector<LayerSpec>& layers, const HostTensors& weights,
                        const ModelFolderWriteOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF16) {
    return Status::InvalidArgument("model folder weights must be written as f32, bf16 or f16");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create model folder " + dir + ": " + ec.message());
  // Group the parameters into shards (one when unsharded), in layer order.
  std::vector<std::vector<const ParamSpec*>> shards(1);
  size_t shard_bytes = 0, total_bytes = 0;
  for (const ParamSpec* p : StorageParamsOf(layers, /*lora=*/false)) {
    const size_t bytes = size_t(p->numel()) * DTypeSize(options.dtype);
    if (options.max_shard_bytes > 0 && shard_bytes > 0 &&
        shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(p);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const bool sharded = shards.size() > 1;  // one shard: model.safetensors, as transformers writes
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = kSingleFile;
    if (sharded) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      name = buf;
    }
    for (const ParamSpec* p : shards[s]) weight_map[p->name] = name;
    FERRY_RETURN_IF_ERROR(
        WriteParameters(dir + "/" + name, shards[s], weights, options.dtype, options.adjust)
            .WithContext("writing model folder " + dir));
  }
  if (sharded) {
    json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    FERRY_RETURN_IF_ERROR(WriteTextFile(dir + "/" + kIndexFile, index.dump(2) + "\n"));
  }
  FERRY_RETURN_IF_ERROR(WriteFolderConfig(dir, config, options.dtype, options.config_from));
  if (!options.tokenizer_from.empty()) {
    FERRY_RETURN_IF_ERROR(CopyTokenizerFiles(options.tokenizer_from, dir));
  }
  return Status::Ok();
}

Status WriteConfigFrom(const std::string& source_config, DType dtype, const std::string& dir) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(source_config));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument(source_config + " is not a JSON object");
  const char* torch_name = TorchDTypeName(dtype);
  if (torch_name == nullptr) {
    return Status::InvalidArgument(std::string("config.json names no weights dtype ") +
                                   std::string(DTypeName(dtype)));
  }
  j.erase("quantization_config");
  j.erase("auto_map");
  if (j.contains("dtype")) j["dtype"] = torch_name;  // transformers 5's name
  j["torch_dtype"] = torch_name;
  return WriteTextFile(dir + "/config.json", j.dump(2) + "\n");
}

Status WriteFolderConfig(const std::string& dir, const ModelConfig& config, DType dtype,
                         const std::string& config_from) {
  if (!config_from.empty()) return WriteConfigFrom(config_from, dtype, dir);
  ModelConfig written = config;
  written.weights_dtype = dtype;
  return WriteTextFile(dir + "/config.json", ToHfConfigJson(written).dump(2) + "\n");
}

Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir) {
  std::error_code ec;
  if (fs::equivalent(from_dir, to_dir, ec)) return Status::Ok();
  for (const char* f : kTokenizerFileNames) {
    const fs::path from = fs::path(from_dir) / f;
    if (!fs::exists(from, ec)) continue;
    fs::copy_file(from, fs::path(to_dir) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return Status::IOError("cannot copy " + from.string() + " to " + to_dir + ": " +
                             ec.message());
    }
  }
  return Status::Ok();
}

bool IsModelFolder(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec);
}

}  // namespace ferry
