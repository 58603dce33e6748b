// Training throughput of the whole stack as `ferry train` runs it (Trainer + the planned pipeline
// on one CpuDevice, engine/train/training_runner.h), beside the reference runner, the
// single-device path it replaced (engine/testing/reference_runner.h) (--path both, the default; or
// --path executor | runner): tokens/s, model FLOP/s of the forward + backward (summed from the
// layers' own ComputeLayerCost reports, no recomputation, over the runner's time alone: the
// optimizer's share is printed apart) and peak RSS, next to the machine's fp32 GEMM rate measured
// in the same run (a large square product through the GEMM op on a CpuDevice with the same
// threads), so the figure reads as a fraction of this machine's ceiling. Each model runs twice: in
// fp32 (the exact reference path) against that ceiling, then in bf16
// (ReferenceRunnerOptions::compute_dtype: bf16 weights and activations, bf16 GEMMs on oneDNN where
// the CPU has them, kernels/cpu/onednn.h) against the bf16-input GEMM rate measured the same way.
// Every figure is a median with its min and max.
//
// Models: a GPT-2-124M-shaped model at B=4, T=64 and a ~100M-parameter Llama-shaped model at B=4,
// T=256, fresh weights, the built-in text; one warm-up update, then --steps (default 5) timed
// updates.
//
// Usage: train_bench [--threads T] [--steps N] [--only gpt2|llama] [--dtype f32|bf16]
//                    [--path both|executor|runner]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/spread.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_runner.h"
#include "engine/testing/reference_runner.h"
#include "engine/train/dataset.h"
#include "engine/train/run_training.h"
#include "engine/train/trainer.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/onednn.h"
#include "kernels/ops/gemm.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Check;
using bench::GemmRates;
using bench::Llama100M;
using bench::Spread;
using bench::SpreadOf;

double PeakRssMiB() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

ModelConfig Gpt2Small() {
  ModelConfig c;
  c.architecture = "GPT2LMHeadModel";
  c.model_type = "gpt2";
  c.family = ModelFamily::kGpt2;
  c.vocab_size = 50257;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.num_layers = 12;
  c.num_heads = c.num_kv_heads = 12;
  c.head_dim = 64;
  c.max_position_embeddings = 1024;
  c.norm = NormKind::kLayerNorm;
  c.activation = Activation::kGeluTanh;
  c.tie_word_embeddings = true;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.learned_positions = true;
  return c;
}

