#include "kernels/host_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry {
namespace {

// The THPeligible field of the /proc/self/smaps entry of the mapping that holds `p`; -1 when the
// kernel does not report it.
int ThpEligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

TEST(HostMemory, MapRoundsUpToPagesAndZeroes) {
  auto a = HostAllocation::Map(5000, "small");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->size(), 2 * HostPageSize());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % HostPageSize(), 0u);
  for (size_t i = 0; i < a->size(); ++i) ASSERT_EQ(a->data()[i], std::byte{0}) << i;
}

TEST(HostMemory, LargeMappingsAreHugePageAlignedAndAdvised) {
  const size_t huge = HostHugePageSize();
  if (huge == 0) GTEST_SKIP() << "the kernel has no transparent huge pages";
  const size_t bytes = 3 * huge + 12345;  // not a multiple: the tail stays on base pages
  auto a = HostAllocation::Map(bytes, "large");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % huge, 0u);
  EXPECT_EQ(a->size(), (bytes + HostPageSize() - 1) / HostPageSize() * HostPageSize());
  // Every byte is mapped, writable and zero (the trimmed head and tail took nothing with them).
  for (size_t i = 0; i < a->size(); i += HostPageSize()) {
    ASSERT_EQ(a->data()[i], std::byte{0}) << i;
    a->data()[i] = std::byte{1};
  }
  a->data()[a->size() - 1] = std::byte{2};

  auto base = HostAllocation::Map(bytes, "base pages", HostPages::kBase);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  const std::string mode = TransparentHugePagesMode();
  const int eligible = ThpEligible(a->data());
  if (eligible < 0) GTEST_SKIP() << "/proc/self/smaps has no THPeligible field on this kernel";
  if (mode != "always" && mode != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' on this machine";
  }
  EXPECT_EQ(eligible, 1) << "mode " << mode;
  EXPECT_EQ(ThpEligible(base->data()), 0) << "MADV_NOHUGEPAGE was not applied";
}

// The pages touched are resident, the rest of a fresh mapping is not (base pages, so no huge page
// fills a whole region at the first touch).
TEST(HostMemory, ResidentBytesCountsTheTouchedPages) {
  const size_t page = HostPageSize();
  Result<HostAllocation> a = HostAllocation::Map(64 * page, "resident test", HostPages::kBase);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->ResidentBytes(), 0u);
  for (size_t p : {0, 7, 63}) a->data()[p * page + 5] = std::byte{1};
  EXPECT_EQ(a->ResidentBytes(), 3 * page);
  EXPECT_EQ(HostAllocation().ResidentBytes(), 0u);
}

TEST(HostMemory, TransparentHugePagesModeIsOneOfTheKernelsWords) {
  const std::string mode = TransparentHugePagesMode();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never" || mode == "unavailable")
      << mode;
}

}  // namespace
}  // namespace ferry
