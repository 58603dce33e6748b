#include "engine/train/run_training.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "engine/job/job_devices.h"
#include "engine/job/run_folder.h"
#include "engine/json.h"
#include "engine/model/converted_base.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/model/model_runner.h"
#include "engine/train/dataset.h"
#include "engine/train/progress_bar.h"
#include "engine/train/run_report.h"
#include "engine/train/trainer.h"
#include "engine/train/training_data.h"
#include "engine/train/training_runner.h"
#include "kernels/arena.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/onednn.h"
#include "offload/file_io.h"
#include "offload/versioned_store.h"

namespace ferry {

Status RunTraining(const JobSpec& job_in, const ModelConfig& model, const RunControl& control) {
  JobSpec job = job_in;  // with --epochs, its steps are set once the data is packed
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const int threads =
      job.threads > 0 ? int(job.threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  const BatchShape shape{job.micro_batch_size(), job.seq_len};
  // What the process holds before the run's data and plan (ferry's code, its libraries).
  const Result<uint64_t> rss_at_start = ResidentBytes();
  const Result<uint64_t> file_rss_at_start = ResidentFileBytes();
  // The data first: its documents per micro-batch size the plan's attention.
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> data, TrainingData::Load(job, model));
  std::string epochs_line;  // printed with the data's line
  if (job.epochs > 0) {
    job.steps = StepsForEpochs(job.epochs, data->training_rows(), job.batch_size);
    epochs_line = EpochsUpdates(job.epochs, data->training_rows(), job.steps) + " of " +
                  std::to_string(job.batch_size) + " rows";
    // job.json says how long the run is (a resumed run's is written once its checkpoint is
    // accepted, control.on_resume).
    if (!control.resume) FERRY_RETURN_IF_ERROR(WriteJobJson(job, model));
  }
  FERRY_ASSIGN_OR_RETURN(
      TrainingRunner devices,
      CreateTrainingRunner(job, model, threads, !control.trace.empty(), /*forward_only=*/false,
                           data->Counts(job.micro_batch_size())));
  ModelRunner* runner = devices.runner.get();
  // The plan's prediction on this machine's rates (CPU devices: the profile's are nominal),
  // measured while nothing else runs.
  std::string pricing;
  const bool on_cpu = std::all_of(devices.devices.begin(), devices.devices.end(),
                                  [](const auto& d) { return d->kind() == DeviceKind::kCpu; });
  if (control.price_plan && devices.plan && on_cpu && !devices.devices.empty()) {
    Result<std::string> line = control.price_plan(*devices.plan, devices.profile, threads);
    pricing = line.ok()
                  ? *line
                  : "warning: the prediction stays at nominal rates: " + line.status().ToString();
  }
  // The host's optimizer threads, started before the set-up is measured (below).
  ThreadPool optimizer_pool(threads);
  // The run's own host peak starts here: what loading the data and pricing the plan held for a
  // while (the probe's buffers) is gone, with or without a probe, and the heap gives back the
  // pages it kept of it (the examples before packing, the tokenizer's work).
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
  if (Status s = ResetPeakResidentBytes(); !s.ok()) {
    pricing += std::string(pricing.empty() ? "" : "; ") +
               "warning: the host peak includes what the start held for a while: " + s.ToString();
  }
  // What the start left resident that the plan does not count: the threads started so far
  // (stacks, their heaps: the devices', the optimizer's pool above), the libraries' state once
  // initialized (a GEMM library's, the CUDA runtime's), the tokenizer; the plan's own memory
  // already in RAM (the data's rows, pinned staging locked for a GPU, arena pages, the NVMe
  // activation store's bounce buffers registered with io_uring) is not part of it.
  uint64_t setup_bytes = 0;
  if (const Result<uint64_t> rss = ResidentBytes(), file_rss = ResidentFileBytes();
      rss.ok() && file_rss.ok() && rss_at_start.ok() && file_rss_at_start.ok()) {
    uint64_t planned_resident = data->host_bytes() + runner->host_resident_bytes();
    if (devices.activation_store)
      planned_resident += devices.activation_store->bounce_resident_bytes();
    for (const auto& d : devices.devices) planned_resident += d->host_resident_bytes();
    const uint64_t anon_now = *rss > *file_rss ? *rss - *file_rss : 0;
    const uint64_t anon_start =
        *rss_at_start > *file_rss_at_start ? *rss_at_start - *file_rss_at_start : 0;
    const uint64_t grew = anon_now > anon_start ? anon_now - anon_start : 0;
    setup_bytes = grew > planned_resident ? grew - planned_resident : 0;
  }

  std::vector<LayerSpec> layers = BuildLayerSpecs(model, job.lora);
  FERRY_ASSIGN_OR_RETURN(HostTensors weights, InitialWeights(job.model, model, layers, job.seed));
  CheckpointMeta meta;
  meta.job = JobSpecToJson(job, model);
  std::optional<CheckpointState> resumed;
  if (control.resume) {
    FERRY_ASSIGN_OR_RETURN(
        resumed, LoadLatestCheckpoint(
                     job.out,
                     [](const std::string& w) {
                       std::fprintf(stderr, "ferry train: warning: %s\n", w.c_str());
                     },
                     [&meta](const CheckpointState& c) {
                       return CompareSavedJob(c.meta.job, meta.job, c.dir + "/state.json");
                     }));
    if (control.on_resume) FERRY_RETURN_IF_ERROR(control.on_resume(resumed->step, job));
    FERRY_RETURN_IF_ERROR(ApplyCheckpointWeights(*resumed, layers, weights));
  }
  // A plan that streams the frozen base from NVMe: what the model's files do not serve as it
  // streams (a seeded base, a wider dtype, NF4) is converted there now, once, and the RAM it held
  // freed; the plan reserved its space (weights.frozen).
  uint64_t base_copy_bytes = 0;
  if (devices.plan && devices.plan->frozen_weights == Tier::kNvme) {
    const auto converting = std::chrono::steady_clock::now();
    const DType dtype = devices.plan->job.compute_dtype;
    Result<ConvertedBase> converted =
        MoveBaseToNvme(layers, dtype, model.weights_dtype, job.nvme_dir, weights);
    if (!converted.ok()) {
      return converted.status().WithContext("the frozen base's copy for --nvme-dir " +
                                            job.nvme_dir);
    }
    const uint64_t planned = devices.plan->memory.nvme.bytes_of("weights.frozen");
    if (converted->bytes > planned) {
      return Status::InvalidArgument(
          "the frozen base's copy converted to " + std::string(DTypeName(dtype)) + " takes " +
          FormatBytes(converted->bytes) + " in --nvme-dir " + job.nvme_dir +
          ", more than the plan reserved (" + FormatBytes(planned) +
          "): some weights the plan took the model's files to serve (as config.json's " +
          "torch_dtype, " + std::string(DTypeName(model.weights_dtype)) +
          ", says) were read into RAM instead (an F64 file); give it more --host-memory, so "
          "that the base stays in RAM");
    }
    base_copy_bytes = converted->bytes;
    if (converted->weights > 0) {
      std::fprintf(stderr,
                   "ferry train: the frozen base converted to %s on NVMe in %s: %lld weights, "
                   "%s, %.1f s\n",
                   std::string(DTypeName(dtype)).c_str(), job.nvme_dir.c_str(),
                   (long long)converted->weights, FormatBytes(converted->bytes).c_str(),
                   seconds_since(converting));
    }
  }
  const OptimizerOptions optimizer{
      .schedule = {.lr = job.lr,
                   .warmup_steps = job.warmup_steps,
                   .total_steps = job.steps,
                   .min_ratio = job.min_lr_ratio,
                   .decay = job.lr_schedule},
      .beta1 = job.beta1,
      .beta2 = job.beta2,
      .eps = job.adam_eps,
      .weight_decay = job.weight_decay,
      .grad_clip = job.grad_clip,
      .stale_updates = job.stale_updates,
      .loss_scaling = {.enabled = F16Storage(job),
                       .initial_scale = job.loss_scale,
                       .growth_interval = job.loss_scale_growth_interval}};
  // A resume hands the checkpoint's moments to the trainer (moved, never held twice).
  std::shared_ptr<OptimizerStateOptions::Resumed> resume;
  if (resumed) {
    resume = std::make_shared<OptimizerStateOptions::Resumed>(
        OptimizerStateOptions::Resumed{.steps_done = resumed->step,
                                       .exp_avg = std::move(resumed->exp_avg),
                                       .exp_avg_sq = std::move(resumed->exp_avg_sq),
                                       .loss_scaler = resumed->loss_scaler});
    meta.elapsed_s = resumed->meta.elapsed_s;
    meta.metrics = std::move(resumed->meta.metrics);
  }
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<Trainer> trainer,
      Trainer::Create(runner, std::move(layers), std::move(weights), optimizer, &optimizer_pool,
                      {.nvme_dir = devices.optimizer_nvme_dir(),
                       .committed = control.optimizer_commit_hook,
                       .resume = std::move(resume)}));
  trainer->set_trace(devices.trace.get());
  const CheckpointOptions checkpoint_options{.keep = job.keep_checkpoints,
                                             .compress = job.checkpoint_compress,
                                             .fault_hook = control.checkpoint_fault_hook,
                                             .warn = [](const std::string& w) {
                                               std::fprintf(stderr, "ferry train: warning: %s\n",
                                                            w.c_str());
                                             }};
  uint64_t nvme_checkpoint_reads = 0;  // optimizer state read back from NVMe for checkpoints
  auto save_checkpoint = [&](double elapsed) -> Result<std::string> {
    meta.elapsed_s = elapsed;
    FERRY_RETURN_IF_ERROR(trainer->FinishUpdates());  // the last step's may still be pending
    const VersionedStore* store = trainer->state_store();
    const uint64_t read_before = store != nullptr ? store->stats().bytes_read : 0;
    Result<std::string> saved = SaveCheckpoint(job.out, *trainer, meta, checkpoint_options);
    if (store != nullptr) nvme_checkpoint_reads += store->stats().bytes_read - read_before;
    return saved;
  };

