#include "engine/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/testing/golden_files.h"

namespace ferry {
namespace {

TEST(LrScheduleTest, MatchesGoldenSchedule) {
  for (const char *model : {"llama", "qwen3", "gpt2", "llama_lora"}) {
    nlohmann::json g = testing::GoldenJson(model);
    ASSERT_FALSE(g.is_discarded()) << model;
    const nlohmann::json &opt = g["optimizer"];
    LrSchedule s{opt["lr"], opt["warmup_steps"], opt["total_steps"], opt["min_lr_ratio"]};
    ASSERT_EQ(g["steps"].size(), size_t(s.total_steps));
    for (const auto &step : g["steps"]) {
      // The golden stores PyTorch's double lr rounded to 9 significant digits.
      const double want = step["lr"].get<double>();
      EXPECT_NEAR(s.At(step["step"].get<int64_t>()), want, 1e-8 * std::abs(want) + 1e-15)
          << model << " step " << step["step"];
    }
  }
}

TEST(LrScheduleTest, ShapeByHand) {
  LrSchedule s{.lr = 1.0, .warmup_steps = 4, .total_steps = 14, .min_ratio = 0.1};
  EXPECT_DOUBLE_EQ(s.At(0), 0.25);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(4), 1.0);              // p = 0
  EXPECT_DOUBLE_EQ(s.At(9), 0.1 + 0.9 * 0.5);  // p = 1/2
  EXPECT_GT(s.At(13), 0.1);                    // the last update keeps a rate above the floor
  LrSchedule none{.lr = 2.0, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(none.At(0), 2.0);
}

// Linear and constant decays: by hand, and linear down to 0 against transformers'
// get_linear_schedule_with_warmup after the warm-up ((T - k) / (T - w)).
TEST(LrScheduleTest, LinearAndConstantByHand) {
  LrSchedule linear{
      .lr = 1.0, .warmup_steps = 4, .total_steps = 14, .min_ratio = 0.1, .decay = LrDecay::kLinear};
  EXPECT_DOUBLE_EQ(linear.At(0), 0.25);
  EXPECT_DOUBLE_EQ(linear.At(4), 1.0);              // p = 0
  EXPECT_DOUBLE_EQ(linear.At(9), 0.1 + 0.9 * 0.5);  // p = 1/2
  EXPECT_DOUBLE_EQ(linear.At(13), 0.1 + 0.9 * 0.1);
  LrSchedule to_zero{
      .lr = 2.0, .warmup_steps = 3, .total_steps = 10, .min_ratio = 0, .decay = LrDecay::kLinear};
  for (int64_t k = 3; k < 10; ++k) {
    EXPECT_NEAR(to_zero.At(k), 2.0 * double(10 - k) / double(10 - 3), 1e-15) << k;
  }
  LrSchedule constant{.lr = 0.5,
                      .warmup_steps = 2,
                      .total_steps = 10,
                      .min_ratio = 0.1,
                      .decay = LrDecay::kConstant};
  EXPECT_DOUBLE_EQ(constant.At(0), 0.25);
  for (int64_t k = 1; k < 10; ++k) EXPECT_DOUBLE_EQ(constant.At(k), 0.5) << k;
  // The default is the cosine the goldens check.
  EXPECT_EQ(LrSchedule{}.decay, LrDecay::kCosine);
}

TEST(LrScheduleTest, DecayNamesRoundTrip) {
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    Result<LrDecay> back = ParseLrDecay(LrDecayName(d));
    ASSERT_TRUE(back.ok()) << LrDecayName(d);
    EXPECT_EQ(*back, d);
  }
  Result<LrDecay> bad = ParseLrDecay("step");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'step'"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace ferry
