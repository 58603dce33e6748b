// NF4 dequantization on CUDA (kernels/ops/nf4_dequantize.h): a thread per packed byte (two
// outputs), grid-stride, the 16-entry map in shared memory. The arithmetic is the host codec's
// (kernels/nf4.h) spelled with explicit roundings, __fmul_rn and __fadd_rn, so nvcc cannot fuse
// a nested absmax's product and sum into an fma: bit for bit the CPU kernel and bitsandbytes.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

struct Nf4Parts {
  const uint8_t* packed;       // ((n + 1) / 2)
  const float* code;           // (16)
  const float* absmax;         // (blocks), not nested
  const uint8_t* absmax_q;     // (blocks), nested
  const float* nested_absmax;  // (ceil(blocks / nested_block)), nested
  const float* nested_code;    // (256), nested
  const float* nested_offset;  // (1), nested
  int64_t nested_block;
  int64_t block;
};

__device__ __forceinline__ float BlockAbsmax(const Nf4Parts& p, int64_t b) {
  if (p.absmax_q == nullptr) return p.absmax[b];
  return __fadd_rn(__fmul_rn(p.nested_code[p.absmax_q[b]], p.nested_absmax[b / p.nested_block]),
                   *p.nested_offset);
}

__global__ void Nf4DequantizeKernel(Nf4Parts p,
                                    DeviceFloats out,  // (n), written
                                    int64_t n) {
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = p.code[threadIdx.x];
  __syncthreads();
  const int64_t bytes = (n + 1) / 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < bytes; k += stride) {
    const uint8_t byte = p.packed[k];
    const int64_t i = 2 * k;
    out.Store(i, __fmul_rn(code[byte >> 4], BlockAbsmax(p, i / p.block)));
    // block is even, so both elements of a byte share a block.
    if (i + 1 < n) out.Store(i + 1, __fmul_rn(code[byte & 0x0f], BlockAbsmax(p, i / p.block)));
  }
}

}  // namespace

Status Nf4Dequantize(CudaDevice& d, const Nf4DequantizeArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("nf4_dequantize", a.out.dtype));
  const int64_t n = a.out.numel();
  if (n == 0) return Status::Ok();
  const bool nested = a.nested();
  Nf4Parts p{};
  p.packed = BackendAccess::Data<const uint8_t>(a.packed);
  p.code = BackendAccess::Data<const float>(a.code);
  if (nested) {
    p.absmax_q = BackendAccess::Data<const uint8_t>(a.absmax);
    p.nested_absmax = BackendAccess::Data<const float>(a.nested_absmax);
    p.nested_code = BackendAccess::Data<const float>(a.nested_code);
    p.nested_offset = BackendAccess::Data<const float>(a.nested_offset);
  } else {
    p.absmax = BackendAccess::Data<const float>(a.absmax);
  }
  p.nested_block = a.nested_block;
  p.block = a.block;
  return d.EnqueueCompute("nf4_dequantize", [p, out = Floats(a.out), n](const CudaContext& c) {
    Nf4DequantizeKernel<<<ElementwiseBlocks(c, (n + 1) / 2), kElementwiseThreads, 0, c.compute>>>(
        p, out, n);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
