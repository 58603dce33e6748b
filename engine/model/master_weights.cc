#include "engine/model/master_weights.h"

#include <algorithm>
#include <optional>

#include "engine/json.h"
#include "engine/model/bnb_folder.h"
#include "engine/model/model_folder.h"
#include "engine/model/model_stack.h"
#include "engine/model/weights_io.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

bool Selected(const ParamSpec& p, ParamSelection which) {
  switch (which) {
    case ParamSelection::kAll:
      return true;
    case ParamSelection::kBase:
      return !p.lora;
    case ParamSelection::kLora:
      return p.lora;
  }
  return false;
}

}  // namespace

std::vector<const ParamSpec*> StorageParams(const std::vector<LayerSpec>& layers) {
  std::vector<const ParamSpec*> out;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty()) out.push_back(&p);
    }
  }
  return out;
}

HostTensors InitMasterWeights(const std::vector<LayerSpec>& layers, uint64_t seed) {
  HostTensors w;
  for (const ParamSpec* p : StorageParams(layers)) {
    std::vector<float>& t = w.tensors[p->name];
    t.resize(size_t(p->numel()));
    InitParameter(*p, seed, t);
  }
  return w;
}

Status LoadMasterWeights(const SafetensorsFile& file, const std::vector<LayerSpec>& layers,
                         ParamSelection which, HostTensors& weights) {
  for (const ParamSpec* p : StorageParams(layers)) {
    if (!Selected(*p, which)) continue;
    FERRY_RETURN_IF_ERROR(LoadParameter(file, *p, weights.at(p->name)));
  }
  return Status::Ok();
}

Status WriteParameters(const std::string& path, std::span<const ParamSpec* const> params,
                       const HostTensors& weights, DType dtype, const ParamAdjust& adjust) {
  std::vector<SafetensorsWriteTensor> tensors;
  tensors.reserve(params.size());
  for (const ParamSpec* p : params)
    tensors.push_back({.name = p->name, .dtype = dtype, .shape = p->shape});
  // A tensor read from its file or dequantized; as `adjust` changed it; its transpose.
  std::vector<float> read, adjusted, laid;
  std::vector<std::byte> bytes;  // the tensor as stored
  return WriteSafetensors(
      path, tensors,
      [&](size_t i) -> Result<std::span<const std::byte>> {
        const ParamSpec& p = *params[i];
        FERRY_ASSIGN_OR_RETURN(std::span<const float> values, ParameterValues(p, weights, read));
        if (values.size() != size_t(p.numel())) {
          return Status::InvalidArgument("the weights to write hold " +
                                         std::to_string(values.size()) + " values of '" + p.name +
                                         "', its shape " + ShapeToString(p.shape) + " needs " +
                                         std::to_string(p.numel()));
        }
        if (adjust) {
          FERRY_ASSIGN_OR_RETURN(values, adjust(p, values, adjusted));
        }
        const std::span<const float> stored = CheckpointLayout(p, values, laid);
        bytes.resize(stored.size() * DTypeSize(dtype));
        if (!stored.empty()) ConvertFromFloat(stored.data(), dtype, bytes.data(), stored.size());
        return std::span<const std::byte>(bytes);
      },
      {{"format", "pt"}});
}

Status SaveMasterWeights(const std::string& path, const std::vector<LayerSpec>& layers,
                         ParamSelection which, const HostTensors& weights, DType dtype) {
  std::vector<const ParamSpec*> params;
  for (const ParamSpec* p : StorageParams(layers)) {
    if (Selected(*p, which)) params.push_back(p);
  }
  return WriteParameters(path, params, weights, dtype);
}

Result<std::span<const float>> ParameterValues(const ParamSpec& p, const HostTensors& weights,
                                               std::vector<float>& dequantized) {
  if (auto it = weights.tensors.find(p.name); it != weights.tensors.end()) {
    return std::span<const float>(it->second);
  }
  if (auto f = weights.files.find(p.name); f != weights.files.end()) {
    dequantized.resize(size_t(f->second.numel()));
    ReadFileTensor(f->second, dequantized);
    return std::span<const float>(dequantized);
  }
  Nf4Host made;
  FERRY_ASSIGN_OR_RETURN(const Nf4Host* q, weights.FindNf4(p.name, made));
  if (q == nullptr) return Status::NotFound("the weights have no tensor '" + p.name + "'");
  dequantized.resize(size_t(q->numel()));
  DequantizeNf4(*q, DType::kF32, dequantized.data());
  return std::span<const float>(dequantized);
}

