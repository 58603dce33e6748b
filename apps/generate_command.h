// `ferry generate`: text generation with a KV cache (engine/model/generator.h) from the built-in
// tiny model, a Hugging Face model folder or a run folder written by `ferry train` (full or LoRA),
// with an optional PEFT LoRA adapter (--model/--adapter resolved by engine/job/model_source.h),
// streaming the text to stdout as tokens are drawn and the speed to stderr. It runs a generation
// plan on --devices (CPU devices: the KV cache is f32), sized by the memory model, as train and
// eval run theirs (engine/train/training_runner.h: CreateGenerationRunner).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/model/lora_config.h"

namespace ferry {

class JobFileKeys;  // apps/job_file.h

struct GenerateCommand {
  const JobFileKeys* job_file = nullptr;  // what a --config job file set (may be null)
  CLI::App* app = nullptr;
  std::string model = "tiny";          // "tiny" | run folder | model folder
  std::string adapter;                 // LoRA adapter folder; empty: the model folder's own, if any
  std::string prompt;                  // empty and not given: read stdin
  bool chat = false;                   // --chat: the prompt is a user turn of the chat template
  std::string system;                  // --system: a system turn before it (with --chat)
  bool no_thinking = false;            // --no-thinking: Qwen3's enable_thinking=False
  std::string chat_template = "auto";  // --chat-template
  int64_t max_tokens = 128;            // new tokens at most
  double temperature = 0.8;
  double top_p = 0.95;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t threads = 0;  // CPU threads (0: all cores); int64 so a huge value is refused by name
  BaseQuant quantize = BaseQuant::kNone;  // --quantize nf4: the base's projections in NF4
  bool double_quant = true;               // --[no-]double-quant: NF4's absmax nested
  // --devices (devices, device_kind and gpus only: the rest of the job is set from the options
  // above); "auto" runs on CPU devices.
  JobSpec devices;
};

// Adds the `generate` subcommand to `parent`; `cmd` receives the parsed options and must outlive
// parsing.
void AddGenerateCommand(CLI::App& parent, GenerateCommand* cmd);

// Loads the model, encodes the prompt and generates. Returns the process exit code: 0 done, 1 bad
// input or a run-time failure (one line on stderr saying what to change).
int RunGenerateCommand(GenerateCommand& cmd);

}  // namespace ferry
