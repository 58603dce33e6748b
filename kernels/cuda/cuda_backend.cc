// The CUDA backend's table (kernels/ops/backend.h): GEMM (cuBLAS), attention (cuDNN's fused SDPA)
// and hand-written kernels (kernels/cuda/*.cu); an op without a kernel yet is an explicit NotYet
// entry until its kernel lands. Its scratch reports live in kernels/ops/backend.cc, built without
// CUDA too.
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops/backend.h"

namespace ferry {
namespace {

CudaDevice& Cuda(Device& d) { return static_cast<CudaDevice&>(d); }

Status GemmKernel(Device& d, std::string_view, const GemmArgs& g) { return cuda::Gemm(Cuda(d), g); }

Status CastKernel(Device& d, std::string_view, const CastArgs& a) {
  return cuda::Cast(Cuda(d), a.src, a.dst);
}

Status ResidualAddKernel(Device& d, std::string_view, const ResidualAddArgs& a) {
  return cuda::Residual(Cuda(d), a.a, a.b, a.y);
}

Status ResidualAccumulateKernel(Device& d, std::string_view, const ResidualAccumulateArgs& a) {
  return cuda::Residual(Cuda(d), a.dx, a.dy, a.dx);
}

// An entry that calls the CUDA implementation `fn` of an op with its validated arguments.
template <typename Args, Status (*fn)(CudaDevice&, const Args&)>
Status OnCuda(Device& d, std::string_view, const Args& a) {
  return fn(Cuda(d), a);
}

constexpr Backend kCudaBackend = [] {
  Backend b;
  b.kind = DeviceKind::kCuda;
  b.name = "cuda";
  b.gemm.run = &GemmKernel;
  b.bias_grad.run = &OnCuda<BiasGradArgs, cuda::BiasGrad>;
  b.cast.run = &CastKernel;
  b.residual_add.run = &ResidualAddKernel;
  b.residual_accumulate.run = &ResidualAccumulateKernel;
  b.rmsnorm_forward.run = &OnCuda<RmsNormForwardArgs, cuda::RmsNormForward>;
  b.rmsnorm_backward.run = &OnCuda<RmsNormBackwardArgs, cuda::RmsNormBackward>;
  b.layernorm_forward.run = &OnCuda<LayerNormForwardArgs, cuda::LayerNormForward>;
  b.layernorm_backward.run = &OnCuda<LayerNormBackwardArgs, cuda::LayerNormBackward>;
  b.rope_forward.run = &OnCuda<RopeArgs, cuda::RopeForward>;
  b.rope_backward.run = &OnCuda<RopeArgs, cuda::RopeBackward>;
  b.attention_forward.run = &OnCuda<AttentionForwardArgs, cuda::AttentionForward>;
  b.attention_backward.run = &OnCuda<AttentionBackwardArgs, cuda::AttentionBackward>;
  b.decode_attention.run = &OnCuda<DecodeAttentionArgs, cuda::DecodeAttention>;
  b.swiglu_forward.run = &OnCuda<SwiGluForwardArgs, cuda::SwiGluForward>;
  b.swiglu_backward.run = &OnCuda<SwiGluBackwardArgs, cuda::SwiGluBackward>;
  b.gelu_forward.run = &OnCuda<GeluForwardArgs, cuda::GeluForward>;
  b.gelu_backward.run = &OnCuda<GeluBackwardArgs, cuda::GeluBackward>;
  b.lm_head_loss_forward.run = &OnCuda<LmHeadLossArgs, cuda::LmHeadLossForward>;
  b.lm_head_loss_forward_backward.run = &OnCuda<LmHeadLossArgs, cuda::LmHeadLossForwardBackward>;
  b.adamw.run = &OnCuda<AdamWArgs, cuda::AdamWStep>;
  b.nf4_dequantize.run = &OnCuda<Nf4DequantizeArgs, cuda::Nf4Dequantize>;
  return b;
}();

}  // namespace

const Backend& CudaBackend() { return kCudaBackend; }

}  // namespace ferry
