// `ferry merge`: a LoRA adapter merged into its base (engine/model/lora_merge.h), written as a
// plain Hugging Face model folder that transformers, `ferry train --model` and any other tool load
// without the adapter: the last step of a LoRA fine-tune for those who want one model to ship.
//
// --model / --adapter: resolved and loaded as for `ferry eval` and `generate`
// (engine/job/model_source.h): a LoRA run folder of `ferry train` (its base found from its
// job.json), or a Hugging Face model folder with --adapter naming a PEFT adapter folder. A QLoRA
// base (NF4: pre-quantized, a QLoRA run folder's, or --quantize nf4 for an adapter trained over a
// base quantized so) is dequantized and written unquantized. config.json is the base's own, with
// the dtype written and no quantization_config. --out must not exist or be empty; the folder
// appears whole (written beside it, then renamed) or not at all, and what a killed merge left
// beside it is removed by the next.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/model/lora_config.h"

namespace ferry {

struct MergeCommand {
  CLI::App* app = nullptr;
  std::string model;
  std::string adapter;  // PEFT LoRA adapter folder; empty: the run folder's own
  std::string out;
  std::string dtype = "auto";             // the weights' dtype: auto (the base's), f32, bf16, f16
  std::string max_shard_size = "5GB";     // 0: one model.safetensors
  BaseQuant quantize = BaseQuant::kNone;  // --quantize nf4: merge into the base's NF4 values
  bool double_quant = true;               // --[no-]double-quant: NF4's absmax nested
};

// Adds the `merge` subcommand to `parent`; `cmd` must outlive parsing.
void AddMergeCommand(CLI::App& parent, MergeCommand* cmd);

// Exit code: 0 done; 1 bad input or a failure (one line on stderr).
int RunMergeCommand(MergeCommand& cmd);

}  // namespace ferry
