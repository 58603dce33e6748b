// ModelStack: the one builder of a model's layers, over the one description of each model family.
//
// A family (ModelConfig::family) is described once, by its block file (decoder_blocks.h's
// FamilyDescription): the Hugging Face names of the tensors a driver addresses by name (the
// embedding tables, the final norm, the block prefix, the buffers a checkpoint may carry), its
// blocks, their parameters in Hugging Face order (BlockParamsOf) and their buffers' bytes
// (BlockBuffersOf). This file serves every driver from it. Parameter specs
// and FLOPs (param_spec.h), the memory model, PEFT's adapter_config.json and the folder loader
// take what they need from here; every driver that puts the model on a device (the pipeline
// executor, the Generator, the layer probe) builds its blocks and head with BuildDeviceStack and
// finds the host embedding tables with FindHostEmbedding / FindHostEmbeddingGrads, so none of them
// switches on the family. Adding a family means its block file, which describes it whole
// (decoder_blocks.h's FamilyDescription: names, blocks, parameters, buffers), a case in FamilyOf
// (model_stack.cc), and its config.json schema (model_config.cc).
//
// Stateless functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/decoder_blocks.h"
#include "engine/model/device_params.h"
#include "engine/model/embedding.h"
#include "engine/model/head.h"
#include "engine/model/host_tensors.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/model/tensor_carver.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry {

const FamilyNames& NamesOf(ModelFamily family);
inline const FamilyNames& NamesOf(const ModelConfig& c) { return NamesOf(c.family); }
// Ok when `c`'s family holds its block projections stored as `quantize` says (kNone always);
// InvalidArgument saying which families can, and why this one cannot, otherwise. Callers add what
// the user should do.
Status CheckBaseQuant(const ModelConfig& c, BaseQuant quantize);
// The model types whose block projections NF4 can hold, as messages list them: "llama, mistral,
// qwen2 and qwen3".
std::string Nf4ModelTypes();

// The prefix of block `block`'s parameters, e.g. "model.layers.3.".
std::string BlockPrefix(const ModelConfig& c, int64_t block);

// The family's block parameters and projections (names under the block prefix).
BlockParams BlockParamsOf(const ModelConfig& c);
// The bytes of the buffers `layer`'s blocks allocate at `tokens` tokens with activations in
// `act` (its LoRA groups read from the layer's adapters). REQUIRES: layer.kind is kBlock.
BlockBufferBytes BlockBuffersOf(const ModelConfig& c, const LayerSpec& layer, int64_t tokens,
                                DType act);

// PEFT's view of the family's projections. A projection's module name is its shortest path
// suffix no other projection of the block shares ("q_proj"; GPT-2's "c_attn", "attn.c_proj").
// The names adapter_config.json's target_modules lists for `targets` (LoraTarget bits), sorted.
std::vector<std::string> PeftTargetModules(const ModelConfig& c, uint32_t targets);
// adapter_config.json's fan_in_fan_out: the projections store (in, out) (GPT-2's Conv1D).
bool PeftFanInFanOut(const ModelConfig& c);
// The LoraTarget bits of the projections a target_modules entry names, as PEFT matches a target
// (the module path equals it or ends with "." + it; a longer path names the same projection).
// InvalidArgument when it names none.
Result<uint32_t> PeftTargetBits(const ModelConfig& c, std::string_view module);

// The embedding's shape: V x C tokens, and P learned positions when the model has them.
EmbeddingShape EmbeddingShapeOf(const ModelConfig& c);

// The host embedding tables of `weights` (the gather runs on the host: engine/model/embedding.h):
// fp32 master tables, or tables served from the model's file. The tables view `weights`,
// which must outlive them.
struct HostEmbedding {
  EmbeddingShape shape = {};
  EmbeddingTable wte = {};  // (V, C)
  EmbeddingTable wpe = {};  // (P, C), or empty without learned positions
  // out (N, C) = the gather of `tokens` (+ `positions`' rows of wpe); errors as EmbeddingForward.
  Status Forward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                 std::span<float> out) const {
    return EmbeddingForward(shape, wte, wpe, tokens, positions, out);
  }
  // The gather stored in `dtype` (f32 or bf16/f16, rounded to nearest even), as the first
  // block's input travels to a device: `out` holds N x C values of `dtype`. The gather runs in
  // fp32 into `f32` (N x C, the caller's, so nothing is allocated per micro-batch; unused when
  // dtype is f32). Errors as Forward.
  Status ForwardAs(std::span<const int32_t> tokens, std::span<const int32_t> positions, DType dtype,
                   std::span<std::byte> out, std::span<float> f32) const;
};
// Errors: InvalidArgument naming a table `weights` lacks or holds with the wrong size.
Result<HostEmbedding> FindHostEmbedding(const ModelConfig& c, const HostTensors& weights);

// The gradients of the host embedding tables in `grads` (which must outlive them).
struct HostEmbeddingGrads {
  EmbeddingShape shape = {};
  std::span<float> dwte = {}, dwpe = {};
  // dwte, dwpe += the scatter-add of dout (N, C) (EmbeddingBackward).
  void Backward(std::span<const float> dout, std::span<const int32_t> tokens,
                std::span<const int32_t> positions) const {
    EmbeddingBackward(shape, dout, tokens, positions, dwte, dwpe);
  }
  // Backward of `dout` stored in `dtype` (N x C values, as a device downloads the first block's
  // input gradient): converted to fp32 in `f32` (N x C, the caller's; unused when dtype is f32),
  // then scatter-added.
  void BackwardFrom(DType dtype, std::span<const std::byte> dout, std::span<float> f32,
                    std::span<const int32_t> tokens, std::span<const int32_t> positions) const;
};
// Errors: InvalidArgument naming a table `grads` lacks or holds with the wrong size.
Result<HostEmbeddingGrads> FindHostEmbeddingGrads(const ModelConfig& c, HostTensors& grads);

// The blocks of ctx.config's family (its FamilyDescription's create_blocks).
Result<std::unique_ptr<DecoderBlocks>> CreateDecoderBlocks(const BlocksContext& ctx);

// What BuildDeviceStack builds over a DeviceParams.
struct StackOptions {
  BatchShape shape;                             // micro-batch B x T
  BlocksInputs inputs = {};                     // the caller's positions, doc ids, RoPE table
  bool blocks = true;                           // build the decoder blocks (the params hold them)
  int num_slots = 1;                            // saved-activation slots of the blocks
  int64_t first_block = 0;                      // the first block the params hold
  KvCache* kv_cache = nullptr;                  // generation (forward only); null for training
  std::optional<HeadMode> head = std::nullopt;  // build the head in this mode (the params hold it)
  int64_t loss_chunk_tokens = 256;              // the head's fused LM-head chunk
  CarveSource* source = nullptr;  // planned regions instead of arena blocks (engine/exec)
};

// A model's layers on one device, over the DeviceParams they were built with (which must outlive
// them): the decoder blocks and/or the head, either null when not asked for.
struct DeviceStack {
  std::unique_ptr<DecoderBlocks> blocks;
  std::unique_ptr<Head> head;
};

// Builds the blocks (first) and the head that `o` asks for, allocating their buffers (arena blocks
// named as decoder_blocks.h and head.h say, or regions of o.source). Errors: those of the blocks'
// and the head's creation (OutOfMemory naming the buffer).
Result<DeviceStack> BuildDeviceStack(Device& d, const ModelConfig& c, const DeviceParams& params,
                                     const StackOptions& o);

}  // namespace ferry
