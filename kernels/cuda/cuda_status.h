// CUDA runtime and cuBLAS error codes turned into Status: the one place where that happens.
// Every CUDA call in kernels/cuda is checked through these, and the Status names the call.
//
// Thread-safety: free functions, no state.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "kernels/status.h"

namespace ferry {

// Ok for cudaSuccess; otherwise "<what>: <cudaErrorName> (<description>)" with a code that says
// what to do: OutOfMemory for allocation failures, Unavailable when there is no usable GPU or
// driver, InvalidArgument for invalid values, Internal for the rest (a fault in ferry's kernels).
Status CudaStatus(cudaError_t err, std::string_view what);
Status CublasStatus(cublasStatus_t err, std::string_view what);

}  // namespace ferry

// Returns the Status of a CUDA runtime call from the enclosing function when it failed; the
// message names the call as written.
#define FERRY_CUDA_RETURN_IF_ERROR(call) FERRY_RETURN_IF_ERROR(::ferry::CudaStatus((call), #call))
#define FERRY_CUBLAS_RETURN_IF_ERROR(call) \
  FERRY_RETURN_IF_ERROR(::ferry::CublasStatus((call), #call))
