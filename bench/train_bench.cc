// Training throughput of the whole stack (Trainer + ModelRunner on a CpuDevice): tokens/s, model
// FLOP/s of the forward + backward (summed from the layers' own ComputeLayerCost reports, no
// recomputation, over the runner's time alone: the optimizer's share is printed apart) and peak
// RSS, next to the machine's fp32 GEMM rate measured in the same run (a
// large square product through the GEMM op on a CpuDevice with the same threads), so the figure
// reads as a fraction of this machine's ceiling.
//
// Models: a GPT-2-124M-shaped model at B=4, T=64 and a ~100M-parameter Llama-shaped model at B=4,
// T=256, fresh weights, the built-in text; one warm-up update, then --steps timed updates.
//
// Usage: train_bench [--threads T] [--steps N] [--only gpt2|llama]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/master_weights.h"
#include "engine/model/model_runner.h"
#include "engine/train/dataset.h"
#include "engine/train/run_training.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/gemm.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "train_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double PeakRssMiB() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Best-of-3 fp32 GEMM rate (GFLOP/s) of an n x n x n product through the op on a CpuDevice.
double GemmRate(int threads, int64_t n) {
  auto dev = CpuDevice::Create({.name = "gemm",
                                .memory_bytes = size_t(3 * n * n) * 4 + (1 << 20),
                                .compute_threads = threads});
  Check(dev.status(), "gemm device");
  std::vector<DeviceBuffer> bufs;
  for (const char* what : {"a", "b", "c"}) {
    auto b = (*dev)->Allocate(size_t(n * n) * 4, what);
    Check(b.status(), what);
    Check((*dev)->Zero(b->data(), size_t(n * n) * 4), "zero");
    bufs.push_back(std::move(*b));
  }
  const GemmArgs g{.a = bufs[0].View(DType::kF32, {n, n}),
                   .b = bufs[1].View(DType::kF32, {n, n}),
                   .c = bufs[2].View(DType::kF32, {n, n})};
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const auto t0 = Clock::now();
    Check(Gemm(**dev, g), "gemm");
    Check((*dev)->Synchronize(), "gemm");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);  // the first run warms up
  }
  return 2.0 * double(n) * double(n) * double(n) / best * 1e-9;
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

// ~100M parameters: 8 blocks of width 768 (GQA 12/4 heads, SwiGLU 2048), 32000 vocabulary, untied
// head.
ModelConfig Llama100M() {
  ModelConfig c = TinyLlamaPreset();
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_layers = 8;
  c.num_heads = 12;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = false;
  return c;
}

void BenchModel(const char* label, const ModelConfig& model, BatchShape shape, int threads,
                int steps, double gemm_gflops) {
  Check(ValidateModelConfig(model), label);
  const LoraConfig lora;
  ModelRunnerOptions options;
  options.shape = shape;
  auto dev = CpuDevice::Create(
      {.name = "cpu0",
       .memory_bytes = EstimateDeviceBytes(model, lora, shape, options.loss_chunk_tokens, threads),
       .compute_threads = threads});
  Check(dev.status(), "device");
  auto runner = ModelRunner::Create(**dev, model, lora, options);
  Check(runner.status(), "runner");
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
  auto trainer = Trainer::Create(runner->get(), std::move(layers), std::move(w), opt, &pool);
  Check(trainer.status(), "trainer");
  const TokenStream stream = TokenStream::Builtin();
  auto batcher = Batcher::Create(&stream, shape.batch, shape.seq_len, 1);
  Check(batcher.status(), "batcher");
  double seconds = 0, compute = 0, optimizer = 0, loss = 0;
  for (int k = 0; k <= steps; ++k) {
    const std::vector<MicroBatch> batch = {batcher->MakeMicroBatch(k, 0)};
    const auto t0 = Clock::now();
    auto st = (*trainer)->Step(batch);
    Check(st.status(), "step");
    if (k > 0) {
      seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      compute += st->compute_seconds;
      optimizer += st->optimizer_seconds;
    }
    loss = st->loss;
  }
  const double tokens_per_s = double(shape.tokens()) * steps / seconds;
  // Model FLOP/s over the forward + backward alone (the optimizer is host work the executor
  // overlaps with backward; it is reported apart).
  const double model_gflops = flops_per_step * steps / compute * 1e-9;
  std::printf(
      "%-12s %6.1fM params  B=%lld T=%lld  %7.2f s/step (fwd+bwd %.2f, optimizer %.2f)  "
      "%8.0f tok/s  fwd+bwd %7.1f GFLOP/s (%4.0f%% of GEMM)  loss %.3f  peak RSS %.0f MiB\n",
      label, double(params) / 1e6, (long long)shape.batch, (long long)shape.seq_len,
      seconds / steps, compute / steps, optimizer / steps, tokens_per_s, model_gflops,
      100 * model_gflops / gemm_gflops, loss, PeakRssMiB());
  std::fflush(stdout);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  int threads = 2, steps = 2;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (k == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (k == "--only") {
      only = v;
    } else {
      std::fprintf(stderr, "usage: train_bench [--threads T] [--steps N] [--only gpt2|llama]\n");
      return 2;
    }
  }
  if (threads < 1 || steps < 1) {
    std::fprintf(stderr, "train_bench: --threads and --steps must be >= 1\n");
    return 2;
  }
  const double gemm = ferry::GemmRate(threads, 2048);
  std::printf(
      "fp32 GEMM 2048^3 on a CpuDevice, %d threads: %.1f GFLOP/s (the "
      "ceiling)\n",
      threads, gemm);
  if (only.empty() || only == "gpt2") {
    ferry::BenchModel("gpt2-124M", ferry::Gpt2Small(), {4, 64}, threads, steps, gemm);
  }
  if (only.empty() || only == "llama") {
    ferry::BenchModel("llama-100M", ferry::Llama100M(), {4, 256}, threads, steps, gemm);
  }
  return 0;
}
