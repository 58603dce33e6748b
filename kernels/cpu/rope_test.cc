// Tests of the fast CPU RoPE kernels against the reference
// (kernels/ref/rope.h), a hand-derived value of HF's rotate-half convention,
// and a finite-difference check of the reference backward.
#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ops/rope_math.h"
#include "kernels/ref/rope.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;

std::vector<float> Positions(int64_t n, uint64_t seed, int32_t max_pos) {
  std::vector<float> p = RandomVector(size_t(n), seed, 0.0f, float(max_pos));
  for (auto& x : p) x = std::floor(x);
  return p;
}

std::vector<int32_t> ToInt(const std::vector<float>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

struct RopeCase {
  int64_t n, heads, head_dim, rotary_dim;
  DType dtype;
  bool table;  // pass inv_freq explicitly (scaled, as Llama 3 would) instead of
               // theta
  bool in_place;
  int threads;
};

// Runs the fast forward and backward and compares each against the double
// reference on the same (storage-rounded) inputs.
void CheckAgainstReference(const RopeCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "n=" << c.n << " H=" << c.heads << " D=" << c.head_dim << " R=" << c.rotary_dim
               << " " << DTypeName(c.dtype) << (c.table ? " table" : "")
               << (c.in_place ? " in-place" : ""));
  const int64_t width = c.heads * c.head_dim, r = c.rotary_dim ? c.rotary_dim : c.head_dim;
  const float theta = 500000.0f;
  std::vector<float> inv_freq = RopeInverseFrequencies(theta, r);
  if (c.table) {
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= 1.0f + float(i) / 4;  // any table
  }
  const std::vector<float> pos = Positions(c.n, 7, 131072);
  const std::vector<float> x = Rounded(RandomVector(size_t(c.n * width), 11), c.dtype);
  ThreadPool pool(c.threads);
  HostTensor pos_t(DType::kI32, Shape{c.n}, pos), freq_t(DType::kF32, Shape{r / 2}, inv_freq);
  HostTensor in(c.dtype, Shape{c.n, width}, x), out(c.dtype, Shape{c.n, width});
  RopeArgs a{in.tensor(),    c.in_place ? in.tensor() : out.tensor(),
             pos_t.tensor(), Tensor{},
             c.heads,        c.head_dim,
             c.rotary_dim,   theta};
  if (c.table) a.inv_freq = freq_t.tensor();

  const ref::RopeDims dims{c.n, c.heads, c.head_dim, r};
  const std::vector<int32_t> ipos = ToInt(pos);
  std::vector<double> xd(x.begin(), x.end()), want(xd.size());
  ref::RopeForward<double>(xd.data(), ipos.data(), inv_freq.data(), dims, want.data());
  ASSERT_TRUE(cpu::RopeForward(pool, a).ok());
  // Each output is x1*cos - x2*sin (|x| <= 1, cos/sin rounded to fp32 from a
  // double evaluation on the same fp32 angle as the reference): fp32 math is
  // off by a few units of 2^-24, and storage rounding adds at most half an ulp,
  // i.e. DTypeEpsilon * |y| (the rtol term).
  const float eps = DTypeEpsilon(c.dtype), atol = 8 * DTypeEpsilon(DType::kF32);
  ExpectClose(c.in_place ? in.Get() : out.Get(), std::vector<float>(want.begin(), want.end()), atol,
              eps, "rope forward");

  const std::vector<float> dy = Rounded(RandomVector(size_t(c.n * width), 12), c.dtype);
  in.Set(dy);
  std::vector<double> dyd(dy.begin(), dy.end());
  ref::RopeBackward<double>(dyd.data(), ipos.data(), inv_freq.data(), dims, want.data());
  ASSERT_TRUE(cpu::RopeBackward(pool, a).ok());
  ExpectClose(c.in_place ? in.Get() : out.Get(), std::vector<float>(want.begin(), want.end()), atol,
              eps, "rope backward");
}

