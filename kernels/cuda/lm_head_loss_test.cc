// The CUDA fused LM head + cross-entropy (kernels/cuda/lm_head_loss.cu, through the op
// dispatchers), forward and forward-backward, against the CPU backend: f32, and bf16 with an f32
// dW, a bf16 dW or none (a frozen head); vocabularies that fit no warp, block or W panel (1000,
// 3001 > the 1024-row panel); chunks smaller than N that do not divide it; ignored targets; a
// loss_scale != 1; dW accumulating onto non-zero values. Also: the same bits on every run and
// with or without dW, bad targets failing the stream with the CPU's message, no tokens at all.
//
// Tolerances (kernels/testing/cuda_vs_cpu.h), per element from a double reference of the stored
// inputs (u = 2^-24):
//   logits: both sides sum C exact (bf16) or rounded (f32) products in fp32, in their own orders:
//     |dl_ij| <= 2 (C + 2) u S_ij, S_ij = sum_c |h_ic w_jc|; delta_i = its max over the row.
//   token loss = lse - l_t moves by at most 2 delta_i (lse moves by at most max_j |dl_ij|), plus
//     (d) for expf and log of arguments up to range_i = max_j l_ij - min_j l_ij: lib_i =
//     kLibrary (1 + range_i); both sides sum z in double.
//   G = s (P - Y): |dG_ij| <= s (p_ij (2 delta_i + 2 lib_i) + [j = t] 2u).
//   dh = G W: sum_j |dG_ij| |w_jc| + (b) 2 (V + 2) u s (sum_j p_ij |w_jc| + |w_tc|), then (a).
//   dW += G^T h: sum_i |dG_ij| |h_ic| + (b) 2 (N + 2) u (|dw0| + sum_i |G_ij h_ic|), then (a); a
//     bf16 dW is rounded once per chunk on both sides: one bf16 spacing of its magnitude per
//     chunk.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops/lm_head_loss.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaLmHeadLossTest = CudaVsCpuTest;

struct HeadCase {
  int64_t n, c, v, chunk;
  DType dtype;              // h, w, dh
  std::optional<DType> dw;  // nullopt: a frozen head
  double loss_scale;
  std::string Name() const {
    return DtypeNames() + " N=" + std::to_string(n) + " C=" + std::to_string(c) +
           " V=" + std::to_string(v) + " chunk=" + std::to_string(chunk) +
           " scale=" + std::to_string(loss_scale);
  }
  std::string DtypeNames() const {
    return testing::Name(dtype) + "/dw " + (dw ? testing::Name(*dw) : std::string("none"));
  }
};

// Every fifth token ignored, the others spread over the vocabulary (both ends included).
std::vector<int32_t> MakeTargets(int64_t n, int64_t v) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    t[size_t(i)] = i % 5 == 3 ? kIgnoreIndex : int32_t((i * 7919 + (i == 0 ? v - 1 : 0)) % v);
  }
  return t;
}

// An int32 vector on a device (in an f32-sized buffer).
struct DeviceTargets {
  DeviceTargets(Device& d, const std::vector<int32_t>& t)
      : tensor(d, kF32, Shape{std::max<int64_t>(1, int64_t(t.size()))}, "targets") {
    tensor.UploadBytes(t.data(), t.size() * 4);
  }
  DevicePtr<const int32_t> ptr() const { return tensor.tensor().data.As<const int32_t>(); }
  DeviceTensor tensor;
};

// The tolerances of the header comment, from the stored inputs.
struct HeadTolerances {
  std::vector<double> loss, dh, dw;  // (N), (N, C), (V, C): the slack terms, before (a)
  double loss_sum = 0;
};