  const BatchSource& batcher = data->source();
  std::fprintf(stderr, "ferry train: data: %s\n", data->summary().c_str());
  if (!epochs_line.empty()) std::fprintf(stderr, "ferry train: %s\n", epochs_line.c_str());
  if (job.warmup_steps > job.steps) {
    std::fprintf(stderr,
                 "ferry train: note: --warmup-steps %lld is more than the run's %lld updates: the "
                 "rate never reaches --lr (at most %.3g of it)\n",
                 (long long)job.warmup_steps, (long long)job.steps,
                 double(job.steps) / double(job.warmup_steps));
  }
  std::fprintf(stderr, "ferry train: CPU GEMM: %s; %s\n", cpu::Blas().Describe().c_str(),
               cpu::Bf16GemmPathDescription().c_str());

  const std::string metrics_path = job.out + "/metrics.jsonl";
  if (resumed) FERRY_RETURN_IF_ERROR(WriteFileAtomically(metrics_path, meta.metrics));
  Result<AppendFile> metrics = AppendFile::Open(metrics_path, /*truncate=*/!resumed);
  if (!metrics.ok()) return metrics.status().WithContext("metrics; choose another --out");

  const int64_t params = CountParameters(trainer->layers());
  const int64_t trainable = CountTrainableParameters(trainer->layers());
  // QLoRA: what the frozen base's block projections occupy on the host, in NF4.
  std::string base;
  if (job.lora.quantize == BaseQuant::kNf4) {
    uint64_t nf4 = 0, fp32 = 0;
    for (const ParamSpec* p : StorageParams(trainer->layers())) {
      if (p->nf4) nf4 += p->host_bytes(), fp32 += uint64_t(p->numel()) * 4;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "; base NF4%s: %.2f MiB, %.1fx smaller than fp32",
                  job.lora.double_quant ? " double-quantized" : "", double(nf4) / (1 << 20),
                  nf4 > 0 ? double(fp32) / double(nf4) : 0.0);
    base = buf;
  }
  std::fprintf(stderr,
               "ferry train: %s model, %.2fM parameters (%.2fM trainable%s), "
               "%lld steps of %lld x "
               "%lld tokens, %d threads, %s -> %s\n",
               model.model_type.c_str(), double(params) / 1e6, double(trainable) / 1e6,
               base.c_str(), (long long)job.steps, (long long)job.batch_size,
               (long long)job.seq_len, threads, job.dtype.c_str(), job.out.c_str());
  if (!control.devices_line.empty()) {
    std::fprintf(stderr, "ferry train: devices: %s\n", control.devices_line.c_str());
  }
  std::fprintf(stderr, "ferry train: %s\n", devices.summary.c_str());
  if (!pricing.empty()) std::fprintf(stderr, "ferry train: %s\n", pricing.c_str());
  ProgressBar progress(stderr, ::isatty(::fileno(stderr)) != 0,
                       std::max<int64_t>(1, job.steps / 20));
  MeasuredRun measured;
  // A streamed frozen base: the bytes the last step read from the drive, measured only
  // when that step followed another of this process with no evaluation between (a first step, or
  // one after an evaluation, finds other weights in the devices' slots than the steady state the
  // plan prices).
  uint64_t base_last_step = 0;
  bool base_warm = false, after_step = false;
  // NVMe traffic of the steps this run makes (not of creating or rebuilding the store).
  const int64_t steps_at_start = trainer->steps_done();
  const VersionedStoreStats nvme_at_start =
      trainer->state_store() != nullptr ? trainer->state_store()->stats() : VersionedStoreStats{};
  const NvmeStore* activations = devices.activation_store.get();
  const StoreStats activations_at_start = activations ? activations->stats() : StoreStats{};
  measured.step_seconds.reserve(size_t(std::max<int64_t>(job.steps, 0)));
  // A pipeline run ends with what it measured against its plan, and the trace when asked for.
  auto report = [&]() -> Status {
    if (!devices.plan) return Status::Ok();
    for (const auto& d : devices.devices) {
      measured.devices.push_back(
          {d->name(), d->arena_stats().peak, d->capacity(), d->host_resident_bytes()});
    }
    const Result<uint64_t> rss = PeakResidentBytes();
    measured.host_peak_bytes = rss.ok() ? *rss : 0;
    measured.host_start_bytes = rss_at_start.ok() ? *rss_at_start : 0;
    measured.host_setup_bytes = setup_bytes;
    // At the end, not at the peak: it can err either way. Code first run after the peak (the
    // final save, say) is subtracted from a peak that did not hold it; a mapping's pages
    // dropped before the end (a streamed base) are not subtracted though the peak held them.
    if (const Result<uint64_t> file_rss = ResidentFileBytes();
        file_rss.ok() && file_rss_at_start.ok()) {
      measured.host_file_growth_bytes =
          *file_rss > *file_rss_at_start ? *file_rss - *file_rss_at_start : 0;
    }
    if (const VersionedStore* store = trainer->state_store(); store != nullptr) {
      FERRY_RETURN_IF_ERROR(trainer->FinishUpdates());  // the last step's traffic, when deferred
      const VersionedStoreStats now = store->stats();
      const double steps = double(std::max<int64_t>(1, trainer->steps_done() - steps_at_start));
      measured.nvme_bytes = store->disk_bytes();
      measured.nvme_read_per_step =
          double(now.bytes_read - nvme_at_start.bytes_read - nvme_checkpoint_reads) / steps;
      measured.nvme_written_per_step =
          double(now.bytes_written - nvme_at_start.bytes_written) / steps;
    }
    if (activations != nullptr) {  // what the disk moved: whole 4096-byte pages, as planned
      // The space: its segment files (one, of the plan's size, unless the plan undercounts).
      measured.nvme_activation_bytes =
          ScratchStoreBytes(devices.activation_store.get_deleter().folder.dir());
      const StoreStats now = activations->stats();
      const double steps = double(std::max<int64_t>(1, trainer->steps_done() - steps_at_start));
      measured.nvme_read_per_step +=
          double(now.disk_bytes_read - activations_at_start.disk_bytes_read) / steps;
      measured.nvme_written_per_step +=
          double(now.disk_bytes_written - activations_at_start.disk_bytes_written) / steps;
    }
    if (devices.plan->frozen_weights == Tier::kNvme) {
      measured.nvme_base_copy_bytes = base_copy_bytes;
      measured.base_reads_measured = base_warm;
      if (base_warm) {
        measured.nvme_read_per_step += double(base_last_step);
      }
    }
    std::fprintf(stderr, "ferry train: %s", MeasuredVsPredicted(*devices.plan, measured).c_str());
    if (devices.trace == nullptr) return Status::Ok();
    FERRY_RETURN_IF_ERROR(WriteTextFile(control.trace, devices.trace->ChromeTraceJson())
                              .WithContext("--trace " + control.trace));
    std::fprintf(stderr, "ferry train: wrote the trace of %lld steps to %s\n",
                 (long long)(devices.trace->step() + 1), control.trace.c_str());
    return Status::Ok();
  };
  int64_t tokens_total = 0;
  double last_loss = 0;
  const int64_t first_step = trainer->steps_done();
  if (resumed) {
    std::fprintf(stderr, "ferry train: resuming from %s (step %lld)\n", resumed->dir.c_str(),
                 (long long)first_step);
  }
  const auto train_start = std::chrono::steady_clock::now() -
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(meta.elapsed_s));
  for (int64_t k = first_step; k < job.steps; ++k) {
    const auto step_start = std::chrono::steady_clock::now();
    std::vector<MicroBatch> batch;
    for (int64_t m = 0; m < job.micro_batches; ++m) batch.push_back(batcher.MakeMicroBatch(k, m));
    const auto update_start = std::chrono::steady_clock::now();
    const RunnerStats base_before = runner->stats();
    Result<StepStats> st = trainer->Step(batch);
    base_last_step = runner->stats().base_bytes_from_drive - base_before.base_bytes_from_drive;
    base_warm = after_step;
    after_step = true;
    if (!st.ok()) return st.status().WithContext("step " + std::to_string(k));
    measured.step_seconds.push_back(seconds_since(update_start));
    if (!std::isfinite(st->loss)) {
      progress.Finish();
      return Status::FailedPrecondition("the loss became " + std::to_string(st->loss) +
                                        " at step " + std::to_string(k) +
                                        "; lower --lr or keep --grad-clip on");
    }
    const double step_s = seconds_since(step_start);
    const double elapsed = seconds_since(train_start);
    tokens_total += st->tokens;
    last_loss = st->loss;
    nlohmann::json line = {{"step", k + 1},
                           {"loss", st->loss},
                           {"lr", st->lr},
                           {"grad_norm", st->grad_norm},
                           {"tokens_per_s", double(st->tokens) / step_s},
                           {"elapsed_s", elapsed}};
    if (F16Storage(job)) {  // f32 and bf16 lines stay as they were
      line["loss_scale"] = st->loss_scale;
      line["skipped"] = st->skipped;
    }
    if (job.eval_every > 0 && ((k + 1) % job.eval_every == 0 || k + 1 == job.steps)) {
      // A pipeline evaluates the master weights: the step's updates first (a synchronization
      // point for stale updates, as a checkpoint is).
      FERRY_RETURN_IF_ERROR(trainer->FinishUpdates());
      after_step = false;  // the evaluation leaves other weights in the devices' slots
      Result<EvalResult> val =
          EvaluateRows(*runner, *data->validation(), shape.batch, job.eval_batches);
      if (!val.ok()) return val.status().WithContext("validation after step " + std::to_string(k));
      line["val_loss"] = val->mean_loss();
    }
    // A line lands whole or not at all; the checkpoints keep what came before.
    FERRY_RETURN_IF_ERROR(metrics->Append(line.dump() + "\n").WithContext("metrics"));
    meta.metrics += line.dump() + "\n";
    progress.Report({.step = k + 1,
                     .total = job.steps,
                     .loss = st->loss,
                     .tokens_per_s = double(tokens_total) / elapsed,
                     .elapsed_s = elapsed});
    // After the last update the run ends normally (final checkpoint and weights) whatever comes.
    const bool last = k + 1 == job.steps;
    const int stop = !last && control.stop_requested ? control.stop_requested() : 0;
    if (stop != 0 || (!last && job.save_every > 0 && (k + 1) % job.save_every == 0)) {
      FERRY_ASSIGN_OR_RETURN(std::string saved, save_checkpoint(elapsed));
      if (stop != 0) {
        progress.Finish();
        FERRY_RETURN_IF_ERROR(report());
        return Status::Cancelled("stopped by signal " + std::to_string(stop) + " after step " +
                                 std::to_string(k + 1) + "; saved " + saved +
                                 "; continue with: ferry train --resume " + job.out);
      }
    }
  }
  progress.Finish();
  FERRY_RETURN_IF_ERROR(report());
  FERRY_RETURN_IF_ERROR(save_checkpoint(seconds_since(train_start)).status());  // finishes updates
  // A folder's frozen base stays where it is (the adapter loads onto it); its tokenizer is copied.
  // The seeded base goes with the adapter; converted to NVMe it was rounded to the compute dtype,
  // so it is seeded again (it never trains), with the trained adapters over it.
  if (job.model == "tiny" && base_copy_bytes > 0) {
    FERRY_ASSIGN_OR_RETURN(HostTensors seeded,
                           InitialWeights(job.model, model, trainer->layers(), job.seed));
    for (const ParamSpec* p : StorageParams(trainer->layers())) {
      if (p->trainable) seeded.tensors[p->name] = trainer->weights().tensors.at(p->name);
    }
    FERRY_RETURN_IF_ERROR(WriteFinalWeights(job.out, model, job.lora, trainer->layers(), seeded,
                                            /*with_base=*/true));
  } else {
    // A folder's run keeps the source's own config.json (its token ids, fields ferry does not
    // model), its dtype set to the f32 written.
    FERRY_RETURN_IF_ERROR(WriteFinalWeights(
        job.out, model, job.lora, trainer->layers(), trainer->weights(),
        /*with_base=*/job.model == "tiny", job.model == "tiny" ? "" : job.model + "/config.json"));
  }
  if (job.model != "tiny") FERRY_RETURN_IF_ERROR(CopyTokenizerFiles(job.model, job.out));
  const LossScalerState scaler_final = trainer->loss_scaler_state();  // trainer may go below
  if (devices.optimizer_folder.held()) {
    // The final checkpoint holds the state; a resume rebuilds the store from it. (A failed or
    // stopped run leaves the store until the next run of the job clears it, before planning.)
    trainer.reset();  // closes the store's files
    devices.optimizer_folder.RemoveFolder();
  }
  std::string scaling;
  if (F16Storage(job)) {  // over the whole run, resumed parts included (checkpointed)
    char buf[160];
    std::snprintf(buf, sizeof buf, "; f16 loss scale %.17g at the end, %lld of %lld steps skipped",
                  scaler_final.scale, (long long)scaler_final.skipped_steps, (long long)job.steps);
    scaling = buf;
  }
  std::fprintf(stderr, "ferry train: done in %s, final loss %.4f%s; wrote %s/%s\n",
               FormatDuration(seconds_since(start)).c_str(), last_loss, scaling.c_str(),
               job.out.c_str(),
               job.lora.enabled() ? "adapter_model.safetensors" : "model.safetensors");
  if (job.lora.enabled()) {
    std::fprintf(stderr,
                 "ferry train: `ferry merge --model %s --out DIR` writes the adapter merged into "
                 "its base as one model folder\n",
                 job.out.c_str());
  }
  return Status::Ok();
}

}  // namespace ferry