// `dtype`: the runner's compute dtype (f32, or bf16 judged against the bf16 GEMM rate `gemm`).
// `executor`: `ferry train`'s path (the planned pipeline on one device), else the reference runner.
void BenchModel(const char* label, const ModelConfig& model, BatchShape shape, int threads,
                int steps, DType dtype, const Spread& gemm, bool executor) {
  Check(ValidateModelConfig(model), label);
  const LoraConfig lora;
  JobSpec job;
  job.model = label;
  job.batch_size = shape.batch;
  job.micro_batches = 1;
  job.seq_len = shape.seq_len;
  job.dtype = std::string(DTypeName(dtype));
  job.lora = lora;
  TrainingRunner devices;  // the executor's devices and runner
  std::unique_ptr<CpuDevice> dev;
  std::unique_ptr<ModelRunner> own;
  ModelRunner* runner = nullptr;
  if (executor) {
    auto t = CreateTrainingRunner(job, model, threads);
    Check(t.status(), "training runner");
    devices = std::move(*t);
    runner = devices.runner.get();
    std::printf("%s %s executor: %s\n", label, DTypeName(dtype).data(), devices.summary.c_str());
  } else {
    ReferenceRunnerOptions options;
    options.shape = shape;
    options.compute_dtype = dtype;
    // A cap, not a reservation: the arena is mapped, and its pages are touched only as the
    // runner allocates (the peak RSS printed is what it took).
    auto d = CpuDevice::Create(
        {.name = "cpu0", .memory_bytes = size_t(16) << 30, .compute_threads = threads});
    Check(d.status(), "device");
    dev = std::move(*d);
    auto r = CreateReferenceRunner(*dev, model, lora, options);
    Check(r.status(), "runner");
    own = std::move(*r);
    runner = own.get();
  }
  std::vector<LayerSpec> layers = BuildLayerSpecs(model, lora);
  double flops_per_step = 0;
  for (const LayerSpec& l : layers) {
    const LayerCost c = ComputeLayerCost(model, lora, l, shape);
    flops_per_step += c.forward_flops + c.backward_flops;
  }
  const int64_t params = CountParameters(layers);
  ThreadPool pool(threads);
  HostTensors w = InitMasterWeights(layers, 1);
  OptimizerOptions opt;
  opt.schedule = {.lr = 1e-4, .warmup_steps = 0, .total_steps = 100, .min_ratio = 0};
  opt.weight_decay = 0.1;
  opt.grad_clip = 1.0;
  auto trainer = Trainer::Create(runner, std::move(layers), std::move(w), opt, &pool);
  Check(trainer.status(), "trainer");
  const TokenStream stream = TokenStream::Builtin();
  auto batcher = Batcher::Create(&stream, shape.batch, shape.seq_len, 1);
  Check(batcher.status(), "batcher");
  std::vector<double> step_s, compute_s, optimizer_s, gflops;
  double loss = 0;
  for (int k = 0; k <= steps; ++k) {
    const std::vector<MicroBatch> batch = {batcher->MakeMicroBatch(k, 0)};
    const auto t0 = Clock::now();
    auto st = (*trainer)->Step(batch);
    Check(st.status(), "step");
    if (k > 0) {  // the first update warms up
      step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      compute_s.push_back(st->compute_seconds);
      optimizer_s.push_back(st->optimizer_seconds);
      // Model FLOP/s over the forward + backward alone (the optimizer is host work the executor
      // overlaps with backward; it is reported apart).
      gflops.push_back(flops_per_step / st->compute_seconds * 1e-9);
    }
    loss = st->loss;
  }
  const Spread step = SpreadOf(step_s), fwd_bwd = SpreadOf(compute_s),
               optim = SpreadOf(optimizer_s), rate = SpreadOf(gflops);
  std::printf(
      "%-12s %s %s %6.1fM params  B=%lld T=%lld  %d steps, median (min-max):\n"
      "  step %.2f s (%.2f-%.2f): fwd+bwd %.2f s (%.2f-%.2f), optimizer %.2f s (%.2f-%.2f); "
      "%.0f tok/s\n"
      "  fwd+bwd %.1f GFLOP/s (%.1f-%.1f) = %.0f%% of the %s GEMM median (%.0f-%.0f%% of "
      "its min-max)  loss %.3f  peak RSS %.0f MiB\n",
      label, DTypeName(dtype).data(), executor ? "executor" : "reference runner",
      double(params) / 1e6, (long long)shape.batch, (long long)shape.seq_len, steps, step.median,
      step.min, step.max, fwd_bwd.median, fwd_bwd.min, fwd_bwd.max, optim.median, optim.min,
      optim.max, double(shape.tokens()) / step.median, rate.median, rate.min, rate.max,
      100 * rate.median / gemm.median, dtype == DType::kF32 ? "fp32" : "bf16",
      100 * rate.median / gemm.max, 100 * rate.median / gemm.min, loss, PeakRssMiB());
  std::fflush(stdout);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  int threads = 2, steps = 5;
  std::string only, only_dtype, path = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (k == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (k == "--only") {
      only = v;
    } else if (k == "--dtype") {
      only_dtype = v;
    } else if (k == "--path" && (v == "both" || v == "executor" || v == "runner")) {
      path = v;
    } else {
      std::fprintf(stderr,
                   "usage: train_bench [--threads T] [--steps N] [--only gpt2|llama] "
                   "[--dtype f32|bf16] [--path both|executor|runner]\n");
      return 2;
    }
  }
  if (threads < 1 || steps < 1) {
    std::fprintf(stderr, "train_bench: --threads and --steps must be >= 1\n");
    return 2;
  }
  // The ceilings: 2048^3 products through the GEMM op on a CpuDevice with the same threads.
  const ferry::bench::Spread gemm =
      ferry::bench::SpreadOf(ferry::GemmRates(threads, 2048, ferry::DType::kF32, 5));
  const ferry::bench::Spread bf16 =
      ferry::bench::SpreadOf(ferry::GemmRates(threads, 2048, ferry::DType::kBF16, 5));
  std::printf("%s\n%s\n", ferry::cpu::Blas().Describe().c_str(),
              ferry::cpu::Bf16GemmPathDescription().c_str());
  std::printf(
      "GEMM 2048^3 on a CpuDevice, %d threads, 5 runs, median (min-max): fp32 %.1f GFLOP/s "
      "(%.1f-%.1f), the ceiling; bf16 inputs %.1f (%.1f-%.1f)\n",
      threads, gemm.median, gemm.min, gemm.max, bf16.median, bf16.min, bf16.max);
  // fp32 (the exact reference path) against the fp32 ceiling, then bf16 against the bf16 one.
  for (const auto& [dtype, ceiling] :
       {std::pair{ferry::DType::kF32, gemm}, std::pair{ferry::DType::kBF16, bf16}}) {
    if (!only_dtype.empty() && only_dtype != ferry::DTypeName(dtype)) continue;
    // Each model on the two paths back to back, so they share the machine's state.
    for (const bool gpt2 : {true, false}) {
      if (!only.empty() && only != (gpt2 ? "gpt2" : "llama")) continue;
      for (const bool executor : {true, false}) {
        if (path != "both" && executor != (path == "executor")) continue;
        if (gpt2) {
          ferry::BenchModel("gpt2-124M", ferry::Gpt2Small(), {4, 64}, threads, steps, dtype,
                            ceiling, executor);
        } else {
          ferry::BenchModel("llama-100M", ferry::bench::Llama100M(), {4, 256}, threads, steps,
                            dtype, ceiling, executor);
        }
      }
    }
  }
  return 0;
}
