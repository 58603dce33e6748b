// LossScaler against a reference sequence written out by hand from torch.amp.GradScaler's rules
// (growth x2 after `growth_interval` consecutive finite steps, x0.5 and a restart on overflow),
// not computed by the code under test.
#include "engine/train/loss_scaler.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <vector>

namespace ferry {
namespace {

struct Expected {
  bool finite;      // this step's gradients
  bool applied;     // Update's answer
  double scale;     // after the step
  int64_t tracker;  // after the step
  int64_t skipped;  // after the step
};

// Initial scale 8, growth interval 3.
TEST(LossScalerTest, FollowsGradScalerOverAMixedPattern) {
  LossScaler s({.enabled = true, .initial_scale = 8, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 8);
  const std::vector<Expected> want = {
      {true, true, 8, 1, 0},   {true, true, 8, 2, 0},   {true, true, 16, 0, 0},  // grows
      {true, true, 16, 1, 0},  {false, false, 8, 0, 1},                          // backoff
      {false, false, 4, 0, 2}, {true, true, 4, 1, 2},   {true, true, 4, 2, 2},
      {false, false, 2, 0, 3},  // a skip one step short of growing restarts the count
      {true, true, 2, 1, 3},   {true, true, 2, 2, 3},   {true, true, 4, 0, 3},
      {true, true, 4, 1, 3},   {true, true, 4, 2, 3},   {true, true, 8, 0, 3},
  };
  for (size_t i = 0; i < want.size(); ++i) {
    const Expected& e = want[i];
    EXPECT_EQ(s.Update(e.finite), e.applied) << "step " << i;
    EXPECT_EQ(s.scale(), e.scale) << "step " << i;
    EXPECT_EQ(s.state().growth_tracker, e.tracker) << "step " << i;
    EXPECT_EQ(s.state().skipped_steps, e.skipped) << "step " << i;
  }
}

// Defaults are GradScaler's: 2^16, doubling after 2000 finite steps.
TEST(LossScalerTest, DefaultsAreGradScalers) {
  LossScaler s(LossScalerOptions{.enabled = true});
  EXPECT_EQ(s.scale(), 65536);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 65536);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 131072);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

// torch keeps the old scale when growing would overflow fp32 (2^127 * 2 = 2^128 > FLT_MAX).
TEST(LossScalerTest, GrowthStopsBelowFp32Overflow) {
  LossScaler s({.enabled = true, .initial_scale = 0x1p100, .growth_interval = 1});
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 0x1p127);
  EXPECT_LE(s.scale(), double(FLT_MAX));
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 0x1p126);
}

// bf16 and f32 runs: scale 1, every step applied, nothing counted.
TEST(LossScalerTest, DisabledNeverSkipsNorScales) {
  LossScaler s({.enabled = false, .initial_scale = 1024, .growth_interval = 1});
  for (bool finite : {true, false, true, false}) EXPECT_TRUE(s.Update(finite));
  EXPECT_EQ(s.state(), LossScalerState{});
  EXPECT_FALSE(s.Restore({.scale = 2, .growth_tracker = 0, .skipped_steps = 0}).ok());
}

// A restored scaler continues exactly as the one it was saved from; bad states are refused.
TEST(LossScalerTest, RestoreContinuesAndRefusesBadStates) {
  const LossScalerOptions o{.enabled = true, .initial_scale = 8, .growth_interval = 3};
  LossScaler a(o), b(o);
  for (bool finite : {true, false, true, true}) a.Update(finite);
  ASSERT_TRUE(b.Restore(a.state()).ok());
  for (bool finite : {true, true, false, true}) {
    EXPECT_EQ(a.Update(finite), b.Update(finite));
    EXPECT_EQ(a.state(), b.state());
  }
  for (const LossScalerState& bad : {LossScalerState{.scale = 3}, LossScalerState{.scale = 0},
                                     LossScalerState{.scale = 4, .growth_tracker = -1},
                                     LossScalerState{.scale = 4, .skipped_steps = -2}}) {
    LossScaler c(o);
    EXPECT_FALSE(c.Restore(bad).ok()) << bad.scale;
    EXPECT_EQ(c.scale(), 8);  // unchanged
  }
}

TEST(LossScalerTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateLossScalerOptions({.enabled = true}).ok());
  for (double bad : {0.0, 0.5, 3.0, 1000.0, 0x1p101}) {
    const Status s = ValidateLossScalerOptions({.enabled = true, .initial_scale = bad});
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("power of two"), std::string::npos) << s.ToString();
  }
  const Status s = ValidateLossScalerOptions({.enabled = true, .growth_interval = 0});
  EXPECT_NE(s.message().find("growth interval"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ferry
