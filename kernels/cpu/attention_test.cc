// Tests of the fast CPU attention kernels against the naive masked-softmax reference
// (kernels/ref/attention.h), a finite-difference check of the reference backward in double, and
// packed-batch equivalence.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ref/attention.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;

struct AttnCase {
  int64_t batch, seq, hq, hkv, d;
  int64_t window;  // 0: none
  bool docs;       // packed documents (random run lengths)
  DType dtype;
  int threads;
};

std::string Describe(const AttnCase& c) {
  return "B=" + std::to_string(c.batch) + " T=" + std::to_string(c.seq) +
         " Hq/Hkv=" + std::to_string(c.hq) + "/" + std::to_string(c.hkv) +
         " D=" + std::to_string(c.d) + " W=" + std::to_string(c.window) +
         (c.docs ? " docs " : " ") + std::string(DTypeName(c.dtype)) +
         " threads=" + std::to_string(c.threads);
}

// Document ids per token: runs of random length; ids alternate between two values so an id
// also reappears after a different one (which must start a new document).
std::vector<int32_t> RandomDocIds(int64_t batch, int64_t seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(size_t(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    int64_t left = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (left == 0) {
        id = 1 - id;
        left = 1 + int64_t(rng() % uint64_t(std::max<int64_t>(1, seq / 3)));
      }
      ids[size_t(b * seq + t)] = id;
      --left;
    }
  }
  return ids;
}

// Inputs, rounded to the storage dtype, and the fast kernels' outputs.
struct AttnRun {
  std::vector<float> q, k, v, d_o;
  std::vector<int32_t> doc_ids;  // empty: none
  std::vector<float> o, lse, dq, dk, dv;
};

AttentionShape ShapeOf(const AttnCase& c) { return {c.batch, c.seq, c.hq, c.hkv, c.d}; }
float ScaleOf(const AttnCase& c) { return 1.0f / std::sqrt(float(c.d)); }

// Runs the fast forward then backward on the run's inputs; fills its outputs.
void RunFast(const AttnCase& c, AttnRun& run) {
  ThreadPool pool(c.threads);
  const int64_t n = c.batch * c.seq, qw = c.hq * c.d, kw = c.hkv * c.d;
  HostTensor q(c.dtype, Shape{n, qw}, run.q), k(c.dtype, Shape{n, kw}, run.k);
  HostTensor v(c.dtype, Shape{n, kw}, run.v), d_o(c.dtype, Shape{n, qw}, run.d_o);
  HostTensor o(c.dtype, Shape{n, qw}), lse(DType::kF32, Shape{n, c.hq});
  HostTensor dq(c.dtype, Shape{n, qw}), dk(c.dtype, Shape{n, kw}), dv(c.dtype, Shape{n, kw});
  HostTensor docs(DType::kI32, Shape{n});
  Tensor doc_t;
  if (!run.doc_ids.empty()) {
    docs.Set(std::vector<float>(run.doc_ids.begin(), run.doc_ids.end()));
    doc_t = docs.tensor();
  }
  const size_t scratch_bytes = cpu::AttentionScratchBytes(pool.size(), ShapeOf(c));
  HostTensor scratch(DType::kF32, Shape{int64_t(scratch_bytes / 4)});
  AttentionForwardArgs fa{ShapeOf(c), q.tensor(),   k.tensor(),       v.tensor(), doc_t,
                          o.tensor(), lse.tensor(), scratch.tensor(), ScaleOf(c), c.window};
  ASSERT_TRUE(cpu::AttentionForward(pool, fa).ok());
  AttentionBackwardArgs ba{ShapeOf(c),  q.tensor(),       k.tensor(),   v.tensor(),  doc_t,
                           o.tensor(),  lse.tensor(),     d_o.tensor(), dq.tensor(), dk.tensor(),
                           dv.tensor(), scratch.tensor(), ScaleOf(c),   c.window};
  ASSERT_TRUE(cpu::AttentionBackward(pool, ba).ok());
  run.o = o.Get(), run.lse = lse.Get(), run.dq = dq.Get(), run.dk = dk.Get(), run.dv = dv.Get();
}

