// Fast CPU GELU (erf and tanh) against the reference (double) in f32 and bf16 storage, and
// finite-difference checks of the reference derivative.
#include "kernels/cpu/gelu.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ref/gelu.h"
#include "kernels/testing/op_testing.h"
#include "kernels/testing/real_vectors.h"

namespace ferry {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;
using testing::ToDouble;
using testing::ToFloat;

void Check(int64_t n, DType dt, GeluApprox approx, int threads, bool in_place) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " " << DTypeName(dt) << " tanh="
                                    << (approx == GeluApprox::kTanh) << " in_place=" << in_place);
  const bool tanh = approx == GeluApprox::kTanh;
  const auto x = Rounded(RandomVector(size_t(n), 1, -5, 5), dt);
  const auto dy = Rounded(RandomVector(size_t(n), 2), dt);
  std::vector<double> y(x.size()), dx(x.size());
  ref::GeluForward<double>(n, ToDouble(x).data(), y.data(), tanh);
  ref::GeluBackward<double>(n, ToDouble(x).data(), ToDouble(dy).data(), dx.data(), tanh);

  ThreadPool pool(threads);
  HostTensor tx(dt, {n}, x), ty(dt, {n}), tdy(dt, {n}, dy), tdx(dt, {n});
  GeluForwardArgs fa{tx.tensor(), in_place ? tx.tensor() : ty.tensor(), approx};
  GeluBackwardArgs ba{tx.tensor(), tdy.tensor(), in_place ? tdy.tensor() : tdx.tensor(), approx};
  ASSERT_TRUE(ValidateGeluBackward(ba).ok());
  ASSERT_TRUE(cpu::GeluBackward(pool, ba).ok());  // before the forward, which may overwrite x
  ASSERT_TRUE(ValidateGeluForward(fa).ok());
  ASSERT_TRUE(cpu::GeluForward(pool, fa).ok());
  // fp32 libm erf/tanh/exp are within a few ulp, and each formula adds < 8 roundings: 16 u32
  // relative to the terms. In the tail (x << 0) 1 + tanh / 1 + erf cancel, so the bound is
  // absolute there, relative to the largest term |x| <= 5: 16 u32 * 5. bf16 storage adds one
  // rounding of the output (relative u_bf16).
  const float u32 = DTypeEpsilon(DType::kF32), ud = dt == DType::kF32 ? 0 : DTypeEpsilon(dt);
  ExpectClose(in_place ? tx.Get() : ty.Get(), ToFloat(y), 80 * u32, 16 * u32 + ud, "y");
  ExpectClose(in_place ? tdy.Get() : tdx.Get(), ToFloat(dx), 80 * u32, 16 * u32 + ud, "dx");
}

TEST(CpuGelu, MatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (GeluApprox ap : {GeluApprox::kErf, GeluApprox::kTanh}) {
      Check(1, dt, ap, 2, false);
      Check(1031, dt, ap, 3, false);
      Check(40009, dt, ap, 2, true);  // several parallel chunks
    }
  }
}

TEST(RefGelu, DerivativeMatchesFiniteDifferences) {
  for (bool tanh : {false, true}) {
    auto x = ToDouble(RandomVector(64, 3, -5, 5));
    const auto g = ToDouble(RandomVector(64, 4));
    auto loss = [&] {
      std::vector<double> y(x.size());
      ref::GeluForward<double>(int64_t(x.size()), x.data(), y.data(), tanh);
      return Dot(g, y);
    };
    std::vector<double> dx(x.size());
    ref::GeluBackward<double>(int64_t(x.size()), x.data(), g.data(), dx.data(), tanh);
    // Central differences, 1e-5 relative step on |x| <= 5: truncation ~h^2 |x|^2 |f'''| ~ 1e-8,
    // rounding ~1e-11; 1e-6 bounds both.
    ExpectClose(ToFloat(testing::FiniteDifference(x, loss)), ToFloat(dx), 1e-6f, 1e-6f,
                tanh ? "dx (tanh)" : "dx (erf)");
  }
}

// Known values (PyTorch): gelu(1) = 0.8413447, gelu_tanh(1) = 0.8411920.
TEST(RefGelu, KnownValues) {
  EXPECT_NEAR(ref::Gelu<double>(1.0, false), 0.8413447460685429, 1e-12);
  EXPECT_NEAR(ref::Gelu<double>(1.0, true), 0.8411919906082768, 1e-12);
}

}  // namespace
}  // namespace ferry
