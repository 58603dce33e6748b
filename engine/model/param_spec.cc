#include "engine/model/param_spec.h"

#include <algorithm>
#include <cassert>

#include "engine/model/device_params.h"
#include "engine/model/head.h"
#include "engine/model/model_stack.h"
#include "engine/model/tensor_carver.h"
#include "kernels/nf4.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/gemm.h"

namespace ferry {
namespace {

bool HasLora(const LoraConfig& lora, const BlockLinear& l) {
  return lora.enabled() && (lora.targets & l.lora_bits) != 0;
}

// Specs for the weights of one module; `trainable` is false for base weights under LoRA.
class SpecBuilder {
 public:
  SpecBuilder(std::vector<ParamSpec>* out, DType dtype, bool trainable)
      : out_(out), dtype_(dtype), trainable_(trainable) {}

  void Vector(std::string name, int64_t n) {
    out_->push_back({std::move(name), {n}, dtype_, trainable_, /*decays=*/false, "", false, false});
  }
  void Matrix(std::string name, int64_t rows, int64_t cols, bool transposed = false) {
    out_->push_back({std::move(name),
                     {rows, cols},
                     dtype_,
                     trainable_,
                     /*decays=*/true,
                     "",
                     transposed,
                     false});
  }
  // Projection `l` of the block whose parameters start with `prefix`: part `part` of `parts` of
  // its fused projection (BlockLinear::fused), if any.
  void Projection(const std::string& prefix, const BlockLinear& l, const LoraConfig& lora, int part,
                  int parts) {
    const std::string module = prefix + l.module;
    const size_t first = out_->size();
    if (l.transposed) {
      Matrix(module + ".weight", l.in, l.out, /*transposed=*/true);
    } else {
      Matrix(module + ".weight", l.out, l.in);
      // The frozen base weight in NF4: QLoRA, or a quantized model run as it is (GPT-2's Conv1D
      // is refused by ValidateJobShape and LoadModelFolder).
      if (lora.quantize == BaseQuant::kNf4) {
        out_->back().nf4 = true;
        out_->back().nf4_nested = lora.double_quant;
      }
    }
    if (l.bias) Vector(module + ".bias", l.out);
    if (HasLora(lora, l)) {
      const std::string peft = std::string(kPeftPrefix) + module;
      out_->push_back(
          {peft + ".lora_A.weight", {lora.rank, l.in}, dtype_, true, true, "", false, true});
      out_->push_back(
          {peft + ".lora_B.weight", {l.out, lora.rank}, dtype_, true, true, "", false, true});
    }
    if (l.fused.empty()) return;
    for (size_t i = first; i < out_->size(); ++i) {
      ParamSpec& p = (*out_)[i];
      p.fused_module = prefix + l.fused;
      p.fused_part = part;
      p.fused_parts = parts;
    }
  }

