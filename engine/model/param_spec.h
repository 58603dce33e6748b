// The model as a flat sequence of layers — embedding, N decoder blocks, head (final norm +
// LM head + loss) — with, for each layer, its parameters (Hugging Face names and shapes, tied and
// frozen ones marked, which ones decay), its FLOPs and the bytes it keeps for backward.
//
// Everything here is a pure function of ModelConfig + LoraConfig + batch shape: the planner sizes
// a plan from it before anything is allocated. The bytes a layer keeps for backward come from the
// layer code's own layouts (model_stack.h's BlockBuffersOf, head.h's HeadBuffersOf), so what is
// planned and what is allocated cannot drift apart.
//
// Plain value types; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "kernels/dtype.h"
#include "kernels/ops/op_target.h"

namespace ferry {

enum class LayerKind { kEmbedding, kBlock, kHead };

// What PEFT puts before a module's name in a LoRA adapter's tensor names
// ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
inline constexpr std::string_view kPeftPrefix = "base_model.model.";

struct ParamSpec {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as stored in Hugging Face checkpoints
  DType dtype = DType::kF32;   // storage dtype of the copy a device computes with
  bool trainable =
      true;            // false: frozen (LoRA or NF4 base weight): no gradient, no optimizer state
  bool decays = true;  // AdamW weight decay applies (matrices yes; norms and biases no)
  // Non-empty: this is the same tensor as the parameter of that name (owned by the embedding
  // layer): it has no storage, gradient buffer or optimizer state of its own, and its gradient is
  // added to the owner's on the host before the update.
  std::string tied_to;
  // The name the host keeps this parameter's values under (HostTensors): its own, or its owner's.
  const std::string& storage_name() const { return tied_to.empty() ? name : tied_to; }
  bool transposed = false;  // stored (in, out) (GPT-2 Conv1D); the GEMM wants (out, in)
  bool lora = false;        // a LoRA A or B matrix (PEFT adapter name)
  // A frozen base projection weight stored in NF4 (LoraConfig::quantize, kernels/nf4.h): the
  // host tiers hold its packed codes and quant state (double-quantized when nf4_nested), the
  // device Nf4DeviceBytes (nested as the host), and the blocks dequantize it into their scratch
  // for each product.
  bool nf4 = false;
  bool nf4_nested = false;
  // One part of a projection the device runs fused (BlockLinear::fused), set on the part's
  // weight, bias and LoRA A/B: the fused module's full name, without PEFT's prefix
  // ("model.layers.0.mlp.gate_up_proj"), this part's index (its rows follow the earlier parts')
  // and the number of parts. Empty, 0, 1: a tensor of its own.
  std::string fused_module = {};
  int fused_part = 0;
  int fused_parts = 1;

