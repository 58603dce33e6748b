// NvmeStore under faults: injected completion results on both backends (-EIO, -ENOSPC, short
// transfers, -EAGAIN), io_uring and O_DIRECT refused (fallbacks), buffer registration refused by
// the memory-lock limit, a real file-size limit and a real full filesystem, a vanished directory.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>

#include "offload/nvme_store.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

using testing::FaultyEnv;
using testing::Pattern;
using testing::SmallStoreOptions;
using testing::TempDir;

class CompletionFaults : public testing::FaultyStoreTest {};

TEST_P(CompletionFaults, WriteErrorsFailTheTransferAndKeepOldData) {
  const auto old_data = Pattern(2 * B_ + 3, 1), new_data = Pattern(3 * B_, 2);
  ASSERT_TRUE(store_->Write("x", old_data).ok());
  struct Case {
    int error;
    StatusCode code;
  } cases[] = {{EIO, StatusCode::kIOError}, {ENOSPC, StatusCode::kNoSpace}};
  for (const Case& c : cases) {
    env_.AddRule({IoKind::kWrite, FaultyEnv::Action::kError, c.error, /*skip=*/1, /*count=*/1});
    const Status s = store_->Write("x", new_data);
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_NE(s.message().find("of entry 'x'"), std::string::npos) << s.ToString();
    ExpectReadsBack("x", old_data);  // the failed overwrite left the old version
  }
  EXPECT_EQ(env_.faults(), 2);
  ASSERT_TRUE(store_->Write("x", new_data).ok());  // the store is still usable
  ExpectReadsBack("x", new_data);
}

TEST_P(CompletionFaults, ReadErrorFailsTheReadOnly) {
  const auto data = Pattern(3 * B_ + 1, 3);
  ASSERT_TRUE(store_->Write("r", data).ok());
  env_.AddRule({IoKind::kRead, FaultyEnv::Action::kError, EIO, /*skip=*/2, /*count=*/1});
  std::vector<std::byte> back(data.size());
  const Status s = store_->Read("r", back);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("of entry 'r'"), std::string::npos) << s.ToString();
  ExpectReadsBack("r", data);
}

TEST_P(CompletionFaults, ShortTransfersAreResubmitted) {
  const auto data = Pattern(4 * B_ + 77, 4);
  env_.AddRule({IoKind::kWrite, FaultyEnv::Action::kShort, 0, /*skip=*/0, /*count=*/5});
  env_.AddRule({IoKind::kRead, FaultyEnv::Action::kShort, 0, /*skip=*/1, /*count=*/5});
  ASSERT_TRUE(store_->Write("s", data).ok());
  ExpectReadsBack("s", data);
  EXPECT_EQ(env_.faults(), 10);
  EXPECT_EQ(store_->stats().short_resubmits, 10u);
}

TEST_P(CompletionFaults, AgainIsResubmitted) {
  const auto data = Pattern(3 * B_, 5);
  env_.AddRule({IoKind::kWrite, FaultyEnv::Action::kError, EAGAIN, 0, /*count=*/4});
  env_.AddRule({IoKind::kRead, FaultyEnv::Action::kError, EAGAIN, 0, /*count=*/4});
  ASSERT_TRUE(store_->Write("a", data).ok());
  ExpectReadsBack("a", data);
  EXPECT_EQ(store_->stats().again_resubmits, 8u);
}

INSTANTIATE_TEST_SUITE_P(Backends, CompletionFaults,
                         ::testing::Values(StoreBackend::kIoUring, StoreBackend::kThreadPool),
                         [](const auto& info) {
                           return info.param == StoreBackend::kIoUring ? "IoUring" : "Threads";
                         });

// ---- fallbacks ------------------------------------------------------------------------------

