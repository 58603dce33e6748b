// The CPU backend's table (kernels/ops/backend.h): every op, each the fast kernel of
// kernels/cpu/<op>.cc enqueued on the CPU device's compute stream and run on its pool. The CPU is
// the reference backend, so it has no NotYet entries.
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/lm_head_loss.h"
#include "kernels/cpu/nf4_dequantize.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/kernel_work.h"

namespace ferry {
namespace {

// Enqueues Fn(pool, a) on a CPU device's compute stream under the name `op`, priced by its work
// (for a virtual clock).
template <typename Args, Status (*Fn)(ThreadPool&, const Args&)>
Status OnPool(Device& d, std::string_view op, const Args& a) {
  return static_cast<CpuDevice&>(d).EnqueueCompute(
      op, [a](ThreadPool& p) { return Fn(p, a); }, WorkOf(a));
}

Status DecodeAttentionKernel(ThreadPool& p, const DecodeAttentionArgs& a) {
  cpu::DecodeAttention(p, a);
  return Status::Ok();
}

constexpr Backend kCpuBackend = [] {
  Backend b;
  b.kind = DeviceKind::kCpu;
  b.name = "cpu";
  b.gemm.run = &OnPool<GemmArgs, cpu::Gemm>;
  b.bias_grad.run = &OnPool<BiasGradArgs, cpu::BiasGrad>;
  b.cast.run = &OnPool<CastArgs, cpu::Cast>;
  b.residual_add.run = &OnPool<ResidualAddArgs, cpu::ResidualAdd>;
  b.residual_accumulate.run = &OnPool<ResidualAccumulateArgs, cpu::ResidualAccumulate>;
  b.rmsnorm_forward.run = &OnPool<RmsNormForwardArgs, cpu::RmsNormForward>;
  b.rmsnorm_backward.run = &OnPool<RmsNormBackwardArgs, cpu::RmsNormBackward>;
  b.layernorm_forward.run = &OnPool<LayerNormForwardArgs, cpu::LayerNormForward>;
  b.layernorm_backward.run = &OnPool<LayerNormBackwardArgs, cpu::LayerNormBackward>;
  b.rope_forward.run = &OnPool<RopeArgs, cpu::RopeForward>;
  b.rope_backward.run = &OnPool<RopeArgs, cpu::RopeBackward>;
  b.attention_forward.run = &OnPool<AttentionForwardArgs, cpu::AttentionForward>;
  b.attention_backward.run = &OnPool<AttentionBackwardArgs, cpu::AttentionBackward>;
  b.decode_attention.run = &OnPool<DecodeAttentionArgs, DecodeAttentionKernel>;
  b.swiglu_forward.run = &OnPool<SwiGluForwardArgs, cpu::SwiGluForward>;
  b.swiglu_backward.run = &OnPool<SwiGluBackwardArgs, cpu::SwiGluBackward>;
  b.gelu_forward.run = &OnPool<GeluForwardArgs, cpu::GeluForward>;
  b.gelu_backward.run = &OnPool<GeluBackwardArgs, cpu::GeluBackward>;
  b.lm_head_loss_forward.run = &OnPool<LmHeadLossArgs, cpu::LmHeadLossForward>;
  b.lm_head_loss_forward_backward.run = &OnPool<LmHeadLossArgs, cpu::LmHeadLossForwardBackward>;
  b.adamw.run = &OnPool<AdamWArgs, cpu::AdamWStep>;
  b.nf4_dequantize.run = &OnPool<Nf4DequantizeArgs, cpu::Nf4Dequantize>;
  return b;
}();

// Per-worker panels: the sizes grow with the device's compute threads.
constexpr ScratchReports kCpuScratch{
    .gemm = &cpu::GemmScratchBytes,
    .attention = &cpu::AttentionScratchBytes,
    .lm_head_loss = &cpu::LmHeadLossScratchBytes,
    .library_workspace = 0,
};

}  // namespace

const Backend& CpuBackend() { return kCpuBackend; }
const ScratchReports& CpuScratchReports() { return kCpuScratch; }

}  // namespace ferry
