// The raw CUDA handles of one CudaDevice, for op implementations in kernels/cuda only (reached
// through CudaDevice::EnqueueCompute, which holds the compute stream's enqueue lock while they are
// used). Owned by the device; valid for its lifetime.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry {

class CudnnAttention;  // kernels/cuda/attention_cudnn.h

struct CudaContext {
  int ordinal = 0;
  cudaStream_t compute = nullptr;
  cublasHandle_t cublas = nullptr;       // bound to `compute`, workspace set
  cublasLtHandle_t cublas_lt = nullptr;  // pass `workspace` to cublasLtMatmul on `compute`
  void* workspace = nullptr;             // shared by cuBLAS and cuBLASLt (same stream, in order)
  size_t workspace_bytes = 0;
  int multiprocessors = 0;              // for grid sizing
  int compute_capability = 0;           // major * 10 + minor
  CudnnAttention* attention = nullptr;  // cuDNN handle and SDPA graphs, created on first use
};

}  // namespace ferry