 private:
  std::vector<ParamSpec>* out_;
  DType dtype_;
  bool trainable_;
};

LayerSpec EmbeddingLayer(const ModelConfig& c, bool trainable, DType dtype) {
  LayerSpec l{LayerKind::kEmbedding, -1, "embedding", {}};
  SpecBuilder b(&l.params, dtype, trainable);
  const FamilyNames& n = NamesOf(c);
  b.Matrix(n.token_table, c.vocab_size, c.hidden_size);
  if (!n.position_table.empty()) {
    b.Matrix(n.position_table, c.max_position_embeddings, c.hidden_size);
  }
  return l;
}

LayerSpec BlockLayer(const ModelConfig& c, const LoraConfig& lora, int64_t i, DType dtype) {
  LayerSpec l{LayerKind::kBlock, i, "block." + std::to_string(i), {}};
  SpecBuilder b(&l.params, dtype, !lora.base_frozen());
  const std::string p = BlockPrefix(c, i);
  const BlockParams block = BlockParamsOf(c);
  for (const BlockParams::Entry& e : block.entries) {
    if (e.vector.empty()) {
      const BlockLinear& linear = block.linears[e.linear];
      int part = 0, parts = 0;
      for (size_t k = 0; k < block.linears.size(); ++k) {
        if (linear.fused.empty() || block.linears[k].fused != linear.fused) continue;
        part += k < e.linear ? 1 : 0;
        ++parts;
      }
      b.Projection(p, linear, lora, part, std::max(parts, 1));
    } else {
      b.Vector(p + e.vector, e.length);
    }
  }
  return l;
}

LayerSpec HeadLayer(const ModelConfig& c, bool trainable, DType dtype) {
  LayerSpec l{LayerKind::kHead, -1, "head", {}};
  SpecBuilder b(&l.params, dtype, trainable);
  const FamilyNames& n = NamesOf(c);
  b.Vector(n.final_norm_weight, c.hidden_size);
  if (!n.final_norm_bias.empty()) b.Vector(n.final_norm_bias, c.hidden_size);
  b.Matrix(n.lm_head, c.vocab_size, c.hidden_size);
  if (c.tie_word_embeddings) l.params.back().tied_to = n.token_table;
  return l;
}

}  // namespace

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t ParamSpec::bytes() const {
  return nf4 ? Nf4DeviceBytes(numel(), nf4_nested) : size_t(numel()) * DTypeSize(dtype);
}

size_t ParamSpec::host_bytes() const {
  return nf4 ? Nf4StoredBytes(numel(), nf4_nested) : size_t(numel()) * sizeof(float);
}

std::vector<size_t> Nf4DeviceTensorBytes(int64_t numel, bool nested) {
  const int64_t blocks = (numel + kNf4Block - 1) / kNf4Block;
  if (!nested) return {size_t((numel + 1) / 2), size_t(blocks) * sizeof(float), 16 * sizeof(float)};
  const int64_t groups = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
  return {size_t((numel + 1) / 2),        size_t(blocks),      16 * sizeof(float),
          size_t(groups) * sizeof(float), 256 * sizeof(float), sizeof(float)};
}

size_t Nf4DeviceBytes(int64_t numel, bool nested) {
  size_t sum = 0;
  for (size_t b : Nf4DeviceTensorBytes(numel, nested)) sum += b;
  return sum;
}

size_t BlockDequantBytes(const LayerSpec& layer, DType compute) {
  int64_t most = 0;
  for (const ParamSpec& p : layer.params) {
    if (!p.nf4 || p.fused_part > 0) continue;
    most = std::max(most, p.numel() * p.fused_parts);  // a fused projection dequantizes as one
  }
  const size_t bytes = size_t(most) * DTypeSize(compute);
  constexpr size_t kAlign = TensorCarver::kAlignment;  // as the blocks carve it
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

std::vector<LayerSpec> BuildLayerSpecs(const ModelConfig& c, const LoraConfig& lora,
                                       DType param_dtype) {
  assert(ValidateModelConfig(c).ok() && ValidateLoraConfig(lora).ok());
  const bool full = !lora.base_frozen();
  std::vector<LayerSpec> layers;
  layers.reserve(size_t(c.num_layers) + 2);
  layers.push_back(EmbeddingLayer(c, full, param_dtype));
  for (int64_t i = 0; i < c.num_layers; ++i) layers.push_back(BlockLayer(c, lora, i, param_dtype));
  layers.push_back(HeadLayer(c, full, param_dtype));
  return layers;
}

LayerCost ComputeLayerCost(const ModelConfig& c, const LoraConfig& lora, const LayerSpec& layer,
                           BatchShape shape, DType activation_dtype) {
  const size_t a = DTypeSize(activation_dtype);
  const double n = double(shape.tokens());
  const int64_t tokens = shape.tokens();
  const size_t hidden_bytes = size_t(tokens * c.hidden_size) * a;
  LayerCost cost;
  switch (layer.kind) {
    case LayerKind::kEmbedding:
      cost.input_bytes = size_t(tokens) * sizeof(int32_t);  // token ids (and positions)
      cost.output_bytes = hidden_bytes;
      return cost;  // a gather and a scatter-add on the host: no FLOPs counted
    case LayerKind::kHead: {
      const double gemm = 2.0 * n * double(c.hidden_size) * double(c.vocab_size);
      const bool trainable = !lora.base_frozen();
      cost.forward_flops = gemm;
      cost.backward_flops = gemm + (trainable ? gemm : 0.0);
      cost.input_bytes = hidden_bytes;
      // The normed input, norm statistics and per-token loss, as the head lays them out.
      cost.saved_bytes =
          HeadBuffersOf(c, tokens, activation_dtype, HeadMode::kTrain).saved_unaligned;
      cost.output_bytes = size_t(tokens) * 4;
      return cost;
    }
    case LayerKind::kBlock:
      break;
  }
  for (const BlockLinear& l : BlockParamsOf(c).linears) {
    const double gemm = 2.0 * n * double(l.in) * double(l.out);
    cost.forward_flops += gemm;
    cost.backward_flops += gemm + (lora.base_frozen() ? 0.0 : gemm);  // dX, and dW when trainable
    if (HasLora(lora, l)) {
      const double low_rank = 2.0 * n * double(lora.rank) * double(l.in + l.out);
      cost.forward_flops += low_rank;
      cost.backward_flops += 2.0 * low_rank;  // dA, dB and the input gradient through A and B
    }
  }
  // Causal attention: per sequence and head, T(T+1)/2 (query, key) pairs, each 2*head_dim FLOPs
  // for Q K^T and 2*head_dim for P V; the backward's four products cost twice the forward.
  const double pairs = double(shape.batch) * double(c.num_heads) * double(shape.seq_len) *
                       double(shape.seq_len + 1) / 2.0;
  cost.forward_flops += 4.0 * double(c.head_dim) * pairs;
  cost.backward_flops += 8.0 * double(c.head_dim) * pairs;
  cost.input_bytes = hidden_bytes;
  // What a block keeps for its backward beyond its input: its saved slot's tensors, as the
  // blocks lay them out (engine/model/decoder_block.cc, gpt2_block.cc).
  cost.saved_bytes = BlockBuffersOf(c, layer, tokens, activation_dtype).saved_unaligned;
  cost.output_bytes = hidden_bytes;
  return cost;
}

int64_t CountParameters(const std::vector<LayerSpec>& layers) {
  int64_t n = 0;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty()) n += p.numel();
    }
  }
  return n;
}

