// Learning a task that only working attention can solve: each row is 8 random tokens followed by
// the same 8 tokens again, with the loss only on the second half's predictions. Without attention
// (or with a broken mask, RoPE or attention backward) the best possible loss is ln(V) per target
// (the next token is uniformly random given everything a position-wise model sees); with it, the
// second half is copied exactly. A few hundred updates of a 2-block model must get the loss far
// below ln(V).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/model/master_weights.h"
#include "engine/model/model_runner.h"
#include "engine/testing/reference_runner.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

constexpr int64_t kVocab = 16, kHalf = 8, kT = 2 * kHalf, kB = 16;

ModelConfig CopyModel() {
  ModelConfig c = TinyLlamaPreset();
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = kT;
  return c;
}

// Rows "x_0 .. x_7 x_0 .. x_7"; targets are the next token, masked except where the next token is a
// copy that an earlier position determines (positions 8 .. 14 predict x_1 .. x_7).
MicroBatch CopyBatch(std::mt19937_64& rng) {
  MicroBatch mb{kB, kT, {}, {}, 0};
  std::uniform_int_distribution<int32_t> tok(0, int32_t(kVocab - 1));
  for (int64_t r = 0; r < kB; ++r) {
    int32_t x[kHalf];
    for (int32_t& v : x) v = tok(rng);
    for (int64_t t = 0; t < kT; ++t) mb.tokens.push_back(x[t % kHalf]);
    for (int64_t t = 0; t < kT; ++t) {
      const bool scored = t >= kHalf && t + 1 < kT;
      mb.targets.push_back(scored ? x[(t + 1) % kHalf] : kIgnoreTarget);
      mb.valid_targets += scored ? 1 : 0;
    }
  }
  return mb;
}

TEST(CopyTaskTest, AttentionLearnsToCopy) {
  const ModelConfig model = CopyModel();
  ASSERT_TRUE(ValidateModelConfig(model).ok());
  auto dev =
      CpuDevice::Create({.name = "cpu0", .memory_bytes = size_t(32) << 20, .compute_threads = 2});
  ASSERT_TRUE(dev.ok());
  ReferenceRunnerOptions ro;
  ro.shape = {kB, kT};
  auto runner = CreateReferenceRunner(**dev, model, {}, ro);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, {});
  OptimizerOptions o;
  o.schedule = {.lr = 1e-2, .warmup_steps = 20, .total_steps = 400, .min_ratio = 0.1};
  o.weight_decay = 0.0;
  o.grad_clip = 1.0;
  auto trainer = Trainer::Create(runner->get(), layers, InitMasterWeights(layers, 11), o, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  std::mt19937_64 rng(5);
  const double chance = std::log(double(kVocab));  // 2.77
  double first = 0, loss = 0;
  int64_t k = 0;
  // Learned when the loss is a tenth of chance: the copies are then predicted with ~0.76
  // probability on average, impossible without attending to the first half.
  for (; k < o.schedule.total_steps; ++k) {
    auto s = (*trainer)->Step(std::vector<MicroBatch>{CopyBatch(rng)});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    if (k == 0) first = s->loss;
    loss = s->loss;
    if (loss < 0.1 * chance) break;
  }
  std::printf("[ copy ] loss %.3f -> %.3f after %lld updates (chance %.3f)\n", first, loss,
              (long long)k + 1, chance);
  EXPECT_GT(first, 0.8 * chance);  // fresh weights are near chance
  EXPECT_LT(loss, 0.1 * chance) << "not learned in " << o.schedule.total_steps << " updates";
}

}  // namespace
}  // namespace ferry
