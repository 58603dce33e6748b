#include "engine/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "engine/model/counter_rng.h"

namespace ferry {

Status ValidateSamplingOptions(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return Status::InvalidArgument("--temperature must be >= 0 (0: greedy), got " +
                                   std::to_string(o.temperature));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return Status::InvalidArgument("--top-p must be in (0, 1], got " + std::to_string(o.top_p));
  }
  if (o.top_k < 0) {
    return Status::InvalidArgument("--top-k must be >= 0 (0: no limit), got " +
                                   std::to_string(o.top_k));
  }
  return Status::Ok();
}

int32_t Argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

SamplingCandidates Candidates(std::span<const float> logits, const SamplingOptions& o) {
  const int64_t v = int64_t(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] ||
           (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  order.resize(size_t(k));
  // softmax(logits / T) over the kept tokens, from the largest (first) down, in double.
  const double top = double(logits[size_t(order[0])]) / o.temperature;
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[size_t(i)] = std::exp(double(logits[size_t(order[size_t(i)])]) / o.temperature - top);
    sum += p[size_t(i)];
  }
  // The nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  SamplingCandidates c;
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) {
    c.ids.push_back(order[size_t(i)]);
    c.probs.push_back(p[size_t(i)] / sum);
    mass += p[size_t(i)] / sum;
    if (mass >= o.top_p) break;
  }
  for (double& q : c.probs) q /= mass;
  return c;
}

int32_t SampleToken(std::span<const float> logits, const SamplingOptions& o, uint64_t step) {
  if (o.temperature == 0) return Argmax(logits);
  const SamplingCandidates c = Candidates(logits, o);
  const double u = UniformOpen01(Mix64(Mix64(o.seed) ^ step));
  double acc = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    acc += c.probs[i];
    if (u < acc) return c.ids[i];
  }
  return c.ids.back();  // u within rounding of 1
}

}  // namespace ferry
