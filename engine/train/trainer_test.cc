// The Trainer's own logic against a fake ModelRunner whose model is a linear least-squares fit with
// analytic gradients: accumulation, clipping, schedule, decay flags, frozen parameters and uploads
// are checked independently of the real layers.
#include "engine/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/model/master_weights.h"

namespace ferry {
namespace {

constexpr int64_t kOut = 4, kIn = 3;

// pred(t) = W x(t) + b + f, loss = sum over non-masked targets of 0.5 |pred - y(target)|^2 / N.
// "alias.weight" is tied to W (no storage); "frozen.weight" (f) is not trainable.
std::vector<LayerSpec> FakeLayers() {
  LayerSpec l{LayerKind::kBlock, 0, "block.0", {}};
  l.params.push_back({"lin.weight", {kOut, kIn}, DType::kF32, true, true, "", false, false});
  l.params.push_back({"lin.bias", {kOut}, DType::kF32, true, false, "", false, false});
  l.params.push_back({"frozen.weight", {kOut}, DType::kF32, false, false, "", false, false});
  l.params.push_back({"alias.weight", {kOut, kIn}, DType::kF32, true, true, "lin.weight"});
  return {l};
}

double Feature(int32_t token, int64_t j) { return std::cos(0.7 * token * double(j + 1)); }
double Label(int32_t target, int64_t k) { return std::sin(0.3 * target * double(k + 1)); }

// Loss and gradients (+=) of one micro-batch in double.
double FakeLossAndGrads(const std::map<std::string, std::vector<float>>& w,
                        std::span<const int32_t> tokens, std::span<const int32_t> targets,
                        double normalizer, std::vector<double>* gw, std::vector<double>* gb) {
  double loss = 0;
  for (size_t n = 0; n < tokens.size(); ++n) {
    if (targets[n] == kIgnoreTarget) continue;
    for (int64_t k = 0; k < kOut; ++k) {
      double pred = w.at("lin.bias")[size_t(k)] + w.at("frozen.weight")[size_t(k)];
      for (int64_t j = 0; j < kIn; ++j) {
        pred += w.at("lin.weight")[size_t(k * kIn + j)] * Feature(tokens[n], j);
      }
      const double r = pred - Label(targets[n], k);
      loss += 0.5 * r * r / normalizer;
      (*gb)[size_t(k)] += r / normalizer;
      for (int64_t j = 0; j < kIn; ++j) {
        (*gw)[size_t(k * kIn + j)] += r * Feature(tokens[n], j) / normalizer;
      }
    }
  }
  return loss;
}

class FakeRunner final : public ModelRunner {
 public:
  Status UploadWeights(const HostTensors& weights) override {
    uploaded_ = weights;
    ++uploads_;
    return Status::Ok();
  }
  Result<double> AccumulateGradients(const MicroBatchInput& mb, HostTensors& grads) override {
    if (grads.tensors.count("frozen.weight") != 0 || grads.tensors.count("alias.weight") != 0) {
      return Status::Internal("gradient buffer for a frozen or tied parameter");
    }
    if (mb.overwrite_grads) {
      for (auto& [name, g] : grads.tensors) std::fill(g.begin(), g.end(), 0.0f);
    }
    std::vector<double> gw(kOut * kIn), gb(kOut);
    const double loss =
        FakeLossAndGrads(uploaded_.tensors, mb.tokens, mb.targets, mb.normalizer, &gw, &gb);
    for (size_t i = 0; i < gw.size(); ++i) grads.at("lin.weight")[i] += float(gw[i]);
    for (size_t i = 0; i < gb.size(); ++i) grads.at("lin.bias")[i] += float(gb[i]);
    return loss;
  }
  Result<std::vector<float>> Logits(std::span<const int32_t>) override {
    return Status::Unavailable("fake runner");
  }
  RunnerStats stats() const override { return {}; }

