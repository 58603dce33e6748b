// CpuDevice under a VirtualClock: every stream operation takes its virtual duration, a stream's
// time follows its order, its waits and the host's synchronizations, and timed events report
// those times exactly, whatever the real timing (the devices run with random delays).
#include "kernels/cpu/virtual_clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/gemm.h"
#include "kernels/testing/device_staging.h"

namespace ferry {
namespace {

constexpr double kFlopsPerS = 1e9;        // a kernel of 1e6 flops takes 1 ms
constexpr double kBytesPerS = 1e10;       // memory traffic: 1e7 bytes take 1 ms
constexpr double kUp = 1e6, kDown = 2e6;  // link rates: 1000 bytes up take 1 ms, down 0.5 ms

double Cost(std::string_view, const KernelWork& w) {
  return w.flops / kFlopsPerS + w.bytes / kBytesPerS;
}

std::unique_ptr<CpuDevice> MakeDevice(std::string name, VirtualClock* clock, uint64_t seed) {
  auto d = CpuDevice::Create({.name = std::move(name),
                              .memory_bytes = size_t(1) << 20,
                              .upload_bytes_per_s = kUp,
                              .download_bytes_per_s = kDown,
                              .max_random_delay_us = 300,
                              .random_delay_seed = seed,
                              .virtual_clock = clock});
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

Event Timed(Device& d) {
  Result<Event> e = d.CreateTimedEvent();
  EXPECT_TRUE(e.ok());
  return std::move(e).value();
}

// A kernel of `ms` virtual milliseconds on d's compute stream (it does nothing for real).
Status Kernel(CpuDevice& d, double ms) {
  return d.EnqueueCompute("test kernel", [](ThreadPool&) { return Status::Ok(); },
                          {.flops = ms * 1e-3 * kFlopsPerS, .bytes = 0});
}

double Ms(Result<double> seconds) {
  EXPECT_TRUE(seconds.ok()) << seconds.status().ToString();
  return seconds.ok() ? *seconds * 1e3 : -1;
}

// One scenario, run under several seeds of random delays: the virtual times never change.
TEST(VirtualClock, StreamTimesFollowOrderWaitsAndTheHost) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    VirtualClock clock(&Cost);
    auto a = MakeDevice("a", &clock, seed);
    auto b = MakeDevice("b", &clock, seed + 10);
    Result<HostAllocation> host = HostAllocation::Map(4096, "test host");
    ASSERT_TRUE(host.ok());
    Result<DeviceBuffer> buf = a->Allocate(4096, "test");
    ASSERT_TRUE(buf.ok());
    const HostSpan span = host->Span(0, host->size());

    Event a0 = Timed(*a), a1 = Timed(*a), up = Timed(*a), up2 = Timed(*a), a3 = Timed(*a);
    Event down = Timed(*a), b0 = Timed(*b), b1 = Timed(*b);
    ASSERT_TRUE(a->Record(a0, StreamId::kCompute).ok());
    ASSERT_TRUE(Kernel(*a, 2).ok());
    ASSERT_TRUE(a->Record(a1, StreamId::kCompute).ok());  // 2 ms
    ASSERT_TRUE(a->CopyToDevice(buf->data(), span, 1000).ok());
    ASSERT_TRUE(a->Record(up, StreamId::kUpload).ok());  // 1 ms: the upload ran beside the kernel
    ASSERT_TRUE(a->Wait(StreamId::kUpload, a1).ok());
    ASSERT_TRUE(a->CopyToDevice(buf->data(), span, 1000).ok());
    ASSERT_TRUE(a->Record(up2, StreamId::kUpload).ok());  // after the kernel: 2 + 1 ms
    // Across devices: b's compute waits for a's second upload, then runs 1 ms.
    ASSERT_TRUE(b->Record(b0, StreamId::kCompute).ok());  // 0 ms
    ASSERT_TRUE(b->Wait(StreamId::kCompute, up2).ok());
    ASSERT_TRUE(Kernel(*b, 1).ok());
    ASSERT_TRUE(b->Record(b1, StreamId::kCompute).ok());  // 4 ms

    EXPECT_DOUBLE_EQ(clock.Now(), 0);  // the host has waited for nothing yet
    ASSERT_TRUE(b->Synchronize(b1).ok());
    EXPECT_DOUBLE_EQ(clock.Now() * 1e3, 4);
    // Work enqueued now starts no earlier than the host: a's compute stream is at 2 ms, the host
    // at 4 ms. A host function on a stream sees that stream's time.
    ASSERT_TRUE(a->Record(a3, StreamId::kCompute).ok());       // 4 ms
    ASSERT_TRUE(a->CopyToHost(span, buf->data(), 1000).ok());  // 0.5 ms, from 4 ms
    double seen_s = -1;
    ASSERT_TRUE(a->LaunchHostFunc(StreamId::kDownload, [&] {
                   seen_s = clock.Now();
                   return Status::Ok();
                 }).ok());
    ASSERT_TRUE(a->Record(down, StreamId::kDownload).ok());
    ASSERT_TRUE(a->Zero(buf->data(), 4096, StreamId::kDownload).ok());  // 4096 / 1e10 s
    ASSERT_TRUE(a->Synchronize().ok());

    EXPECT_DOUBLE_EQ(Ms(a->ElapsedSeconds(a0, a1)), 2);
    EXPECT_DOUBLE_EQ(Ms(a->ElapsedSeconds(a0, up)), 1);
    EXPECT_DOUBLE_EQ(Ms(a->ElapsedSeconds(a0, up2)), 3);
    EXPECT_DOUBLE_EQ(Ms(b->ElapsedSeconds(b0, b1)), 4);
    EXPECT_DOUBLE_EQ(Ms(a->ElapsedSeconds(a0, a3)), 4);
    EXPECT_DOUBLE_EQ(Ms(a->ElapsedSeconds(a0, down)), 4.5);
    EXPECT_DOUBLE_EQ(seen_s * 1e3, 4.5);
    EXPECT_DOUBLE_EQ(clock.Now(), 4.5e-3 + 4096 / kBytesPerS);  // the device's last work
  }
}

// An op reaches the clock with its work: a GEMM is priced by its 2*M*N*K flops and its bytes.
TEST(VirtualClock, OpsArePricedByTheirWork) {
  std::vector<std::string> ops;
  std::vector<KernelWork> works;
  VirtualClock clock([&](std::string_view op, const KernelWork& w) {
    ops.emplace_back(op);
    works.push_back(w);
    return Cost(op, w);
  });
  auto d = MakeDevice("a", &clock, 1);
  const int64_t m = 8, n = 16, k = 32;
  testing::DeviceTensor x(*d, DType::kF32, {m, k}, "x"), w(*d, DType::kF32, {n, k}, "w"),
      y(*d, DType::kF32, {m, n}, "y");
  x.Upload(std::vector<float>(size_t(m * k), 1.0f));
  w.Upload(std::vector<float>(size_t(n * k), 1.0f));
  const size_t scratch_bytes = GemmScratchBytes(*d, m, n, k, {});
  testing::DeviceTensor s(*d, DType::kF32, {int64_t(std::max<size_t>(scratch_bytes, 4) / 4)},
                          "scratch");
  Event e0 = Timed(*d), e1 = Timed(*d);
  ASSERT_TRUE(d->Record(e0, StreamId::kCompute).ok());
  GemmArgs g{x.tensor(), w.tensor(), y.tensor(), {}, s.tensor(), false, true};
  ASSERT_TRUE(Gemm(*d, g).ok());
  ASSERT_TRUE(d->Record(e1, StreamId::kCompute).ok());
  ASSERT_TRUE(d->Synchronize().ok());
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0], "gemm");
  EXPECT_DOUBLE_EQ(works[0].flops, 2.0 * m * n * k);
  EXPECT_DOUBLE_EQ(works[0].bytes, 4.0 * (m * k + n * k + m * n));
  // (The records' times are differences of sums: equal to rounding.)
  EXPECT_NEAR(*d->ElapsedSeconds(e0, e1), Cost("gemm", works[0]), 1e-15);
}

}  // namespace
}  // namespace ferry
