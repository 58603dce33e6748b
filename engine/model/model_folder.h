// Hugging Face model folders: reading one (config.json + model.safetensors, or shards listed by
// model.safetensors.index.json, optionally a PEFT LoRA adapter folder on top) into ferry's fp32
// master weights, and writing one that `transformers` loads.
//
// Reading:
//  - config.json is parsed by ParseHfConfig (unknown architectures are refused by name).
//  - Weights: model.safetensors, or model.safetensors.index.json's weight_map {tensor: shard}.
//    Every shard named there is opened (memory-mapped) and fully validated (safetensors.h); a
//    missing shard is an error naming it and the index; a tensor listed for one shard but stored
//    in another, or stored in two shards, is an error naming the tensor and both files.
//  - Every parameter the config implies (BuildLayerSpecs) must be present with its Hugging Face
//    shape, in F32, BF16, F16 or F64; errors name the tensor and the file. GPT-2 checkpoints saved
//    without the "transformer." prefix (as the hub's gpt2 is) are found too.
//  - Extras: non-parameter buffers transformers itself ignores (".rotary_emb.inv_freq", GPT-2's
//    ".attn.bias" / ".attn.masked_bias" masks) are skipped; "lm_head.weight" in a model with tied
//    embeddings is skipped when its shape equals the embedding's (transformers ties it to the
//    embedding; ferry does the same). Any other tensor is an error naming it: it means the
//    config does not describe the checkpoint.
//  - A PEFT adapter folder (adapter_config.json + adapter_model.safetensors): LoRA only, no
//    rsLoRA, DoRA, rank/alpha patterns, layers_to_transform or modules_to_save; errors name the
//    field. Every A and B matrix the config implies must be present with its shape.
//
// Writing: config.json (ToHfConfigJson, torch_dtype = the chosen dtype), the base weights (no LoRA
// matrices) under their Hugging Face names and layouts in one model.safetensors or, above a size
// threshold, in model-0000k-of-0000n.safetensors shards with model.safetensors.index.json; tied
// aliases are not written (transformers re-ties them). The tokenizer and generation files of a
// source folder are copied when present (CopyTokenizerFiles). PEFT adapters are written by
// engine/model/master_weights.h (WriteFinalWeights).
//
// Ownership: FolderWeights owns its memory mappings (move-only); LoadedModel is a plain value.
// Thread-safety: a FolderWeights is immutable after Open and may be read from several threads;
// the functions are thread-compatible.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/base_reader.h"
#include "engine/model/lora_config.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/model/param_spec.h"
#include "engine/model/safetensors.h"
#include "kernels/status.h"

namespace ferry {

// A model loaded for ferry: what LoadModelFolder returns.
struct LoadedModel {
  ModelConfig config;  // from config.json
  // From adapter_config.json (rank 0 without an adapter); quantize kNf4 when the base is held
  // in NF4 (double_quant as stored).
  LoraConfig lora;
  std::vector<LayerSpec> layers;  // BuildLayerSpecs(config, lora)
  HostTensors weights;            // every storage-owning parameter of `layers`: LoRA A/B as
                                  // fp32 values (MasterShape layout), NF4 ones (ParamSpec::nf4)
                                  // made from the files when packed (weights.nf4_served), the
                                  // rest served from the files (weights.files; fp32 values, or
                                  // weights.nf4, when a file stores F64)
};

// Reads the model folder `dir` for inference (`ferry eval`, `generate`: every base parameter not
// held in NF4 is served from the files, ServedBase::kAll) and, when `adapter_dir` is not empty,
// the PEFT LoRA adapter in it
// (its A/B matrices are loaded; the base weights are frozen in `layers`). A folder pre-quantized
// by bitsandbytes (engine/model/bnb_folder.h) keeps its NF4 weights as stored (LoadBnb4bitBase:
// no fp32 copy); `quantize` kNf4 quantizes an unquantized base's block projections on load
// (double-quantized, as `ferry train --quantize nf4`). Either way lora.quantize is kNf4 and the
// base frozen, with or without an adapter. Errors name the folder, the file and the tensor or
// field; an NF4 base of a GPT-2 model is refused (InvalidArgument: Llama family only).
// `double_quant` is the nesting of a base quantized here (a pre-quantized folder keeps its own).
Result<LoadedModel> LoadModelFolder(const std::string& dir, const std::string& adapter_dir = "",
                                    BaseQuant quantize = BaseQuant::kNone,
                                    bool double_quant = true);

// The base parameters a loader serves from the model's files (HostTensors::files) instead of
// reading them into fp32: the frozen ones (training: the trainable ones need fp32 masters), or all
// of them (inference, which trains nothing). NF4 ones are held as NF4 either way.
enum class ServedBase { kFrozen, kAll };

// The safetensors files of a model folder, memory-mapped, indexed by tensor name.
class FolderWeights {
 public:
  // Opens `dir`/model.safetensors or the shards of `dir`/model.safetensors.index.json.
  static Result<FolderWeights> Open(const std::string& dir);

