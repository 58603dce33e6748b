#include "engine/plan/memory_model.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <optional>
#include <string_view>

#include "engine/model/base_reader.h"
#include "engine/model/converted_base.h"
#include "engine/model/head.h"
#include "engine/model/model_stack.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/backend.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/lm_head_loss.h"
#include "offload/versioned_store.h"

namespace ferry::plan {
namespace {

constexpr uint64_t kF32 = 4;

void Add(TierMemory& tier, std::string name, uint64_t bytes, uint64_t unit) {
  if (bytes == 0) return;
  tier.allocations.push_back({std::move(name), RoundUp(bytes, unit)});
}

// The ops layer's name for the devices a plan sizes scratch for: the sizes themselves are what
// the ops report for that device kind (kernels/ops/backend.h), as the devices ask for them.
OpTarget OpsTarget(ScratchTarget t) {
  return {t.cuda ? DeviceKind::kCuda : DeviceKind::kCpu, t.cpu_threads};
}

// Element counts of the device tensors a layer's parameters occupy (all of them, or the trainable
// ones), as the executor lays them out (engine/model/device_params.h): the parts of a fused
// projection (ParamSpec::fused_module: a Llama MLP's gate_proj and up_proj) are one tensor, weight
// and bias alike; their LoRA adapters are one packed group whose A stacks the adapters' (r, C) and
// whose B is block-diagonal (parts x out, k r) for k adapted parts, i.e. `parts` times the
// elements of the adapters' own B matrices. Anything else is one tensor per parameter.
std::vector<uint64_t> DeviceTensorElems(const LayerSpec& layer, bool trainable_only) {
  std::map<std::string, uint64_t> fused;  // fused module + the parameter's kind -> elements
  std::vector<uint64_t> out;
  for (const ParamSpec& p : layer.params) {
    if (trainable_only && !p.trainable) continue;
    if (p.nf4) continue;  // NF4WeightBytes
    const uint64_t n = uint64_t(p.numel());
    if (p.fused_module.empty()) {
      out.push_back(n);
      continue;
    }
    const bool b = p.lora && p.name.ends_with(".lora_B.weight");
    const std::string kind =
        p.lora ? p.name.substr(p.name.size() - std::string_view(".lora_A.weight").size())
               : p.name.substr(p.name.rfind('.'));
    fused[p.fused_module + kind] += b ? uint64_t(p.fused_parts) * n : n;
  }
  for (const auto& [name, n] : fused) out.push_back(n);
  return out;
}

// Device bytes of a layer's weights (all, or the trainable ones) in the compute dtype, each tensor
// at an aligned offset.
uint64_t LayerWeightBytes(const LayerSpec& layer, DType compute, bool trainable_only = false) {
  uint64_t bytes = 0;
  for (uint64_t n : DeviceTensorElems(layer, trainable_only)) {
    bytes += RoundUp(n * DTypeSize(compute), kArenaAlignment);
  }
  // NF4 weights (frozen): packed codes, absmax, code (and nested state), each its own tensor,
  // gate and up apart.
  for (const ParamSpec& p : layer.params) {
    if (!p.nf4 || trainable_only) continue;
    for (size_t b : Nf4DeviceTensorBytes(p.numel(), p.nf4_nested)) {
      bytes += RoundUp(b, kArenaAlignment);
    }
  }
  return bytes;
}

// fp32 gradient accumulator bytes of a layer's trainable weights, each at an
// aligned offset.
uint64_t LayerGradBytes(const LayerSpec& layer) {
  uint64_t bytes = 0;
  for (uint64_t n : DeviceTensorElems(layer, true)) bytes += RoundUp(n * kF32, kArenaAlignment);
  return bytes;
}

// A layer's saved set as a GPU slot holds it, as the layer code lays it out: a block's by its
// family's layout (BlockBuffersOf), the head's by Head's (HeadBuffersOf). Activations in `act`.
uint64_t SavedSlotBytes(const ModelConfig& c, const LayerSpec& layer, int64_t n, DType act) {
  if (layer.kind == LayerKind::kBlock) return BlockBuffersOf(c, layer, n, act).saved;
  if (layer.kind == LayerKind::kHead) return HeadBuffersOf(c, n, act, HeadMode::kTrain).saved;
  return 0;
}

// The backward's temporaries of a layer ("blocks.workspace" / "head.workspace", both placed in
// the plan's "grad.work"), as the layer code lays them out.
uint64_t WorkspaceBytes(const ModelConfig& c, const LayerSpec& layer, int64_t n, DType act) {
  if (layer.kind == LayerKind::kBlock) return BlockBuffersOf(c, layer, n, act).workspace;
  if (layer.kind == LayerKind::kHead) return HeadBuffersOf(c, n, act, HeadMode::kTrain).workspace;
  return 0;
}

struct ParamCounts {
  uint64_t trainable = 0;  // owners only (a tied alias counts at its owner)
  uint64_t frozen = 0;     // fp32 on the host, unless served from the model's files
  // Served from the model's files (ComputeMemory): of `frozen` when training; forward only, of
  // every base weight.
  uint64_t from_files = 0;
  uint64_t nf4_bytes = 0;  // frozen NF4 weights on the host: codes and quant state
};
// QLoRA's NF4 base on the host: held whole (codes and quant state), or, made from the model's
// files when packed (HostTensors::nf4_served), only the staging of one weight: the upload mirrors
// hold the rest.
void AddNf4Base(MemoryEstimate& e, const MemoryPlanInput& in, uint64_t held, uint64_t staging) {
  if (held == 0) return;
  if (in.frozen_base_from_files || in.frozen_weights_on_nvme) {
    Add(e.pageable_host, "weights.nf4_staging", staging, kHostPageBytes);
  } else {
    Add(e.pageable_host, "weights.nf4", held, kHostPageBytes);
  }
}

ParamCounts CountParams(const LayerSpec& layer) {
  ParamCounts c;
  for (const ParamSpec& p : layer.params) {
    if (!p.tied_to.empty()) continue;
    if (p.nf4) {
      c.nf4_bytes += p.host_bytes();
      continue;
    }
    (p.trainable ? c.trainable : c.frozen) += uint64_t(p.numel());
  }
  return c;
}

}  // namespace

uint64_t RoundUp(uint64_t bytes, uint64_t unit) { return (bytes + unit - 1) / unit * unit; }

LayerDeviceBytes DeviceBytesOf(const LayerSpec& layer, DType compute_dtype) {
  // An update's upload copies the trainable tensors' own bytes (DeviceParams' trainable extents),
  // not the alignment between them; the whole slot and the gradients move whole.
  uint64_t trainable = 0;
  for (uint64_t n : DeviceTensorElems(layer, /*trainable_only=*/true)) {
    trainable += n * DTypeSize(compute_dtype);
  }
  const uint64_t weights = LayerWeightBytes(layer, compute_dtype);
  uint64_t master = 0, trainable_master = 0;
  for (const ParamSpec& p : layer.params) {
    master += p.host_bytes();
    if (p.trainable) trainable_master += p.host_bytes();
  }
  return {.weights = weights,
          .trainable_weights = trainable,
          .grads = LayerGradBytes(layer),
          .pack = master + weights,
          .trainable_pack = trainable_master + trainable};
}

uint64_t TierMemory::total() const {
  uint64_t t = 0;
  for (const Allocation& a : allocations) t += a.bytes;
  return t;
}

uint64_t TierMemory::bytes_of(std::string_view name) const {
  uint64_t t = 0;
  for (const Allocation& a : allocations) t += a.name == name ? a.bytes : 0;
  return t;
}

uint64_t OpScratchBytes(const ModelConfig& model, const LayerSpec& layer, BatchShape micro_batch,
                        DType compute_dtype, ScratchTarget target) {
  const int64_t n = micro_batch.tokens();
  const OpTarget t = OpsTarget(target);
  uint64_t most = 0;
  if (layer.kind == LayerKind::kHead) {
    const int64_t chunk = std::min(kLossChunkTokens, n);
    // A frozen head weight (LoRA) gets no dW: the loss op skips it and its scratch.
    bool head_trainable = false;
    for (const ParamSpec& p : layer.params) {
      if (p.name == "lm_head.weight") head_trainable = p.trainable;
    }
    const std::optional<DType> dw_dtype =
        head_trainable ? std::optional<DType>(DType::kF32) : std::nullopt;
    most = LmHeadLossScratchBytes(t, chunk, model.vocab_size, model.hidden_size, compute_dtype,
                                  dw_dtype, /*backward=*/true);
  } else if (layer.kind == LayerKind::kBlock) {
    most = BlockScratchBytes(model, layer, micro_batch, compute_dtype, t);  // as the blocks take it
  }
  return RoundUp(most, kArenaAlignment);
}

uint64_t KvCacheBytes(const ModelConfig& model, const std::vector<LayerRange>& stages, int gpus,
                      int device, int64_t positions) {
  uint64_t blocks = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (GenerationDevice(s, gpus) == device) blocks += uint64_t(stages[s].size());
  }
  return blocks * 2 * uint64_t(positions) * uint64_t(model.kv_dim()) * kF32;
}

