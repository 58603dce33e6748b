#include "engine/train/run_report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/host_memory.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

plan::Plan TwoDevicePlan() {
  plan::Plan p;
  p.hardware_name = "cpu-devices";
  p.gpus = 2;
  p.stages = {{1, 3}, {3, 5}};
  p.step_s = 0.25;
  p.memory.gpu.allocations = {{"weights.slot0", 1024}};
  p.memory.pinned_host.allocations = {{"weights.upload", 2048}};
  return p;
}

// The step time skips the first update (it also creates what later ones reuse); every device
// and the host get a row against the plan; NVMe only when the plan puts bytes there.
TEST(RunReport, ComparesSteadyStepsAndEveryTierWithThePlan) {
  MeasuredRun run;
  run.step_seconds = {9.0, 0.3, 0.1, 0.2};
  // The arenas' pages in RAM count, not their size (4 KiB each here).
  run.devices = {{"cpu0", 1024, 4096, 4096}, {"cpu1", 512, 4096, 4096}};
  run.host_peak_bytes = 1 << 20;
  const std::string text = MeasuredVsPredicted(TwoDevicePlan(), run);
  EXPECT_NE(text.find("2 devices, 2 forward stages"), std::string::npos) << text;
  EXPECT_NE(text.find("200 ms (median of 3 after the first; min 100 ms, max 300 ms)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("predicted 250 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("cpu1 peak"), std::string::npos) << text;
  EXPECT_NE(text.find("planned 1.00 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("8.00 KiB of it device arenas in RAM"), std::string::npos) << text;
  // The host's plan splits on a line of its own, under the measured column ("cpu0 peak" is the
  // widest label: 9 characters).
  EXPECT_NE(text.find("planned 2.00 KiB\n             planned: pinned 2.00 KiB + pageable 0 B\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("NVMe"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
  // With the resident set at the start: the part the plan's host total compares with, in the row,
  // and how the peak splits, below it.
  run.host_start_bytes = 1000 << 10;
  const std::string split = MeasuredVsPredicted(TwoDevicePlan(), run);
  EXPECT_NE(split.find("host peak  16.00 KiB (the rest of the process's peak RSS, below)"),
            std::string::npos)
      << split;
  EXPECT_NE(split.find("\n             peak RSS 1.00 MiB = 1000.00 KiB at start + 8.00 KiB device "
                       "arenas in RAM\n               + 16.00 KiB the rest\n"),
            std::string::npos)
      << split;
  EXPECT_EQ(std::count(split.begin(), split.end(), '\n'), 8) << split;
  // File-backed pages paged in (libraries' code): shown, and not in the rest.
  run.host_file_growth_bytes = 4 << 10;
  EXPECT_NE(MeasuredVsPredicted(TwoDevicePlan(), run)
                .find("8.00 KiB device arenas in RAM\n               + 4.00 KiB code and files "
                      "paged in + 12.00 KiB the rest\n"),
            std::string::npos)
      << MeasuredVsPredicted(TwoDevicePlan(), run);
  // What the set-up left resident for the run (threads, libraries): shown, and not in the rest.
  run.host_setup_bytes = 8 << 10;
  EXPECT_NE(MeasuredVsPredicted(TwoDevicePlan(), run)
                .find("1000.00 KiB at start + 8.00 KiB set-up (threads, libraries) + 8.00 KiB "
                      "device arenas in RAM\n               + 4.00 KiB code and files paged in + "
                      "4.00 KiB the rest\n"),
            std::string::npos)
      << MeasuredVsPredicted(TwoDevicePlan(), run);
  run.host_setup_bytes = 0;
  run.host_file_growth_bytes = 0;
  run.host_start_bytes = 1 << 20;  // nothing left beyond start and arenas: 0, not a wrap-around
  EXPECT_NE(MeasuredVsPredicted(TwoDevicePlan(), run).find("+ 0 B the rest"), std::string::npos);
  // Arenas mapped but one page filled: only that page is theirs.
  run.host_start_bytes = 1000 << 10;
  run.devices = {{"cpu0", 1024, 1 << 20, 4096}, {"cpu1", 512, 1 << 20, 0}};
  EXPECT_NE(MeasuredVsPredicted(TwoDevicePlan(), run)
                .find("1000.00 KiB at start + 4.00 KiB device arenas in RAM\n               + "
                      "20.00 KiB the rest"),
            std::string::npos)
      << MeasuredVsPredicted(TwoDevicePlan(), run);

  run.step_seconds = {0.5};
  EXPECT_NE(MeasuredVsPredicted(TwoDevicePlan(), run).find("500 ms (the only update)"),
            std::string::npos);
  plan::Plan one = TwoDevicePlan();
  one.gpus = 1;
  EXPECT_NE(MeasuredVsPredicted(one, run).find("1 device, 2 forward stages"), std::string::npos);
}

// Optimizer state on NVMe: its space and its bytes per step, each against the plan's.
TEST(RunReport, NvmeRowsCompareSpaceAndBytesPerStepWithThePlan) {
  plan::Plan p = TwoDevicePlan();
  p.memory.nvme.allocations = {{"optimizer.slots", 16384}};
  p.nvme_read_bytes = p.nvme_write_bytes = 8192;
  MeasuredRun run;
  run.step_seconds = {0.1};
  run.nvme_bytes = 16384;
  run.nvme_read_per_step = run.nvme_written_per_step = 8192;
  const std::string text = MeasuredVsPredicted(p, run);
  EXPECT_NE(text.find("16.00 KiB (optimizer state)"), std::string::npos) << text;
  EXPECT_NE(text.find("8.00 KiB read, 8.00 KiB written"), std::string::npos) << text;
  EXPECT_NE(text.find("planned 8.00 KiB read, 8.00 KiB written"), std::string::npos) << text;
  run.nvme_activation_bytes = 4096;
  const std::string both = MeasuredVsPredicted(p, run);
  EXPECT_NE(both.find("20.00 KiB (optimizer state + activations)"), std::string::npos) << both;
}

// After a reset the peak is the resident set from then on: 64 MiB touched and unmapped before it
// no longer count. (Mapped directly, not through the allocator, which the sanitizers' builds
// replace with ones that keep freed memory.)
TEST(RunReport, ResetPeakResidentBytesForgetsWhatWasFreed) {
  {
    Result<HostAllocation> big = HostAllocation::Map(size_t(64) << 20, "test", HostPages::kBase);
    ASSERT_TRUE(big.ok()) << big.status().ToString();
    std::memset(big->data(), 1, big->size());
    Result<uint64_t> peak = PeakResidentBytes();
    ASSERT_TRUE(peak.ok()) << peak.status().ToString();
    EXPECT_GE(*peak, uint64_t(64) << 20);
  }
  Result<uint64_t> before = PeakResidentBytes(), now = ResidentBytes();
  ASSERT_TRUE(before.ok() && now.ok());
  ASSERT_GE(*before, *now + (uint64_t(48) << 20)) << "the 64 MiB were not returned to the OS";
  if (Status s = ResetPeakResidentBytes(); !s.ok()) {
    GTEST_SKIP() << "this kernel cannot reset the peak: " << s.ToString();
  }
  Result<uint64_t> after = PeakResidentBytes();
  ASSERT_TRUE(after.ok());
  EXPECT_LT(*after, *before - (uint64_t(32) << 20));
}

TEST(RunReport, PeakResidentBytesIsThisProcesss) {
  Result<uint64_t> now = ResidentBytes();
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_GT(*now, 0u);
  Result<uint64_t> rss = PeakResidentBytes();
  ASSERT_TRUE(rss.ok()) << rss.status().ToString();
  EXPECT_GE(*rss, *now);  // the peak since the start, read after `now`
}

// Pages of a mapped file count as file-backed; an anonymous allocation's do not. The kernel's
// counters may lag by a few pages (batched per CPU before Linux 6.16), hence the margins.
TEST(RunReport, ResidentFileBytesCountsMappedFilesOnly) {
  constexpr size_t kBytes = 8 << 20;
  ferry::testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << dir.path() << " is on tmpfs, whose mapped pages count as shared memory, not "
                 << "as file-backed: set FERRY_TEST_DIR to a disk-backed folder";
  }
  const std::string path = dir.path() + "/mapped";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  const std::vector<char> data(kBytes, 'x');
  const ssize_t wrote = ::write(fd, data.data(), kBytes);
  void* map =
      wrote == ssize_t(kBytes) ? ::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED) << "wrote " << wrote << " bytes";
  Result<uint64_t> before = ResidentFileBytes();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  std::vector<char> anon(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) anon[i] = 1;
  Result<uint64_t> after_anon = ResidentFileBytes();
  ASSERT_TRUE(after_anon.ok());
  EXPECT_LT(*after_anon, *before + kBytes / 4);
  uint64_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += uint64_t(static_cast<const char*>(map)[i]);
  EXPECT_EQ(sum, uint64_t('x') * (kBytes / 4096));
  Result<uint64_t> mapped = ResidentFileBytes();
  ASSERT_TRUE(mapped.ok());
  ::munmap(map, kBytes);
  EXPECT_GE(*mapped, *after_anon + kBytes * 3 / 4);
  EXPECT_EQ(anon[4096], 1);
}

}  // namespace
}  // namespace ferry
