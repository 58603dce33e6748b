// The reference runner (engine/testing/reference_runner.h) against PyTorch goldens (tests/goldens/,
// scripts/make_goldens.py) on a CpuDevice in f32: logits, loss and every parameter gradient,
// element by element.
#include "engine/model/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/model/tensor_carver.h"
#include "engine/testing/reference_runner.h"
#include "engine/testing/runner_fixture.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::GoldenModel;
using testing::RunnerFixture;

// Tolerances, from fp32's epsilon (2^-23 ~ 1.2e-7). ferry and PyTorch both compute in fp32 but
// sum in different orders (OpenBLAS vs PyTorch's GEMM panels, tiled online-softmax attention vs
// the eager softmax, the head's chunked log-sum-exp in double): each dot product of length K <= 128
// carries a relative rounding error of order sqrt(K) * eps, and two blocks, the head and the
// backward compose a few dozen such steps, so errors of tens of eps times the magnitudes involved
// are expected. Logits are O(1..10): atol 64 eps (measured worst 2.9e-6 = 24 eps). Gradients are
// at most O(1): atol 16 eps (measured worst 3.2e-7 = 2.7 eps), plus 1e-4 relative for the largest
// ones (the measured worst error is within atol alone).
// The loss is a mean of 17 log-sum-exps: 8 eps relative (measured worst 1.2e-7 relative).
constexpr float kEps = DTypeEpsilon(DType::kF32);
constexpr float kLogitAtol = 64 * kEps, kLogitRtol = 8 * kEps;
constexpr float kGradAtol = 16 * kEps, kGradRtol = 1e-4f;
constexpr double kLossRtol = 8 * kEps;

class RunnerGoldenTest : public ::testing::TestWithParam<const char*> {};

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
  // The loss is a mean of 17 log-sum-exps of O(1) logits: ~1e-6 relative in fp32.
  (*f)->ExpectStepMatchesGolden(2e-6, [](const auto& got, const auto& want, const auto& name) {
    ExpectClose(got, want, kGradAtol, kGradRtol, name);
  });
}

// Runs one micro-batch (the golden's) and returns the loss and gradients.
struct Step {
  double loss = 0;
  HostTensors grads;
  RunnerStats stats;
};
Step RunGoldenStep(RunnerFixture& fx) {
  Step s;
  s.grads = fx.ZeroGrads();
  Result<double> loss =
      fx.runner->AccumulateGradients({fx.tokens, fx.targets, fx.normalizer}, s.grads);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  s.loss = loss.ok() ? *loss : NAN;
  s.stats = fx.runner->stats();
  return s;
}

TEST_P(RunnerGoldenTest, RecomputationGivesBitIdenticalGradientsWithLessMemory) {
  Result<std::unique_ptr<RunnerFixture>> saved = RunnerFixture::Create(GetParam());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ReferenceRunnerOptions options;
  options.recompute.assign(size_t((*saved)->golden.config.num_layers), true);
  Result<std::unique_ptr<RunnerFixture>> recomputed = RunnerFixture::Create(GetParam(), options);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status().ToString();
  const Step a = RunGoldenStep(**saved), b = RunGoldenStep(**recomputed);
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.grads.tensors.size(), b.grads.tensors.size());
  for (const auto& [name, g] : a.grads.tensors) {
    const std::vector<float>& h = b.grads.tensors.at(name);
    ASSERT_EQ(g.size(), h.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], h[i]) << name << "[" << i << "] differs with recomputation";
    }
  }
  const int64_t L = (*saved)->golden.config.num_layers;
  EXPECT_EQ(a.stats.block_forward_calls, L);
  EXPECT_EQ(b.stats.block_forward_calls, 2 * L);
  EXPECT_LT(b.stats.arena_peak_bytes, a.stats.arena_peak_bytes);
}

