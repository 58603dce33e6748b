#include "offload/host_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <fstream>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

// A device that only counts host registrations (everything else is unused here).
class CountingDevice final : public Device {
 public:
  struct Registration : HostRegistration {
    explicit Registration(int* live) : live(live) { ++*live; }
    ~Registration() override { --*live; }
    int* live;
  };
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  const std::string& name() const override { return name_; }
  size_t capacity() const override { return 0; }
  Result<DeviceBuffer> Allocate(size_t, std::string_view) override { return Unused(); }
  ArenaStats arena_stats() const override { return {}; }
  std::vector<ArenaRecord> arena_log() const override { return {}; }
  void ResetPeak() override {}
  Result<std::unique_ptr<HostRegistration>> RegisterHost(const HostAllocation& a) override {
    ++registrations;
    registered_bytes += a.size();
    return std::unique_ptr<HostRegistration>(new Registration(&live));
  }
  Result<Event> CreateEvent() override { return Unused(); }
  Status Record(Event&, StreamId) override { return Unused(); }
  Status Wait(StreamId, const Event&) override { return Unused(); }
  Status Synchronize(const Event&) override { return Unused(); }
  Status Synchronize(StreamId) override { return Unused(); }
  Status Synchronize() override { return Unused(); }
  Result<bool> Query(const Event&) override { return Unused(); }
  Result<Event> CreateTimedEvent() override { return Unused(); }
  Result<double> ElapsedSeconds(const Event&, const Event&) override { return Unused(); }
  Status CopyToDevice(DevicePtr<std::byte>, HostSpan, size_t, StreamId) override {
    return Unused();
  }
  Status CopyToHost(HostSpan, DevicePtr<const std::byte>, size_t, StreamId) override {
    return Unused();
  }
  Status Zero(DevicePtr<std::byte>, size_t, StreamId) override { return Unused(); }
  Status LaunchHostFunc(StreamId, std::function<Status()>) override { return Unused(); }

  int registrations = 0;
  size_t registered_bytes = 0;
  int live = 0;

 private:
  void Free(size_t) override {}
  static Status Unused() { return Status::Unavailable("not used by these tests"); }
  std::string name_ = "counting";
};

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostPool, ExactSizePageAlignedBuffersFromFewMappings) {
  CountingDevice dev;
  HostPoolOptions o;
  o.pinned_budget = 8 * kMiB;
  o.pageable_budget = 8 * kMiB;
  o.chunk_bytes = 4 * kMiB;
  o.devices = {&dev};
  auto pool = HostPool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<HostBlock> blocks;
  for (size_t n : {size_t{1}, size_t{4096}, size_t{5000}, size_t{100000}, kMiB}) {
    auto b = (*pool)->Allocate(n, HostMemoryKind::kPinned, "test");
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % HostPageSize(), 0u);
    std::memset(b->data(), 0xAB, n);  // writable over its whole size
    blocks.push_back(std::move(b).value());
  }
  const HostPoolStats st = (*pool)->stats(HostMemoryKind::kPinned);
  EXPECT_EQ(st.mappings, 1u);       // all carved from one 4 MiB mapping
  EXPECT_EQ(dev.registrations, 1);  // registered once, when mapped
  EXPECT_EQ(dev.registered_bytes, 4 * kMiB);
  // Disjoint ranges.
  for (size_t i = 0; i + 1 < blocks.size(); ++i) {
    EXPECT_LE(blocks[i].data() + blocks[i].size(), blocks[i + 1].data());
  }
  // Freed space is coalesced and reused.
  blocks.clear();
  EXPECT_EQ((*pool)->stats(HostMemoryKind::kPinned).in_use, 0u);
  auto big = (*pool)->Allocate(4 * kMiB, HostMemoryKind::kPinned, "big");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ((*pool)->stats(HostMemoryKind::kPinned).mappings, 1u);
  big = HostBlock();
  pool->reset();
  EXPECT_EQ(dev.live, 0) << "registrations must be undone when the pool goes";
}

