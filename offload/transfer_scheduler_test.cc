#include "offload/transfer_scheduler.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry {
namespace {

TEST(PriorityQueues, ServesTheMostUrgentFirst) {
  PriorityQueues<int> q(100);
  q.Push(TransferPriority::kSpill, 3);
  q.Push(TransferPriority::kNextWeights, 1);
  q.Push(TransferPriority::kActivationNow, 0);
  q.Push(TransferPriority::kGradientOut, 2);
  std::vector<int> order;
  for (int p; (p = q.Pick()) >= 0;) {
    order.push_back(q.Front(p));
    q.PopFront(p);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(q.empty());
}

TEST(PriorityQueues, LowerQueuesAreNotStarved) {
  constexpr int kQuota = 4;
  PriorityQueues<int> q(kQuota);
  for (int i = 0; i < 1000; ++i) q.Push(TransferPriority::kActivationNow, 0);
  for (int i = 0; i < 10; ++i) q.Push(TransferPriority::kNextWeights, 1);
  for (int i = 0; i < 10; ++i) q.Push(TransferPriority::kSpill, 3);
  // While urgent work never runs out, every other non-empty queue is still served at least once
  // every quota + number-of-queues picks.
  int since[kNumTransferPriorities] = {};
  int served[kNumTransferPriorities] = {};
  int served_urgent_early = 0;
  for (int pick = 0; pick < 200; ++pick) {
    const int p = q.Pick();
    ASSERT_GE(p, 0);
    ++served[p];
    if (p == 0 && pick < 100) ++served_urgent_early;
    q.PopFront(p);
    for (int k = 1; k < kNumTransferPriorities; ++k) {
      since[k] = k == p ? 0 : since[k] + 1;
    }
    for (int k : {1, 3}) {
      if (served[k] < 10) {  // still waiting with items
        EXPECT_LE(since[k], kQuota + kNumTransferPriorities) << "queue " << k << " at pick " << pick;
      }
    }
  }
  EXPECT_EQ(served[3], 10);
  EXPECT_EQ(served[1], 10);
  // And urgent work still got most of the picks while the others were waiting.
  EXPECT_GE(served_urgent_early, 100 - 2 * (100 / kQuota));
}

}  // namespace
}  // namespace ferry
