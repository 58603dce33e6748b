// Pre-quantized bitsandbytes 4-bit model folders (the hub's `*-bnb-4bit` folders, written by
// transformers' save_pretrained on a model loaded with BitsAndBytesConfig(load_in_4bit=True)):
// reading their NF4 weights into ferry's host format (kernels/nf4.h), bit for bit.
//
// What such a folder holds, beside an ordinary model folder (engine/model/model_folder.h):
//  - config.json's "quantization_config": quant_method "bitsandbytes", load_in_4bit true,
//    bnb_4bit_quant_type ("nf4"; "fp4" is refused: not supported yet), bnb_4bit_use_double_quant,
//    bnb_4bit_compute_dtype, bnb_4bit_quant_storage (the dtype the packed bytes were viewed as:
//    "uint8" by default, "bfloat16" and others store the same bytes reinterpreted, so ferry reads
//    raw bytes whatever the storage), llm_int8_skip_modules (modules left unquantized).
//  - For each quantized linear weight W (every decoder-block projection, unless skipped):
//      W                                   the packed codes: (numel + 1) / 2 bytes, stored as
//                                          ((numel + 1) / 2, 1) U8 or the same bytes viewed as
//                                          the quant storage dtype
//      W.absmax                            per 64-element block: F32, or U8 when double-quantized
//      W.quant_map                         the 16-entry NF4 table, F32
//      W.nested_absmax, W.nested_quant_map (double quantization only) F32 per nested block, and
//                                          the 256-entry dynamic map, F32
//      W.quant_state.bitsandbytes__nf4     U8: the bytes of a JSON object {"quant_type": "nf4",
//                                          "blocksize": 64, "dtype": "bfloat16", "shape": [out,
//                                          in], and when nested "nested_blocksize": 256,
//                                          "nested_dtype": "float32", "nested_offset": x}
//    (bitsandbytes' QuantState.as_dict(packed=True), written by Linear4bit._save_to_state_dict.)
//    The logical shape is (out, in), GPT-2's Conv1D weights included (transformers transposes
//    them before quantizing): MasterShape of the parameter (engine/model/weights_io.h).
//  - Embeddings, norms, biases and lm_head stay ordinary float tensors.
//
// Every quantized weight is checked completely before it is handed out: the companions present
// with their dtypes and sizes, the JSON well-formed, the quant type nf4, the block size ferry
// computes with (kNf4Block = 64), the shape equal to what config.json implies. A bad folder is an
// error naming the tensor, the file and what is wrong, never a crash.
//
// ferry trains LoRA over such a folder's NF4 base (QLoRA: InitialWeights) and runs it (eval,
// generate: LoadModelFolder); both read it with LoadBnb4bitBase. LoadBaseWeights alone refuses a
// quantized tensor (UnexpectedQuantizedTensor).
//
// Plain values; the functions are thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/host_tensors.h"
#include "engine/model/model_config.h"
#include "engine/model/model_folder.h"
#include "engine/model/param_spec.h"
#include "kernels/dtype.h"
#include "kernels/nf4.h"
#include "kernels/status.h"

