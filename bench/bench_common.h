// What several benchmarks share: failing loudly, the GEMM ceiling, the models they run.
#pragma once

#include <errno.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/model/model_config.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/gemm.h"
#include "kernels/status.h"

namespace ferry::bench {

// Exits with the program's name, `what` and the error when `s` is one.
inline void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, s.ToString().c_str());
    std::exit(1);
  }
}

// GEMM rates (GFLOP/s) of an n x n x n product through the op on a CpuDevice, A and B stored in
// `dtype` and C in f32: one warm-up run, then `reps` timed runs.
inline std::vector<double> GemmRates(int threads, int64_t n, DType dtype, int reps) {
  const size_t in_bytes = size_t(n * n) * DTypeSize(dtype), out_bytes = size_t(n * n) * 4;
  const size_t scratch_bytes =
      GemmScratchBytes(OpTarget{DeviceKind::kCpu, threads}, n, n, n, {dtype, dtype, DType::kF32});
  auto dev =
      CpuDevice::Create({.name = "gemm",
                         .memory_bytes = 2 * in_bytes + out_bytes + scratch_bytes + (1 << 20),
                         .compute_threads = threads});
  Check(dev.status(), "gemm device");
  std::vector<DeviceBuffer> bufs;
  for (auto [what, bytes] : {std::pair{"a", in_bytes},
                             {"b", in_bytes},
                             {"c", out_bytes},
                             {"scratch", std::max<size_t>(scratch_bytes, 64)}}) {
    auto b = (*dev)->Allocate(bytes, what);
    Check(b.status(), what);
    Check((*dev)->Zero(b->data(), bytes), "zero");
    bufs.push_back(std::move(*b));
  }
  const GemmArgs g{.a = bufs[0].View(dtype, {n, n}),
                   .b = bufs[1].View(dtype, {n, n}),
                   .c = bufs[2].View(DType::kF32, {n, n}),
                   .scratch = bufs[3].View(DType::kF32, {int64_t(bufs[3].bytes() / 4)})};
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Check(Gemm(**dev, g), "gemm");
    Check((*dev)->Synchronize(), "gemm");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * double(n) * double(n) * double(n) / s * 1e-9);
  }
  return rates;
}

// ~100M parameters: 8 blocks of width 768 (GQA 12/4 heads, SwiGLU 2048), 32000 vocabulary, untied
// head.
inline ModelConfig Llama100M() {
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

}  // namespace ferry::bench
