// The reference runner in bf16 (ReferenceRunnerOptions::compute_dtype): bf16 weights and
// activations, GEMMs on bf16 inputs with fp32 accumulation (oneDNN's kernels where the CPU has
// AVX512-BF16 or AMX, the converted fp32 panels elsewhere), element-wise math in fp32, fp32
// parameter gradients. Checked element by element against the same PyTorch fp32 goldens the f32
// runner matches (model_runner_test.cc), with tolerances derived from bf16's unit roundoff u =
// 2^-8:
//  - every stored activation and weight is rounded once (relative error <= u), and an error
//    carries through the two blocks, the head and the backward: a few dozen roundings compose, so
//    errors of several u times the magnitudes involved are expected. Each tensor is checked with
//    atol = k u max|want| (the tensor's own scale: gradients of different parameters differ by
//    orders of magnitude) plus rtol = k u: k = 8 for the logits (measured worst over the seven
//    goldens: 2.0 u max|want|, llama_lora) and 16 for the gradients (measured worst 6.5, qwen3's
//    k_proj; the test records each tensor's worst as a property of its test case);
//  - the loss, a mean of log-sum-exps computed in fp32 from bf16 logits: 8 u relative.
// Also: recomputation is bit-identical in bf16 too. (The saved buffers against the memory model's
// bf16 bytes: model_runner_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/model/model_runner.h"
#include "engine/model/tensor_carver.h"
#include "engine/testing/reference_runner.h"
#include "engine/testing/runner_fixture.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::RunnerFixture;

constexpr float kU = DTypeEpsilon(DType::kBF16);  // 2^-8
constexpr float kLogitK = 8, kGradK = 16;         // roundings composed, see the header
constexpr double kLossRtol = 8 * double(kU);

ReferenceRunnerOptions Bf16(ReferenceRunnerOptions o = {}) {
  o.compute_dtype = DType::kBF16;
  return o;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// |got - want| <= k u (max|want| + |want|), element by element; records the worst error in units
// of u max|want| so the tolerance's margin is visible in the test's XML report.
void ExpectBf16Close(const std::vector<float>& got, const std::vector<float>& want, float k,
                     const std::string& what) {
  const float scale = std::max(MaxAbs(want), 1e-30f);
  ExpectClose(got, want, k * kU * scale, k * kU, what);
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / (kU * scale));
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

class RunnerBf16Test : public ::testing::TestWithParam<const char*> {};

TEST_P(RunnerBf16Test, LogitsMatchPyTorchWithinBf16Rounding) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam(), Bf16());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<std::vector<float>> logits = (*f)->runner->Logits((*f)->tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  Result<std::vector<float>> want = (*f)->golden.io.ReadFloats("logits");
  ASSERT_TRUE(want.ok());
  ExpectBf16Close(*logits, *want, kLogitK, "logits");
}

TEST_P(RunnerBf16Test, LossAndGradientsMatchPyTorchWithinBf16Rounding) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam(), Bf16());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  (*f)->ExpectStepMatchesGolden(kLossRtol, [](const auto& got, const auto& want, const auto& name) {
    ExpectBf16Close(got, want, kGradK, name);
  });
}

// bf16 is not f32: the same runner in f32 gives different bits (so the dtype really changed).
TEST_P(RunnerBf16Test, DiffersFromF32) {
  Result<std::unique_ptr<RunnerFixture>> a = RunnerFixture::Create(GetParam());
  Result<std::unique_ptr<RunnerFixture>> b = RunnerFixture::Create(GetParam(), Bf16());
  ASSERT_TRUE(a.ok() && b.ok());
  Result<std::vector<float>> la = (*a)->runner->Logits((*a)->tokens);
  Result<std::vector<float>> lb = (*b)->runner->Logits((*b)->tokens);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_NE(*la, *lb);
}

TEST_P(RunnerBf16Test, RecomputationIsBitIdentical) {
  Result<std::unique_ptr<RunnerFixture>> saved = RunnerFixture::Create(GetParam(), Bf16());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ReferenceRunnerOptions o = Bf16();
  o.recompute.assign(size_t((*saved)->golden.config.num_layers), true);
  Result<std::unique_ptr<RunnerFixture>> recomputed = RunnerFixture::Create(GetParam(), o);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status().ToString();
  auto step = [](RunnerFixture& fx) {
    HostTensors g = fx.ZeroGrads();
    Result<double> loss = fx.runner->AccumulateGradients({fx.tokens, fx.targets, fx.normalizer}, g);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    return std::pair{loss.ok() ? *loss : NAN, g};
  };
  const auto [loss_a, grads_a] = step(**saved);
  const auto [loss_b, grads_b] = step(**recomputed);
  EXPECT_EQ(loss_a, loss_b);
  for (const auto& [name, g] : grads_a.tensors) {
    EXPECT_EQ(g, grads_b.tensors.at(name)) << name << " differs with recomputation";
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, RunnerBf16Test,
                         ::testing::Values("llama", "qwen3", "gpt2", "llama_lora", "llama3_rope",
                                           "mistral_window", "qwen2"));

}  // namespace
}  // namespace ferry
