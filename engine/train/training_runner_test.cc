// The NVMe folders a run keeps its scratch in (engine/train/training_runner.h): their names, and
// the scratch store's lock, leftovers and clean-up.
#include "engine/train/training_runner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// The run's folder name is the last component of --out, a trailing separator or not.
TEST(RunNvmeFolders, AreNamedAfterTheRunFolder) {
  JobSpec job;
  job.nvme_dir = "/nvme";
  for (const char* out : {"runs/exp1", "runs/exp1/", "./runs/exp1//"}) {
    job.out = out;
    EXPECT_EQ(ActivationsDir(job), "/nvme/exp1.activations") << out;
    EXPECT_EQ(OptimizerStateDir(job), "/nvme/exp1.optimizer-state") << out;
  }
  job.out = "/";
  EXPECT_EQ(ActivationsDir(job), "/nvme/run.activations");
}

NvmeStoreOptions Quiet(const std::string& dir) {
  NvmeStoreOptions o;
  o.directory = dir;
  o.segment_bytes = o.block_bytes;  // small: the tests' folder may be on tmpfs
  o.log = [](std::string_view) {};
  return o;
}

// One run holds the folder: a second store there is refused naming it; closing the first removes
// the folder; a killed run's segment files are cleared when the next run opens it.
TEST(ScratchStore, IsLockedClearedAndRemoved) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/run.activations";
  {
    Result<ScratchStore> first = OpenScratchStore(Quiet(dir));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE((*first)->Write("x", std::as_bytes(std::span("abc", 3))).ok());
    Result<ScratchStore> second = OpenScratchStore(Quiet(dir));
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find(dir + " is in use"), std::string::npos)
        << second.status().ToString();
    EXPECT_TRUE(fs::exists(dir));  // the refusal touched nothing
  }
  EXPECT_FALSE(fs::exists(dir)) << "the closed store left its folder";

  fs::create_directories(dir);
  std::ofstream(dir + "/segment-00007.ferry") << "left by a killed run";
  {
    Result<ScratchStore> s = OpenScratchStore(Quiet(dir));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(fs::exists(dir + "/segment-00007.ferry"));
  }
  EXPECT_FALSE(fs::exists(dir));
}

// A killed run's folder (lock file and segments, no process holding it) is removed before the next
// run plans, so its space counts as free; a folder another run holds is left as it is.
TEST(ScratchStore, LeftoversOfAKilledRunAreClearedOthersLeft) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/run.activations";
  fs::create_directories(dir);
  std::ofstream(dir + "/.ferry-lock");
  std::ofstream(dir + "/segment-00000.ferry") << "left by a killed run";
  ASSERT_TRUE(ClearScratchLeftovers(dir).ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(ClearScratchLeftovers(dir).ok());  // nothing there: nothing to do

  Result<ScratchStore> held = OpenScratchStore(Quiet(dir));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE((*held)->Write("x", std::as_bytes(std::span("abc", 3))).ok());
  const Status s = ClearScratchLeftovers(dir);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ScratchStoreBytes(dir), (*held)->block_bytes());  // one segment of one block, intact
}

// The optimizer state's folder is held as the scratch store's is: a second hold is refused, a
// killed run's records (no process holding the folder) are cleared, and RemoveFolder removes the
// records, the lock and the folder.
TEST(NvmeFolderLock, HoldsClearsAndRemovesTheOptimizerStateFolder) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/run.optimizer-state";
  fs::create_directories(dir);
  std::ofstream(dir + "/.ferry-lock");
  std::ofstream(dir + "/record-00003.slots") << "left by a killed run";
  ASSERT_TRUE(ClearScratchLeftovers(dir).ok());
  EXPECT_FALSE(fs::exists(dir));

  Result<NvmeFolderLock> held = NvmeFolderLock::Take(dir);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_TRUE(held->held());
  std::ofstream(dir + "/record-00000.slots") << "state";
  Result<NvmeFolderLock> twin = NvmeFolderLock::Take(dir);
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ClearScratchLeftovers(dir).ok());  // held: left as it is
  EXPECT_EQ(ScratchStoreBytes(dir), 5u);

  NvmeFolderLock moved = std::move(*held);
  EXPECT_FALSE(held->held());
  held->RemoveFolder();  // not held: nothing
  EXPECT_TRUE(fs::exists(dir + "/record-00000.slots"));
  moved.RemoveFolder();
  EXPECT_FALSE(moved.held());
  EXPECT_FALSE(fs::exists(dir));
  Result<NvmeFolderLock> again = NvmeFolderLock::Take(dir);  // free again
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// FileLock: a second lock of the file is refused with the caller's words; StillAt tells a file
// unlinked (by a run removing its folder) or replaced at that path from the one held.
TEST(FileLock, RefusesASecondHolderAndSeesItsFileReplaced) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = tmp.path() + "/lock";
  Result<FileLock> held = FileLock::Take(path, "busy here");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_TRUE(held->StillAt(path));
  Result<FileLock> twin = FileLock::Take(path, "busy here");
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(twin.status().message(), "busy here");
  fs::remove(path);
  EXPECT_FALSE(held->StillAt(path));                          // unlinked
  Result<FileLock> next = FileLock::Take(path, "busy here");  // a new file: free
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_FALSE(held->StillAt(path));  // replaced
  EXPECT_TRUE(next->StillAt(path));
  Result<FileLock> gone = FileLock::Take(tmp.path() + "/no/such/lock", "busy here");
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
}

// A folder holding anything ferry did not write is refused naming the file, which stays.
TEST(ScratchStore, RefusesAFolderWithOtherFiles) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/mine";
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "keep me";
  Result<ScratchStore> s = OpenScratchStore(Quiet(dir));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("notes.txt"), std::string::npos) << s.status().ToString();
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  Result<NvmeFolderLock> lock = NvmeFolderLock::Take(dir);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ClearScratchLeftovers(dir).ok());  // not ferry's folder: left alone
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
}

}  // namespace
}  // namespace ferry
