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

}  // namespace
}  // namespace ferry
