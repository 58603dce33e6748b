#include "engine/train/training_runner.h"

#include <cstdio>
#include <filesystem>
#include <set>
#include <string_view>

#include "engine/exec/job_device_factory.h"
#include "engine/exec/pipeline_runner.h"
#include "engine/exec/planned_generator.h"
#include "engine/job/job_devices.h"
#include "engine/model/model_folder.h"
#include "engine/plan/byte_size.h"
#include "engine/plan/planner.h"
#include "kernels/arena.h"
#include "offload/file_io.h"

namespace ferry {

plan::HardwareProfile CpuDevicesProfile(int count, uint64_t device_bytes) {
  const std::string src = "ferry train --devices: CPU devices, nominal rates";
  plan::HardwareProfile h;
  h.name = "cpu-devices";
  h.description = std::to_string(count) + " CPU devices";
  h.gpu = {.model = "cpu",
           .count = count,
           .memory_label_bytes = device_bytes,
           .memory_reserve_bytes = 0,
           .memory_usable_bytes = device_bytes,
           .bf16_flops = 1e11,
           .fp16_fp16acc_flops = 0,
           .matmul_efficiency = 0.5,
           .memory_bandwidth = 1e10,
           .peer_access = false,
           .source = src};
  h.pcie = {4, 16, 1e10, 1e10, 1e10, 1e10, src};
  const uint64_t ram = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
  h.host = {ram, ram, 1e10, 1, 1, src};
  h.nvme = {"", 0, 1e9, 1e9, 1e9, 0, src};
  h.optimizer = {1e9, src};
  return h;
}

plan::HardwareProfile GpuDevicesProfile(int count, uint64_t device_bytes,
                                        const std::string& gpu_model) {
  plan::HardwareProfile h = CpuDevicesProfile(count, device_bytes);
  const std::string src = "ferry train --devices: GPUs, nominal rates";
  h.name = "gpu-devices";
  h.description = std::to_string(count) + " CUDA devices on " + gpu_model;
  h.gpu.model = gpu_model;
  h.gpu.bf16_flops = 1e14;
  h.gpu.memory_bandwidth = 1e12;
  h.gpu.source = src;
  h.pcie = {4, 16, 2.5e10, 2.5e10, 1e10, 1e10, src};
  return h;
}

namespace {

// The job with its devices and dtype settled (a job whose command settled them is unchanged).
Result<JobSpec> Resolved(const JobSpec& job, const GpuCensus& census) {
  JobSpec j = job;
  FERRY_RETURN_IF_ERROR(ResolveJobDevices(j, census).status());
  return j;
}

// The census a job needs: GPUs only when it may run on them.
GpuCensus CensusFor(const JobSpec& job) {
  if (job.device_kind == "cpu") return GpuCensus{.gpus = {}, .none_reason = "--devices cpu"};
  return exec::TakeGpuCensus();
}

bool OnGpus(const JobSpec& job) { return job.device_kind == "cuda"; }

DType ComputeDtype(const JobSpec& job) {
  if (job.dtype == "bf16") return DType::kBF16;  // ValidateJobSpec'd, resolved
  return F16Storage(job) ? DType::kF16 : DType::kF32;
}

plan::ScratchTarget ScratchOf(const JobSpec& job, int threads) {
  return OnGpus(job) ? plan::ScratchTarget{.cuda = true}
                     : plan::ScratchTarget{.cuda = false, .cpu_threads = threads};
}

}  // namespace

uint64_t WholeModelBytes(const JobSpec& unresolved, const ModelConfig& model, int threads,
                         bool forward_only, int64_t generate_positions) {
  JobSpec job = unresolved;
  if (job.device_kind == "auto") job.device_kind = "cpu";
  if (job.dtype == "auto") job.dtype = OnGpus(job) ? "bf16" : "f32";
  plan::MemoryPlanInput in;
  in.model = model;
  in.lora = job.lora;
  in.micro_batch = {job.micro_batch_size(), job.seq_len};
  in.micro_batches = int(job.micro_batches);
  in.compute_dtype = ComputeDtype(job);
  in.stages = {{1, int(model.num_layers) + 1}};
  in.recompute.assign(size_t(model.num_layers) + 2, false);
  in.scratch = ScratchOf(job, threads);
  in.forward_only = forward_only || generate_positions > 0;
  in.generate_positions = generate_positions;
  // One device may keep every saved activation (the planner's "keep" policy): that bounds it.
  // Two CPU devices could too (each its forward stages'), but are not sized for it: their arenas
  // are host RAM that --host-memory does not count, so a kept plan there would move the saved
  // activations out of the host budget rather than save a copy over a link.
  in.keep_activations = job.devices == 1 && !in.forward_only;
  return plan::ComputeMemory(in).gpu.total();
}

Result<uint64_t> JobGpuBudget(const JobSpec& job, const GpuCensus& census) {
  if (!OnGpus(job)) {
    if (job.gpu_memory.empty()) return uint64_t(0);
    return Status::InvalidArgument("--gpu-memory " + job.gpu_memory + ": the job runs on " +
                                   DevicesOptionText(job) + " (CPU devices); --gpu-memory caps " +
                                   "CUDA devices (--host-memory caps the host)");
  }
  const uint64_t share = GpuDeviceBytes(job, census);
  if (job.gpu_memory.empty()) return share;
  Result<uint64_t> cap = plan::ParseByteSize(job.gpu_memory);
  if (!cap.ok()) return cap.status().WithContext("--gpu-memory");
  if (*cap == 0) return Status::InvalidArgument("--gpu-memory must be more than 0 bytes");
  if (*cap > share) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", kGpuMemoryFraction * 100);
    return Status::InvalidArgument(
        "--gpu-memory " + plan::FormatByteSize(*cap) + " is more than each device has: " +
        plan::FormatByteSize(share) + " (" + pct + " of its GPU's free memory" +
        (job.gpus.size() > std::set<int64_t>(job.gpus.begin(), job.gpus.end()).size()
             ? ", split between the devices sharing it"
             : "") +
        "); give less, or leave it out to use that");
  }
  return *cap;
}

