// How an op reaches a device. Each op lives in kernels/ops/<op>.h as an argument struct, a
// validator, a scratch-size report and a free function `Status Op(Device&, const Args&)` that
// validates (errors at enqueue time) and enqueues on the device's compute stream:
//   - CPU device: the fast CPU kernel (kernels/cpu/<op>.cc) on the device's pool;
//   - CUDA device: the CUDA kernel (kernels/cuda/<op>.cu), or Unavailable until it exists.
// The plain reference (kernels/ref/) is a separate host function used by tests.
#pragma once

#include <functional>
#include <string_view>

#include "kernels/cpu/cpu_device.h"
#include "kernels/device.h"

namespace ferry {

// Enqueues `kernel` on a CPU device's compute stream. REQUIRES: d.kind() == kCpu.
inline Status EnqueueCpuKernel(Device& d, std::string_view op,
                               std::function<Status(ThreadPool&)> kernel) {
  return static_cast<CpuDevice&>(d).EnqueueCompute(op, std::move(kernel));
}

// The error for an op that has no implementation on this device kind yet.
Status NotOnDevice(const Device& d, std::string_view op);

}  // namespace ferry
