#include "apps/plan_command.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "apps/job_file.h"
#include "apps/job_options.h"
#include "engine/job/model_source.h"
#include "engine/json.h"
#include "engine/model/model_folder.h"
#include "engine/plan/byte_size.h"
#include "engine/plan/planner.h"
#include "engine/plan/simulator.h"
#include "engine/plan/timeline_writers.h"
#include "engine/train/progress_bar.h"
#include "engine/train/training_data.h"
#include "offload/file_io.h"

namespace ferry {

namespace fs = std::filesystem;

// configs/ of the source tree (set at build time), or $FERRY_CONFIG_DIR.
static std::string ConfigDir() {
  const char* env = std::getenv("FERRY_CONFIG_DIR");
  if (env != nullptr && *env != '\0') return env;
  return FERRY_CONFIG_DIR_DEFAULT;
}

// A preset name (configs/<kind>/<name>.json) or a path to a file (a folder: its
// config.json).
std::string ResolveConfigPath(const std::string& kind, const std::string& name) {
  if (fs::is_directory(name)) return (fs::path(name) / "config.json").string();
  if (fs::exists(name)) return name;
  return (fs::path(ConfigDir()) / kind / (name + ".json")).string();
}

Result<ModelConfig> ResolvePlanModel(const std::string& name) {
  FERRY_ASSIGN_OR_RETURN(ModelSource source,
                         ResolveModelSource(name, "", ModelUse::kConfigOnly,
                                            (fs::path(ConfigDir()) / "models").string()));
  return source.config;
}

Result<plan::PlanJob> PlanJobOf(const JobSpec& spec, const std::string& lora_targets,
                                bool micro_batches_given, const std::string& dtype) {
  Result<uint32_t> targets = ParseLoraTargets(lora_targets);
  if (!targets.ok()) return targets.status().WithContext("--lora-targets");
  // fp16acc: fp16 compute whose GEMMs accumulate in fp16, a price the planner knows (the GPU's
  // fp16-accumulate rate) though no executor runs it yet.
  const bool fp16_accumulate = dtype == plan::kFp16AccumulateName;
  Result<DType> compute = fp16_accumulate ? Result<DType>(DType::kF16) : ParseDType(dtype);
  if (!compute.ok() ||
      (*compute != DType::kBF16 && *compute != DType::kF16 && *compute != DType::kF32)) {
    return Status::InvalidArgument("--dtype '" + dtype +
                                   "': use bf16, fp16, fp16acc (fp16 accumulation, GPUs) "
                                   "or f32 (CPU devices)");
  }
  plan::PlanJob job;
  job.global_batch = spec.batch_size;
  job.seq_len = spec.seq_len;
  job.micro_batches = micro_batches_given ? spec.micro_batches : 0;
  job.lora = spec.lora;
  job.lora.targets = *targets;
  job.frozen_base_from_files = spec.model != "tiny";
  job.compute_dtype = *compute;
  job.fp16_accumulate = fp16_accumulate;
  if (*compute == DType::kF32) {
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    job.scratch = {.cuda = false, .cpu_threads = spec.threads > 0 ? int(spec.threads) : cores};
  }
  return job;
}

namespace {

// --nvme-dir: the space the plan may use there is at most what the filesystem has free. An
// explicit --nvme-space beyond it is refused; the profile's drive size is lowered to it (noted on
// stderr), so no plan counts on space that is not there.
Status FitNvmeToFreeSpace(const PlanCommand& cmd, plan::HardwareProfile& hw) {
  Result<uint64_t> free = FreeSpace(cmd.nvme_dir);
  if (!free.ok()) return free.status().WithContext("--nvme-dir");
  if (hw.nvme.space_bytes <= *free) return Status::Ok();
  const std::string have = plan::FormatByteSize(*free) + " free in --nvme-dir " + cmd.nvme_dir;
  if (!cmd.nvme_space.empty()) {
    return Status::InvalidArgument("--nvme-space " + cmd.nvme_space + " (" +
                                   plan::FormatByteSize(hw.nvme.space_bytes) + ") exceeds the " +
                                   have + "; free space there or give " + "--nvme-space " +
                                   std::to_string(*free >> 30) + "GiB or less");
  }
  std::fprintf(stderr, "ferry plan: note: planning with the %s (the profile's drive has %s)\n",
               have.c_str(), plan::FormatByteSize(hw.nvme.space_bytes).c_str());
  hw.nvme.space_bytes = *free;
  return plan::ValidateHardwareProfile(hw);
}

Result<plan::HardwareProfile> ResolveHardware(const PlanCommand& cmd) {
  const std::string path = ResolveConfigPath("hardware", cmd.hardware);
  if (!fs::exists(path)) {
    return Status::NotFound("--hardware '" + cmd.hardware + "': no profile " + path +
                            " and no such file; name a file in configs/hardware or a path");
  }
  FERRY_ASSIGN_OR_RETURN(plan::HardwareProfile hw, plan::LoadHardwareProfile(path));
  FERRY_ASSIGN_OR_RETURN(
      plan::BudgetOverrides o,
      plan::ParseBudgetOverrides(cmd.gpu_memory, cmd.host_memory, cmd.nvme_dir, cmd.nvme_space));
  FERRY_RETURN_IF_ERROR(plan::ApplyBudgetOverrides(o, hw));
  if (!cmd.nvme_dir.empty()) FERRY_RETURN_IF_ERROR(FitNvmeToFreeSpace(cmd, hw));
  return hw;
}

Status WriteTimeline(const PlanCommand& cmd, const ModelConfig& model, const plan::Plan& p,
                     const plan::HardwareProfile& hw) {
  if (cmd.svg.empty() && cmd.trace.empty()) return Status::Ok();
  FERRY_ASSIGN_OR_RETURN(plan::Schedule schedule,
                         plan::BuildRoundRobinSchedule(plan::RoundRobinJobOf(model, p, hw)));
  FERRY_ASSIGN_OR_RETURN(plan::SimResult sim,
                         plan::Simulate(schedule, plan::LaneRatesFromProfile(hw, true)));
  if (!cmd.svg.empty()) {
    plan::SvgOptions options;
    options.title = p.model_name + " on " + p.hardware_name + ": one step, round-robin";
    FERRY_RETURN_IF_ERROR(WriteTextFile(cmd.svg, plan::TimelineSvg(schedule, sim, options)));
  }
  if (!cmd.trace.empty()) {
    FERRY_RETURN_IF_ERROR(WriteTextFile(cmd.trace, plan::ChromeTraceJson(schedule, sim)));
  }
  return Status::Ok();
}

// "  run: ..." — the run's length at the plan's step: its updates (--steps, or --epochs' over
// `rows` packed training rows; `updates` 0: the data was not read) and their time.
std::string RunLine(const JobSpec& job, int64_t rows, int64_t updates, double seconds) {
  if (job.epochs > 0 && updates == 0) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "--epochs %g: its updates are counted from the packed data (plan a model folder "
                  "to count them)",
                  job.epochs);
    return std::string("  run: ") + what + "\n";
  }
  const std::string what = job.epochs > 0 ? EpochsUpdates(job.epochs, rows, updates)
                                          : std::to_string(updates) + " updates (--steps)";
  return "  run: " + what + " in about " + FormatDuration(seconds) +
         " at the predicted step (start-up, validation and checkpoints not counted)\n";
}

}  // namespace