namespace ferry {

// config.json's quantization_config for bitsandbytes 4-bit.
struct Bnb4bitSettings {
  std::string quant_type = "nf4";         // bnb_4bit_quant_type (only nf4 is accepted)
  bool double_quant = false;              // bnb_4bit_use_double_quant
  DType compute_dtype = DType::kF32;      // bnb_4bit_compute_dtype (float32 when absent or null)
  std::string quant_storage = "uint8";    // bnb_4bit_quant_storage (torch dtype name)
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules (empty when absent or null)
};

// Parses the quantization_config of a config.json (its whole text): nullopt when there is none
// (an unquantized folder). Errors (InvalidArgument naming the field and what ferry accepts): a
// quant_method other than "bitsandbytes", 8-bit, a 4-bit quant type other than nf4 (fp4 is not
// supported yet), fields of the wrong type, a compute dtype or quant storage torch does not name.
Result<std::optional<Bnb4bitSettings>> ParseBnb4bitSettings(std::string_view config_json_text);

// ParseBnb4bitSettings of `dir`/config.json (errors name the file).
Result<std::optional<Bnb4bitSettings>> LoadBnb4bitSettings(const std::string& dir);

// The suffix of the tensor holding a quantized weight's JSON quant state ("<weight>" + this).
inline constexpr std::string_view kBnbQuantStateSuffix = ".quant_state.bitsandbytes__nf4";

// True when `folder` stores `param_name` quantized by bitsandbytes (its quant state tensor, nf4
// or fp4, or one of its companions is there).
bool IsBnbQuantized(const FolderWeights& folder, std::string_view param_name);

// The NF4 weights of a pre-quantized folder.
struct QuantizedWeights {
  Bnb4bitSettings settings;
  // Hugging Face parameter name ("model.layers.0.self_attn.q_proj.weight") -> its NF4 weight,
  // shape (out, in).
  std::map<std::string, Nf4Host> weights;
};

// Reads the quantized weight `name` of logical shape `shape` from `folder`. Errors name the tensor
// and the file: a missing companion (NotFound), the packed tensor's byte count, a companion of the
// wrong dtype or size, truncated or unparsable quant-state JSON, a field missing or of the wrong
// type, quant type fp4, a block size other than kNf4Block, a shape that is not `shape`, nested
// fields without nested tensors or the reverse (Corruption or InvalidArgument).
Result<Nf4Host> ReadBnb4bitWeight(const FolderWeights& folder, const std::string& name,
                                  std::span<const int64_t> shape);

// Reads the quantized weights of `layers` (the base parameters BuildLayerSpecs made from
// config.json) from `folder` one at a time, each checked and handed to `fn` (whose error stops the
// walk), so only one is read at a time. Errors as ReadBnb4bitWeights'.
Status ForEachBnb4bitWeight(const FolderWeights& folder, const Bnb4bitSettings& settings,
                            const std::vector<LayerSpec>& layers,
                            const std::function<Status(const ParamSpec&, Nf4Host)>& fn);

// Reads every quantized weight of `layers` (the base parameters BuildLayerSpecs made from
// config.json) from `folder`. Only decoder-block linear weights may be quantized (an embedding
// or lm_head stored quantized is refused by name); a block weight stored as floats is left to
// LoadBaseWeights (llm_int8_skip_modules).
Result<QuantizedWeights> ReadBnb4bitWeights(const FolderWeights& folder,
                                            const Bnb4bitSettings& settings,
                                            const std::vector<LayerSpec>& layers);

// Fills `weights` with the base parameters of `layers` from the pre-quantized `folder`: its NF4
// weights checked one at a time (ValidateNf4) and served from the folder as stored (no fp32 copy,
// no requantization: weights.nf4_served, read again when packed), the others as LoadBaseWeights
// loads them (`served`). `layers` must hold every stored NF4 weight in NF4 (ParamSpec::nf4:
// BuildLayerSpecs with lora.quantize kNf4); a block projection the folder left unquantized
// (llm_int8_skip_modules) is read as floats. Errors name the folder and the tensor: a quantized
// weight whose parameter is not nf4 in `layers` (InvalidArgument), and those of ReadBnb4bitWeights
// and LoadBaseWeights.
Status LoadBnb4bitBase(const FolderWeights& folder, const ModelConfig& config,
                       const Bnb4bitSettings& settings, const std::vector<LayerSpec>& layers,
                       HostTensors& weights, ServedBase served = ServedBase::kFrozen);

// A pre-quantized folder, read whole: what LoadModelFolder returns for an unquantized one, with
// the quantized weights in `quantized` instead of `weights`.
struct Bnb4bitModel {
  ModelConfig config;             // from config.json
  std::vector<LayerSpec> layers;  // BuildLayerSpecs(config, no LoRA)
  HostTensors weights;            // fp32 values of every base parameter that is not quantized
  QuantizedWeights quantized;     // the others
};

// Reads the pre-quantized folder `dir`. Errors as LoadModelFolder's and ReadBnb4bitWeights';
// a folder without a bitsandbytes 4-bit quantization_config is an InvalidArgument.
Result<Bnb4bitModel> LoadBnb4bitFolder(const std::string& dir);

// The error for the tensor `name` of `dir` found quantized by bitsandbytes where floats were
// expected (FailedPrecondition): a folder read as unquantized, its config.json without the
// quantization_config it was saved with.
Status UnexpectedQuantizedTensor(const std::string& dir, const std::string& name);

}  // namespace ferry
