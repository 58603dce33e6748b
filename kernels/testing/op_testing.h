// Helpers for op tests (header-only; tests only): random data, storage rounding, element-by-element
// comparison with dtype-derived tolerances, finite-difference gradients, and host<->"device"
// staging for calling CPU kernels directly.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_access.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace ferry::testing {

inline std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Rounds every element through a storage dtype (what storing it would keep).
inline std::vector<float> Rounded(std::vector<float> v, DType t) {
  for (auto& x : v) x = RoundTo(t, x);
  return v;
}

// Host storage of a vector in a dtype, viewable as a Tensor for calling CPU kernels directly.
// (In kernels/ tests only: real callers hold device memory from a Device.)
class HostTensor {
 public:
  HostTensor(DType t, Shape shape) : dtype_(t), shape_(shape),
      bytes_(size_t(shape.numel()) * DTypeSize(t) + 64) {}
  HostTensor(DType t, Shape shape, const std::vector<float>& values) : HostTensor(t, shape) {
    Set(values);
  }
  void Set(const std::vector<float>& v) {
    assert(int64_t(v.size()) == shape_.numel());
    ConvertFromFloat(v.data(), dtype_, bytes_.data(), v.size());
  }
  std::vector<float> Get() const {
    std::vector<float> v(size_t(shape_.numel()));
    ConvertToFloat(dtype_, bytes_.data(), v.data(), v.size());
    return v;
  }
  Tensor tensor() {
    return Tensor{BackendAccess::Wrap(reinterpret_cast<std::byte*>(bytes_.data())), dtype_, shape_};
  }

 private:
  DType dtype_;
  Shape shape_;
  std::vector<uint8_t> bytes_;
};

// Expects |got - want| <= atol + rtol * |want| for every element; reports the first few
// mismatches with their index, and the worst error.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float atol,
                        float rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double lim = atol + rtol * std::fabs(double(want[i]));
    if (!(err <= lim)) {  // NaN fails too
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i]
                                 << " (err " << err << " > " << lim << ")";
      ++bad;
    }
    if (err > worst || std::isnan(err)) { worst = err; worst_i = i; }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off; worst at ["
                    << worst_i << "] err " << worst;
}

// Central finite differences of a scalar function f with respect to x (modified in place and
// restored), in double precision where the caller's f allows. Step h is relative to |x_i|.
inline std::vector<double> FiniteDifference(std::vector<double>& x,
                                            const std::function<double()>& f, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    const double step = h * std::max(1.0, std::fabs(saved));
    x[i] = saved + step;
    const double fp = f();
    x[i] = saved - step;
    const double fm = f();
    x[i] = saved;
    g[i] = (fp - fm) / (2 * step);
  }
  return g;
}

}  // namespace ferry::testing
