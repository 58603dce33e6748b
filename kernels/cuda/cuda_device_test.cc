// CudaDevice against the Device contract (kernels/device.h), and the CUDA element-wise kernels
// against the CPU's conversions. Every test needs a GPU and reports itself skipped without one.
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/arena.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops/gemm.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/gpu_testing.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_GPU();
    device_ = testing::CreateTestCudaDevice(320 * kMiB, kMiB);
    ASSERT_NE(device_, nullptr);
  }

  // Host memory copies can use, registered with the device.
  HostAllocation Pinned(size_t bytes) {
    auto a = HostAllocation::Map(bytes, "test staging");
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    auto reg = device_->RegisterHost(*a);
    EXPECT_TRUE(reg.ok()) << reg.status().ToString();
    a->Attach(std::move(reg).value());
    return std::move(a).value();
  }

  // Uploads host floats stored as `t` into `buffer` (at its start) and waits.
  void Upload(const DeviceBuffer& buffer, DType t, const std::vector<float>& values) {
    HostAllocation staging = Pinned(values.size() * DTypeSize(t));
    ConvertFromFloat(values.data(), t, staging.data(), values.size());
    ASSERT_TRUE(
        device_->CopyToDevice(buffer.data(), staging.Whole(), values.size() * DTypeSize(t)).ok());
    ASSERT_TRUE(device_->Synchronize(StreamId::kUpload).ok());
  }

  // Downloads n elements of dtype `t` as raw bytes after the compute stream's work.
  std::vector<std::byte> DownloadBytes(const DeviceBuffer& buffer, DType t, size_t n) {
    auto done = device_->CreateEvent();
    EXPECT_TRUE(done.ok());
    EXPECT_TRUE(device_->Record(*done, StreamId::kCompute).ok());
    EXPECT_TRUE(device_->Wait(StreamId::kDownload, *done).ok());
    HostAllocation staging = Pinned(n * DTypeSize(t));
    EXPECT_TRUE(
        device_->CopyToHost(staging.Whole(), buffer.data().As<const std::byte>(), n * DTypeSize(t))
            .ok());
    Status st = device_->Synchronize(StreamId::kDownload);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return std::vector<std::byte>(staging.data(), staging.data() + n * DTypeSize(t));
  }

  std::unique_ptr<CudaDevice> device_;
};

TEST_F(CudaDeviceTest, CopiesRoundTripAndZeroFollowsEvents) {
  const size_t n = 3 * kMiB + 7;  // not a multiple of anything
  HostAllocation in = Pinned(n), out = Pinned(n);
  for (size_t i = 0; i < n; ++i) in.data()[i] = std::byte((i * 131 + 7) & 0xff);
  auto buffer = device_->Allocate(n, "roundtrip");
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();

  auto uploaded = device_->CreateEvent();
  auto zeroed = device_->CreateEvent();
  ASSERT_TRUE(uploaded.ok() && zeroed.ok());
  ASSERT_TRUE(device_->CopyToDevice(buffer->data(), in.Whole(), n).ok());
  ASSERT_TRUE(device_->Record(*uploaded, StreamId::kUpload).ok());
  ASSERT_TRUE(device_->Wait(StreamId::kCompute, *uploaded).ok());
  const size_t zero_begin = 1000, zero_bytes = 4097;
  ASSERT_TRUE(device_->Zero(buffer->data() + zero_begin, zero_bytes).ok());
  ASSERT_TRUE(device_->Record(*zeroed, StreamId::kCompute).ok());
  ASSERT_TRUE(device_->Wait(StreamId::kDownload, *zeroed).ok());
  ASSERT_TRUE(device_->CopyToHost(out.Whole(), buffer->data().As<const std::byte>(), n).ok());
  Status st = device_->Synchronize();
  ASSERT_TRUE(st.ok()) << st.ToString();

  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool in_zero = i >= zero_begin && i < zero_begin + zero_bytes;
    const std::byte want = in_zero ? std::byte{0} : in.data()[i];
    if (out.data()[i] != want && mismatches++ < 5) ADD_FAILURE() << "byte " << i << " differs";
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(CudaDeviceTest, WaitOrdersWorkAcrossStreams) {
  std::atomic<int> flag{0};
  int seen = -1;
  auto e = device_->CreateEvent();
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kUpload,
                                   [&] {
                                     std::this_thread::sleep_for(std::chrono::milliseconds(50));
                                     flag = 1;
                                     return Status::Ok();
                                   })
                  .ok());
  ASSERT_TRUE(device_->Record(*e, StreamId::kUpload).ok());
  ASSERT_TRUE(device_->Wait(StreamId::kCompute, *e).ok());
  ASSERT_TRUE(
      device_
          ->LaunchHostFunc(StreamId::kCompute,
                           [&] {
                             seen = flag.load();  // without the wait this runs at once and sees 0
                             return Status::Ok();
                           })
          .ok());
  ASSERT_TRUE(device_->Synchronize(StreamId::kCompute).ok());
  EXPECT_EQ(seen, 1);
  auto done = device_->Query(*e);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

