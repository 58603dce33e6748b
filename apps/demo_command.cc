// `ferry demo`: two CPU devices run a two-stage pipeline over micro-batches, exactly as the
// executor will drive GPUs: stage 1 (device 0) computes h = RMSNorm(x W^T), its output travels
// device -> host -> device, stage 2 (device 1) computes the fused LM head + cross-entropy with its
// gradients. Streams and events order everything (cross-device waits included); the loss is then
// checked against the plain reference implementation computed on the host in double precision.
#include "apps/demo_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ref/gemm.h"
#include "kernels/ref/lm_head_loss.h"
#include "kernels/ref/rmsnorm.h"

namespace ferry {
namespace {

struct DemoOptions {
  int micro_batches = 8;
  int tokens = 256;  // per micro-batch
  int hidden = 256;
  int vocab = 2048;
  int threads = 1;  // per device
};

// Host memory the devices copy from and to, carved from one mapping.
class HostArena {
 public:
  static Result<HostArena> Make(size_t bytes) {
    FERRY_ASSIGN_OR_RETURN(HostAllocation a, HostAllocation::Map(bytes, "demo host memory"));
    HostArena h;
    h.mem_ = std::move(a);
    return h;
  }
  HostSpan Take(size_t bytes) {
    HostSpan s = mem_.Span(used_, bytes);
    used_ += (bytes + 255) / 256 * 256;
    return s;
  }