AttnRun RandomInputs(const AttnCase& c, uint64_t seed) {
  const size_t n = size_t(c.batch * c.seq), qw = size_t(c.hq * c.d), kw = size_t(c.hkv * c.d);
  AttnRun run;
  // q spans [-3, 3] so that softmax rows are far from uniform at scale 1/sqrt(D).
  run.q = Rounded(RandomVector(n * qw, seed, -3.0f, 3.0f), c.dtype);
  run.k = Rounded(RandomVector(n * kw, seed + 1), c.dtype);
  run.v = Rounded(RandomVector(n * kw, seed + 2), c.dtype);
  run.d_o = Rounded(RandomVector(n * qw, seed + 3), c.dtype);
  if (c.docs) run.doc_ids = RandomDocIds(c.batch, c.seq, seed + 4);
  return run;
}

ref::AttentionDims RefDims(const AttnCase& c) {
  return {c.batch, c.seq, c.hq, c.hkv, c.d, c.window, double(ScaleOf(c))};
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Largest |x|: the scale of a gradient tensor.
float MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return float(m);
}

void CheckAgainstReference(const AttnCase& c) {
  SCOPED_TRACE(Describe(c));
  AttnRun run = RandomInputs(c, 100 + uint64_t(c.seq * 7 + c.d));
  RunFast(c, run);
  if (::testing::Test::HasFatalFailure()) return;
  const ref::AttentionDims dims = RefDims(c);
  const std::vector<double> q = ToDouble(run.q), k = ToDouble(run.k), v = ToDouble(run.v);
  const std::vector<double> d_o = ToDouble(run.d_o);
  const int32_t* docs = run.doc_ids.empty() ? nullptr : run.doc_ids.data();
  std::vector<double> o(q.size()), lse(size_t(c.batch * c.seq * c.hq));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  ref::AttentionForward<double>(q.data(), k.data(), v.data(), docs, dims, o.data(), lse.data());
  ref::AttentionBackward<double>(q.data(), k.data(), v.data(), docs, d_o.data(), dims, dq.data(),
                                 dk.data(), dv.data());
  // fp32 math on the same (rounded) inputs: a score scale*q.k with |q| <= 3, |k| <= 1 carries at
  // most ~D units of 2^-24 of scale*3*D (dot product bound), i.e. 3*D^1.5*eps; the softmax
  // shifts it into p relatively and the T-term sums add T*eps. Storage rounding of the output
  // adds half an ulp: the rtol term DTypeEpsilon(dtype).
  const float f32 = DTypeEpsilon(DType::kF32), eps = DTypeEpsilon(c.dtype);
  const float atol = (3 * float(c.d) * std::sqrt(float(c.d)) + float(c.seq) + 16) * f32;
  ExpectClose(run.o, ToFloat(o), atol, eps, "o");
  ExpectClose(run.lse, ToFloat(lse), atol, f32, "lse");
  // Backward adds dP = dO.v (D terms) and the dS sums over T keys or queries (and G heads for
  // dk/dv): a few times the forward's bound, relative to each gradient's scale. In bf16 the
  // kernel forms Delta = rowsum(dO * o) from the stored (rounded) o, as flash-attention does:
  // that moves every dS_ij by p_ij * eps * sum|dO o|, an error on the scale of the whole tensor
  // rather than of the element, hence 4 * eps * max|grad|.
  auto grad_tol = [&](const std::vector<double>& g) {
    const float g_scale = std::max(1.0f, MaxAbs(g));
    return c.dtype == DType::kF32 ? 4 * atol * g_scale : 4 * eps * g_scale;
  };
  ExpectClose(run.dq, ToFloat(dq), grad_tol(dq), eps, "dq");
  ExpectClose(run.dk, ToFloat(dk), grad_tol(dk), eps, "dk");
  ExpectClose(run.dv, ToFloat(dv), grad_tol(dv), eps, "dv");
}

TEST(AttentionTest, FastMatchesReference) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    CheckAgainstReference({1, 1, 4, 1, 8, 0, false, t, 1});
    CheckAgainstReference({2, 7, 6, 2, 8, 0, true, t, 2});
    CheckAgainstReference({1, 33, 3, 3, 64, 0, false, t, 3});
    CheckAgainstReference({2, 33, 4, 1, 80, 5, true, t, 2});
    CheckAgainstReference({1, 130, 6, 2, 64, 0, true, t, 3});
    CheckAgainstReference({1, 130, 3, 3, 8, 17, false, t, 2});
    CheckAgainstReference({1, 130, 4, 1, 80, 64, true, t, 3});
    CheckAgainstReference({3, 7, 3, 3, 80, 3, false, t, 1});
  }
}