TEST(HostPool, BudgetsArePerKindAndRefusalsNameEverything) {
  HostPoolOptions o;
  o.pinned_budget = 2 * kMiB;
  o.pageable_budget = 3 * kMiB;
  auto pool = HostPool::Create(o);
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(2 * kMiB, HostMemoryKind::kPinned, "bf16 weights");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = (*pool)->Allocate(1, HostMemoryKind::kPinned, "grad landing");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  const std::string m = b.status().message();
  for (const char* part : {"'grad landing'", "1 bytes", "pinned", "in use 2 MiB", "budget 2 MiB"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " missing from: " << m;
  }
  // The pageable budget is separate.
  auto c = (*pool)->Allocate(3 * kMiB, HostMemoryKind::kPageable, "adam m");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*pool)->stats(HostMemoryKind::kPageable).in_use, 3 * kMiB);
  EXPECT_EQ((*pool)->Allocate(1, HostMemoryKind::kPageable, "x").status().code(),
            StatusCode::kOutOfMemory);
}

TEST(HostPool, NumaPlacement) {
  const int nodes = HostPool::NumaNodes();
  HostPoolOptions o;
  o.pageable_budget = kMiB;
  o.numa_node = 0;
  auto pool = HostPool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto b = (*pool)->Allocate(100000, HostMemoryKind::kPageable, "numa");
  ASSERT_TRUE(b.ok()) << b.status().ToString();  // mbind to node 0 works on any machine
  o.numa_node = nodes;
  EXPECT_EQ(HostPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  if (nodes == 1) {
    EXPECT_NE((*pool)->numa_report().find("1 NUMA node"), std::string::npos);
    GTEST_SKIP() << "this machine has 1 NUMA node: binding to a second node cannot be tested ("
                 << (*pool)->numa_report() << ")";
  }
}

// In a child process: drops CAP_IPC_LOCK and lowers RLIMIT_MEMLOCK to 64 KiB, so locking is
// bound by the limit as for an ordinary user. Returns "" or a "SKIP: " reason.
std::string LimitLockingTo64KiB() {
  if (!testing::DropCapability(CAP_IPC_LOCK)) return "SKIP: cannot drop CAP_IPC_LOCK";
  rlimit rl{64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "SKIP: cannot lower RLIMIT_MEMLOCK";
  return "";
}

TEST(HostPool, LockLimitIsReportedWithTheFix) {
  const std::string msg = testing::RunInChild([]() -> std::string {
    if (std::string skip = LimitLockingTo64KiB(); !skip.empty()) return skip;
    HostPoolOptions o;
    o.pinned_budget = 4 * kMiB;
    auto pool = HostPool::Create(o);
    if (!pool.ok()) return pool.status().ToString();
    auto b = (*pool)->Allocate(kMiB, HostMemoryKind::kPinned, "upload staging");
    if (b.ok()) {
      // ASan replaces mlock with a no-op: nothing is locked, so no limit can be hit.
      std::ifstream status("/proc/self/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmLck:", 0) == 0 && line.find(" 0 kB") != std::string::npos) {
          return "SKIP: mlock does nothing in this build (sanitizer interceptor), so the "
                 "memory-lock limit cannot be hit";
        }
      }
      return "locking 4 MiB under a 64 KiB limit succeeded";
    }
    const std::string m = b.status().message();
    for (const char* part :
         {"'upload staging'", "RLIMIT_MEMLOCK is 64 KiB", "ulimit -l", "limits.conf"}) {
      if (m.find(part) == std::string::npos) return std::string(part) + " missing from: " + m;
    }
    return "";
  });
  if (msg.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << msg.substr(6);
  EXPECT_EQ(msg, "");
}

// Without lock_pinned (CPU devices only), pinned buffers need no memory-lock allowance: under a
// 64 KiB RLIMIT_MEMLOCK without CAP_IPC_LOCK, 1 MiB of pinned memory is still handed out (and
// registered with the devices).
TEST(HostPool, UnlockedPinnedMemoryNeedsNoLockLimit) {
  const std::string msg = testing::RunInChild([]() -> std::string {
    if (std::string skip = LimitLockingTo64KiB(); !skip.empty()) return skip;
    HostPoolOptions o;
    o.pinned_budget = 4 * kMiB;
    o.lock_pinned = false;
    auto pool = HostPool::Create(o);
    if (!pool.ok()) return pool.status().ToString();
    auto b = (*pool)->Allocate(kMiB, HostMemoryKind::kPinned, "upload staging");
    return b.ok() ? "" : b.status().ToString();
  });
  if (msg.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << msg.substr(6);
  EXPECT_EQ(msg, "");
}

}  // namespace
}  // namespace ferry
