// ModelRunner against PyTorch goldens (tests/goldens/, scripts/make_goldens.py)
// on a CpuDevice in f32: logits, loss and every parameter gradient, element by
// element.
#include "engine/model/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/testing/runner_fixture.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::RunnerFixture;

// Tolerances (fp32 everywhere, on both sides). Both ferry and PyTorch compute
// in fp32 but sum in different orders (OpenBLAS vs MKL/cuBLAS panels, tiled
// online-softmax attention vs the eager softmax, chunked log-sum-exp in double
// vs fp32): each dot product of length K <= 128 carries relative rounding error
// of order sqrt(K) * eps32 ~ 1e-6, and two blocks, the head and the backward
// compose a few dozen such steps. Values are O(1) (logits), O(1e-1..1e-3)
// (gradients), so we allow atol 2e-5 on logits (O(1) values: ~200 ulps) and
// 1e-5 + 1e-3 relative on gradients (small gradients are sums of cancelling
// terms whose absolute error, not relative, is bounded).
constexpr float kLogitAtol = 2e-5f, kLogitRtol = 1e-4f;
constexpr float kGradAtol = 1e-5f, kGradRtol = 1e-3f;

class RunnerGoldenTest : public ::testing::TestWithParam<const char *> {};

TEST_P(RunnerGoldenTest, LogitsMatchPyTorch) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<std::vector<float>> logits = (*f)->runner->Logits((*f)->tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  Result<std::vector<float>> want = (*f)->golden.io.ReadFloats("logits");
  ASSERT_TRUE(want.ok());
  ExpectClose(*logits, *want, kLogitAtol, kLogitRtol, "logits");
}

TEST_P(RunnerGoldenTest, LossAndGradientsMatchPyTorch) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  RunnerFixture &fx = **f;
  HostTensors grads = fx.ZeroGrads();
  Result<double> loss = fx.runner->AccumulateGradients(
      {fx.tokens, fx.targets, fx.normalizer}, grads);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  // The loss is a mean of 17 log-sum-exps of O(1) logits: ~1e-6 relative in
  // fp32.
  const double want = fx.golden.info["loss"].get<double>();
  EXPECT_NEAR(*loss, want, 2e-6 * want);
  int checked = 0;
  for (const LayerSpec &l : fx.layers) {
    for (const ParamSpec &p : l.params) {
      if (!p.trainable || !p.tied_to.empty())
        continue;
      Result<std::vector<float>> g = fx.GoldenGrad(p);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      ExpectClose(grads.tensors.at(p.name), *g, kGradAtol, kGradRtol, p.name);
      ++checked;
    }
  }
  EXPECT_EQ(checked, int(fx.golden.grads.tensors().size()));
}

INSTANTIATE_TEST_SUITE_P(Goldens, RunnerGoldenTest,
                         ::testing::Values("llama", "qwen3", "gpt2",
                                           "llama_lora"));

} // namespace
} // namespace ferry
