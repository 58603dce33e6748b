// The learning-rate schedule: linear warm-up, then a decay down to min_ratio * lr (--lr-schedule):
// a half cosine (the default), a straight line, or none (constant).
//
// For the k-th optimizer update (k = 0 .. total_steps - 1):
//   f(k) = (k + 1) / warmup                                               if k < warmup
//   otherwise, with p = (k - warmup) / max(1, total_steps - warmup):
//     cosine:   f(k) = min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * p))
//     linear:   f(k) = min_ratio + (1 - min_ratio) * (1 - p)
//     constant: f(k) = 1
//   lr_k = lr * f(k)
// The first update already has a non-zero rate ((k + 1), unlike transformers'
// get_cosine_schedule_with_warmup and get_linear_schedule_with_warmup, whose first update has
// rate 0), and so does the last one (p < 1). scripts/make_goldens.py implements the cosine
// (lr_factor); the goldens record lr_k.
#pragma once

#include <cstdint>

#include "engine/job/lr_decay.h"

namespace ferry {

struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.0;
  LrDecay decay = LrDecay::kCosine;

  // lr_k for update k (0-based). REQUIRES: 0 <= k.
  double At(int64_t k) const;
};

}  // namespace ferry