  HostTensors uploaded_;
  int uploads_ = 0;
};

MicroBatch Rows(int64_t first_row, int64_t rows, int64_t step) {
  constexpr int64_t kT = 5;
  MicroBatch mb{rows, kT, {}, {}, 0};
  for (int64_t r = first_row; r < first_row + rows; ++r) {
    for (int64_t t = 0; t < kT; ++t) {
      mb.tokens.push_back(int32_t((r * 7 + t * 3 + step * 11) % 23));
      const bool masked = (r + t + step) % 4 == 0;
      mb.targets.push_back(masked ? kIgnoreTarget : int32_t((r * 5 + t + step) % 19));
      mb.valid_targets += masked ? 0 : 1;
    }
  }
  return mb;
}

OptimizerOptions Options(double clip) {
  return {.schedule = {.lr = 0.05, .warmup_steps = 2, .total_steps = 6, .min_ratio = 0.1},
          .beta1 = 0.9,
          .beta2 = 0.95,
          .eps = 1e-8,
          .weight_decay = 0.1,
          .grad_clip = clip};
}

std::unique_ptr<Trainer> MakeTrainer(FakeRunner* runner, const OptimizerOptions& o) {
  Result<std::unique_ptr<Trainer>> t =
      Trainer::Create(runner, FakeLayers(), InitMasterWeights(FakeLayers(), 7), o, nullptr);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(TrainerTest, AccumulationEqualsOneBigBatch) {
  FakeRunner r1, r2;
  std::unique_ptr<Trainer> one = MakeTrainer(&r1, Options(1.0));
  std::unique_ptr<Trainer> two = MakeTrainer(&r2, Options(1.0));
  ASSERT_TRUE(one && two);
  for (int64_t k = 0; k < 4; ++k) {
    const std::vector<MicroBatch> big = {Rows(0, 4, k)};
    const std::vector<MicroBatch> split = {Rows(0, 1, k), Rows(1, 3, k)};
    Result<StepStats> a = one->Step(big), b = two->Step(split);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->valid_targets, b->valid_targets);
    // Before the first update the losses are the same double terms regrouped (~1e-15 relative);
    // afterwards the weights differ by a few fp32 ulps (below), and so do the losses.
    EXPECT_NEAR(a->loss, b->loss, (k == 0 ? 1e-12 : 16 * DTypeEpsilon(DType::kF32)) * a->loss);
    // The fp32 gradient buffers sum the same terms in a different grouping (one extra fp32 rounding
    // per element), so the norms agree to a few fp32 ulps.
    EXPECT_NEAR(a->grad_norm, b->grad_norm, 4 * DTypeEpsilon(DType::kF32) * a->grad_norm);
  }
  for (const auto& [name, w] : one->weights().tensors) {
    const std::vector<float>& v = two->weights().tensors.at(name);
    for (size_t i = 0; i < w.size(); ++i) {
      // An ulp of gradient difference moves Adam's m/sqrt(v) by ~2^-23 relative, i.e. the update by
      // ~lr * 2^-23; 4 updates with margin: 16 ulps of (|w| + lr).
      EXPECT_NEAR(w[i], v[i], 16 * DTypeEpsilon(DType::kF32) * (std::abs(w[i]) + 0.05))
          << name << "[" << i << "]";
    }
  }
}

// The whole update against plain double AdamW written out here: schedule, clipping, bias
// correction, decay only on lin.weight, nothing for the frozen parameter.
TEST(TrainerTest, MatchesReferenceAdamWWithClippingAndSchedule) {
  FakeRunner runner;
  const OptimizerOptions o = Options(0.05);  // small enough that every update is clipped
  std::unique_ptr<Trainer> t = MakeTrainer(&runner, o);
  ASSERT_TRUE(t);
  std::map<std::string, std::vector<float>> ref = InitMasterWeights(FakeLayers(), 7).tensors;
  std::map<std::string, std::vector<double>> m, v;
  for (const char* n : {"lin.weight", "lin.bias"}) {
    m[n].assign(ref[n].size(), 0.0);
    v[n].assign(ref[n].size(), 0.0);
  }
  for (int64_t k = 0; k < o.schedule.total_steps; ++k) {
    const std::vector<MicroBatch> batch = {Rows(0, 2, k), Rows(2, 2, k)};
    const double n = double(batch[0].valid_targets + batch[1].valid_targets);
    std::map<std::string, std::vector<double>> g = {{"lin.weight", std::vector<double>(12)},
                                                    {"lin.bias", std::vector<double>(4)}};
    double loss = 0;
    for (const MicroBatch& mb : batch) {
      loss += FakeLossAndGrads(ref, mb.tokens, mb.targets, n, &g["lin.weight"], &g["lin.bias"]);
    }
    double sq = 0;
    for (auto& [name, gv] : g) {
      for (double x : gv) sq += x * x;
    }
    const double norm = std::sqrt(sq);
    const double coef = std::min(1.0, o.grad_clip / (norm + 1e-6));
    const double lr = o.schedule.At(k);
    Result<StepStats> s = t->Step(batch);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->step, k);
    EXPECT_DOUBLE_EQ(s->lr, lr);
    EXPECT_LT(s->clip_coef, 1.0);
    // The trainer's gradients are fp32 sums: norms agree to a few fp32 ulps.
    EXPECT_NEAR(s->grad_norm, norm, 8 * DTypeEpsilon(DType::kF32) * norm);
    EXPECT_NEAR(s->clip_coef, coef, 8 * DTypeEpsilon(DType::kF32) * coef);
    EXPECT_NEAR(s->loss, loss, 8 * DTypeEpsilon(DType::kF32) * loss);
    for (auto& [name, p] : ref) {
      if (name == "frozen.weight") continue;
      const double wd = name == "lin.weight" ? o.weight_decay : 0.0;
      for (size_t i = 0; i < p.size(); ++i) {
        const double gi = g[name][i] * coef;
        m[name][i] = o.beta1 * m[name][i] + (1 - o.beta1) * gi;
        v[name][i] = o.beta2 * v[name][i] + (1 - o.beta2) * gi * gi;
        const double mh = m[name][i] / (1 - std::pow(o.beta1, double(k + 1)));
        const double vh = v[name][i] / (1 - std::pow(o.beta2, double(k + 1)));
        p[i] = float(double(p[i]) * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + o.eps));
      }
    }
    for (auto& [name, p] : ref) {
      const std::vector<float>& got = t->weights().tensors.at(name);
      for (size_t i = 0; i < p.size(); ++i) {
        // fp32 AdamW vs double: each update's step is lr * O(1) computed in fp32 (a few ulps of lr)
        // and the weights carry fp32 rounding (an ulp of |p|); the clipped gradients feed m/sqrt(v)
        // with fp32 error ~1e-6 relative, scaled by lr per update. 1e-5 * (|p| + lr) per update
        // bounds it with margin over 6 updates.
        ASSERT_NEAR(got[i], p[i], 1e-5 * double(k + 1) * (std::abs(p[i]) + lr))
            << name << "[" << i << "] after update " << k;
      }
    }
    // The runner computes with exactly the master copy after every update.
    EXPECT_EQ(runner.uploaded_.tensors, t->weights().tensors);
  }
  EXPECT_EQ(runner.uploads_, 1 + int(o.schedule.total_steps));
}