TEST(StoreFallback, IoUringRefusedChoosesThreadsAndSaysSo) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FaultyEnv env;
  env.ring_error = ENOSYS;
  std::string logged;
  auto o = SmallStoreOptions(dir.path(), StoreBackend::kAuto, &env);
  o.log = [&](std::string_view l) { logged += l; };
  auto store = NvmeStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->backend_name(), "threads");
  EXPECT_NE(logged.find("io_uring_queue_init refused"), std::string::npos) << logged;
  const auto data = Pattern(100000, 6);
  ASSERT_TRUE((*store)->Write("d", data).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*store)->Read("d", back).ok());
  EXPECT_TRUE(back == data);

  o.backend = StoreBackend::kIoUring;  // forced: no silent fallback
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kUnavailable);
}

// A kernel that refuses the single-issuer ring flags (before 6.1) gets a plain ring: still
// io_uring, and every block in flight round-trips.
TEST(StoreFallback, RingFlagsRefusedGivesAPlainRing) {
  if (!testing::UringAvailable()) GTEST_SKIP() << "io_uring is not available here";
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FaultyEnv env;
  env.refuse_ring_flags = true;
  auto store = NvmeStore::Open(SmallStoreOptions(dir.path(), StoreBackend::kIoUring, &env));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->backend_name(), "io_uring");
  const auto data = Pattern(20 * (*store)->block_bytes() + 12345, 7);
  ASSERT_TRUE((*store)->Write("d", data).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*store)->Read("d", back).ok());
  EXPECT_TRUE(back == data);
}

TEST(StoreFallback, DirectIoRefusedChoosesThreadsWithBufferedIo) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FaultyEnv env;
  env.refuse_direct = true;
  auto store = NvmeStore::Open(SmallStoreOptions(dir.path(), StoreBackend::kAuto, &env));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->backend_name(), "threads");
  EXPECT_FALSE((*store)->direct_io());
  EXPECT_NE((*store)->report().find("O_DIRECT refused"), std::string::npos) << (*store)->report();
  const auto data = Pattern(200001, 7);
  ASSERT_TRUE((*store)->Write("d", data).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*store)->Read("d", back).ok());
  EXPECT_TRUE(back == data);
}

TEST(StoreFallback, RegistrationRefusedUsesFewerRegisteredBuffers) {
  if (!testing::UringAvailable()) GTEST_SKIP() << "io_uring is not available here";
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FaultyEnv env;
  env.register_limit = 3 * (64 << 10);  // room for 3 of the 8 buffers: the store halves to 2
  auto store = NvmeStore::Open(SmallStoreOptions(dir.path(), StoreBackend::kIoUring, &env));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->registered_buffers(), 2u);
  EXPECT_NE((*store)->report().find("RLIMIT_MEMLOCK"), std::string::npos) << (*store)->report();
  const auto data = Pattern(8 * (64 << 10) + 5, 8);  // uses registered and unregistered buffers
  ASSERT_TRUE((*store)->Write("d", data).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*store)->Read("d", back).ok());
  EXPECT_TRUE(back == data);
}

