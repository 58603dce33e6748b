// The one check every command (train, plan, eval, generate, probe) makes before it allocates
// anything: what it is about to run, against the model and against this machine.
//   - the threads (--threads) against the machine's hardware threads (ValidateThreads);
//   - the tokens one sequence reaches (--seq-len; generate: the prompt plus --max-tokens) against
//     the model's positions (max_position_embeddings);
//   - the bytes of the CPU device the command will create (its weights, activations and scratch
//     as the command sizes them) against this machine's physical memory.
// Errors are one line naming the option(s), the numbers and what to lower.
//
// Plain values and stateless functions; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/model/model_config.h"
#include "kernels/status.h"

namespace ferry {

// What the command checks against: this machine's, or a test's made-up one.
struct MachineLimits {
  int64_t hardware_threads = 1;
  uint64_t memory_bytes = 0;  // physical memory; 0: unknown (device sizes are then not checked)

  static MachineLimits OfThisMachine();
};

// Sequences x tokens in one forward pass: at most 2^40, so every size computed from them fits
// in 64 bits.
inline constexpr int64_t kMaxTokensPerForward = int64_t(1) << 40;

// What a command is about to run; fields left at 0 (or empty) are not checked.
struct RunLimits {
  int64_t threads = 0;         // --threads (0: all cores)
  int64_t positions = 0;       // the tokens one sequence reaches
  std::string positions_from;  // the option(s) that set them, with the numbers: "--seq-len 4096"
  int64_t rows = 0;            // sequences in one forward pass (at most kMaxTokensPerForward
                               // tokens together)
  // The bytes of the CPU device(s) the command will create, all together; called only once the
  // numbers above passed (so its arithmetic cannot overflow).
  std::function<uint64_t()> device_bytes;
  std::string device_from;  // what sets the rows and the bytes: "--batch-size 64 x --seq-len 4096"
};

[[nodiscard]] Status ValidateRunLimits(const RunLimits& run, const ModelConfig& model,
                                       const MachineLimits& machine);

// ValidateRunLimits against this machine.
[[nodiscard]] Status ValidateRunLimits(const RunLimits& run, const ModelConfig& model);

}  // namespace ferry
