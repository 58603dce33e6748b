#include "engine/job/job_devices.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>

namespace ferry {
namespace {

constexpr int64_t kMaxDevices = 64;

Status Bad(std::string msg) { return Status::InvalidArgument(std::move(msg)); }

constexpr std::string_view kForms =
    "give a count (2), CPU devices (cpu,cpu), GPUs (cuda:0,cuda:1) or logical devices sharing a "
    "GPU (cuda:0,cuda:0)";

bool ParseCount(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string GiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

// How many of the job's devices use each GPU.
std::map<int64_t, int> Sharers(const JobSpec& job) {
  std::map<int64_t, int> n;
  for (int64_t g : job.gpus) ++n[g];
  return n;
}

// The three device fields against each other (ValidateJobDevices without the dtype).
Status ValidateDeviceFields(const JobSpec& job) {
  if (job.devices < 1 || job.devices > kMaxDevices) {
    return Bad("--devices must be 1 to " + std::to_string(kMaxDevices) + " devices");
  }
  if (job.device_kind != "auto" && job.device_kind != "cpu" && job.device_kind != "cuda") {
    return Bad("device_kind '" + job.device_kind + "' is not one of auto, cpu, cuda");
  }
  if (job.device_kind == "cuda") {
    if (int64_t(job.gpus.size()) != job.devices) {
      return Bad("--devices: " + std::to_string(job.devices) + " CUDA devices need a GPU each, " +
                 std::to_string(job.gpus.size()) + " given");
    }
    for (int64_t g : job.gpus) {
      if (g < 0) return Bad("--devices: GPU " + std::to_string(g) + " does not exist");
    }
  } else if (!job.gpus.empty()) {
    return Bad("--devices: GPUs are named only for CUDA devices (cuda:0)");
  }
  return Status::Ok();
}

}  // namespace

Status ParseDevicesOption(std::string_view text, JobSpec& job) {
  const std::string quoted = "--devices '" + std::string(text) + "'";
  // Set on a copy: a refused value leaves the job as it was.
  JobSpec parsed = job;
  int64_t count = 0;
  if (ParseCount(text, count)) {
    parsed.devices = count;
    parsed.device_kind = "auto";
    parsed.gpus.clear();
    FERRY_RETURN_IF_ERROR(ValidateDeviceFields(parsed).WithContext(quoted));
    job = std::move(parsed);
    return Status::Ok();
  }
  std::string kind;
  std::vector<int64_t> gpus;
  int64_t items = 0;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    std::string item_kind;
    if (item == "cpu") {
      item_kind = "cpu";
    } else if (item == "cuda") {
      item_kind = "cuda", gpus.push_back(0);
    } else if (item.substr(0, 5) == "cuda:") {
      int64_t ordinal = -1;
      if (!ParseCount(item.substr(5), ordinal) || ordinal < 0) {
        return Bad(quoted + ": '" + std::string(item) + "' names no GPU (cuda:0 is the first)");
      }
      item_kind = "cuda", gpus.push_back(ordinal);
    } else {
      return Bad(quoted + ": '" + std::string(item) + "' is not a device; " + std::string(kForms));
    }
    if (!kind.empty() && kind != item_kind) {
      return Bad(quoted + " mixes CPU and CUDA devices; one job runs on one kind (" +
                 std::string(kForms) + ")");
    }
    kind = item_kind;
    ++items;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  parsed.devices = items;
  parsed.device_kind = kind;
  parsed.gpus = std::move(gpus);
  FERRY_RETURN_IF_ERROR(ValidateDeviceFields(parsed).WithContext(quoted));
  job = std::move(parsed);
  return Status::Ok();
}

std::string DevicesOptionText(const JobSpec& job) {
  if (job.device_kind == "auto") return std::to_string(job.devices);
  std::string s;
  for (int64_t i = 0; i < job.devices; ++i) {
    if (i > 0) s += ",";
    s += job.device_kind == "cuda" && size_t(i) < job.gpus.size()
             ? "cuda:" + std::to_string(job.gpus[size_t(i)])
             : job.device_kind;
  }
  return s;
}

Status ValidateJobDevices(const JobSpec& job) {
  FERRY_RETURN_IF_ERROR(ValidateDeviceFields(job));
  const std::string dtype = CanonicalDtypeName(job.dtype);
  if (dtype != "auto" && dtype != "f32" && dtype != "bf16" && dtype != "f16" &&
      dtype != "fp16acc") {
    return Bad("--dtype '" + job.dtype +
               "': use f32 (the exact reference, CPU devices), bf16, f16 (with dynamic loss "
               "scaling; fp16 and fp32 are taken too), fp16acc (f16 with fp16-accumulating "
               "GEMMs, GPUs) or auto (f32 on CPU devices, bf16 on GPUs)");
  }
  return Status::Ok();
}

Result<std::string> ResolveJobDevices(JobSpec& job, const GpuCensus& census) {
  FERRY_RETURN_IF_ERROR(ValidateJobDevices(job));
  job.dtype = CanonicalDtypeName(job.dtype);
  const int64_t have = int64_t(census.gpus.size());
  std::string why;
  if (job.device_kind == "auto") {
    if (have == 0) {
      job.device_kind = "cpu";
      why = " (no GPU: " + census.none_reason + ")";
    } else if (job.devices > have) {
      return Bad("--devices " + std::to_string(job.devices) + ": this machine has " +
                 std::to_string(have) + " GPU" + (have == 1 ? "" : "s") +
                 "; list the GPUs to share them (--devices cuda:0,cuda:0) or ask for CPU "
                 "devices (--devices cpu,cpu)");
    } else {
      job.device_kind = "cuda";
      job.gpus.clear();
      for (int64_t i = 0; i < job.devices; ++i) job.gpus.push_back(i);
    }
  } else if (job.device_kind == "cpu") {
    why = " (--devices " + DevicesOptionText(job) + ")";
  }
  if (job.device_kind == "cuda") {
    for (int64_t g : job.gpus) {
      if (g < have) continue;
      if (have == 0) {
        return Bad("--devices " + DevicesOptionText(job) + ": no GPU (" + census.none_reason +
                   "); run on CPU devices with --devices " + std::to_string(job.devices));
      }
      return Bad("--devices " + DevicesOptionText(job) + ": there is no GPU " + std::to_string(g) +
                 " (this machine has cuda:0 to cuda:" + std::to_string(have - 1) + ")");
    }
    if (job.dtype == "f32") {
      return Bad(
          "--dtype f32 runs on CPU devices only; GPUs train in bf16 or f16 (give --dtype "
          "bf16, or --devices cpu for the f32 reference)");
    }
  }
  if (job.dtype == "auto") job.dtype = job.device_kind == "cuda" ? "bf16" : "f32";
  if (job.dtype == "fp16acc" && job.device_kind != "cuda") {
    return Bad(
        "--dtype fp16acc (GEMMs accumulating in fp16) runs on GPUs only; CPU devices accumulate "
        "in fp32 (give --dtype f16 for the same storage)");
  }

  if (job.device_kind == "cpu") return DevicesCountText(job) + why;
  std::string line;
  const std::map<int64_t, int> sharers = Sharers(job);
  for (const auto& [g, n] : sharers) {
    const GpuInfo& info = census.gpus[size_t(g)];
    if (!line.empty()) line += ", ";
    line += "cuda:" + std::to_string(g) + " (" + info.name + ", " + GiB(info.free_bytes) +
            " free, sm_" + std::to_string(info.compute_capability) +
            (n > 1 ? ", shared by " + std::to_string(n) + " devices" : "") + ")";
  }
  return DevicesCountText(job) + " on " + line;
}

std::string DevicesCountText(const JobSpec& job) {
  return std::to_string(job.devices) +
         (job.device_kind == "cuda" ? " CUDA device" : " CPU device") +
         (job.devices == 1 ? "" : "s");
}

std::vector<std::string> JobDeviceNames(const JobSpec& job) {
  std::vector<std::string> names;
  if (job.device_kind != "cuda") {
    for (int64_t i = 0; i < job.devices; ++i) names.push_back("cpu" + std::to_string(i));
    return names;
  }
  const std::map<int64_t, int> sharers = Sharers(job);
  std::map<int64_t, int> seen;
  for (int64_t g : job.gpus) {
    const int k = seen[g]++;
    names.push_back("cuda" + std::to_string(g) +
                    (sharers.at(g) > 1 ? "." + std::to_string(k) : std::string()));
  }
  return names;
}

uint64_t GpuDeviceBytes(const JobSpec& job, const GpuCensus& census) {
  const double fraction = kGpuMemoryFraction;
  uint64_t least = UINT64_MAX;
  for (const auto& [g, n] : Sharers(job)) {
    if (g >= int64_t(census.gpus.size())) return 0;
    const double share = double(census.gpus[size_t(g)].free_bytes) * fraction / double(n);
    least = std::min(least, uint64_t(share));
  }
  return least == UINT64_MAX ? 0 : least;
}

}  // namespace ferry
