#include "engine/plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

namespace ferry::plan {
namespace {

// A lane's slot in per-lane tables: per-GPU lanes first (kind-major), then the host lanes.
int LaneSlot(LaneId lane, int gpus) {
  const int kind = static_cast<int>(lane.kind);
  return IsPerGpuLane(lane.kind) ? kind * gpus + lane.gpu : kLaneKindCount * gpus + kind;
}

double LaneRate(LaneKind kind, const LaneRates& r) {
  switch (kind) {
    case LaneKind::kCompute:
      return 0;
    case LaneKind::kHostToDevice:
      return r.host_to_device;
    case LaneKind::kDeviceToHost:
      return r.device_to_host;
    case LaneKind::kHostMemory:
      return r.host_memory;
    case LaneKind::kCpuOptimizer:
      return r.cpu_optimizer;
    case LaneKind::kNvmeRead:
      return r.nvme_read;
    case LaneKind::kNvmeWrite:
      return r.nvme_write;
  }
  return 0;
}

bool DrawsHostMemory(LaneKind kind, const LaneRates& r) {
  if (kind == LaneKind::kHostMemory) return true;
  return r.transfers_share_host_memory && kind != LaneKind::kCompute;
}

Status ValidateTask(const Schedule& s, const LaneRates& rates, int i) {
  const SimTask& t = s.tasks[i];
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("schedule '" + s.name + "' task " + std::to_string(i) + " (" +
                                   t.name + "): " + what);
  };
  if (IsPerGpuLane(t.lane.kind) && (t.lane.gpu < 0 || t.lane.gpu >= s.gpus)) {
    return bad("GPU " + std::to_string(t.lane.gpu) + " is out of range [0, " +
               std::to_string(s.gpus) + ")");
  }
  if (!(t.duration_s >= 0) || !std::isfinite(t.duration_s)) return bad("bad duration");
  if (!(t.bytes >= 0) || !std::isfinite(t.bytes)) return bad("bad byte count");
  if (t.bytes > 0 && !(LaneRate(t.lane.kind, rates) > 0)) {
    return bad("moves bytes on lane " + LaneLabel(t.lane) + ", whose rate is 0");
  }
  for (int d : t.deps) {
    if (d < 0 || d >= static_cast<int>(s.tasks.size()) || d == i) {
      return bad("dependency " + std::to_string(d) + " is out of range or the task itself");
    }
  }
  return Status::Ok();
}

// Max-min fair share of `capacity` among users with individual caps; returns each user's rate.
std::vector<double> FairShare(const std::vector<double>& caps, double capacity) {
  std::vector<int> order(caps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return caps[a] < caps[b]; });
  std::vector<double> rate(caps.size());
  double left = capacity;
  for (size_t k = 0; k < order.size(); ++k) {
    const double share = left / static_cast<double>(order.size() - k);
    const double r = std::min(caps[order[k]], share);
    rate[order[k]] = r;
    left -= r;
  }
  return rate;
}

}  // namespace

std::string_view LaneKindName(LaneKind kind) {
  switch (kind) {
    case LaneKind::kCompute:
      return "compute";
    case LaneKind::kHostToDevice:
      return "host->device";
    case LaneKind::kDeviceToHost:
      return "device->host";
    case LaneKind::kHostMemory:
      return "host memory";
    case LaneKind::kCpuOptimizer:
      return "CPU optimizer";
    case LaneKind::kNvmeRead:
      return "NVMe read";
    case LaneKind::kNvmeWrite:
      return "NVMe write";
  }
  return "?";
}

bool IsPerGpuLane(LaneKind kind) {
  return kind == LaneKind::kCompute || kind == LaneKind::kHostToDevice ||
         kind == LaneKind::kDeviceToHost;
}

std::string LaneLabel(LaneId lane) {
  if (IsPerGpuLane(lane.kind)) {
    return "GPU " + std::to_string(lane.gpu) + " " + std::string(LaneKindName(lane.kind));
  }
  return std::string(LaneKindName(lane.kind));
}

std::string_view TaskKindName(TaskKind kind) {
  switch (kind) {
    case TaskKind::kForward:
      return "forward";
    case TaskKind::kBackward:
      return "backward";
    case TaskKind::kTail:
      return "head+loss (fwd+bwd)";
    case TaskKind::kWeightUpload:
      return "weight upload";
    case TaskKind::kActivationUpload:
      return "activation upload";
    case TaskKind::kActivationDownload:
      return "activation download";
    case TaskKind::kGradientDownload:
      return "gradient download";
    case TaskKind::kOptimizer:
      return "CPU optimizer";
    case TaskKind::kNvmeRead:
      return "NVMe read";
    case TaskKind::kNvmeWrite:
      return "NVMe write";
    case TaskKind::kWeightPack:
      return "weight packing";
    case TaskKind::kGradientAdd:
      return "gradient adding";
    case TaskKind::kOther:
      return "other";
  }
  return "?";
}