namespace {

// --host-memory and --nvme-dir (all its free space) on the CPU devices' profile.
Status ApplyJobBudgets(const JobSpec& job, plan::HardwareProfile& hw) {
  std::string space;
  if (!job.nvme_dir.empty()) {
    Result<uint64_t> free = FreeSpace(job.nvme_dir);
    if (!free.ok()) return free.status().WithContext("--nvme-dir");
    space = std::to_string(*free);
  }
  FERRY_ASSIGN_OR_RETURN(plan::BudgetOverrides o,
                         plan::ParseBudgetOverrides("", job.host_memory, job.nvme_dir, space));
  return plan::ApplyBudgetOverrides(o, hw);
}

}  // namespace

Result<plan::Plan> PlanJobDevices(const JobSpec& job, const ModelConfig& model, int threads,
                                  bool forward_only, const GpuCensus& census,
                                  const plan::DataCounts& data, int64_t generate_positions,
                                  plan::HardwareProfile* profile) {
  forward_only = forward_only || generate_positions > 0;
  plan::PlanJob pj;
  pj.documents_in_rows = data.documents_in_rows;
  pj.data_host_bytes = data.host_bytes;
  pj.global_batch = job.batch_size;
  pj.seq_len = job.seq_len;
  pj.micro_batches = job.micro_batches;
  pj.lora = job.lora;
  pj.compute_dtype = ComputeDtype(job);
  pj.fp16_accumulate = job.dtype == "fp16acc";
  pj.stale_updates = job.stale_updates;
  pj.forward_only = forward_only;
  pj.generate_positions = generate_positions;
  // One CPU device runs the whole model as one stage: on a CPU device a weight copy takes the
  // cores its compute needs, so streaming stages would only add work. A GPU streams what does not
  // fit.
  if (job.devices == 1 && !OnGpus(job)) pj.max_stages = 1;
  // Generation prefers stages its devices keep (at most one per device, each with its weights
  // resident token after token) and streams them only when none fits.
  const bool resident_first = generate_positions > 0 && pj.max_stages == 0;
  if (resident_first) pj.max_stages = int(job.devices);
  pj.scratch = ScratchOf(job, threads);
  pj.frozen_base_from_files = job.model != "tiny";
  // A LoRA base streamed from the model's files is read in whole blocks of the drive: the plan
  // counts them from where its tensors lie in the files.
  if (pj.frozen_base_from_files && plan::CanStreamBase(pj)) {
    FERRY_ASSIGN_OR_RETURN(pj.base_file_layout, FolderTensorLayout(job.model, model));
  }
  // A CPU device never needs more than the whole model as one stage: that bounds its budget. A
  // GPU's is its free memory.
  FERRY_ASSIGN_OR_RETURN(const uint64_t gpu_budget, JobGpuBudget(job, census));
  plan::HardwareProfile hw =
      OnGpus(job)
          ? GpuDevicesProfile(int(job.devices), gpu_budget,
                              census.gpus.at(size_t(job.gpus.at(0))).name)
          : CpuDevicesProfile(int(job.devices), WholeModelBytes(job, model, threads, forward_only,
                                                                generate_positions));
  FERRY_RETURN_IF_ERROR(ApplyJobBudgets(job, hw));
  if (profile != nullptr) *profile = hw;
  FERRY_ASSIGN_OR_RETURN(plan::PlanOutcome outcome,
                         plan::MakePlan(job.model, model, pj, hw, /*suggest=*/false));
  if (!outcome.feasible && resident_first) {
    pj.max_stages = 0;
    FERRY_ASSIGN_OR_RETURN(outcome, plan::MakePlan(job.model, model, pj, hw, /*suggest=*/false));
  }
  if (!outcome.feasible) {
    return Status::InvalidArgument("no plan fits " + DevicesCountText(job) + ": " +
                                   outcome.binding);
  }
  const plan::Plan& p = outcome.plan;
  if (p.micro_batches != job.micro_batches || p.micro_batch_size != job.micro_batch_size()) {
    return Status::Internal("the plan runs " + std::to_string(p.micro_batches) + " x " +
                            std::to_string(p.micro_batch_size) + " sequences, the job " +
                            std::to_string(job.micro_batches) + " x " +
                            std::to_string(job.micro_batch_size()));
  }
  return std::move(outcome.plan);
}

