#include "kernels/ops/gemm.h"

#include <string>

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateGemm(const GemmArgs& g) {
  int64_t ar, ac, br, bc, cr, cc;
  FERRY_RETURN_IF_ERROR(CheckMatrix("gemm", "a", g.a, &ar, &ac));
  FERRY_RETURN_IF_ERROR(CheckMatrix("gemm", "b", g.b, &br, &bc));
  FERRY_RETURN_IF_ERROR(CheckMatrix("gemm", "c", g.c, &cr, &cc));
  const GemmDims d = GemmDimsOf(g);
  const int64_t b_k = g.trans_b ? bc : br;
  if (b_k != d.k) {
    return Status::InvalidArgument(
        "gemm: inner dimensions differ: op(a) is (" + std::to_string(d.m) + ", " +
        std::to_string(d.k) + ") from a " + g.a.ToString() + (g.trans_a ? " transposed" : "") +
        ", op(b) is (" + std::to_string(b_k) + ", " + std::to_string(d.n) + ") from b " +
        g.b.ToString() + (g.trans_b ? " transposed" : ""));
  }
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("gemm", "c", g.c, Shape{d.m, d.n}));
  if (Given(g.bias)) FERRY_RETURN_IF_ERROR(CheckFloatTensor("gemm", "bias", g.bias, Shape{d.n}));
  return Status::Ok();
}

bool CudaGemmTakesDirectly(GemmDTypes t) {
  return t.a == t.b && (t.c == t.a || t.c == DType::kF32);
}

size_t CudaGemmScratchBytes(int64_t m, int64_t n, int64_t k, GemmDTypes t) {
  if (CudaGemmTakesDirectly(t)) return 0;
  const auto f32_copy = [](int64_t elems) {
    const size_t a = kCudaGemmScratchAlign;
    return (size_t(elems) * 4 + a - 1) / a * a;
  };
  size_t bytes = 0;
  if (t.a != DType::kF32) bytes += f32_copy(m * k);
  if (t.b != DType::kF32) bytes += f32_copy(k * n);
  if (t.c != DType::kF32) bytes += f32_copy(m * n);
  return bytes;
}

size_t GemmScratchBytes(OpTarget t, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes) {
  return ScratchReportsFor(t.kind).gemm(t.threads, m, n, k, dtypes);
}

size_t GemmScratchBytes(const Device& d, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes) {
  return GemmScratchBytes(OpTargetOf(d), m, n, k, dtypes);
}

Status Gemm(Device& d, const GemmArgs& g) {
  FERRY_RETURN_IF_ERROR(ValidateGemm(g));
  const GemmDims dims = GemmDimsOf(g);
  const size_t need =
      GemmScratchBytes(d, dims.m, dims.n, dims.k, {g.a.dtype, g.b.dtype, g.c.dtype});
  const size_t have = g.scratch.data.is_null() ? 0 : g.scratch.bytes();
  if (have < need) {
    return Status::InvalidArgument("gemm: scratch holds " + std::to_string(have) +
                                   " bytes, this product needs " + std::to_string(need) +
                                   " on device '" + d.name() + "' (size it with GemmScratchBytes)");
  }
  return RunKernel(d, &Backend::gemm, g);
}

}  // namespace ferry