  int64_t numel() const;
  // The bytes of the copy a device computes with (NF4: Nf4DeviceBytes).
  size_t bytes() const;
  // The bytes the host keeps of a frozen parameter: fp32, or NF4's packed codes and quant state.
  size_t host_bytes() const;
};

// The tensors an NF4 weight of `numel` elements occupies on a device, in this order (Nf4Slot):
// packed codes (u8, (numel + 1) / 2), absmax (one per block of kNf4Block: f32, or nested u8
// indices) and the 16-entry code (f32); nested, then also the nested absmax (f32, one per
// kNf4NestedBlock blocks), the 256-entry nested code (f32) and the offset (f32). As the host tiers
// hold it, so the upload is the stored bytes (4.127 bits a weight nested, 4.5 not) plus the maps.
// DeviceParams lays them out this way and the memory model counts them from this.
struct Nf4Slot {
  enum : size_t { kPacked, kAbsmax, kCode, kNestedAbsmax, kNestedCode, kNestedOffset };
};
std::vector<size_t> Nf4DeviceTensorBytes(int64_t numel, bool nested);
size_t Nf4DeviceBytes(int64_t numel, bool nested);  // their sum (unaligned)

struct LayerSpec {
  LayerKind kind = LayerKind::kBlock;
  int64_t block = -1;  // decoder block index, -1 for embedding and head
  std::string name;    // "embedding", "block.3", "head"
  std::vector<ParamSpec> params;
};

struct BatchShape {
  int64_t batch = 1;    // sequences in one micro-batch (B)
  int64_t seq_len = 1;  // tokens per sequence (T)
  // The most documents one micro-batch holds, its sequences together (packed data: a row's
  // pieces and its padding each count; AttentionShape::max_documents sizes the CUDA attention's
  // graph and scratch by it); 0: one per sequence.
  int64_t max_documents = 0;
  int64_t tokens() const { return batch * seq_len; }
};

// What one layer costs for one micro-batch.
struct LayerCost {
  // Algorithmic FLOPs (a multiply-add is 2): matrix products and attention's two products over
  // the causal (i >= j) pairs; element-wise work and recomputation are not counted. Backward
  // counts the input-gradient products, plus the weight-gradient products of trainable weights
  // only (a frozen base weight under LoRA has no weight-gradient GEMM).
  double forward_flops = 0;
  double backward_flops = 0;
  // Bytes of the layer's input (the hidden state, or the token ids for the embedding): what
  // recomputation keeps.
  size_t input_bytes = 0;
  // Bytes the forward keeps, beyond the input, for the backward when the layer is not
  // recomputed (activations in the activation dtype, per-row statistics in fp32).
  size_t saved_bytes = 0;
  // Bytes of the layer's output (the hidden state passed to the next layer; the head's is the
  // per-token loss, fp32).
  size_t output_bytes = 0;
};

// One linear projection of a decoder block, as its family describes it (engine/model/model_stack.h,
// BlockParamsOf): parameter specs, FLOPs and PEFT's module names are all derived from this list,
// so they cannot disagree.
struct BlockLinear {
  std::string module;  // Hugging Face module path under the block's prefix, e.g. "self_attn.q_proj"
  int64_t in = 0;
  int64_t out = 0;
  bool bias = false;
  uint32_t lora_bits = 0;   // LoraTarget bits that select this projection
  bool transposed = false;  // stored (in, out): GPT-2's Conv1D
  // The fused projection the device runs it as one part of: its module under the block prefix,
  // shared by adjacent linears of one shape, whose rows it stacks in their order (a Llama MLP's
  // gate_proj and up_proj: "mlp.gate_up_proj", gate's rows first; two parts at most). Empty: a
  // projection of its own.
  std::string fused = {};
};

// A decoder block's parameters in Hugging Face order: each entry a vector (a norm's weight or bias,
// named under the block's prefix) or one of `linears` (its weight, bias and LoRA adapters).
struct BlockParams {
  struct Entry {
    std::string vector;  // e.g. "input_layernorm.weight"; empty for a projection
    int64_t length = 0;  // the vector's length
    size_t linear = 0;   // the projection's index in `linears` when `vector` is empty
  };
  std::vector<BlockLinear> linears;
  std::vector<Entry> entries;
};

// The parameters of the model `c`: the base trainable unless lora.base_frozen(), LoRA A/B when
// lora is enabled, Llama-family block projection weights nf4 when lora.quantize is kNf4 (with or
// without LoRA). REQUIRES: ValidateModelConfig(c) and ValidateLoraConfig(lora) are ok.
std::vector<LayerSpec> BuildLayerSpecs(const ModelConfig& c, const LoraConfig& lora,
                                       DType param_dtype = DType::kF32);

LayerCost ComputeLayerCost(const ModelConfig& c, const LoraConfig& lora, const LayerSpec& layer,
                           BatchShape shape, DType activation_dtype = DType::kF32);

// The total rank R of each LoRA projection group of a layer, as DeviceParams packs them
// (engine/model/device_params.h): a fused projection's parts (gate_proj and up_proj) share one
// group (their ranks add), every other adapted projection is a group of its own. Empty without
// LoRA.
std::vector<int64_t> LoraGroupRanks(const LayerSpec& layer);

// The scratch bytes the ops of a decoder block need at micro-batch `shape` with activations in
// `compute` on a device of target `t`: the largest of its GEMMs (y = x W^T and dx = dy W of every
// projection, dW = dy^T x of a trainable one; each LoRA group's six products, at the widest
// group's rank) and of attention. One figure for the blocks' scratch buffer ("blocks.scratch",
// engine/model/block_base.h) and the memory model's ("scratch"), so a plan counts exactly what the
// blocks take. 0 for the embedding and the head (the head's fused loss op sizes its own).
size_t BlockScratchBytes(const ModelConfig& c, const LayerSpec& layer, BatchShape shape,
                         DType compute, OpTarget t);
// The part of BlockScratchBytes that holds an NF4 weight dequantized for a product (the widest
// quantized projection of the layer, the fused gate_up counted whole, in `compute`; aligned to the
// arena's alignment): 0 without NF4. The blocks carve it first and give the GEMMs the rest.
size_t BlockDequantBytes(const LayerSpec& layer, DType compute);

// Parameter counts over all layers; tied aliases count once (as transformers' num_parameters()).
int64_t CountParameters(const std::vector<LayerSpec>& layers);
int64_t CountTrainableParameters(const std::vector<LayerSpec>& layers);

}  // namespace ferry
