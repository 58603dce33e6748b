// DeviceParams: the device copy of a model's block and head parameters (in the compute dtype) and
// their gradients (fp32), and the moves between it and the host master copy (HostTensors, fp32,
// master layout).
//
// Layout: one arena allocation "params.weights" and one "params.grads"
// (trainable parameters only; frozen LoRA base weights get none). Two layouts
// serve the kernels directly:
//  - the parts of a fused projection (ParamSpec::fused_module, as the family's BlockLinear::fused
//    says: a Llama block's gate_proj and up_proj) are one tensor (weights, biases, gradients),
//    part 0's rows first, so gate and up are one (2I, C) GEMM whose output is SwiGLU's
//    [gate | up] input;
//  - LoRA adapters are packed per group of projections that share an input and one output
//    tensor (a fused projection's parts; any other projection alone): A of the group is the
//    adapters' A stacked (R, in), B is block-diagonal (out, R) with zeros elsewhere, so
//    u = x A^T (N, R) and y += s u B^T are single GEMMs. The zeros' gradients are computed and
//    dropped when unpacking.
// The embedding tables stay on the host (the gather runs there): they are not
// in this table. A tied head weight is uploaded from its owner's master copy,
// and its gradient is added to the owner's.
//
// Upload and download go through host-pool mirrors of the two allocations
// (kernels/host_memory.h) on the device's upload/download streams, ordered with
// the compute stream by events.
//
// Ownership: owns its buffers and mirrors; must be destroyed before the device.
// Thread-safety: one host thread at a time.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/host_tensors.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/model/tensor_carver.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/device.h"
#include "kernels/host_memory.h"

namespace ferry {

class BaseFileReader;

struct DeviceParam {
  Tensor w;             // master-layout shape
  Tensor grad;          // same shape; null data when frozen
  size_t w_offset = 0;  // byte offsets in the weights / grads allocation
  size_t g_offset = 0;
  std::string host_name;   // HostTensors key (the owner's name for a tied parameter)
  bool trainable = false;  // the optimizer updates it (a LoRA job's base weights are frozen)
  // An NF4 weight (ParamSpec::nf4) as it sits in "params.weights": packed codes, absmax and the
  // 16-entry code, and when nested (ParamSpec::nf4_nested, as the host holds it) the nested
  // absmax, code and offset (the tensors Nf4DeviceTensorBytes counts, in its order). Such a
  // parameter's `w` has the dequantized shape and dtype but null data: the blocks dequantize
  // `nf4` into their scratch for each product. The fused gate_up holds gate's part, then up's.
  struct Nf4Part {
    // Indexed by Nf4Slot (param_spec.h); the nested three are null when not nested.
    std::array<Tensor, 6> t;
    std::array<size_t, 6> offset{};  // in "params.weights"
    int64_t rows = 0;                // of the dequantized weight (master layout)
    bool nested() const { return !t[Nf4Slot::kNestedOffset].data.is_null(); }
  };
  std::vector<Nf4Part> nf4;
  // The whole of a fused projection (ParamSpec::fused_module), over its parts' tensors: packed
  // and downloaded through them, never itself.
  bool fused = false;
};

// The projection group LoRA A or B parameter `adapter` belongs to, without PEFT's prefix: the
// fused projection its module is a part of (ParamSpec::fused_module: a Llama MLP's gate_proj and
// up_proj, "…mlp.gate_up_proj"), else its module alone ("…self_attn.q_proj").
std::string LoraGroupOf(const ParamSpec& adapter);

// The LoRA adapters of one projection group, packed.
struct LoraPack {
  struct Adapter {
    std::string a_name, b_name;  // PEFT names: A (r, in), B (out_m, r)
    int64_t row = 0;             // first output row of this adapter in the group's output
    int64_t rows = 0;            // out_m
    int64_t col = 0;             // first of its r columns in u
  };
  std::vector<Adapter> adapters;
  int64_t in = 0, out = 0,
          rank = 0;  // per-adapter rank r; R = rank * adapters.size()
  float scaling = 1;
  Tensor a, b;    // (R, in), (out, R)
  Tensor da, db;  // gradients, same shapes (accumulated +=)
  size_t a_offset = 0, b_offset = 0, da_offset = 0, db_offset = 0;
  int64_t total_rank() const { return rank * int64_t(adapters.size()); }
};

// Whether DeviceParams allocates gradient buffers: inference (Generator, a runner built for
// evaluation) needs none.
enum class ParamGrads { kAllocate, kNone };

// A step that overwrites the host gradients instead of adding to them
// (MicroBatchInput::overwrite_grads), over one or more DownloadAndAddGrads
// calls (one per pipeline stage, engine/exec): each call stores the first
// gradient that reaches a tensor and adds the rest; ZeroUnwritten, after the
// last call, zeroes the tensors no call reached. The result equals zeroing
// `grads` first and adding (0 + g == g).
struct GradOverwrite {
  std::set<std::string> written;  // host tensors this step has written