HeadTolerances Tolerances(const HeadCase& k, const std::vector<float>& h,
                          const std::vector<float>& w, const std::vector<int32_t>& targets,
                          const std::vector<float>& dw0, double normalizer) {
  const int64_t N = k.n, C = k.c, V = k.v;
  const double u = kF32Unit, s = k.loss_scale / normalizer;
  HeadTolerances t;
  t.loss.assign(size_t(N), 0.0);
  t.dh.assign(size_t(N * C), 0.0);
  t.dw.assign(size_t(V * C), 0.0);
  std::vector<double> p(static_cast<size_t>(V)), err(static_cast<size_t>(V));
  std::vector<double> dw_mag(size_t(V * C), 0.0);  // sum_i |G_ij h_ic|
  for (int64_t i = 0; i < N; ++i) {
    const int32_t ti = targets[size_t(i)];
    if (ti == kIgnoreIndex) continue;
    double mx = -INFINITY, mn = INFINITY, smax = 0;
    for (int64_t j = 0; j < V; ++j) {
      double l = 0, sa = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double prod = double(h[size_t(i * C + c)]) * double(w[size_t(j * C + c)]);
        l += prod;
        sa += std::fabs(prod);
      }
      p[size_t(j)] = l;
      mx = std::max(mx, l);
      mn = std::min(mn, l);
      smax = std::max(smax, sa);
    }
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(p[size_t(j)] - mx);
    for (int64_t j = 0; j < V; ++j) p[size_t(j)] = std::exp(p[size_t(j)] - mx) / z * 1.01;
    const double delta = 2.0 * double(C + 2) * u * smax;
    const double lib = kLibrary * (1.0 + (mx - mn));
    t.loss[size_t(i)] = 2.0 * delta + lib;
    t.loss_sum += t.loss[size_t(i)] / normalizer;
    for (int64_t j = 0; j < V; ++j) {
      err[size_t(j)] = s * (p[size_t(j)] * (2.0 * delta + 2.0 * lib) + (j == ti ? 2.0 * u : 0.0));
    }
    for (int64_t j = 0; j < V; ++j) {
      const double g = s * (p[size_t(j)] + (j == ti ? 1.0 : 0.0));
      for (int64_t c = 0; c < C; ++c) {
        const double aw = std::fabs(w[size_t(j * C + c)]), ah = std::fabs(h[size_t(i * C + c)]);
        t.dh[size_t(i * C + c)] += err[size_t(j)] * aw + 2.0 * double(V + 2) * u * g * aw;
        t.dw[size_t(j * C + c)] += err[size_t(j)] * ah;
        dw_mag[size_t(j * C + c)] += g * ah;
      }
    }
  }
  const int64_t chunks = (N + k.chunk - 1) / k.chunk;
  for (size_t e = 0; e < t.dw.size(); ++e) {
    const double mag = std::fabs(dw0[e]) + dw_mag[e];
    t.dw[e] += 2.0 * double(N + 2) * u * mag;
    if (k.dw && *k.dw != kF32) t.dw[e] += double(chunks) * Spacing(*k.dw) * mag;
  }
  return t;
}

