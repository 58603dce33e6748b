// CpuDevice semantics: the contract of kernels/device.h, shaken with random delays.
#include "kernels/cpu/cpu_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace ferry {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<CpuDevice> MakeDevice(std::string name = "cpu0", size_t bytes = 1 << 20,
                                      uint32_t max_delay_us = 0, uint64_t seed = 1, double up = 0,
                                      double down = 0) {
  CpuDeviceOptions o;
  o.name = std::move(name);
  o.memory_bytes = bytes;
  o.max_random_delay_us = max_delay_us;
  o.random_delay_seed = seed;
  o.upload_bytes_per_s = up;
  o.download_bytes_per_s = down;
  o.compute_threads = 2;
  auto d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

HostAllocation MapHost(size_t bytes) {
  auto a = HostAllocation::Map(bytes, "test host memory");
  EXPECT_TRUE(a.ok());
  return std::move(a).value();
}

// A gate a stream task can block on until the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  Status Pass() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
    return Status::Ok();
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(CpuDevice, RejectsBadOptions) {
  CpuDeviceOptions o;
  o.memory_bytes = 0;
  EXPECT_EQ(CpuDevice::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.memory_bytes = 1 << 20;
  o.compute_threads = 0;
  EXPECT_EQ(CpuDevice::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.compute_threads = 1;
  o.alignment = 100;
  EXPECT_EQ(CpuDevice::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuDevice, CopiesRoundTrip) {
  auto dev = MakeDevice();
  HostAllocation host = MapHost(1000);
  for (int i = 0; i < 1000; ++i) host.data()[i] = std::byte(i * 7);
  auto buf = dev->Allocate(1000, "x");
  ASSERT_TRUE(buf.ok());
  HostAllocation back = MapHost(1000);
  ASSERT_TRUE(dev->CopyToDevice(buf->data(), host.Span(0, 1000), 1000).ok());
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(dev->Record(*ev, StreamId::kUpload).ok());
  ASSERT_TRUE(dev->Wait(StreamId::kDownload, *ev).ok());
  ASSERT_TRUE(dev->CopyToHost(back.Span(0, 1000), buf->data(), 1000).ok());
  ASSERT_TRUE(dev->Synchronize(StreamId::kDownload).ok());
  EXPECT_EQ(std::memcmp(host.data(), back.data(), 1000), 0);
}

// The arena is host memory filled as used: what a run's report counts as the device's share of
// the process's resident set is the pages written, not the capacity.
TEST(CpuDevice, HostResidentBytesAreTheArenasFilledPages) {
  auto dev = MakeDevice();
  ASSERT_GE(dev->capacity(), size_t(64) * HostPageSize());
  const size_t before = dev->host_resident_bytes();
  EXPECT_LT(before, dev->capacity());
  HostAllocation host = MapHost(HostPageSize());
  auto buf = dev->Allocate(HostPageSize(), "x");
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(dev->CopyToDevice(buf->data(), host.Whole(), HostPageSize()).ok());
  ASSERT_TRUE(dev->Synchronize(StreamId::kUpload).ok());
  const size_t after = dev->host_resident_bytes();
  EXPECT_GE(after, HostPageSize());
  EXPECT_LT(after, dev->capacity());
}

// As cudaHostRegister (cudaErrorHostMemoryAlreadyRegistered): a host range is registered with a
// device once; the second registration is refused naming the allocation, and the range may be
// registered again once its registration is gone. Other ranges, and other devices, are unaffected.
TEST(CpuDevice, RegistersAHostRangeOnce) {
  auto dev = MakeDevice("cpu0");
  auto other = MakeDevice("cpu1");
  HostAllocation a = MapHost(3 * 4096), b = MapHost(4096);
  auto first = dev->RegisterHost(a);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto twice = dev->RegisterHost(a);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kFailedPrecondition);
  for (const char* part : {"cpu0", "'test host memory'", "already registered", "12288 bytes"}) {
    EXPECT_NE(twice.status().message().find(part), std::string::npos)
        << part << ": " << twice.status().ToString();
  }
  auto next = dev->RegisterHost(b);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  auto elsewhere = other->RegisterHost(a);
  EXPECT_TRUE(elsewhere.ok()) << elsewhere.status().ToString();
  first->reset();  // unregisters
  auto again = dev->RegisterHost(a);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  HostAllocation empty;
  EXPECT_EQ(dev->RegisterHost(empty).status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuDevice, RejectsPointersOutsideItsMemoryAndShortSpans) {
  auto a = MakeDevice("a");
  auto b = MakeDevice("b");
  auto buf_b = b->Allocate(256, "on b");
  ASSERT_TRUE(buf_b.ok());
  HostAllocation host = MapHost(256);
  Status s = a->CopyToDevice(buf_b->data(), host.Span(0, 256), 256);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside device 'a'"), std::string::npos) << s.ToString();
  auto buf_a = a->Allocate(256, "on a");
  ASSERT_TRUE(buf_a.ok());
  EXPECT_EQ(a->CopyToDevice(buf_a->data(), host.Span(0, 100), 256).code(),
            StatusCode::kInvalidArgument);
}

TEST(CpuDevice, ArenaCapFailsWithRequesterSizeAndCap) {
  auto dev = MakeDevice("cpu7", 4096);
  auto ok = dev->Allocate(4096, "fills it");
  ASSERT_TRUE(ok.ok());
  auto over = dev->Allocate(1, "one more byte");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(over.status().message().find("one more byte"), std::string::npos);
  EXPECT_NE(over.status().message().find("cpu7"), std::string::npos);
  EXPECT_NE(over.status().message().find("4096"), std::string::npos);
  EXPECT_EQ(dev->arena_stats().peak, 4096u);
}

TEST(CpuDevice, WaitOnNeverRecordedEventIsNoOp) {
  auto dev = MakeDevice();
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(dev->Wait(StreamId::kCompute, *ev).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kCompute,
                                  [&] {
                                    ran = true;
                                    return Status::Ok();
                                  })
                  .ok());
  EXPECT_TRUE(dev->Synchronize(StreamId::kCompute).ok());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(dev->Query(*ev).value());
  EXPECT_TRUE(dev->Synchronize(*ev).ok());
}

// A timed event's time is when its stream reached it, not when the host enqueued it: a record
// behind a held task is stamped after the task ran.
TEST(CpuDevice, TimedEventsMeasureWhenTheStreamReachesThem) {
  auto d = MakeDevice();
  auto a = d->CreateTimedEvent(), b = d->CreateTimedEvent(), plain = d->CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && plain.ok());
  EXPECT_EQ(d->ElapsedSeconds(*a, *b).status().code(), StatusCode::kFailedPrecondition);
  Gate gate;
  ASSERT_TRUE(d->Record(*a, StreamId::kCompute).ok());
  ASSERT_TRUE(d->LaunchHostFunc(StreamId::kCompute, [&] { return gate.Pass(); }).ok());
  ASSERT_TRUE(d->Record(*b, StreamId::kCompute).ok());
  EXPECT_EQ(d->ElapsedSeconds(*a, *b).status().code(), StatusCode::kFailedPrecondition);
  std::this_thread::sleep_for(20ms);
  gate.Open();
  ASSERT_TRUE(d->Synchronize(*b).ok());
  auto ab = d->ElapsedSeconds(*a, *b), ba = d->ElapsedSeconds(*b, *a);
  ASSERT_TRUE(ab.ok() && ba.ok()) << ab.status().ToString();
  EXPECT_GE(*ab, 0.015);
  EXPECT_EQ(*ba, -*ab);
  // As CUDA: untimed events and another device's events are refused.
  ASSERT_TRUE(d->Record(*plain, StreamId::kCompute).ok());
  ASSERT_TRUE(d->Synchronize().ok());
  EXPECT_EQ(d->ElapsedSeconds(*a, *plain).status().code(), StatusCode::kInvalidArgument);
  auto other = MakeDevice("cpu1");
  auto c = other->CreateTimedEvent();
  ASSERT_TRUE(c.ok() && other->Record(*c, StreamId::kUpload).ok() && other->Synchronize().ok());
  EXPECT_EQ(d->ElapsedSeconds(*a, *c).status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuDevice, WaitUsesTheRecordAtEnqueueTime) {
  auto dev = MakeDevice();
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(ev.ok());
  // 1) A wait enqueued after record #1 waits for record #1 even if the event is re-recorded on
  //    a stream that completes at once.
  Gate gate1;
  std::atomic<bool> slow_done{false};
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kUpload,
                                  [&] {
                                    Status s = gate1.Pass();
                                    slow_done = true;
                                    return s;
                                  })
                  .ok());
  ASSERT_TRUE(dev->Record(*ev, StreamId::kUpload).ok());
  ASSERT_TRUE(dev->Wait(StreamId::kCompute, *ev).ok());
  ASSERT_TRUE(dev->Record(*ev, StreamId::kDownload).ok());  // completes immediately
  std::atomic<bool> saw_slow_done{false};
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kCompute,
                                  [&] {
                                    saw_slow_done = slow_done.load();
                                    return Status::Ok();
                                  })
                  .ok());
  std::this_thread::sleep_for(5ms);
  gate1.Open();
  ASSERT_TRUE(dev->Synchronize(StreamId::kCompute).ok());
  EXPECT_TRUE(saw_slow_done);

  // 2) A later record does not extend a wait already enqueued.
  ASSERT_TRUE(dev->Record(*ev, StreamId::kUpload).ok());  // completes quickly
  ASSERT_TRUE(dev->Wait(StreamId::kCompute, *ev).ok());
  Gate gate2;
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kUpload, [&] { return gate2.Pass(); }).ok());
  ASSERT_TRUE(dev->Record(*ev, StreamId::kUpload).ok());   // blocked behind gate2
  EXPECT_TRUE(dev->Synchronize(StreamId::kCompute).ok());  // must not deadlock on gate2
  EXPECT_FALSE(dev->Query(*ev).value());                   // the latest record is still pending
  gate2.Open();
  EXPECT_TRUE(dev->Synchronize(*ev).ok());
  EXPECT_TRUE(dev->Query(*ev).value());
}

