// Fused LM head + cross-entropy: the chunked CPU kernel against the reference that materializes
// the logits (double), element by element; finite differences on the reference backward.
#include "kernels/cpu/lm_head_loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ref/lm_head_loss.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;

constexpr double kU = DTypeEpsilon(DType::kF32);

struct Case {
  int64_t N, V, C, chunk;
  int threads;
  DType dtype;     // h, W, dh storage
  DType dw_dtype;  // dW storage
  double loss_scale = 1.0;
  int ignore_every = 5;  // every k-th token is masked (0: none; 1: all)
};

std::string Name(const Case& c) {
  return "N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) + " C=" + std::to_string(c.C) +
         " chunk=" + std::to_string(c.chunk) + " threads=" + std::to_string(c.threads) + " " +
         std::string(DTypeName(c.dtype)) + "/dW " + std::string(DTypeName(c.dw_dtype));
}

std::vector<int32_t> MakeTargets(int64_t N, int64_t V, int ignore_every, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(N));
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < N; ++i) {
    t[size_t(i)] = (ignore_every > 0 && i % ignore_every == ignore_every - 1)
                       ? kIgnoreIndex
                       : int32_t(rng() % uint64_t(V));
  }
  return t;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Runs one case through the fast kernel (forward-backward and forward-only) and compares with the