  // Zeroes every tensor of `grads` not written yet and counts it written.
  void ZeroUnwritten(HostTensors& grads);
};

// The host mirrors of a DeviceParams' two allocations (upload staging for the weights, landing
// for the gradients). A caller that builds DeviceParams for the same layers again and again (the
// pipeline executor: a stage's parameters on whichever device runs it this step) hands the same
// HostMirrors to each. Its spans may be set by the caller (the executor carves them from its
// pinned host-pool blocks, sized with DeviceParams::Measure) and are then borrowed; a span that
// is empty or too small is replaced by a mapping of DeviceParams' own (owned_*), made once, by
// the first, and borrowed after. `mapped` counts those mappings.
struct HostMirrors {
  HostSpan weights, grads;                    // what the copies read and fill
  HostAllocation owned_weights, owned_grads;  // mapped here when no span was given
  int64_t mapped = 0;
};

class DeviceParams {
 public:
  DeviceParams() = default;
  DeviceParams(DeviceParams&&) = default;
  DeviceParams& operator=(DeviceParams&&) = default;

  // Plans and allocates weights and gradients of the block and head layers among `layers` (all
  // of a model's, or a pipeline stage's). With a `source` the two are regions it hands out for
  // "params.weights" and "params.grads" instead of arena blocks (engine/exec; not owned).
  // With ParamGrads::kNone nothing is allocated for gradients (every DeviceParam::grad and
  // LoraPack::da/db is null; ZeroGrads and DownloadAndAddGrads do nothing).
  // `dtype`: the storage (compute) dtype of the weights on the device, f32, bf16 or f16: Upload
  // rounds the fp32 master to it (to nearest even). Gradients are fp32 whatever it is (as the
  // memory model counts them: engine/plan/memory_model.cc, LayerGradBytes).
  // `mirrors`: host mirrors shared with other DeviceParams of the same layers (see HostMirrors);
  // null: its own. Mirrors too small for these layers are (re)mapped.
  static Result<DeviceParams> Create(Device& d, const ModelConfig& c, const LoraConfig& lora,
                                     const std::vector<LayerSpec>& layers,
                                     CarveSource* source = nullptr,
                                     ParamGrads grads = ParamGrads::kAllocate,
                                     DType dtype = DType::kF32,
                                     std::shared_ptr<HostMirrors> mirrors = nullptr);
  // The bytes Create gives "params.weights" and "params.grads" for these layers (what their host
  // mirrors hold), without a device: a caller sizes the mirrors before any DeviceParams exists.
  struct Bytes {
    size_t weights = 0, grads = 0;
    size_t trainable_weights = 0;  // of `weights`: what UploadTrainableWeights copies in all
  };
  static Result<Bytes> Measure(const ModelConfig& c, const LoraConfig& lora,
                               const std::vector<LayerSpec>& layers, DType dtype = DType::kF32);
  // The weights' storage dtype: the blocks and the head keep their activations in it.
  DType dtype() const { return dtype_; }
  // The block and head layers these params hold (as given to Create).
  const std::vector<LayerSpec>& layers() const { return layers_; }

  // The parameter of that Hugging Face name (or a fused
  // "…mlp.gate_up_proj.weight|bias"). REQUIRES: it exists.
  const DeviceParam& at(const std::string& name) const { return params_.at(name); }
  bool has(const std::string& name) const { return params_.count(name) != 0; }
  // The LoRA group for a projection module (e.g.
  // "model.layers.0.self_attn.q_proj" or "model.layers.0.mlp.gate_up_proj");
  // null when it has no adapter.
  const LoraPack* lora(const std::string& module) const {
    auto it = lora_.find(module);
    return it == lora_.end() ? nullptr : &it->second;
  }