// A producer/consumer pipeline across streams and two devices under random delays: each
// consumer step checks that what it reads was completely produced. A missing or misordered
// wait shows up as a wrong value.
TEST(CpuDevice, RandomizedCrossStreamAndCrossDeviceOrdering) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    auto a = MakeDevice("a", 1 << 20, 300, seed);
    auto b = MakeDevice("b", 1 << 20, 300, seed + 100);
    constexpr int kSteps = 24;
    constexpr size_t kBytes = 4096;
    HostAllocation in = MapHost(kSteps * kBytes);
    HostAllocation mid = MapHost(kSteps * kBytes);
    HostAllocation out = MapHost(kSteps * kBytes);
    for (int i = 0; i < kSteps; ++i) std::memset(in.data() + i * kBytes, i + 1, kBytes);
    auto buf_a = a->Allocate(kBytes, "a.buf");
    auto buf_b = b->Allocate(kBytes, "b.buf");
    ASSERT_TRUE(buf_a.ok() && buf_b.ok());
    auto uploaded = a->CreateEvent(), computed = a->CreateEvent(), downloaded = a->CreateEvent();
    auto b_up = b->CreateEvent(), b_done = b->CreateEvent();
    ASSERT_TRUE(uploaded.ok() && computed.ok() && downloaded.ok() && b_up.ok() && b_done.ok());
    std::atomic<int> bad{0};
    for (int i = 0; i < kSteps; ++i) {
      // a: upload step i (after the previous download freed the buffer), check on compute,
      // download into `mid`.
      ASSERT_TRUE(a->Wait(StreamId::kUpload, *downloaded).ok());
      ASSERT_TRUE(a->CopyToDevice(buf_a->data(), in.Span(i * kBytes, kBytes), kBytes).ok());
      ASSERT_TRUE(a->Record(*uploaded, StreamId::kUpload).ok());
      ASSERT_TRUE(a->Wait(StreamId::kDownload, *uploaded).ok());
      ASSERT_TRUE(a->CopyToHost(mid.Span(i * kBytes, kBytes), buf_a->data(), kBytes).ok());
      ASSERT_TRUE(a->Record(*downloaded, StreamId::kDownload).ok());
      // b: waits for a's download (cross-device event), uploads `mid`, checks it on compute.
      ASSERT_TRUE(b->Wait(StreamId::kUpload, *downloaded).ok());
      ASSERT_TRUE(b->Wait(StreamId::kUpload, *b_done).ok());
      ASSERT_TRUE(b->CopyToDevice(buf_b->data(), mid.Span(i * kBytes, kBytes), kBytes).ok());
      ASSERT_TRUE(b->Record(*b_up, StreamId::kUpload).ok());
      ASSERT_TRUE(b->Wait(StreamId::kDownload, *b_up).ok());
      ASSERT_TRUE(b->CopyToHost(out.Span(i * kBytes, kBytes), buf_b->data(), kBytes).ok());
      ASSERT_TRUE(b->Record(*b_done, StreamId::kDownload).ok());
      const std::byte* expect_at = out.data() + i * kBytes;
      ASSERT_TRUE(b->Wait(StreamId::kCompute, *b_done).ok());
      ASSERT_TRUE(b->LaunchHostFunc(StreamId::kCompute, [&bad, expect_at, i] {
                     for (size_t k = 0; k < kBytes; ++k) {
                       if (expect_at[k] != std::byte(i + 1)) {
                         ++bad;
                         break;
                       }
                     }
                     return Status::Ok();
                   }).ok());
    }
    ASSERT_TRUE(a->Synchronize().ok());
    ASSERT_TRUE(b->Synchronize().ok());
    EXPECT_EQ(bad.load(), 0) << "seed " << seed;
    for (int i = 0; i < kSteps; ++i) {
      ASSERT_EQ(out.data()[i * kBytes + kBytes - 1], std::byte(i + 1)) << i;
    }
  }
}