// double reference fed the same (storage-rounded) inputs.
void CheckCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  const int64_t N = c.N, V = c.V, C = c.C;
  // Inputs in [-1, 1]: |h|, |w| <= 1 is what the tolerances below assume.
  const std::vector<float> h = Rounded(RandomVector(size_t(N * C), 1), c.dtype);
  const std::vector<float> w = Rounded(RandomVector(size_t(V * C), 2), c.dtype);
  const std::vector<float> dw0 = Rounded(RandomVector(size_t(V * C), 3, -0.1f, 0.1f), c.dw_dtype);
  const std::vector<int32_t> targets = MakeTargets(N, V, c.ignore_every, 4);
  const int64_t valid =
      std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; });
  // The global batch has more tokens than this micro-batch.
  const double normalizer = double(valid + 3);

  // Reference in double.
  std::vector<double> ref_loss(static_cast<size_t>(N)), ref_dh(static_cast<size_t>(N * C));
  std::vector<double> ref_dw = ToDouble(dw0);
  const double ref_sum = ref::LmHeadLoss<double>(ToDouble(h).data(), ToDouble(w).data(),
                                                 targets.data(), N, V, C, normalizer, c.loss_scale,
                                                 ref_loss.data(), ref_dh.data(), ref_dw.data());

  ThreadPool pool(c.threads);
  HostTensor th(c.dtype, Shape{N, C}, h), tw(c.dtype, Shape{V, C}, w);
  HostTensor tdw(c.dw_dtype, Shape{V, C}, dw0);
  HostTensor tdh(c.dtype, Shape{N, C}, std::vector<float>(size_t(N * C), 7.0f));  // overwritten
  HostTensor tloss(DType::kF32, Shape{N}), tsum(DType::kF32, Shape{1});
  const size_t scratch_bytes =
      cpu::LmHeadLossScratchBytes(c.threads, c.chunk, V, C, c.dtype, c.dw_dtype, true);
  HostTensor scratch(DType::kF32, Shape{int64_t(scratch_bytes / 4 + 1)});
  LmHeadLossArgs a;
  a.h = th.tensor();
  a.w = tw.tensor();
  a.targets = BackendAccess::Wrap(static_cast<const int32_t*>(targets.data()));
  a.normalizer = normalizer;
  a.loss_scale = c.loss_scale;
  a.chunk_tokens = c.chunk;
  a.token_loss = tloss.tensor();
  a.loss_sum = tsum.tensor();
  a.dh = tdh.tensor();
  a.dw = tdw.tensor();
  a.scratch = scratch.tensor();
  ASSERT_TRUE(ValidateLmHeadLoss(a, true).ok()) << ValidateLmHeadLoss(a, true).ToString();
  const Status st = cpu::LmHeadLossForwardBackward(pool, a);
  ASSERT_TRUE(st.ok()) << st.ToString();

  // Tolerances, from Higham's bound for a K-term fp32 dot product, |err| <= K u sum|a_k b_k|,
  // with |h|, |w| <= 1:
  //  - a logit (K = C) errs by at most dl = C * u * C;
  //  - a token loss, lse(l) - l_t, by 2 dl (lse is 1-Lipschitz) plus a few roundings of
  //    exp/log/the final float (8 u absolute, 4 u relative);
  //  - softmax rows: sum_j |dp_j| <= 2 dl + 4 u; |P - Y| row sums <= 2; s = loss_scale/normalizer;
  //  - dh (K = V, then a sum over the pool's parts): s * (2 (V + threads) u + 2 dl + 4 u), plus
  //    storage rounding (relative DTypeEpsilon(dtype));
  //  - dW (K = N tokens, |dL| <= s): s * (N^2 u + N (2 dl + 4 u)); bf16 dW is rounded once per
  //    chunk: + chunks * u_bf16 * (max |dW0| + N s).
  const double s = c.loss_scale / normalizer;
  const double dl = double(C) * double(C) * kU;
  const double loss_atol = 2 * dl + 8 * kU, loss_rtol = 4 * kU;
  ExpectClose(tloss.Get(), std::vector<float>(ref_loss.begin(), ref_loss.end()), float(loss_atol),
              float(loss_rtol), "token_loss");
  ExpectClose(tsum.Get(), {float(ref_sum)}, float(loss_atol), float(loss_rtol), "loss_sum");
  const double dh_atol = s * (2 * double(V + c.threads) * kU + 2 * dl + 4 * kU);
  ExpectClose(tdh.Get(), std::vector<float>(ref_dh.begin(), ref_dh.end()), float(dh_atol),
              DTypeEpsilon(c.dtype), "dh");
  double dw_atol = s * (double(N) * double(N) * kU + double(N) * (2 * dl + 4 * kU));
  if (c.dw_dtype != DType::kF32) {
    const double chunks = double((N + c.chunk - 1) / c.chunk);
    dw_atol += chunks * DTypeEpsilon(c.dw_dtype) * (0.1 + double(N) * s);
  }
  ExpectClose(tdw.Get(), std::vector<float>(ref_dw.begin(), ref_dw.end()), float(dw_atol),
              DTypeEpsilon(c.dw_dtype), "dW");

  // Forward only: the same losses bit for bit (same sums in the same order), dh/dW untouched.
  HostTensor floss(DType::kF32, Shape{N}), fsum(DType::kF32, Shape{1});
  LmHeadLossArgs f = a;
  f.token_loss = floss.tensor();
  f.loss_sum = fsum.tensor();
  f.dh = {};
  f.dw = {};
  ASSERT_TRUE(ValidateLmHeadLoss(f, false).ok());
  ASSERT_TRUE(cpu::LmHeadLossForward(pool, f).ok());
  ExpectClose(floss.Get(), tloss.Get(), 0, 0, "forward-only token_loss");
  ExpectClose(fsum.Get(), tsum.Get(), 0, 0, "forward-only loss_sum");

  // No weight gradient (a frozen head): the same losses and dh bit for bit (dW's products never
  // feed dh), in scratch sized exactly for that pass: no more than with a dW, and without the
  // per-thread dW panel when dW is not f32.
  const size_t no_dw_bytes =
      cpu::LmHeadLossScratchBytes(c.threads, c.chunk, V, C, c.dtype, std::nullopt, true);
  EXPECT_LE(no_dw_bytes, scratch_bytes);
  if (c.dw_dtype != DType::kF32) {
    EXPECT_LT(no_dw_bytes, scratch_bytes);
  }
  HostTensor nloss(DType::kF32, Shape{N}), nsum(DType::kF32, Shape{1});
  HostTensor ndh(c.dtype, Shape{N, C}, std::vector<float>(size_t(N * C), 7.0f));
  HostTensor nscratch(DType::kF32, Shape{int64_t(no_dw_bytes / 4)});
  LmHeadLossArgs g = a;
  g.token_loss = nloss.tensor();
  g.loss_sum = nsum.tensor();
  g.dh = ndh.tensor();
  g.dw = {};
  g.scratch = nscratch.tensor();
  ASSERT_TRUE(ValidateLmHeadLoss(g, true).ok()) << ValidateLmHeadLoss(g, true).ToString();
  const Status ng = cpu::LmHeadLossForwardBackward(pool, g);
  ASSERT_TRUE(ng.ok()) << ng.ToString();
  ExpectClose(nloss.Get(), tloss.Get(), 0, 0, "no-dW token_loss");
  ExpectClose(nsum.Get(), tsum.Get(), 0, 0, "no-dW loss_sum");
  ExpectClose(ndh.Get(), tdh.Get(), 0, 0, "no-dW dh");
}

