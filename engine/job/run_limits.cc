#include "engine/job/run_limits.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine/job/job_spec.h"

namespace ferry {
namespace {

std::string GiB(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(uint64_t(1) << 30));
  return buf;
}

}  // namespace

MachineLimits MachineLimits::OfThisMachine() {
  MachineLimits m;
  m.hardware_threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.memory_bytes = uint64_t(pages) * uint64_t(page);
  return m;
}

Status ValidateRunLimits(const RunLimits& run, const ModelConfig& model,
                         const MachineLimits& machine) {
  FERRY_RETURN_IF_ERROR(ValidateThreads(run.threads, machine.hardware_threads));
  if (run.positions > model.max_position_embeddings) {
    return Status::InvalidArgument(run.positions_from + " exceeds the model's " +
                                   std::to_string(model.max_position_embeddings) +
                                   " positions (max_position_embeddings); lower it");
  }
  if (run.rows > 0 && run.positions > 0 && run.rows > kMaxTokensPerForward / run.positions) {
    return Status::InvalidArgument(run.device_from + " is more than 2^40 tokens at once; lower it");
  }
  if (!run.device_bytes || machine.memory_bytes == 0) return Status::Ok();
  const uint64_t bytes = run.device_bytes();
  if (bytes > machine.memory_bytes) {
    return Status::InvalidArgument(run.device_from + " needs " + GiB(bytes) +
                                   " of device memory; this machine has " +
                                   GiB(machine.memory_bytes) + " of memory in all: lower it");
  }
  return Status::Ok();
}

Status ValidateRunLimits(const RunLimits& run, const ModelConfig& model) {
  return ValidateRunLimits(run, model, MachineLimits::OfThisMachine());
}

}  // namespace ferry
