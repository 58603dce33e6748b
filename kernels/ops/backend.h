// How an op reaches a device: one table of kernels per device kind (ggml-backend's idea).
//
// Each op lives in kernels/ops/<op>.h as an argument struct, a validator, a scratch-size report
// and a free function `Status Op(Device&, const Args&)` that validates (errors at enqueue time),
// then looks its kernel up in the table of the device's kind and runs it; the kernel enqueues on
// the device's compute stream. The tables:
//   - CPU (kernels/cpu/cpu_backend.cc, always built): the fast CPU kernels on the device's pool;
//   - CUDA (kernels/cuda/cuda_backend.cc, built with FERRY_WITH_CUDA): the CUDA kernels, or an
//     explicit NotYet entry (Unavailable naming the op and the device) until one exists.
// Adding an op: an entry in Backend below and a line in each backend's table. Adding a backend:
// one table (and its scratch reports). kernels/ops/backend_test.cc checks that every op DESIGN.md
// lists has an entry in every backend built.
//
// Scratch is reported per device kind by ScratchReports, a parallel table of pure functions of
// (threads, dtypes, shape) that is built for every kind whether or not its kernels are, so the
// planner sizes a CUDA plan on any machine; the op headers' *ScratchBytes(OpTarget, ...) read it.
// The plain reference (kernels/ref/) is a separate host function used by tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/device.h"
#include "kernels/ops/adamw.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/cast.h"
#include "kernels/ops/decode_attention.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/ops/nf4_dequantize.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "kernels/status.h"

namespace ferry {

// One op's entry in a backend's table. `run` enqueues the op on d's compute stream; it is called
// with validated arguments and the entry's `op` (the name in errors and stream traces).
template <typename Args>
struct Kernel {
  using Fn = Status (*)(Device& d, std::string_view op, const Args& a);
  std::string_view op;
  Fn run = nullptr;  // nullptr: the backend has no entry (a bug: the backend test fails)
};

// The kernels of one device kind. The op names are given here, once; each backend sets `run`.
struct Backend {
  DeviceKind kind = DeviceKind::kCpu;
  std::string_view name;  // "cpu", "cuda"
  Kernel<GemmArgs> gemm{"gemm"};
  Kernel<BiasGradArgs> bias_grad{"bias_grad"};
  Kernel<CastArgs> cast{"cast"};
  Kernel<ResidualAddArgs> residual_add{"residual_add"};
  Kernel<ResidualAccumulateArgs> residual_accumulate{"residual_accumulate"};
  Kernel<RmsNormForwardArgs> rmsnorm_forward{"rmsnorm_forward"};
  Kernel<RmsNormBackwardArgs> rmsnorm_backward{"rmsnorm_backward"};
  Kernel<LayerNormForwardArgs> layernorm_forward{"layernorm_forward"};
  Kernel<LayerNormBackwardArgs> layernorm_backward{"layernorm_backward"};
  Kernel<RopeArgs> rope_forward{"rope_forward"};
  Kernel<RopeArgs> rope_backward{"rope_backward"};
  Kernel<AttentionForwardArgs> attention_forward{"attention_forward"};
  Kernel<AttentionBackwardArgs> attention_backward{"attention_backward"};
  Kernel<DecodeAttentionArgs> decode_attention{"decode_attention"};
  Kernel<SwiGluForwardArgs> swiglu_forward{"swiglu_forward"};
  Kernel<SwiGluBackwardArgs> swiglu_backward{"swiglu_backward"};
  Kernel<GeluForwardArgs> gelu_forward{"gelu_forward"};  // exact and tanh: GeluArgs::approx
  Kernel<GeluBackwardArgs> gelu_backward{"gelu_backward"};
  Kernel<LmHeadLossArgs> lm_head_loss_forward{"lm_head_loss_fwd"};
  Kernel<LmHeadLossArgs> lm_head_loss_forward_backward{"lm_head_loss_fwd_bwd"};
  Kernel<AdamWArgs> adamw{"adamw"};
  Kernel<Nf4DequantizeArgs> nf4_dequantize{"nf4_dequantize"};
};

// Scratch bytes one device kind's kernels need, as pure functions of (threads, dtypes, shape):
// the sizes the op headers' *ScratchBytes report (the ops not named here need none).
struct ScratchReports {
  size_t (*gemm)(int threads, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes) = nullptr;
  size_t (*attention)(int threads, const AttentionShape& shape) = nullptr;
  size_t (*lm_head_loss)(int threads, int64_t chunk_tokens, int64_t V, int64_t C, DType h_dtype,
                         std::optional<DType> dw_dtype, bool backward) = nullptr;
  size_t library_workspace = 0;  // bytes a device of this kind holds for its libraries (cuBLAS)
};

// The tables, defined by each backend.
const Backend& CpuBackend();
const ScratchReports& CpuScratchReports();
#ifdef FERRY_WITH_CUDA
const Backend& CudaBackend();
#endif
const ScratchReports& CudaScratchReports();  // built without CUDA too (the planner's sizes)

// The table of a device kind, or nullptr when that backend is not built.
const Backend* FindBackend(DeviceKind kind);
// The scratch reports of a device kind (every kind has them).
const ScratchReports& ScratchReportsFor(DeviceKind kind);

// The error for an op that has no implementation on this device kind yet.
Status NotOnDevice(const Device& d, std::string_view op);

// The entry of an op a backend does not implement yet: NotOnDevice naming the op and the device.
template <typename Args>
Status NotYet(Device& d, std::string_view op, const Args&) {
  return NotOnDevice(d, op);
}
template <typename Args>
bool IsNotYet(const Kernel<Args>& k) {
  return k.run == &NotYet<Args>;
}

// d's kernel for `entry` (e.g. &Backend::gemm), or NotOnDevice when d's backend is not built,
// has no such entry or says NotYet.
template <typename Args>
Result<const Kernel<Args>*> FindKernel(const Device& d, Kernel<Args> Backend::*entry) {
  const Backend* b = FindBackend(d.kind());
  const Kernel<Args>* k = b == nullptr ? nullptr : &(b->*entry);
  if (k == nullptr || k->run == nullptr || IsNotYet(*k)) {
    return NotOnDevice(d, (Backend{}.*entry).op);
  }
  return k;
}

// Looks the kernel up and runs it. REQUIRES: the arguments are validated.
template <typename Args>
Status RunKernel(Device& d, Kernel<Args> Backend::*entry, const Args& a) {
  FERRY_ASSIGN_OR_RETURN(const Kernel<Args>* k, FindKernel(d, entry));
  return k->run(d, k->op, a);
}

// What most ops do: validate (errors at enqueue time), then look the kernel up and run it.
template <typename Args>
Status RunKernel(Device& d, Kernel<Args> Backend::*entry, Status (*validate)(const Args&),
                 const Args& a) {
  FERRY_RETURN_IF_ERROR(validate(a));
  return RunKernel(d, entry, a);
}

}  // namespace ferry
