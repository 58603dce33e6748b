// LossScaler: dynamic loss scaling for fp16 training, with the semantics of PyTorch's
// torch.amp.GradScaler (its defaults: initial scale 2^16, growth x2 after 2000 consecutive
// steps with finite gradients, backoff x0.5 on a step whose gradients hold an inf or a nan).
//
// fp16's range (smallest normal 2^-14) underflows small activation gradients, so the loss is
// multiplied by the scale before backward (the LM head's loss_scale) and the parameter
// gradients are divided by it (AdamW's grad_scale, with the clip coefficient) before clipping
// and the update. The Trainer checks the gradients globally, the way the clip norm is taken:
// the sum of their squares over every trainable parameter is finite exactly when every gradient
// is (a finite fp32 value squared stays finite in double). A non-finite step is skipped whole:
// no weight, moment or AdamW step count changes (the Trainer's doc says what the LR schedule
// does). Scales are powers of two, so scaling and unscaling are exact away from subnormals.
//
// Disabled (bf16 and f32 training): the scale is 1, Update always says apply, and nothing of the
// step's arithmetic changes.
//
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace ferry {

struct LossScalerOptions {
  bool enabled = false;
  double initial_scale = 65536;    // 2^16; a power of two in [1, 2^100]
  int64_t growth_interval = 2000;  // consecutive finite steps before the scale doubles (>= 1)
};

// What a checkpoint saves, so a resumed run continues with the same scales.
struct LossScalerState {
  double scale = 1;
  int64_t growth_tracker = 0;  // consecutive finite steps since the last growth or backoff
  int64_t skipped_steps = 0;   // steps skipped for non-finite gradients, over the whole run
  friend bool operator==(const LossScalerState&, const LossScalerState&) = default;
};

// InvalidArgument saying which option is out of range (JobSpec checks the flags the same way).
Status ValidateLossScalerOptions(const LossScalerOptions& options);

class LossScaler {
 public:
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;

  // REQUIRES: ValidateLossScalerOptions(options).ok().
  explicit LossScaler(const LossScalerOptions& options);

  bool enabled() const { return options_.enabled; }
  // The scale this step's loss is multiplied by (1 when disabled).
  double scale() const { return state_.scale; }
  const LossScalerState& state() const { return state_; }
  // Continues from a checkpoint's state. InvalidArgument for a state a scaler cannot reach (a
  // scale that is not a positive power of two, a negative count, a disabled scaler's scale != 1).
  Status Restore(const LossScalerState& state);

  // After a step's gradients were checked: true when they were finite (apply the update). Then,
  // as GradScaler.update: finite -> the tracker counts the step, and on reaching the growth
  // interval the scale doubles (unless that overflows fp32, as torch keeps the old scale) and the
  // tracker restarts; non-finite -> the scale halves, the tracker restarts, the step counts as
  // skipped. Disabled: always true, nothing changes.
  bool Update(bool grads_finite);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace ferry