TEST_F(CudaLmHeadLossTest, ForwardAndForwardBackwardMatchCpu) {
  const std::vector<HeadCase> cases = {{1, 7, 1000, 4, kF32, kF32, 1.0},
                                       {3, 64, 3001, 2, kF32, kF32, 2.5},
                                       {300, 7, 1000, 64, kF32, std::nullopt, 1.0},
                                       {37, 257, 3001, 16, kBF16, kF32, 1.0},
                                       {300, 64, 3001, 128, kBF16, kBF16, 1024.0},
                                       {3, 257, 1000, 2, kBF16, std::nullopt, 2.5},
                                       {300, 7, 1000, 64, kBF16, kF32, 1.0}};
  for (const HeadCase& k : cases) {
    SCOPED_TRACE(k.Name());
    const int64_t N = k.n, C = k.c, V = k.v;
    const std::vector<float> hv = StoredRandom(k.dtype, N * C, 30, -2, 2);
    const std::vector<float> wv = StoredRandom(k.dtype, V * C, 31, -0.5, 0.5);
    const DType dw_dtype = k.dw.value_or(kF32);
    const std::vector<float> dw0 = StoredRandom(dw_dtype, V * C, 32, -0.1, 0.1);
    const std::vector<int32_t> tv = MakeTargets(N, V);
    const double normalizer =
        double(std::count_if(tv.begin(), tv.end(), [](int32_t t) { return t != kIgnoreIndex; })) +
        3.0;  // the global batch holds more targets than this micro-batch
    Twin h = Make(k.dtype, {N, C}, "h", hv), w = Make(k.dtype, {V, C}, "w", wv);
    Twin dh = Zeros(k.dtype, {N, C}, "dh"), dw = Make(dw_dtype, {V, C}, "dw", dw0);
    Twin token_loss = Zeros(kF32, {N}, "token_loss"), loss_sum = Zeros(kF32, {1}, "loss_sum");
    Twin fwd_loss = Zeros(kF32, {N}, "token_loss"), fwd_sum = Zeros(kF32, {1}, "loss_sum");
    DeviceTargets gpu_targets(*gpu_, tv), cpu_targets(*cpu_, tv);
    auto scratch_on = [&](Device& d, bool backward) {
      const size_t bytes = LmHeadLossScratchBytes(d, k.chunk, V, C, k.dtype,
                                                  backward ? k.dw : std::nullopt, backward);
      return DeviceTensor(d, kF32, Shape{int64_t((bytes + 3) / 4)}, "lm_head scratch");
    };
    DeviceTensor gpu_fwd_scratch = scratch_on(*gpu_, false),
                 cpu_fwd_scratch = scratch_on(*cpu_, false);
    DeviceTensor gpu_scratch = scratch_on(*gpu_, true), cpu_scratch = scratch_on(*cpu_, true);
    auto args = [&](bool g, bool backward) {
      LmHeadLossArgs a;
      a.h = h.On(g);
      a.w = w.On(g);
      a.targets = g ? gpu_targets.ptr() : cpu_targets.ptr();
      a.normalizer = normalizer;
      a.loss_scale = k.loss_scale;
      a.chunk_tokens = k.chunk;
      a.token_loss = backward ? token_loss.On(g) : fwd_loss.On(g);
      a.loss_sum = backward ? loss_sum.On(g) : fwd_sum.On(g);
      if (backward) {
        a.dh = dh.On(g);
        if (k.dw) a.dw = dw.On(g);
      }
      a.scratch = backward ? (g ? gpu_scratch : cpu_scratch).tensor()
                           : (g ? gpu_fwd_scratch : cpu_fwd_scratch).tensor();
      return a;
    };
    RunBoth<LmHeadLossArgs>(&LmHeadLossForward, [&](bool g) { return args(g, false); });
    RunBoth<LmHeadLossArgs>(&LmHeadLossForwardBackward, [&](bool g) { return args(g, true); });

    const HeadTolerances tol = Tolerances(k, hv, wv, tv, dw0, normalizer);
    for (Twin* loss : {&fwd_loss, &token_loss}) {
      const std::vector<float> want = loss->Cpu();
      ExpectWithin(loss->Gpu(), want, Tolerance(kF32, want, tol.loss, 1.0), "token_loss");
    }
    for (Twin* sum : {&fwd_sum, &loss_sum}) {
      const std::vector<float> want = sum->Cpu();
      ExpectWithin(sum->Gpu(), want, Tolerance(kF32, want, {tol.loss_sum}, 1.0), "loss_sum");
    }
    const std::vector<float> want_dh = dh.Cpu();
    ExpectWithin(dh.Gpu(), want_dh, Tolerance(k.dtype, want_dh, tol.dh, 1.0), "dh");
    const std::vector<float> want_dw = dw.Cpu();
    if (k.dw) {
      ExpectWithin(dw.Gpu(), want_dw, Tolerance(*k.dw, want_dw, tol.dw, 1.0), "dw");
    } else {
      ExpectExact(dw.Gpu(), dw0, "untouched dw of a frozen head");
    }
  }
}

// Runs the GPU forward-backward over bf16 inputs with a bf16 dW (or none) starting at dw0;
// returns token_loss, loss_sum, dh and dW.
struct GpuHeadRun {
  std::vector<float> token_loss, loss_sum, dh, dw;
};