TEST(RopeTest, FastMatchesReference) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    CheckAgainstReference({1, 1, 2, 0, t, false, false, 1});
    CheckAgainstReference({7, 3, 8, 0, t, false, false, 2});
    CheckAgainstReference({33, 4, 64, 0, t, true, false, 3});
    CheckAgainstReference({13, 2, 80, 32, t, false, true, 2});  // partial rotary, in place
    CheckAgainstReference({130, 5, 128, 0, t, true, true, 3});
  }
}

// HF's convention by hand: head_dim 4, theta 10000 -> inv_freq = [1, 0.01]; at
// position 1, x = e0 rotates into (cos 1, 0, sin 1, 0) and x = e3 into (0, -sin
// .01, 0, cos .01).
TEST(RopeTest, RotateHalfConventionByHand) {
  ThreadPool pool(1);
  HostTensor pos(DType::kI32, Shape{2}, {1, 1});
  HostTensor x(DType::kF32, Shape{2, 4}, {1, 0, 0, 0, 0, 0, 0, 1}), y(DType::kF32, Shape{2, 4});
  RopeArgs a{x.tensor(), y.tensor(), pos.tensor(), Tensor{}, 1, 4, 0, 10000.0f};
  ASSERT_TRUE(cpu::RopeForward(pool, a).ok());
  // Only fp32 rounding of cos/sin and of inv_freq = 1/10000^0.5 separates
  // these.
  ExpectClose(y.Get(),
              {std::cos(1.0f), 0, std::sin(1.0f), 0, 0, -std::sin(0.01f), 0, std::cos(0.01f)},
              4 * DTypeEpsilon(DType::kF32), 0, "by hand");
}

// The backward is the transpose of the forward (a linear map): the gradient of
// L = sum(w * RopeForward(x)) by central differences must equal
// RopeBackward(w).
TEST(RopeTest, ReferenceBackwardMatchesFiniteDifferences) {
  const ref::RopeDims dims{3, 2, 6, 4};
  const std::vector<float> inv_freq = RopeInverseFrequencies(10000.0f, dims.rotary_dim);
  const std::vector<int32_t> pos{0, 5, 1000};
  const size_t n = size_t(dims.tokens * dims.num_heads * dims.head_dim);
  std::vector<double> x(n), w(n), y(n), grad(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.7 * double(i));
    w[i] = std::cos(1.3 * double(i));
  }
  auto loss = [&] {
    ref::RopeForward<double>(x.data(), pos.data(), inv_freq.data(), dims, y.data());
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += w[i] * y[i];
    return s;
  };
  const std::vector<double> fd = testing::FiniteDifference(x, loss);
  ref::RopeBackward<double>(w.data(), pos.data(), inv_freq.data(), dims, grad.data());
  // The loss is linear in x: central differences are exact up to double
  // rounding of ~|L|*1e-16/h.
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(grad[i], fd[i], 1e-9) << i;
}

// Backward undoes forward (rotation by -angle) up to fp32 rounding.
TEST(RopeTest, BackwardInvertsForward) {
  ThreadPool pool(2);
  const int64_t n = 17, h = 3, d = 16;
  const std::vector<float> x = RandomVector(size_t(n * h * d), 3);
  HostTensor pos(DType::kI32, Shape{n}, Positions(n, 5, 8192));
  HostTensor buf(DType::kF32, Shape{n, h * d}, x);
  RopeArgs a{buf.tensor(), buf.tensor(), pos.tensor(), Tensor{}, h, d, 0, 10000.0f};
  ASSERT_TRUE(cpu::RopeForward(pool, a).ok());
  ASSERT_TRUE(cpu::RopeBackward(pool, a).ok());
  // Two rotations of |x| <= 1 values, each a few fp32 roundings; cos^2+sin^2
  // off by ~2^-24.
  ExpectClose(buf.Get(), x, 16 * DTypeEpsilon(DType::kF32), 0, "round trip");
}

}  // namespace
}  // namespace ferry
