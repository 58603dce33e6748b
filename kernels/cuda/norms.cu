// RMSNorm and LayerNorm on CUDA, forward and backward (kernels/ops/rmsnorm.h, layernorm.h), and the
// bias gradient (kernels/ops/gemm_bias_grad.h), with the CPU kernels' formulas and rounding points
// (kernels/cpu/rmsnorm.cc, layernorm.cc, gemm.cc); math fp32, each tensor f32, bf16 or f16.
//
// Row work (forward, and dx in backward): a block per row, the row's sums by BlockSum; rstd and
// mean are written (=), y and dx are written (=). y may alias x and dx may alias dy: each thread
// reads its elements before writing them, and the row's sums are complete (BlockSum synchronizes)
// before the first write.
// Column work (dweight, dbias, BiasGrad: parameter gradients, accumulated +=): the fixed-order
// column sums of reduce.cuh, run BEFORE the dx kernel because dx may overwrite dy. No scratch;
// the same bits on every run.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

namespace ferry::cuda {
namespace {

// ---- RMSNorm ----

__global__ void RmsNormForwardKernel(DeviceFloats x,            // (N, C)
                                     DeviceFloats w,            // (C)
                                     DeviceFloats y,            // (N, C), written
                                     float* __restrict__ rstd,  // (N), written
                                     int64_t cols, float eps) {
  const int64_t row = blockIdx.x, base = row * cols;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = x.Load(base + j);
    ss += v * v;
  }
  const float rs = 1.0f / sqrtf(BlockSum(ss) / float(cols) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    y.Store(base + j, w.Load(j) * x.Round(x.Load(base + j) * rs));  // HF: xhat in x's dtype
  }
}

// dw += dy * round_x(x * rstd), summed over rows.
struct RmsNormWeightTerm {
  DeviceFloats dy, x;
  const float* rstd;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&sums)[1]) const {
    const int64_t i = r * cols + c;
    sums[0] += dy.Load(i) * x.Round(x.Load(i) * rstd[r]);
  }
};

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w.
__global__ void RmsNormBackwardKernel(DeviceFloats dy,                 // (N, C)
                                      DeviceFloats x,                  // (N, C)
                                      DeviceFloats w,                  // (C)
                                      const float* __restrict__ rstd,  // (N)
                                      DeviceFloats dx,                 // (N, C), written
                                      int64_t cols) {
  const int64_t row = blockIdx.x, base = row * cols;
  const float rs = rstd[row];
  float dot = 0.0f;  // sum of dy * w * x
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    dot += dy.Load(base + j) * w.Load(j) * x.Load(base + j);
  }
  const float mean_dot = BlockSum(dot) * rs / float(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy.Load(base + j) * w.Load(j);
    dx.Store(base + j, rs * (g - x.Load(base + j) * rs * mean_dot));
  }
}

// ---- LayerNorm ----

__global__ void LayerNormForwardKernel(DeviceFloats x,            // (N, C)
                                       DeviceFloats w,            // (C)
                                       DeviceFloats b,            // (C)
                                       DeviceFloats y,            // (N, C), written
                                       float* __restrict__ mean,  // (N), written
                                       float* __restrict__ rstd,  // (N), written
                                       int64_t cols, float eps) {
  const int64_t row = blockIdx.x, base = row * cols;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += x.Load(base + j);
  const float m = BlockSum(sum) / float(cols);
  float ss = 0.0f;  // second pass: sum of (x - m)^2, no cancellation
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = x.Load(base + j) - m;
    ss += v * v;
  }
  const float rs = 1.0f / sqrtf(BlockSum(ss) / float(cols) + eps);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    y.Store(base + j, (x.Load(base + j) - m) * rs * w.Load(j) + b.Load(j));
  }
}

// dw += dy * xhat, db += dy, summed over rows.
struct LayerNormParamTerm {
  DeviceFloats dy, x;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&sums)[2]) const {
    const int64_t i = r * cols + c;
    const float d = dy.Load(i);
    sums[0] += d * ((x.Load(i) - mean[r]) * rstd[r]);
    sums[1] += d;
  }
};

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
__global__ void LayerNormBackwardKernel(DeviceFloats dy,                 // (N, C)
                                        DeviceFloats x,                  // (N, C)
                                        DeviceFloats w,                  // (C)
                                        const float* __restrict__ mean,  // (N)
                                        const float* __restrict__ rstd,  // (N)
                                        DeviceFloats dx,                 // (N, C), written
                                        int64_t cols) {
  const int64_t row = blockIdx.x, base = row * cols;
  const float m = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy.Load(base + j) * w.Load(j);
    sum_g += g;
    sum_gx += g * ((x.Load(base + j) - m) * rs);
  }
  const float mean_g = BlockSum(sum_g) / float(cols);
  const float mean_gx = BlockSum(sum_gx) / float(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy.Load(base + j) * w.Load(j);
    dx.Store(base + j, rs * (g - mean_g - (x.Load(base + j) - m) * rs * mean_gx));
  }
}

// ---- BiasGrad ----

struct BiasTerm {
  DeviceFloats dy;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&sums)[1]) const {
    sums[0] += dy.Load(r * cols + c);
  }
};

