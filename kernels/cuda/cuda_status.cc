#include "kernels/cuda/cuda_status.h"

#include <string>

namespace ferry {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  switch (err) {
    case cudaErrorMemoryAllocation:
      return Status::OutOfMemory(std::move(msg) + "; lower the memory cap or the plan's size");
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Status::Unavailable(std::move(msg) + "; check the GPU and driver (nvidia-smi)");
    case cudaErrorInvalidValue:
      return Status::InvalidArgument(std::move(msg));
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
      return Status::FailedPrecondition(std::move(msg));
    default:
      return Status::Internal(std::move(msg));
  }
}

Status CublasStatus(cublasStatus_t err, std::string_view what) {
  if (err == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string msg =
      std::string(what) + ": " + cublasGetStatusName(err) + " (" + cublasGetStatusString(err) + ")";
  switch (err) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return Status::OutOfMemory(std::move(msg));
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return Status::Unavailable(std::move(msg));
    case CUBLAS_STATUS_INVALID_VALUE:
      return Status::InvalidArgument(std::move(msg));
    default:
      return Status::Internal(std::move(msg));
  }
}

}  // namespace ferry