// The reference backward is the gradient of L = sum(w * o) (central differences in double).
TEST(AttentionTest, ReferenceBackwardMatchesFiniteDifferences) {
  for (int64_t window : {0, 2}) {
    const AttnCase c{2, 5, 4, 2, 3, window, true, DType::kF32, 1};
    SCOPED_TRACE(Describe(c));
    const ref::AttentionDims dims = RefDims(c);
    const std::vector<int32_t> docs{0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
    const size_t nq = size_t(c.batch * c.seq * c.hq * c.d),
                 nk = size_t(c.batch * c.seq * c.hkv * c.d);
    std::vector<double> q = ToDouble(RandomVector(nq, 1, -2, 2)), k = ToDouble(RandomVector(nk, 2));
    std::vector<double> v = ToDouble(RandomVector(nk, 3)), w = ToDouble(RandomVector(nq, 4));
    std::vector<double> o(nq), lse(size_t(c.batch * c.seq * c.hq));
    auto loss = [&] {
      ref::AttentionForward<double>(q.data(), k.data(), v.data(), docs.data(), dims, o.data(),
                                    lse.data());
      double s = 0;
      for (size_t i = 0; i < nq; ++i) s += w[i] * o[i];
      return s;
    };
    std::vector<double> dq(nq), dk(nk), dv(nk);
    ref::AttentionBackward<double>(q.data(), k.data(), v.data(), docs.data(), w.data(), dims,
                                   dq.data(), dk.data(), dv.data());
    // Central differences with h = 1e-5 on O(1) smooth functions: truncation ~h^2 = 1e-10,
    // round-off ~1e-16/h = 1e-11; 1e-8 leaves a wide margin while any wrong term (O(0.01..1))
    // fails.
    const std::vector<double> fq = testing::FiniteDifference(q, loss);
    const std::vector<double> fk = testing::FiniteDifference(k, loss);
    const std::vector<double> fv = testing::FiniteDifference(v, loss);
    for (size_t i = 0; i < nq; ++i) EXPECT_NEAR(dq[i], fq[i], 1e-8) << "dq " << i;
    for (size_t i = 0; i < nk; ++i) EXPECT_NEAR(dk[i], fk[i], 1e-8) << "dk " << i;
    for (size_t i = 0; i < nk; ++i) EXPECT_NEAR(dv[i], fv[i], 1e-8) << "dv " << i;
  }
}

// A packed batch (documents back to back in one sequence) gives, row for row, what running each
// document as its own sequence gives.
TEST(AttentionTest, PackedBatchEqualsSeparateDocuments) {
  const std::vector<int64_t> lengths{37, 1, 70, 22};  // one packed sequence of 130 tokens
  const AttnCase packed{1, 130, 6, 2, 64, 0, false, DType::kF32, 3};
  AttnRun whole = RandomInputs(packed, 9);
  for (size_t i = 0; i < lengths.size(); ++i) {
    whole.doc_ids.insert(whole.doc_ids.end(), size_t(lengths[i]), int32_t(i % 2));
  }
  RunFast(packed, whole);
  int64_t start = 0;
  for (int64_t len : lengths) {
    const AttnCase one{1, len, 6, 2, 64, 0, false, DType::kF32, 2};
    SCOPED_TRACE("document of " + std::to_string(len) + " at " + std::to_string(start));
    auto slice = [&](const std::vector<float>& v, int64_t width) {
      return std::vector<float>(v.begin() + start * width, v.begin() + (start + len) * width);
    };
    AttnRun doc;
    doc.q = slice(whole.q, 6 * 64), doc.k = slice(whole.k, 2 * 64), doc.v = slice(whole.v, 2 * 64);
    doc.d_o = slice(whole.d_o, 6 * 64);
    RunFast(one, doc);
    // Same arithmetic up to where the key tiles start (document start vs position 0), which
    // reorders fp32 sums: the reference comparison's bound applies.
    const float atol = (3 * 64 * 8 + 130 + 16) * DTypeEpsilon(DType::kF32);
    ExpectClose(doc.o, slice(whole.o, 6 * 64), atol, 0, "o");
    ExpectClose(doc.lse, slice(whole.lse, 6), atol, 0, "lse");
    ExpectClose(doc.dq, slice(whole.dq, 6 * 64), 4 * atol, 0, "dq");
    ExpectClose(doc.dk, slice(whole.dk, 2 * 64), 4 * atol, 0, "dk");
    ExpectClose(doc.dv, slice(whole.dv, 2 * 64), 4 * atol, 0, "dv");
    start += len;
  }
}

// Each output element comes from one work item in a fixed order: the thread count cannot change
// a single bit.
TEST(AttentionTest, ResultsDoNotDependOnThreadCount) {
  const AttnCase one{2, 130, 6, 2, 24, 40, true, DType::kBF16, 1};
  AttnCase three = one;
  three.threads = 3;
  AttnRun a = RandomInputs(one, 77), b = RandomInputs(three, 77);
  RunFast(one, a);
  RunFast(three, b);
  ExpectClose(b.o, a.o, 0, 0, "o");
  ExpectClose(b.lse, a.lse, 0, 0, "lse");
  ExpectClose(b.dq, a.dq, 0, 0, "dq");
  ExpectClose(b.dk, a.dk, 0, 0, "dk");
  ExpectClose(b.dv, a.dv, 0, 0, "dv");
}

TEST(AttentionTest, ScratchIsLinearInSequenceLength) {
  const AttentionShape s1{1, 4096, 8, 2, 64}, s2{1, 8192, 8, 2, 64};
  const size_t b1 = cpu::AttentionScratchBytes(4, s1), b2 = cpu::AttentionScratchBytes(4, s2);
  EXPECT_LT(b1, size_t(4096) * 4096 * 4 / 16);           // far below one T x T fp32 matrix
  EXPECT_LE(b2 - b1, size_t(4096) * (8 * 4 + 4) + 256);  // +T tokens: Delta rows and bounds
}

TEST(AttentionTest, TooSmallScratchIsAnError) {
  const AttnCase c{1, 7, 2, 1, 8, 0, false, DType::kF32, 2};
  ThreadPool pool(2);
  HostTensor q(DType::kF32, Shape{7, 16}), k(DType::kF32, Shape{7, 8}), v(DType::kF32, Shape{7, 8});
  HostTensor o(DType::kF32, Shape{7, 16}), lse(DType::kF32, Shape{7, 2});
  HostTensor scratch(DType::kF32, Shape{16});
  AttentionForwardArgs fa{ShapeOf(c), q.tensor(),   k.tensor(),       v.tensor(), Tensor{},
                          o.tensor(), lse.tensor(), scratch.tensor(), ScaleOf(c), 0};
  const Status s = cpu::AttentionForward(pool, fa);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("scratch"), std::string::npos) << s.ToString();
}

