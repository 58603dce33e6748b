// NvmeStore's zero-copy path (blocks moved straight from/to page-aligned caller memory): round
// trips on both backends with the path checked to be taken (and not taken for unaligned memory),
// mixing aligned and unaligned buffers, a flipped bit on disk, faults injected on it (short
// transfers that resubmit into the caller's pages, -EIO keeping the old version), external files.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kernels/host_memory.h"
#include "offload/nvme_store.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

using testing::FaultyEnv;
using testing::Pattern;

constexpr size_t kPage = 4096;

// Page-aligned memory holding `content` (a HostAllocation, as the host pool hands out).
HostAllocation Aligned(const std::vector<std::byte>& content) {
  auto a = HostAllocation::Map(std::max<size_t>(content.size(), 1), "zero-copy test buffer");
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) std::abort();
  if (!content.empty()) std::memcpy(a->data(), content.data(), content.size());
  return std::move(a).value();
}

class ZeroCopy : public testing::FaultyStoreTest {
 protected:
  uint64_t ZeroCopyBlocks() const { return store_->stats().zero_copy_blocks; }
};

TEST_P(ZeroCopy, AlignedRoundTripsTakeThePathUnalignedOnesDoNot) {
  struct Case {
    size_t size;
    uint64_t zero_copy_blocks;  // per transfer: blocks that are whole pages of aligned memory
  } cases[] = {
      {3 * B_, 3},                // every block
      {2 * B_ + 5 * kPage, 3},    // the short last block is still whole pages
      {2 * B_ + 100, 2},          // the last block (100 bytes) goes through a bounce buffer
      {kPage - 1, 0},             // one partial page
  };
  for (const Case& c : cases) {
    const auto data = Pattern(c.size, c.size);
    HostAllocation src = Aligned(data);
    const uint64_t before = ZeroCopyBlocks();
    ASSERT_TRUE(store_->Write("z", {src.data(), c.size}).ok());
    EXPECT_EQ(ZeroCopyBlocks() - before, c.zero_copy_blocks) << "write of " << c.size;
    HostAllocation back = Aligned(std::vector<std::byte>(c.size, std::byte{0xEE}));
    if (back.size() > c.size) back.data()[c.size] = std::byte{0xEE};
    ASSERT_TRUE(store_->Read("z", {back.data(), c.size}).ok());
    EXPECT_EQ(ZeroCopyBlocks() - before, 2 * c.zero_copy_blocks) << "read of " << c.size;
    EXPECT_EQ(std::memcmp(back.data(), data.data(), c.size), 0) << "size " << c.size;
    // The pages past the entry in the caller's buffer are not touched by the read.
    if (back.size() > c.size) {
      EXPECT_EQ(back.data()[c.size], std::byte{0xEE});
    }
  }
  // Memory one byte off a page boundary never goes to the disk directly.
  const auto data = Pattern(2 * B_, 8);
  HostAllocation raw = Aligned(std::vector<std::byte>(2 * B_ + 1));
  std::memcpy(raw.data() + 1, data.data(), data.size());
  const uint64_t before = ZeroCopyBlocks();
  ASSERT_TRUE(store_->Write("u", {raw.data() + 1, data.size()}).ok());
  std::memset(raw.data(), 0, raw.size());
  ASSERT_TRUE(store_->Read("u", {raw.data() + 1, data.size()}).ok());
  EXPECT_EQ(ZeroCopyBlocks(), before);
  EXPECT_EQ(std::memcmp(raw.data() + 1, data.data(), data.size()), 0);
}

TEST_P(ZeroCopy, AlignedAndUnalignedBuffersMix) {
  const auto data = Pattern(3 * B_ + 3 * kPage, 11);
  HostAllocation aligned = Aligned(data);
  ASSERT_TRUE(store_->Write("a", {aligned.data(), data.size()}).ok());
  ASSERT_TRUE(store_->Write("v", data).ok());  // a std::vector: bounce buffers
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(store_->Read("a", back).ok());
  EXPECT_TRUE(back == data) << "zero-copy write, bounce read";
  HostAllocation back_aligned = Aligned(std::vector<std::byte>(data.size()));
  ASSERT_TRUE(store_->Read("v", {back_aligned.data(), data.size()}).ok());
  EXPECT_EQ(std::memcmp(back_aligned.data(), data.data(), data.size()), 0)
      << "bounce write, zero-copy read";
}

