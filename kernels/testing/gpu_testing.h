// Test helper (header-only; tests only): skips a test when no GPU is visible to the CUDA runtime,
// or fails it when FERRY_REQUIRE_GPU is set (scripts/gpu_check.sh sets it: there a missing GPU is
// a failure, never a silent skip). Build-independent: without FERRY_WITH_CUDA the reason is that
// CUDA is not built.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#ifdef FERRY_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace ferry::testing {

// Empty when a GPU can be used; otherwise why not.
inline std::string NoGpuReason() {
#ifdef FERRY_WITH_CUDA
  Result<int> count = CudaDevice::CountDevices();
  return count.ok() ? std::string() : count.status().message();
#else
  return "built without the CUDA toolkit";
#endif
}

#ifdef FERRY_WITH_CUDA
// A device on GPU 0 for a test, with an arena of `memory_bytes` of which `cublas_workspace_bytes`
// go to cuBLAS; nullptr (and a test failure naming the error) when it cannot be created. Call
// after FERRY_SKIP_WITHOUT_GPU.
inline std::unique_ptr<CudaDevice> CreateTestCudaDevice(size_t memory_bytes,
                                                        size_t cublas_workspace_bytes) {
  CudaDeviceOptions options;
  options.memory_bytes = memory_bytes;
  options.cublas_workspace_bytes = cublas_workspace_bytes;
  Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(options);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}
#endif

}  // namespace ferry::testing

// In a test body or SetUp: returns from it (skipped, or failed under FERRY_REQUIRE_GPU) unless a
// GPU can be used.
#define FERRY_SKIP_WITHOUT_GPU()                                                             \
  do {                                                                                       \
    const std::string ferry_no_gpu = ::ferry::testing::NoGpuReason();                        \
    if (!ferry_no_gpu.empty()) {                                                             \
      if (std::getenv("FERRY_REQUIRE_GPU") != nullptr) FAIL() << "no GPU: " << ferry_no_gpu; \
      GTEST_SKIP() << "no GPU: " << ferry_no_gpu;                                            \
    }                                                                                        \
  } while (0)