 private:
  HostAllocation mem_;
  size_t used_ = 0;
};

std::vector<float> Random(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Status RunDemo(const DemoOptions& o) {
  const int64_t N = o.tokens, C = o.hidden, V = o.vocab, M = o.micro_batches;
  std::printf(
      "ferry demo: 2 CPU devices, %lld micro-batches of %lld tokens, hidden %lld, "
      "vocab %lld\n",
      (long long)M, (long long)N, (long long)C, (long long)V);
  std::vector<std::unique_ptr<CpuDevice>> dev;
  for (int i = 0; i < 2; ++i) {
    CpuDeviceOptions opt;
    opt.name = "cpu" + std::to_string(i);
    opt.memory_bytes = size_t(64) << 20;
    opt.compute_threads = o.threads;
    FERRY_ASSIGN_OR_RETURN(auto d, CpuDevice::Create(opt));
    dev.push_back(std::move(d));
  }
  // Host data: inputs, weights, targets, and the activations that travel between the stages.
  const auto x = Random(size_t(M * N * C), 1, 1.0f);
  const auto w1 = Random(size_t(C * C), 2, 1.0f / std::sqrt(float(C)));
  const std::vector<float> g(size_t(C), 1.0f);
  const auto wh = Random(size_t(V * C), 3, 0.05f);
  std::vector<int32_t> targets(size_t(M * N));
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = int32_t((i * 7919) % size_t(V));
  for (size_t i = 0; i < targets.size(); i += 5) targets[i] = -100;  // masked tokens
  double unmasked = 0;
  for (int32_t t : targets) unmasked += t >= 0;

  FERRY_ASSIGN_OR_RETURN(HostArena host,
                         HostArena::Make(size_t(M * N * C * 4 * 2 + C * C * 4 + C * 4 + V * C * 4 +
                                                M * N * 4 + M * 4 + (1 << 16))));
  HostSpan hx = host.Take(x.size() * 4), hw1 = host.Take(w1.size() * 4), hg = host.Take(C * 4),
           hwh = host.Take(wh.size() * 4), ht = host.Take(targets.size() * 4),
           hmid = host.Take(x.size() * 4), hloss = host.Take(size_t(M) * 4);
  std::memcpy(hx.data(), x.data(), hx.size());
  std::memcpy(hw1.data(), w1.data(), hw1.size());
  std::memcpy(hg.data(), g.data(), hg.size());
  std::memcpy(hwh.data(), wh.data(), hwh.size());
  std::memcpy(ht.data(), targets.data(), ht.size());

  CpuDevice& d0 = *dev[0];
  CpuDevice& d1 = *dev[1];
  const size_t act = size_t(N * C * 4);
  // Stage 1 buffers (device 0): weights once, activations double-buffered.
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer w1_d, d0.Allocate(C * C * 4, "stage1.w"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer g_d, d0.Allocate(C * 4, "stage1.norm"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer x_d, d0.Allocate(act, "stage1.x"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer y_d, d0.Allocate(act, "stage1.y"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer h_d, d0.Allocate(act, "stage1.h"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer rstd_d, d0.Allocate(N * 4, "stage1.rstd"));
  // Stage 2 buffers (device 1).
  const size_t scratch = LmHeadLossScratchBytes(d1, 128, V, C, DType::kF32, DType::kF32, true);
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer wh_d, d1.Allocate(V * C * 4, "stage2.head"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer dwh_d, d1.Allocate(V * C * 4, "stage2.head.grad"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer h2_d, d1.Allocate(act, "stage2.h"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer dh_d, d1.Allocate(act, "stage2.dh"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer t_d, d1.Allocate(N * 4, "stage2.targets"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer loss_d, d1.Allocate(256, "stage2.loss"));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer scratch_d, d1.Allocate(scratch, "stage2.scratch"));

  FERRY_ASSIGN_OR_RETURN(Event weights0, d0.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event x_in, d0.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event h_done, d0.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event h_out, d0.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event stage1_free, d0.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event h_in, d1.CreateEvent());
  FERRY_ASSIGN_OR_RETURN(Event stage2_free, d1.CreateEvent());

  const auto t0 = std::chrono::steady_clock::now();
  FERRY_RETURN_IF_ERROR(d0.CopyToDevice(w1_d.data(), hw1, hw1.size()));
  FERRY_RETURN_IF_ERROR(d0.CopyToDevice(g_d.data(), hg, hg.size()));
  FERRY_RETURN_IF_ERROR(d1.CopyToDevice(wh_d.data(), hwh, hwh.size()));
  FERRY_RETURN_IF_ERROR(d1.Zero(dwh_d.data(), dwh_d.bytes(), StreamId::kUpload));
  FERRY_RETURN_IF_ERROR(d0.Record(weights0, StreamId::kUpload));
  FERRY_RETURN_IF_ERROR(d0.Wait(StreamId::kCompute, weights0));
  for (int64_t m = 0; m < M; ++m) {
    // Stage 1 on device 0: the upload of x waits until the previous compute has read x_d.
    FERRY_RETURN_IF_ERROR(d0.Wait(StreamId::kUpload, stage1_free));
    FERRY_RETURN_IF_ERROR(d0.CopyToDevice(x_d.data(), hx.Sub(size_t(m) * act, act), act));
    FERRY_RETURN_IF_ERROR(d0.Record(x_in, StreamId::kUpload));
    FERRY_RETURN_IF_ERROR(d0.Wait(StreamId::kCompute, x_in));
    FERRY_RETURN_IF_ERROR(d0.Wait(StreamId::kCompute, h_out));  // h_d downloaded before reuse
    GemmArgs gemm{x_d.View(DType::kF32, {N, C}), w1_d.View(DType::kF32, {C, C}),
                  y_d.View(DType::kF32, {N, C})};
    gemm.trans_b = true;
    FERRY_RETURN_IF_ERROR(Gemm(d0, gemm));
    FERRY_RETURN_IF_ERROR(d0.Record(stage1_free, StreamId::kCompute));
    FERRY_RETURN_IF_ERROR(
        RmsNormForward(d0, {y_d.View(DType::kF32, {N, C}), g_d.View(DType::kF32, {C}),
                            h_d.View(DType::kF32, {N, C}), rstd_d.View(DType::kF32, {N}), 1e-5f}));
    FERRY_RETURN_IF_ERROR(d0.Record(h_done, StreamId::kCompute));
    // Device 0 -> host.
    FERRY_RETURN_IF_ERROR(d0.Wait(StreamId::kDownload, h_done));
    FERRY_RETURN_IF_ERROR(d0.CopyToHost(hmid.Sub(size_t(m) * act, act), h_d.data(), act));
    FERRY_RETURN_IF_ERROR(d0.Record(h_out, StreamId::kDownload));
    // Host -> device 1 (a cross-device wait), then stage 2.
    FERRY_RETURN_IF_ERROR(d1.Wait(StreamId::kUpload, h_out));
    FERRY_RETURN_IF_ERROR(d1.Wait(StreamId::kUpload, stage2_free));
    FERRY_RETURN_IF_ERROR(d1.CopyToDevice(h2_d.data(), hmid.Sub(size_t(m) * act, act), act));
    FERRY_RETURN_IF_ERROR(
        d1.CopyToDevice(t_d.data(), ht.Sub(size_t(m * N) * 4, size_t(N) * 4), size_t(N) * 4));
    FERRY_RETURN_IF_ERROR(d1.Record(h_in, StreamId::kUpload));
    FERRY_RETURN_IF_ERROR(d1.Wait(StreamId::kCompute, h_in));
    LmHeadLossArgs loss;
    loss.h = h2_d.View(DType::kF32, {N, C});
    loss.w = wh_d.View(DType::kF32, {V, C});
    loss.targets = t_d.data().As<const int32_t>();
    loss.normalizer = unmasked;
    loss.chunk_tokens = 128;
    loss.loss_sum = loss_d.View(DType::kF32, {1});
    loss.dh = dh_d.View(DType::kF32, {N, C});
    loss.dw = dwh_d.View(DType::kF32, {V, C});
    loss.scratch = scratch_d.View(DType::kF32, {int64_t(scratch / 4)});
    FERRY_RETURN_IF_ERROR(LmHeadLossForwardBackward(d1, loss));
    FERRY_RETURN_IF_ERROR(d1.Record(stage2_free, StreamId::kCompute));
    FERRY_RETURN_IF_ERROR(d1.Wait(StreamId::kDownload, stage2_free));
    FERRY_RETURN_IF_ERROR(d1.CopyToHost(hloss.Sub(size_t(m) * 4, 4), loss_d.data(), 4));
  }
  FERRY_RETURN_IF_ERROR(d0.Synchronize());
  FERRY_RETURN_IF_ERROR(d1.Synchronize());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double loss_sum = 0;
  for (int64_t m = 0; m < M; ++m) loss_sum += hloss.as<float>()[size_t(m)];

  // The plain reference, in double, on the host.
  std::vector<double> xd(x.begin(), x.end()), w1d(w1.begin(), w1.end()), gd(g.begin(), g.end()),
      whd(wh.begin(), wh.end()), y(size_t(M * N * C)), h(size_t(M * N * C)), rstd(size_t(M * N));
  ref::Gemm<double>(false, true, M * N, C, C, 1.0, xd.data(), w1d.data(), 0.0, y.data(), nullptr);
  ref::RmsNormForward<double>(M * N, C, y.data(), gd.data(), 1e-5, h.data(), rstd.data());
  const double want = ref::LmHeadLoss<double>(h.data(), whd.data(), targets.data(), M * N, V, C,
                                              unmasked, 1.0, nullptr, nullptr, nullptr);
  const double rel = std::fabs(loss_sum - want) / std::fabs(want);
  const double flops = double(M) * N * (2.0 * C * C + 6.0 * C * V);
  std::printf("  loss (devices)   %.6f\n  loss (reference) %.6f   relative difference %.2e\n",
              loss_sum, want, rel);
  std::printf("  %.3f s, %.0f tokens/s, %.2f GFLOP/s\n", seconds, double(M * N) / seconds,
              flops / seconds / 1e9);
  for (auto* d : {&d0, &d1}) {
    const ArenaStats s = d->arena_stats();
    std::printf("  %s: arena peak %.1f MiB of %.1f MiB in %zu named allocations\n",
                d->name().c_str(), s.peak / 1048576.0, s.capacity / 1048576.0, s.allocations);
  }
  // fp32 math with fp32 storage over C- and V-long sums: far inside 1e-4.
  if (!(rel < 1e-4)) {
    return Status::Internal("the devices' loss differs from the reference by " +
                            std::to_string(rel));
  }
  std::printf("  OK: the pipelined devices agree with the reference\n");
  return Status::Ok();
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Run a two-device pipeline of ferry's ops on CPU devices and check it against the "
      "reference implementation");
  cmd->add_option("--micro-batches", opts->micro_batches, "micro-batches")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--tokens", opts->tokens, "tokens per micro-batch")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--hidden", opts->hidden, "hidden size")->check(CLI::Range(1, 8192));
  cmd->add_option("--vocab", opts->vocab, "vocabulary size")->check(CLI::Range(2, 1 << 18));
  cmd->add_option("--threads", opts->threads, "compute threads per device")
      ->check(CLI::Range(1, 256));
  cmd->callback([opts] {
    const Status s = RunDemo(*opts);
    if (!s.ok()) {
      std::fprintf(stderr, "ferry demo: %s\n", s.ToString().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ferry
