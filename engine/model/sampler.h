// Sampler: picks the next token from a row of logits — greedy (temperature 0), or a draw from
// softmax(logits / temperature) restricted to the top-k most likely tokens and then to the nucleus
// (top-p: the smallest set of most likely tokens whose probability reaches p), renormalized.
//
// Draws are counter-based (engine/model/counter_rng.h): the uniform of draw `step` is a pure
// function of (seed, step), so a seed reproduces a generation exactly, whatever ran before.
// Ties in probability are broken by the lower token id, everywhere.
//
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/status.h"

namespace ferry {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax); > 0: divides the logits
  double top_p = 1.0;        // nucleus mass in (0, 1]; 1: no restriction
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  uint64_t seed = 0;
};

// InvalidArgument naming the option: temperature < 0 or not finite, top_p outside (0, 1],
// top_k < 0.
Status ValidateSamplingOptions(const SamplingOptions& o);

// The tokens a draw may pick, most likely first, with their renormalized probabilities (summing
// to 1). REQUIRES: temperature > 0, options valid, logits not empty.
struct SamplingCandidates {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};
SamplingCandidates Candidates(std::span<const float> logits, const SamplingOptions& o);

// The index of the largest logit (the lowest on ties). REQUIRES: logits not empty.
int32_t Argmax(std::span<const float> logits);

// Argmax when temperature == 0; otherwise a draw from Candidates with the uniform of (seed, step).
// REQUIRES: options valid, logits not empty.
int32_t SampleToken(std::span<const float> logits, const SamplingOptions& o, uint64_t step);

}  // namespace ferry
