// MemoryModel: the exact byte count of what a plan makes the executor allocate — on each GPU (its
// arena), in pinned and pageable host RAM, and on NVMe — as a named allocation map.
//
// This is the contract the executor obeys (DESIGN.md, "Plan" and "Execution"); it is computed here
// from the model's layer specs, independently of the code that will size the executor's buffers,
// so a test can compare the arena's named allocation log with it.
//
// GPU (every GPU alike; round-robin dispatch gives each GPU stages of every kind, so each arena is
// sized for the largest stage of the plan and holds these buffers for the whole step; nothing is
// allocated inside a step, so the peak moment is the sum):
//   weights.slot0/1     two stage weight buffers (running stage, next stage's upload), each the
//                       largest stage's weights in the compute dtype, tensors at aligned offsets
//                       (a tied head weight is uploaded like any other; a Llama MLP's gate and up
//                       projections are one tensor, their LoRA adapters one packed group with a
//                       block-diagonal B, as engine/model/device_params.h lays them out);
//   grads.accum         fp32 gradient accumulators of the largest stage's trainable weights
//                       (accumulated across micro-batches, downloaded once per stage);
//   grads.accum1        a second set of them with two accumulators (grad_accumulators), one
//                       per weight slot: a device's stages with gradients alternate, so a stage
//                       accumulates while the gradients of the one before it still download;
//   hidden.0..4         five hidden-state buffers (B*T, C): forward stages and the tail rotate
//                       three (a micro-batch's input uploads while the one before computes);
//                       backward rotates the residual gradient through three (0, 2, 4: the
//                       next micro-batch's dY uploads while this one computes and the one
//                       before's dX downloads; two, 0 and 2, with one micro-batch) and a layer's
//                       input through the other two, alternating, so the next layer's input
//                       uploads while this layer computes (forward only, or activations kept on
//                       the device: three, 0..2);
//   saved.slot0/1       two per-layer saved-activation buffers, each the largest layer's saved set
//                       (the tensors ComputeLayerCost::saved_bytes counts, each at an aligned
//                       offset): forward writes layer i's set into one
//                       while layer i-1's set downloads from the other; backward uploads (or
//                       recomputes from the layer's input) a layer's set into one while the other
//                       is consumed. Saved data never stays on a GPU across layers, so whether a
//                       layer is recomputed changes host/NVMe bytes and time, not GPU bytes;
//   grad.work           the backward's temporaries of the largest layer, fp32, carved as the
//                       blocks and the head carve their workspace (activation gradients,
//                       LoRA's du, a frozen-parameter sink; the head: targets, input gradient);
//   scratch             the largest scratch any op of the plan asks for (see OpScratchBytes);
//   positions           RoPE position ids, i32 per token (models without learned positions),
//                       and doc_ids, packed-document ids, i32 per token: two slots each, each
//                       aligned (one with one micro-batch), micro-batch m's in slot m % 2;
//   library.workspace   the device kind's library workspace as kernels/ops/backend.h reports it
//                       (CUDA: cuBLAS/cuBLASLt's, 32 MiB; CPU: none).
// Every allocation is rounded up to the arena alignment (256 bytes, as kernels/arena.h).
//
// Host (HostPool: page-rounded, 4096 bytes). The pinned entries are what the executor takes from
// its host pool, one block per entry carved as listed (engine/exec/pipeline_executor.h), so a
// test compares the pool's peak with their total both ways:
//   pinned   weights.upload: one upload mirror per layer range (each block stage, the head), in
//            the device layout of its weight slot (aligned tensors, gate|up fused, LoRA B
//            block-diagonal), since a mirror is copied into the slot verbatim; none when frozen
//            weights stream from NVMe. (Once counted as the weights' raw bytes, which the slot
//            layout exceeds.)
//            weights.nvme_staging (frozen weights streamed from NVMe): per GPU, two images of the
//            largest range's weights in that layout, which its stages pack in turn (the frozen
//            base read from NVMe, the trainable tensors from the master copy) and upload from.
//            grads.landing: one fp32 gradient mirror per layer range, in the device layout of
//            grads.accum, and the head's once more per tail part after the first. (Once "one
//            stage buffer per GPU": but the host adds a stage's landed gradients only once the
//            whole step is enqueued, in stage order, so a device's next stage cannot reuse its
//            landing buffer within the step; per-GPU landing needs the host to consume each
//            landing while it enqueues, the per-layer optimizer's work.)
//            activations.saved: each layer's input (a hidden buffer) for all micro-batches, and
//            a block's saved set — a whole saved slot's layout, as it is downloaded — unless
//            recomputed; the head's set never leaves the device (the fused tail runs its forward
//            and backward at once), so the head counts its input only. With activations on NVMe
//            only the stage inputs (the head's included) stay here.
//            activations.staging (saved activations on NVMe): per GPU, kNvmeStagingSlots slots of
//            the larger of a hidden buffer and a saved set, page-rounded: two that downloads
//            fill while the disk writes the other, two that the disk reads into while uploads
//            drain the other.
//            activations.grad: one activation gradient (a hidden buffer) per micro-batch. (Once
//            "two stage boundaries": a backward stage reads its input gradient before it writes
//            its output gradient over it, ordered by its device's streams, and the next stage
//            waits for that write, so one buffer per micro-batch serves every boundary.)
//            batch.io: per micro-batch and token, positions and document ids, targets (i32, all
//            uploaded) and the per-token loss (fp32, downloaded): 16 bytes.
//            rope.inv_freq: RoPE's table (models without learned positions), uploaded once.
//   pageable optimizer.master fp32 trainable weights, grads.update (fp32 gradients for the
//            update), optimizer.moments (2 x fp32) for trainable parameters only; optimizer state
//            can move to NVMe (optimizer.slots below), then optimizer.staging (two buffers of
//            the largest layer's slot: one layer updated while the next is read) streams it;
//            weights.embedding: a frozen, untied embedding's compute-dtype copy (the gather runs
//            on the host), or the embedding's tables as mapped from the model's file when the
//            files serve them (frozen_base_from_files); weights.frozen: the frozen base in fp32
//            unless the files serve it (with the base on NVMe: a seeded, untied embedding's
//            only); weights.nf4: QLoRA's NF4 base (codes and quant state) held whole, or
//            weights.nf4_staging when the model's files or NVMe serve it (each weight made into
//            NF4 as its stage is packed: the largest one's fp32 values and NF4 form; the upload
//            mirrors or images hold the base); activations.store (saved activations on NVMe): the
//            store's own bounce buffers, kActivationQueueDepth blocks (mapped by the store, locked
//            when io_uring registers them; the devices never copy from them); weights.base_read
//            (a base streamed from NVMe): the bounce buffer its reads from the drive go through
//            (engine/model/base_reader.h), the model's files or the converted copy; data.rows:
//            the packed dataset's rows (training and validation, PlanJob::data_host_bytes), held
//            for the whole run; activations.embedding (a compute dtype other than f32): the
//            embedding's fp32 gather and gradient for one micro-batch, which the host converts.
// NVMe (4096-byte blocks): whichever groups the plan places there (weights.frozen: the frozen
// base converted to the compute dtype, NF4 weights as packed, written once at the start: none
// when the model's files serve it in that dtype, not NF4: they are its copy; activations.saved,
// optimizer.slots). activations.saved: per micro-batch, every block input that does not start a
// stage and every block's saved set unless recomputed, each an entry of its own in whole blocks
// (MemoryEstimate::nvme_activation_block_bytes), plus two entries per GPU being rewritten (a
// rewrite takes new blocks and frees the old ones when it completes; each GPU has two in flight); a
// step writes and reads each entry once (MemoryEstimate::nvme_activation_step_bytes).
// optimizer.slots: per layer with trainable parameters, its fp32 master weights and both moments
// (12 bytes a parameter) as one record kept in two versioned slots, each VersionedSlotBytes
// (offload/versioned_store.h: a header, 4096-byte blocks); a step reads one slot of every layer and
// writes the other, half the allocation each way.
//
// Pure functions of value types; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/param_spec.h"
#include "kernels/dtype.h"