// A timed event's time is when the stream reached it: a record behind a held host function is
// stamped after it ran; untimed events cannot be timed (CUDA refuses them too).
TEST_F(CudaDeviceTest, TimedEventsMeasureWhenTheStreamReachesThem) {
  auto a = device_->CreateTimedEvent(), b = device_->CreateTimedEvent();
  auto plain = device_->CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && plain.ok());
  EXPECT_EQ(device_->ElapsedSeconds(*a, *b).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(device_->Record(*a, StreamId::kCompute).ok());
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kCompute,
                                   [] {
                                     std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                     return Status::Ok();
                                   })
                  .ok());
  ASSERT_TRUE(device_->Record(*b, StreamId::kCompute).ok());
  ASSERT_TRUE(device_->Synchronize(*b).ok());
  auto ab = device_->ElapsedSeconds(*a, *b);
  ASSERT_TRUE(ab.ok()) << ab.status().ToString();
  EXPECT_GE(*ab, 0.015);
  ASSERT_TRUE(device_->Record(*plain, StreamId::kCompute).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  EXPECT_EQ(device_->ElapsedSeconds(*a, *plain).status().code(), StatusCode::kInvalidArgument);
}

// A pinned upload on the upload stream runs beside GEMMs on the compute stream: the two together
// take well under the sum of their times alone. Each side is sized (by doubling) to take at least
// 20 ms alone on this GPU, and the copy about as long as the GEMMs, so neither hides in the
// other's launch overhead. The figures are printed.
TEST_F(CudaDeviceTest, PinnedCopyOverlapsGemms) {
  CudaDeviceOptions o;
  o.memory_bytes = 1024 * kMiB;
  o.cublas_workspace_bytes = 32 * kMiB;
  Result<std::unique_ptr<CudaDevice>> made = CudaDevice::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  CudaDevice& d = **made;
  constexpr int64_t kDim = 2048;
  testing::DeviceTensor a(d, DType::kBF16, {kDim, kDim}, "a"),
      b(d, DType::kBF16, {kDim, kDim}, "b"), c(d, DType::kBF16, {kDim, kDim}, "c");
  a.Upload(testing::RandomVector(size_t(kDim * kDim), 1));
  b.Upload(testing::RandomVector(size_t(kDim * kDim), 2));
  const size_t copy_bytes = 256 * kMiB;
  auto host = HostAllocation::Map(copy_bytes, "overlap staging");
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  auto reg = d.RegisterHost(*host);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  host->Attach(std::move(reg).value());
  auto target = d.Allocate(copy_bytes, "overlap target");
  ASSERT_TRUE(target.ok()) << target.status().ToString();

  auto gemms = [&](int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(Gemm(d, {a.tensor(), b.tensor(), c.tensor()}).ok());
  };
  auto copies = [&](int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(d.CopyToDevice(target->data(), host->Whole(), copy_bytes).ok());
    }
  };
  // Seconds from an event on `stream` to one after `work` (enqueued on it).
  auto timed = [&](StreamId stream, const std::function<void()>& work) {
    auto from = d.CreateTimedEvent(), to = d.CreateTimedEvent();
    EXPECT_TRUE(from.ok() && to.ok());
    EXPECT_TRUE(d.Record(*from, stream).ok());
    work();
    EXPECT_TRUE(d.Record(*to, stream).ok());
    EXPECT_TRUE(d.Synchronize().ok());
    Result<double> s = d.ElapsedSeconds(*from, *to);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : 0.0;
  };
  gemms(2);  // warm-up: cuBLAS picks its kernel
  copies(1);
  ASSERT_TRUE(d.Synchronize().ok());
  int n_gemm = 4, n_copy = 1;
  double t_gemm = 0, t_copy = 0;
  while ((t_gemm = timed(StreamId::kCompute, [&] { gemms(n_gemm); })) < 0.02 && n_gemm < 65536) {
    n_gemm *= 2;
  }
  while ((t_copy = timed(StreamId::kUpload, [&] { copies(n_copy); })) < t_gemm && n_copy < 256) {
    n_copy *= 2;
  }
  // Together: both streams start from one event on the compute stream. The copies share the
  // GPU's memory with the GEMMs, so neither runs at its own speed; a copy engine that overlaps
  // hides a good part of the shorter side, one that does not hides none of it. Best of three.
  auto together_once = [&]() -> double {
    auto start = d.CreateTimedEvent(), end_gemm = d.CreateTimedEvent(),
         end_copy = d.CreateTimedEvent();
    EXPECT_TRUE(start.ok() && end_gemm.ok() && end_copy.ok());
    if (!start.ok() || !end_gemm.ok() || !end_copy.ok()) return 0.0;
    EXPECT_TRUE(d.Record(*start, StreamId::kCompute).ok());
    EXPECT_TRUE(d.Wait(StreamId::kUpload, *start).ok());
    gemms(n_gemm);
    copies(n_copy);
    EXPECT_TRUE(d.Record(*end_gemm, StreamId::kCompute).ok());
    EXPECT_TRUE(d.Record(*end_copy, StreamId::kUpload).ok());
    EXPECT_TRUE(d.Synchronize().ok());
    Result<double> g = d.ElapsedSeconds(*start, *end_gemm), k = d.ElapsedSeconds(*start, *end_copy);
    EXPECT_TRUE(g.ok() && k.ok());
    return g.ok() && k.ok() ? std::max(*g, *k) : 0.0;
  };
  double together = together_once();
  for (int i = 0; i < 2; ++i) together = std::min(together, together_once());
  const double sum = t_gemm + t_copy, shorter = std::min(t_gemm, t_copy);
  std::printf(
      "overlap: %d GEMMs %.1f ms alone, %d x %zu MiB pinned uploads %.1f ms alone "
      "(%.1f GB/s), together %.1f ms (%.2f of the sum; %.0f%% of the shorter hidden)\n",
      n_gemm, t_gemm * 1e3, n_copy, copy_bytes / kMiB, t_copy * 1e3,
      double(n_copy) * double(copy_bytes) / t_copy / 1e9, together * 1e3, together / sum,
      100.0 * (sum - together) / shorter);
  EXPECT_GT(together, 0.0);
  EXPECT_LT(together, sum - 0.25 * shorter) << "the copies and GEMMs ran one after the other";
}