// Overwriting buffers full of NaN (on a 2-thread host pool) gives the same bits as adding into
// zeroed ones: every trainable tensor is either stored or zeroed before any scatter-add, including
// the tied head's share (gpt2) and the LoRA factors (llama_lora).
TEST_P(RunnerGoldenTest, OverwritingGradientsEqualsAddingToZeros) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  RunnerFixture& fx = **f;
  const Step added = RunGoldenStep(fx);
  HostTensors grads = fx.ZeroGrads();
  for (auto& [name, g] : grads.tensors) std::fill(g.begin(), g.end(), NAN);
  ThreadPool pool(2);
  Result<double> loss = fx.runner->AccumulateGradients({.tokens = fx.tokens,
                                                        .targets = fx.targets,
                                                        .normalizer = fx.normalizer,
                                                        .overwrite_grads = true,
                                                        .host_pool = &pool},
                                                       grads);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ(*loss, added.loss);
  ASSERT_EQ(grads.tensors.size(), added.grads.tensors.size());
  for (const auto& [name, g] : added.grads.tensors) {
    const std::vector<float>& h = grads.tensors.at(name);
    ASSERT_EQ(g.size(), h.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], h[i]) << name << "[" << i << "] differs when overwriting";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, RunnerGoldenTest,
                         ::testing::Values("llama", "qwen3", "gpt2", "llama_lora", "llama3_rope",
                                           "mistral_window", "qwen2", "llama_qlora"));

// Two micro-batches of one sequence each, with the global batch's normalizer, accumulate to the
// gradients of the golden's batch of two (same tolerances: only the summation order differs).
TEST(RunnerAccumulationTest, TwoMicroBatchesGiveTheGradientOfTheWholeBatch) {
  ReferenceRunnerOptions options;
  Result<GoldenModel> g = GoldenModel::Load("llama");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const int64_t T = g->info["seq_len"];
  options.shape = {1, T};
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create("llama", options);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  RunnerFixture& fx = **f;
  HostTensors grads = fx.ZeroGrads();
  double loss = 0;
  for (int64_t b = 0; b < 2; ++b) {
    const std::span<const int32_t> tokens(fx.tokens.data() + b * T, size_t(T));
    const std::span<const int32_t> targets(fx.targets.data() + b * T, size_t(T));
    Result<double> l = fx.runner->AccumulateGradients({tokens, targets, fx.normalizer}, grads);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss += *l;
  }
  const double want = fx.golden.info["loss"].get<double>();
  EXPECT_NEAR(loss, want, kLossRtol * want);
  for (const LayerSpec& l : fx.layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.trainable || !p.tied_to.empty()) continue;
      Result<std::vector<float>> gold = fx.GoldenGrad(p);
      ASSERT_TRUE(gold.ok()) << gold.status().ToString();
      ExpectClose(grads.tensors.at(p.name), *gold, kGradAtol, kGradRtol, p.name);
    }
  }
}

// LoRA: the base weights are frozen — no gradient is asked for them, none is downloaded, and the
// device's gradient allocation holds only the adapters (a small fraction of the weights'); the A
// gradients are not trivially zero (the golden's B starts non-zero).
TEST(RunnerLoraTest, OnlyAdaptersHaveGradients) {
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create("llama_lora");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const Step s = RunGoldenStep(**f);
  for (const auto& [name, g] : s.grads.tensors) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name << " should be frozen";
    double norm = 0;
    for (float v : g) norm += double(v) * double(v);
    EXPECT_GT(norm, 0) << name;
  }
  size_t weights = 0, grads = 0;
  for (const ArenaRecord& r : (*f)->device->arena_log()) {
    if (r.requester == "params.weights") weights = r.bytes;
    if (r.requester == "params.grads") grads = r.bytes;
    // The frozen LM head gets no dW: no (vocab x hidden) sink for one.
    EXPECT_EQ(r.requester.find("sink"), std::string::npos) << r.requester;
  }
  ASSERT_GT(weights, 0u);
  EXPECT_LT(grads * 4, weights);
}

class RunnerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create({});
    ASSERT_TRUE(d.ok());
    device_ = std::move(*d);
    config_ = TinyLlamaPreset();
    options_.shape = {2, 8};
  }
  std::string CreateError() {
    Result<std::unique_ptr<ModelRunner>> r =
        CreateReferenceRunner(*device_, config_, lora_, options_);
    return r.ok() ? "" : r.status().ToString();
  }
  std::unique_ptr<CpuDevice> device_;
  ModelConfig config_;
  LoraConfig lora_;
  ReferenceRunnerOptions options_;
};

TEST_F(RunnerConfigTest, BadConfigsGetClearErrors) {
  EXPECT_EQ(CreateError(), "");
  options_.compute_dtype = DType::kF16;  // bf16 runs (model_runner_bf16_test.cc); f16 not yet
  EXPECT_NE(CreateError().find("f32 or bf16"), std::string::npos) << CreateError();
  options_.compute_dtype = DType::kF32;
  options_.recompute = {true};
  EXPECT_NE(CreateError().find("one per decoder block"), std::string::npos) << CreateError();
  options_.recompute.clear();
  options_.shape = {0, 8};
  EXPECT_NE(CreateError().find("at least 1 x 1"), std::string::npos) << CreateError();
  options_.shape = {2, 8};
  config_.num_kv_heads = config_.num_heads + 1;
  EXPECT_NE(CreateError().find("num_key_value_heads"), std::string::npos) << CreateError();
}

TEST_F(RunnerConfigTest, ArenaTooSmallNamesTheBuffer) {
  CpuDeviceOptions small;
  small.memory_bytes = 64 << 10;
  Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(small);
  ASSERT_TRUE(d.ok());
  Result<std::unique_ptr<ModelRunner>> r = CreateReferenceRunner(**d, config_, lora_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(r.status().ToString().find("params.weights"), std::string::npos)
      << r.status().ToString();
}

TEST_F(RunnerConfigTest, BadBatchesGetClearErrors) {
  Result<std::unique_ptr<ModelRunner>> r =
      CreateReferenceRunner(*device_, config_, lora_, options_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int32_t> tokens(16, 1), targets(16, 2);
  HostTensors grads;
  Result<double> before = (*r)->AccumulateGradients({tokens, targets, 16}, grads);
  ASSERT_FALSE(before.ok());
  EXPECT_NE(before.status().ToString().find("UploadWeights"), std::string::npos)
      << before.status().ToString();
  tokens.resize(15);
  EXPECT_FALSE((*r)->Logits(tokens).ok());
}

// The saved-activation buffers are what the planner's memory model (ComputeLayerCost) says, in f32
// and in bf16 (bf16 activations, fp32 statistics), up to the carver's alignment padding: less
// than kAlignment bytes per tensor, and a block saves at most 22 tensors (Qwen3 with LoRA on every
// projection group), the head 4. (The slack also hides a miscounted (N) statistic of these tiny
// goldens; the lower bound is the strict part.)
TEST_P(RunnerGoldenTest, SavedBuffersMatchTheMemoryModel) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ReferenceRunnerOptions o;
    o.compute_dtype = dtype;
    Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create(GetParam(), o);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const RunnerFixture& fx = **f;
    const BatchShape shape{fx.golden.info["batch"].get<int64_t>(),
                           fx.golden.info["seq_len"].get<int64_t>()};
    std::map<std::string, size_t> bytes;
    for (const ArenaRecord& r : fx.device->arena_log()) bytes[r.requester] = r.bytes;
    for (const LayerSpec& l : fx.layers) {
      if (l.kind == LayerKind::kEmbedding) continue;
      const LayerCost cost = ComputeLayerCost(fx.golden.config, fx.lora, l, shape, dtype);
      const std::string buffer =
          l.kind == LayerKind::kHead ? "head.saved" : "blocks.saved." + std::to_string(l.block);
      ASSERT_EQ(bytes.count(buffer), 1u) << buffer;
      EXPECT_GE(bytes[buffer], cost.saved_bytes) << buffer;
      const size_t tensors = l.kind == LayerKind::kHead ? 4 : 22;
      EXPECT_LT(bytes[buffer], cost.saved_bytes + tensors * TensorCarver::kAlignment) << buffer;
    }
  }
}

}  // namespace
}  // namespace ferry
