// executor_bench: does the pipeline executor overlap what it can? A ~100M-parameter Llama-shaped
// LoRA job (rank 16 on every projection, so the host optimizer is small and does not fight the
// devices for the cores) runs on CPU devices of one thread each, traced (engine/exec/
// trace_recorder.h). Per timed step it reads, from the streams' own timestamps, each device's
// busy time per lane (compute, host->device, device->host) and the host optimizer's, and prints
//   - the measured step against the bound max(busiest lane) (target <= 1.15: everything that can
//     overlap does),
//   - against the sum of every lane of every device (what a serial executor would take: no
//     device runs beside another, no copy beside compute),
//   - against the planner's prediction for the same plan on a profile whose rates are this run's:
//     every layer's forward and backward time probed on a 1-thread CPU device first (the layer
//     probe of `ferry probe --model`), the throttled link's rate.
// Runs: 2 devices with the link throttled so that one device's uploads take about as long as its
// compute (rate chosen from an unthrottled run, then again from a first throttled run, whose plan
// recomputes more, until a run's own uploads and compute agree within 20%, else the tried rate
// that came closest; when the throttled plan keeps its activations on the devices, the same link
// again with a plan that does not), the same link with one-step-stale updates, 2 devices
// unthrottled, 1 device unthrottled. 16 micro-batches by default: the pipeline's fill and drain,
// which no overlap removes (the simulator counts them), are a smaller share of a step than with 4.
// Each figure is a median with its min and max over the timed steps, next to the 1-thread fp32 GEMM
// ceiling measured in the same run. Then QLoRA (issue 18): 2 devices with the link throttled, bf16
// compute, the frozen base streamed in bf16 against NF4 by one plan (a stage per block): bytes
// uploaded and step time. Activations on NVMe: 2 devices unthrottled, the same plan with its saved
// activations in an NVMe store under --nvme-dir (default: the current directory; when the planner
// keeps them on the devices, the plan that does not), against the host-RAM run: step time, bytes
// per step each way, and the disk time they take at the store's own sequential rates measured in
// the same run (offload/store_rate.h).
//
// Usage: executor_bench [--steps N] [--seq-len T] [--micro-batches M] [--nvme-dir DIR]
//                       [--link MB/s] [--qlora-only | --throttled-only] [--trace FILE]
// --link: the throttled runs' link rate, not chosen from this run's (to compare builds at one
// rate; the QLoRA runs choose their own still). --throttled-only: the 2-device throttled run
// and its stale-update twin alone. --trace: that run's Chrome trace (as `ferry train --trace`)
// written to FILE, its twin's to FILE.stale.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/spread.h"
#include "engine/exec/pipeline_runner.h"
#include "engine/exec/trace_recorder.h"
#include "engine/model/master_weights.h"
#include "engine/plan/planner.h"
#include "engine/probe/layer_probe.h"
#include "engine/train/dataset.h"
#include "engine/train/run_training.h"
#include "engine/train/trainer.h"
#include "engine/train/training_runner.h"
#include "offload/file_io.h"
#include "offload/store_rate.h"

