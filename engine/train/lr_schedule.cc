#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

namespace ferry {

double LrSchedule::At(int64_t k) const {
  assert(k >= 0);
  if (warmup_steps > 0 && k < warmup_steps) return lr * double(k + 1) / double(warmup_steps);
  const double p =
      double(k - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  switch (decay) {
    case LrDecay::kLinear:
      return lr * (min_ratio + (1.0 - min_ratio) * (1.0 - p));
    case LrDecay::kConstant:
      return lr;
    case LrDecay::kCosine:
      break;
  }
  return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

}  // namespace ferry
