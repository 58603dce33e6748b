#include "engine/plan/memory_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/model/base_reader.h"
#include "engine/model/device_params.h"
#include "kernels/nf4.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/lm_head_loss.h"

namespace ferry::plan {
namespace {

// A Llama-style model small enough to count by hand:
// C = 8, I = 16, H = 2 query heads, 1 KV head, head_dim 4, 2 blocks, vocab 10, untied.
ModelConfig HandModel() {
  ModelConfig c = TinyLlamaPreset();
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  return c;
}

// Micro-batch 1 x 4 tokens, 3 micro-batches, 2 GPUs, one block per stage, bf16, a CUDA device.
MemoryPlanInput HandInput() {
  MemoryPlanInput in;
  in.model = HandModel();
  in.micro_batch = {1, 4};
  in.micro_batches = 3;
  in.gpus = 2;
  in.compute_dtype = DType::kBF16;
  in.stages = {{1, 2}, {2, 3}};
  in.recompute = {false, false, false, false};  // embedding, block 0, block 1, head
  in.scratch = {.cuda = true};
  return in;
}

std::map<std::string, uint64_t> Named(const TierMemory& t) {
  std::map<std::string, uint64_t> m;
  for (const Allocation& a : t.allocations) m[a.name] = a.bytes;
  return m;
}

// The head's scratch is the fused LM-head op's own size function for a CUDA device (tested in
// kernels/), for one chunk of all 4 tokens, vocabulary 10, C 8, bf16 hidden, fp32 dW.
uint64_t HeadScratch() {
  return RoundUp(LmHeadLossScratchBytes(OpTarget{DeviceKind::kCuda, 1}, 4, 10, 8, DType::kBF16,
                                        DType::kF32, true),
                 256);
}

// The attention's CUDA scratch (cuDNN's stats, the documents' offsets, its workspace bound; tested
// in kernels/) for the micro-batch of 1 x 4 tokens, 2 query heads, 1 KV head, head_dim 4.
uint64_t AttentionScratch() {
  return RoundUp(
      AttentionScratchBytes(OpTarget{DeviceKind::kCuda, 1}, AttentionShape{.batch = 1,
                                                                           .seq_len = 4,
                                                                           .q_heads = 2,
                                                                           .kv_heads = 1,
                                                                           .head_dim = 4,
                                                                           .max_documents = 0}),
      256);
}

// The scratch region serves one op at a time: the largest of the ops' own sizes.
uint64_t Scratch() { return std::max(HeadScratch(), AttentionScratch()); }

TEST(MemoryModel, FullFineTuningByHand) {
  const MemoryEstimate e = ComputeMemory(HandInput());
  // Block parameters: 2 norms of 8, q 8x8 = 64, k 4x8 = 32, v 32, o 64, gate/up/down 16x8 = 128:
  // 592. In bf16 the tensors are 16, 128, 64, 64, 128, 16, 256, 256, 256 bytes, each placed at a
  // 256-byte offset: 9 x 256 = 2304 bytes. The head (norm 8 + lm_head 10x8) is 2 x 256 = 512.
  // fp32 gradients: 32, 256, 128, 128, 256, 32 -> 256 each (6 x 256), 512 x 3 -> 3072 per block.
  // Hidden state 4 tokens x 8 x 2 B = 64 -> 256. Saved set of a block: 4 x (8 + 8 + 2x4 + 8 + 8 +
  // 8 + 3x16) = 384 bf16 values (768 B) + 4 x (1 + 1 + 2) fp32 statistics (64 B) = 832, in a slot
  // as its 12 tensors (xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate|up, h), each under
  // 256 B and at a 256-byte offset: 3072. The backward's workspace of a block (activation
  // gradients in bf16, the sink fp32): branch 4 x 8 (64 B), d_h 4 x 16 (128), d_gate_up 4 x 32
  // (256), d_xn 4 x 8, d_att and dq 4 x 8, dk and dv 4 x 4, LoRA's du 4 x 1 and the sink 2 x 8
  // (64), each at a 256-byte offset: 10 x 256 = 2560 (the head's targets, input gradient and
  // sink: 768).
  const auto gpu = Named(e.gpu);
  EXPECT_EQ(gpu.at("weights.slot0"), 2304u);
  EXPECT_EQ(gpu.at("weights.slot1"), 2304u);
  EXPECT_EQ(gpu.at("grads.accum"), 3072u);
  EXPECT_EQ(gpu.at("hidden.0"), 256u);
  EXPECT_EQ(gpu.at("hidden.3"), 256u);
  EXPECT_EQ(gpu.at("hidden.4"), 256u);  // the backward's third gradient buffer (2 micro-batches)
  EXPECT_EQ(gpu.at("saved.slot0"), 3072u);
  EXPECT_EQ(gpu.at("saved.slot1"), 3072u);
  EXPECT_EQ(gpu.at("grad.work"), 2560u);
  EXPECT_EQ(gpu.at("scratch"), Scratch());  // the CUDA GEMM needs none in bf16
  EXPECT_EQ(gpu.at("library.workspace"), 32u << 20);
  // Two slots of the row layout (two micro-batches), each 4 tokens x 4 B -> 256.
  EXPECT_EQ(gpu.at("positions"), 512u);      // RoPE ids
  EXPECT_EQ(gpu.at("rope.inv_freq"), 256u);  // head_dim / 2 f32 -> 256
  EXPECT_EQ(gpu.at("doc_ids"), 512u);        // packed-document ids
  EXPECT_EQ(e.gpu.total(),
            2 * 2304 + 3072 + 5 * 256 + 2 * 3072 + 2560 + Scratch() + (32u << 20) + 2 * 512 + 256);

  // Pinned, as the executor carves it: upload mirrors in the slots' layout, one per layer range:
  // 2 blocks x 2304 + the head's 512 = 5120 -> 8192; gradient landing mirrors likewise: 2 x 3072
  // + the head's 256 (norm) + 512 (lm_head 80 x 4 B) = 6912 -> 8192; saved activations: per
  // block 3 micro-batches x (64 input + a 3072-byte slot) = 9408, twice, plus the head's input
  // only, 3 x 64 = 192: 19008 -> 20480; activation gradients: one per micro-batch, 3 x 64 = 192
  // -> 4096; batch inputs and losses: 3 x 4 tokens x 16 B = 192 -> 4096; RoPE's table: 2 f32 ->
  // 4096.
  const auto pinned = Named(e.pinned_host);
  EXPECT_EQ(pinned.at("weights.upload"), 8192u);
  EXPECT_EQ(pinned.at("grads.landing"), 8192u);
  EXPECT_EQ(pinned.at("activations.saved"), 20480u);
  EXPECT_EQ(pinned.at("activations.grad"), 4096u);
  EXPECT_EQ(pinned.at("batch.io"), 4096u);
  EXPECT_EQ(pinned.at("rope.inv_freq"), 4096u);
  EXPECT_EQ(e.pinned_host.total(), 8192u + 8192 + 20480 + 4096 + 4096 + 4096);

  // Pageable: trainable = embedding 80 + 2 x 592 + head 88 = 1352 parameters: fp32 master 5408
  // -> 8192, moments 10816 -> 12288, update gradients 5408 -> 8192; in bf16 the embedding's fp32
  // gather of a micro-batch, 4 tokens x 8 x 4 B = 128 -> 4096.
  const auto pageable = Named(e.pageable_host);
  EXPECT_EQ(pageable.at("optimizer.master"), 8192u);
  EXPECT_EQ(pageable.at("optimizer.moments"), 12288u);
  EXPECT_EQ(pageable.at("grads.update"), 8192u);
  EXPECT_EQ(pageable.at("activations.embedding"), 4096u);
  EXPECT_EQ(e.pageable_host.total(), 8192u + 12288 + 8192 + 4096);
  EXPECT_EQ(e.nvme.total(), 0u);
}

// The tail in three parts: each part after the first lands the head's gradients (768 bytes by
// hand above) in a host buffer of its own: 6912 + 2 x 768 = 8448 -> 12288. Nothing else moves.
TEST(MemoryModel, TailPartsLandTheHeadsGradientsApart) {
  MemoryPlanInput in = HandInput();
  const MemoryEstimate one = ComputeMemory(in);
  in.tail_parts = 3;
  const MemoryEstimate three = ComputeMemory(in);
  EXPECT_EQ(Named(three.pinned_host).at("grads.landing"), 12288u);
  EXPECT_EQ(three.pinned_host.total(), one.pinned_host.total() + 4096);
  EXPECT_EQ(three.gpu.total(), one.gpu.total());
  EXPECT_EQ(three.pageable_host.total(), one.pageable_host.total());
}

// The packed data's rows: a pageable "data.rows" of their bytes in whole pages, training and
// forward-only alike; nothing else moves, and no data, no entry.
TEST(MemoryModel, DataRowsArePageableHostMemory) {
  MemoryPlanInput in = HandInput();
  const MemoryEstimate none = ComputeMemory(in);
  EXPECT_EQ(Named(none.pageable_host).count("data.rows"), 0u);
  in.data_bytes = 10000;
  const MemoryEstimate rows = ComputeMemory(in);
  EXPECT_EQ(Named(rows.pageable_host).at("data.rows"), 12288u);
  EXPECT_EQ(rows.pageable_host.total(), none.pageable_host.total() + 12288);
  EXPECT_EQ(rows.pinned_host.total(), none.pinned_host.total());
  EXPECT_EQ(rows.gpu.total(), none.gpu.total());
  in.forward_only = true;
  EXPECT_EQ(Named(ComputeMemory(in).pageable_host).at("data.rows"), 12288u);
}

// Two gradient accumulators: a second "grads.accum1" the size of the first on each GPU; nothing
// else moves. A forward-only plan has neither.
TEST(MemoryModel, TwoGradientAccumulatorsAddASecondOfTheSameSize) {
  MemoryPlanInput in = HandInput();
  const MemoryEstimate one = ComputeMemory(in);
  in.grad_accumulators = 2;
  const MemoryEstimate two = ComputeMemory(in);
  const auto gpu = Named(two.gpu);
  ASSERT_EQ(gpu.count("grads.accum1"), 1u);
  EXPECT_EQ(gpu.at("grads.accum1"), gpu.at("grads.accum"));
  EXPECT_EQ(two.gpu.total(), one.gpu.total() + gpu.at("grads.accum"));
  EXPECT_EQ(Named(one.gpu).count("grads.accum1"), 0u);
  EXPECT_EQ(two.pinned_host.total(), one.pinned_host.total());
  EXPECT_EQ(two.pageable_host.total(), one.pageable_host.total());
  in.forward_only = true;
  const auto forward = Named(ComputeMemory(in).gpu);
  EXPECT_EQ(forward.count("grads.accum"), 0u);
  EXPECT_EQ(forward.count("grads.accum1"), 0u);
}

// One micro-batch: nothing uploads for a next one, so the row layout has one slot and the
// backward's residual gradient two buffers (no "hidden.4").
TEST(MemoryModel, OneMicroBatchPlansOneLayoutSlotAndTwoGradientBuffers) {
  MemoryPlanInput in = HandInput();
  in.micro_batches = 1;
  const auto gpu = Named(ComputeMemory(in).gpu);
  EXPECT_EQ(gpu.at("positions"), 256u);
  EXPECT_EQ(gpu.at("doc_ids"), 256u);
  EXPECT_EQ(gpu.count("hidden.3"), 1u);
  EXPECT_EQ(gpu.count("hidden.4"), 0u);
}

// Optimizer state on NVMe: each layer's master weights and moments (12 B a parameter) plus a
// 48-byte header in two versioned 4096-byte-block slots (offload/versioned_store.h): embedding
// 80 x 12 = 960 -> 4096, each block 592 x 12 = 7104 -> 8192, head 88 x 12 = 1056 -> 4096; two
// slots of each: 2 x 24576 = 49152. The master and moments leave pageable RAM; two staging
// buffers of the largest slot (8192) stream them; the fp32 weights the stages are packed from
// (5408 -> 8192) stay in RAM.
TEST(MemoryModel, OptimizerOnNvmeTakesTwoVersionedSlotsPerLayer) {
  MemoryPlanInput in = HandInput();
  in.optimizer_on_nvme = true;
  const MemoryEstimate e = ComputeMemory(in);
  const auto nvme = Named(e.nvme);
  EXPECT_EQ(nvme.at("optimizer.slots"), 49152u);
  EXPECT_EQ(e.nvme.total(), 49152u);
  const auto pageable = Named(e.pageable_host);
  EXPECT_EQ(pageable.count("optimizer.master"), 0u);
  EXPECT_EQ(pageable.count("optimizer.moments"), 0u);
  EXPECT_EQ(pageable.at("optimizer.staging"), 2 * 8192u);  // two of a block's slot
  EXPECT_EQ(pageable.at("weights.master"), 8192u);
}

TEST(MemoryModel, RecomputeKeepsOnlyTheInputAndLeavesGpuBytesAlone) {
  MemoryPlanInput in = HandInput();
  const uint64_t gpu_saving = ComputeMemory(in).gpu.total();
  in.recompute = {false, true, false, false};
  const MemoryEstimate e = ComputeMemory(in);
  // 19008 - 3 x 3072 = 9792 -> 12288.
  EXPECT_EQ(Named(e.pinned_host).at("activations.saved"), 12288u);
  EXPECT_EQ(e.gpu.total(), gpu_saving);  // saved sets never stay on a GPU either way
}

TEST(MemoryModel, LoraWithFrozenWeightsAndActivationsOnNvmeByHand) {
  MemoryPlanInput in = HandInput();
  in.lora.rank = 2;
  in.lora.targets = kLoraQ | kLoraV;
  in.frozen_weights_on_nvme = true;
  in.activations_on_nvme = true;
  const MemoryEstimate e = ComputeMemory(in);
  // Per block: q A (2x8) 16 + B (8x2) 16, v A (2x8) 16 + B (4x2) 8 = 56 trainable; 112 in all.
  // Slot: 2304 + 4 x 256 = 3328. Gradients: 4 fp32 tensors of 64, 64, 64, 32 B -> 4 x 256.
  const auto gpu = Named(e.gpu);
  EXPECT_EQ(gpu.at("weights.slot0"), 3328u);
  EXPECT_EQ(gpu.at("grads.accum"), 1024u);
  // The LoRA saved set adds x A^T (2 per token) for q and v: 832 + 4 x 4 x 2 B = 896; in a slot
  // two more 256-byte tensors: 3072 + 2 x 256.
  EXPECT_EQ(gpu.at("saved.slot0"), 3584u);

  const auto pinned = Named(e.pinned_host);
  // No mirror per range: two images of a stage's weights per GPU, packed in turn (the frozen base
  // read from NVMe, the adapters from the master copy): 2 x 2 x 3328 = 13312 -> 16384.
  EXPECT_EQ(pinned.count("weights.upload"), 0u);
  EXPECT_EQ(pinned.at("weights.nvme_staging"), 16384u);
  // Four slots per GPU, each the larger of the hidden state (64) and the saved set's slot (3584),
  // page-rounded: 2 x 4 x 4096.
  EXPECT_EQ(pinned.at("activations.staging"), 32768u);
  // The stage inputs stay in RAM: 3 micro-batches x 64 B x (2 stages + the head) = 576 -> 4096.
  EXPECT_EQ(pinned.at("activations.saved"), 4096u);

  const auto nvme = Named(e.nvme);
  // Frozen bf16: 2 blocks x 9 weights (two norms, q, k, v, o, gate, up, down; 592 x 2 B) and the
  // head's norm and table (88 x 2 B), each starting a 4096-byte block of its own (the copy's
  // layout, converted_base.h: a step reads only its own blocks): 20 x 4096.
  EXPECT_EQ(nvme.at("weights.frozen"), 20 * 4096u);
  // Saved: both blocks start a stage, so only their saved sets go there, each micro-batch's an
  // entry of its own in whole blocks of the largest entry's pages (4096: under 1 MiB), 2 x 3,
  // plus two being rewritten per GPU: 10 x 4096 of space; a step moves each entry's pages once
  // each way: 2 x 3 x 4096.
  EXPECT_EQ(e.nvme_activation_block_bytes, 4096u);
  EXPECT_EQ(nvme.at("activations.saved"), 40960u);
  // The store's own bounce buffers: its queue depth of those blocks.
  EXPECT_EQ(Named(e.pageable_host).at("activations.store"), kActivationQueueDepth * 4096u);
  EXPECT_EQ(e.nvme_activation_step_bytes, 24576u);

  const auto pageable = Named(e.pageable_host);
  EXPECT_EQ(pageable.at("optimizer.master"), 4096u);   // 112 x 4 B
  EXPECT_EQ(pageable.at("optimizer.moments"), 4096u);  // 112 x 8 B
  EXPECT_EQ(pageable.at("weights.embedding"), 4096u);  // frozen, untied: 80 x 2 B
  // A frozen LM head gets no dW at all (the fused op skips it): no gradient sink on the GPU.
  EXPECT_EQ(gpu.count("grads.sink"), 0u);
  for (const Allocation& a : e.gpu.allocations) EXPECT_EQ(a.name.find("sink"), std::string::npos);

  // The seeded embedding (frozen, untied) stays on the host in fp32: 80 x 4 B.
  EXPECT_EQ(pageable.at("weights.frozen"), 4096u);

  // The copy is read from the drive through the reader's bounce buffer: a block for an element
  // split between two reads, then the largest weight's blocks (an MLP weight's 128 x 2 B: one)
  // and one more, should it straddle two.
  EXPECT_EQ(pageable.at("weights.base_read"), 3 * 4096u);
  // Files in a wider dtype than the upload's (f32) still need the converted copy.
  in.frozen_base_from_files = true;
  EXPECT_EQ(Named(ComputeMemory(in).nvme).at("weights.frozen"), 20 * 4096u);
  EXPECT_EQ(Named(ComputeMemory(in).pageable_host).at("weights.base_read"), 3 * 4096u);
  // Served by the model's files in the upload dtype, the base has no converted copy on NVMe (the
  // files are read as they are stored), nor an fp32 embedding, and the host holds the same images;
  // so with files narrower than the uploads (f16 into f32).
  in.model.weights_dtype = in.compute_dtype;
  const MemoryEstimate served = ComputeMemory(in);
  EXPECT_EQ(Named(served.pageable_host).count("weights.frozen"), 0u);
  EXPECT_EQ(Named(served.nvme).count("weights.frozen"), 0u);
  EXPECT_EQ(Named(served.pinned_host).at("weights.nvme_staging"), 16384u);
  EXPECT_EQ(served.nvme.total(), e.nvme.total() - 20 * 4096u);
  // So are the files' tensors, through the same buffer.
  EXPECT_EQ(Named(served.pageable_host).at("weights.base_read"), 3 * 4096u);
  MemoryPlanInput widened = in;
  widened.model.weights_dtype = DType::kF16;
  widened.compute_dtype = DType::kF32;
  EXPECT_EQ(Named(ComputeMemory(widened).nvme).count("weights.frozen"), 0u);
}

// A LoRA base served from the model's files (frozen_base_from_files) has no fp32 copy on the
// host: each range's upload mirror is packed from the file. The frozen embedding is its table as
// the file maps it, in the file's dtype. Nothing else moves. Forward only, the whole base is
// served.
TEST(MemoryModel, ABaseServedFromTheModelsFilesHasNoFp32CopyByHand) {
  MemoryPlanInput in = HandInput();
  in.lora.rank = 2;
  in.lora.targets = kLoraQ | kLoraV;
  in.model.weights_dtype = DType::kF32;
  const MemoryEstimate held = ComputeMemory(in);
  const auto h = Named(held.pageable_host);
  // Frozen: embedding 80, per block 2 x 8 norms + q 64 + k 32 + v 32 + o 64 + 3 x 128 MLP = 592,
  // final norm 8, untied head 80: 1352 x 4 B = 5408 -> 8192. The embedding's bf16 copy: 160 B.
  EXPECT_EQ(h.at("weights.frozen"), 8192u);
  EXPECT_EQ(h.at("weights.embedding"), 4096u);
  in.frozen_base_from_files = true;
  const MemoryEstimate served = ComputeMemory(in);
  const auto s = Named(served.pageable_host);
  EXPECT_EQ(s.count("weights.frozen"), 0u);
  EXPECT_EQ(s.at("weights.embedding"), 4096u);  // the f32 file's table: 80 x 4 B
  EXPECT_EQ(held.pageable_host.total() - served.pageable_host.total(), 8192u);
  EXPECT_EQ(held.gpu.total(), served.gpu.total());
  EXPECT_EQ(held.pinned_host.total(), served.pinned_host.total());
  // Forward only (evaluation): the fp32 weights the host packs from are the adapters alone.
  in.forward_only = true;
  const auto fwd = Named(ComputeMemory(in).pageable_host);
  EXPECT_EQ(fwd.at("weights.master"), 4096u);  // 112 trainable x 4 B
  // Without an adapter nothing is held in fp32: evaluation and generation train nothing, so the
  // files serve the whole base.
  in.lora = {};
  const auto bare = Named(ComputeMemory(in).pageable_host);
  EXPECT_EQ(bare.count("weights.master"), 0u);
  EXPECT_EQ(bare.at("weights.embedding"), 4096u);
}

// QLoRA's NF4 base: held whole in RAM (a base made from the seed: codes and quant state of every
// block projection), or, when the model's files serve it, made into NF4 as each stage is packed:
// then only the largest weight's fp32 values and NF4 form are staged on the host, since the upload
// mirrors (pinned, unchanged) hold the base.
TEST(MemoryModel, AnNf4BaseFromTheFilesIsStagedOneWeightAtATimeByHand) {
  MemoryPlanInput in = HandInput();
  in.lora.rank = 2;
  in.lora.targets = kLoraAll;
  in.lora.quantize = BaseQuant::kNf4;
  in.lora.double_quant = true;
  const MemoryEstimate held = ComputeMemory(in);
  const auto h = Named(held.pageable_host);
  // Per block: q 64, k 32, v 32, o 64, gate, up and down 128 elements each.
  uint64_t nf4 = 0;
  for (int64_t n : {64, 32, 32, 64, 128, 128, 128}) nf4 += 2 * Nf4StoredBytes(n, true);
  EXPECT_EQ(h.at("weights.nf4"), RoundUp(nf4, kHostPageBytes));
  EXPECT_EQ(h.count("weights.nf4_staging"), 0u);
  in.frozen_base_from_files = true;
  const MemoryEstimate served = ComputeMemory(in);
  const auto s = Named(served.pageable_host);
  EXPECT_EQ(s.count("weights.nf4"), 0u);
  EXPECT_EQ(s.at("weights.nf4_staging"),
            RoundUp(128 * 4 + Nf4StoredBytes(128, true), kHostPageBytes));
  EXPECT_EQ(held.pinned_host.total(), served.pinned_host.total());
  EXPECT_EQ(held.gpu.total(), served.gpu.total());
  // Forward only (evaluation over an NF4 base) alike.
  in.forward_only = true;
  const auto fwd = Named(ComputeMemory(in).pageable_host);
  EXPECT_EQ(fwd.count("weights.nf4"), 0u);
  EXPECT_EQ(fwd.count("weights.nf4_staging"), 1u);
}

// A Llama MLP's gate and up projections are one device tensor, and their LoRA adapters one
// packed group whose B is block-diagonal (engine/model/device_params.h): counted as laid out.
TEST(MemoryModel, GateUpLoraIsOnePackedGroupByHand) {
  MemoryPlanInput in = HandInput();
  in.lora.rank = 8;
  in.lora.targets = kLoraGate | kLoraUp;
  const auto gpu = Named(ComputeMemory(in).gpu);
  // fp32 gradients per block: A stacks gate's and up's (8 x 8) into (16 x 8) = 512 B; B is
  // (2 x 16 rows) x (2 x 8) = 512 values = 2048 B, twice the two (16 x 8) B's own 1024 B.
  EXPECT_EQ(gpu.at("grads.accum"), 512u + 2048u);
  // Weights: the 9 base tensors as before (gate+up fused: 512 bf16 B = two 256-byte tensors)
  // + A 256 B + B 1024 B.
  EXPECT_EQ(gpu.at("weights.slot0"), 2304u + 256u + 1024u);
}

// What the planner prices a layer's copies at (DeviceBytesOf) is what DeviceParams lays out and
// uploads, packing included: more than the adapters' raw bytes once gate and up share a group.
TEST(MemoryModel, DeviceBytesOfEqualsWhatDeviceParamsLaysOut) {
  MemoryPlanInput in = HandInput();
  in.lora.rank = 8;
  in.lora.targets = kLoraQ | kLoraGate | kLoraUp;
  const std::vector<LayerSpec> layers = BuildLayerSpecs(in.model, in.lora, DType::kBF16);
  for (const LayerSpec& layer : {layers[1], layers.back()}) {
    SCOPED_TRACE(layer.name);
    const LayerDeviceBytes got = DeviceBytesOf(layer, DType::kBF16);
    Result<DeviceParams::Bytes> want =
        DeviceParams::Measure(in.model, in.lora, {layer}, DType::kBF16);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(got.weights, want->weights);
    EXPECT_EQ(got.trainable_weights, want->trainable_weights);
    EXPECT_EQ(got.grads, want->grads);
  }
  uint64_t raw = 0;  // the block's adapters as parameters, in bf16
  for (const ParamSpec& p : layers[1].params) raw += p.lora ? uint64_t(p.numel()) * 2 : 0;
  EXPECT_GT(DeviceBytesOf(layers[1], DType::kBF16).trainable_weights, raw);
}

TEST(MemoryModel, CpuDeviceScratchFollowsThreadCount) {
  MemoryPlanInput in = HandInput();
  in.scratch = {.cuda = false, .cpu_threads = 1};
  const MemoryEstimate one = ComputeMemory(in);
  in.scratch.cpu_threads = 4;
  const MemoryEstimate four = ComputeMemory(in);
  EXPECT_EQ(Named(one.gpu).count("library.workspace"), 0u);
  EXPECT_GE(Named(four.gpu).at("scratch"), Named(one.gpu).at("scratch"));
  EXPECT_EQ(Named(one.gpu).at("scratch") % kArenaAlignment, 0u);
}

}  // namespace
}  // namespace ferry::plan