TEST_F(CudaDeviceTest, WaitOnNeverRecordedEventIsNoOp) {
  auto e = device_->CreateEvent();
  ASSERT_TRUE(e.ok());
  auto done = device_->Query(*e);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  ASSERT_TRUE(device_->Wait(StreamId::kCompute, *e).ok());
  bool ran = false;
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kCompute,
                                   [&] {
                                     ran = true;
                                     return Status::Ok();
                                   })
                  .ok());
  EXPECT_TRUE(device_->Synchronize(StreamId::kCompute).ok());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(device_->Synchronize(*e).ok());
}

TEST_F(CudaDeviceTest, LaterRecordDoesNotAffectEnqueuedWait) {
  // Long GPU work on the upload stream between two records of one event: the compute stream's
  // wait was enqueued against the first record, so it must finish long before the second.
  auto scratch = device_->Allocate(256 * kMiB, "long work");
  ASSERT_TRUE(scratch.ok()) << scratch.status().ToString();
  auto e = device_->CreateEvent();
  auto f = device_->CreateEvent();
  ASSERT_TRUE(e.ok() && f.ok());
  ASSERT_TRUE(device_->Record(*e, StreamId::kUpload).ok());
  ASSERT_TRUE(device_->Wait(StreamId::kCompute, *e).ok());
  // About 100 GB of memset: tens of milliseconds on an H200, more on smaller GPUs; under the
  // launch queue's depth so enqueueing never blocks the host.
  for (int i = 0; i < 400; ++i) {
    ASSERT_TRUE(device_->Zero(scratch->data(), scratch->bytes(), StreamId::kUpload).ok());
  }
  ASSERT_TRUE(device_->Record(*e, StreamId::kUpload).ok());
  ASSERT_TRUE(device_->Record(*f, StreamId::kCompute).ok());
  ASSERT_TRUE(device_->Synchronize(*f).ok());
  auto second_done = device_->Query(*e);
  ASSERT_TRUE(second_done.ok());
  EXPECT_FALSE(*second_done) << "the compute stream waited for the later record";
  EXPECT_TRUE(device_->Synchronize().ok());
}