namespace ferry::plan {

inline constexpr uint64_t kArenaAlignment = 256;   // kernels/arena.h, CpuDeviceOptions
inline constexpr uint64_t kHostPageBytes = 4096;   // offload/host_pool.h
inline constexpr uint64_t kNvmeBlockBytes = 4096;  // O_DIRECT block
inline constexpr uint64_t kNvmeStagingSlots = 4;   // per GPU: activations.staging
// The largest block of the saved activations' NVMe store (offload/nvme_store.h: an entry takes
// whole blocks; the last one moves only its 4096-byte pages).
inline constexpr uint64_t kActivationBlockBytes = uint64_t(1) << 20;
// Its blocks in flight, each with a bounce buffer of one block (activations.store).
inline constexpr uint64_t kActivationQueueDepth = 32;
inline constexpr int64_t kLossChunkTokens = 256;  // the head's chunk: StackOptions' default
// The GPU entry of the device kind's library workspace: the device carves it from its own arena
// when it is created (engine/exec/job_device_factory.h), so the executor allocates it no second
// time.
inline constexpr std::string_view kLibraryWorkspace = "library.workspace";

uint64_t RoundUp(uint64_t bytes, uint64_t unit);

// Where a device's op scratch is sized for: a CPU device (scratch depends on
// its thread count) or a CUDA device. The sizes are what the ops layer reports
// for that device kind (kernels/ops/backend.h), as the devices ask for them.
struct ScratchTarget {
  bool cuda = true;
  int cpu_threads = 1;  // CPU devices only
};

// A named buffer, bytes already rounded to its tier's unit.
struct Allocation {
  std::string name;
  uint64_t bytes = 0;
};

struct TierMemory {
  std::vector<Allocation> allocations;
  uint64_t total() const;
  // The bytes of the allocations named `name` (0 when none).
  uint64_t bytes_of(std::string_view name) const;
};

// Layer ranges index BuildLayerSpecs' vector (0 = embedding, 1..N = blocks, N+1
// = head).
struct LayerRange {
  int first = 0;  // inclusive
  int last = 0;   // exclusive
  int size() const { return last - first; }
  bool operator==(const LayerRange&) const = default;
};

struct MemoryPlanInput {
  ModelConfig model;
  LoraConfig lora;
  BatchShape micro_batch;  // one micro-batch
  int micro_batches = 1;
  int gpus = 1;
  // f16 counts the same bytes as bf16: its dynamic loss scaling needs no buffer anywhere (the
  // scale is a scalar the head multiplies its gradients by, the overflow check is the gradient
  // sum of squares the clip norm takes anyway, and unscaling is folded into AdamW's grad_scale on
  // the host; engine/train/loss_scaler.h).
  DType compute_dtype = DType::kBF16;
  std::vector<LayerRange> stages;  // block stages in layer order; the head is the fused tail
  // The tail's micro-batches run in this many parts, each on its device (RoundRobinJob::
  // tail_parts); every part after the first lands its gradients in a buffer of its own, so
  // "grads.landing" holds the head's gradients once per part.
  int tail_parts = 1;
  // Gradient accumulators per device (RoundRobinJob::grad_accumulators): 1, or 2 ("grads.accum1"
  // beside "grads.accum", each the largest stage's).
  int grad_accumulators = 1;
  std::vector<bool> recompute;  // per layer of BuildLayerSpecs (embedding, blocks, head)
  bool activations_on_nvme = false;
  // Each device keeps the input and saved set of every micro-batch of the blocks of its forward
  // stages ("activations.keep": per block and micro-batch, its input then its saved slot, each
  // rounded to kArenaAlignment: KeptActivationBytes; sized for the device with the most:
  // KeptBlocksPerDevice), so no saved activation crosses the host; only stage inputs do
  // ("activations.saved"), as in a forward-only plan. Round-robin on one or two devices runs a
  // backward stage on the device of the forward stage over its layers (their distance in the
  // step, 2 (S - s), is even). "saved.slot0" then holds the head's set alone, and neither
  // "saved.slot1" nor "hidden.3" and "hidden.4" are planned. REQUIRES: gpus <= 2, no layer
  // recomputed, activations not on NVMe.
  bool keep_activations = false;
  bool optimizer_on_nvme = false;       // fp32 master weights and Adam moments
  bool frozen_weights_on_nvme = false;  // LoRA base weights of blocks and head
  // The frozen base (a LoRA job's, but NF4 weights; forward only, the whole base: evaluation and
  // generation train nothing) is served from the model's safetensors files
  // (engine/model/host_tensors.h, FileTensor): packed into the upload mirrors from there, no fp32
  // copy in RAM ("weights.frozen" / "weights.master" leave it out); such an embedding is its
  // mapped table in the file's dtype (ModelConfig::weights_dtype, config.json's torch_dtype, is
  // taken for it; an F64 file, which is read into fp32, is not counted so), "weights.embedding".
  // False: a base made from the seed (`tiny`), held in fp32.
  // The packed data's rows in host RAM (PlanJob::data_host_bytes): pageable "data.rows".
  uint64_t data_bytes = 0;
  bool frozen_base_from_files = false;
  ScratchTarget scratch;
  // Forward only (evaluation, PipelineExecutor::Evaluate on such a plan): nothing only a backward
  // or an update uses: no gradient buffers on the device or the host, no saved activations (only
  // each stage's input crosses the host), three hidden buffers, a loss-only head, no optimizer
  // state; the host holds the fp32 weights ("weights.master": those the model's files do not
  // serve, frozen_base_from_files) instead.
  bool forward_only = false;
  // Generation (forward only, PipelineExecutor::Decode on such a plan): each block's KV cache
  // holds `generate_positions` tokens (prompt and new), f32 (capacity x kv_dim, keys and values),
  // on the device that runs the block's stage (GenerationDevice), in "kv_cache"; the head writes
  // the logits of up to `logit_rows` tokens (f32 x vocab) to "logits", downloaded through the
  // pinned "logits". The micro-batch is the longest step (the prompt): 1 x T. 0: not generation.
  int64_t generate_positions = 0;
  int64_t logit_rows = 1;
};

// The device (of `gpus`) that runs forward stage `stage` of a generation plan, every step, so its
// blocks' KV cache stays there: stage s on device s % gpus, the head on the next one.
inline int GenerationDevice(size_t stage, int gpus) { return int(stage % size_t(gpus)); }

// The bytes of the KV cache `device` holds in a generation plan (MemoryPlanInput): keys and values
// of every block of its stages, f32, `positions` rows of kv_dim each.
uint64_t KvCacheBytes(const ModelConfig& model, const std::vector<LayerRange>& stages, int gpus,
                      int device, int64_t positions);

// The stride of one (block, micro-batch) entry of "activations.keep": the block's input
// (tokens x hidden in `act`-byte elements) and the largest block saved slot, each rounded to
// kArenaAlignment.
uint64_t KeptActivationBytes(const ModelConfig& model, const LoraConfig& lora, int64_t tokens,
                             DType compute_dtype);

// The bytes of one slot of a device's row layout ("positions", "doc_ids": an i32 per token),
// rounded to kArenaAlignment; the plan holds two slots of each (one with one micro-batch).
uint64_t RowLayoutSlotBytes(int64_t tokens);

// The most blocks whose activations one device keeps (MemoryPlanInput::keep_activations): the
// blocks of the forward stages it runs, stage s on device (first + s) mod gpus, whichever device
// the step starts on. REQUIRES: 1 <= gpus <= 2.
int64_t KeptBlocksPerDevice(const std::vector<LayerRange>& stages, int gpus);

// A layer's parameters on a device, as the executor lays them out and moves them (DeviceParams:
// gate and up fused, each LoRA group packed with its block-diagonal B, NF4 weights as stored,
// every tensor at an aligned offset): the weight upload, the part of it an update changes (the
// trainable tensors' own bytes, as UploadTrainableWeights copies them), and the fp32 gradients
// downloaded; and the host memory traffic of packing the weights (DeviceParams::PackWeights: the
// master copy read, fp32 or NF4 as the host keeps it, and the upload mirror written), whole and
// of the trainable tensors only (a LoRA job's steps after the first: the mirror keeps the base).
struct LayerDeviceBytes {
  uint64_t weights = 0;
  uint64_t trainable_weights = 0;
  uint64_t grads = 0;
  uint64_t pack = 0;
  uint64_t trainable_pack = 0;
};
LayerDeviceBytes DeviceBytesOf(const LayerSpec& layer, DType compute_dtype);

struct MemoryEstimate {
  TierMemory gpu;  // per GPU
  TierMemory pinned_host;
  TierMemory pageable_host;
  TierMemory nvme;
  // Saved activations on NVMe: the bytes a step writes, and reads back, of "activations.saved"
  // (each entry rounded up to 4096 bytes, as O_DIRECT moves it); its allocation is the space.
  uint64_t nvme_activation_step_bytes = 0;
  // ... and the block its store is opened with (kActivationBlockBytes, or the largest entry's
  // 4096-byte pages when smaller); 0 when nothing is there.
  uint64_t nvme_activation_block_bytes = 0;
};

// The largest scratch any op of a block (forward and backward GEMMs, attention)
// or the head (fused LM-head + loss, forward-backward) needs for `micro_batch`,
// rounded to kArenaAlignment.
uint64_t OpScratchBytes(const ModelConfig& model, const LayerSpec& layer, BatchShape micro_batch,
                        DType compute_dtype, ScratchTarget target);

// REQUIRES: the model and LoRA configs validate; stages cover blocks 1..N in
// order; recompute.size() == number of layers.
MemoryEstimate ComputeMemory(const MemoryPlanInput& in);

}  // namespace ferry::plan
