#include "engine/plan/hardware_profile.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/json.h"

namespace ferry::plan {
namespace {

namespace fs = std::filesystem;

constexpr char kMinimal[] = R"({
  "name": "test box",
  "gpu": {"model": "RTX 4090", "count": 2, "memory_label_bytes": "24GiB",
          "memory_reserve_bytes": "1GiB", "bf16_flops": 165e12, "matmul_efficiency": 0.65,
          "memory_bandwidth": 1008e9, "peer_access": false},
  "pcie": {"generation": 4, "lanes": 16, "h2d_pinned": 23.2e9, "d2h_pinned": 26e9,
           "h2d_pageable": 16e9, "d2h_pageable": 10.7e9},
  "host": {"ram_bytes": "128GiB", "ram_usable_bytes": "120GiB", "memory_bandwidth": 60e9,
           "numa_nodes": 1, "cpu_cores": 16},
  "nvme": {"space_bytes": "2TB", "read_rate": 7e9, "write_rate": 6.6e9},
  "optimizer": {"cpu_adamw_params_per_s": 1.6e9}
})";

TEST(HardwareProfile, ParsesSizesAsStringsAndFillsDefaults) {
  Result<HardwareProfile> p = ParseHardwareProfile(kMinimal, "minimal.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->gpu.count, 2);
  EXPECT_EQ(p->gpu.memory_label_bytes, 24ull << 30);
  EXPECT_EQ(p->gpu.memory_usable_bytes, 23ull << 30);  // label - reserve when not given
  EXPECT_DOUBLE_EQ(p->gpu.fp16_fp16acc_flops, 0.0);    // unknown
  EXPECT_EQ(p->host.ram_usable_bytes, 120ull << 30);
  EXPECT_EQ(p->nvme.space_bytes, 2'000'000'000'000u);
  EXPECT_DOUBLE_EQ(p->nvme.sustained_write_rate, 6.6e9);  // defaults to the write rate
  EXPECT_FALSE(p->HasNvme());                             // no directory named
  EXPECT_DOUBLE_EQ(p->gpu.EffectiveBf16Flops(), 165e12 * 0.65);
  EXPECT_DOUBLE_EQ(p->host_links.shared_bandwidth_per_node, 0.0);  // optional: no cap
}

TEST(HardwareProfile, HostLinksAndTheFp16AccumulateRateRoundTrip) {
  std::string text = kMinimal;
  text.replace(text.find(R"("nvme": {)"), 9,
               R"("host_links": {"shared_bandwidth_per_node": 150e9, "source": "datasheet"},
                  "nvme": {)");
  text.replace(text.find(R"("bf16_flops": 165e12)"), 20,
               R"("bf16_flops": 165e12, "fp16_fp16acc_flops": 330e12)");
  Result<HardwareProfile> p = ParseHardwareProfile(text, "links.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_DOUBLE_EQ(p->host_links.shared_bandwidth_per_node, 150e9);
  EXPECT_EQ(p->host_links.source, "datasheet");
  EXPECT_DOUBLE_EQ(p->gpu.EffectiveFlops(true), 330e12 * 0.65);
  EXPECT_DOUBLE_EQ(p->gpu.EffectiveFlops(false), 165e12 * 0.65);
  Result<HardwareProfile> q = ParseHardwareProfile(HardwareProfileToJson(*p), "again.json");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(HardwareProfileToJson(*p), HardwareProfileToJson(*q));
}

TEST(HardwareProfile, ErrorsNameTheField) {
  struct Case {
    const char* from;
    const char* to;
    const char* field;
  };
  const Case cases[] = {
      {R"("count": 2)", R"("count": "two")", "gpu.count"},
      // Found while writing tests/fuzz: a count beyond int used to wrap (2^32 + 2 read as 2).
      {R"("count": 2)", R"("count": 4294967298)", "gpu.count"},
      {R"("numa_nodes": 1)", R"("numa_nodes": 18446744073709551615)", "host.numa_nodes"},
      {R"("memory_label_bytes": "24GiB")", R"("memory_label_bytes": "24 furlongs")",
       "gpu.memory_label_bytes"},
      {R"("h2d_pinned": 23.2e9, )", "", "pcie.h2d_pinned"},
      {R"("matmul_efficiency": 0.65)", R"("matmul_efficiency": 1.5)", "gpu.matmul_efficiency"},
      {R"("ram_usable_bytes": "120GiB")", R"("ram_usable_bytes": "200GiB")",
       "host.ram_usable_bytes"},
      {R"("numa_nodes": 1)", R"("numa_nodes": 0)", "host.numa_nodes"},
      {R"("cpu_adamw_params_per_s": 1.6e9)", R"("cpu_adamw_params_per_s": -1)",
       "optimizer.cpu_adamw_params_per_s"},
      {R"("nvme": {)", R"("host_links": {"shared_bandwidth_per_node": -1}, "nvme": {)",
       "host_links.shared_bandwidth_per_node"},
      {R"("nvme": {)", R"("host_links": {"source": "no number"}, "nvme": {)",
       "host_links.shared_bandwidth_per_node"},
  };
  for (const Case& c : cases) {
    std::string text = kMinimal;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, std::string(c.from).size(), c.to);
    Result<HardwareProfile> p = ParseHardwareProfile(text, "bad.json");
    ASSERT_FALSE(p.ok()) << "accepted a bad " << c.field;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.field), std::string::npos) << p.status().ToString();
    EXPECT_NE(p.status().message().find("bad.json"), std::string::npos) << p.status().ToString();
  }
}