TEST_F(CudaDeviceTest, HostFunctionErrorSurfacesAtNextCoveringSynchronize) {
  auto before = device_->CreateEvent();
  auto after = device_->CreateEvent();
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_TRUE(device_->Record(*before, StreamId::kCompute).ok());
  ASSERT_TRUE(
      device_->LaunchHostFunc(StreamId::kCompute, [] { return Status::Internal("boom"); }).ok());
  bool later_ran = false, waiter_ran = false;
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kCompute,
                                   [&] {
                                     later_ran = true;
                                     return Status::Ok();
                                   })
                  .ok());
  ASSERT_TRUE(device_->Record(*after, StreamId::kCompute).ok());
  ASSERT_TRUE(device_->Wait(StreamId::kDownload, *after).ok());
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kDownload,
                                   [&] {
                                     waiter_ran = true;
                                     return Status::Ok();
                                   })
                  .ok());

  EXPECT_TRUE(device_->Synchronize(*before).ok());  // recorded before the failure
  Status st = device_->Synchronize(*after);
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(device_->name() + "/compute"), std::string::npos) << st.ToString();
  st = device_->Synchronize(StreamId::kDownload);  // poisoned through the wait
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.ToString();
  EXPECT_TRUE(device_->Synchronize(StreamId::kUpload).ok());
  EXPECT_FALSE(later_ran);
  EXPECT_FALSE(waiter_ran);

  st = device_->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.ToString();
  EXPECT_TRUE(device_->Synchronize().ok()) << "the error is cleared";
  bool ran_again = false;
  ASSERT_TRUE(device_
                  ->LaunchHostFunc(StreamId::kCompute,
                                   [&] {
                                     ran_again = true;
                                     return Status::Ok();
                                   })
                  .ok());
  EXPECT_TRUE(device_->Synchronize(StreamId::kCompute).ok());
  EXPECT_TRUE(ran_again);
}

TEST_F(CudaDeviceTest, ArenaCapFailsNamingRequesterAndNumbers) {
  const std::vector<ArenaRecord> log = device_->arena_log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log[0].requester, "cublas workspace");  // carved from the arena
  EXPECT_EQ(device_->capacity(), 320 * kMiB);

  auto small = device_->Allocate(1000, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->data().address() % 256, 0u);
  auto too_big = device_->Allocate(device_->capacity(), "too big");
  ASSERT_FALSE(too_big.ok());
  const Status& st = too_big.status();
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("too big"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(device_->name()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(FormatBytes(device_->capacity())), std::string::npos) << st.message();
}

