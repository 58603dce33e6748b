// Test helper (header-only; tests only): skips a test when no GPU is visible to the CUDA runtime,
// or fails it when FERRY_REQUIRE_GPU is set (scripts/gpu_check.sh sets it: there a missing GPU is
// a failure, never a silent skip). Build-independent: without FERRY_WITH_CUDA the reason is that
// CUDA is not built.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
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
