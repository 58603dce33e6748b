// LayerProbe: measures the forward and backward time of every distinct layer a plan prices — one
// decoder block of each distinct shape, the embedding, the fused head + loss — on the device a job
// would run on, at the micro-batch shapes, compute dtype and LoRA setting the planner tries, and
// keys each time exactly as the planner looks it up (plan::LayerTimeQueries, plan::LayerTimeKey).
// Merged into a hardware profile's layer_times (`ferry probe --model M ...`), the times replace the
// planner's FLOP formulas for that job.
//
// Each layer runs the real layer code (DecoderBlocks, Head, the host embedding) on randomly
// initialized weights of the real shapes, one layer at a time: what the device and the host hold
// is one layer's weights, gradients and activations, freed before the next layer. Before anything
// is allocated every layer's bytes are checked against the memory the probe may use; a layer that
// does not fit is refused (OutOfMemory naming the layer, the bytes it needs and what is there).
//
// What is timed (plan::TimeRuns: wall clock, each call followed by a device synchronize; `warmup`
// untimed runs, then the median of `repeats`):
//  - block: Forward, then Backward (input gradient and parameter gradients);
//  - head: forward_s = the loss-only pass (Head::Forward), backward_s = the fused
//    ForwardBackward's time minus that (so forward_s + backward_s is the fused pass, which is
//    what the planner's tail costs);
//  - embedding: the host gather, then the host scatter-add of its gradient (0 when the table is
//    frozen: LoRA).
//
// Stateless functions; the device factory's device is owned here for one layer's probe. Not for
// concurrent use with other timing-sensitive work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/plan/hardware_profile.h"
#include "engine/plan/planner.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

// Makes the device one layer is probed on, with an arena of `device_bytes`.
using ProbeDeviceFactory = std::function<Result<std::unique_ptr<Device>>(size_t device_bytes)>;

struct LayerProbeOptions {
  int warmup = 1;   // untimed runs per layer
  int repeats = 3;  // timed runs per layer and direction; the median is kept
  // Host bytes the probe may use (0: the OS's MemAvailable now).
  uint64_t host_memory_bytes = 0;
  // The device's memory is host memory (a CpuDevice): its arena counts against host_memory_bytes.
  bool device_memory_is_host = true;
  int cpu_threads = 1;  // sizes the op scratch of a CPU device (plan::ScratchTarget)
  uint64_t seed = 1;    // weights, hidden states and targets
};

// What one layer's probe allocates.
struct LayerProbeBytes {
  uint64_t host = 0;    // host master weights and staging
  uint64_t device = 0;  // the device arena (weights, gradients, activations, workspace, scratch)
};

struct LayerProbeEntry {
  plan::MeasuredLayerTime time;  // key, forward_s, backward_s
  std::string layer;             // the probed layer's name ("block.0", "head", "embedding")
  BatchShape micro;
  LayerProbeBytes bytes;
};

// The bytes probing `layer` at `micro` takes (an upper estimate).
LayerProbeBytes LayerProbeNeeds(const ModelConfig& model, const plan::PlanJob& job,
                                const LayerSpec& layer, BatchShape micro,
                                const LayerProbeOptions& options);

// The OS's available host memory (MemAvailable; free pages when /proc/meminfo is unreadable).
uint64_t AvailableHostMemory();

// Probes every query of plan::LayerTimeQueries(model, job, gpus), in that order. Errors:
// InvalidArgument for a compute dtype the devices cannot run (f32 only today) or a bad model or
// job; OutOfMemory, before anything runs, naming the first layer that does not fit; those of the
// device factory and the layers.
[[nodiscard]] Result<std::vector<LayerProbeEntry>> ProbeLayerTimes(
    const ModelConfig& model, const plan::PlanJob& job, int gpus,
    const ProbeDeviceFactory& make_device, const LayerProbeOptions& options);

// Puts `times` into profile.layer_times: an entry with the same key is replaced, others appended.
void MergeLayerTimes(const std::vector<LayerProbeEntry>& times, plan::HardwareProfile& profile);

}  // namespace ferry