int Schedule::Add(SimTask task) {
  tasks.push_back(std::move(task));
  return static_cast<int>(tasks.size()) - 1;
}

LaneRates LaneRatesFromProfile(const HardwareProfile& p, bool sustained_nvme_writes) {
  LaneRates r;
  r.host_to_device = p.pcie.h2d_pinned;
  r.device_to_host = p.pcie.d2h_pinned;
  r.host_memory = p.host.memory_bandwidth;
  r.pcie_shared_per_node = p.host_links.shared_bandwidth_per_node;
  r.numa_nodes = p.host.numa_nodes;
  r.cpu_optimizer = p.optimizer.cpu_adamw_params_per_s * kAdamWBytesPerParameter;
  r.nvme_read = p.nvme.read_rate;
  r.nvme_write = sustained_nvme_writes ? p.nvme.sustained_write_rate : p.nvme.write_rate;
  return r;
}

double SimResult::BusySeconds(LaneId lane) const {
  for (const LaneUsage& u : lanes) {
    if (u.lane == lane) return u.busy_s;
  }
  return 0;
}

Result<SimResult> Simulate(const Schedule& s, const LaneRates& rates) {
  if (s.gpus < 1) return Status::InvalidArgument("schedule '" + s.name + "': needs >= 1 GPU");
  if (!(rates.pcie_shared_per_node >= 0) || rates.numa_nodes < 1) {
    return Status::InvalidArgument("schedule '" + s.name +
                                   "': the per-node PCIe cap must be >= 0 over >= 1 node");
  }
  const int n = static_cast<int>(s.tasks.size());
  for (int i = 0; i < n; ++i) FERRY_RETURN_IF_ERROR(ValidateTask(s, rates, i));

  const int slots = kLaneKindCount * s.gpus + kLaneKindCount;
  std::vector<std::vector<int>> lane_queue(slots);  // serial lanes: tasks in program order
  std::vector<size_t> lane_head(slots, 0);
  std::vector<int> waiting_deps(n, 0);
  std::vector<std::vector<int>> dependents(n);
  for (int i = 0; i < n; ++i) {
    lane_queue[LaneSlot(s.tasks[i].lane, s.gpus)].push_back(i);
    waiting_deps[i] = static_cast<int>(s.tasks[i].deps.size());
    for (int d : s.tasks[i].deps) dependents[d].push_back(i);
  }

  enum class State { kPending, kRunning, kDone };
  std::vector<State> state(n, State::kPending);
  std::vector<double> remaining(n);  // seconds (duration tasks) or bytes (byte tasks)
  SimResult result;
  result.timing.assign(n, {});
  std::vector<int> running;
  double now = 0;
  int done = 0;

  auto can_start = [&](int i) {
    if (state[i] != State::kPending || waiting_deps[i] > 0) return false;
    if (s.tasks[i].lane.kind == LaneKind::kHostMemory) return true;
    const int slot = LaneSlot(s.tasks[i].lane, s.gpus);
    return lane_queue[slot][lane_head[slot]] == i;  // heads advance only when a task ends
  };
  auto finish = [&](int i, std::vector<int>& newly_free) {
    state[i] = State::kDone;
    result.timing[i].end_s = now;
    ++done;
    if (s.tasks[i].lane.kind != LaneKind::kHostMemory) {
      const int slot = LaneSlot(s.tasks[i].lane, s.gpus);
      ++lane_head[slot];
      if (lane_head[slot] < lane_queue[slot].size()) {
        newly_free.push_back(lane_queue[slot][lane_head[slot]]);
      }
    }
    for (int d : dependents[i]) {
      if (--waiting_deps[d] == 0) newly_free.push_back(d);
    }
  };
  // Starts every startable task among `candidates`; zero-work tasks finish at once and may free
  // more candidates.
  auto start_ready = [&](std::vector<int> candidates) {
    while (!candidates.empty()) {
      const int i = candidates.back();
      candidates.pop_back();
      if (!can_start(i)) continue;
      result.timing[i].start_s = now;
      const SimTask& t = s.tasks[i];
      remaining[i] = t.bytes > 0 ? t.bytes : t.duration_s;
      if (remaining[i] == 0) {
        finish(i, candidates);
      } else {
        state[i] = State::kRunning;
        running.push_back(i);
      }
    }
  };

  std::vector<int> initial(n);
  for (int i = 0; i < n; ++i) initial[i] = n - 1 - i;  // popped from the back: index order
  start_ready(std::move(initial));

  std::vector<double> rate;
  while (!running.empty()) {
    // Rates: durations run at 1 s/s; byte tasks at their lane rate, PCIe copies fair-shared within
    // their node's cap, then host users fair-shared.
    rate.assign(running.size(), 1.0);
    for (size_t k = 0; k < running.size(); ++k) {
      const SimTask& t = s.tasks[running[k]];
      if (t.bytes > 0) rate[k] = LaneRate(t.lane.kind, rates);
    }
    if (rates.pcie_shared_per_node > 0) {
      for (int node = 0; node < rates.numa_nodes; ++node) {
        std::vector<double> caps;
        std::vector<size_t> users;
        for (size_t k = 0; k < running.size(); ++k) {
          const SimTask& t = s.tasks[running[k]];
          const bool pcie =
              t.lane.kind == LaneKind::kHostToDevice || t.lane.kind == LaneKind::kDeviceToHost;
          if (t.bytes > 0 && pcie &&
              static_cast<long>(t.lane.gpu) * rates.numa_nodes / s.gpus == node) {
            caps.push_back(rate[k]);
            users.push_back(k);
          }
        }
        if (users.empty()) continue;
        const std::vector<double> shared = FairShare(caps, rates.pcie_shared_per_node);
        for (size_t u = 0; u < users.size(); ++u) rate[users[u]] = shared[u];
      }
    }
    std::vector<double> host_caps;
    std::vector<size_t> host_users;
    for (size_t k = 0; k < running.size(); ++k) {
      const SimTask& t = s.tasks[running[k]];
      if (t.bytes > 0 && DrawsHostMemory(t.lane.kind, rates) && rates.host_memory > 0) {
        host_caps.push_back(rate[k]);
        host_users.push_back(k);
      }
    }
    if (!host_users.empty()) {
      const std::vector<double> shared = FairShare(host_caps, rates.host_memory);
      for (size_t u = 0; u < host_users.size(); ++u) rate[host_users[u]] = shared[u];
    }
    double dt = std::numeric_limits<double>::infinity();
    for (size_t k = 0; k < running.size(); ++k) dt = std::min(dt, remaining[running[k]] / rate[k]);
    now += dt;
    std::vector<int> ended;
    std::vector<int> still;
    for (size_t k = 0; k < running.size(); ++k) {
      const int i = running[k];
      const double left_s = remaining[i] / rate[k] - dt;
      remaining[i] -= rate[k] * dt;
      // Ends now when what is left would take under a picosecond-scale sliver of the step.
      if (left_s <= 1e-12 * std::max(1.0, now)) {
        ended.push_back(i);
      } else {
        still.push_back(i);
      }
    }
    running = std::move(still);
    std::vector<int> freed;
    for (int i : ended) finish(i, freed);
    std::reverse(freed.begin(), freed.end());
    start_ready(std::move(freed));
  }

  if (done != n) {
    for (int i = 0; i < n; ++i) {
      if (state[i] != State::kPending) continue;
      std::string why = waiting_deps[i] > 0 ? "waits for a dependency that never finishes"
                                            : "waits behind a lane that never frees";
      return Status::FailedPrecondition("schedule '" + s.name + "': task " + std::to_string(i) +
                                        " (" + s.tasks[i].name + ") " + why +
                                        "; the dependencies and lane orders form a cycle");
    }
  }

  // Busy time per lane: the union of its task intervals.
  std::map<int, std::vector<std::pair<double, double>>> intervals;
  for (int i = 0; i < n; ++i) {
    result.makespan_s = std::max(result.makespan_s, result.timing[i].end_s);
    if (result.timing[i].end_s > result.timing[i].start_s) {
      intervals[LaneSlot(s.tasks[i].lane, s.gpus)].push_back(
          {result.timing[i].start_s, result.timing[i].end_s});
    }
  }
  for (int i = 0; i < n; ++i) intervals[LaneSlot(s.tasks[i].lane, s.gpus)];  // lanes with tasks
  for (int g = 0; g < s.gpus; ++g) intervals[LaneSlot({LaneKind::kCompute, g}, s.gpus)];
  for (auto& [slot, list] : intervals) {
    std::sort(list.begin(), list.end());
    double busy = 0, cur_begin = 0, cur_end = -1;
    for (const auto& [b, e] : list) {
      if (b > cur_end) {
        if (cur_end > cur_begin) busy += cur_end - cur_begin;
        cur_begin = b;
        cur_end = e;
      } else {
        cur_end = std::max(cur_end, e);
      }
    }
    if (cur_end > cur_begin) busy += cur_end - cur_begin;
    LaneId lane;
    if (slot < kLaneKindCount * s.gpus) {
      lane = {static_cast<LaneKind>(slot / s.gpus), slot % s.gpus};
    } else {
      lane = {static_cast<LaneKind>(slot - kLaneKindCount * s.gpus), 0};
    }
    result.lanes.push_back({lane, busy});
  }
  for (int g = 0; g < s.gpus; ++g) {
    const double busy = result.BusySeconds({LaneKind::kCompute, g});
    const double bubble = result.makespan_s > 0 ? 1.0 - busy / result.makespan_s : 0.0;
    result.gpu_bubble_fraction.push_back(bubble);
    result.mean_bubble_fraction += bubble / s.gpus;
  }
  return result;
}

}  // namespace ferry::plan