TEST(CpuDevice, ErrorInStreamSurfacesAtNextWaitAndPoisons) {
  auto dev = MakeDevice("cpu0", 1 << 20, 50, 3);
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(ev.ok());
  std::atomic<bool> later_ran{false};
  ASSERT_TRUE(
      dev->LaunchHostFunc(StreamId::kCompute, [] { return Status::IOError("injected failure"); })
          .ok());
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kCompute,
                                  [&] {
                                    later_ran = true;
                                    return Status::Ok();
                                  })
                  .ok());
  ASSERT_TRUE(dev->Record(*ev, StreamId::kCompute).ok());
  // Another stream that waits on the failed work is poisoned too.
  ASSERT_TRUE(dev->Wait(StreamId::kDownload, *ev).ok());
  std::atomic<bool> download_ran{false};
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kDownload,
                                  [&] {
                                    download_ran = true;
                                    return Status::Ok();
                                  })
                  .ok());

  Status s = dev->Synchronize(*ev);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("injected failure"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("cpu0/compute"), std::string::npos) << s.ToString();
  EXPECT_EQ(dev->Synchronize(StreamId::kDownload).code(), StatusCode::kIOError);
  EXPECT_FALSE(later_ran);
  EXPECT_FALSE(download_ran);
  EXPECT_TRUE(dev->Synchronize(StreamId::kUpload).ok());  // untouched stream stays healthy

  // The device-wide synchronize reports the first error once and clears it.
  Status first = dev->Synchronize();
  EXPECT_EQ(first.code(), StatusCode::kIOError);
  EXPECT_NE(first.message().find("cpu0/compute"), std::string::npos) << first.ToString();
  EXPECT_TRUE(dev->Synchronize().ok());
  ASSERT_TRUE(dev->LaunchHostFunc(StreamId::kCompute,
                                  [&] {
                                    later_ran = true;
                                    return Status::Ok();
                                  })
                  .ok());
  EXPECT_TRUE(dev->Synchronize(StreamId::kCompute).ok());
  EXPECT_TRUE(later_ran);
}