TEST(TrainerTest, ZeroGradientDecaysMatricesOnlyAndFrozenStaysPut) {
  FakeRunner runner;
  OptimizerOptions o = Options(0.0);
  o.schedule.warmup_steps = 0;
  std::unique_ptr<Trainer> t = MakeTrainer(&runner, o);
  ASSERT_TRUE(t);
  const HostTensors before = t->weights();
  // A runner whose gradients are all zero isolates the weight decay.
  class ZeroRunner final : public ModelRunner {
   public:
    Status UploadWeights(const HostTensors&) override { return Status::Ok(); }
    Result<double> AccumulateGradients(const MicroBatchInput&, HostTensors&) override {
      return 0.0;
    }
    Result<std::vector<float>> Logits(std::span<const int32_t>) override {
      return Status::Unavailable("fake runner");
    }
    RunnerStats stats() const override { return {}; }
  } zero;
  Result<std::unique_ptr<Trainer>> z = Trainer::Create(&zero, FakeLayers(), before, o, nullptr);
  ASSERT_TRUE(z.ok());
  ASSERT_TRUE((*z)->Step(std::vector<MicroBatch>{Rows(0, 2, 0)}).ok());
  // g = 0: Adam's step is 0 / (0 + eps) = 0, leaving the decoupled decay p *= (1 - lr * wd) on
  // decaying parameters only (one fp32 multiply: within an ulp).
  const double shrink = 1 - o.schedule.At(0) * o.weight_decay;
  const HostTensors& after = (*z)->weights();
  for (size_t i = 0; i < before.tensors.at("lin.weight").size(); ++i) {
    const double w = before.tensors.at("lin.weight")[i];
    EXPECT_NEAR(after.tensors.at("lin.weight")[i], w * shrink,
                DTypeEpsilon(DType::kF32) * std::abs(w));
  }
  EXPECT_EQ(after.tensors.at("lin.bias"), before.tensors.at("lin.bias"));
  EXPECT_EQ(after.tensors.at("frozen.weight"), before.tensors.at("frozen.weight"));
  // A real update moves the trainable bias but never the frozen parameter, which has no state.
  ASSERT_TRUE(t->Step(std::vector<MicroBatch>{Rows(0, 2, 0)}).ok());
  EXPECT_NE(t->weights().tensors.at("lin.bias"), before.tensors.at("lin.bias"));
  EXPECT_EQ(t->weights().tensors.at("frozen.weight"), before.tensors.at("frozen.weight"));
  EXPECT_FALSE(t->has_optimizer_state("frozen.weight"));
  EXPECT_FALSE(t->has_optimizer_state("alias.weight"));
  EXPECT_TRUE(t->has_optimizer_state("lin.bias"));
  EXPECT_EQ(t->optimizer_state_bytes(), size_t(2 * (kOut * kIn + kOut) * sizeof(float)));
}

TEST(TrainerTest, AllMaskedBatchAndBadOptionsAreErrors) {
  FakeRunner runner;
  std::unique_ptr<Trainer> t = MakeTrainer(&runner, Options(1.0));
  ASSERT_TRUE(t);
  MicroBatch mb = Rows(0, 1, 0);
  std::fill(mb.targets.begin(), mb.targets.end(), kIgnoreTarget);
  mb.valid_targets = 0;
  EXPECT_EQ(t->Step(std::vector<MicroBatch>{mb}).status().code(), StatusCode::kInvalidArgument);
  OptimizerOptions bad = Options(1.0);
  bad.beta1 = 1.5;
  EXPECT_FALSE(
      Trainer::Create(&runner, FakeLayers(), InitMasterWeights(FakeLayers(), 7), bad, nullptr)
          .ok());
  bad = Options(-1.0);
  EXPECT_FALSE(
      Trainer::Create(&runner, FakeLayers(), InitMasterWeights(FakeLayers(), 7), bad, nullptr)
          .ok());
}

}  // namespace
}  // namespace ferry