TEST(HardwareProfile, RejectsMalformedJson) {
  Result<HardwareProfile> p = ParseHardwareProfile("{\"gpu\": ", "broken.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("not valid JSON"), std::string::npos);
}

TEST(HardwareProfile, SaveLoadRoundTrip) {
  Result<HardwareProfile> p = ParseHardwareProfile(kMinimal, "minimal.json");
  ASSERT_TRUE(p.ok());
  p->nvme.dir = "/scratch/ferry";
  p->gpu.source = "measured";
  const fs::path path = fs::temp_directory_path() / "ferry_hardware_profile_test.json";
  ASSERT_TRUE(SaveHardwareProfile(*p, path.string()).ok());
  Result<HardwareProfile> q = LoadHardwareProfile(path.string());
  fs::remove(path);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(HardwareProfileToJson(*p), HardwareProfileToJson(*q));
  EXPECT_EQ(q->nvme.dir, "/scratch/ferry");
  EXPECT_TRUE(q->HasNvme());
}

TEST(HardwareProfile, MissingFileIsNotFound) {
  Result<HardwareProfile> p = LoadHardwareProfile("/nonexistent/ferry/profile.json");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
}

TEST(BudgetOverrides, LowerBudgetsAndNameNvme) {
  Result<HardwareProfile> p = ParseHardwareProfile(kMinimal, "minimal.json");
  ASSERT_TRUE(p.ok());
  Result<BudgetOverrides> o = ParseBudgetOverrides("20GiB", "64GiB", "/nvme/ferry", "500GB");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_TRUE(ApplyBudgetOverrides(*o, *p).ok());
  EXPECT_EQ(p->gpu.memory_usable_bytes, 20ull << 30);
  EXPECT_EQ(p->host.ram_usable_bytes, 64ull << 30);
  EXPECT_EQ(p->nvme.dir, "/nvme/ferry");
  EXPECT_EQ(p->nvme.space_bytes, 500'000'000'000u);
  EXPECT_TRUE(p->HasNvme());
}

TEST(BudgetOverrides, EmptyStringsLeaveTheProfileAlone) {
  Result<BudgetOverrides> o = ParseBudgetOverrides("", "", "", "");
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->gpu_memory || o->host_memory || o->nvme_dir || o->nvme_space);
}

TEST(BudgetOverrides, RejectsImpossibleBudgets) {
  Result<HardwareProfile> p = ParseHardwareProfile(kMinimal, "minimal.json");
  ASSERT_TRUE(p.ok());
  Result<BudgetOverrides> bad_size = ParseBudgetOverrides("lots", "", "", "");
  ASSERT_FALSE(bad_size.ok());
  EXPECT_NE(bad_size.status().message().find("--gpu-memory"), std::string::npos);

  BudgetOverrides too_big;
  too_big.gpu_memory = 30ull << 30;
  Status s = ApplyBudgetOverrides(too_big, *p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds"), std::string::npos);

  BudgetOverrides more_ram;
  more_ram.host_memory = 256ull << 30;
  EXPECT_EQ(ApplyBudgetOverrides(more_ram, *p).code(), StatusCode::kInvalidArgument);

  BudgetOverrides space_without_dir;
  space_without_dir.nvme_space = 1ull << 40;
  s = ApplyBudgetOverrides(space_without_dir, *p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--nvme-dir"), std::string::npos);
}

// Every shipped profile loads, validates, and holds its documented invariants.
TEST(HardwareProfile, ShippedProfilesLoad) {
  const char* root = std::getenv("FERRY_SOURCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "FERRY_SOURCE_DIR is not set (run through ctest)";
  const fs::path dir = fs::path(root) / "configs" / "hardware";
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    Result<HardwareProfile> p = LoadHardwareProfile(entry.path().string());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->gpu.memory_usable_bytes + p->gpu.memory_reserve_bytes, p->gpu.memory_label_bytes)
        << entry.path();
    EXPECT_FALSE(p->gpu.source.empty() || p->pcie.source.empty() || p->host.source.empty() ||
                 p->nvme.source.empty() || p->optimizer.source.empty())
        << entry.path() << ": every field group says where its numbers came from";
    EXPECT_TRUE(p->host_links.shared_bandwidth_per_node == 0 || !p->host_links.source.empty())
        << entry.path() << ": a host-link cap cites its source";
    EXPECT_GT(p->pcie.d2h_pinned, p->pcie.d2h_pageable) << entry.path();
    // AdamW moves 30 bytes per parameter at 80% of the host bandwidth (configs/hardware/README).
    EXPECT_NEAR(p->optimizer.cpu_adamw_params_per_s, p->host.memory_bandwidth * 0.8 / 30,
                1e6 /* rounded to a million in the file */)
        << entry.path();
    ++loaded;
  }
  EXPECT_EQ(loaded, 6);
}

}  // namespace
}  // namespace ferry::plan
