// kernels_bench: CPU-device kernel rates next to the machine's own ceiling, measured in the same
// run so each figure reads as a ratio.
//
//  - GEMM: ferry's GEMM on a CpuDevice (its ThreadPool of --threads workers, serial OpenBLAS per
//    block) at transformer shapes, f32 and bf16 storage, and a large square; beside it the plain
//    multithreaded OpenBLAS (the pthread build, a private copy loaded with dlopen so its thread
//    count is its own: ferry links the same library set to one thread per call) with the same
//    thread count on the same f32 shape.
//    ratio = ferry / plain.
//  - AdamW versus a memory-bandwidth triad: BenchAdamWVsTriad below (its own program,
//    bench/adamw_bench.cc, owns the measurement).
//
// Usage: kernels_bench [--threads N] [--quick]
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/host_memory.h"
#include "kernels/ops/gemm.h"

namespace ferry {
namespace {

constexpr const char* kPthreadOpenBlas =
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0";

bool CopyFile(const char* from, int to_fd) {
  const int in = open(from, O_RDONLY);
  if (in < 0) return false;
  char buf[1 << 16];
  ssize_t n;
  bool ok = true;
  while ((n = read(in, buf, sizeof buf)) > 0) {
    if (write(to_fd, buf, size_t(n)) != n) {
      ok = false;
      break;
    }
  }
  close(in);
  return ok && n == 0;
}

// The pthread OpenBLAS, loaded into its own symbol scope. Owns the dlopen handle.
class PlainOpenBlas {
 public:
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                           int, float, float*, int);
  static std::unique_ptr<PlainOpenBlas> Load(int threads) {
    // ferry itself links this library (set to one thread per call), and dlopen of the same file
    // would return that instance, so load a private copy: its own thread count and thread pool.
    char path[] = "/tmp/ferry-bench-openblas-XXXXXX.so";
    const int fd = mkstemps(path, 3);
    if (fd < 0 || !CopyFile(kPthreadOpenBlas, fd)) {
      std::fprintf(stderr, "cannot copy %s to %s: no ceiling column\n", kPthreadOpenBlas, path);
      if (fd >= 0) close(fd);
      unlink(path);
      return nullptr;
    }
    close(fd);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    unlink(path);  // the mapping stays valid
    if (h == nullptr) {
      std::fprintf(stderr, "plain OpenBLAS unavailable (%s): no ceiling column\n", dlerror());
      return nullptr;
    }
    auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"));
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    if (set_threads == nullptr || sgemm == nullptr) {
      std::fprintf(stderr, "plain OpenBLAS lacks cblas_sgemm/openblas_set_num_threads\n");
      dlclose(h);
      return nullptr;
    }
    set_threads(threads);
    return std::unique_ptr<PlainOpenBlas>(new PlainOpenBlas(h, sgemm));
  }
  ~PlainOpenBlas() { dlclose(handle_); }
  PlainOpenBlas(const PlainOpenBlas&) = delete;
  PlainOpenBlas& operator=(const PlainOpenBlas&) = delete;

  // Row-major C = op(A) op(B), as cblas (CblasRowMajor = 101, NoTrans = 111, Trans = 112).
  void Sgemm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
    sgemm_(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f,
           c, n);
  }

 private:
  PlainOpenBlas(void* h, SgemmFn f) : handle_(h), sgemm_(f) {}
  void* handle_;
  SgemmFn sgemm_;
};

// Best seconds per call of each function over `reps` rounds, after one warm-up call each. The
// functions take turns within a round, so load from other processes hits them alike.
std::vector<double> BestSecondsInterleaved(int reps,
                                           const std::vector<std::function<void()>>& fns) {
  std::vector<double> best(fns.size(), 1e30);
  for (const auto& fn : fns) fn();
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      best[i] = std::min(
          best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return best;
}

struct GemmShape {
  const char* what;
  int64_t m, n, k;
  bool ta, tb;
};

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Uploads n random values of dtype t into buf at byte offset 0.
void FillRandom(Device& dev, const DeviceBuffer& buf, DType t, int64_t n, HostAllocation& host) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  ConvertFromFloat(v.data(), t, host.data(), v.size());
  Check(dev.CopyToDevice(buf.data(), host.Span(0, size_t(n) * DTypeSize(t)),
                         size_t(n) * DTypeSize(t)),
        "upload");
  Check(dev.Synchronize(), "upload");
}