namespace {

std::string RunNvmeDir(const JobSpec& job, const char* what) {
  std::filesystem::path out = std::filesystem::path(job.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "runs/exp/" is "runs/exp"
  std::string run = out.filename().string();
  if (run.empty() || run == "." || run == "..") run = "run";
  return job.nvme_dir + "/" + run + what;
}

}  // namespace

std::string OptimizerStateDir(const JobSpec& job) { return RunNvmeDir(job, ".optimizer-state"); }
std::string ActivationsDir(const JobSpec& job) { return RunNvmeDir(job, ".activations"); }

namespace {

namespace fs = std::filesystem;
constexpr const char* kScratchLock = ".ferry-lock";

// What ferry's stores write in a run's NVMe folder: an NvmeStore's segments and its O_DIRECT
// probe (left when a run dies while opening the store), a VersionedStore's records.
bool IsStoreFile(const std::string& name) {
  auto named = [&name](std::string_view prefix, std::string_view suffix) {
    return name.size() > prefix.size() + suffix.size() && name.starts_with(prefix) &&
           name.ends_with(suffix);
  };
  return named("segment-", ".ferry") || named("record-", ".slots") || name == ".odirect-probe";
}

// Calls fn(name) for each entry of `dir`, stopping at the first error (none: an empty code; a
// missing folder is no error).
template <typename Fn>
std::error_code ForEachEntry(const std::string& dir, Fn&& fn) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return {};
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (std::error_code e = fn(it->path().filename().string()); e) return e;
  }
  return ec;
}

// Removes the store's files in `dir` (not the lock file); the first error.
std::error_code RemoveStoreFiles(const std::string& dir) {
  return ForEachEntry(dir, [&](const std::string& name) {
    std::error_code ec;
    if (IsStoreFile(name)) fs::remove(fs::path(dir) / name, ec);
    return ec;
  });
}

// Takes the folder's lock file, still the one at that path (a run that is removing the folder
// unlinks it while holding it); a folder it creates is the user's alone (0700). Errors:
// FailedPrecondition when another process holds it; NoSpace; IOError.
Result<FileLock> LockFolder(const std::string& dir) {
  const std::string lock = (fs::path(dir) / kScratchLock).string();
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::error_code ec;
    if (fs::create_directories(dir, ec) && !ec) {
      fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
    }
    if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
    Result<FileLock> held = FileLock::Take(
        lock, dir + " is in use by another ferry run: give this run another --out or --nvme-dir");
    if (held.status().code() == StatusCode::kNotFound) continue;  // the folder went away
    if (!held.ok() || held->StillAt(lock)) return held;
    // Unlinked by the run that held it: take the new one.
  }
  return Status::IOError("cannot lock " + lock + ": it keeps being replaced");
}

// The first file in `dir` that ferry did not write, or "".
std::string ForeignFile(const std::string& dir) {
  std::string foreign;
  (void)ForEachEntry(dir, [&](const std::string& name) {
    if (foreign.empty() && name != kScratchLock && !IsStoreFile(name)) foreign = name;
    return std::error_code();
  });
  return foreign;
}

}  // namespace

Result<NvmeFolderLock> NvmeFolderLock::Take(const std::string& dir) {
  // Refused before anything is written there.
  if (const std::string foreign = ForeignFile(dir); !foreign.empty()) {
    return Status::InvalidArgument(dir + " holds " + foreign +
                                   ", which ferry did not write: remove it or give another "
                                   "--nvme-dir");
  }
  NvmeFolderLock folder;
  FERRY_ASSIGN_OR_RETURN(folder.lock_, LockFolder(dir));
  folder.dir_ = dir;
  return folder;
}

