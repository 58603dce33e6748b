// The CUDA attention (cuDNN's fused SDPA, kernels/cuda/attention_cudnn.h, through the op
// dispatchers) against the CPU op, forward and backward, element by element: bf16 and f16, sizes
// that are no tile multiple (T = 37, 53), GQA and MQA, packed documents (ragged sequences with an
// empty padding one), a sliding window; f32 and a bad head_dim refused; too many documents fail
// the stream with an error naming max_documents.
//
// Graphs: each test has its own device, so its own cache; each asserts how many graphs it built
// (a second call of the same shape builds none). In all, 9: 2 (bf16, fwd + bwd) + 2 (f16) +
// 2 (documents) + 2 (documents, window) + 1 (too many documents, forward only). cuDNN compiles
// each engine at run time (seconds), so the count is what bounds this test's time.
//
// The CPU op runs in f32 on the very values the GPU holds (inputs rounded to the GPU's dtype), so
// the difference is the GPU's own rounding. Tolerances (kernels/testing/cuda_vs_cpu.h), with
// s = Spacing(dtype): cuDNN rounds the softmax probabilities P to the storage dtype before P V,
// and dS = P (dP - Delta) before dS K and dS^T Q; each such rounding moves a sum by at most s/2
// times the sum of its terms' magnitudes. So each output gets (a) s |want|, plus 2 s times the
// sum of its terms' magnitudes (a factor 2 over the two roundings' s/2 + s/2 for fp32 order and
// exp2-vs-exp differences, which are far smaller), computed here in double:
//   o_id:  sum_j p_ij |v_jd|              dv_jd: sum_i p_ij |dO_id|
//   dq_id: scale sum_j p_ij (|dP_ij| + |Delta|_i) |k_jd|   (|dP_ij| as sum_c |dO_ic v_jc|)
//   dk_jd: scale sum_i p_ij (|dP_ij| + |Delta|_i) |q_id|   (i over the group's query heads)
// where |Delta|_i = sum_c |dO_ic o_ic| also covers Delta's move by the GPU's rounded o.
// lse is fp32 on both sides: kLibrary (1 + |lse|) + 4 T 2^-24. The first GPU run confirms these.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/ops/attention.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

struct AttentionCase {
  AttentionShape shape;
  std::vector<int32_t> doc_ids;  // empty: none
  int64_t window = 0;
  DType dtype = kBF16;
  std::string Name() const {
    const AttentionShape& s = shape;
    return Name(dtype) + " B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq_len) +
           " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
           " D=" + std::to_string(s.head_dim) + " G=" + std::to_string(s.documents()) +
           " W=" + std::to_string(window) + (doc_ids.empty() ? "" : " documents");
  }
  static std::string Name(DType t) { return std::string(DTypeName(t)); }
};

// The magnitudes the tolerances scale with (see the top), from a plain double attention over the
// CPU op's mask.
struct Magnitudes {
  std::vector<double> o, dq, dk, dv;
};