namespace ferry {
namespace {

using bench::Check;
using bench::Spread;
using bench::SpreadOf;
using Clock = std::chrono::steady_clock;

struct Options {
  int steps = 4;
  int64_t seq_len = 128;
  int64_t micro_batches = 16;
  DType dtype = DType::kF32;    // compute
  bool qlora_only = false;      // skip the overlap runs
  bool throttled_only = false;  // the 2-device throttled runs alone
  std::string trace;            // where the throttled run's trace goes (empty: nowhere)
  bool stale = false;           // one-step-stale updates (planned and run)
  std::string nvme_dir = ".";   // where the activations-on-NVMe run keeps its store
  double link = 0;              // bytes/s of the throttled runs' link (0: chosen from this run)
};

// One step's lanes, from the trace: seconds busy per device and lane, and the host optimizer's.
struct StepLanes {
  std::vector<double> compute, upload, download;
  double optimizer = 0;
  std::vector<double> uploaded_bytes;
  double weight_bytes = 0;  // all devices: the stages' weights (not the activations)
  double Bound() const {
    double b = optimizer;
    for (size_t d = 0; d < compute.size(); ++d) {
      b = std::max({b, compute[d], upload[d], download[d]});
    }
    return b;
  }
  double Serial() const {
    double s = optimizer;
    for (size_t d = 0; d < compute.size(); ++d) s += compute[d] + upload[d] + download[d];
    return s;
  }
};

StepLanes LanesOf(const std::vector<exec::TraceSpan>& spans, int devices, int64_t step) {
  StepLanes l;
  l.compute.assign(size_t(devices), 0);
  l.upload.assign(size_t(devices), 0);
  l.download.assign(size_t(devices), 0);
  l.uploaded_bytes.assign(size_t(devices), 0);
  for (const exec::TraceSpan& s : spans) {
    if (s.step != step) continue;
    const double d = s.end_s - s.start_s;
    const size_t g = size_t(s.lane.gpu);
    switch (s.lane.kind) {
      case plan::LaneKind::kCompute:
        l.compute[g] += d;
        break;
      case plan::LaneKind::kHostToDevice:
        l.upload[g] += d;
        l.uploaded_bytes[g] += s.bytes;
        if (s.kind == plan::TaskKind::kWeightUpload) l.weight_bytes += s.bytes;
        break;
      case plan::LaneKind::kDeviceToHost:
        l.download[g] += d;
        break;
      case plan::LaneKind::kCpuOptimizer:
        l.optimizer += d;
        break;
      default:
        break;
    }
  }
  return l;
}

// Untimed steps first: the first maps the host mirrors; in the second a LoRA job's frozen base
// moves to the weight slots it then keeps (plan::StageRoundRobin: a step starts where the last
// one ended), uploading several times a steady step's bytes.
constexpr int kWarmUpSteps = 2;

struct RunResult {
  std::vector<double> step_s, bound_s, serial_s, compute_s, upload_s, uploaded_bytes, weight_bytes;
  std::vector<double> nvme_written, nvme_read;  // activations on NVMe: disk bytes per step
  double predicted_s = 0;
  int stages = 0;
  std::string policy;      // the plan's activation policy
  uint64_t gpu_bytes = 0;  // the plan's arena per device
  // The least device memory any candidate that keeps activations takes (0: none was weighed).
  uint64_t least_kept_bytes = 0;
  plan::Plan plan;  // the plan it ran
};

plan::PlanJob JobOf(const LoraConfig& lora, const Options& o) {
  plan::PlanJob pj;
  pj.global_batch = o.micro_batches;
  pj.seq_len = o.seq_len;
  pj.micro_batches = o.micro_batches;
  pj.lora = lora;
  pj.compute_dtype = o.dtype;
  pj.scratch = {.cuda = false, .cpu_threads = 1};
  pj.stale_updates = o.stale;
  return pj;
}

// Every layer time the planner looks up for `devices` devices, measured on a 1-thread CPU device.
std::vector<LayerProbeEntry> ProbeLayers(const ModelConfig& model, const plan::PlanJob& job,
                                         int devices) {
  auto entries = ProbeLayerTimes(
      model, job, devices,
      [](size_t bytes) -> Result<std::unique_ptr<Device>> {
        FERRY_ASSIGN_OR_RETURN(
            std::unique_ptr<CpuDevice> d,
            CpuDevice::Create({.name = "probe", .memory_bytes = bytes, .compute_threads = 1}));
        return std::unique_ptr<Device>(std::move(d));
      },
      {});
  Check(entries.status(), "layer probe");
  return std::move(*entries);
}

// `link`: bytes/s of each device's links (0: unthrottled); `times`: the layers' measured times;
// `nvme_dir` non-empty: the plan's saved activations go to an NVMe store there (removed after).
// `gpu_cap` > 0: the profile's device memory, so that plans needing more are out.
// `like` non-null: run that plan's stages, the tail's parts, gradient accumulators, micro-batches,
// recomputation, activation policy, kept activations and activation tier (sized and priced again
// for this job: plan::PricePlan), not the planner's own choice.
// `trace_file` non-empty: the run's Chrome trace is written there.
RunResult Run(const ModelConfig& model, const LoraConfig& lora, const Options& o, int devices,
              double link, const std::vector<LayerProbeEntry>& times,
              const std::string& nvme_dir = "", uint64_t gpu_cap = 0,
              const plan::Plan* like = nullptr, const std::string& trace_file = "") {
  const BatchShape shape{1, o.seq_len};
  const plan::PlanJob pj = JobOf(lora, o);
  // The profile carries this run's rates, so the planner's prediction is for this machine.
  JobSpec job;  // the same job as `pj`, to size the whole model as one stage
  job.batch_size = job.micro_batches = o.micro_batches;
  job.seq_len = o.seq_len;
  job.lora = lora;
  job.dtype = std::string(DTypeName(o.dtype));
  const size_t one_device = WholeModelBytes(job, model, /*threads=*/1);
  plan::HardwareProfile hw = CpuDevicesProfile(devices, one_device);
  MergeLayerTimes(times, hw);
  if (link > 0) hw.pcie.h2d_pinned = hw.pcie.d2h_pinned = link;
  if (gpu_cap > 0) hw.gpu.memory_usable_bytes = gpu_cap;
  auto outcome = plan::MakePlan("llama-100M", model, pj, hw, /*suggest=*/false);
  Check(outcome.status(), "plan");
  if (!outcome->feasible) Check(Status::Internal(outcome->binding), "plan");
  plan::Plan p = outcome->plan;
  RunResult r;
  for (const plan::PlanCandidate& c : outcome->candidates) {
    if (c.policy == "keep" && (r.least_kept_bytes == 0 || c.gpu_bytes < r.least_kept_bytes)) {
      r.least_kept_bytes = c.gpu_bytes;
    }
  }
  if (like != nullptr) {
    p.stages = like->stages;
    p.tail_parts = like->tail_parts;
    p.grad_accumulators = like->grad_accumulators;
    p.recompute = like->recompute;
    p.micro_batches = like->micro_batches;
    p.micro_batch_size = like->micro_batch_size;
    p.activation_policy = like->activation_policy;
    p.keep_activations = like->keep_activations;
    p.activations = like->activations;
    p.memory = plan::ComputeMemory(plan::MemoryInputOf(model, p));
    Check(plan::PricePlan(model, hw, p), "price the pinned plan");
  }
  ScratchStore store;
  if (!nvme_dir.empty()) {
    p.activations = Tier::kNvme;
    p.memory = plan::ComputeMemory(plan::MemoryInputOf(model, p));
    NvmeStoreOptions so = exec::ActivationStoreOptions(p, nvme_dir + "/executor_bench.activations");
    so.log = [](std::string_view) {};
    auto s = OpenScratchStore(std::move(so));
    Check(s.status(), "NVMe store");
    store = std::move(*s);
  }
  std::vector<std::unique_ptr<CpuDevice>> owned;
  std::vector<Device*> raw;
  for (int i = 0; i < devices; ++i) {
    auto d = CpuDevice::Create({.name = "cpu" + std::to_string(i),
                                .memory_bytes = p.memory.gpu.total(),
                                .compute_threads = 1,
                                .upload_bytes_per_s = link,
                                .download_bytes_per_s = link});
    Check(d.status(), "device");
    raw.push_back(d->get());
    owned.push_back(std::move(*d));
  }
  exec::TraceRecorder trace(p, o.steps + kWarmUpSteps);
  auto runner = exec::CreatePipelineRunner(raw, model, p, &trace, store.get());
  Check(runner.status(), "pipeline");
  std::vector<LayerSpec> layers = BuildLayerSpecs(model, lora);
  ThreadPool pool(1);
  OptimizerOptions opt;
  opt.schedule = {.lr = 1e-4, .warmup_steps = 0, .total_steps = 100, .min_ratio = 0};
  opt.grad_clip = 1.0;
  opt.stale_updates = o.stale;
  HostTensors weights = InitMasterWeights(layers, 1);
  Check(QuantizeFrozenBase(layers, weights), "quantize");  // QLoRA: the base in NF4
  auto trainer = Trainer::Create(runner->get(), layers, std::move(weights), opt, &pool);
  Check(trainer.status(), "trainer");
  (*trainer)->set_trace(&trace);
  const TokenStream stream = TokenStream::Builtin();
  auto batcher = Batcher::Create(&stream, shape.batch, shape.seq_len, 1);
  Check(batcher.status(), "batcher");
  r.predicted_s = p.step_s;
  r.stages = int(p.stages.size());
  r.policy = p.activation_policy;
  r.gpu_bytes = p.memory.gpu.total();
  r.plan = p;
  for (int k = 0; k < o.steps + kWarmUpSteps; ++k) {
    std::vector<MicroBatch> batch;
    for (int64_t m = 0; m < o.micro_batches; ++m) batch.push_back(batcher->MakeMicroBatch(k, m));
    const StoreStats io0 = store ? store->stats() : StoreStats{};
    const auto t0 = Clock::now();
    Check((*trainer)->Step(batch).status(), "step");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (k < kWarmUpSteps) continue;
    if (store) {
      const StoreStats io1 = store->stats();
      r.nvme_written.push_back(double(io1.disk_bytes_written - io0.disk_bytes_written));
      r.nvme_read.push_back(double(io1.disk_bytes_read - io0.disk_bytes_read));
    }
    const StepLanes l = LanesOf(trace.spans(), devices, k);
    r.step_s.push_back(s);
    r.bound_s.push_back(l.Bound());
    r.serial_s.push_back(l.Serial());
    r.compute_s.push_back(*std::max_element(l.compute.begin(), l.compute.end()));
    r.upload_s.push_back(*std::max_element(l.upload.begin(), l.upload.end()));
    r.uploaded_bytes.push_back(*std::max_element(l.uploaded_bytes.begin(), l.uploaded_bytes.end()));
    r.weight_bytes.push_back(l.weight_bytes);
  }
  if (!trace_file.empty()) Check(WriteTextFile(trace_file, trace.ChromeTraceJson()), "trace");
  return r;
}

// `o` with one timed step: a short run (the throttle's rate, a plan to pin).
Options OneStep(Options o) {
  o.steps = 1;
  return o;
}

std::vector<double> Ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size(); ++i) r.push_back(a[i] / b[i]);
  return r;
}

