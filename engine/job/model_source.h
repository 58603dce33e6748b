// ModelSource: what `--model NAME [--adapter DIR]` names, resolved in one place for every command
// (train, plan, eval, generate, merge), and the loading of it for inference (eval, generate,
// merge).
//
// --model is one of:
//  - "tiny": the built-in preset (random initialization from a seed) with the byte tokenizer;
//  - a Hugging Face model folder: config.json + model.safetensors or shards listed by
//    model.safetensors.index.json (engine/model/model_folder.h), tokenizer.json beside them;
//  - a run folder of `ferry train`: after full fine-tuning it is a model folder; after LoRA it
//    holds adapter_config.json + adapter_model.safetensors, config.json and the tokenizer files,
//    and its base weights are either in it (a run of "tiny") or at the run's --model, which
//    job.json records ("model", and "model_path" made absolute);
//  - for planning only (ModelUse::kConfigOnly): a config.json file or a preset name
//    (<presets_dir>/<name>.json).
//  A folder pre-quantized by bitsandbytes (config.json's quantization_config, 4-bit nf4) is
//  detected (ModelSource::bnb4bit); every use takes it, the base staying NF4 (training: QLoRA).
// --adapter DIR: a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), e.g.
// a LoRA run folder; it replaces a run folder's own adapter. Errors are one line naming the folder
// or file and what to give instead.
//
// The tokenizer: tokenizer.json of the --model folder, else of the base weights' folder, else the
// byte tokenizer when the vocabulary is the tiny preset's; a tokenizer with more tokens than the
// model's vocabulary is refused (they belong to different models).
//
// Plain values; the functions are thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/model/bnb_folder.h"
#include "engine/model/model_config.h"
#include "engine/model/model_folder.h"
#include "engine/text/tokenizer.h"
#include "kernels/status.h"

namespace ferry {

enum class ModelUse {
  kConfigOnly,  // plan: the config is enough (presets and config.json files allowed)
  kTrain,       // train: the base weights of a model folder (no adapter)
  kInference,   // eval, generate, merge: base weights, an adapter, a tokenizer
};

struct ModelSource {
  std::string name;           // --model as given
  bool tiny = false;          // the built-in preset
  std::string config_path;    // the config.json read; "" for tiny
  std::string weights_dir;    // folder holding the base weights; "" for tiny or config-only
  std::string adapter_dir;    // PEFT adapter folder; "" for none
  std::string tokenizer_dir;  // folder with tokenizer.json; "" for the byte tokenizer
  ModelConfig config;
  // config.json's bitsandbytes 4-bit quantization_config, when the base weights' folder is
  // pre-quantized (engine/model/bnb_folder.h); nullopt otherwise.
  std::optional<Bnb4bitSettings> bnb4bit;
  // A QLoRA run folder's base storage (its job.json's "quantize" and "double_quant"): its adapter
  // was trained over an NF4 base, so inference holds the base in NF4 too, nested as it was then
  // (the nesting changes the dequantized values). kNone otherwise.
  BaseQuant run_quantize = BaseQuant::kNone;
  bool run_double_quant = true;
};

// Resolves --model `model` and --adapter `adapter` ("" for none) for `use`. `presets_dir` is
// searched for <model>.json with kConfigOnly ("" : no presets).
Result<ModelSource> ResolveModelSource(const std::string& model, const std::string& adapter,
                                       ModelUse use, const std::string& presets_dir = "");

// How inference holds `s`'s base when --quantize and --[no-]double-quant say `quantize` and
// `double_quant`: a pre-quantized folder's as it is stored, a QLoRA run folder's as it was trained,
// any other as asked. Returned in a LoraConfig's storage fields (quantize, double_quant); its
// rank is 0.
LoraConfig InferenceBaseStorage(const ModelSource& s, BaseQuant quantize, bool double_quant);

// The weights of resolved source `s` (kInference) as inference holds them
// (InferenceBaseStorage): a model folder's base with its adapter (LoadModelFolder), or "tiny"
// initialized from `seed`. No tokenizer is needed.
Result<LoadedModel> LoadSourceWeights(const ModelSource& s, uint64_t seed,
                                      BaseQuant quantize = BaseQuant::kNone,
                                      bool double_quant = true);

// A model ready for inference: config, adapter, layers and weights (fp32, or NF4 block
// projections), and its tokenizer.
struct InferenceModel {
  ModelSource source;
  LoadedModel model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string template_source;  // what ResolveChatTemplate reads: "tiny" or a folder
};

// Resolves (ModelUse::kInference) and loads --model/--adapter; "tiny" is initialized from `seed`.
// `quantize` kNf4 (--quantize nf4) holds the base's block projections in NF4, quantized as packed
// (LoadModelFolder) with `double_quant`'s nesting; a pre-quantized folder is NF4 as it is stored
// whatever these say, and the base of a QLoRA run folder as it was trained
// (ModelSource::run_quantize, run_double_quant).
Result<InferenceModel> LoadInferenceModel(const std::string& model, const std::string& adapter,
                                          uint64_t seed, BaseQuant quantize = BaseQuant::kNone,
                                          bool double_quant = true);

}  // namespace ferry
