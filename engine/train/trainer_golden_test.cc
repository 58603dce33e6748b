// The whole training path — the reference runner's forward/backward on a CpuDevice, the Trainer's
// accumulation, clipping, schedule and AdamW — against five torch.optim.AdamW steps of
// transformers/PEFT models (tests/goldens/<model>/: golden.json's per-step losses, and
// final.safetensors, the trainable parameters after the fifth update).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/testing/runner_fixture.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

// Element i of `p` is a key-projection bias (Llama/Qwen k_proj.bias, or the middle third of GPT-2's
// fused c_attn.bias).
bool IsKeyBias(const ModelConfig& c, const ParamSpec& p, size_t i) {
  if (p.name.ends_with("k_proj.bias")) return true;
  return p.name.ends_with("attn.c_attn.bias") && int64_t(i) >= c.q_dim() &&
         int64_t(i) < c.q_dim() + c.kv_dim();
}

class TrainerGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainerGoldenTest, FiveStepsMatchTorch) {
  auto f = testing::RunnerFixture::Create(GetParam());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  testing::RunnerFixture& fx = **f;
  const nlohmann::json& opt = fx.golden.info["optimizer"];
  OptimizerOptions o;
  o.schedule = {opt["lr"], opt["warmup_steps"], opt["total_steps"], opt["min_lr_ratio"]};
  o.beta1 = opt["betas"][0];
  o.beta2 = opt["betas"][1];
  o.eps = opt["eps"];
  o.weight_decay = opt["weight_decay"];
  o.grad_clip = opt["max_grad_norm"];
  ThreadPool pool(2);
  auto t = Trainer::Create(fx.runner.get(), fx.layers, fx.weights, o, &pool);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const int64_t batch = fx.golden.info["batch"], seq_len = fx.golden.info["seq_len"];
  const std::vector<MicroBatch> mb = {
      {batch, seq_len, fx.tokens, fx.targets, fx.golden.info["valid_targets"].get<int64_t>()}};
  for (int64_t k = 0; k < o.schedule.total_steps; ++k) {
    Result<StepStats> s = (*t)->Step(mb);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const nlohmann::json& want = fx.golden.info["steps"][size_t(k)];
    EXPECT_DOUBLE_EQ(s->lr, want["lr"].get<double>());
    // Loss: the first step is the runner's fp32 forward against torch's (2e-6 relative, as in
    // model_runner_test); each update then carries the fp32 gradient differences (1e-3 relative at
    // worst, on tiny gradients) into the weights at lr * O(1e-3), which moves a loss of O(1) by
    // ~1e-4 relative after five updates.
    const double wl = want["loss"];
    EXPECT_NEAR(s->loss, wl, (k == 0 ? 2e-6 : 2e-4) * wl) << "loss of step " << k;
    EXPECT_NEAR(s->grad_norm, want["grad_norm"].get<double>(),
                (k == 0 ? 1e-5 : 1e-3) * want["grad_norm"].get<double>())
        << "grad norm of step " << k;
  }
  double worst = 0;
  std::string worst_name;
  for (const LayerSpec& l : fx.layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.trainable || !p.tied_to.empty()) continue;
      std::vector<float> want(size_t(p.numel()));
      ASSERT_TRUE(LoadParameter(fx.golden.final_weights, p, want).ok()) << p.name;
      const std::vector<float>& got = (*t)->weights().tensors.at(p.name);
      const std::vector<float>& init = fx.weights.tensors.at(p.name);
      Result<std::vector<float>> first_grad = fx.GoldenGrad(p);
      ASSERT_TRUE(first_grad.ok()) << first_grad.status().ToString();
      for (size_t i = 0; i < want.size(); ++i) {
        // A first gradient within the two sides' fp32 noise (model_runner_test's gradient atol,
        // 16 eps ~ 1.9e-6) has no reliable sign, and Adam's first update is lr * sign(g): such an
        // element (mistral_window has one at 1.5e-8 of the 8192 in a layer's o_proj) is held to
        // the same bound as a key bias.
        const bool noisy_first_grad = std::abs((*first_grad)[i]) < 16 * DTypeEpsilon(DType::kF32);
        if (IsKeyBias(fx.golden.config, p, i) || noisy_first_grad) {
          // d loss / d (key bias) is exactly 0 (q . b_k is the same for every key, and softmax
          // ignores a constant), so both sides' gradients are rounding noise, which Adam normalizes
          // into O(lr) steps of arbitrary sign: only the bound holds (five updates of at most lr *
          // (1 + wd) each).
          ASSERT_LE(std::abs(got[i] - init[i]), 5 * 0.011) << p.name << "[" << i << "]";
          continue;
        }
        const double d = std::abs(double(got[i]) - double(want[i]));
        if (d > worst) worst = d, worst_name = p.name;
        // Each Adam update moves a weight by lr * m_hat / (sqrt(v_hat) + eps), which is O(lr) and
        // insensitive to the gradient's scale; the runner's gradients match torch's to 1e-3
        // relative (model_runner_test), so an update differs by ~1e-3 * lr, plus the drift of later
        // gradients computed at slightly different weights. Over five updates with lr <= 0.01 that
        // is ~5e-5; 2e-4 absolute (+ 1e-4 relative for the fp32 value) bounds it with margin while
        // a wrong update (an error of order lr = 1e-2) fails. Measured: llama 1.3e-6, qwen3 4.0e-6,
        // gpt2 6.8e-5, llama_lora 3.4e-7, llama3_rope 2.3e-6, mistral_window 6.5e-5, qwen2 7.2e-6,
        // llama_qlora 1.0e-6.
        ASSERT_NEAR(got[i], want[i], 2e-4 + 1e-4 * std::abs(want[i])) << p.name << "[" << i << "]";
      }
    }
  }
  std::printf("[ %s ] largest final-weight difference %.3g (%s)\n", GetParam(), worst,
              worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Goldens, TrainerGoldenTest,
                         ::testing::Values("llama", "qwen3", "gpt2", "llama_lora", "llama3_rope",
                                           "mistral_window", "qwen2", "llama_qlora"));

}  // namespace
}  // namespace ferry
