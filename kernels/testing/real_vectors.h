// Small vector helpers for tests that compare kernels with the double-precision references
// (header-only; tests only): float <-> double copies, zeros, the largest magnitude (tolerance
// scales) and the dot product that turns an op's output into the scalar loss L = sum(G o y) of a
// finite-difference check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ferry::testing {

inline std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> Zeros(int64_t n) {
  return std::vector<double>(static_cast<size_t>(n), 0.0);
}
inline double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
// REQUIRES: a.size() == b.size().
inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ferry::testing