void NvmeFolderLock::RemoveFolder() {
  if (!held()) return;
  std::error_code ec = RemoveStoreFiles(dir_);
  // Unlinked while still locked: a run waiting for the folder retries on the new lock file.
  if (!ec) fs::remove(fs::path(dir_) / kScratchLock, ec);
  if (!ec) fs::remove(dir_, ec);  // only when empty
  if (ec) {
    std::fprintf(stderr, "ferry: warning: could not remove %s: %s\n", dir_.c_str(),
                 ec.message().c_str());
  }
  lock_.Release();
}

void ScratchStoreDeleter::operator()(NvmeStore* store) const {
  delete store;  // closes its files
  folder.RemoveFolder();
}

Status ClearScratchLeftovers(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kScratchLock, ec)) return Status::Ok();  // not ferry's
  Result<NvmeFolderLock> held = NvmeFolderLock::Take(dir);
  if (!held.ok()) {  // another run's, or foreign files: Take refuses it if this run needs it
    const StatusCode c = held.status().code();
    return c == StatusCode::kFailedPrecondition || c == StatusCode::kInvalidArgument
               ? Status::Ok()
               : held.status();
  }
  held->RemoveFolder();
  return Status::Ok();
}

uint64_t ScratchStoreBytes(const std::string& dir) {
  uint64_t bytes = 0;
  (void)ForEachEntry(dir, [&](const std::string& name) {
    std::error_code ec;
    const uintmax_t size = IsStoreFile(name) ? fs::file_size(fs::path(dir) / name, ec) : 0;
    if (!ec) bytes += uint64_t(size);
    return std::error_code();
  });
  return bytes;
}

Result<ScratchStore> OpenScratchStore(NvmeStoreOptions options) {
  FERRY_ASSIGN_OR_RETURN(NvmeFolderLock folder, NvmeFolderLock::Take(options.directory));
  if (std::error_code ec = RemoveStoreFiles(folder.dir()); ec) {  // a killed run's
    return Status::IOError("cannot clear " + folder.dir() + ": " + ec.message());
  }
  Result<std::unique_ptr<NvmeStore>> store = NvmeStore::Open(std::move(options));
  if (!store.ok()) {
    folder.RemoveFolder();  // what it made, and the lock
    return store.status();
  }
  return ScratchStore(store->release(), ScratchStoreDeleter{std::move(folder)});
}

uint64_t TrainingDevicesBytes(const JobSpec& unresolved, const ModelConfig& model, int threads,
                              bool forward_only, int64_t generate_positions) {
  const GpuCensus census = CensusFor(unresolved);
  Result<JobSpec> job = Resolved(unresolved, census);
  if (job.ok() && OnGpus(*job)) return 0;  // device memory, not the host's
  // Devices that do not resolve are CreateTrainingRunner's to report; CPU devices bound the host.
  JobSpec j = job.ok() ? *job : unresolved;
  if (!job.ok()) j.device_kind = "cpu", j.gpus.clear(), j.dtype = "f32";
  Result<plan::Plan> p =
      PlanJobDevices(j, model, threads, forward_only, census, {}, generate_positions);
  // Without a plan, CreateTrainingRunner reports why; the whole model bounds each stage.
  if (!p.ok()) {
    return uint64_t(j.devices) *
           WholeModelBytes(j, model, threads, forward_only, generate_positions);
  }
  return uint64_t(j.devices) * p->memory.gpu.total();
}

