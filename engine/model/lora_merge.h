// Merging a LoRA adapter into its base (PEFT's merge_and_unload): each adapted projection's
// weight becomes W + scaling * B A, with A (r, in), B (out, r) and scaling = alpha / r (alpha /
// sqrt(r) for rsLoRA: LoraConfig::scaling) (engine/model/lora_config.h), so that the model computes
// what base and adapter computed together, with no adapter. The sum is taken in fp32 from the
// base's values (read from its files, or dequantized from NF4: a QLoRA base is written unquantized)
// and rounded once to the dtype written; every other tensor is written as loaded. The folder is a
// plain Hugging Face model folder (config.json, safetensors, the tokenizer's files), which
// transformers loads without peft.
//
// Stateless; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/model_folder.h"
#include "kernels/status.h"

namespace ferry {

// What a merge wrote.
struct MergeSummary {
  int64_t projections = 0;  // weights an adapter changed
  int64_t tensors = 0;      // tensors written
};

// Writes `m` (a base with its LoRA adapter, as LoadModelFolder or LoadInferenceModel load it) with
// the adapter merged into the base, as a Hugging Face model folder `dir` (options: the dtype,
// shards and tokenizer files; options.adjust must be unset). Errors: InvalidArgument when `m` has
// no adapter, or an adapter matrix is missing or has the wrong size, named; WriteModelFolder's.
Result<MergeSummary> WriteMergedModelFolder(const std::string& dir, const LoadedModel& m,
                                            const ModelFolderWriteOptions& options);

}  // namespace ferry
