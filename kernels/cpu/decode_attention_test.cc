// The fast CPU decode attention against the plain attention reference (kernels/ref/attention.h)
// over the whole prefix: the op's n rows must equal the reference's rows [P, P+n) of one sequence
// of P+n tokens, and the cache must hold the new keys and values at rows [P, P+n) afterwards.
#include "kernels/cpu/decode_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops/decode_attention.h"
#include "kernels/ref/attention.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;

struct DecodeCase {
  int64_t past, n, capacity, hq, hkv, d, window;
  int threads;
};

void Check(const DecodeCase& c) {
  SCOPED_TRACE("P=" + std::to_string(c.past) + " n=" + std::to_string(c.n) + " Hq/Hkv=" +
               std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " D=" + std::to_string(c.d) +
               " W=" + std::to_string(c.window) + " threads=" + std::to_string(c.threads));
  const int64_t total = c.past + c.n, qw = c.hq * c.d, kw = c.hkv * c.d;
  const uint64_t seed = uint64_t(7 * total + c.d + c.window);
  // The whole prefix's q, k, v; q spans [-3, 3] so softmax rows are far from uniform.
  const std::vector<float> q = RandomVector(size_t(total * qw), seed, -3.0f, 3.0f);
  const std::vector<float> k = RandomVector(size_t(total * kw), seed + 1);
  const std::vector<float> v = RandomVector(size_t(total * kw), seed + 2);
  auto rows = [](const std::vector<float>& x, int64_t from, int64_t to, int64_t w) {
    return std::vector<float>(x.begin() + from * w, x.begin() + to * w);
  };
  // The cache: the first P rows filled, the rest poison (NaN) that the op must overwrite or skip.
  std::vector<float> kc(size_t(c.capacity * kw), NAN), vc(size_t(c.capacity * kw), NAN);
  std::copy(k.begin(), k.begin() + c.past * kw, kc.begin());
  std::copy(v.begin(), v.begin() + c.past * kw, vc.begin());
  HostTensor tq(DType::kF32, Shape{c.n, qw}, rows(q, c.past, total, qw));
  HostTensor tk(DType::kF32, Shape{c.n, kw}, rows(k, c.past, total, kw));
  HostTensor tv(DType::kF32, Shape{c.n, kw}, rows(v, c.past, total, kw));
  HostTensor tkc(DType::kF32, Shape{c.capacity, kw}, kc),
      tvc(DType::kF32, Shape{c.capacity, kw}, vc);
  HostTensor to(DType::kF32, Shape{c.n, qw}), tlse(DType::kF32, Shape{c.n, c.hq});
  const float scale = 1.0f / std::sqrt(float(c.d));
  DecodeAttentionArgs a{{c.n, c.past, c.capacity, c.hq, c.hkv, c.d},
                        tq.tensor(),
                        tk.tensor(),
                        tv.tensor(),
                        tkc.tensor(),
                        tvc.tensor(),
                        to.tensor(),
                        tlse.tensor(),
                        scale,
                        c.window};
  ASSERT_TRUE(ValidateDecodeAttention(a).ok()) << ValidateDecodeAttention(a).ToString();
  ThreadPool pool(c.threads);
  cpu::DecodeAttention(pool, a);

  // The cache rows [0, P+n) now hold exactly the prefix's k and v (a copy: bit-equal).
  EXPECT_EQ(rows(tkc.Get(), 0, total, kw), rows(k, 0, total, kw));
  EXPECT_EQ(rows(tvc.Get(), 0, total, kw), rows(v, 0, total, kw));

  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
  std::vector<double> o(qd.size()), lse(size_t(total * c.hq));
  const ref::AttentionDims dims{1, total, c.hq, c.hkv, c.d, c.window, double(scale)};
  ref::AttentionForward<double>(qd.data(), kd.data(), vd.data(), nullptr, dims, o.data(),
                                lse.data());
  const std::vector<float> o_want = rows(std::vector<float>(o.begin(), o.end()), c.past, total, qw);
  const std::vector<float> lse_want =
      rows(std::vector<float>(lse.begin(), lse.end()), c.past, total, c.hq);
  // fp32 math on the same inputs against a double reference: a score scale*q.k (|q| <= 3,
  // |k| <= 1) has an absolute error of at most ~D ulps of its bound 3*sqrt(D), i.e. 3*D^1.5*eps;
  // exp carries it relatively into each probability; the output, a convex mix of |v| <= 1 with
  // up to P+n terms, adds (P+n)*eps. lse adds the log of the sum's relative error.
  const float eps = DTypeEpsilon(DType::kF32);
  const float score_err = 3.0f * std::pow(float(c.d), 1.5f) * eps;
  const float atol = 2.0f * (score_err + float(total) * eps);
  ExpectClose(to.Get(), o_want, atol, 4 * eps, "o");
  ExpectClose(tlse.Get(), lse_want, atol, 4 * eps, "lse");
}

TEST(DecodeAttention, PrefillEqualsFullAttention) {
  Check({0, 17, 20, 4, 2, 16, 0, 3});
  Check({0, 9, 9, 2, 2, 8, 0, 1});
}

TEST(DecodeAttention, OneTokenAfterPrefixMatchesLastRow) {
  for (int64_t past : {1, 5, 40}) Check({past, 1, 64, 8, 2, 32, 0, 2});
  Check({63, 1, 64, 4, 1, 64, 0, 4});  // MQA, cache exactly full
}

TEST(DecodeAttention, ChunkAfterPrefix) { Check({12, 5, 30, 6, 3, 16, 0, 2}); }

TEST(DecodeAttention, SlidingWindow) {
  Check({20, 1, 32, 4, 2, 16, 6, 2});
  Check({10, 7, 32, 4, 4, 16, 4, 3});
  Check({3, 2, 8, 2, 1, 8, 16, 1});  // window wider than the prefix: no effect
}

TEST(DecodeAttention, RejectsAFullCacheAndBadShapes) {
  HostTensor q(DType::kF32, Shape{1, 8}), kv(DType::kF32, Shape{1, 8}), c(DType::kF32, Shape{4, 8});
  HostTensor o(DType::kF32, Shape{1, 8}), lse(DType::kF32, Shape{1, 1});
  DecodeAttentionArgs a{{1, 4, 4, 1, 1, 8}, q.tensor(), kv.tensor(),  kv.tensor(), c.tensor(),
                        c.tensor(),         o.tensor(), lse.tensor(), 0.5f,        0};
  Status s = ValidateDecodeAttention(a);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("KV cache is full"), std::string::npos) << s.ToString();
  a.shape.past = 3;
  EXPECT_TRUE(ValidateDecodeAttention(a).ok());
  a.lse = o.tensor();
  EXPECT_FALSE(ValidateDecodeAttention(a).ok());
}

}  // namespace
}  // namespace ferry