Result<TrainingRunner> CreateTrainingRunner(const JobSpec& unresolved, const ModelConfig& model,
                                            int threads, bool trace, bool forward_only,
                                            const plan::DataCounts& data) {
  TrainingRunner t;
  const GpuCensus census = CensusFor(unresolved);
  JobSpec job = unresolved;
  FERRY_RETURN_IF_ERROR(ResolveJobDevices(job, census).status());
  // A killed run of this job left its stores' files: their space is free to plan (a resume
  // rebuilds the optimizer state from its checkpoint).
  if (!job.nvme_dir.empty() && !forward_only) {
    for (const std::string& dir : {ActivationsDir(job), OptimizerStateDir(job)}) {
      FERRY_RETURN_IF_ERROR(ClearScratchLeftovers(dir).WithContext("--nvme-dir"));
    }
  }
  FERRY_ASSIGN_OR_RETURN(const plan::Plan p,
                         PlanJobDevices(job, model, threads, forward_only, census, data,
                                        /*generate_positions=*/0, &t.profile));
  FERRY_ASSIGN_OR_RETURN(t.devices, exec::CreateJobDevices(job, p.memory.gpu.total(), threads));
  std::vector<Device*> raw;
  for (const std::unique_ptr<Device>& d : t.devices) raw.push_back(d.get());
  if (trace) t.trace = std::make_unique<exec::TraceRecorder>(p, job.steps);
  std::string nvme;  // what the plan puts on NVMe, for the summary
  auto nvme_bytes = [&p](std::string_view name) {
    return FormatBytes(p.memory.nvme.bytes_of(name));
  };
  if (p.activations == Tier::kNvme && !p.job.forward_only) {
    // Scratch for this run only: a killed run's leftovers go first, and the folder goes with the
    // runner (a resume recomputes what it held).
    const std::string dir = ActivationsDir(job);
    NvmeStoreOptions o = exec::ActivationStoreOptions(p, dir);
    o.log = [](std::string_view line) {
      std::fprintf(stderr, "ferry: activations on NVMe: %.*s\n", int(line.size()), line.data());
    };
    Result<ScratchStore> store = OpenScratchStore(std::move(o));
    if (!store.ok()) return store.status().WithContext("--nvme-dir");
    t.activation_store = std::move(*store);
    nvme += ", saved activations on NVMe in " + dir + " (" + nvme_bytes("activations.saved") + ")";
  }
  FERRY_ASSIGN_OR_RETURN(
      t.runner, exec::CreatePipelineRunner(raw, model, p, t.trace.get(), t.activation_store.get()));
  if (p.optimizer_state == Tier::kNvme) {
    Result<NvmeFolderLock> folder = NvmeFolderLock::Take(OptimizerStateDir(job));
    if (!folder.ok()) return folder.status().WithContext("--nvme-dir");
    t.optimizer_folder = std::move(*folder);
    nvme += ", optimizer state on NVMe in " + t.optimizer_folder.dir() + " (" +
            nvme_bytes("optimizer.slots") + ")";
  }
  if (p.frozen_weights == Tier::kNvme) {
    // What the model's files do not serve as uploaded is converted to a copy first.
    nvme += p.memory.nvme.bytes_of("weights.frozen") > 0
                ? ", the frozen base streamed from a copy converted on NVMe in " + job.nvme_dir +
                      " (" + nvme_bytes("weights.frozen") + ")"
                : ", the frozen base streamed from the model's files";
  }
  t.summary = DevicesCountText(job) + ", " + std::to_string(p.stages.size()) + " stage" +
              (p.stages.size() == 1 ? "" : "s") +
              (p.tail_parts > 1 ? ", the tail in " + std::to_string(p.tail_parts) + " parts" : "") +
              (p.grad_accumulators > 1 ? ", two gradient accumulators" : "") + ", activations " +
              p.activation_policy + ", " + FormatBytes(p.memory.gpu.total()) + " per device" + nvme;
  t.plan = p;
  return t;
}

Result<GenerationRunner> CreateGenerationRunner(const JobSpec& unresolved, const ModelConfig& model,
                                                const HostTensors& weights, int threads,
                                                int64_t positions) {
  GenerationRunner g;
  const GpuCensus census = CensusFor(unresolved);
  JobSpec job = unresolved;
  FERRY_RETURN_IF_ERROR(ResolveJobDevices(job, census).status());
  if (OnGpus(job)) {
    return Status::InvalidArgument(
        "generation runs on CPU devices for now (--devices cpu): it keeps its KV cache in f32, "
        "and GPU plans compute in bf16 or f16");
  }
  FERRY_ASSIGN_OR_RETURN(
      g.plan, PlanJobDevices(job, model, threads, /*forward_only=*/true, census, {}, positions));
  FERRY_ASSIGN_OR_RETURN(g.devices,
                         exec::CreateJobDevices(job, g.plan.memory.gpu.total(), threads));
  std::vector<Device*> raw;
  for (const std::unique_ptr<Device>& d : g.devices) raw.push_back(d.get());
  FERRY_ASSIGN_OR_RETURN(g.generator, exec::CreatePlannedGenerator(raw, model, g.plan, weights));
  const size_t stages = g.plan.stages.size();
  g.summary = DevicesCountText(job) + ", " + std::to_string(stages) + " stage" +
              (stages == 1 ? "" : "s") + ", " + FormatBytes(g.plan.memory.gpu.total()) +
              " per device (KV cache of " + std::to_string(positions) + " positions)";
  return g;
}

}  // namespace ferry
