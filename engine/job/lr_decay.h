// LrDecay: how the learning rate falls after the warm-up (--lr-schedule; the formulas are in
// engine/train/lr_schedule.h, which applies them).
#pragma once

#include <string_view>

#include "kernels/status.h"

namespace ferry {

enum class LrDecay {
  kCosine,    // a half cosine from lr down to min_lr_ratio * lr
  kLinear,    // a straight line from lr down to min_lr_ratio * lr
  kConstant,  // lr throughout (min_lr_ratio unused)
};

// "cosine", "linear", "constant": the --lr-schedule values.
std::string_view LrDecayName(LrDecay d);
// Errors: InvalidArgument naming the value and the three accepted.
Result<LrDecay> ParseLrDecay(std::string_view name);

}  // namespace ferry