TEST(LmHeadLossTest, MatchesReferenceF32) {
  CheckCase({1, 1, 1, 1, 1, DType::kF32, DType::kF32, 1.0, 0});
  CheckCase({37, 101, 19, 7, 1, DType::kF32, DType::kF32});
  CheckCase({37, 101, 19, 16, 3, DType::kF32, DType::kF32, 2.0});
  CheckCase({37, 53, 33, 256, 2, DType::kF32, DType::kF32});  // chunk > N
  CheckCase({20, 2, 5, 3, 3, DType::kF32, DType::kF32});      // V smaller than the pool
  CheckCase({64, 131, 64, 64, 2, DType::kF32, DType::kF32, 1.0, 3});
}

TEST(LmHeadLossTest, MatchesReferenceBF16) {
  // V = 300 > 2 panels of 128 W rows per part on one thread: exercises the panel loop's tail.
  CheckCase({29, 300, 24, 8, 1, DType::kBF16, DType::kF32});
  CheckCase({37, 101, 19, 5, 3, DType::kBF16, DType::kF32, 4.0});
  CheckCase({33, 257, 17, 10, 2, DType::kBF16, DType::kBF16});
  CheckCase({7, 11, 3, 1, 1, DType::kBF16, DType::kBF16});
}

// f16 h and W (fp16 training) with an fp32 dW, the executor's layout; the loss scale 1024 is what
// fp16 dynamic loss scaling passes (gradients of loss_sum * 1024, the loss itself unscaled).
TEST(LmHeadLossTest, MatchesReferenceF16) {
  CheckCase({29, 300, 24, 8, 1, DType::kF16, DType::kF32});
  CheckCase({37, 101, 19, 5, 3, DType::kF16, DType::kF32, 1024.0});
  CheckCase({7, 11, 3, 1, 1, DType::kF16, DType::kF32});
}

TEST(LmHeadLossTest, AllTokensIgnored) {
  // Every token masked: zero loss, dh = 0, dW unchanged (exactly).
  CheckCase({12, 17, 5, 5, 2, DType::kF32, DType::kF32, 1.0, 1});
  CheckCase({12, 17, 5, 5, 2, DType::kBF16, DType::kBF16, 1.0, 1});
}

TEST(LmHeadLossTest, DeterministicForAPoolSize) {
  const int64_t N = 19, V = 70, C = 12;
  const std::vector<float> h = RandomVector(size_t(N * C), 1), w = RandomVector(size_t(V * C), 2);
  const std::vector<int32_t> targets = MakeTargets(N, V, 4, 5);
  std::vector<std::vector<float>> dh_runs, dw_runs;
  ThreadPool pool(3);
  for (int run = 0; run < 2; ++run) {
    HostTensor th(DType::kF32, Shape{N, C}, h), tw(DType::kF32, Shape{V, C}, w);
    HostTensor tdh(DType::kF32, Shape{N, C}), tdw(DType::kF32, Shape{V, C});
    HostTensor scratch(
        DType::kF32,
        Shape{
            int64_t(cpu::LmHeadLossScratchBytes(3, 4, V, C, DType::kF32, DType::kF32, true) / 4)});
    LmHeadLossArgs a;
    a.h = th.tensor();
    a.w = tw.tensor();
    a.targets = BackendAccess::Wrap(static_cast<const int32_t*>(targets.data()));
    a.normalizer = 10;
    a.chunk_tokens = 4;
    a.dh = tdh.tensor();
    a.dw = tdw.tensor();
    a.scratch = scratch.tensor();
    ASSERT_TRUE(cpu::LmHeadLossForwardBackward(pool, a).ok());
    dh_runs.push_back(tdh.Get());
    dw_runs.push_back(tdw.Get());
  }
  // Parts are fixed vocabulary ranges and partials are summed in part order: no scheduling effect.
  ExpectClose(dh_runs[1], dh_runs[0], 0, 0, "dh run 2 vs 1");
  ExpectClose(dw_runs[1], dw_runs[0], 0, 0, "dW run 2 vs 1");
}

