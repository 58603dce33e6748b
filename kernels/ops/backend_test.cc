// The backend tables (kernels/ops/backend.h). Every op DESIGN.md lists ("Ops (forward and
// backward where it applies)") must have an entry in the table of every backend built: the CPU
// backend, the reference, implements each; the CUDA backend says NotYet exactly for the ops whose
// kernels have not landed (kCudaNotYet, empty since attention landed on cuDNN's SDPA). The list
// below is written from DESIGN.md, not read from the tables, so a table that leaves an op out fails
// here (TheCheckFailsForAMissingEntry shows that it can). The scratch reports give the CPU kernels'
// and the CUDA GEMM's own sizes.
#include "kernels/ops/backend.h"

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/lm_head_loss.h"

namespace ferry {
namespace {

// What a table holds for one op.
struct Entry {
  std::string_view op;  // the name the entry runs under
  bool present = false;
  bool not_yet = false;
};

template <typename Args>
std::function<Entry(const Backend&)> Of(Kernel<Args> Backend::*member) {
  return [member](const Backend& b) {
    const Kernel<Args>& k = b.*member;
    return Entry{k.op, k.run != nullptr, IsNotYet(k)};
  };
}

struct DesignOp {
  std::string design;   // as DESIGN.md names it
  std::string_view op;  // the entry's name
  std::function<Entry(const Backend&)> entry;
};

// DESIGN.md's ops, forward and backward where it applies.
std::vector<DesignOp> DesignOps() {
  return {
      {"GEMM (forward, and the dx and dW products of backward)", "gemm", Of(&Backend::gemm)},
      {"bias gradient", "bias_grad", Of(&Backend::bias_grad)},
      {"RMSNorm forward", "rmsnorm_forward", Of(&Backend::rmsnorm_forward)},
      {"RMSNorm backward", "rmsnorm_backward", Of(&Backend::rmsnorm_backward)},
      {"LayerNorm forward", "layernorm_forward", Of(&Backend::layernorm_forward)},
      {"LayerNorm backward", "layernorm_backward", Of(&Backend::layernorm_backward)},
      {"RoPE forward", "rope_forward", Of(&Backend::rope_forward)},
      {"RoPE backward", "rope_backward", Of(&Backend::rope_backward)},
      {"causal attention forward", "attention_forward", Of(&Backend::attention_forward)},
      {"causal attention backward", "attention_backward", Of(&Backend::attention_backward)},
      {"decode attention (KV cache)", "decode_attention", Of(&Backend::decode_attention)},
      {"SwiGLU forward", "swiglu_forward", Of(&Backend::swiglu_forward)},
      {"SwiGLU backward", "swiglu_backward", Of(&Backend::swiglu_backward)},
      {"GELU forward (exact and tanh)", "gelu_forward", Of(&Backend::gelu_forward)},
      {"GELU backward (exact and tanh)", "gelu_backward", Of(&Backend::gelu_backward)},
      {"residual add", "residual_add", Of(&Backend::residual_add)},
      {"residual add backward (gradient accumulate)", "residual_accumulate",
       Of(&Backend::residual_accumulate)},
      {"fused LM head + cross-entropy forward", "lm_head_loss_fwd",
       Of(&Backend::lm_head_loss_forward)},
      {"fused LM head + cross-entropy forward-backward", "lm_head_loss_fwd_bwd",
       Of(&Backend::lm_head_loss_forward_backward)},
      {"AdamW", "adamw", Of(&Backend::adamw)},
      {"casts between fp32/bf16/fp16", "cast", Of(&Backend::cast)},
      {"NF4 dequantization", "nf4_dequantize", Of(&Backend::nf4_dequantize)},
  };
}

// The DESIGN ops `b` has no entry for, or whose entry runs under another name.
std::vector<std::string> Missing(const Backend& b) {
  std::vector<std::string> missing;
  for (const DesignOp& d : DesignOps()) {
    const Entry e = d.entry(b);
    if (!e.present || e.op != d.op) missing.push_back(d.design);
  }
  return missing;
}

std::vector<const Backend*> BuiltBackends() {
  std::vector<const Backend*> built = {&CpuBackend()};
#ifdef FERRY_WITH_CUDA
  built.push_back(&CudaBackend());
#endif
  return built;
}

TEST(BackendTable, EveryDesignOpHasAnEntryInEveryBuiltBackend) {
  for (const Backend* b : BuiltBackends()) {
    EXPECT_EQ(Missing(*b), std::vector<std::string>{}) << "backend " << b->name;
    EXPECT_EQ(FindBackend(b->kind), b) << b->name;
  }
}

TEST(BackendTable, TheCpuReferenceImplementsEveryOp) {
  EXPECT_EQ(CpuBackend().kind, DeviceKind::kCpu);
  EXPECT_EQ(CpuBackend().name, "cpu");
  for (const DesignOp& d : DesignOps()) EXPECT_FALSE(d.entry(CpuBackend()).not_yet) << d.design;
}

#ifdef FERRY_WITH_CUDA
// The ops the CUDA backend has no kernel for yet: their entries say NotYet, every other entry is
// a kernel. None: attention forward and backward run on cuDNN's fused SDPA.
const std::set<std::string_view> kCudaNotYet = {};

TEST(BackendTable, CudaSaysNotYetExactlyForTheOpsWithoutAKernel) {
  const Backend& b = CudaBackend();
  EXPECT_EQ(b.kind, DeviceKind::kCuda);
  EXPECT_EQ(b.name, "cuda");
  for (const DesignOp& d : DesignOps()) {
    EXPECT_EQ(d.entry(b).not_yet, kCudaNotYet.contains(d.op)) << d.design;
  }
}
#else
TEST(BackendTable, CudaIsNotBuilt) { EXPECT_EQ(FindBackend(DeviceKind::kCuda), nullptr); }
#endif

TEST(BackendTable, TheCheckFailsForAMissingEntry) {
  Backend partial = CpuBackend();
  partial.rope_backward.run = nullptr;
  EXPECT_EQ(Missing(partial), std::vector<std::string>{"RoPE backward"});
  partial = CpuBackend();
  partial.adamw.op = "adam";  // an entry under another op's name is no entry for AdamW
  EXPECT_EQ(Missing(partial), std::vector<std::string>{"AdamW"});
  EXPECT_EQ(Missing(Backend{}).size(), DesignOps().size());  // nothing set
}

TEST(BackendTable, NotYetNamesTheOpAndTheDevice) {
  CpuDeviceOptions o;
  o.name = "cpu-notyet";
  o.memory_bytes = size_t(1) << 20;
  auto dev = CpuDevice::Create(o);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const Status s = NotYet<RopeArgs>(**dev, "rope_backward", RopeArgs{});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("'rope_backward'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("'cpu-notyet'"), std::string::npos) << s.ToString();
}

TEST(ScratchReports, CpuReportsAreTheCpuKernelsSizesForTheDevicesThreads) {
  CpuDeviceOptions o;
  o.memory_bytes = size_t(1) << 20;
  o.compute_threads = 3;
  auto dev = CpuDevice::Create(o);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const OpTarget t = OpTargetOf(**dev);
  EXPECT_EQ(t.kind, DeviceKind::kCpu);
  EXPECT_EQ(t.threads, 3);

  const DType bf = DType::kBF16, f32 = DType::kF32;
  const GemmDTypes dt{bf, bf, f32};
  EXPECT_GT(cpu::GemmScratchBytes(3, 67, 530, 300, dt), 0u);
  EXPECT_EQ(GemmScratchBytes(t, 67, 530, 300, dt), cpu::GemmScratchBytes(3, 67, 530, 300, dt));
  EXPECT_EQ(GemmScratchBytes(**dev, 67, 530, 300, dt), cpu::GemmScratchBytes(3, 67, 530, 300, dt));
  EXPECT_EQ(ScratchReportsFor(DeviceKind::kCpu).gemm, &cpu::GemmScratchBytes);

  const AttentionShape shape{2, 33, 4, 2, 16};
  EXPECT_GT(cpu::AttentionScratchBytes(3, shape), 0u);
  EXPECT_EQ(AttentionScratchBytes(t, shape), cpu::AttentionScratchBytes(3, shape));
  EXPECT_EQ(AttentionScratchBytes(**dev, shape), cpu::AttentionScratchBytes(3, shape));

  const size_t head = cpu::LmHeadLossScratchBytes(3, 64, 1000, 48, bf, f32, true);
  EXPECT_GT(head, cpu::LmHeadLossScratchBytes(1, 64, 1000, 48, bf, f32, true));
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, bf, f32, true), head);
  EXPECT_EQ(LmHeadLossScratchBytes(**dev, 64, 1000, 48, bf, f32, true), head);
  EXPECT_EQ(ScratchReportsFor(DeviceKind::kCpu).library_workspace, 0u);
}

TEST(ScratchReports, CudaReportsNeedNoCudaAndIgnoreThreads) {
  const OpTarget t{DeviceKind::kCuda, 8};
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  EXPECT_EQ(GemmScratchBytes(t, 1000, 24, 1000, {f16, bf, f32}),
            CudaGemmScratchBytes(1000, 24, 1000, {f16, bf, f32}));
  EXPECT_EQ(GemmScratchBytes(t, 1000, 24, 1000, {bf, bf, f32}), 0u);
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  // Attention: cuDNN's packed stats (G, Hq, T), the documents' lengths, offsets and starts, the
  // rows' documents, the count, and the workspace bound: fp32 dq, softmax sums and (Hkv < Hq)
  // full-head dk, dv over R = Hq * G * 128 rows (T = 33 padded to 128), plus 1 MiB.
  auto workspace = [](size_t rows) { return rows * 17 * 4 + 2 * rows * 16 * 4 + (1u << 20); };
  const size_t attention_ws = workspace(4 * 2 * 128);
  EXPECT_EQ(AttentionScratchBytes(t, AttentionShape{2, 33, 4, 2, 16}),
            up(2 * 4 * 33 * 4) + up(2 * 4) + 3 * up(3 * 4) + up(66 * 4) + 256 + up(attention_ws));
  EXPECT_EQ(MakeCudaAttentionLayout(AttentionShape{2, 33, 4, 2, 16}).workspace_bytes, attention_ws);
  // Without grouped KV heads, dq and the softmax sums only.
  EXPECT_EQ(MakeCudaAttentionLayout(AttentionShape{2, 33, 4, 4, 16}).workspace_bytes,
            4 * 2 * 128 * 17 * 4 + (1u << 20));
  // With max_documents, G = 5 sequences of up to T.
  EXPECT_EQ(AttentionScratchBytes(t, AttentionShape{2, 33, 4, 2, 16, 5}),
            up(5 * 4 * 33 * 4) + up(5 * 4) + 3 * up(6 * 4) + up(66 * 4) + 256 +
                up(workspace(4 * 5 * 128)));
  // The LM head: its CUDA layout, counted piece by piece (each rounded up to 256 bytes): the
  // (chunk, V) logits, the chunk's losses, the state; with bf16 h in the backward, the widened h
  // (only with a dW), one W panel of min(V, 1024) rows and the fp32 dh block.
  const size_t logits = up(64 * 1000 * 4), losses = up(64 * 4), state = 256;
  const size_t h_panel = up(64 * 48 * 4), w_panel = up(1000 * 48 * 4), dh = up(64 * 48 * 4);
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, f32, f32, true), logits + losses + state);
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, bf, std::nullopt, false),
            logits + losses + state);
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, bf, f32, true),
            logits + losses + state + h_panel + w_panel + dh);
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, bf, std::nullopt, true),
            logits + losses + state + w_panel + dh);  // a frozen head: no widened h
  EXPECT_EQ(LmHeadLossScratchBytes(t, 7, 3001, 5, bf, bf, true),
            up(7 * 3001 * 4) + up(7 * 4) + 256 + up(7 * 5 * 4) + up(1024 * 5 * 4) + up(7 * 5 * 4));
  EXPECT_EQ(LmHeadLossScratchBytes(t, 64, 1000, 48, bf, f32, true),
            MakeCudaLmHeadLossLayout(64, 1000, 48, bf, f32, true).total);
  EXPECT_EQ(ScratchReportsFor(DeviceKind::kCuda).library_workspace, size_t(32) << 20);
}

}  // namespace
}  // namespace ferry