void AddPlanCommand(CLI::App& parent, PlanCommand* cmd) {
  CLI::App* p =
      parent.add_subcommand("plan",
                            "Plan a job before running it: what fits, where every byte "
                            "lives, how fast it will run.\n"
                            "Takes the job options of `ferry train` (and --config job files) "
                            "plus a hardware profile; "
                            "exits with 3 when nothing fits, naming what is short and the "
                            "changes that would fit.");
  cmd->app = p;
  p->fallthrough();
  AddJobOptions(*p, cmd->job, &cmd->lora_targets);
  p->add_option("--threads", cmd->job.threads, "Accepted so train job files plan as they are");
  AddDevicesOption(*p, cmd->job,
                   "accepted so train job files plan as they are (the plan's GPUs are "
                   "--hardware's)");
  p->add_option("--out", cmd->job.out, "Accepted so train job files plan as they are");
  // The rest of a train job's keys, which change no plan.
  p->add_option("--loss-scale", cmd->job.loss_scale,
                "Accepted so train job files plan as they are");
  p->add_option("--loss-scale-growth-interval", cmd->job.loss_scale_growth_interval,
                "Accepted so train job files plan as they are");
  p->add_option("--save-every", cmd->job.save_every,
                "Accepted so train job files plan as they are");
  p->add_option("--keep-checkpoints", cmd->job.keep_checkpoints,
                "Accepted so train job files plan as they are");
  p->add_flag("--checkpoint-compress", cmd->job.checkpoint_compress,
              "Accepted so train job files plan as they are");
  p->add_option("--hardware", cmd->hardware,
                "Hardware profile: a name in configs/hardware (1x-rtx4090-pcie4, "
                "8x-rtx4090-pcie4, ...) or a path (ferry probe writes one)")
      ->capture_default_str();
  p->add_option("--gpu-memory", cmd->gpu_memory, "Usable memory per GPU, e.g. 20GiB");
  p->add_option("--host-memory", cmd->host_memory, "Host RAM ferry may use, e.g. 256GiB");
  p->add_option("--nvme-dir", cmd->nvme_dir, "Directory on an NVMe drive ferry may use");
  p->add_option("--nvme-space", cmd->nvme_space, "Space ferry may use in --nvme-dir, e.g. 2TB");
  p->add_option("--dtype", cmd->dtype,
                "Compute dtype: bf16, fp16, fp16acc (fp16 GEMMs accumulating in fp16: priced at "
                "the GPU's fp16-accumulate rate; ferry train --dtype fp16acc runs it on GPUs) or "
                "f32 (CPU devices)")
      ->capture_default_str();
  p->add_flag("--json", cmd->json, "Print the plan as JSON instead of the summary");
  p->add_flag("--explain", cmd->explain,
              "Also show the candidates the planner weighed: the fastest runners-up, what each "
              "lost on, and those closest to fitting (with --json: every candidate)");
  p->add_option("--svg", cmd->svg, "Write the predicted timeline of one step as an SVG Gantt");
  p->add_option("--trace", cmd->trace, "Write the timeline as Chrome-trace JSON (Perfetto)");
}