TEST(LmHeadLossTest, RejectsBadTargetsAndSmallScratch) {
  const int64_t N = 4, V = 5, C = 3;
  HostTensor th(DType::kF32, Shape{N, C}, RandomVector(size_t(N * C), 1));
  HostTensor tw(DType::kF32, Shape{V, C}, RandomVector(size_t(V * C), 2));
  HostTensor tsum(DType::kF32, Shape{1});
  const size_t need = cpu::LmHeadLossScratchBytes(1, 2, V, C, DType::kF32, DType::kF32, false);
  HostTensor scratch(DType::kF32, Shape{int64_t(need / 4)});
  std::vector<int32_t> targets = {0, kIgnoreIndex, 5, 1};  // 5 == V: out of range
  LmHeadLossArgs a;
  a.h = th.tensor();
  a.w = tw.tensor();
  a.targets = BackendAccess::Wrap(static_cast<const int32_t*>(targets.data()));
  a.normalizer = 3;
  a.chunk_tokens = 2;
  a.loss_sum = tsum.tensor();
  a.scratch = scratch.tensor();
  ThreadPool pool(1);
  Status st = cpu::LmHeadLossForward(pool, a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("target[2] = 5"), std::string::npos) << st.ToString();
  targets[2] = -1;  // negative and not the ignore index
  EXPECT_EQ(cpu::LmHeadLossForward(pool, a).code(), StatusCode::kInvalidArgument);
  targets[2] = 4;
  EXPECT_TRUE(cpu::LmHeadLossForward(pool, a).ok());
  a.scratch = a.scratch.Reshape(Shape{int64_t(need / 4)}).Rows(0, int64_t(need / 4) - 1);
  st = cpu::LmHeadLossForward(pool, a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("scratch"), std::string::npos) << st.ToString();
}

TEST(LmHeadLossTest, ValidateNamesTheTensor) {
  HostTensor th(DType::kBF16, Shape{4, 3}), tw(DType::kBF16, Shape{5, 3}), s(DType::kF32, Shape{1});
  HostTensor dh(DType::kBF16, Shape{4, 3}), dw_bad(DType::kBF16, Shape{5, 4});
  int32_t targets[4] = {0, 1, 2, 3};
  LmHeadLossArgs a;
  a.h = th.tensor();
  a.w = tw.tensor();
  a.targets = BackendAccess::Wrap(static_cast<const int32_t*>(targets));
  a.scratch = s.tensor();
  EXPECT_TRUE(ValidateLmHeadLoss(a, false).ok());
  EXPECT_FALSE(ValidateLmHeadLoss(a, true).ok());  // dh, dw missing
  a.dh = dh.tensor();
  EXPECT_TRUE(ValidateLmHeadLoss(a, true).ok());  // no dw: no weight gradient (a frozen head)
  a.dw = dw_bad.tensor();
  const Status st = ValidateLmHeadLoss(a, true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dw has shape [5, 4]; expected [5, 3]"), std::string::npos)
      << st.ToString();
  a.normalizer = 0;
  EXPECT_FALSE(ValidateLmHeadLoss(a, false).ok());
}

// Finite differences of loss_sum * loss_scale (double reference) against its dh and dW.
// Central differences with step 1e-5 err by O(step^2 |f'''|) ~ 1e-10 plus cancellation
// ~ 1e-16 / 1e-5 = 1e-11 on values of order 1, so 1e-7 absolute is ample and still far below
// the gradients (order 1e-2 .. 1e-1).
TEST(LmHeadLossTest, ReferenceGradientsMatchFiniteDifferences) {
  const int64_t N = 4, V = 6, C = 3;
  const double normalizer = 5, loss_scale = 1.5;
  std::vector<double> h = ToDouble(RandomVector(size_t(N * C), 7));
  std::vector<double> w = ToDouble(RandomVector(size_t(V * C), 8));
  const std::vector<int32_t> targets = {2, kIgnoreIndex, 0, 5};
  std::vector<double> dh(size_t(N * C)), dw(size_t(V * C), 0.0);
  ref::LmHeadLoss<double>(h.data(), w.data(), targets.data(), N, V, C, normalizer, loss_scale,
                          nullptr, dh.data(), dw.data());
  auto f = [&] {
    return loss_scale * ref::LmHeadLoss<double>(h.data(), w.data(), targets.data(), N, V, C,
                                                normalizer, loss_scale, nullptr, nullptr, nullptr);
  };
  const std::vector<double> fd_h = testing::FiniteDifference(h, f);
  const std::vector<double> fd_w = testing::FiniteDifference(w, f);
  for (size_t i = 0; i < dh.size(); ++i) EXPECT_NEAR(dh[i], fd_h[i], 1e-7) << "dh[" << i << "]";
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], fd_w[i], 1e-7) << "dW[" << i << "]";
  // The ignored token's dh row is exactly zero.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dh[size_t(1 * C + c)], 0.0);
}

}  // namespace
}  // namespace ferry
