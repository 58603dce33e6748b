#include "kernels/ref/lm_head_loss.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops/lm_head_loss.h"

namespace ferry::ref {

template <typename R>
double LmHeadLoss(const R* h, const R* w, const int32_t* targets, int64_t N, int64_t V, int64_t C,
                  double normalizer, double loss_scale, R* token_loss, R* dh, R* dw) {
  assert(normalizer > 0);
  std::vector<double> logits(size_t(N * V));  // (N, V): the thing the fast kernel never holds
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += double(h[n * C + c]) * double(w[v * C + c]);
      logits[size_t(n * V + v)] = acc;
    }
  }
  const double s = loss_scale / normalizer;
  double sum = 0;
  std::vector<double> dlogits(size_t(N * V), 0.0);  // (N, V)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t == kIgnoreIndex) {
      if (token_loss != nullptr) token_loss[n] = R(0);
      continue;
    }
    assert(t >= 0 && t < V);
    const double* row = &logits[size_t(n * V)];
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    const double lse = mx + std::log(z);
    const double loss = lse - row[t];  // -log softmax(row)[t]
    if (token_loss != nullptr) token_loss[n] = R(loss);
    sum += loss;
    for (int64_t v = 0; v < V; ++v) {
      dlogits[size_t(n * V + v)] = (std::exp(row[v] - lse) - (v == t ? 1.0 : 0.0)) * s;
    }
  }
  if (dh != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t v = 0; v < V; ++v) acc += dlogits[size_t(n * V + v)] * double(w[v * C + c]);
        dh[n * C + c] = R(acc);
      }
    }
  }
  if (dw != nullptr) {
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dlogits[size_t(n * V + v)] * double(h[n * C + c]);
        dw[v * C + c] = R(double(dw[v * C + c]) + acc);
      }
    }
  }
  return sum / normalizer;
}

template double LmHeadLoss<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                                  int64_t, double, double, float*, float*, float*);
template double LmHeadLoss<double>(const double*, const double*, const int32_t*, int64_t, int64_t,
                                   int64_t, double, double, double*, double*, double*);

}  // namespace ferry::ref
