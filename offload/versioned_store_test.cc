#include "offload/versioned_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

using testing::FaultyEnv;
using testing::TempDir;
using testing::TornWriteEnv;

// Record r's bytes at `step`: a pattern of both, so a mix of versions is visible.
std::byte Value(size_t r, int64_t step, size_t i) {
  return std::byte(uint8_t(r * 131 + size_t(step) * 17 + i * 7));
}
void Fill(size_t r, int64_t step, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = Value(r, step, i);
}
bool Holds(size_t r, int64_t step, std::span<const std::byte> in) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != Value(r, step, i)) return false;
  }
  return true;
}

const std::vector<size_t> kRecords = {100, 5000, 4096 - kVersionedSlotHeaderBytes, 9000};

class VersionedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dir_.path().empty()) GTEST_SKIP() << "could not create a temporary directory";
    options_.directory = dir_.path() + "/optim";
  }
  std::unique_ptr<VersionedStore> CreateStore(IoEnv* env = nullptr) {
    VersionedStoreOptions o = options_;
    o.env = env;
    auto s = VersionedStore::Create(o, kRecords, 0,
                                    [](size_t r, std::span<std::byte> b) { Fill(r, 0, b); });
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // One update cycle of record r from `step` to `step + 1`.
  Status Update(VersionedStore& s, size_t r, int64_t step) {
    FERRY_ASSIGN_OR_RETURN(std::span<std::byte> b, s.Acquire(r));
    EXPECT_TRUE(Holds(r, step, b)) << "record " << r;
    Fill(r, step + 1, b);
    return s.Commit(r, step + 1);
  }
  TempDir dir_;
  VersionedStoreOptions options_;
};

TEST_F(VersionedStoreTest, CyclesReadAndWriteWholeSlotsAndReopenAtTheNewestStep) {
  std::unique_ptr<VersionedStore> s = CreateStore();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(VersionedSlotBytes(100), 4096u);
  EXPECT_EQ(VersionedSlotBytes(4096 - kVersionedSlotHeaderBytes), 4096u);
  EXPECT_EQ(VersionedSlotBytes(4096 - kVersionedSlotHeaderBytes + 1), 8192u);
  size_t slot_bytes = 0;
  for (size_t b : kRecords) slot_bytes += VersionedSlotBytes(b);
  const VersionedStoreStats before = s->stats();
  for (int64_t step = 0; step < 3; ++step) {
    s->Prefetch(kRecords.size() - 1);
    for (size_t r = kRecords.size(); r-- > 0;) {  // backward order, reading one ahead
      if (r > 0) s->Prefetch(r - 1);
      ASSERT_TRUE(Update(*s, r, step).ok());
    }
  }
  const VersionedStoreStats after = s->stats();
  EXPECT_EQ(after.bytes_read - before.bytes_read, 3 * slot_bytes);
  EXPECT_EQ(after.bytes_written - before.bytes_written, 3 * slot_bytes);
  EXPECT_EQ(after.wasted_prefetches, 0u);
  EXPECT_EQ(s->staging_bytes(), 2 * VersionedSlotBytes(9000));
  s.reset();
  auto reopened = VersionedStore::Open(options_, kRecords);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  for (size_t r = 0; r < kRecords.size(); ++r) {
    EXPECT_EQ((*reopened)->step(r), 3);
    auto b = (*reopened)->Acquire(r);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(Holds(r, 3, *b));
    (*reopened)->Release(r);
  }
}

TEST_F(VersionedStoreTest, AnUnusedPrefetchIsDroppedToFreeABuffer) {
  std::unique_ptr<VersionedStore> s = CreateStore();
  ASSERT_NE(s, nullptr);
  s->Prefetch(0);
  s->Prefetch(1);
  ASSERT_TRUE(Update(*s, 2, 0).ok());  // both buffers hold read-ahead: one is dropped
  EXPECT_EQ(s->stats().wasted_prefetches, 1u);
  ASSERT_TRUE(Update(*s, 0, 0).ok());
  ASSERT_TRUE(Update(*s, 1, 0).ok());
}

TEST_F(VersionedStoreTest, ATornWriteLeavesTheRecordWhollyAtItsOldStep) {
  // Creating the store writes one slot per record; record 3 (two blocks per slot) tears in the
  // second cycle, after records 0..2 committed step 2.
  TornWriteEnv env(int(kRecords.size()) * 2 + 4);
  std::unique_ptr<VersionedStore> s = CreateStore(&env);
  ASSERT_NE(s, nullptr);
  for (size_t r = 0; r < kRecords.size(); ++r) ASSERT_TRUE(Update(*s, r, 0).ok());
  for (size_t r = 0; r < 3; ++r) ASSERT_TRUE(Update(*s, r, 1).ok());
  Status torn = Update(*s, 3, 1);
  EXPECT_EQ(torn.code(), StatusCode::kIOError);
  EXPECT_NE(torn.message().find("record-00003.slots"), std::string::npos) << torn.ToString();
  EXPECT_EQ(s->step(3), 1);
  s.reset();  // the process dies here
  auto reopened = VersionedStore::Open(options_, kRecords);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  for (size_t r = 0; r < kRecords.size(); ++r) {
    const int64_t step = (*reopened)->step(r);
    EXPECT_EQ(step, r < 3 ? 2 : 1) << "record " << r;
    auto b = (*reopened)->Acquire(r);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_TRUE(Holds(r, step, *b)) << "record " << r << " is not wholly at step " << step;
    (*reopened)->Release(r);
  }
}

TEST_F(VersionedStoreTest, AReadErrorNamesTheFileAndSlotAndFreesTheBuffer) {
  FaultyEnv env;
  std::unique_ptr<VersionedStore> s = CreateStore(&env);
  ASSERT_NE(s, nullptr);
  env.AddRule({.kind = IoKind::kRead, .action = FaultyEnv::Action::kError, .error = EIO});
  s->Prefetch(1);
  auto b = s->Acquire(1);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kIOError);
  EXPECT_NE(b.status().message().find("slot 0 of"), std::string::npos) << b.status().ToString();
  EXPECT_NE(b.status().message().find("record-00001.slots"), std::string::npos);
  ASSERT_TRUE(Update(*s, 1, 0).ok());  // the next try reads again
}

TEST_F(VersionedStoreTest, OpenRefusesARecordWithNoValidSlot) {
  std::unique_ptr<VersionedStore> s = CreateStore();
  ASSERT_NE(s, nullptr);
  const std::string path = s->path(2);
  s.reset();
  {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fputc(0x5a, f);  // flips a byte of slot 0's record: its checksum fails
    std::fclose(f);
  }
  auto reopened = VersionedStore::Open(options_, kRecords);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), StatusCode::kCorruption);
  EXPECT_NE(reopened.status().message().find("record-00002.slots has no valid slot"),
            std::string::npos)
      << reopened.status().ToString();
}

}  // namespace
}  // namespace ferry
