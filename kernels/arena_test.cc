#include "kernels/arena.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(Arena, AlignsCountsAndLogs) {
  Arena arena("dev", 4096, 256);
  auto a = arena.Allocate(1, "a");
  ASSERT_TRUE(a.ok());
  auto b = arena.Allocate(300, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->offset % 256, 0u);
  EXPECT_EQ(b->offset % 256, 0u);
  EXPECT_NE(a->offset, b->offset);
  EXPECT_EQ(arena.stats().in_use, 256u + 512u);
  arena.Free(a->handle);
  EXPECT_EQ(arena.stats().in_use, 512u);
  EXPECT_EQ(arena.stats().peak, 768u);
  auto log = arena.log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].requester, "a");
  EXPECT_EQ(log[0].bytes, 1u);
  EXPECT_EQ(log[0].reserved, 256u);
  EXPECT_FALSE(log[0].live);
  EXPECT_TRUE(log[1].live);
  arena.ResetPeak();
  EXPECT_EQ(arena.stats().peak, 512u);
  log = arena.log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].requester, "b");
  arena.Free(b->handle);  // the handle still resolves after the log was compacted
  EXPECT_EQ(arena.stats().in_use, 0u);
}

TEST(Arena, CapErrorNamesRequesterSizeAndCap) {
  Arena arena("gpu3", 1024, 256);
  auto a = arena.Allocate(768, "weights");
  ASSERT_TRUE(a.ok());
  auto b = arena.Allocate(512, "attention.scratch");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("gpu3"), std::string::npos) << m;
  EXPECT_NE(m.find("attention.scratch"), std::string::npos) << m;
  EXPECT_NE(m.find("512"), std::string::npos) << m;
  EXPECT_NE(m.find("1024"), std::string::npos) << m;
  EXPECT_NE(m.find("768"), std::string::npos) << m;
  // Exactly the remaining bytes still fit: the cap is hard, not approximate.
  EXPECT_TRUE(arena.Allocate(256, "last").ok());
  EXPECT_FALSE(arena.Allocate(1, "over").ok());
}

TEST(Arena, CoalescesFreedNeighbours) {
  Arena arena("dev", 4 * 256, 256);
  auto a = arena.Allocate(256, "a");
  auto b = arena.Allocate(256, "b");
  auto c = arena.Allocate(256, "c");
  auto d = arena.Allocate(256, "d");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  arena.Free(b->handle);
  arena.Free(c->handle);
  EXPECT_FALSE(arena.Allocate(768, "too big").ok());
  auto bc = arena.Allocate(512, "b+c");  // needs b and c merged
  ASSERT_TRUE(bc.ok());
  EXPECT_EQ(bc->offset, b->offset);
  arena.Free(a->handle);
  arena.Free(bc->handle);
  arena.Free(d->handle);
  auto all = arena.Allocate(1024, "all");  // everything merged back into one block
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->offset, 0u);
}

TEST(Arena, BestFitKeepsLargeBlocks) {
  Arena arena("dev", 8 * 256, 256);
  auto a = arena.Allocate(256, "a");
  auto gap1 = arena.Allocate(256, "gap1");
  auto b = arena.Allocate(3 * 256, "b");
  auto gap2 = arena.Allocate(256, "gap2");
  ASSERT_TRUE(a.ok() && gap1.ok() && b.ok() && gap2.ok());
  arena.Free(a->handle);  // a 256 hole at 0; b's 768 hole; 512 free at the end
  arena.Free(b->handle);
  auto small = arena.Allocate(200, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->offset, 0u);  // the smallest hole that fits
  EXPECT_TRUE(arena.Allocate(768, "big").ok());
}

}  // namespace
}  // namespace ferry