void BenchGemm(CpuDevice& dev, PlainOpenBlas* plain, int threads, bool quick) {
  std::vector<GemmShape> shapes;
  const std::vector<int64_t> tokens =
      quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 2048};
  for (int64_t h : {int64_t(768), int64_t(2048)}) {
    for (int64_t t : tokens) {
      shapes.push_back({"fwd y=xW^T up  ", t, 4 * h, h, false, true});
      shapes.push_back({"bwd dW+=dy^T x  ", 4 * h, h, t, true, false});
    }
  }
  shapes.push_back({"square          ", 2048, 2048, 2048, false, false});

  const int reps = quick ? 1 : 3;
  size_t max_elems = 0;
  for (const auto& s : shapes)
    max_elems = std::max({max_elems, size_t(s.m * s.k), size_t(s.k * s.n), size_t(s.m * s.n)});
  auto host = HostAllocation::Map(max_elems * 4, "bench host staging");
  Check(host.status(), "host staging");
  std::vector<float> pa(max_elems), pb(max_elems), pc(max_elems);
  for (size_t i = 0; i < max_elems; ++i) pa[i] = pb[i] = float(i % 7) * 0.1f;

  std::printf("GEMM on CpuDevice, %d threads (plain = pthread OpenBLAS, %d threads, f32)\n",
              threads, threads);
  std::printf("%-16s %5s %5s %5s %-5s %10s %10s %6s\n", "shape", "M", "N", "K", "dtype",
              "ferry GF/s", "plain GF/s", "ratio");
  const DType dtypes[] = {DType::kF32, DType::kBF16};
  for (const auto& s : shapes) {
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const Shape sa = s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k};
    const Shape sb = s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n};
    std::vector<DeviceBuffer> buffers;       // released at the end of the shape
    buffers.reserve(4 * std::size(dtypes));  // no reallocation: the runs hold views into them
    std::vector<std::function<void()>> runs;
    for (DType dt : dtypes) {
      const size_t scratch =
          std::max<size_t>(GemmScratchBytes(dev, s.m, s.n, s.k, {dt, dt, dt}), 4);
      auto alloc = [&](size_t bytes, const char* what) {
        auto buf = dev.Allocate(bytes, what);
        Check(buf.status(), what);
        buffers.push_back(std::move(buf).value());
        return &buffers.back();
      };
      const DeviceBuffer* a = alloc(size_t(sa.numel()) * DTypeSize(dt), "a");
      const DeviceBuffer* b = alloc(size_t(sb.numel()) * DTypeSize(dt), "b");
      const DeviceBuffer* c = alloc(size_t(s.m * s.n) * DTypeSize(dt), "c");
      const DeviceBuffer* w = alloc(scratch, "scratch");
      FillRandom(dev, *a, dt, sa.numel(), *host);
      FillRandom(dev, *b, dt, sb.numel(), *host);
      GemmArgs g{.a = a->View(dt, sa),
                 .b = b->View(dt, sb),
                 .c = c->View(dt, {s.m, s.n}),
                 .scratch = w->View(DType::kF32, {int64_t(scratch / 4)}),
                 .trans_a = s.ta,
                 .trans_b = s.tb};
      runs.push_back([&dev, g] {
        Check(Gemm(dev, g), "gemm");
        Check(dev.Synchronize(), "gemm");
      });
    }
    if (plain != nullptr) {
      runs.push_back([&] {
        plain->Sgemm(s.ta, s.tb, int(s.m), int(s.n), int(s.k), pa.data(), pb.data(), pc.data());
      });
    }
    const std::vector<double> best = BestSecondsInterleaved(reps, runs);
    const double plain_gf = plain != nullptr ? flops / best.back() * 1e-9 : 0;
    for (size_t i = 0; i < std::size(dtypes); ++i) {
      const double ferry_gf = flops / best[i] * 1e-9;
      std::printf("%-16s %5lld %5lld %5lld %-5s %10.1f %10.1f %6.2f\n", s.what, (long long)s.m,
                  (long long)s.n, (long long)s.k, std::string(DTypeName(dtypes[i])).c_str(),
                  ferry_gf, plain_gf, plain_gf > 0 ? ferry_gf / plain_gf : 0.0);
    }
    std::fflush(stdout);
  }
}

// AdamW versus a memory-bandwidth triad (a[i] = b[i] + s * c[i], the optimizer step's ceiling):
// measured by bench/adamw_bench.cc, which owns the optimizer kernels. When that section moves
// here, it goes in this function, which main() already calls.
void BenchAdamWVsTriad(CpuDevice& dev, int threads) {
  (void)dev;
  std::printf("\nAdamW vs triad (%d threads): run build/bench/adamw_bench\n", threads);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  ferry::CpuDeviceOptions o;
  o.name = "bench-cpu";
  o.memory_bytes = size_t(1) << 30;
  o.compute_threads = threads;
  auto dev = ferry::CpuDevice::Create(o);
  if (!dev.ok()) {
    std::fprintf(stderr, "CpuDevice: %s\n", dev.status().ToString().c_str());
    return 1;
  }
  auto plain = ferry::PlainOpenBlas::Load(threads);
  ferry::BenchGemm(**dev, plain.get(), threads, quick);
  ferry::BenchAdamWVsTriad(**dev, threads);
  return 0;
}