// The real limit: a child without CAP_IPC_LOCK (root ignores the limit otherwise) and a 128 KiB
// RLIMIT_MEMLOCK registers what fits and still works.
TEST(StoreFallback, RealMemlockLimitShrinksTheRegisteredRing) {
  if (!testing::UringAvailable()) GTEST_SKIP() << "io_uring is not available here";
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string msg = testing::RunInChild([&]() -> std::string {
    if (!testing::DropCapability(CAP_IPC_LOCK)) return "SKIP: cannot drop CAP_IPC_LOCK";
    rlimit rl{128 << 10, 128 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "SKIP: cannot lower RLIMIT_MEMLOCK";
    auto store = NvmeStore::Open(SmallStoreOptions(dir.path(), StoreBackend::kIoUring));
    if (!store.ok()) return "open: " + store.status().ToString();
    if ((*store)->registered_buffers() >= 8) return "all 8 buffers registered despite the limit";
    if ((*store)->report().find("RLIMIT_MEMLOCK is 128 KiB") == std::string::npos) {
      return "report lacks the limit: " + (*store)->report();
    }
    const auto data = Pattern(600000, 9);
    if (!(*store)->Write("d", data).ok()) return "write failed";
    std::vector<std::byte> back(data.size());
    if (!(*store)->Read("d", back).ok() || back != data) return "read back differs";
    return "";
  });
  if (msg.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << msg.substr(6);
  EXPECT_EQ(msg, "");
}

// ---- full disks and vanished directories ----------------------------------------------------

// Writes 200 KiB entries until the store refuses; checks the refusal and that every entry written
// before it reads back. Returns "" or a failure message.
std::string FillUntilFull(NvmeStore& store, int max_entries) {
  std::vector<std::vector<std::byte>> written;
  Status s;
  for (int i = 0; i < max_entries && s.ok(); ++i) {
    auto data = Pattern(200 << 10, uint64_t(i) + 50);
    s = store.Write("f" + std::to_string(i), data);
    if (s.ok()) written.push_back(std::move(data));
  }
  if (s.ok()) return "the disk never filled";
  if (s.code() != StatusCode::kNoSpace) return "expected NoSpace, got " + s.ToString();
  if (written.empty()) return "nothing could be written at all";
  for (size_t i = 0; i < written.size(); ++i) {
    std::vector<std::byte> back(written[i].size());
    const Status r = store.Read("f" + std::to_string(i), back);
    if (!r.ok()) return "entry written before the disk filled: " + r.ToString();
    if (back != written[i]) return "entry " + std::to_string(i) + " differs";
  }
  return "";
}

TEST(StoreFull, FileSizeLimitIsNoSpaceAndEarlierEntriesStayReadable) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string msg = testing::RunInChild([&]() -> std::string {
    std::signal(SIGXFSZ, SIG_IGN);  // so the limit gives EFBIG instead of killing the process
    auto o = SmallStoreOptions(dir.path(), StoreBackend::kAuto);
    o.segment_bytes = 512 << 10;
    o.reserve_bytes = 512 << 10;  // segment 0 exists before the limit is set
    auto store = NvmeStore::Open(o);
    if (!store.ok()) return "open: " + store.status().ToString();
    // Writes at or past 256 KiB of any file now fail with EFBIG: the second entry fails at the
    // completion level, and a new segment could not be reserved either.
    rlimit rl{256 << 10, 256 << 10};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return "SKIP: cannot set RLIMIT_FSIZE";
    return FillUntilFull(**store, 64);
  });
  if (msg.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << msg.substr(6);
  EXPECT_EQ(msg, "");
}

TEST(StoreFull, RealFullFilesystem) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // A 1 MiB tmpfs mounted in a private mount namespace of a child process (needs CAP_SYS_ADMIN).
  const std::string msg = testing::RunInChild([&]() -> std::string {
    if (unshare(CLONE_NEWNS) != 0) return "SKIP: no private mount namespace (unprivileged)";
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return "SKIP: cannot make mounts private";
    }
    if (mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=1m") != 0) {
      return "SKIP: cannot mount a small tmpfs: " + std::string(std::strerror(errno));
    }
    auto o = SmallStoreOptions(dir.path(), StoreBackend::kAuto);
    o.segment_bytes = 256 << 10;
    auto store = NvmeStore::Open(o);
    if (!store.ok()) return "open: " + store.status().ToString();
    return FillUntilFull(**store, 64);
  });
  if (msg.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << msg.substr(6);
  EXPECT_EQ(msg, "");
}

TEST(StoreFull, VanishedDirectoryIsNotFoundAndEarlierEntriesStayReadable) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto o = SmallStoreOptions(dir.path() + "/store", StoreBackend::kAuto);
  o.segment_bytes = 256 << 10;  // 4 blocks per segment file
  auto store = NvmeStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto a = Pattern(200 << 10, 1);
  ASSERT_TRUE((*store)->Write("a", a).ok());
  std::filesystem::remove_all(dir.path() + "/store");
  const Status s = (*store)->Write("b", Pattern(300 << 10, 2));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("vanished"), std::string::npos) << s.ToString();
  std::vector<std::byte> back(a.size());
  ASSERT_TRUE((*store)->Read("a", back).ok());
  EXPECT_TRUE(back == a);
}

TEST(StoreOpen, MissingParentIsNotFound) {
  auto o = SmallStoreOptions("/nonexistent-ferry-parent/store", StoreBackend::kAuto);
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kNotFound);
  o.block_bytes = 1000;
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