int RunPlanCommand(PlanCommand& cmd) {
  auto fail = [&cmd](const Status& s) {
    std::fprintf(stderr, "ferry plan: %s\n", AnnotateJobFile(cmd.job_file, s).message().c_str());
    return 1;
  };
  if (Status s = SettleRunLength(*cmd.app, cmd.job_file, cmd.job); !s.ok()) return fail(s);
  // A folder pre-quantized by bitsandbytes plans as QLoRA, as `ferry train` runs it.
  if (fs::is_directory(cmd.job.model)) {
    if (Status s = AdoptPreQuantizedBase(cmd.job); !s.ok()) return fail(s);
  }
  Result<ModelConfig> model = ResolvePlanModel(cmd.job.model);
  if (!model.ok()) return fail(model.status());
  // What `ferry train` would refuse, plan refuses too (the planner judges what fits the profile).
  if (Status s = ValidateJobSpec(cmd.job, *model); !s.ok()) return fail(s);
  Result<plan::PlanJob> job =
      PlanJobOf(cmd.job, cmd.lora_targets, cmd.app->count("--micro-batches") > 0, cmd.dtype);
  if (!job.ok()) return fail(job.status());
  job->stale_updates = cmd.job.stale_updates;  // every plan prices both modes
  // A LoRA base streamed from a folder's files is read in whole blocks of the drive: counted from
  // where its tensors lie there. A folder whose weights cannot be read yet (shards not downloaded)
  // still plans, counting the most the reads can take, and says why when the plan streams it.
  Status unread_layout;
  if (job->frozen_base_from_files && plan::CanStreamBase(*job)) {
    Result<std::shared_ptr<const TensorFileLayout>> layout =
        FolderTensorLayout(cmd.job.model, *model);
    if (layout.ok()) {
      job->base_file_layout = *layout;
    } else {
      unread_layout = layout.status();
    }
  }
  // Packed data's documents size the GPU attention (as `ferry train` plans them): read --data
  // when the model has a tokenizer to read it with (a folder, or the built-in tiny model).
  int64_t training_rows = 0;  // what --epochs counts its updates by; 0: not read
  if (cmd.job.data != "builtin") {
    if (cmd.job.model == "tiny" || fs::is_directory(cmd.job.model)) {
      Result<std::unique_ptr<TrainingData>> data = TrainingData::Load(cmd.job, *model);
      if (!data.ok()) return fail(data.status().WithContext("--data"));
      plan::DataCounts counts = (*data)->Counts(job->global_batch);
      job->documents_in_rows = std::move(counts.documents_in_rows);
      job->data_host_bytes = counts.host_bytes;
      training_rows = (*data)->training_rows();
    } else {
      std::fprintf(stderr,
                   "ferry plan: note: --data %s is not read (the preset '%s' has no tokenizer): "
                   "planned as one document per sequence, its rows not in host memory; plan a "
                   "model folder to count them\n",
                   cmd.job.data.c_str(), cmd.job.model.c_str());
    }
  }
  Result<plan::HardwareProfile> hw = ResolveHardware(cmd);
  if (!hw.ok()) return fail(hw.status());
  Result<plan::PlanOutcome> outcome =
      plan::MakePlan(cmd.job.model, *model, *job, *hw, /*suggest=*/true, cmd.explain);
  if (!outcome.ok()) return fail(outcome.status());
  if (outcome->feasible && outcome->plan.base_reads_at_most && !unread_layout.ok()) {
    std::fprintf(stderr,
                 "ferry plan: note: %s: the frozen base's reads from NVMe are counted at the most "
                 "they can take\n",
                 unread_layout.ToString().c_str());
  }
  // The run's updates: --steps, or --epochs' once the data is packed (0: not read).
  const int64_t updates = cmd.job.epochs == 0 ? cmd.job.steps
                          : training_rows > 0
                              ? StepsForEpochs(cmd.job.epochs, training_rows, cmd.job.batch_size)
                              : 0;
  const double run_s = double(updates) * outcome->plan.step_s;
  if (cmd.json) {
    nlohmann::json j = plan::OutcomeToJson(*outcome);
    if (cmd.explain) j["candidates"] = plan::CandidatesToJson(outcome->candidates);
    if (outcome->feasible) {
      j["run"] = {{"updates", updates > 0 ? nlohmann::json(updates) : nlohmann::json()},
                  {"seconds", updates > 0 ? nlohmann::json(run_s) : nlohmann::json()}};
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", plan::OutcomeSummary(*outcome).c_str());
    if (outcome->feasible)
      std::printf("%s", RunLine(cmd.job, training_rows, updates, run_s).c_str());
    if (cmd.explain) std::printf("%s", plan::ExplainCandidates(*outcome).c_str());
  }
  if (!outcome->feasible) return 3;
  if (Status s = WriteTimeline(cmd, *model, outcome->plan, *hw); !s.ok()) return fail(s);
  return 0;
}

}  // namespace ferry