  // Copies every device parameter from `weights` (blocks until the copy
  // completes). Errors: NotFound naming a missing tensor, InvalidArgument
  // naming one of the wrong size.
  Status Upload(Device& d, const HostTensors& weights);
  // Zeroes the gradients on the compute stream.
  Status ZeroGrads(Device& d);
  // Waits for the compute stream, downloads the gradients and adds them (+=)
  // into `grads`; with `overwrite`, the first gradient to reach a tensor of
  // `grads` this step is stored (=) instead (see GradOverwrite). The host-side
  // pass runs on `pool` (nullptr: inline).
  Status DownloadAndAddGrads(Device& d, HostTensors& grads, GradOverwrite* overwrite = nullptr,
                             ThreadPool* pool = nullptr);

  // The two halves of Upload and of DownloadAndAddGrads, for a caller that orders the copies
  // with the compute stream itself and never blocks on them (engine/exec: a stage's weights are
  // prefetched in chunks while another stage computes; its gradients are added once they land).
  // PackWeights fills the host mirror from `weights` (errors as Upload), converting to the
  // device dtype on `pool`'s threads when one is given; UploadWeights enqueues
  // the copy of mirror bytes [offset, offset + bytes) on the upload stream. DownloadGrads enqueues
  // the gradients' copy into the host mirror on the download stream; AddGrads, once that copy has
  // completed, adds (or stores) them into `grads` as DownloadAndAddGrads does. The mirrors must
  // not be repacked, nor this object destroyed, while a copy enqueued here may still run.
  // `trainable_only`: the mirror's frozen tensors are already packed from the same values; only
  // the trainable ones (and the LoRA packs) are written. `keep_served`: so are the tensors served
  // from the model's files (HostTensors::files and nf4_served: a file's view never changes), not
  // written again. `reader`: the tensors whose place in a file is known (HostTensors::files with
  // an offset, nf4_served's parts_file: the model's files, the converted copy) are read from the
  // drive through it (a base streamed every step) rather than from their mappings.
  Status PackWeights(const HostTensors& weights, ThreadPool* pool = nullptr,
                     bool trainable_only = false, bool keep_served = false,
                     BaseFileReader* reader = nullptr);
  size_t weights_bytes() const { return weights_bytes_; }
  size_t grads_bytes() const { return grads_bytes_; }
  // Whether any packed weight is trainable (a LoRA stage's adapters; none in a frozen head).
  bool has_trainable_weights() const { return !trainable_extents_.empty(); }
  Status UploadWeights(Device& d, size_t offset, size_t bytes);
  // Enqueues, as UploadWeights, the copy of the trainable ranges (trainable_extents_) that lie
  // in [offset, offset + bytes) only, for a slot that holds these layers' frozen weights already
  // (packed from the same master copy). Returns the bytes copied.
  Result<size_t> UploadTrainableWeights(Device& d, size_t offset, size_t bytes);
  Status DownloadGrads(Device& d);
  Status AddGrads(HostTensors& grads, GradOverwrite* overwrite = nullptr,
                  ThreadPool* pool = nullptr);

 private:
  // Create without the mirrors; with d == nullptr (Measure) only the sizes are computed.
  static Result<DeviceParams> Lay(Device* d, const ModelConfig& c, const LoraConfig& lora,
                                  const std::vector<LayerSpec>& layers, CarveSource* source,
                                  ParamGrads grads, DType dtype);
  std::map<std::string, DeviceParam> params_;
  std::map<std::string, LoraPack> lora_;
  DeviceBuffer weights_, grads_;  // empty with a CarveSource
  DevicePtr<std::byte> weights_data_, grads_data_;
  size_t weights_bytes_ = 0, grads_bytes_ = 0;
  // The byte ranges [begin, end) of "params.weights" that hold trainable weights (LoRA adapters,
  // and every weight in full fine-tuning), ascending and merged: what changes from one update to
  // the next.
  std::vector<std::pair<size_t, size_t>> trainable_extents_;
  std::shared_ptr<HostMirrors> mirrors_;  // never null after Create
  DType dtype_ = DType::kF32;
  std::vector<LayerSpec> layers_;
};

}  // namespace ferry
