// LayerProbe: measures the forward and backward time of every distinct layer a plan prices — one
// decoder block of each distinct shape, the embedding, the fused head + loss — on the device a job
// would run on, at the micro-batch shapes, compute dtype and LoRA setting the planner tries, and
// keys each time exactly as the planner looks it up (plan::LayerTimeQueries, plan::LayerTimeKey).
// Merged into a hardware profile's layer_times (`ferry probe --model M ...`), the times replace the
// planner's FLOP formulas for that job.
//
// A probe is a plan run by the executor (engine/exec/pipeline_executor.h), as every run is: for
// each micro-batch shape, a one-block model of the job's shapes (its embedding, one block, its
// head) as a one-device, one-stage plan of one micro-batch (nothing recomputed, every tier in host
// RAM, the job's dtype, LoRA and quantized base), sized by the memory model like any plan: the
// device arena is the plan's GPU map, the host holds its pinned map and the fp32 (or NF4) weights
// and gradients of its pageable map (the optimizer's moments aside: nothing is updated). Before
// anything is allocated every run's bytes are checked against the memory the probe may use; a run
// that does not fit is refused (OutOfMemory naming the block and micro-batch, the bytes and what
// is there). Weights are randomly initialized at the real shapes.
//
// What is timed: `warmup` untimed, then `repeats` timed rounds of a training step (Step) and an
// evaluation (Evaluate), each traced (engine/exec/trace_recorder.h) by the device's own events
// around the kernels of each layer, so a time is what the device spent on that layer's compute,
// not on copies or waits. The executor runs isolated (PipelineExecutor::Create's
// isolate_compute): no weight copy and no host gradient add runs beside a kernel, as they would
// on a CPU device's cores (in training the head's upload and gradients overlap the first and last
// blocks; here the one block would take all of it). The median of the rounds is kept:
//  - block: its forward span, and its backward span (a stage's gradient zeroing, traced as the
//    stage's first compute, is not counted: the planner does not price it);
//  - head: forward_s = the evaluation's loss-only pass, backward_s = the step's fused
//    forward + backward less that (so forward_s + backward_s is the fused pass, which is what the
//    planner's tail costs);
//  - embedding: the host gather, then the host scatter-add of its gradient (0 when the table is
//    frozen: LoRA), on the host's clock.
//
// Stateless functions; the device factory's device is owned here for one run. Not for concurrent
// use with other timing-sensitive work.
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

// What the probe run that measures a layer allocates: its plan's maps (see above).
struct LayerProbeBytes {
  uint64_t host = 0;    // pinned staging, fp32 (or NF4) weights and fp32 gradients
  uint64_t device = 0;  // the device arena: the plan's GPU map
};

struct LayerProbeEntry {
  plan::MeasuredLayerTime time;  // key, forward_s, backward_s
  std::string layer;             // the probed layer's name ("block.0", "head", "embedding")
  BatchShape micro;
  LayerProbeBytes bytes;
};

// The plan a probe at `micro` runs (see above): `model` with one block, one device and one
// micro-batch of `micro`; the scratch sized for the probe's device (LayerProbeOptions).
plan::Plan LayerProbePlan(const ModelConfig& model, const plan::PlanJob& job, BatchShape micro,
                          const LayerProbeOptions& options);

// What running `plan` (a LayerProbePlan) allocates.
LayerProbeBytes LayerProbeNeeds(const plan::Plan& plan);

// The OS's available host memory (MemAvailable; free pages when /proc/meminfo is unreadable).
uint64_t AvailableHostMemory();

// Probes every query of plan::LayerTimeQueries(model, job, gpus), in that order, one executor run
// (one device) per micro-batch shape. Errors: InvalidArgument for fp16 accumulation or a bad model
// or job; OutOfMemory, before anything runs, naming the first run that does not fit; those of the
// device factory and the executor.
[[nodiscard]] Result<std::vector<LayerProbeEntry>> ProbeLayerTimes(
    const ModelConfig& model, const plan::PlanJob& job, int gpus,
    const ProbeDeviceFactory& make_device, const LayerProbeOptions& options);

// Puts `times` into profile.layer_times: an entry with the same key is replaced, others appended.
void MergeLayerTimes(const std::vector<LayerProbeEntry>& times, plan::HardwareProfile& profile);

// Re-prices `plan`, made on `profile` for CPU devices at nominal rates (`ferry train`'s
// CpuDevicesProfile), on this machine as it runs now, and returns a line for the log saying what
// was measured and how long it took (0.4 s for the default job and for a 109M-parameter Llama's
// LoRA job; a probe round costs about a layer's step, so larger models take longer). `threads`:
// the job's. Measured:
//  - every layer time the plan looks up (ProbeLayerTimes on a CPU device of threads / devices
//    threads, at least one: the job's CPU devices each get `threads` threads but run at once on
//    the same cores; the plan's micro-batch shape only), within the host memory the profile
//    allows and the OS has free;
//  - the CPU devices' copy rates (ProbeCopyRates: an upload or download is a memcpy on the
//    device's copy thread), for the links;
//  - the host's triad bandwidth (the host thread's packing and gradient adds) and AdamW rate (the
//    optimizer's pool), on all `threads`, at `ferry probe --quick`'s sizes.
// NVMe rates stay the profile's. The plan's stages, policy and tiers are unchanged
// (plan::PricePlan): the search stays a pure function of the job and its budgets, only its
// prediction is this machine's. Errors: those of the probes and of plan::PricePlan; the plan is
// unchanged then.
[[nodiscard]] Result<std::string> PriceOnCpuDevices(const ModelConfig& model,
                                                    const plan::HardwareProfile& profile,
                                                    int threads, plan::Plan& plan);

}  // namespace ferry