TEST(CpuDevice, LinkModelThrottlesCopies) {
  // 1 MiB at 20 MiB/s takes at least 50 ms; the link model sleeps until then. (A lower bound
  // only: it cannot flake on a slow machine.)
  auto dev = MakeDevice("cpu0", 2 << 20, 0, 1, 20.0 * (1 << 20), 0);
  HostAllocation host = MapHost(1 << 20);
  auto buf = dev->Allocate(1 << 20, "x");
  ASSERT_TRUE(buf.ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(dev->CopyToDevice(buf->data(), host.Whole(), 1 << 20).ok());
  ASSERT_TRUE(dev->Synchronize(StreamId::kUpload).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.049);
  // Two copies on two streams in the same direction share the link: 2 x 0.5 MiB >= 50 ms too.
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      dev->CopyToDevice(buf->data(), host.Span(0, 1 << 19), 1 << 19, StreamId::kUpload).ok());
  ASSERT_TRUE(dev->CopyToDevice(buf->data() + (1 << 19), host.Span(1 << 19, 1 << 19), 1 << 19,
                                StreamId::kCompute)
                  .ok());
  ASSERT_TRUE(dev->Synchronize().ok());
  const double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_GE(s2, 0.049);
}

TEST(CpuDevice, ComputeRunsOnTheDevicePool) {
  auto dev = MakeDevice();
  std::atomic<int> pool_size{0};
  ASSERT_TRUE(dev->EnqueueCompute("probe",
                                  [&](ThreadPool& p) {
                                    pool_size = p.size();
                                    std::atomic<int64_t> sum{0};
                                    p.ParallelFor(1000, 10, [&](int64_t b, int64_t e, int) {
                                      for (int64_t i = b; i < e; ++i) sum += i;
                                    });
                                    return sum == 999 * 1000 / 2 ? Status::Ok()
                                                                 : Status::Internal("wrong sum");
                                  })
                  .ok());
  EXPECT_TRUE(dev->Synchronize().ok());
  EXPECT_EQ(pool_size.load(), 2);
}

}  // namespace
}  // namespace ferry