Magnitudes MagnitudesOf(const AttentionCase& c, const std::vector<float>& q,
                        const std::vector<float>& k, const std::vector<float>& v,
                        const std::vector<float>& d_o, float scale) {
  const AttentionShape& s = c.shape;
  const int64_t T = s.seq_len, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  const int64_t N = s.tokens(), group = Hq / Hkv;
  Magnitudes m{std::vector<double>(size_t(N * Hq * D)), std::vector<double>(size_t(N * Hq * D)),
               std::vector<double>(size_t(N * Hkv * D)), std::vector<double>(size_t(N * Hkv * D))};
  std::vector<int64_t> start(static_cast<size_t>(N), 0);  // each row's document start
  for (int64_t i = 0; i < N; ++i) {
    const bool starts =
        i % T == 0 || (!c.doc_ids.empty() && c.doc_ids[size_t(i)] != c.doc_ids[size_t(i - 1)]);
    start[size_t(i)] = starts ? i : start[size_t(i - 1)];
  }
  auto Q = [&](int64_t i, int64_t h, int64_t d) { return double(q[size_t((i * Hq + h) * D + d)]); };
  auto K = [&](int64_t j, int64_t h, int64_t d) {
    return double(k[size_t((j * Hkv + h) * D + d)]);
  };
  auto V = [&](int64_t j, int64_t h, int64_t d) {
    return double(v[size_t((j * Hkv + h) * D + d)]);
  };
  auto DO = [&](int64_t i, int64_t h, int64_t d) {
    return double(d_o[size_t((i * Hq + h) * D + d)]);
  };
  for (int64_t i = 0; i < N; ++i) {
    const int64_t lo = std::max(start[size_t(i)], c.window > 0 ? i - c.window + 1 : int64_t(0));
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      std::vector<double> p(size_t(i - lo + 1));
      double mx = -INFINITY, sum = 0, abs_delta = 0;  // sum_d |dO_id o_id|
      for (int64_t j = lo; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += Q(i, h, d) * K(j, kh, d);
        p[size_t(j - lo)] = scale * dot;
        mx = std::max(mx, scale * dot);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (double& x : p) x /= sum;
      for (int64_t d = 0; d < D; ++d) {
        double od = 0;
        for (int64_t j = lo; j <= i; ++j) od += p[size_t(j - lo)] * V(j, kh, d);
        abs_delta += std::fabs(DO(i, h, d) * od);
      }
      for (int64_t j = lo; j <= i; ++j) {
        const double pj = p[size_t(j - lo)];
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += std::fabs(DO(i, h, d) * V(j, kh, d));
        const double ds = scale * pj * (dp + abs_delta);
        for (int64_t d = 0; d < D; ++d) {
          m.o[size_t((i * Hq + h) * D + d)] += pj * std::fabs(V(j, kh, d));
          m.dv[size_t((j * Hkv + kh) * D + d)] += pj * std::fabs(DO(i, h, d));
          m.dq[size_t((i * Hq + h) * D + d)] += ds * std::fabs(K(j, kh, d));
          m.dk[size_t((j * Hkv + kh) * D + d)] += ds * std::fabs(Q(i, h, d));
        }
      }
    }
  }
  return m;
}