// max_documents is 0 or between the batch (a document per sequence at least) and the token count.
TEST(AttentionTest, MaxDocumentsIsChecked) {
  const AttnCase c{1, 7, 2, 1, 8, 0, false, DType::kF16, 2};
  HostTensor q(DType::kF16, Shape{7, 16}), k(DType::kF16, Shape{7, 8}), v(DType::kF16, Shape{7, 8});
  HostTensor o(DType::kF16, Shape{7, 16}), lse(DType::kF32, Shape{7, 2});
  HostTensor scratch(DType::kU8, Shape{int64_t(cpu::AttentionScratchBytes(2, ShapeOf(c)))});
  AttentionForwardArgs fa{ShapeOf(c), q.tensor(),   k.tensor(),       v.tensor(), Tensor{},
                          o.tensor(), lse.tensor(), scratch.tensor(), ScaleOf(c), 0};
  EXPECT_TRUE(ValidateAttentionForward(fa).ok());
  for (const int64_t ok : {0, 1, 3, 7}) {
    fa.shape.max_documents = ok;
    EXPECT_TRUE(ValidateAttentionForward(fa).ok()) << ok;
  }
  fa.shape.max_documents = 8;
  const Status too_many = ValidateAttentionForward(fa);
  EXPECT_NE(too_many.message().find("max_documents"), std::string::npos) << too_many.ToString();
  fa.shape.max_documents = -1;
  EXPECT_FALSE(ValidateAttentionForward(fa).ok());
}

}  // namespace
}  // namespace ferry
