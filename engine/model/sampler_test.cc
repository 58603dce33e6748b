// The sampler on fixed distributions: greedy, temperature, top-k, the nucleus, and that draws
// only ever land in the candidate set, with frequencies matching its probabilities.
#include "engine/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace ferry {
namespace {

// logits = log p for p = {0.05, 0.5, 0.1, 0.2, 0.15} (token 1 most likely, then 3, 4, 2, 0).
std::vector<float> Fixed() {
  std::vector<float> l;
  for (double p : {0.05, 0.5, 0.1, 0.2, 0.15}) l.push_back(float(std::log(p)));
  return l;
}

// Probabilities come back from float logits: 1e-6 relative covers the float rounding of log p.
constexpr double kTol = 1e-6;

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  EXPECT_EQ(Argmax(Fixed()), 1);
  EXPECT_EQ(SampleToken(Fixed(), {}, 0), 1);
  const std::vector<float> tie = {0.f, 2.f, 1.f, 2.f};
  EXPECT_EQ(SampleToken(tie, {}, 5), 1);
}

TEST(Sampler, NucleusIsTheShortestPrefixReachingP) {
  SamplingOptions o{.temperature = 1.0, .top_p = 0.7};
  SamplingCandidates c = Candidates(Fixed(), o);
  ASSERT_EQ(c.ids, (std::vector<int32_t>{1, 3}));  // 0.5 + 0.2 reaches 0.7
  EXPECT_NEAR(c.probs[0], 0.5 / 0.7, kTol);
  EXPECT_NEAR(c.probs[1], 0.2 / 0.7, kTol);
  o.top_p = 0.71;
  EXPECT_EQ(Candidates(Fixed(), o).ids, (std::vector<int32_t>{1, 3, 4}));
  o.top_p = 0.1;  // below the top token's mass: the top token alone
  EXPECT_EQ(Candidates(Fixed(), o).ids, (std::vector<int32_t>{1}));
  o.top_p = 1.0;
  EXPECT_EQ(Candidates(Fixed(), o).ids, (std::vector<int32_t>{1, 3, 4, 2, 0}));
}

TEST(Sampler, TopKThenNucleus) {
  SamplingOptions o{.temperature = 1.0, .top_p = 1.0, .top_k = 2};
  SamplingCandidates c = Candidates(Fixed(), o);
  ASSERT_EQ(c.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(c.probs[0], 0.5 / 0.7, kTol);
  o.top_k = 3;
  o.top_p = 0.6;  // within the top 3 (mass 0.85): 0.5/0.85 < 0.6 <= 0.7/0.85
  EXPECT_EQ(Candidates(Fixed(), o).ids, (std::vector<int32_t>{1, 3}));
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  // softmax(log p / T) is proportional to p^(1/T).
  for (double t : {0.5, 2.0}) {
    SamplingCandidates c = Candidates(Fixed(), {.temperature = t});
    double z = 0;
    for (double p : {0.05, 0.5, 0.1, 0.2, 0.15}) z += std::pow(p, 1 / t);
    EXPECT_NEAR(c.probs[0], std::pow(0.5, 1 / t) / z, kTol) << "T=" << t;
    EXPECT_NEAR(c.probs[4], std::pow(0.05, 1 / t) / z, kTol) << "T=" << t;
  }
}

TEST(Sampler, DrawsStayInTheNucleusWithItsFrequencies) {
  const SamplingOptions o{.temperature = 1.0, .top_p = 0.8, .seed = 42};
  const SamplingCandidates c = Candidates(Fixed(), o);  // {1, 3, 4}: 0.5, 0.2, 0.15 of 0.85
  ASSERT_EQ(c.ids.size(), 3u);
  const int n = 20000;
  std::map<int32_t, int> count;
  for (int i = 0; i < n; ++i) ++count[SampleToken(Fixed(), o, uint64_t(i))];
  EXPECT_EQ(count.count(0), 0u);
  EXPECT_EQ(count.count(2), 0u);
  for (size_t i = 0; i < c.ids.size(); ++i) {
    // Binomial: 5 standard deviations (sqrt(n p (1-p)) <= 71 here) leaves a false failure at
    // about 1 in 10^6 for a correct sampler; a wrong nucleus or renormalization is off by > 500.
    const double want = n * c.probs[i];
    EXPECT_NEAR(count[c.ids[i]], want, 5 * std::sqrt(want * (1 - c.probs[i])))
        << "token " << c.ids[i];
  }
  // The same (seed, step) always draws the same token.
  for (uint64_t s = 0; s < 50; ++s)
    EXPECT_EQ(SampleToken(Fixed(), o, s), SampleToken(Fixed(), o, s));
}

TEST(Sampler, OptionsAreValidated) {
  EXPECT_TRUE(ValidateSamplingOptions({}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({.temperature = -1}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({.temperature = NAN}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({.top_p = 0}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({.top_p = 1.5}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({.top_k = -1}).ok());
}

}  // namespace
}  // namespace ferry