  // The file holding `name`, or nullptr.
  const SafetensorsFile* FileOf(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  // Where each tensor lies in its file, by its name there.
  TensorFileLayout TensorLayout() const;
  const std::string& dir() const { return dir_; }
  // What keeps the files' mappings alive (FileTensor::owner): they outlive this object while a
  // copy of it exists.
  std::shared_ptr<const void> Owner() const { return files_; }

 private:
  std::string dir_;
  std::shared_ptr<std::vector<SafetensorsFile>> files_ =
      std::make_shared<std::vector<SafetensorsFile>>();
  std::map<std::string, size_t, std::less<>> index_;  // tensor -> files_ index
};

// Where the tensors of `dir`'s safetensors weights lie (FolderWeights::TensorLayout), by the
// names `config`'s parameters have (a bare GPT2Model checkpoint's "h.0..." as
// "transformer.h.0...", as LoadBaseWeights reads them): nullptr when `dir` is no folder or holds
// none (a config alone); FolderWeights::Open's errors when they are malformed or missing.
Result<std::shared_ptr<const TensorFileLayout>> FolderTensorLayout(const std::string& dir,
                                                                   const ModelConfig& config);

// Fills the base (non-LoRA) parameters of `layers` in `weights` from `folder` (creating their
// entries), after checking that every expected tensor is present with its shape and that the
// folder holds nothing unexpected (see the header comment for what is tolerated). Parameters
// named in `held_elsewhere` are left out, and so are their tensors in the folder ("<name>" and
// "<name>.<anything>": the NF4 weights of a pre-quantized folder, engine/model/bnb_folder.h). A
// parameter stored quantized by bitsandbytes and not held elsewhere is a FailedPrecondition
// (UnexpectedQuantizedTensor). An NF4 parameter (ParamSpec::nf4, QLoRA) stored as F32, BF16 or
// F16 is served from its file and quantized each time it is packed (weights.nf4_served:
// QuantizeWhenPacked), so the NF4 base is never held beside the upload mirrors; one stored as F64
// is quantized into weights.nf4 as soon as it is read (QuantizeParameter). Any other frozen
// parameter (a LoRA job's base) stored as F32, BF16 or F16 is served from its file (weights.files:
// ServeParameter), never read into RAM; with ServedBase::kAll every such base parameter is
// (inference).
Status LoadBaseWeights(const FolderWeights& folder, const ModelConfig& config,
                       const std::vector<LayerSpec>& layers, HostTensors& weights,
                       const std::set<std::string, std::less<>>& held_elsewhere = {},
                       ServedBase served = ServedBase::kFrozen);

// Parses a PEFT adapter_config.json (its text) into a LoraConfig for `model`. Errors name the
// field.
Result<LoraConfig> ParsePeftAdapterConfig(std::string_view json_text, const ModelConfig& model);

// Fills the LoRA A/B parameters of `layers` from `adapter_dir`/adapter_model.safetensors
// (creating their entries). Errors name the tensor and the file.
Status LoadAdapterWeights(const std::string& adapter_dir, const std::vector<LayerSpec>& layers,
                          HostTensors& weights);

struct ModelFolderWriteOptions {
  DType dtype = DType::kF32;   // storage dtype of the weights: F32, BF16 or F16
  size_t max_shard_bytes = 0;  // 0: one model.safetensors; otherwise shards of at most this
                               // many bytes each (a larger tensor gets a shard of its own), with
                               // model.safetensors.index.json; a model within one shard is one
                               // model.safetensors
  std::string tokenizer_from = "";  // folder whose tokenizer/generation files are copied; "" none
  ParamAdjust adjust = nullptr;     // may change each parameter's values before they are stored
  std::string config_from = "";     // non-empty: config.json from this one (WriteConfigFrom), the
                                    // source folder's; empty: ToHfConfigJson's
};

// Writes `config` and the base parameters of `layers` (values in `weights`) as a Hugging Face
// model folder `dir` (created). REQUIRES: `weights` holds every storage-owning base parameter.
Status WriteModelFolder(const std::string& dir, const ModelConfig& config,
                        const std::vector<LayerSpec>& layers, const HostTensors& weights,
                        const ModelFolderWriteOptions& options = {});

// Writes `dir`/config.json from the model folder config.json `source_config`: every field the
// source has (token ids, fields ferry does not model), the weights' dtype set to `dtype`
// (torch_dtype, and transformers 5's dtype where present), without a quantization_config or an
// auto_map (the custom code it names is not copied; ferry's families are transformers' own
// classes). For folders made from a model folder: a fine-tuned or merged model. Errors name the
// file.
Status WriteConfigFrom(const std::string& source_config, DType dtype, const std::string& dir);

// Writes `dir`/config.json for weights stored as `dtype`: from `config_from` (WriteConfigFrom)
// when given, else ToHfConfigJson of `config` (the fields ferry models).
Status WriteFolderConfig(const std::string& dir, const ModelConfig& config, DType dtype,
                         const std::string& config_from);

// The tokenizer and generation files CopyTokenizerFiles copies.
inline constexpr const char* kTokenizerFileNames[] = {"tokenizer.json",
                                                      "tokenizer_config.json",
                                                      "special_tokens_map.json",
                                                      "generation_config.json",
                                                      "tokenizer.model",
                                                      "vocab.json",
                                                      "merges.txt"};

// Copies tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
// (and the sentencepiece tokenizer.model, vocab.json, merges.txt) from `from_dir` into `to_dir`,
// each when present. Errors name the file.
Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir);

// True when `dir` holds a config.json (what `--model DIR` expects).
bool IsModelFolder(const std::string& dir);

}  // namespace ferry
