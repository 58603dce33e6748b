// The host fp32 master copy of a model's parameters: creating it (fresh from a seed, or read from
// safetensors files) and writing it out as Hugging Face / PEFT files.
//
// Only storage-owning parameters have an entry (a tied alias has none: it is the same tensor as its
// owner). Values are in ferry's master layout (engine/model/weights_io.h: MasterShape).
//
// Stateless functions over caller-owned HostTensors; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/model/param_spec.h"
#include "engine/model/safetensors.h"
#include "kernels/status.h"

namespace ferry {

// Which parameters a load or a save touches.
enum class ParamSelection {
  kAll,   // every storage-owning parameter
  kBase,  // the model's own parameters (not LoRA A/B)
  kLora,  // LoRA A/B matrices only (PEFT names)
};

// The storage-owning parameters of `layers` (tied aliases skipped), in layer order.
std::vector<const ParamSpec*> StorageParams(const std::vector<LayerSpec>& layers);

// A buffer for every storage-owning parameter, filled by InitParameter(p, seed): a pure function of
// (seed, name, index), whatever the order.
HostTensors InitMasterWeights(const std::vector<LayerSpec>& layers, uint64_t seed);

// Overwrites the selected parameters of `weights` with the values in `file` (any float dtype;
// GPT-2's Conv1D transposed into the master layout). Errors name the tensor and the file. REQUIRES:
// `weights` has an entry for each storage-owning parameter (InitMasterWeights).
Status LoadMasterWeights(const SafetensorsFile& file, const std::vector<LayerSpec>& layers,
                         ParamSelection which, HostTensors& weights);

// Writes `params` of `weights` to safetensors file `path` with their Hugging Face (or PEFT) names
// and checkpoint layout, as `dtype`, one tensor at a time as the file is written: the file's image
// is never whole in memory (a 70B model's final weights take no second 280 GB). Errors: a
// parameter `weights` lacks or holds at another size, named; an I/O error naming the file.
// Neither leaves a file at `path`. `adjust`, when set, sees each parameter's fp32 values (master
// layout, MasterShape) and returns those to store: `values` as they are, or changed ones it keeps
// in `scratch` (valid until the next call); its error stops the write.
using ParamAdjust = std::function<Result<std::span<const float>>(
    const ParamSpec& p, std::span<const float> values, std::vector<float>& scratch)>;
Status WriteParameters(const std::string& path, std::span<const ParamSpec* const> params,
                       const HostTensors& weights, DType dtype,
                       const ParamAdjust& adjust = nullptr);

// WriteParameters of the selected parameters.
Status SaveMasterWeights(const std::string& path, const std::vector<LayerSpec>& layers,
                         ParamSelection which, const HostTensors& weights,
                         DType dtype = DType::kF32);

// QLoRA: replaces the fp32 tensor of every NF4 parameter (ParamSpec::nf4) of `weights` by its
// NF4 quantization (kernels/nf4.h: bitsandbytes' CUDA rounding, double-quantized as the spec
// says), one tensor at a time. Errors: a missing tensor.
Status QuantizeFrozenBase(const std::vector<LayerSpec>& layers, HostTensors& weights,
                          Nf4Rounding rounding = Nf4Rounding::kThresholdTree);
// The same for one parameter (nothing when it is not NF4 or is already quantized): what a loader
// calls right after reading it, so that one fp32 tensor at a time exists.
Status QuantizeParameter(const ParamSpec& p, HostTensors& weights,
                         Nf4Rounding rounding = Nf4Rounding::kThresholdTree);
// QLoRA from a model's file: NF4 parameter `p` served from `t` (its stored values, ServeParameter)
// and quantized as QuantizeParameter would each time it is packed (HostTensors::nf4_served), so
// neither its values nor its NF4 form stay in RAM beside the upload mirrors. The file's pages are
// released after each read (ReleaseFilePages).
Nf4Source QuantizeWhenPacked(FileTensor t, const ParamSpec& p,
                             Nf4Rounding rounding = Nf4Rounding::kThresholdTree);

// A parameter's fp32 values: its tensor, or its NF4 weight dequantized (or its file's tensor
// read) into `dequantized`, whose storage the span then views. Errors: NotFound when `weights`
// holds none.
Result<std::span<const float>> ParameterValues(const ParamSpec& p, const HostTensors& weights,
                                               std::vector<float>& dequantized);

// Writes a run's final weights into `dir`: full fine-tuning: model.safetensors; LoRA:
// adapter_model.safetensors + adapter_config.json (PEFT's format: `peft` loads them onto the base
// model), plus the frozen base as model.safetensors when `with_base` (a base initialized from the
// seed exists nowhere else). Either way config.json: from `config_from` (the source model folder's
// config.json, every field kept: WriteConfigFrom) when given, else the Hugging Face config of
// `model`.
Status WriteFinalWeights(const std::string& dir, const ModelConfig& model, const LoraConfig& lora,
                         const std::vector<LayerSpec>& layers, const HostTensors& weights,
                         bool with_base, const std::string& config_from = "");

// The weights a run starts from: `model` "tiny": InitMasterWeights(layers, seed); otherwise
// `model` is a Hugging Face model folder whose weights fill the base parameters
// (engine/model/model_folder.h: every tensor checked), LoRA A/B (if any) fresh from the seed.
// NF4 parameters are then quantized (QuantizeFrozenBase).
Result<HostTensors> InitialWeights(const std::string& model, const ModelConfig& config,
                                   const std::vector<LayerSpec>& layers, uint64_t seed);

// PEFT's adapter_config.json for `lora` (target module names as PEFT lists them).
nlohmann::json PeftAdapterConfig(const ModelConfig& model, const LoraConfig& lora);

}  // namespace ferry