uint64_t KeptActivationBytes(const ModelConfig& model, const LoraConfig& lora, int64_t tokens,
                             DType compute_dtype) {
  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, lora, compute_dtype);
  const uint64_t act = DTypeSize(compute_dtype);
  uint64_t saved = 0;
  for (size_t i = 1; i + 1 < layers.size(); ++i) {
    saved = std::max(saved, SavedSlotBytes(model, layers[i], tokens, compute_dtype));
  }
  return RoundUp(uint64_t(tokens * model.hidden_size) * act, kArenaAlignment) +
         RoundUp(saved, kArenaAlignment);
}

uint64_t RowLayoutSlotBytes(int64_t tokens) {
  return RoundUp(uint64_t(tokens) * 4, kArenaAlignment);
}

int64_t KeptBlocksPerDevice(const std::vector<LayerRange>& stages, int gpus) {
  assert(gpus <= 2);
  std::vector<int64_t> blocks(size_t(std::max(gpus, 1)), 0);
  for (size_t s = 0; s < stages.size(); ++s) blocks[s % blocks.size()] += stages[s].size();
  return *std::max_element(blocks.begin(), blocks.end());
}

MemoryEstimate ComputeMemory(const MemoryPlanInput& in) {
  const std::vector<LayerSpec> layers = BuildLayerSpecs(in.model, in.lora, in.compute_dtype);
  assert(in.recompute.size() == layers.size());
  const int head = int(layers.size()) - 1;
  const DType cd = in.compute_dtype;
  const uint64_t act = DTypeSize(cd);
  const uint64_t m = uint64_t(in.micro_batches);
  const uint64_t gpus = uint64_t(in.gpus);
  const uint64_t hidden = uint64_t(in.micro_batch.tokens() * in.model.hidden_size) * act;

  // Per-stage weights and gradients; the head is a stage of its own (the fused
  // tail).
  std::vector<LayerRange> gpu_stages = in.stages;
  gpu_stages.push_back({head, head + 1});
  // Each layer range's host mirrors (the pinned upload copy and gradient landing buffer) hold
  // the device layout, summed over the ranges.
  uint64_t stage_weights = 0, stage_grads = 0, upload_mirrors = 0, landing = 0;
  for (const LayerRange& s : gpu_stages) {
    uint64_t w = 0, g = 0, w_host = 0;
    for (int i = s.first; i < s.last; ++i) {
      const LayerSpec& l = layers[size_t(i)];
      w += LayerWeightBytes(l, cd);
      // Frozen weights streamed from NVMe: no mirror per range; the staging images hold the
      // trainable tensors too.
      if (!in.frozen_weights_on_nvme) w_host += LayerWeightBytes(l, cd);
      g += LayerGradBytes(l);
    }
    stage_weights = std::max(stage_weights, w);
    stage_grads = std::max(stage_grads, g);
    upload_mirrors += w_host;
    // The tail's parts after the first land their gradients apart (MemoryPlanInput::tail_parts).
    landing += g * uint64_t(s.first == head ? std::max(in.tail_parts, 1) : 1);
  }
  uint64_t saved_set = 0, scratch = 0, work = 0;
  const int64_t tokens = in.micro_batch.tokens();
  for (int i = 1; i <= head; ++i) {
    saved_set =
        std::max<uint64_t>(saved_set, SavedSlotBytes(in.model, layers[size_t(i)], tokens, cd));
    if (in.forward_only && i == head) {
      // A loss-only head (HeadMode::kForwardOnly): its workspace holds the targets alone.
      work = std::max<uint64_t>(
          work, HeadBuffersOf(in.model, tokens, cd, HeadMode::kForwardOnly).workspace);
      scratch = std::max<uint64_t>(
          scratch,
          RoundUp(LmHeadLossScratchBytes(OpsTarget(in.scratch), std::min(kLossChunkTokens, tokens),
                                         in.model.vocab_size, in.model.hidden_size, cd,
                                         std::nullopt, /*backward=*/false),
                  kArenaAlignment));
      continue;
    }
    work = std::max(work, WorkspaceBytes(in.model, layers[size_t(i)], tokens, cd));
    scratch = std::max(scratch,
                       OpScratchBytes(in.model, layers[size_t(i)], in.micro_batch, cd, in.scratch));
  }

  MemoryEstimate e;
  const uint64_t A = kArenaAlignment;
  const bool keep = in.keep_activations && !in.forward_only;
  Add(e.gpu, "weights.slot0", stage_weights, A);
  Add(e.gpu, "weights.slot1", stage_weights, A);
  if (!in.forward_only) {
    Add(e.gpu, "grads.accum", stage_grads, A);
    if (in.grad_accumulators > 1) Add(e.gpu, "grads.accum1", stage_grads, A);
  }
  // Forward stages and the tail rotate three hidden buffers. Backward stages rotate the residual
  // gradient through three (with two micro-batches or more: the next one's dY uploads while this
  // one computes and its dX downloads) and alternate their layer inputs between two more,
  // unless the inputs stay on the device (then the gradients take the three).
  const int hidden_buffers = in.forward_only || keep ? 3 : m >= 2 ? 5 : 4;
  for (int k = 0; k < hidden_buffers; ++k) {
    Add(e.gpu, "hidden." + std::to_string(k), hidden, A);
  }
  if (keep) {
    Add(e.gpu, "saved.slot0", SavedSlotBytes(in.model, layers[size_t(head)], tokens, cd), A);
    Add(e.gpu, "activations.keep",
        m * uint64_t(KeptBlocksPerDevice(in.stages, in.gpus)) *
            KeptActivationBytes(in.model, in.lora, tokens, in.compute_dtype),
        A);
  } else {
    Add(e.gpu, "saved.slot0", saved_set, A);
    Add(e.gpu, "saved.slot1", saved_set, A);
  }
  Add(e.gpu, "grad.work", work, A);
  Add(e.gpu, "scratch", scratch, A);
  // RoPE position ids (i32 per token) and RoPE's inverse-frequency table (f32, head_dim / 2:
  // plain or Llama 3-scaled) for models without learned positions (GPT-2 adds its position table
  // on the host). Packed-document ids (i32 per token) for every model: attention never crosses a
  // document boundary (all one id when rows are not packed).
  // Two of each with two micro-batches or more (micro-batch m's in slot m % 2, aligned), so the
  // next micro-batch's upload does not wait for this one's compute.
  const uint64_t layout = std::min<uint64_t>(m, 2) * RowLayoutSlotBytes(tokens);
  if (!in.model.learned_positions) {
    Add(e.gpu, "positions", layout, A);
    Add(e.gpu, "rope.inv_freq", uint64_t(in.model.head_dim / 2) * 4, A);
  }
  Add(e.gpu, "doc_ids", layout, A);
  Add(e.gpu, std::string(kLibraryWorkspace),
      ScratchReportsFor(OpsTarget(in.scratch).kind).library_workspace, A);
  const bool generate = in.forward_only && in.generate_positions > 0;
  const uint64_t logits = generate ? uint64_t(in.logit_rows * in.model.vocab_size) * kF32 : 0;
  if (generate) {
    uint64_t kv = 0;  // every device gets the same map: the busiest device's cache
    for (int d = 0; d < in.gpus; ++d) {
      kv = std::max(kv, KvCacheBytes(in.model, in.stages, in.gpus, d, in.generate_positions));
    }
    Add(e.gpu, "kv_cache", kv, A);
    Add(e.gpu, "logits", logits, A);
  }

  // Host and NVMe.
  const uint64_t P = kHostPageBytes;
  uint64_t upload_frozen_nvme = 0;
  uint64_t largest_read = 0;  // the largest weight a streamed base reads (files or copy)
  const StreamedBaseSource streamed{.from_files = in.frozen_base_from_files,
                                    .files = in.model.weights_dtype,
                                    .upload = in.compute_dtype};
  ParamCounts params;
  uint64_t embedding_frozen_copy = 0;
  // A frozen embedding held in fp32 (a seeded model's, not tied): it stays on the host when the
  // rest of the base goes to NVMe.
  uint64_t embedding_frozen_fp32 = 0;
  uint64_t optimizer_slots = 0;  // two versioned slots per layer with trainable parameters
  uint64_t largest_slot = 0;
  // QLoRA's base from the model's files is made into NF4 as each stage is packed, one weight at a
  // time: its fp32 values and its NF4 form, for the largest weight.
  uint64_t nf4_staging = 0;
  for (int i = 0; i <= head; ++i) {
    const LayerSpec& l = layers[size_t(i)];
    const ParamCounts c = CountParams(l);
    if (c.trainable > 0) {
      const uint64_t slot = VersionedSlotBytes(3 * c.trainable * kF32);
      optimizer_slots += 2 * slot;
      largest_slot = std::max(largest_slot, slot);
    }
    params.trainable += c.trainable;
    params.frozen += c.frozen;
    params.nf4_bytes += c.nf4_bytes;
    for (const ParamSpec& p : l.params) {
      if (p.nf4) nf4_staging = std::max(nf4_staging, uint64_t(p.numel()) * kF32 + p.host_bytes());
      const uint64_t bytes = uint64_t(p.numel()) * act;
      // Served from the model's files: a frozen base weight, and forward only (evaluation and
      // generation train nothing) every base weight; NF4 ones: AddNf4Base.
      const bool served = in.frozen_base_from_files && p.tied_to.empty() && !p.nf4 && !p.lora &&
                          (!p.trainable || in.forward_only);
      if (l.kind == LayerKind::kEmbedding) {
        // The gather runs on the host: an embedding served from the model's file reads its
        // mapped table there, in the file's dtype; else a frozen one keeps one compute-dtype copy
        // (the head's upload copy when tied); a trainable one gathers from its fp32 master.
        if (served) {
          embedding_frozen_copy += uint64_t(p.numel()) * DTypeSize(in.model.weights_dtype);
          params.from_files += uint64_t(p.numel());
        } else if (!p.trainable && !in.model.tie_word_embeddings) {
          embedding_frozen_copy += bytes;
          embedding_frozen_fp32 += uint64_t(p.numel()) * kF32;
        }
        continue;
      }
      if (served) params.from_files += uint64_t(p.numel());
      // The model's files are the NVMe copy of a weight they serve; else a converted one.
      if (!p.trainable && in.frozen_weights_on_nvme) {
        const uint64_t stored = streamed.StoredBytes(p);
        if (!streamed.FromFiles(p)) upload_frozen_nvme += RoundUp(stored, kConvertedBaseAlign);
        largest_read = std::max(largest_read, stored);
      }
    }
  }
  Add(e.pinned_host, "weights.upload", upload_mirrors, P);
  if (in.frozen_weights_on_nvme) {
    Add(e.pinned_host, "weights.nvme_staging", 2 * gpus * stage_weights, P);
    Add(e.nvme, "weights.frozen", upload_frozen_nvme, kNvmeBlockBytes);
    Add(e.pageable_host, "weights.base_read", BaseReadBufferBytes(largest_read), P);
  }
  if (!in.forward_only) Add(e.pinned_host, "grads.landing", landing, P);
  // Every layer's input; a block's saved set (a whole slot's layout) unless recomputed; the
  // head's set never leaves the device (the fused tail runs its forward and backward at once).
  // Forward only: each stage's input (the tail's included), nothing saved.
  // On NVMe: the stage inputs (the head's included) stay here, where the next stage's device
  // reads them at once; every other layer input and every saved set is an NVMe entry of its own,
  // staged through a device's ring of kNvmeStagingSlots slots of the larger of the two.
  const bool on_nvme = in.activations_on_nvme && !in.forward_only && !keep;
  uint64_t saved_all = 0, nvme_space = 0;
  if (in.forward_only || keep || on_nvme) saved_all = m * hidden * (in.stages.size() + 1);
  // The store's block: 1 MiB, or the largest entry's pages when smaller.
  const uint64_t block =
      std::min(kActivationBlockBytes, RoundUp(std::max(hidden, saved_set), kNvmeBlockBytes));
  if (on_nvme) {
    e.nvme_activation_block_bytes = block;
    auto entry = [&](uint64_t bytes) {
      nvme_space += m * RoundUp(bytes, block);
      e.nvme_activation_step_bytes += m * RoundUp(bytes, kNvmeBlockBytes);
    };
    for (int i = 1; i < head; ++i) {
      if (std::none_of(in.stages.begin(), in.stages.end(),
                       [&](const LayerRange& s) { return s.first == i; })) {
        entry(hidden);
      }
      if (!in.recompute[size_t(i)]) entry(saved_set);
    }
    nvme_space += 2 * gpus * RoundUp(std::max(hidden, saved_set), block);
  } else if (!in.forward_only && !keep) {
    for (int i = 1; i <= head; ++i) {
      saved_all += m * (hidden + (i == head || in.recompute[size_t(i)] ? 0 : saved_set));
    }
  }
  Add(e.pinned_host, "activations.saved", saved_all, P);
  if (on_nvme) {
    Add(e.pinned_host, "activations.staging",
        gpus * kNvmeStagingSlots * RoundUp(std::max(hidden, saved_set), P), P);
    Add(e.nvme, "activations.saved", nvme_space, block);
    Add(e.pageable_host, "activations.store", kActivationQueueDepth * block, P);
  }
  if (!in.forward_only) Add(e.pinned_host, "activations.grad", m * hidden, P);
  // Per micro-batch and token: positions and document ids, targets (i32, uploaded) and the
  // per-token loss (fp32, downloaded); RoPE's table, uploaded once.
  Add(e.pinned_host, "batch.io", m * uint64_t(in.micro_batch.tokens()) * 16, P);
  if (!in.model.learned_positions) {
    Add(e.pinned_host, "rope.inv_freq", uint64_t(in.model.head_dim / 2) * 4, P);
  }
  Add(e.pinned_host, "logits", logits, P);
  // The embedding's fp32 gather (and gradient) on the host when the compute dtype is not f32:
  // the executor converts through it, one micro-batch at a time.
  if (in.compute_dtype != DType::kF32) {
    Add(e.pageable_host, "activations.embedding",
        uint64_t(in.micro_batch.tokens() * in.model.hidden_size) * kF32, P);
  }

  if (in.forward_only) {
    // The fp32 weights the host packs each stage's upload from (and gathers the embedding from).
    Add(e.pageable_host, "weights.master",
        (params.trainable + params.frozen - params.from_files) * kF32, P);
    AddNf4Base(e, in, params.nf4_bytes, nf4_staging);
    Add(e.pageable_host, "weights.embedding", embedding_frozen_copy, P);
    Add(e.pageable_host, "data.rows", in.data_bytes, P);
    return e;
  }
  const uint64_t master = params.trainable * kF32;
  if (in.optimizer_on_nvme) {
    // Each layer's master weights and moments as one record in two versioned slots
    // (offload/versioned_store.h): every step reads one slot of each and writes the other.
    Add(e.nvme, "optimizer.slots", optimizer_slots, kNvmeBlockBytes);
    // The Trainer still keeps the trainable fp32 weights in RAM, where each stage's upload is
    // packed from (engine/train/trainer.h): the slots hold a second copy.
    Add(e.pageable_host, "weights.master", master, P);
  } else {
    Add(e.pageable_host, "optimizer.master", master, P);
    Add(e.pageable_host, "optimizer.moments", 2 * master, P);
  }
  // With optimizer state on NVMe the update streams it through two staging buffers of the
  // largest layer's slot (VersionedStore: one layer updated while the next one is read).
  if (in.optimizer_on_nvme) Add(e.pageable_host, "optimizer.staging", 2 * largest_slot, P);
  Add(e.pageable_host, "grads.update", master, P);
  Add(e.pageable_host, "data.rows", in.data_bytes, P);
  Add(e.pageable_host, "weights.embedding", embedding_frozen_copy, P);
  // The frozen base (LoRA) in fp32, which each stage's upload is packed from, unless the plan
  // serves it from NVMe or the model's files serve it (packed into the upload mirrors straight
  // from there); QLoRA's block projections as NF4 codes and quant state instead, at their real
  // size.
  Add(e.pageable_host, "weights.frozen",
      in.frozen_weights_on_nvme ? embedding_frozen_fp32
                                : (params.frozen - params.from_files) * kF32,
      P);
  AddNf4Base(e, in, params.nf4_bytes, nf4_staging);
  return e;
}

}  // namespace ferry::plan
