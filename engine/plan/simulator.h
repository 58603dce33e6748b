// A discrete-event simulator that replays a pipeline schedule on a machine's lanes and reports
// when each task ran, the makespan, how busy each lane was and the bubble fraction of each GPU.
//
// Model (the numbers come from a HardwareProfile through LaneRatesFromProfile, or from a test):
// - A lane is a resource: per GPU a compute lane and the two directions of its PCIe link (full
//   duplex: host->device and device->host are separate lanes); on the host the shared memory
//   bandwidth, the CPU optimizer, NVMe read and NVMe write.
// - Every lane except host memory is serial and runs its tasks in the order they appear in
//   Schedule::tasks, like a CUDA stream: a task starts when its dependencies have finished and
//   the task before it on its lane has finished. Host-memory tasks run concurrently.
// - A task takes `duration_s`, or moves `bytes` at its lane's rate. Byte tasks on the PCIe, host
//   memory, optimizer and NVMe lanes also draw host memory bandwidth, which is divided among the
//   transfers running at the same moment by max-min fair share (each gets an equal share, a task
//   capped below its share by its own lane gives the rest to the others); rates are recomputed
//   whenever a task starts or ends. Compute tasks take their duration.
// - Before that, the PCIe copies of the GPUs on one NUMA node are fair-shared the same way within
//   the node's cap (LaneRates::pcie_shared_per_node), when there is one: eight links each fast on
//   its own do not all run at full rate at once when their node's memory cannot serve them.
// - The bubble fraction of a GPU is the time its compute lane is idle within the makespan
//   divided by the makespan.
//
// Pure functions over value types; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/hardware_profile.h"
#include "kernels/status.h"

namespace ferry::plan {

enum class LaneKind {
  kCompute,       // per GPU
  kHostToDevice,  // per GPU, PCIe host->device
  kDeviceToHost,  // per GPU, PCIe device->host
  kHostMemory,    // shared, concurrent
  kCpuOptimizer,  // host
  kNvmeRead,      // host
  kNvmeWrite,     // host
};
inline constexpr int kLaneKindCount = 7;
std::string_view LaneKindName(LaneKind kind);
bool IsPerGpuLane(LaneKind kind);

struct LaneId {
  LaneKind kind = LaneKind::kCompute;
  int gpu = 0;  // per-GPU lanes only; 0 for host lanes
  bool operator==(const LaneId&) const = default;
};
std::string LaneLabel(LaneId lane);  // "GPU 1 compute", "GPU 1 host->device", "CPU optimizer"

// What a task does; the writers colour by it.
enum class TaskKind {
  kForward,
  kBackward,
  kTail,  // fused head + loss, forward then backward
  kWeightUpload,
  kActivationUpload,
  kActivationDownload,
  kGradientDownload,
  kOptimizer,
  kNvmeRead,
  kNvmeWrite,
  kWeightPack,   // host: master weights into an upload mirror
  kGradientAdd,  // host: landed gradients into the master gradients
  kOther,
};
inline constexpr int kTaskKindCount = 13;
std::string_view TaskKindName(TaskKind kind);

struct SimTask {
  std::string name;  // short, shown in charts: "F3.2" = forward stage 3, micro-batch 2
  TaskKind kind = TaskKind::kOther;
  LaneId lane;
  double duration_s = 0;  // used when bytes == 0
  double bytes = 0;       // > 0: the task moves this many bytes at its lane's rate
  std::vector<int> deps;  // indices into Schedule::tasks that must finish first
  int stage = -1;         // -1 = none
  int micro_batch = -1;   // -1 = none
};

struct Schedule {
  std::string name;  // "round-robin", "GPipe", ...
  int gpus = 1;
  std::vector<SimTask> tasks;  // per-lane order = order here

  // Appends a task and returns its index.
  int Add(SimTask task);
};

// Rates in bytes per second.
struct LaneRates {
  double host_to_device = 0;  // per GPU
  double device_to_host = 0;  // per GPU
  double host_memory = 0;     // shared by all transfers
  double cpu_optimizer = 0;   // optimizer traffic (kAdamWBytesPerParameter per parameter)
  double nvme_read = 0;
  double nvme_write = 0;
  // When false only kHostMemory tasks share host bandwidth; the other lanes run at their own rate.
  bool transfers_share_host_memory = true;
  // The PCIe copies (both directions) of the GPUs on one NUMA node share that node's memory:
  // together they move at most this many bytes/s (0 = no such cap). GPU g is on node
  // g * numa_nodes / gpus (HostLinkSpec).
  double pcie_shared_per_node = 0;
  int numa_nodes = 1;
};

// Host traffic of one fp32 AdamW update per parameter: reads weight, gradient and two moments
// (16 B), writes weight and moments (12 B) and the bf16 copy for the GPUs (2 B).
inline constexpr double kAdamWBytesPerParameter = 30;

// Pinned PCIe rates, host bandwidth, the per-node PCIe cap (HostLinkSpec), optimizer rate x
// kAdamWBytesPerParameter, NVMe rates (sustained write rate when `sustained_nvme_writes`).
LaneRates LaneRatesFromProfile(const HardwareProfile& profile, bool sustained_nvme_writes = false);

struct TaskTiming {
  double start_s = 0;
  double end_s = 0;
};

struct LaneUsage {
  LaneId lane;
  double busy_s = 0;  // time with at least one task running on the lane
};

struct SimResult {
  std::vector<TaskTiming> timing;  // parallel to Schedule::tasks
  double makespan_s = 0;
  std::vector<LaneUsage> lanes;             // every lane that ran a task, plus every compute lane
  std::vector<double> gpu_bubble_fraction;  // per GPU
  double mean_bubble_fraction = 0;          // over GPUs

  double BusySeconds(LaneId lane) const;  // 0 for a lane that ran nothing
};

// Runs the schedule. InvalidArgument for a bad task (dependency out of range or on itself, lane
// GPU out of range, negative or non-finite work, bytes on a lane whose rate is 0);
// FailedPrecondition naming a stuck task when the dependencies and lane orders form a cycle.
[[nodiscard]] Result<SimResult> Simulate(const Schedule& schedule, const LaneRates& rates);

}  // namespace ferry::plan