TEST_F(CudaLmHeadLossTest, SameBitsEveryRunAndWithOrWithoutDw) {
  const int64_t N = 75, C = 33, V = 2049, chunk = 32;
  const std::vector<int32_t> tv = MakeTargets(N, V);
  const std::vector<float> dw0 = StoredRandom(kBF16, V * C, 42, -0.1, 0.1);
  DeviceTensor h(*gpu_, kBF16, {N, C}, "h"), w(*gpu_, kBF16, {V, C}, "w");
  h.Upload(StoredRandom(kBF16, N * C, 40, -2, 2));
  w.Upload(StoredRandom(kBF16, V * C, 41, -0.5, 0.5));
  DeviceTargets targets(*gpu_, tv);
  DeviceTensor scratch(
      *gpu_, kF32, {int64_t(LmHeadLossScratchBytes(*gpu_, chunk, V, C, kBF16, kBF16, true) / 4)},
      "scratch");
  auto run = [&](bool with_dw) {
    DeviceTensor dh(*gpu_, kBF16, {N, C}, "dh"), dw(*gpu_, kBF16, {V, C}, "dw");
    DeviceTensor loss(*gpu_, kF32, {N}, "token_loss"), sum(*gpu_, kF32, {1}, "loss_sum");
    dw.Upload(dw0);
    LmHeadLossArgs a;
    a.h = h.tensor();
    a.w = w.tensor();
    a.targets = targets.ptr();
    a.normalizer = 61;
    a.loss_scale = 4;
    a.chunk_tokens = chunk;
    a.token_loss = loss.tensor();
    a.loss_sum = sum.tensor();
    a.dh = dh.tensor();
    if (with_dw) a.dw = dw.tensor();
    a.scratch = scratch.tensor();
    const Status st = LmHeadLossForwardBackward(*gpu_, a);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return GpuHeadRun{loss.Download(), sum.Download(), dh.Download(), dw.Download()};
  };
  const GpuHeadRun first = run(true), second = run(true), frozen = run(false);
  ExpectExact(second.token_loss, first.token_loss, "token_loss, run 2");
  ExpectExact(second.loss_sum, first.loss_sum, "loss_sum, run 2");
  ExpectExact(second.dh, first.dh, "dh, run 2");
  ExpectExact(second.dw, first.dw, "dw, run 2");
  ExpectExact(frozen.dh, first.dh, "dh without dW");
  ExpectExact(frozen.loss_sum, first.loss_sum, "loss_sum without dW");
  ExpectExact(frozen.dw, dw0, "dw not given: untouched");
}

TEST_F(CudaLmHeadLossTest, BadTargetFailsTheStreamNamingTheFirst) {
  const int64_t N = 40, C = 8, V = 1000;
  std::vector<int32_t> tv = MakeTargets(N, V);
  tv[17] = int32_t(V);  // the first bad one
  tv[23] = -7;
  tv[31] = 5000;
  DeviceTensor h(*gpu_, kF32, {N, C}, "h"), w(*gpu_, kF32, {V, C}, "w");
  h.Upload(StoredRandom(kF32, N * C, 50));
  w.Upload(StoredRandom(kF32, V * C, 51));
  DeviceTargets targets(*gpu_, tv);
  DeviceTensor loss(*gpu_, kF32, {N}, "token_loss"), dh(*gpu_, kF32, {N, C}, "dh");
  DeviceTensor scratch(
      *gpu_, kF32, {int64_t(LmHeadLossScratchBytes(*gpu_, 16, V, C, kF32, std::nullopt, true) / 4)},
      "scratch");
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "forward-backward" : "forward");
    LmHeadLossArgs a;
    a.h = h.tensor();
    a.w = w.tensor();
    a.targets = targets.ptr();
    a.chunk_tokens = 16;
    a.token_loss = loss.tensor();
    if (backward) a.dh = dh.tensor();
    a.scratch = scratch.tensor();
    const Status enqueued =
        backward ? LmHeadLossForwardBackward(*gpu_, a) : LmHeadLossForward(*gpu_, a);
    ASSERT_TRUE(enqueued.ok()) << enqueued.ToString();  // target values are device data
    const Status s = gpu_->Synchronize();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("target[17] = 1000 is outside [0, 1000)"), std::string::npos)
        << s.ToString();
    // The error is taken by Synchronize: the device runs on.
    const Status again = gpu_->Synchronize();
    EXPECT_TRUE(again.ok()) << again.ToString();
  }
}

TEST_F(CudaLmHeadLossTest, NoTokensWritesAZeroLoss) {
  const int64_t C = 8, V = 100;
  DeviceTensor h(*gpu_, kF32, {0, C}, "h"), w(*gpu_, kF32, {V, C}, "w"),
      dh(*gpu_, kF32, {0, C}, "dh");
  DeviceTensor sum(*gpu_, kF32, {1}, "loss_sum");
  sum.Upload({7.0f});
  DeviceTensor scratch(
      *gpu_, kF32, {int64_t(LmHeadLossScratchBytes(*gpu_, 4, V, C, kF32, std::nullopt, true) / 4)},
      "scratch");
  LmHeadLossArgs a;
  a.h = h.tensor();
  a.w = w.tensor();
  a.loss_sum = sum.tensor();
  a.chunk_tokens = 4;
  a.dh = dh.tensor();
  a.scratch = scratch.tensor();
  const Status st = LmHeadLossForwardBackward(*gpu_, a);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectExact(sum.Download(), {0.0f}, "loss_sum");
}

}  // namespace
}  // namespace ferry::testing

#endif  // FERRY_WITH_CUDA