class CudaAttentionTest : public CudaVsCpuTest {
 protected:
  // A figure of the device's cuDNN attention (graphs built, largest workspace), read on its stream.
  int64_t FromAttention(int64_t (CudnnAttention::*figure)() const) {
    int64_t n = -1;
    const Status s = gpu_->EnqueueCompute("test", [&](const CudaContext& ctx) {
      n = (ctx.attention->*figure)();
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return n;
  }
  int64_t GraphsBuilt() { return FromAttention(&CudnnAttention::graphs_built); }
  int64_t LargestWorkspace() { return FromAttention(&CudnnAttention::largest_workspace); }

  // Forward and backward of `c` on both devices (the GPU in c.dtype, the CPU in f32 on the same
  // values), compared; each direction runs twice on the GPU (the second must reuse its graph).
  void Check(const AttentionCase& c) {
    SCOPED_TRACE(c.Name());
    const AttentionShape& s = c.shape;
    const int64_t N = s.tokens(), qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
    const float scale = 1.0f / std::sqrt(float(s.head_dim));
    const int64_t before = GraphsBuilt();
    const std::vector<float> qv = StoredRandom(c.dtype, N * qw, 70),
                             kv = StoredRandom(c.dtype, N * kw, 71),
                             vv = StoredRandom(c.dtype, N * kw, 72),
                             dov = StoredRandom(c.dtype, N * qw, 73);
    struct Side {
      DeviceTensor q, k, v, o, lse, d_o, dq, dk, dv, doc, scratch;
    };
    auto make = [&](Device& d, DType t) {
      Side x{
          {d, t, {N, qw}, "q"},
          {d, t, {N, kw}, "k"},
          {d, t, {N, kw}, "v"},
          {d, t, {N, qw}, "o"},
          {d, kF32, {N, s.q_heads}, "lse"},
          {d, t, {N, qw}, "d_o"},
          {d, t, {N, qw}, "dq"},
          {d, t, {N, kw}, "dk"},
          {d, t, {N, kw}, "dv"},
          {d, DType::kI32, {std::max<int64_t>(1, int64_t(c.doc_ids.size()))}, "doc_ids"},
          {d, DType::kU8, {int64_t(std::max<size_t>(1, AttentionScratchBytes(d, s)))}, "scratch"}};
      x.q.Upload(qv);
      x.k.Upload(kv);
      x.v.Upload(vv);
      x.d_o.Upload(dov);
      if (!c.doc_ids.empty()) x.doc.UploadBytes(c.doc_ids.data(), c.doc_ids.size() * 4);
      return x;
    };
    Side g = make(*gpu_, c.dtype), h = make(*cpu_, kF32);
    auto fwd = [&](Side& x) {
      return AttentionForwardArgs{.shape = s,
                                  .q = x.q.tensor(),
                                  .k = x.k.tensor(),
                                  .v = x.v.tensor(),
                                  .doc_ids = c.doc_ids.empty() ? Tensor{} : x.doc.tensor(),
                                  .o = x.o.tensor(),
                                  .lse = x.lse.tensor(),
                                  .scratch = x.scratch.tensor(),
                                  .scale = scale,
                                  .window = c.window};
    };
    auto bwd = [&](Side& x) {
      const AttentionForwardArgs f = fwd(x);  // the forward's inputs, o and lse
      return AttentionBackwardArgs{f.shape,       f.q,           f.k,           f.v,
                                   f.doc_ids,     f.o,           f.lse,         x.d_o.tensor(),
                                   x.dq.tensor(), x.dk.tensor(), x.dv.tensor(), f.scratch,
                                   f.scale,       f.window};
    };
    for (int run = 0; run < 2; ++run) {
      const Status f = AttentionForward(*gpu_, fwd(g));
      ASSERT_TRUE(f.ok()) << f.ToString();
      const Status b = AttentionBackward(*gpu_, bwd(g));
      ASSERT_TRUE(b.ok()) << b.ToString();
    }
    const Status gs = gpu_->Synchronize();
    ASSERT_TRUE(gs.ok()) << gs.ToString();
    // The CPU backward reads the CPU forward's own o and lse.
    ASSERT_TRUE(AttentionForward(*cpu_, fwd(h)).ok());
    ASSERT_TRUE(AttentionBackward(*cpu_, bwd(h)).ok());
    ASSERT_TRUE(cpu_->Synchronize().ok());
    EXPECT_EQ(GraphsBuilt() - before, 2) << "one forward and one backward graph, reused";
    std::printf("%s: cuDNN's largest workspace so far %lld bytes; ferry's bound %zu\n",
                c.Name().c_str(), (long long)LargestWorkspace(),
                MakeCudaAttentionLayout(s).workspace_bytes);

    const Magnitudes m = MagnitudesOf(c, qv, kv, vv, dov, scale);
    const double sp = Spacing(c.dtype);
    auto check = [&](DeviceTensor& got, DeviceTensor& want, const std::vector<double>& mag,
                     const std::string& what) {
      const std::vector<float> w = want.Download();
      ExpectWithin(got.Download(), w, Tolerance(c.dtype, w, mag, 2.0 * sp), what);
    };
    check(g.o, h.o, m.o, "o");
    const std::vector<float> lse_want = h.lse.Download();
    std::vector<double> lse_tol(lse_want.size());
    for (size_t i = 0; i < lse_tol.size(); ++i) {
      lse_tol[i] = kLibrary * (1.0 + std::fabs(lse_want[i])) + 4.0 * double(s.seq_len) * kF32Unit;
    }
    ExpectWithin(g.lse.Download(), lse_want, lse_tol, "lse");
    // dq, dk, dv come from each side's own o and lse (|Delta|_i covers the difference).
    check(g.dq, h.dq, m.dq, "dq");
    check(g.dk, h.dk, m.dk, "dk");
    check(g.dv, h.dv, m.dv, "dv");
  }
};

const AttentionShape kGqaShape{
    .batch = 2, .seq_len = 37, .q_heads = 4, .kv_heads = 2, .head_dim = 40, .max_documents = 0};

TEST_F(CudaAttentionTest, Bf16GqaMatchesCpu) {
  Check({.shape = kGqaShape, .doc_ids = {}, .window = 0, .dtype = kBF16});
}

TEST_F(CudaAttentionTest, F16GqaMatchesCpu) {
  Check({.shape = kGqaShape, .doc_ids = {}, .window = 0, .dtype = kF16});
}

// Two sequences of 53 rows holding 2 and 3 documents; G = 6 leaves one empty padding sequence.
// Ids rise within a sequence and restart in the next, as the packer writes them; the second
// sequence's first id equals the first's last, which still starts a new document.
std::vector<int32_t> PackedDocIds() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(0);
  for (int i = 0; i < 33; ++i) ids.push_back(1);
  for (int i = 0; i < 10; ++i) ids.push_back(1);
  for (int i = 0; i < 10; ++i) ids.push_back(2);
  for (int i = 0; i < 33; ++i) ids.push_back(3);
  return ids;
}
const AttentionShape kPackedShape{
    .batch = 2, .seq_len = 53, .q_heads = 4, .kv_heads = 1, .head_dim = 64, .max_documents = 6};

TEST_F(CudaAttentionTest, PackedDocumentsMatchCpu) {
  Check({.shape = kPackedShape, .doc_ids = PackedDocIds(), .window = 0, .dtype = kBF16});
}

TEST_F(CudaAttentionTest, PackedDocumentsWithSlidingWindowMatchCpu) {
  Check({.shape = kPackedShape, .doc_ids = PackedDocIds(), .window = 7, .dtype = kBF16});
}

TEST_F(CudaAttentionTest, RefusesF32AndUnsupportedHeadDim) {
  for (const auto& [dtype, head_dim, needle] : {std::tuple{kF32, int64_t(64), "bf16 or f16"},
                                                std::tuple{kBF16, int64_t(12), "multiple of 8"}}) {
    const AttentionShape s{.batch = 1,
                           .seq_len = 8,
                           .q_heads = 2,
                           .kv_heads = 2,
                           .head_dim = head_dim,
                           .max_documents = 0};
    DeviceTensor q(*gpu_, dtype, {8, 2 * head_dim}, "q"), o(*gpu_, dtype, {8, 2 * head_dim}, "o"),
        lse(*gpu_, kF32, {8, 2}, "lse"),
        scratch(*gpu_, DType::kU8, {int64_t(AttentionScratchBytes(*gpu_, s))}, "scratch");
    const Status st = AttentionForward(*gpu_, {.shape = s,
                                               .q = q.tensor(),
                                               .k = q.tensor(),
                                               .v = q.tensor(),
                                               .doc_ids = {},
                                               .o = o.tensor(),
                                               .lse = lse.tensor(),
                                               .scratch = scratch.tensor(),
                                               .scale = 0.25f});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.ToString();
  }
  EXPECT_EQ(GraphsBuilt(), 0);
}

TEST_F(CudaAttentionTest, TooManyDocumentsFailTheStream) {
  AttentionShape s = kPackedShape;
  s.max_documents = 2;  // the ids hold 5
  const int64_t N = s.tokens(), qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const std::vector<int32_t> ids = PackedDocIds();
  DeviceTensor q(*gpu_, kBF16, {N, qw}, "q"), k(*gpu_, kBF16, {N, kw}, "k"),
      o(*gpu_, kBF16, {N, qw}, "o"), lse(*gpu_, kF32, {N, s.q_heads}, "lse"),
      doc(*gpu_, DType::kI32, {N}, "doc_ids"),
      scratch(*gpu_, DType::kU8, {int64_t(AttentionScratchBytes(*gpu_, s))}, "scratch");
  q.Upload(StoredRandom(kBF16, N * qw, 80));
  k.Upload(StoredRandom(kBF16, N * kw, 81));
  doc.UploadBytes(ids.data(), ids.size() * 4);
  const Status st = AttentionForward(*gpu_, {.shape = s,
                                             .q = q.tensor(),
                                             .k = k.tensor(),
                                             .v = k.tensor(),
                                             .doc_ids = doc.tensor(),
                                             .o = o.tensor(),
                                             .lse = lse.tensor(),
                                             .scratch = scratch.tensor(),
                                             .scale = 0.125f});
  ASSERT_TRUE(st.ok()) << st.ToString();  // the documents are device data: found on the stream
  const Status sync = gpu_->Synchronize();
  EXPECT_EQ(sync.code(), StatusCode::kInvalidArgument) << sync.ToString();
  EXPECT_NE(sync.message().find("max_documents"), std::string::npos) << sync.ToString();
}

}  // namespace
}  // namespace ferry::testing

#endif  // FERRY_WITH_CUDA