int64_t CountTrainableParameters(const std::vector<LayerSpec>& layers) {
  int64_t n = 0;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty() && p.trainable) n += p.numel();
    }
  }
  return n;
}

std::vector<int64_t> LoraGroupRanks(const LayerSpec& layer) {
  constexpr std::string_view kA = ".lora_A.weight";
  std::vector<std::pair<std::string, int64_t>> groups;  // in the order of their first adapter
  for (const ParamSpec& p : layer.params) {
    if (!p.lora || !p.name.ends_with(kA)) continue;
    const std::string group = LoraGroupOf(p);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == group; });
    if (it == groups.end()) it = groups.insert(groups.end(), {group, 0});
    it->second += p.shape[0];
  }
  std::vector<int64_t> ranks;
  for (const auto& [group, rank] : groups) ranks.push_back(rank);
  return ranks;
}

size_t BlockScratchBytes(const ModelConfig& c, const LayerSpec& layer, BatchShape shape,
                         DType compute, OpTarget t) {
  if (layer.kind != LayerKind::kBlock) return 0;
  const int64_t n = shape.tokens();
  const GemmDTypes act{compute, compute, compute};
  const GemmDTypes grad{compute, compute, DType::kF32};  // parameter gradients are fp32
  int64_t rank = 0;  // the widest LoRA group's: a CPU GEMM's scratch grows with each dimension
  for (int64_t r : LoraGroupRanks(layer)) rank = std::max(rank, r);
  size_t most = 0;
  auto gemm = [&](int64_t m, int64_t nn, int64_t k, GemmDTypes dt) {
    most = std::max(most, GemmScratchBytes(t, m, nn, k, dt));
  };
  for (const ParamSpec& p : layer.params) {
    if (p.shape.size() != 2 || p.lora) continue;
    // (out, in) as the GEMM sees it (GPT-2's Conv1D weights are stored (in, out)); a fused
    // projection's parts (a Llama MLP's gate_proj and up_proj) run as one product.
    if (p.fused_part > 0) continue;
    const int64_t out = (p.transposed ? p.shape[1] : p.shape[0]) * p.fused_parts;
    const int64_t in = p.transposed ? p.shape[0] : p.shape[1];
    gemm(n, out, in, act);                    // y = x W^T
    gemm(n, in, out, act);                    // dx (+)= dy W
    if (p.trainable) gemm(out, in, n, grad);  // dW += dy^T x
    if (rank == 0) continue;
    gemm(n, rank, in, act);    // u = x A^T
    gemm(n, out, rank, act);   // y += s u B^T
    gemm(out, rank, n, grad);  // dB += s dy^T u
    gemm(n, rank, out, act);   // du (+)= s dy B
    gemm(rank, in, n, grad);   // dA += du^T x
    gemm(n, in, rank, act);    // dx += du A
  }
  const AttentionShape attention{shape.batch,    shape.seq_len, c.num_heads,
                                 c.num_kv_heads, c.head_dim,    shape.max_documents};
  return BlockDequantBytes(layer, compute) + std::max(most, AttentionScratchBytes(t, attention));
}

}  // namespace ferry