TEST_F(CudaDeviceTest, RejectsPointersOutsideItsMemoryAndShortSpans) {
  auto buffer = device_->Allocate(4096, "range");
  ASSERT_TRUE(buffer.ok());
  HostAllocation host = Pinned(4096);
  const DevicePtr<std::byte> past_end = buffer->data() + std::ptrdiff_t(device_->capacity());
  EXPECT_EQ(device_->CopyToDevice(past_end, host.Whole(), 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->Zero(buffer->data(), device_->capacity()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->CopyToHost(host.Span(0, 8), buffer->data().As<const std::byte>(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->Synchronize().ok());  // nothing was enqueued
}

TEST_F(CudaDeviceTest, CreateRejectsMissingOrdinalAndOversizedCap) {
  CudaDeviceOptions options;
  options.ordinal = 1000;
  auto d = CudaDevice::Create(options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable) << d.status().ToString();
  options.ordinal = 0;
  options.memory_bytes = size_t(1) << 50;  // 1 PiB
  d = CudaDevice::Create(options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kOutOfMemory) << d.status().ToString();
}

// Finite values that exercise rounding: ties in bf16 and f16, f16 subnormals and overflow,
// signed zeros, infinities; then random values of several magnitudes.
std::vector<float> CastInputs(size_t n) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e6f,
                          -1e30f,
                          6e-8f,
                          3e-8f,
                          2.98e-8f,
                          1e-40f,
                          -1e-45f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f801000u, 0x3f803000u}) {
    v.push_back(std::bit_cast<float>(bits));  // bf16 and f16 halfway cases
  }
  const std::vector<float> r = testing::RandomVector(n, 7, -1.0f, 1.0f);
  for (size_t i = 0; v.size() < n; ++i) v.push_back(r[i] * std::ldexp(1.0f, int(i % 40) - 20));
  return v;
}

bool IsNaN(DType t, const std::byte* p) {
  float f;
  ConvertToFloat(t, p, &f, 1);
  return std::isnan(f);
}

TEST_F(CudaDeviceTest, CastMatchesCpuBitForBit) {
  const size_t n = 4099;  // odd, not a multiple of the block
  std::vector<float> values = CastInputs(n);
  values[17] = std::numeric_limits<float>::quiet_NaN();
  auto src = device_->Allocate(n * 4, "cast src");
  auto dst = device_->Allocate(n * 4, "cast dst");
  ASSERT_TRUE(src.ok() && dst.ok());
  for (DType from : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + std::string(DTypeName(to)));
      Upload(*src, from, values);
      const Tensor s = src->View(from, Shape{int64_t(n)});
      const Tensor d = dst->View(to, Shape{int64_t(n)});
      ASSERT_TRUE(cuda::Cast(*device_, s, d).ok());
      const std::vector<std::byte> got = DownloadBytes(*dst, to, n);
      // The CPU cast: the source as stored, widened to fp32 (exact), then narrowed with RNE.
      std::vector<std::byte> stored(n * DTypeSize(from)), want(n * DTypeSize(to));
      std::vector<float> wide(n);
      ConvertFromFloat(values.data(), from, stored.data(), n);
      ConvertToFloat(from, stored.data(), wide.data(), n);
      ConvertFromFloat(wide.data(), to, want.data(), n);
      int bad = 0;
      const size_t w = DTypeSize(to);
      for (size_t i = 0; i < n; ++i) {
        const std::byte* g = got.data() + i * w;
        const std::byte* x = want.data() + i * w;
        if (IsNaN(to, x) && IsNaN(to, g)) continue;  // NaN payloads may differ
        if (std::memcmp(g, x, w) != 0 && bad++ < 5) {
          ADD_FAILURE() << "element " << i << " (" << values[i] << ") differs from the CPU cast";
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST_F(CudaDeviceTest, ResidualMatchesCpuBitForBitAndInPlace) {
  const size_t n = 10007;  // prime
  const std::vector<float> a = testing::RandomVector(n, 1), b = testing::RandomVector(n, 2);
  auto ba = device_->Allocate(n * 4, "a");
  auto bb = device_->Allocate(n * 4, "b");
  auto by = device_->Allocate(n * 4, "y");
  ASSERT_TRUE(ba.ok() && bb.ok() && by.ok());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    Upload(*ba, t, a);
    Upload(*bb, t, b);
    const Tensor ta = ba->View(t, Shape{int64_t(n)}), tb = bb->View(t, Shape{int64_t(n)});
    ASSERT_TRUE(cuda::Residual(*device_, ta, tb, by->View(t, Shape{int64_t(n)})).ok());
    ASSERT_TRUE(cuda::Residual(*device_, ta, tb, ta).ok());  // in place: a += b
    // fp32 addition of the stored inputs is exact IEEE on both sides, then one RNE rounding:
    // the results must agree bit for bit.
    const std::vector<float> sa = testing::Rounded(a, t), sb = testing::Rounded(b, t);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = RoundTo(t, sa[i] + sb[i]);
    for (const DeviceBuffer* out : {&*by, &*ba}) {
      const std::vector<std::byte> got = DownloadBytes(*out, t, n);
      std::vector<float> got_f(n);
      ConvertToFloat(t, got.data(), got_f.data(), n);
      testing::ExpectClose(got_f, want, 0.0f, 0.0f, "residual");
    }
  }
}

}  // namespace
}  // namespace ferry

#else  // !FERRY_WITH_CUDA

TEST(CudaDeviceTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