void Print(const char* label, const RunResult& r) {
  const Spread step = SpreadOf(r.step_s), bound = SpreadOf(Ratio(r.step_s, r.bound_s)),
               serial = SpreadOf(Ratio(r.step_s, r.serial_s)), compute = SpreadOf(r.compute_s),
               upload = SpreadOf(r.upload_s);
  std::printf(
      "%-26s %d stage(s), %s  step %.3f s (%.3f-%.3f)  busiest device: compute %.3f s, "
      "uploads %.3f s\n",
      label, r.stages, r.policy.c_str(), step.median, step.min, step.max, compute.median,
      upload.median);
  std::printf(
      "%-26s step / max(lanes) %.2f (%.2f-%.2f)   step / serial sum %.2f (%.2f-%.2f)   "
      "step / predicted (%.3f s) %.2f\n",
      "", bound.median, bound.min, bound.max, serial.median, serial.min, serial.max, r.predicted_s,
      step.median / r.predicted_s);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--qlora-only") {
      o.qlora_only = true;
      continue;
    }
    if (flag == "--throttled-only") {
      o.throttled_only = true;
      continue;
    }
    if (flag == "--trace" && i + 1 < argc) {
      o.trace = argv[++i];
      continue;
    }
    if (flag == "--nvme-dir" && i + 1 < argc) {
      o.nvme_dir = argv[++i];
      continue;
    }
    if (flag == "--link" && i + 1 < argc) {
      o.link = std::atof(argv[++i]) * 1e6;
      if (!(o.link > 0)) {
        std::fprintf(stderr, "executor_bench: --link must be > 0 MB/s\n");
        return 2;
      }
      continue;
    }
    const long long v = i + 1 < argc ? std::atoll(argv[++i]) : 0;
    if (flag == "--steps")
      o.steps = int(v);
    else if (flag == "--seq-len")
      o.seq_len = v;
    else if (flag == "--micro-batches")
      o.micro_batches = v;
    else {
      std::fprintf(stderr,
                   "usage: executor_bench [--steps N] [--seq-len T] [--micro-batches M] "
                   "[--nvme-dir DIR] [--link MB/s] [--qlora-only | --throttled-only] "
                   "[--trace FILE]\n");
      return 2;
    }
  }
  if (o.steps < 1 || o.seq_len < 1 || o.micro_batches < 1) {
    std::fprintf(stderr, "executor_bench: --steps, --seq-len and --micro-batches must be >= 1\n");
    return 2;
  }
  const ferry::bench::Spread gemm =
      ferry::bench::SpreadOf(ferry::bench::GemmRates(1, 1024, ferry::DType::kF32, 5));
  std::printf("ceiling: 1-thread fp32 GEMM 1024^3 %.1f GFLOP/s (%.1f-%.1f)\n", gemm.median,
              gemm.min, gemm.max);
  const ferry::ModelConfig model = ferry::bench::Llama100M();
  ferry::LoraConfig lora;
  lora.rank = 16;
  lora.alpha = 32;
  if (!o.qlora_only) {
    std::printf(
        "job: llama-100M LoRA r16 (all projections), f32, %lld micro-batches of 1 x %lld, "
        "devices of 1 thread, %d timed steps after %d untimed\n",
        (long long)o.micro_batches, (long long)o.seq_len, o.steps, ferry::kWarmUpSteps);
    const ferry::plan::PlanJob job = ferry::JobOf(lora, o);
    const std::vector<ferry::LayerProbeEntry> times2 = ferry::ProbeLayers(model, job, 2);
    // The unthrottled run (skipped when only the throttled one runs, at a given rate).
    const ferry::RunResult two = o.throttled_only && o.link > 0
                                     ? ferry::RunResult{}
                                     : ferry::Run(model, lora, o, 2, 0, times2);
    // The throttle: the busiest device's uploads at this rate take as long as its compute. The
    // planner prices the slower link (it recomputes instead of uploading saved activations), so
    // the throttled plan uploads less and computes more than the unthrottled one: the rate is
    // taken again from a short throttled run (one timed step) until it settles (within 20%, at
    // most four runs), so that the timed plan's own transfer and compute are comparable.
    auto throttle = [](const ferry::RunResult& r) {
      return ferry::plan::MedianOf(r.uploaded_bytes) / ferry::plan::MedianOf(r.compute_s);
    };
    // The planner's choice can swing with the rate (a plan that keeps its activations uploads a
    // fifth of one that does not), so the rate may not settle: then the tried rate whose own run
    // came closest to uploads = compute is timed, never an untried one.
    const ferry::Options quick = ferry::OneStep(o);
    double link = o.link > 0 ? o.link : throttle(two);
    double closest = 0, best_link = link;  // |log(uploads / compute)| of the closest run so far
    for (int run = 0; run < 4 && o.link <= 0; ++run) {
      const double next = throttle(ferry::Run(model, lora, quick, 2, link, times2));
      const double off = std::abs(std::log(next / link));  // uploads / compute = next / link
      if (run == 0 || off < closest) {
        closest = off;
        best_link = link;
      }
      if (next > 0.8 * link && next < 1.25 * link) break;  // settled: this rate's plan fits it
      link = next;
    }
    if (o.link <= 0) link = best_link;
    const ferry::RunResult throttled =
        ferry::Run(model, lora, o, 2, link, times2, "", 0, nullptr, o.trace);
    char label[64];
    std::snprintf(label, sizeof label, "2 devices, link %.1f MB/s", link * 1e-6);
    ferry::Print(label, throttled);
    // One-step-stale updates (#13 item 6), the same link and plan: the next step's first uploads
    // no longer wait for this step's last updates.
    ferry::Options stale = o;
    stale.stale = true;
    const ferry::RunResult stale_run =
        ferry::Run(model, lora, stale, 2, link, times2, "", 0, &throttled.plan,
                   o.trace.empty() ? "" : o.trace + ".stale");
    ferry::Print("  the same, stale updates", stale_run);
    if (o.throttled_only) return 0;
    const std::vector<ferry::LayerProbeEntry> times1 = ferry::ProbeLayers(model, job, 1);
    const ferry::RunResult one = ferry::Run(model, lora, o, 1, 0, times1);
    if (throttled.policy == "keep") {
      // The same link without kept activations (device memory one byte short of the least any
      // candidate that keeps them takes): what keeping them saves.
      const ferry::RunResult via_host =
          ferry::Run(model, lora, o, 2, link, times2, "", throttled.least_kept_bytes - 1);
      if (via_host.policy == "keep")
        ferry::bench::Check(ferry::Status::Internal("still kept"), "not kept");
      ferry::Print("  the same, not kept", via_host);
      std::printf("kept activations: %.2fx the step rate of the plan without them\n",
                  ferry::plan::MedianOf(via_host.step_s) / ferry::plan::MedianOf(throttled.step_s));
    }
    ferry::Print("2 devices, unthrottled", two);
    ferry::Print("1 device, unthrottled", one);
    std::printf("2 devices vs 1 (unthrottled): %.2fx the step rate\n",
                ferry::plan::MedianOf(one.step_s) / ferry::plan::MedianOf(two.step_s));
    // Activations on NVMe: the unthrottled 2-device plan with its saved activations in a store,
    // the disk's own rates measured alongside. A plan that keeps them on the devices has none to
    // store: then the plan without (device memory one byte short of the least any candidate that
    // keeps them takes), in RAM and on NVMe.
    const uint64_t cap = two.policy == "keep" ? two.least_kept_bytes - 1 : 0;
    const ferry::RunResult in_ram =
        cap > 0 ? ferry::Run(model, lora, o, 2, 0, times2, "", cap) : two;
    if (in_ram.policy == "keep")
      ferry::bench::Check(ferry::Status::Internal("still kept"), "in RAM");
    auto rate = ferry::MeasureStoreRate(
        {.directory = o.nvme_dir + "/executor_bench.rate", .log = [](std::string_view) {}},
        size_t(256) << 20);
    ferry::bench::Check(rate.status(), "store rate");
    std::error_code ec;
    std::filesystem::remove_all(o.nvme_dir + "/executor_bench.rate", ec);
    const ferry::RunResult nvme = ferry::Run(model, lora, o, 2, 0, times2, o.nvme_dir, cap);
    std::printf(
        "\nactivations on NVMe (%s, %s, O_DIRECT %s): store write %.2f GB/s, read %.2f GB/s\n",
        o.nvme_dir.c_str(), rate->backend.c_str(), rate->direct_io ? "on" : "off",
        rate->write_bytes_per_s * 1e-9, rate->read_bytes_per_s * 1e-9);
    if (cap > 0) ferry::Print("2 devices, not kept, RAM", in_ram);
    ferry::Print("2 devices, activations NVMe", nvme);
    const double w = ferry::plan::MedianOf(nvme.nvme_written),
                 rd = ferry::plan::MedianOf(nvme.nvme_read);
    const double disk_s = w / rate->write_bytes_per_s + rd / rate->read_bytes_per_s;
    std::printf(
        "NVMe per step: %.1f MB written, %.1f MB read = %.3f s of disk at those rates; step %.3f s "
        "against %.3f s with them in RAM (%.2fx)\n",
        w * 1e-6, rd * 1e-6, disk_s, ferry::plan::MedianOf(nvme.step_s),
        ferry::plan::MedianOf(in_ram.step_s),
        ferry::plan::MedianOf(nvme.step_s) / ferry::plan::MedianOf(in_ram.step_s));
  }

  // Issue 18: the frozen base streamed in bf16 against NF4 (QLoRA), bf16 compute, 2 devices.
  // When a plan's stages fit the devices' weight slots the base stays there from step to step
  // (plan::StageRoundRobin) and nothing streams it, so both runs run one plan that cannot keep
  // it: a stage per block, activations saved to the host (the planner's plan otherwise, sized and
  // priced for each job), so the two differ only in the base's storage. The link is throttled so
  // that the bf16 run's uploads (its base and the saved activations) take about as long as its
  // compute.
  ferry::Options b = o;
  b.dtype = ferry::DType::kBF16;
  ferry::LoraConfig q = lora;
  q.quantize = ferry::BaseQuant::kNf4;
  const std::vector<ferry::LayerProbeEntry> tb =
                                                ferry::ProbeLayers(model, ferry::JobOf(lora, b), 2),
                                            tq = ferry::ProbeLayers(model, ferry::JobOf(q, b), 2);
  ferry::plan::Plan streamed = ferry::Run(model, lora, ferry::OneStep(b), 2, 0, tb).plan;
  streamed.stages.clear();
  for (int li = 1; li <= int(model.num_layers); ++li) streamed.stages.push_back({li, li + 1});
  streamed.recompute.assign(streamed.recompute.size(), false);
  streamed.activation_policy = "save";
  streamed.keep_activations = false;
  streamed.activations = ferry::Tier::kHost;
  const ferry::RunResult free_bf16 = ferry::Run(model, lora, b, 2, 0, tb, "", 0, &streamed);
  const double link16 =
      ferry::plan::MedianOf(free_bf16.uploaded_bytes) / ferry::plan::MedianOf(free_bf16.compute_s);
  const ferry::RunResult base16 = ferry::Run(model, lora, b, 2, link16, tb, "", 0, &streamed);
  const ferry::RunResult base4 = ferry::Run(model, q, b, 2, link16, tq, "", 0, &streamed);
  std::printf(
      "\nQLoRA: bf16 compute, 2 devices, link %.0f MB/s each, one plan for both (a stage per "
      "block, activations saved to the host)\n",
      link16 * 1e-6);
  ferry::Print("bf16 base", base16);
  ferry::Print("NF4 base", base4);
  const double w16 = ferry::plan::MedianOf(base16.weight_bytes),
               w4 = ferry::plan::MedianOf(base4.weight_bytes),
               up16 = ferry::plan::MedianOf(base16.uploaded_bytes),
               up4 = ferry::plan::MedianOf(base4.uploaded_bytes);
  std::printf(
      "weights uploaded per step (all devices): bf16 base %.1f MB, NF4 base %.1f MB (%.2fx less); "
      "everything the busiest device uploads: %.1f MB against %.1f MB; step: NF4 %.2fx the "
      "bf16 base's rate\n",
      w16 * 1e-6, w4 * 1e-6, w16 / w4, up16 * 1e-6, up4 * 1e-6,
      ferry::plan::MedianOf(base16.step_s) / ferry::plan::MedianOf(base4.step_s));
  return 0;
}
