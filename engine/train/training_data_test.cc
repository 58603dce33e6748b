#include "engine/train/training_data.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

// Whole updates, rounded up, at least one; a product that lands on a whole number of updates
// through a rounding error (2.2 x 45 / 3 = 33.00000000000001 in doubles) is that number, not one
// more.
TEST(TrainingDataTest, StepsForEpochsRoundsUpToWholeUpdates) {
  EXPECT_EQ(StepsForEpochs(2, 64, 16), 8);
  EXPECT_EQ(StepsForEpochs(1, 10, 4), 3);
  EXPECT_EQ(StepsForEpochs(2.5, 10, 4), 7);
  EXPECT_EQ(StepsForEpochs(2.2, 45, 3), 33);
  EXPECT_EQ(StepsForEpochs(2.2, 25, 1), 55);
  EXPECT_EQ(StepsForEpochs(0.7, 30, 3), 7);
  EXPECT_EQ(StepsForEpochs(0.01, 10, 16), 1);
  EXPECT_EQ(StepsForEpochs(3, 1000003, 7), 428573);
}

}  // namespace
}  // namespace ferry
