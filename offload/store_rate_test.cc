#include "offload/store_rate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

TEST(MeasureStoreRate, ReportsBothRatesAndKeepsTheFileForComparisons) {
  testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto o = testing::SmallStoreOptions(dir.path() + "/store", StoreBackend::kAuto);
  o.block_bytes = 256 << 10;
  size_t seen_bytes = 0;
  auto rate = MeasureStoreRate(o, (4 << 20) + 1000, [&](const std::string& path, size_t n) {
    EXPECT_EQ(std::filesystem::file_size(path), n);
    seen_bytes = n;
  });
  ASSERT_TRUE(rate.ok()) << rate.status().ToString();
  EXPECT_GT(rate->write_bytes_per_s, 0.0);
  EXPECT_GT(rate->read_bytes_per_s, 0.0);
  EXPECT_FALSE(rate->backend.empty());
  EXPECT_EQ(seen_bytes, size_t{(4 << 20) + (256 << 10)});  // rounded up to whole blocks
}

TEST(MeasureStoreRate, BeforeTimingSeesTheLaidOutFileAndMayOverwriteIt) {
  testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto o = testing::SmallStoreOptions(dir.path() + "/store", StoreBackend::kAuto);
  std::string seen_path;
  auto rate = MeasureStoreRate(o, 1 << 20, nullptr, [&](const std::string& path, size_t n) {
    EXPECT_EQ(std::filesystem::file_size(path), n);
    seen_path = path;
    // What fio would do: overwrite the file; the store's timed write and check come after.
    std::ofstream(path, std::ios::binary | std::ios::in) << std::string(n, 'x');
  });
  ASSERT_TRUE(rate.ok()) << rate.status().ToString();
  EXPECT_FALSE(seen_path.empty());
}

}  // namespace
}  // namespace ferry
