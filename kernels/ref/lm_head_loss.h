// Reference LM head + cross-entropy: materializes the full (N, V) logits and computes the
// log-softmax in double, element by element. Semantics as kernels/ops/lm_head_loss.h. Templated
// on the real type R of inputs and outputs (float, double); internal math is double either way,
// so finite-difference checks in double and comparisons of the fp32 kernels use the same code.
//
// Accumulation: dh is written (`=`), dw is accumulated (`+=`).
// Thread-safety: pure function.
#pragma once

#include <cstdint>

namespace ferry::ref {

// h: (N, C); w: (V, C); targets: (N) in [0, V) or kIgnoreIndex. Outputs may be null:
// token_loss (N) `=`; dh (N, C) `=`; dw (V, C) `+=`. Returns sum(token_loss) / normalizer.
// REQUIRES: targets valid, normalizer > 0.
template <typename R>
double LmHeadLoss(const R* h, const R* w, const int32_t* targets, int64_t N, int64_t V, int64_t C,
                  double normalizer, double loss_scale, R* token_loss, R* dh, R* dw);

}  // namespace ferry::ref
