// What an op's scratch size depends on besides its own dtypes and shape: the kind of device it
// runs on and, on a CPU device, the device's compute threads (per-worker panels). The devices and
// the memory model (engine/plan) both size scratch from this value, so a plan counts exactly what
// a device asks for; a planner can size a CUDA device's scratch on a machine without CUDA.
#pragma once

#include "kernels/device.h"

namespace ferry {

struct OpTarget {
  DeviceKind kind = DeviceKind::kCpu;
  int threads = 1;  // a CPU device's compute threads; ignored by the other kinds
};

// The target `d` is: its kind and, for a CPU device, its compute thread count.
OpTarget OpTargetOf(const Device& d);

}  // namespace ferry