TEST_P(ZeroCopy, FlippedBitIsDetected) {
  const auto data = Pattern(3 * B_, 21);
  HostAllocation src = Aligned(data);
  ASSERT_TRUE(store_->Write("w", {src.data(), data.size()}).ok());
  auto loc = store_->LocateBlock("w", 2);
  ASSERT_TRUE(loc.ok());
  ASSERT_EQ(testing::FlipBitsOnDisk(loc->path, loc->offset + 12345, 0x01), "");
  HostAllocation back = Aligned(std::vector<std::byte>(data.size()));
  const uint64_t before = ZeroCopyBlocks();
  const Status s = store_->Read("w", {back.data(), data.size()});
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("block 2 of entry 'w'"), std::string::npos) << s.ToString();
  EXPECT_EQ(store_->stats().checksum_failures, 1u);
  EXPECT_EQ(ZeroCopyBlocks() - before, 3u);  // the damaged block was read zero-copy too
}

TEST_P(ZeroCopy, ShortTransfersResubmitIntoTheCallersPages) {
  const auto data = Pattern(4 * B_, 31);
  HostAllocation src = Aligned(data);
  env_.AddRule({IoKind::kWrite, FaultyEnv::Action::kShort, 0, /*skip=*/0, /*count=*/3});
  env_.AddRule({IoKind::kRead, FaultyEnv::Action::kShort, 0, /*skip=*/1, /*count=*/3});
  ASSERT_TRUE(store_->Write("s", {src.data(), data.size()}).ok());
  HostAllocation back = Aligned(std::vector<std::byte>(data.size()));
  ASSERT_TRUE(store_->Read("s", {back.data(), data.size()}).ok());
  EXPECT_EQ(std::memcmp(back.data(), data.data(), data.size()), 0);
  EXPECT_EQ(env_.faults(), 6);
  EXPECT_EQ(store_->stats().short_resubmits, 6u);
  EXPECT_EQ(ZeroCopyBlocks(), 8u);
}

TEST_P(ZeroCopy, WriteErrorKeepsTheOldVersionAndReadErrorFailsTheRead) {
  const auto old_data = Pattern(3 * B_, 41), new_data = Pattern(3 * B_, 42);
  HostAllocation old_src = Aligned(old_data), new_src = Aligned(new_data);
  ASSERT_TRUE(store_->Write("x", {old_src.data(), old_data.size()}).ok());
  env_.AddRule({IoKind::kWrite, FaultyEnv::Action::kError, EIO, /*skip=*/1, /*count=*/1});
  const Status w = store_->Write("x", {new_src.data(), new_data.size()});
  EXPECT_EQ(w.code(), StatusCode::kIOError) << w.ToString();
  EXPECT_NE(w.message().find("of entry 'x'"), std::string::npos) << w.ToString();
  HostAllocation back = Aligned(std::vector<std::byte>(old_data.size()));
  ASSERT_TRUE(store_->Read("x", {back.data(), old_data.size()}).ok());
  EXPECT_EQ(std::memcmp(back.data(), old_data.data(), old_data.size()), 0);

  env_.AddRule({IoKind::kRead, FaultyEnv::Action::kError, EIO, /*skip=*/1, /*count=*/1});
  const Status r = store_->Read("x", {back.data(), old_data.size()});
  EXPECT_EQ(r.code(), StatusCode::kIOError) << r.ToString();
  EXPECT_EQ(env_.faults(), 2);
}

TEST_P(ZeroCopy, ExternalFileReadsStraightIntoAlignedMemory) {
  const auto content = Pattern(3 * B_ + 777, 51);
  const std::string path = dir_.path() + "/model.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(content.data()), std::streamsize(content.size()));
  }
  auto file = store_->OpenExternal(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  struct Case {
    size_t offset, len;
    bool some_zero_copy;
  } cases[] = {
      {0, 2 * B_, true},                        // whole blocks
      {kPage, B_ + kPage, true},                // aligned offset, whole pages
      {0, content.size(), true},                // the unaligned tail goes through a bounce buffer
      {100, B_, false},                         // unaligned offset: bounce buffers only
  };
  for (const Case& c : cases) {
    HostAllocation back = Aligned(std::vector<std::byte>(c.len));
    const uint64_t before = ZeroCopyBlocks();
    const Status s = store_->ReadExternalAsync(*file, c.offset, {back.data(), c.len},
                                               TransferPriority::kNextWeights)
                         .Wait();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::memcmp(back.data(), content.data() + c.offset, c.len), 0)
        << "[" << c.offset << ", " << c.offset + c.len << ")";
    EXPECT_EQ(ZeroCopyBlocks() > before, c.some_zero_copy) << "offset " << c.offset;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ZeroCopy,
                         ::testing::Values(StoreBackend::kIoUring, StoreBackend::kThreadPool),
                         [](const auto& info) {
                           return info.param == StoreBackend::kIoUring ? "IoUring" : "Threads";
                         });

}  // namespace
}  // namespace ferry
