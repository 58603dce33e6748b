#include "kernels/ops/backend.h"

#include <string>

#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/op_target.h"

namespace ferry {
namespace {

// The CUDA kernels' sizes, compiled without CUDA too (the planner sizes GPU plans anywhere).
// GEMM: fp32 copies of the operands cuBLAS does not take (kernels/ops/gemm.h). Attention reports
// its CudaAttentionLayout (cuDNN's stats, the documents' offsets, a bounded workspace); the LM head
// reports its CudaLmHeadLossLayout. The library workspace is
// CudaDeviceOptions::cublas_workspace_bytes' default: NVIDIA's advice for Hopper+, enough for
// Ada/Ampere too. The other CUDA kernels need no scratch: the norms' parameter gradients and the
// bias gradient sum columns inside one block per column tile (kernels/cuda/reduce.cuh), with no
// cross-block partials to keep.
constexpr ScratchReports kCudaScratch{
    .gemm = [](int, int64_t m, int64_t n, int64_t k,
               GemmDTypes dtypes) { return CudaGemmScratchBytes(m, n, k, dtypes); },
    .attention = [](int,
                    const AttentionShape& shape) { return MakeCudaAttentionLayout(shape).total; },
    .lm_head_loss =
        [](int, int64_t chunk_tokens, int64_t V, int64_t C, DType h_dtype,
           std::optional<DType> dw_dtype, bool backward) {
          return MakeCudaLmHeadLossLayout(chunk_tokens, V, C, h_dtype, dw_dtype, backward).total;
        },
    .library_workspace = size_t(32) << 20,
};

}  // namespace

const ScratchReports& CudaScratchReports() { return kCudaScratch; }

const Backend* FindBackend(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return &CpuBackend();
    case DeviceKind::kCuda:
#ifdef FERRY_WITH_CUDA
      return &CudaBackend();
#else
      return nullptr;
#endif
  }
  return nullptr;
}

const ScratchReports& ScratchReportsFor(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? CudaScratchReports() : CpuScratchReports();
}

OpTarget OpTargetOf(const Device& d) {
  if (d.kind() != DeviceKind::kCpu) return {d.kind(), 1};
  return {DeviceKind::kCpu, static_cast<const CpuDevice&>(d).options().compute_threads};
}

Status NotOnDevice(const Device& d, std::string_view op) {
  return Status::Unavailable("op '" + std::string(op) + "' has no implementation on device '" +
                             d.name() + "' yet");
}

}  // namespace ferry
