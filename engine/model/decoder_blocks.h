// DecoderBlocks: the N decoder blocks of one model family on one device, as
// explicit forward and backward functions over buffers planned when they are
// created (no autograd tape).
//
// Saved activations live in "slots": one arena allocation per slot
// ("blocks.saved.<slot>"), each holding exactly what one block's backward needs
// beyond its input (its family's layout; model_stack.h's BlockBuffersOf counts it). A block that is
// not recomputed has a slot of its own; blocks marked for recomputation share one slot, and the
// caller re-runs Forward into it just before Backward. One workspace ("blocks.workspace") holds the
// temporaries of every block's forward and backward, and "blocks.scratch" the attention op's
// scratch.
//
// Accumulation: Backward writes the input gradient dx (=) and accumulates (+=)
// the gradients of trainable parameters (DeviceParams); frozen weights get
// none.
//
// Ownership: owns its buffers; refers to the DeviceParams and position tensor
// it was created with, which must outlive it. Thread-safety: one host thread at
// a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/device_params.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/model/tensor_carver.h"
#include "kernels/device.h"

namespace ferry {

// The keys and values of every block for generation (engine/model/generator.h): when a
// BlocksContext carries one, a block's attention appends the step's new keys and values at rows
// [length, length + N) of its block's cache and attends over rows [0, length + N) instead of over
// the step alone (kernels/ops/decode_attention.h); the batch must then be one sequence and the
// positions must be length, length + 1, ... The owner advances `length` after all blocks ran.
// Forward only: Backward is undefined on blocks created with a cache.
struct KvCache {
  std::vector<Tensor> k, v;  // per block: f32 (capacity, Hkv*D), after RoPE for k
  int64_t capacity = 0;      // rows of each tensor
  int64_t length = 0;        // rows filled by the steps before the one in flight
};

struct BlocksContext {
  Device* device = nullptr;
  const ModelConfig* config = nullptr;
  const DeviceParams* params = nullptr;
  BatchShape shape;
  int num_slots = 1;
  Tensor positions;             // i32 (N): RoPE position of each token (Llama family only)
  Tensor doc_ids;               // i32 (N): packed-document id of each token (attention never
                                // crosses a change of id within a sequence; ops/attention.h)
  Tensor inv_freq;              // f32 (head_dim / 2): RoPE inverse frequencies (RopeInvFreq)
  KvCache* kv_cache = nullptr;  // forward-only generation with a cache; null for training
  // Optional: regions for "blocks.saved.<slot>", "blocks.workspace" and "blocks.scratch" (the
  // attention scratch) instead of arena blocks of those names (engine/exec). Not owned.
  CarveSource* source = nullptr;
  // The first block `params` holds (a pipeline stage's params hold a range of blocks).
  int64_t first_block = 0;
};

class DecoderBlocks {
 public:
  virtual ~DecoderBlocks() = default;
  // y (N, C) = block `block`(x (N, C)), saving its activations in `slot`.
  virtual Status Forward(int64_t block, int slot, Tensor x, Tensor y) = 0;
  // dx (=) from dy, parameter gradients (+=). REQUIRES: the last Forward into
  // `slot` was this block's, on this x. dx must not alias x or dy.
  virtual Status Backward(int64_t block, int slot, Tensor x, Tensor dy, Tensor dx) = 0;
  // The row layout the calls from now on read (BlocksContext::positions and doc_ids, the same
  // shapes): a caller that uploads the next micro-batch's layout while this one computes keeps
  // two and switches between them. Kernels already enqueued keep the tensors they were given.
  virtual void SetRowLayout(Tensor positions, Tensor doc_ids) = 0;
};

// What a family's buffer layouts depend on. One layout per family serves both the blocks, which
// carve their saved slots and workspace by it, and whoever sizes them without building them (the
// memory model, the planner's LayerCost), through model_stack.h's BlockBuffersOf.
struct BlockBufferArgs {
  const ModelConfig* config = nullptr;
  int64_t tokens = 0;       // N of the micro-batch
  DType act = DType::kF32;  // activations and their gradients; statistics stay f32
  // The total rank of the LoRA group a module of the block belongs to, as DeviceParams packs it
  // ("self_attn.q_proj", "mlp.gate_up_proj"); 0 when the module is not adapted.
  std::function<int64_t(std::string_view module)> lora_rank = nullptr;
};

// The bytes of a family's block buffers, as the blocks allocate them.
struct BlockBufferBytes {
  size_t saved = 0;            // one saved slot, each tensor aligned (TensorCarver)
  size_t saved_unaligned = 0;  // the same tensors without alignment (LayerCost::saved_bytes)
  size_t workspace = 0;        // the family's temporaries, LoRA's du and the sink
};

// The Hugging Face names of one family's tensors outside the decoder blocks.
struct FamilyNames {
  std::string token_table;     // (V, C): "model.embed_tokens.weight", GPT-2 "transformer.wte…"
  std::string position_table;  // (P, C) learned positions (GPT-2 "transformer.wpe.weight"), or ""
  std::string final_norm_weight;  // "model.norm.weight", GPT-2 "transformer.ln_f.weight"
  std::string final_norm_bias;    // GPT-2 "transformer.ln_f.bias", or "" (RMSNorm has none)
  std::string block_prefix;       // "model.layers.", GPT-2 "transformer.h."
  std::string lm_head;            // "lm_head.weight"
  // The prefix a checkpoint saved from the bare model leaves out (GPT2Model: "h.0…", "wte.weight"
  // without GPT-2's "transformer."), or "".
  std::string bare_prefix;
  // Endings of buffers transformers keeps out of the parameters, which a checkpoint may hold and
  // the loader ignores (".rotary_emb.inv_freq"; GPT-2's ".attn.bias", ".attn.masked_bias").
  std::vector<std::string> ignored_buffers;
};

// One model family as its block file describes it: its tensors' Hugging Face names, its blocks,
// its block parameters in Hugging Face order (names under the block prefix), its buffers' bytes,
// and why its projections cannot be held in NF4 (nullptr: they can). model_stack.h serves every
// driver from these; config.json's schema of the family is model_config.cc's.
struct FamilyDescription {
  FamilyNames names;
  Result<std::unique_ptr<DecoderBlocks>> (*create_blocks)(const BlocksContext&) = nullptr;
  BlockParams (*block_params)(const ModelConfig&) = nullptr;
  BlockBufferBytes (*buffer_bytes)(const BlockBufferArgs&) = nullptr;
  const char* no_nf4 = nullptr;
};

// Llama family (decoder_block.cc): RMSNorm, q/k/v (+ biases), optional Qwen3 q/k RMSNorm, RoPE,
// GQA attention, o_proj, residual, RMSNorm, fused gate/up, SwiGLU, down, residual.
const FamilyDescription& LlamaFamily();
// GPT-2 (gpt2_block.cc): LayerNorm, fused c_attn with bias, attention, c_proj, residual,
// LayerNorm, c_fc, tanh GELU, c_proj, residual.
const FamilyDescription& Gpt2Family();

// What the caller of the blocks owns and fills for each batch; a tensor stays empty where the
// model (GPT-2: no RoPE) or the caller (generation: no packed rows) has none.
struct BlocksInputs {
  Tensor positions = {};  // i32 (N)
  Tensor doc_ids = {};    // i32 (N)
  Tensor inv_freq = {};   // f32 (head_dim / 2)
};

// (engine/model/model_stack.h builds the blocks of a config's family.)

// The context of `params`' blocks on `device`, reading `inputs`: one slot, no KV cache, arena
// buffers, from block 0; the caller changes those it needs.
inline BlocksContext MakeBlocksContext(Device& device, const ModelConfig& config,
                                       const DeviceParams& params, BatchShape shape,
                                       const BlocksInputs& inputs) {
  return BlocksContext{.device = &device,
                       .config = &config,
                       .params = &params,
                       .shape = shape,
                       .positions = inputs.positions,
                       .doc_ids = inputs.doc_ids,
                       .inv_freq = inputs.inv_freq};
}

// A (n) f32 view of `sink` from element `offset` on (a gradient nobody reads,
// for the frozen weights of ops whose backward always accumulates one; two such
// gradients of one op take disjoint offsets). REQUIRES: sink is f32 and holds
// at least offset + n elements.
inline Tensor SinkView(const Tensor& sink, int64_t n, int64_t offset = 0) {
  Tensor t = sink;
  t.data = sink.data + std::ptrdiff_t(offset * int64_t(sizeof(float)));
  t.shape = Shape{n};
  return t;
}

}  // namespace ferry