Status QuantizeParameter(const ParamSpec& p, HostTensors& weights, Nf4Rounding rounding) {
  // Read quantized (as it is), or made from the model's file when packed.
  if (!p.nf4 || weights.nf4.contains(p.name) || weights.nf4_served.contains(p.name)) {
    return Status::Ok();
  }
  if (weights.numel(p.name) < 0) {
    return Status::NotFound("no base weight '" + p.name + "' to quantize");
  }
  std::vector<float> read;  // a weight served from its file, read for the quantization
  FERRY_ASSIGN_OR_RETURN(std::span<const float> values, ParameterValues(p, weights, read));
  FERRY_ASSIGN_OR_RETURN(Nf4Host q, QuantizeNf4(values, MasterShape(p), p.nf4_nested, rounding));
  // The fp32 copy (or the file's view) goes as soon as its NF4 one exists.
  weights.tensors.erase(p.name);
  weights.files.erase(p.name);
  weights.nf4[p.name] = std::move(q);
  return Status::Ok();
}

Nf4Source QuantizeWhenPacked(FileTensor t, const ParamSpec& p, Nf4Rounding rounding) {
  std::vector<int64_t> shape = MasterShape(p);
  return Nf4Source{
      .shape = shape,
      .make = [t = std::move(t), shape, nested = p.nf4_nested, rounding]() -> Result<Nf4Host> {
        std::vector<float> values(size_t(t.numel()));
        ReadFileTensor(t, values);
        ReleaseFilePages(t);
        return QuantizeNf4(values, shape, nested, rounding);
      }};
}

Status QuantizeFrozenBase(const std::vector<LayerSpec>& layers, HostTensors& weights,
                          Nf4Rounding rounding) {
  for (const ParamSpec* p : StorageParams(layers)) {
    FERRY_RETURN_IF_ERROR(QuantizeParameter(*p, weights, rounding));
  }
  return Status::Ok();
}

Result<HostTensors> InitialWeights(const std::string& model, const ModelConfig& config,
                                   const std::vector<LayerSpec>& layers, uint64_t seed) {
  HostTensors w;
  if (model == "tiny") {
    w = InitMasterWeights(layers, seed);
  } else {
    FERRY_ASSIGN_OR_RETURN(FolderWeights folder, FolderWeights::Open(model));
    // A folder pre-quantized by bitsandbytes: its NF4 weights are taken as they are (QLoRA).
    FERRY_ASSIGN_OR_RETURN(std::optional<Bnb4bitSettings> bnb, LoadBnb4bitSettings(model));
    FERRY_RETURN_IF_ERROR(bnb.has_value() ? LoadBnb4bitBase(folder, config, *bnb, layers, w)
                                          : LoadBaseWeights(folder, config, layers, w));
    for (const ParamSpec* p : StorageParams(layers)) {
      if (w.numel(p->name) >= 0) continue;  // LoRA A/B: fresh
      std::vector<float>& t = w.tensors[p->name];
      t.resize(size_t(p->numel()));
      InitParameter(*p, seed, t);
    }
  }
  FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(layers, w));
  return w;
}

nlohmann::json PeftAdapterConfig(const ModelConfig& model, const LoraConfig& lora) {
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", nullptr},
          {"r", lora.rank},
          {"lora_alpha", lora.alpha},
          {"lora_dropout", 0.0},
          {"bias", "none"},
          {"fan_in_fan_out", PeftFanInFanOut(model)},
          {"use_rslora", lora.rslora},
          {"use_dora", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"target_modules", PeftTargetModules(model, lora.enabled() ? lora.targets : 0)}};
}

Status WriteFinalWeights(const std::string& dir, const ModelConfig& model, const LoraConfig& lora,
                         const std::vector<LayerSpec>& layers, const HostTensors& weights,
                         bool with_base, const std::string& config_from) {
  if (lora.enabled()) {
    FERRY_RETURN_IF_ERROR(SaveMasterWeights(dir + "/adapter_model.safetensors", layers,
                                            ParamSelection::kLora, weights));
    FERRY_RETURN_IF_ERROR(
        WriteTextFile(dir + "/adapter_config.json", PeftAdapterConfig(model, lora).dump(2) + "\n"));
  }
  if (!lora.enabled() || with_base) {
    FERRY_RETURN_IF_ERROR(
        SaveMasterWeights(dir + "/model.safetensors", layers, ParamSelection::kBase, weights));
  }
  return WriteFolderConfig(dir, model, DType::kF32,
                           config_from);  // f32: what SaveMasterWeights wrote
}

}  // namespace ferry
