// Checks the goldens' own layout and conventions, so that a mismatch in a layer test can only mean
// ferry is wrong: the recorded loss is the mean cross-entropy of the recorded logits over the
// unmasked targets, and the gradient files hold exactly ferry's trainable parameters.
#include "engine/testing/golden_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/model/param_spec.h"

namespace ferry::testing {
namespace {

class GoldenModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenModelTest, LossIsMeanCrossEntropyOfUnmaskedTargets) {
  Result<GoldenModel> g = GoldenModel::Load(GetParam());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const int64_t B = g->info["batch"], T = g->info["seq_len"], V = g->config.vocab_size;
  Result<std::vector<float>> logits = g->io.ReadFloats("logits");
  Result<std::vector<int64_t>> targets = g->io.ReadInts("targets");
  ASSERT_TRUE(logits.ok() && targets.ok());
  ASSERT_EQ(logits->size(), size_t(B * T * V));
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t y = (*targets)[size_t(i)];
    if (y == -100) continue;
    ASSERT_TRUE(y >= 0 && y < V);
    const float* row = &(*logits)[size_t(i * V)];
    double mx = row[0], z = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - double(row[y]);
    ++count;
  }
  EXPECT_EQ(count, g->info["valid_targets"].get<int64_t>());
  // PyTorch computed the loss in fp32 from the same fp32 logits: log-sum-exp over V = 97 terms
  // and a mean over 17 loses a few ulps; 1e-6 relative is about 8 fp32 ulps.
  const double want = g->info["loss"].get<double>();
  EXPECT_NEAR(sum / double(count), want, 1e-6 * want);
}

TEST_P(GoldenModelTest, GradientsCoverExactlyTheTrainableParameters) {
  Result<GoldenModel> g = GoldenModel::Load(GetParam());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  LoraConfig lora;
  if (g->info.contains("lora")) {
    lora = {.rank = g->info["lora"]["r"], .alpha = g->info["lora"]["alpha"], .targets = kLoraAll};
  }
  std::set<std::string> trainable, in_file;
  for (const LayerSpec& l : BuildLayerSpecs(g->config, lora)) {
    for (const ParamSpec& p : l.params) {
      if (!p.trainable || !p.tied_to.empty()) continue;
      trainable.insert(p.name);
      const SafetensorsTensorInfo* grad = g->grads.Find(p.name);
      ASSERT_NE(grad, nullptr) << p.name;
      EXPECT_EQ(grad->shape, p.shape) << p.name;
      ASSERT_NE(g->final_weights.Find(p.name), nullptr) << p.name;
      // Initial values: the base checkpoint, or PEFT's adapter file for LoRA matrices.
      const SafetensorsFile& init = p.lora ? g->adapter : g->weights;
      ASSERT_NE(init.Find(p.name), nullptr) << p.name;
    }
  }
  for (const SafetensorsTensorInfo& t : g->grads.tensors()) in_file.insert(t.name);
  EXPECT_EQ(in_file, trainable);
}

INSTANTIATE_TEST_SUITE_P(AllGoldens, GoldenModelTest,
                         ::testing::Values("llama", "qwen3", "gpt2", "llama_lora", "llama3_rope",
                                           "mistral_window", "qwen2", "llama_qlora"));

}  // namespace
}  // namespace ferry::testing
