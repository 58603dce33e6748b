#include "apps/train_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "apps/job_file.h"
#include "apps/job_options.h"
#include "engine/exec/job_device_factory.h"
#include "engine/job/job_devices.h"
#include "engine/job/run_folder.h"
#include "engine/job/run_limits.h"
#include "engine/json.h"
#include "engine/plan/byte_size.h"
#include "engine/probe/layer_probe.h"
#include "engine/train/run_training.h"
#include "engine/train/stop_signals.h"
#include "engine/train/training_runner.h"
#include "offload/file_io.h"

namespace ferry {

void AddTrainCommand(CLI::App& parent, TrainCommand* cmd) {
  JobSpec& j = cmd->job;
  CLI::App* t = parent.add_subcommand(
      "train",
      "Fine-tune a model. With no options: the built-in tiny Llama-style model on the "
      "built-in dataset, on the CPU, in a minute or two.\n"
      "--config FILE reads a job file (TOML): each key is one of the options below "
      "without its dashes (steps = 100, lora-rank = 8); options on the command line "
      "win.");
  cmd->app = t;
  t->fallthrough();
  AddJobOptions(*t, j, &cmd->lora_targets);
  t->add_option("--threads", j.threads, "CPU threads (0: all cores)")->capture_default_str();
  AddDevicesOption(*t, j,
                   "the job is planned for them (one CPU device: one stage when the model fits) "
                   "and the planned pipeline runs over them");
  t->add_option("--dtype", j.dtype,
                "Compute dtype: f32 (the exact reference, CPU devices), bf16 (bf16 weights and "
                "activations, bf16 GEMMs with fp32 accumulation where the device has them), f16 "
                "(f16 weights and activations, dynamic loss scaling), fp16acc (f16 whose all-f16 "
                "GEMMs accumulate in fp16: faster on RTX cards, less exact; GPUs only) or auto "
                "(f32 on CPU devices, bf16 on GPUs); fp32 master weights")
      ->transform([](std::string name) { return CanonicalDtypeName(std::move(name)); })
      ->capture_default_str();
  t->add_option("--loss-scale", j.loss_scale,
                "With --dtype f16: the initial dynamic loss scale, a power of two (halved on a "
                "step with inf/nan gradients, which is skipped)")
      ->capture_default_str();
  t->add_option("--loss-scale-growth-interval", j.loss_scale_growth_interval,
                "With --dtype f16: consecutive finite steps after which the loss scale doubles")
      ->capture_default_str();
  t->add_option("--host-memory", j.host_memory,
                "Host RAM the job's plan may use, e.g. 2GiB (default: physical RAM)");
  AddGpuMemoryOption(*t, j);
  t->add_option("--nvme-dir", j.nvme_dir,
                "Folder on an NVMe drive the job's plan may use (its free space): "
                "optimizer state goes there when host RAM is short");
  t->add_option("--out", j.out,
                "Run folder (created; an existing one only for the same job): weights, "
                "metrics.jsonl, job.json")
      ->capture_default_str();
  t->add_flag("--force", cmd->force,
              "Replace the run folder --out when it holds another job's run (never a folder "
              "with files ferry did not write)");
  t->add_option("--save-every", j.save_every,
                "Checkpoint every N updates into RUN_DIR/checkpoints (0: only at the end and on "
                "SIGINT/SIGTERM)")
      ->capture_default_str();
  t->add_option("--keep-checkpoints", j.keep_checkpoints, "Newest checkpoints kept")
      ->capture_default_str();
  t->add_flag("--checkpoint-compress", j.checkpoint_compress,
              "zstd-compress the checkpoints' tensor files");
  t->add_option("--trace", cmd->trace,
                "Write what ran as Chrome-trace JSON (Perfetto), timed by the devices' streams: "
                "per device compute, host->device and device->host lanes, the host's lanes, "
                "named as `ferry plan --trace` names the predicted ones");
  t->add_flag("--skip-rate-probe", cmd->skip_rate_probe,
              "On CPU devices, skip measuring this machine's rates at start (a probe of the "
              "plan's layers, copies, memory bandwidth and AdamW): the closing report then "
              "compares the run with a prediction at nominal rates");
  t->add_option("--resume", cmd->resume,
                "Continue the run in RUN_DIR from its newest intact checkpoint (job from "
                "RUN_DIR/job.json; only --steps or --epochs, --threads and the checkpoint options "
                "may change)");
}

namespace {

// With --resume: the run's job, with the changes the command line may make. Any other option
// given (on the command line or in a --config file) must agree with the run's job.
Result<JobSpec> ResumedJob(const TrainCommand& cmd) {
  const std::string path = cmd.resume + "/job.json";
  Result<std::string> text = ReadWholeFile(path);
  if (text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound(cmd.resume +
                            " is not a run folder of ferry train (it has no job.json)");
  }
  if (!text.ok()) return text.status();
  nlohmann::json saved = nlohmann::json::parse(*text, nullptr, false);
  FERRY_ASSIGN_OR_RETURN(JobSpec job, JobSpecFromJson(saved, path));
  FERRY_ASSIGN_OR_RETURN(ModelConfig model, ResolveModel(job));
  const nlohmann::json given = JobSpecToJson(cmd.job, model);
  // A run saved before job.json had device_kind ran on CPU devices.
  if (!saved.contains("device_kind")) job.device_kind = "cpu";
  nlohmann::json merged = JobSpecToJson(job, model);
  for (const CLI::Option* opt : cmd.app->get_options()) {
    if (opt->count() == 0) continue;
    std::string key = opt->get_name();
    while (!key.empty() && key.front() == '-') key.erase(key.begin());
    for (char& c : key) c = c == '-' ? '_' : c;
    if (key == "resume" || !given.contains(key)) continue;
    // --devices sets three keys.
    if (key == "devices") {
      // A count ("auto") names no kind: it agrees with the run's devices of that count.
      const bool count_only = given["device_kind"] == "auto";
      nlohmann::json a = {given["devices"], given["device_kind"], given["gpus"]};
      nlohmann::json b = {merged["devices"], merged["device_kind"], merged["gpus"]};
      if (count_only) a = a[0], b = b[0];
      if (a != b) {
        return Status::InvalidArgument("--devices " + DevicesOptionText(cmd.job) +
                                       " differs from the run's " + DevicesOptionText(job) + " (" +
                                       path + "); a resumed run keeps its devices");
      }
      continue;
    }
    if (key == "out") {
      return Status::InvalidArgument("--out cannot be combined with --resume (the run folder is " +
                                     cmd.resume + ")");
    }
    if (IsResumableJobKey(key)) {
      merged[key] = given[key];
      // The run's length is the pair SettleRunLength settled: --steps given to a run of epochs
      // takes over from them (the given epochs are 0 then), whichever option comes first.
      if (key == "steps") merged["epochs"] = given["epochs"];
    } else if (given[key] != merged[key]) {
      return Status::InvalidArgument(opt->get_name() + " " + given[key].dump() +
                                     " differs from the run's " + merged[key].dump() + " (" + path +
                                     "); a resumed run keeps its job: only --steps or "
                                     "--epochs, --threads and the checkpoint options may change");
    }
  }
  merged["out"] = cmd.resume;
  return JobSpecFromJson(merged, path);
}

}  // namespace

int RunTrainCommand(TrainCommand& cmd) {
  JobSpec& job = cmd.job;
  auto fail = [&cmd](const Status& s) {
    std::fprintf(stderr, "ferry train: %s\n", AnnotateJobFile(cmd.job_file, s).message().c_str());
    return 1;
  };
  Result<uint32_t> targets = ParseLoraTargets(cmd.lora_targets);
  if (!targets.ok()) return fail(targets.status().WithContext("--lora-targets"));
  job.lora.targets = *targets;
  RunControl control;
  if (Status s = SettleRunLength(*cmd.app, cmd.job_file, job); !s.ok()) return fail(s);
  if (!cmd.resume.empty()) {
    Result<JobSpec> resumed = ResumedJob(cmd);
    if (!resumed.ok()) return fail(resumed.status().WithContext("--resume"));
    job = *resumed;
    control.resume = true;
  }
  if (Status s = AdoptPreQuantizedBase(job); !s.ok()) return fail(s);
  Result<ModelConfig> model = ResolveModel(job);
  if (!model.ok()) return fail(model.status());
  if (Status s = ValidateJobSpec(job, *model); !s.ok()) return fail(s);
  // Which devices, settled before anything is written: job.json records them.
  const GpuCensus census = exec::TakeGpuCensus();
  Result<std::string> which = ResolveJobDevices(job, census);
  if (!which.ok()) return fail(which.status());
  control.devices_line = *which;
  // Loss scaling is f16's (engine/train/loss_scaler.h): a scale asked of another dtype is said
  // to be unused rather than dropped in silence.
  if (!F16Storage(job) &&
      (job.loss_scale != JobSpec{}.loss_scale ||
       job.loss_scale_growth_interval != JobSpec{}.loss_scale_growth_interval)) {
    std::fprintf(stderr,
                 "ferry train: note: --loss-scale and --loss-scale-growth-interval apply to "
                 "--dtype f16; this run is %s, which needs no loss scaling: not used\n",
                 job.dtype.c_str());
  }
  Result<uint64_t> gpu_budget = JobGpuBudget(job, census);
  if (!gpu_budget.ok()) return fail(gpu_budget.status());
  if (!job.gpu_memory.empty()) {
    control.devices_line +=
        ", at most " + plan::FormatByteSize(*gpu_budget) + " each (--gpu-memory)";
  }
  // The device the run will create, against this machine, before the run folder is touched.
  const int threads =
      job.threads > 0 ? int(job.threads) : int(MachineLimits::OfThisMachine().hardware_threads);
  RunLimits run;
  run.threads = job.threads;
  run.device_bytes = [&] { return TrainingDevicesBytes(job, *model, threads); };
  run.device_from = "--batch-size " + std::to_string(job.batch_size) + " / --micro-batches " +
                    std::to_string(job.micro_batches) + " x --seq-len " +
                    std::to_string(job.seq_len);
  run.device_from += " on --devices " + DevicesOptionText(job);
  if (Status s = ValidateRunLimits(run, *model); !s.ok()) return fail(s);
  control.trace = cmd.trace;
  if (!cmd.skip_rate_probe) {
    control.price_plan = [&model](plan::Plan& p, const plan::HardwareProfile& hw, int threads) {
      return PriceOnCpuDevices(*model, hw, threads, p);
    };
  }
  if (cmd.force && control.resume)
    return fail(
        Status::InvalidArgument("--force cannot be "
                                "combined with --resume"));
  // The dataset files exist before the run folder is claimed (their contents are read later).
  for (const auto& [option, path] : {std::pair<const char*, const std::string&>{"--data", job.data},
                                     {"--val-data", job.val_data}}) {
    if (path.empty() || (path == "builtin" && std::string_view(option) == "--data")) continue;
    if (::access(path.c_str(), R_OK) != 0) {
      return fail(Status::FromErrno(errno, std::string(option) + " " + path));
    }
  }
  const RunFolderMode mode = control.resume ? RunFolderMode::kResume
                             : cmd.force    ? RunFolderMode::kForce
                                            : RunFolderMode::kNew;
  Result<RunFolderLock> lock = ClaimRunFolder(job, JobSpecToJson(job, *model), mode);
  if (!lock.ok()) return fail(lock.status());
  // A resumed run's job.json is rewritten once its checkpoint is chosen and accepted.
  if (!control.resume) {
    if (Status s = WriteJobJson(job, *model); !s.ok()) return fail(s);
  }
  control.on_resume = [&model](int64_t checkpoint_step, const JobSpec& run) {
    if (run.steps < checkpoint_step) {
      char length[96];
      if (run.epochs > 0) {
        std::snprintf(length, sizeof length, "--epochs %g (%lld updates)", run.epochs,
                      (long long)run.steps);
      } else {
        std::snprintf(length, sizeof length, "--steps %lld", (long long)run.steps);
      }
      return Status::InvalidArgument(std::string(length) + " is below the checkpoint's step " +
                                     std::to_string(checkpoint_step) + "; give --steps " +
                                     std::to_string(checkpoint_step) + " or more");
    }
    return WriteJobJson(run, *model);
  };
  Result<StopSignals> signals = StopSignals::Install();
  if (signals.ok()) {
    control.stop_requested = [&signals] { return signals->Poll(); };
  } else {
    std::fprintf(stderr, "ferry train: warning: %s; SIGINT/SIGTERM will not save a checkpoint\n",
                 signals.status().message().c_str());
  }
  if (const char* kill_at = std::getenv("FERRY_TEST_CHECKPOINT_KILL"); kill_at != nullptr) {
    const std::string spec = kill_at;
    const size_t colon = spec.find(':');
    const int64_t step = std::atoll(spec.substr(0, colon).c_str());
    const std::string stage = colon == std::string::npos ? "" : spec.substr(colon + 1);
    control.checkpoint_fault_hook = [step, stage](int64_t at, std::string_view reached) {
      if (at == step && reached == stage) ::kill(::getpid(), SIGKILL);
      return Status::Ok();
    };
  }
  if (const char* kill_at = std::getenv("FERRY_TEST_COMMIT_KILL"); kill_at != nullptr) {
    const std::string spec = kill_at;
    const size_t colon = spec.find(':');
    const int64_t version = std::atoll(spec.substr(0, colon).c_str());
    const int64_t nth = colon == std::string::npos ? 1 : std::atoll(spec.substr(colon + 1).c_str());
    auto seen = std::make_shared<int64_t>(0);  // commits at `version` so far
    control.optimizer_commit_hook = [version, nth, seen](int64_t at, int64_t) {
      if (at == version && ++*seen == nth) ::kill(::getpid(), SIGKILL);
    };
  }
  Status s = RunTraining(job, *model, control);
  if (s.code() == StatusCode::kCancelled && signals.ok() && signals->Poll() != 0) {
    std::fprintf(stderr, "ferry train: %s\n", s.message().c_str());
    return 128 + signals->Poll();
  }
  if (s.code() == StatusCode::kUnavailable) {
    std::fprintf(stderr, "ferry train: %s (the resolved job is in %s/job.json)\n",
                 s.message().c_str(), job.out.c_str());
    return 2;
  }
  if (!s.ok()) return fail(s);
  return 0;
}

}  // namespace ferry