const float* F32(const Tensor& t) { return BackendAccess::Data<const float>(t); }
float* MutableF32(const Tensor& t) { return BackendAccess::Data<float>(t); }

}  // namespace

Status RmsNormForward(CudaDevice& d, const RmsNormForwardArgs& a) {
  constexpr std::string_view kOp = "rmsnorm_forward";
  FERRY_RETURN_IF_ERROR(RequireFloatStorage(kOp, {a.x.dtype, a.weight.dtype, a.y.dtype}));
  const int64_t rows = a.x.dim(0), cols = a.x.dim(1);
  FERRY_RETURN_IF_ERROR(CheckGridRows(kOp, rows));
  if (rows == 0 || cols == 0) return Status::Ok();
  return d.EnqueueCompute(kOp, [&](const CudaContext& c) -> Status {
    RmsNormForwardKernel<<<unsigned(rows), RowThreads(cols), 0, c.compute>>>(
        Floats(a.x), Floats(a.weight), Floats(a.y), MutableF32(a.rstd), cols, a.eps);
    return Status::Ok();
  });
}

Status RmsNormBackward(CudaDevice& d, const RmsNormBackwardArgs& a) {
  constexpr std::string_view kOp = "rmsnorm_backward";
  FERRY_RETURN_IF_ERROR(RequireFloatStorage(
      kOp, {a.dy.dtype, a.x.dtype, a.weight.dtype, a.dx.dtype, a.dweight.dtype}));
  const int64_t rows = a.x.dim(0), cols = a.x.dim(1);
  FERRY_RETURN_IF_ERROR(CheckGridRows(kOp, rows));
  if (cols == 0) return Status::Ok();
  return d.EnqueueCompute(kOp, [&](const CudaContext& c) -> Status {
    // dw first: dx may alias dy.
    AccumulateColumnSums<1><<<ColumnBlocks(cols), ColumnBlock(), 0, c.compute>>>(
        RmsNormWeightTerm{Floats(a.dy), Floats(a.x), F32(a.rstd), cols}, rows, cols,
        Floats(a.dweight), Floats(a.dweight));
    if (rows > 0) {
      RmsNormBackwardKernel<<<unsigned(rows), RowThreads(cols), 0, c.compute>>>(
          Floats(a.dy), Floats(a.x), Floats(a.weight), F32(a.rstd), Floats(a.dx), cols);
    }
    return Status::Ok();
  });
}

Status LayerNormForward(CudaDevice& d, const LayerNormForwardArgs& a) {
  constexpr std::string_view kOp = "layernorm_forward";
  FERRY_RETURN_IF_ERROR(
      RequireFloatStorage(kOp, {a.x.dtype, a.weight.dtype, a.bias.dtype, a.y.dtype}));
  const int64_t rows = a.x.dim(0), cols = a.x.dim(1);
  FERRY_RETURN_IF_ERROR(CheckGridRows(kOp, rows));
  if (rows == 0 || cols == 0) return Status::Ok();
  return d.EnqueueCompute(kOp, [&](const CudaContext& c) -> Status {
    LayerNormForwardKernel<<<unsigned(rows), RowThreads(cols), 0, c.compute>>>(
        Floats(a.x), Floats(a.weight), Floats(a.bias), Floats(a.y), MutableF32(a.mean),
        MutableF32(a.rstd), cols, a.eps);
    return Status::Ok();
  });
}

Status LayerNormBackward(CudaDevice& d, const LayerNormBackwardArgs& a) {
  constexpr std::string_view kOp = "layernorm_backward";
  FERRY_RETURN_IF_ERROR(RequireFloatStorage(
      kOp, {a.dy.dtype, a.x.dtype, a.weight.dtype, a.dx.dtype, a.dweight.dtype, a.dbias.dtype}));
  const int64_t rows = a.x.dim(0), cols = a.x.dim(1);
  FERRY_RETURN_IF_ERROR(CheckGridRows(kOp, rows));
  if (cols == 0) return Status::Ok();
  return d.EnqueueCompute(kOp, [&](const CudaContext& c) -> Status {
    // dw and db first: dx may alias dy.
    AccumulateColumnSums<2><<<ColumnBlocks(cols), ColumnBlock(), 0, c.compute>>>(
        LayerNormParamTerm{Floats(a.dy), Floats(a.x), F32(a.mean), F32(a.rstd), cols}, rows, cols,
        Floats(a.dweight), Floats(a.dbias));
    if (rows > 0) {
      LayerNormBackwardKernel<<<unsigned(rows), RowThreads(cols), 0, c.compute>>>(
          Floats(a.dy), Floats(a.x), Floats(a.weight), F32(a.mean), F32(a.rstd), Floats(a.dx),
          cols);
    }
    return Status::Ok();
  });
}

Status BiasGrad(CudaDevice& d, const BiasGradArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("bias_grad", {a.dy.dtype, a.db.dtype}));
  const int64_t rows = a.dy.dim(0), cols = a.dy.dim(1);
  if (cols == 0) return Status::Ok();
  return d.EnqueueCompute("bias_grad", [&](const CudaContext& c) -> Status {
    AccumulateColumnSums<1><<<ColumnBlocks(cols), ColumnBlock(), 0, c.compute>>>(
        BiasTerm{Floats(a.dy), cols}, rows, cols, Floats(a.db), Floats(a.db));
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
