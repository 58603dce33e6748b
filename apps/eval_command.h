// `ferry eval`: mean loss and perplexity of a model on a dataset file (every row of it, or the
// first --max-batches micro-batches), forward only. The file is read, masked and packed exactly as
// `ferry train --data` does (engine/train/training_data.h), in file order (no shuffle).
//
// --model / --adapter: resolved and loaded as for `ferry generate` (engine/job/model_source.h):
// "tiny" (the preset at its seeded initialization, a smoke test), a Hugging Face model folder, or
// a run folder of `ferry train` (full or LoRA), with an optional PEFT LoRA adapter. The forward
// runs as a forward-only plan (no gradient buffers) on --devices (GPUs when present, else CPU
// devices, as `ferry train`), said at the start.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/model/lora_config.h"

namespace ferry {

class JobFileKeys;  // apps/job_file.h

struct EvalCommand {
  const JobFileKeys* job_file = nullptr;  // what a --config job file set (may be null)
  CLI::App* app = nullptr;
  std::string model = "tiny";
  std::string adapter;  // PEFT LoRA adapter folder; empty: the model folder's own, if any
  std::string data;
  int64_t seq_len = 128;
  int64_t batch_size = 8;
  int64_t max_batches = 0;
  std::string chat_template = "auto";
  std::string long_examples = "split";
  bool skip_bad_lines = false;
  bool train_on_prompt = false;  // score prompts and user turns too
  uint64_t seed = 1234;          // the tiny model's initialization
  int64_t threads = 0;
  BaseQuant quantize = BaseQuant::kNone;  // --quantize nf4: the base's projections in NF4
  bool double_quant = true;               // --[no-]double-quant: NF4's absmax nested
  bool json = false;
  // --devices, --dtype and --gpu-memory (devices, device_kind, gpus, dtype and gpu_memory only:
  // the rest is set from the options above).
  JobSpec devices;
};

// Adds the `eval` subcommand to `parent`; `cmd` must outlive parsing.
void AddEvalCommand(CLI::App& parent, EvalCommand* cmd);

// Exit code: 0 done; 1 bad input or a failure (one line on stderr); 2 not available yet.
int RunEvalCommand(EvalCommand& cmd);

}  // namespace ferry
