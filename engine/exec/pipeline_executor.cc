// PipelineExecutor's implementation (the contract is in pipeline_executor.h).
#include "engine/exec/pipeline_executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "engine/exec/device_timeline.h"
#include "engine/exec/stream_hazards.h"
#include "engine/model/base_reader.h"
#include "engine/model/device_params.h"
#include "engine/model/model_stack.h"
#include "engine/plan/pipeline_schedules.h"
#include "kernels/arena.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/host_memory.h"
#include "offload/host_pool.h"
#include "offload/nvme_store.h"

namespace ferry::exec {
namespace {

// Host memory devices copy to and from (kernels/host_memory.h); exec's HostSpan is a trace span.
using HostMemorySpan = ::ferry::HostSpan;

struct Region {
  DevicePtr<std::byte> data;
  size_t bytes = 0;
};

// The names StreamHazards tracks on every device: the plan buffers that a copy and a kernel may
// both touch, and "layout.0" / "layout.1" for the row layout's two slots ("positions" and
// "doc_ids", written together; micro-batch m's in slot m % 2).
// ("scratch" is compute-only; "rope.inv_freq" is written once, at Create, before any compute.)
constexpr std::string_view kTracked[] = {
    "hidden.0",     "hidden.1",    "hidden.2",      "hidden.3",         "hidden.4",
    "saved.slot0",  "saved.slot1", "weights.slot0", "weights.slot1",    "grads.accum",
    "grad.work",    "layout.0",    "layout.1",      "activations.keep", "keep.input.0",
    "keep.input.1", "logits",      "grads.accum1"};
constexpr std::string_view kHidden[5] = {"hidden.0", "hidden.1", "hidden.2", "hidden.3",
                                         "hidden.4"};
constexpr std::string_view kLayout[2] = {"layout.0", "layout.1"};
// Kept activations: a forward stage's input for micro-batch m, uploaded into its own entry of
// "activations.keep" under name m % 2, so the upload waits for the compute two micro-batches
// back, not for the one before (which never touches that entry). Every other use of the region
// is the compute stream's, and a step ends with every device synchronized.
constexpr std::string_view kKeepInput[2] = {"keep.input.0", "keep.input.1"};
constexpr std::string_view kSaved[2] = {"saved.slot0", "saved.slot1"};
constexpr std::string_view kWeights[2] = {"weights.slot0", "weights.slot1"};
// Appended to the trace names of the next step's first weights, read ahead (StepHooks::
// read_ahead): "PF0 (next step)", "WF0 (next step)".
constexpr std::string_view kNextStep = " (next step)";
// A device's gradient accumulators (plan.grad_accumulators): with two, a stage accumulates in the
// one of its weight slot, so the device's stages with gradients alternate between them.
constexpr std::string_view kGrads[2] = {"grads.accum", "grads.accum1"};

// A transfer to or from the activation store and what it moves, for its error.
struct PendingIo {
  TransferHandle handle;
  std::string what;
  // Waits for it (ok when none); its error names what it moved.
  Status Wait() const {
    if (!handle.valid()) return Status::Ok();
    Status s = handle.Wait();
    return s.ok() ? s : s.WithContext(what);
  }
};

// Three hidden buffers turned over between micro-batches: a micro-batch reads its input from `in`
// and ping-pongs its layers' outputs between `in` and `other`, while `idle` still downloads the
// output of the one before.
struct HiddenRotation {
  int in = 0, other = 1, idle = 2;
  // After a micro-batch whose output is in buffer `out` (`in` or `other`).
  void Next(int out) {
    const int spare = out == in ? other : in;
    in = idle;
    other = spare;
    idle = out;
  }
};

// One device's planned arena blocks, by plan name, and what orders the work on its streams.
struct DeviceState {
  Device* device = nullptr;
  std::vector<DeviceBuffer> buffers;
  std::map<std::string, Region, std::less<>> regions;
  std::map<std::string, size_t, std::less<>> used;  // plan name -> most bytes a component used
  // Each weight slot's contents, (layer range, weights version), while they are whole;
  // {kNone, -1} while none or being overwritten.
  static constexpr size_t kNone = SIZE_MAX;
  std::pair<size_t, int64_t> slot_holds[2] = {{kNone, -1}, {kNone, -1}};
  // Each weight slot's frozen weights, (layer range, the master copy they were packed from),
  // while whole: a LoRA job's base, which no update changes, so a later stage over the same
  // layers packed from the same master copy uploads its trainable weights only.
  std::pair<size_t, const HostTensors*> slot_frozen[2] = {{kNone, nullptr}, {kNone, nullptr}};
  // Generation: the KV cache of the blocks this device runs (plan::GenerationDevice), carved
  // from its "kv_cache" allocation; other blocks' entries are empty.
  KvCache kv;
  StreamHazards hazards;
  // The forward stages' and the tail's hidden buffers (0, 1, 2), turned over from one stage to
  // the next on this device as between micro-batches: a stage's first input uploads into the
  // buffer its device's stage before freed first, not into one its last micro-batch still uses.
  HiddenRotation forward_hidden;
  // The saved-set slot (0 or 1) the forward stages' next block writes: they alternate over the
  // blocks and micro-batches of every forward stage on this device, so a block never computes into
  // the slot whose set is still downloading (also across a stage of one block, or to the next
  // stage).
  int next_saved_slot = 0;
  // Per micro-batch m, recorded on the download stream after each stage's downloads of m: a stage
  // reading them (on any device) waits for its latest record, which covers every earlier copy on
  // this stream.
  std::vector<Event> landed;
  // Per stage of a step (on this device): its gradients are in its host mirror.
  std::vector<Event> grads_landed;
  // Isolated compute (Create's `isolate_compute`): a stage's weights are up, recorded on the
  // upload stream for the compute stream to wait for.
  std::vector<Event> weights_up;
  // A step that reads ahead (StepHooks::read_ahead): recorded on the upload stream after each
  // upload from the first forward stage's host mirror; `first_mirror_read` says a record is
  // outstanding, which packing that mirror for the next step waits for.
  std::vector<Event> first_mirror_free;
  bool first_mirror_read = false;
  // The frozen base streamed from NVMe (plan.frozen_weights there): the device's two pinned
  // stage images ("weights.nvme_staging"), packed in turn by its stages (the frozen base read
  // from the model's files or its converted copy, the trainable tensors from the master copy) and
  // uploaded from there; image_free[k] is recorded on the upload stream after image k's last copy,
  // and image_busy[k] says a record is outstanding, which the next packing of k waits for.
  HostMemorySpan images[2];
  std::vector<Event> image_free;
  bool image_busy[2] = {false, false};
  int next_image = 0;
  // With a trace: times this device's tasks (null without one: then nothing is recorded).
  std::unique_ptr<DeviceTimeline> timeline;
  // For the trace's task names: the stage (its index in the step) and micro-batch (-1: the whole
  // stage) whose work the executor is enqueuing on this device.
  int task_stage = -1, task_micro_batch = -1;
  // Saved activations on NVMe: the device's pinned staging rings, two slots each way. Downloads
  // fill `outgoing` in turn, each then written to the store (the slot's write waited for before
  // its next download); `incoming` takes reads that uploads drain. writes[k] and reads[k] are the
  // slots' transfers in flight, touched only by host functions on the download and upload
  // stream respectively. `fetches` lists the entries of the backward micro-batch being enqueued,
  // in upload order, `fetched` how many of them are enqueued (both the enqueuing thread's).
  HostMemorySpan outgoing[2], incoming[2];
  PendingIo writes[2], reads[2];
  struct ActivationEntry {
    int kind;  // Executor::EntryKind
    size_t layer, micro_batch;
  };
  uint64_t spills = 0;
  std::vector<ActivationEntry> fetches;
  size_t fetched = 0;

  Status TraceBegin(StreamId s) { return timeline ? timeline->Begin(s) : Status::Ok(); }
  // what == 0: the stage's compute (DeviceTimeline::End).
  Status TraceEnd(StreamId s, char what, plan::TaskKind kind, double bytes = 0) {
    if (!timeline) return Status::Ok();
    return timeline->End(s, what, kind, task_stage, task_micro_batch, bytes);
  }

  // The start of plan allocation `name`, counting `bytes` of it as used (the executor's own
  // direct uses; components carve through PlannedSource, which counts theirs).
  DevicePtr<std::byte> Use(const std::string& name, size_t bytes) {
    size_t& u = used[name];
    u = std::max(u, bytes);
    return regions.at(name).data;
  }
  // Hidden buffer k as an (n, c) tensor of the compute dtype.
  Tensor Hidden(int k, int64_t n, int64_t c, DType dtype) {
    return Tensor{Use(std::string(kHidden[k]), size_t(n * c) * DTypeSize(dtype)), dtype,
                  Shape{n, c}};
  }
};

// Places a stage's components into the device's planned blocks (see the header's table).
// Kept activations (plan.keep_activations): where a stage's blocks' saved slots sit in
// "activations.keep": slot k of the stage is entry first + k of the device's (block, micro-batch)
// entries, each `stride` bytes, its input first (`input` bytes) and its saved set after it.
struct KeptSlots {
  size_t first = 0, stride = 0, input = 0;
};

class PlannedSource final : public CarveSource {
 public:
  PlannedSource(DeviceState& ds, int weight_slot, std::string_view grads,
                std::optional<KeptSlots> kept = std::nullopt)
      : ds_(ds), kept_(kept) {
    const std::string w = "weights.slot" + std::to_string(weight_slot);
    map_ = {{"params.weights", w},
            {"params.grads", std::string(grads)},
            {"blocks.saved.0", "saved.slot0"},
            {"blocks.saved.1", "saved.slot1"},
            {"head.saved", "saved.slot0"},
            {"blocks.workspace", "grad.work"},
            {"head.workspace", "grad.work"},
            {"blocks.scratch", "scratch"},
            {"head.scratch", "scratch"}};
  }

  Result<DevicePtr<std::byte>> Region(std::string_view requester, size_t bytes) override {
    constexpr std::string_view kBlockSlot = "blocks.saved.";
    if (kept_ && requester.substr(0, kBlockSlot.size()) == kBlockSlot) {
      const size_t k = std::stoul(std::string(requester.substr(kBlockSlot.size())));
      const size_t at = (kept_->first + k) * kept_->stride + kept_->input;
      const exec::Region r = ds_.regions.at("activations.keep");
      if (bytes > kept_->stride - kept_->input || at + bytes > r.bytes) {
        return Status::OutOfMemory("device '" + ds_.device->name() + "': '" +
                                   std::string(requester) + "' needs " + FormatBytes(bytes) +
                                   " but the plan's 'activations.keep' holds less (the memory "
                                   "model undercounts)");
      }
      ds_.Use("activations.keep", at + bytes);
      return r.data + std::ptrdiff_t(at);
    }
    auto m = map_.find(requester);
    if (m == map_.end()) {
      return Status::NotFound("the plan has no allocation for '" + std::string(requester) + "'");
    }
    auto r = ds_.regions.find(m->second);
    if (r == ds_.regions.end()) {
      if (bytes == 0) return DevicePtr<std::byte>();
      return Status::OutOfMemory("device '" + ds_.device->name() + "': '" + std::string(requester) +
                                 "' needs " + FormatBytes(bytes) + " but the plan has no '" +
                                 m->second + "' allocation");
    }
    if (bytes > r->second.bytes) {
      return Status::OutOfMemory("device '" + ds_.device->name() + "': '" + std::string(requester) +
                                 "' needs " + FormatBytes(bytes) + " but the plan's '" + m->second +
                                 "' holds " + FormatBytes(r->second.bytes) +
                                 " (the memory model undercounts)");
    }
    size_t& used = ds_.used[m->second];
    used = std::max(used, bytes);
    return r->second.data;
  }

 private:
  DeviceState& ds_;
  std::optional<KeptSlots> kept_;
  std::map<std::string, std::string, std::less<>> map_;
};

enum class StageKind { kForward, kTail, kBackward };

// One stage of a step, from the copy of its weights (a prefetch, unless it is its device's first
// stage of the step) to the host's addition of its gradients. It lives until the step ends, so
// its host mirrors outlive every copy that reads or fills them.
struct StageRun {
  StageKind kind = StageKind::kForward;
  plan::LayerRange range;  // layers [first, last); the tail: {head, head + 1}
  int64_t forward = -1;    // a backward stage: the index of the forward stage over its layers
  // The micro-batches it runs, [first, last): a part of the tail its share (plan.tail_parts),
  // every other stage all of the step's.
  size_t first_micro_batch = 0, last_micro_batch = 0;
  int part = -1;      // a tail's part: its index among the step's
  size_t device = 0;  // index into the executor's devices
  int slot = 0;       // its weights go to weights.slot<slot>; with two accumulators, its
                      // gradients to the slot's (kGrads)
  // Kept activations: the entry of its first block's micro-batch 0 in its device's
  // "activations.keep" (a backward stage's are its forward stage's, on the same device).
  size_t kept_first = 0;
  std::unique_ptr<PlannedSource> source;
  std::unique_ptr<DeviceParams> params;   // null until prepared
  std::unique_ptr<DecoderBlocks> blocks;  // forward and backward stages
  std::unique_ptr<Head> head;             // the tail
  bool weights_sent = false;
  int image = -1;  // the frozen base streamed: the device image its weights are packed into
};

// The next stage's weights on a device, sent in `chunks` pieces between the running stage's
// activation uploads (none when the device runs no further stage this step).
struct Prefetch {
  std::optional<size_t> stage;  // its index in the step; prepared with its first chunk
  size_t chunks = 1;
  size_t sent = 0;
  const HostTensors* weights = nullptr;  // the master copy its weights are packed from
};

class Executor final : public PipelineExecutor {
 public:
  Executor(std::vector<Device*> devices, const ModelConfig& c, const plan::Plan& p,
           EnqueueObserver observer, TraceRecorder* trace, HostPool* host_pool,
           NvmeStore* activation_store, bool isolate_compute)
      : isolate_(isolate_compute),
        host_pool_(host_pool),
        store_(activation_store),
        c_(c),
        p_(p),
        lora_(p.job.lora),
        dtype_(p.job.compute_dtype),
        observer_(std::move(observer)),
        trace_(trace) {
    for (Device* d : devices) {
      devices_.emplace_back();
      devices_.back().device = d;
    }
    round_robin_ = plan::StageRoundRobin(int(devices_.size()));
  }

  ~Executor() override {
    SynchronizeAll();
    // A failed stream skips its later host functions: what they would have waited for may still
    // be in flight into or out of the staging, which dies with this executor.
    for (const DeviceState& ds : devices_) {
      for (const PendingIo* io : {&ds.writes[0], &ds.writes[1], &ds.reads[0], &ds.reads[1]}) {
        (void)io->Wait();
      }
    }
    for (const PendingIo& io : written_) (void)io.Wait();
  }

  Status Init() {
    layers_ = BuildLayerSpecs(c_, lora_);
    shape_ = plan::MicroBatchShape(p_.job, p_.micro_batch_size);
    const int64_t N = shape_.tokens(), C = c_.hidden_size;
    const size_t stages = 2 * p_.stages.size() + size_t(std::max(p_.tail_parts, 1));
    const size_t hb = HiddenBytes();
    for (DeviceState& ds : devices_) {
      for (const plan::Allocation& a : p_.memory.gpu.allocations) {
        // The device carves its libraries' workspace (cuBLAS's) from its arena when it is
        // created; the plan's entry counts those bytes, so the arena the plan sizes holds both.
        if (a.name == plan::kLibraryWorkspace) continue;
        FERRY_ASSIGN_OR_RETURN(DeviceBuffer b, ds.device->Allocate(a.bytes, a.name));
        ds.regions[a.name] = {b.data(), a.bytes};
        ds.buffers.push_back(std::move(b));
      }
      for (const char* name : {"hidden.0", "hidden.1", "hidden.2", "hidden.3", "hidden.4",
                               "saved.slot0", "saved.slot1", "weights.slot0", "weights.slot1",
                               "grads.accum", "grad.work", "doc_ids"}) {
        // A forward-only plan has neither gradients nor a backward stage's fourth and fifth
        // buffers; with one micro-batch the residual gradient needs no third (hidden.4).
        const std::string_view n = name;
        if (p_.job.forward_only && (n == "hidden.3" || n == "hidden.4" || n == "grads.accum")) {
          continue;
        }
        if (keep_ && (n == "hidden.3" || n == "hidden.4" || n == "saved.slot1")) continue;
        if (n == "hidden.4" && p_.micro_batches < 2) continue;
        if (!ds.regions.count(name)) {
          return Status::InvalidArgument(std::string("the plan's GPU map lacks '") + name + "'");
        }
      }
      if (accumulators_ > 1 && !ds.regions.count(std::string(kGrads[1]))) {
        return Status::InvalidArgument(
            "the plan has two gradient accumulators per device and its GPU map lacks '" +
            std::string(kGrads[1]) + "'");
      }
      const size_t layout = LayoutStride() * std::min<size_t>(size_t(p_.micro_batches), 2);
      if (ds.regions.at("doc_ids").bytes < layout ||
          (ds.regions.count("positions") && ds.regions.at("positions").bytes < layout)) {
        return Status::InvalidArgument(
            "the plan's row layout buffers (positions, doc_ids) are smaller than " +
            std::to_string(layout) + " bytes");
      }
      if (ds.regions.at("hidden.0").bytes < hb) {
        return Status::InvalidArgument("the plan's hidden buffers are smaller than B*T x C " +
                                       std::string(DTypeName(dtype_)));
      }
      FERRY_ASSIGN_OR_RETURN(ds.hazards, StreamHazards::Create(*ds.device, kTracked));
      FERRY_RETURN_IF_ERROR(CreateEvents(*ds.device, size_t(p_.micro_batches), ds.landed));
      FERRY_RETURN_IF_ERROR(CreateEvents(*ds.device, stages, ds.grads_landed));
      if (isolate_) FERRY_RETURN_IF_ERROR(CreateEvents(*ds.device, 1, ds.weights_up));
      if (!p_.job.forward_only) {
        FERRY_RETURN_IF_ERROR(CreateEvents(*ds.device, 1, ds.first_mirror_free));
      }
      if (stream_base_) FERRY_RETURN_IF_ERROR(CreateEvents(*ds.device, 2, ds.image_free));
      if (trace_ != nullptr) {
        FERRY_ASSIGN_OR_RETURN(
            ds.timeline, DeviceTimeline::Create(*ds.device, int(&ds - devices_.data()),
                                                int(p_.stages.size()), std::max(p_.tail_parts, 1)));
      }
    }
    saved_bytes_ = devices_[0].regions.at("saved.slot0").bytes;
    if (keep_) {
      if (!devices_[0].regions.count("activations.keep")) {
        return Status::InvalidArgument(
            "the plan keeps activations but its GPU map lacks "
            "'activations.keep'");
      }
      kept_stride_ = plan::KeptActivationBytes(c_, lora_, N, dtype_);
      kept_input_ = plan::RoundUp(uint64_t(N * C) * DTypeSize(dtype_), plan::kArenaAlignment);
    }
    if (p_.job.generate_positions > 0) FERRY_RETURN_IF_ERROR(CarveKvCaches());
    // The embedding's fp32 gather and gradient when the compute dtype is not f32 (ForwardAs /
    // BackwardFrom convert through it): host-only, pageable "activations.embedding".
    if (dtype_ != DType::kF32) {
      const uint64_t need = plan::RoundUp(uint64_t(N * C) * sizeof(float), plan::kHostPageBytes);
      if (p_.memory.pageable_host.bytes_of("activations.embedding") < need) {
        return Status::OutOfMemory("the embedding's fp32 gather needs " + FormatBytes(need) +
                                   " of pageable host memory, more than the plan's "
                                   "'activations.embedding' (the memory model undercounts)");
      }
      embed_f32_.resize(size_t(N * C));
    }
    for (size_t r = 0; r <= p_.stages.size(); ++r) {
      mirrors_.push_back(std::make_shared<HostMirrors>());
    }
    // The tail's parts after the first land their gradients apart (their weights are the head
    // range's mirror).
    for (int part = 1; part < p_.tail_parts && !p_.job.forward_only; ++part) {
      tail_landing_.push_back(std::make_shared<HostMirrors>());
    }
    packed_.assign(mirrors_.size(), -1);
    mirror_frozen_.assign(mirrors_.size(), nullptr);
    FERRY_RETURN_IF_ERROR(TakeHostStaging());
    for (const plan::Allocation& a : p_.memory.pageable_host.allocations) {
      if (a.name != "weights.base_read" || !stream_base_ || a.bytes == 0) continue;
      FERRY_ASSIGN_OR_RETURN(BaseFileReader reader, BaseFileReader::Create(a.bytes));
      base_reader_ = std::move(reader);
      if (trace_ != nullptr) base_reader_->set_clock([trace = trace_] { return trace->Now(); });
    }
    if (c_.learned_positions) return Status::Ok();
    // RoPE's inverse frequencies (plain or Llama 3-scaled), uploaded once to every device; the
    // upload completes here, before any compute can read it.
    const std::vector<float> inv_freq = RopeInvFreq(c_);
    const size_t fb = inv_freq.size() * sizeof(float);
    if (inv_freq_.size() != fb) {
      return Status::Internal("the RoPE table's staging holds " + FormatBytes(inv_freq_.size()) +
                              ", the table " + FormatBytes(fb));
    }
    std::memcpy(inv_freq_.data(), inv_freq.data(), fb);
    for (DeviceState& ds : devices_) {
      auto it = ds.regions.find("rope.inv_freq");
      if (it == ds.regions.end() || it->second.bytes < fb) {
        return Status::InvalidArgument("the plan's GPU map lacks a 'rope.inv_freq' of " +
                                       FormatBytes(fb) + ": re-plan with this version");
      }
      FERRY_RETURN_IF_ERROR(ds.device->CopyToDevice(ds.Use("rope.inv_freq", fb), inv_freq_, fb));
      FERRY_RETURN_IF_ERROR(ds.device->Synchronize(StreamId::kUpload));
    }
    return Status::Ok();
  }

  // The pinned host staging, from the host pool (DESIGN.md, "Storage tiers"): one block per
  // entry of the plan's pinned map (engine/plan/memory_model.h), in its order and named as it
  // names it, each sized by what this executor carves from it, so the pool's peak equals the
  // plan's pinned total only if the two agree (an over-count shows as a smaller peak; an
  // under-count fails here, with the pool's OutOfMemory naming the entry when the budget is the
  // plan's, else naming both sizes). Without a caller's pool the executor makes one whose budget
  // is exactly the plan's pinned total, in one mapping registered once with each device.
  //  - weights.upload / grads.landing: each layer range's weight and gradient mirrors
  //    (DeviceParams::Measure), in range order, then the gradient landing of each tail part
  //    after the first (the head's size); with the frozen base streamed from NVMe, no
  //    weight mirrors but weights.nvme_staging: two images of the largest range's
  //    weights per device (DeviceState::images);
  //  - activations.saved: per layer, per micro-batch, its input and (unless recomputed; never
  //    the head's) its saved slot's bytes;
  //  - activations.grad: per micro-batch, its boundary gradient (B*T x C in the compute dtype);
  //  - batch.io: per micro-batch, its row layout (positions, then doc ids), targets, losses;
  //  - rope.inv_freq: RoPE's table (models without learned positions).
  Status TakeHostStaging() {
    const bool fo = p_.job.forward_only;
    const size_t M = size_t(p_.micro_batches), head = layers_.size() - 1, hb = HiddenBytes();
    const size_t N = size_t(shape_.tokens());
    std::vector<DeviceParams::Bytes> mirror_bytes;
    std::map<std::string, size_t, std::less<>> need;
    size_t image_bytes = 0;  // the largest range's weights
    for (size_t r = 0; r < mirrors_.size(); ++r) {
      const plan::LayerRange range =
          r < p_.stages.size() ? p_.stages[r] : plan::LayerRange{int(head), int(head) + 1};
      const std::vector<LayerSpec> layers(layers_.begin() + range.first,
                                          layers_.begin() + range.last);
      FERRY_ASSIGN_OR_RETURN(DeviceParams::Bytes b,
                             DeviceParams::Measure(c_, lora_, layers, dtype_));
      if (!stream_base_) need["weights.upload"] += b.weights;
      image_bytes = std::max(image_bytes, b.weights);
      if (!fo) need["grads.landing"] += b.grads;
      mirror_bytes.push_back(b);
    }
    need["grads.landing"] += tail_landing_.size() * mirror_bytes.back().grads;
    for (size_t li = 1; li <= head; ++li) {
      if (fo || keep_ || spill_) {  // only stage inputs stay in host RAM
        if (StageInput(li)) need["activations.saved"] += M * hb;
        continue;
      }
      const bool saved = li != head && !p_.recompute[li];
      need["activations.saved"] += M * (hb + (saved ? saved_bytes_ : 0));
    }
    if (stream_base_) need["weights.nvme_staging"] = devices_.size() * 2 * image_bytes;
    if (spill_) {
      need["activations.staging"] = devices_.size() * plan::kNvmeStagingSlots * StagingSlotBytes();
    }
    if (!fo) need["activations.grad"] = M * hb;
    need["batch.io"] = M * N * 16;
    if (!c_.learned_positions) need["rope.inv_freq"] = RopeInvFreq(c_).size() * sizeof(float);
    const size_t logits_bytes =
        p_.job.generate_positions > 0 ? size_t(p_.job.logit_rows * c_.vocab_size) * 4 : 0;
    need["logits"] = logits_bytes;

    const uint64_t planned = p_.memory.pinned_host.total();
    if (host_pool_ == nullptr) {
      // Locked only for a GPU: CPU devices copy from any memory at the same speed.
      const std::vector<Device*> raw = Raw();
      const bool gpu = std::any_of(raw.begin(), raw.end(),
                                   [](const Device* d) { return d->kind() == DeviceKind::kCuda; });
      FERRY_ASSIGN_OR_RETURN(own_pool_, HostPool::Create({.pinned_budget = planned,
                                                          .chunk_bytes = planned,
                                                          .devices = raw,
                                                          .lock_pinned = gpu}));
      host_pool_ = own_pool_.get();
    }
    std::map<std::string, HostMemorySpan, std::less<>> span;
    for (const plan::Allocation& a : p_.memory.pinned_host.allocations) {
      auto it = need.find(a.name);
      if (it == need.end() || it->second == 0) continue;
      if (plan::RoundUp(it->second, plan::kHostPageBytes) > a.bytes) {
        return Status::OutOfMemory("pinned host staging '" + a.name + "' needs " +
                                   FormatBytes(it->second) + " but the plan holds " +
                                   FormatBytes(a.bytes) + " (the memory model undercounts)");
      }
      FERRY_ASSIGN_OR_RETURN(HostBlock b,
                             host_pool_->Allocate(it->second, HostMemoryKind::kPinned, a.name));
      span[a.name] = b.span();
      pinned_.emplace_back(a.name, std::move(b));
      need.erase(it);
    }
    for (const auto& [name, bytes] : need) {
      if (bytes > 0) {
        return Status::InvalidArgument("the plan's pinned host map lacks '" + name + "' (" +
                                       FormatBytes(bytes) + "): re-plan with this version");
      }
    }
    // Carves the next `bytes` of entry `name`.
    std::map<std::string, size_t, std::less<>> at;
    auto carve = [&](std::string_view name, size_t bytes) {
      auto s = span.find(name);
      if (s == span.end()) return HostMemorySpan();  // a zero-byte entry
      size_t& offset = at[std::string(name)];
      const HostMemorySpan out = s->second.Sub(offset, bytes);
      offset += bytes;
      return out;
    };
    for (size_t r = 0; r < mirrors_.size(); ++r) {
      if (!stream_base_) mirrors_[r]->weights = carve("weights.upload", mirror_bytes[r].weights);
      mirrors_[r]->grads = carve("grads.landing", mirror_bytes[r].grads);
    }
    for (std::shared_ptr<HostMirrors>& m : tail_landing_) {
      m->weights = mirrors_.back()->weights;
      m->grads = carve("grads.landing", mirror_bytes.back().grads);
    }
    if (stream_base_) {
      for (DeviceState& ds : devices_) {
        for (HostMemorySpan& image : ds.images) image = carve("weights.nvme_staging", image_bytes);
      }
    }
    act_.resize(layers_.size());
    saved_.resize(layers_.size());
    for (size_t li = 1; li <= head; ++li) {
      // Forward only or kept activations: nothing else crosses the host; on NVMe, nothing else
      // stays in it.
      if ((fo || keep_ || spill_) && !StageInput(li)) continue;
      for (size_t m = 0; m < M; ++m) {
        act_[li].push_back(carve("activations.saved", hb));
        if (fo || keep_ || spill_ || li == head || p_.recompute[li]) continue;
        saved_[li].push_back(carve("activations.saved", saved_bytes_));
      }
    }
    if (spill_) {
      for (DeviceState& ds : devices_) {
        for (HostMemorySpan* slot :
             {&ds.outgoing[0], &ds.outgoing[1], &ds.incoming[0], &ds.incoming[1]}) {
          *slot = carve("activations.staging", StagingSlotBytes());
        }
        ds.fetches.reserve(2 * layers_.size());
      }
      written_.resize(2 * layers_.size() * M);
    }
    for (size_t m = 0; m < M; ++m) {
      if (!fo) bgrad_.push_back(carve("activations.grad", hb));
      layout_.push_back(carve("batch.io", N * 8));
      targets_.push_back(carve("batch.io", N * 4));
      loss_.push_back(carve("batch.io", N * 4));
    }
    if (!c_.learned_positions) inv_freq_ = carve("rope.inv_freq", RopeInvFreq(c_).size() * 4);
    logits_host_ = carve("logits", logits_bytes);
    return Status::Ok();
  }

  // Generation: each device's KV cache, carved from its "kv_cache" allocation: keys then values
  // (f32, capacity x kv_dim) of each block of its stages (plan::GenerationDevice), in layer order.
  Status CarveKvCaches() {
    if (int(devices_.size()) != p_.gpus) {
      return Status::InvalidArgument("the generation plan is for " + std::to_string(p_.gpus) +
                                     " devices, the executor runs " +
                                     std::to_string(devices_.size()));
    }
    if (c_.learned_positions && p_.job.generate_positions > c_.max_position_embeddings) {
      return Status::InvalidArgument(
          std::to_string(p_.job.generate_positions) + " tokens (prompt + new) exceed the model's " +
          std::to_string(c_.max_position_embeddings) +
          " learned positions; use a shorter prompt or fewer new tokens");
    }
    const int64_t capacity = p_.job.generate_positions, kv_dim = c_.kv_dim();
    const size_t bytes = size_t(capacity * kv_dim) * 4;
    for (size_t d = 0; d < devices_.size(); ++d) {
      DeviceState& ds = devices_[d];
      ds.kv.capacity = capacity;
      ds.kv.k.assign(size_t(c_.num_layers), Tensor{});
      ds.kv.v.assign(size_t(c_.num_layers), Tensor{});
      if (!ds.regions.count("logits")) {
        return Status::InvalidArgument("the generation plan's GPU map lacks 'logits'");
      }
      auto region = ds.regions.find("kv_cache");
      size_t offset = 0;
      for (size_t s = 0; s < p_.stages.size(); ++s) {
        if (plan::GenerationDevice(s, p_.gpus) != int(d)) continue;
        for (int li = p_.stages[s].first; li < p_.stages[s].last; ++li) {
          if (region == ds.regions.end() || offset + 2 * bytes > region->second.bytes) {
            return Status::InvalidArgument(
                "the plan's 'kv_cache' on device '" + ds.device->name() +
                "' is smaller than its blocks' caches: re-plan with this version");
          }
          for (std::vector<Tensor>* kv : {&ds.kv.k, &ds.kv.v}) {
            (*kv)[size_t(li - 1)] = {region->second.data + std::ptrdiff_t(offset), DType::kF32,
                                     Shape{capacity, kv_dim}};
            offset += bytes;
          }
        }
      }
      if (offset > 0) ds.Use("kv_cache", offset);
    }
    return Status::Ok();
  }

  // Whether layer `li` is the first of a forward stage or the head: the layers whose inputs a
  // forward-only pass moves through the host.
  bool StageInput(size_t li) const {
    if (li == layers_.size() - 1) return true;
    return std::any_of(p_.stages.begin(), p_.stages.end(),
                       [&](const plan::LayerRange& r) { return size_t(r.first) == li; });
  }

  std::vector<Device*> Raw() const {
    std::vector<Device*> out;
    for (const DeviceState& ds : devices_) out.push_back(ds.device);
    return out;
  }

  Result<double> Step(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                      HostTensors& grads, const StepHooks& hooks) override {
    if (p_.job.forward_only) {
      return Status::FailedPrecondition(
          "this executor runs a forward-only plan (evaluation): Evaluate, not Step; plan the job "
          "for training to train it");
    }
    return Run(weights, batches, &grads, hooks);
  }
  Result<double> Evaluate(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                          const StepHooks& hooks) override {
    return Run(weights, batches, nullptr, hooks);
  }

  Result<std::vector<float>> Decode(const HostTensors& weights, std::span<const int32_t> tokens,
                                    int64_t past, bool last_only, const StepHooks& hooks) override {
    const int64_t n = int64_t(tokens.size()), capacity = p_.job.generate_positions;
    if (capacity == 0) {
      return Status::FailedPrecondition(
          "this executor's plan has no KV cache: plan the job for generation "
          "(PlanJob::generate_positions) to decode");
    }
    if (trace_ != nullptr) return Status::FailedPrecondition("generation is not traced");
    if (n < 1 || n > p_.job.seq_len) {
      return Status::InvalidArgument("a generation step runs 1 to " +
                                     std::to_string(p_.job.seq_len) +
                                     " tokens (the plan's longest), got " + std::to_string(n));
    }
    if (!last_only && n > p_.job.logit_rows) {
      return Status::InvalidArgument("the plan returns the logits of at most " +
                                     std::to_string(p_.job.logit_rows) + " tokens a step, asked " +
                                     std::to_string(n));
    }
    if (past < 0 || past + n > capacity) {
      return Status::InvalidArgument("the KV cache holds " + std::to_string(capacity) +
                                     " positions; " + std::to_string(std::max<int64_t>(past, 0)) +
                                     " used and " + std::to_string(n) +
                                     " more do not fit: plan a longer cache (prompt + new tokens)");
    }
    std::vector<int32_t> positions(size_t(n), 0);
    for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = int32_t(past + t);
    DropReadAhead();
    if (past == 0) {  // a new sequence: the weights may have changed, the frozen base too
      ++weights_version_;
      ForgetFrozenBases();
    }
    packed_from_ = &weights;
    MicroBatchInput mb;
    mb.tokens = tokens;
    mb.positions = positions;
    hooks_ = &hooks;
    decoding_ = true;
    last_only_ = last_only;
    forward_only_ = true;
    M_ = 1;
    shape_ = {1, n};
    for (DeviceState& ds : devices_) ds.kv.length = past;
    // One-token steps of a sequence reuse the last one's stages (their parameters, blocks and head
    // over the same regions, the blocks reading the cache's length at each call) and, with them,
    // the weights they packed: only the first step of a shape builds them.
    const bool reuse = one_token_runs_ && n == 1 && past > 0 && last_only;
    one_token_runs_ = false;
    Status s = [&]() -> Status {
      FERRY_RETURN_IF_ERROR(SetLayout(0, mb));
      FERRY_RETURN_IF_ERROR(WeightsNeeded({0, 1}));
      FERRY_RETURN_IF_ERROR(Embed(weights, std::span<const MicroBatchInput>(&mb, 1)));
      FERRY_RETURN_IF_ERROR(WeightsRead({0, 1}));
      if (reuse) {
        for (StageRun& st : runs_) st.weights_sent = false;
      } else {
        FERRY_RETURN_IF_ERROR(ScheduleStages());
      }
      for (size_t i = 0; i < runs_.size(); ++i) {
        FERRY_RETURN_IF_ERROR(EnqueueStage(i, weights, std::span<const MicroBatchInput>(&mb, 1)));
      }
      for (DeviceState& ds : devices_) FERRY_RETURN_IF_ERROR(ds.device->Synchronize());
      return Status::Ok();
    }();
    hooks_ = nullptr;
    decoding_ = false;
    shape_ = plan::MicroBatchShape(p_.job, p_.micro_batch_size);
    if (!s.ok()) {
      SynchronizeAll();
      ForgetSlots();
    }
    if (s.ok() && n == 1 && last_only) {
      one_token_runs_ = true;  // kept for the next token
    } else {
      runs_.clear();
    }
    if (!s.ok()) return s;
    const int64_t rows = last_only ? 1 : n;
    const float* l = reinterpret_cast<const float*>(logits_host_.data());
    return std::vector<float>(l, l + rows * c_.vocab_size);
  }

  // A training step (`grads`) or a forward-only pass (null), traced as a step when asked.
  Result<double> Run(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                     HostTensors* grads, const StepHooks& hooks) {
    one_token_runs_ = false;  // a step lays its stages out anew
    if (trace_ != nullptr) {
      trace_->BeginStep();
      for (DeviceState& ds : devices_) FERRY_RETURN_IF_ERROR(ds.timeline->BeginStep(*trace_));
    }
    hooks_ = &hooks;
    Result<double> r = RunStep(weights, batches, grads);
    hooks_ = nullptr;
    const Status traced = r.ok() && trace_ != nullptr ? CollectTrace() : Status::Ok();
    if (!r.ok() || !traced.ok()) {
      SynchronizeAll();
      ForgetSlots();
    }
    runs_.clear();  // every copy that used their mirrors has completed
    if (!traced.ok()) return traced;
    return r;
  }

  size_t HostResidentBytes() const override {
    return (own_pool_ ? own_pool_->ResidentBytes() : 0) + embed_f32_.capacity() * sizeof(float);
  }
  ExecutorStats stats() const override {
    ExecutorStats s = stats_;
    if (base_reader_) {
      s.base_file_bytes = base_reader_->tensor_bytes();
      s.base_bytes_from_drive = base_reader_->disk_bytes();
    }
    s.pinned = host_pool_->stats(HostMemoryKind::kPinned);
    s.host_mappings = int64_t(s.pinned.mappings);
    for (const auto& m : mirrors_) s.host_mappings += m->mapped;
    for (const auto& m : tail_landing_) s.host_mappings += m->mapped;
    for (const auto& [name, block] : pinned_) {
      s.host_pinned.push_back({name, plan::RoundUp(block.size(), plan::kHostPageBytes)});
    }
    std::map<std::string, size_t> used;
    for (const DeviceState& ds : devices_) {
      for (const auto& [name, bytes] : ds.used) used[name] = std::max(used[name], bytes);
    }
    for (const auto& [name, bytes] : used) s.used.push_back({name, bytes});
    return s;
  }

 private:
  static Status CreateEvents(Device& d, size_t n, std::vector<Event>& out) {
    for (size_t i = 0; i < n; ++i) {
      FERRY_ASSIGN_OR_RETURN(Event e, d.CreateEvent());
      out.push_back(std::move(e));
    }
    return Status::Ok();
  }

  // Adds the step's spans to the trace. Next step a device may run what another ran in this one
  // (the round robin runs on): every device keeps as many events as the busiest.
  Status CollectTrace() {
    size_t most = 0;
    for (DeviceState& ds : devices_) most = std::max(most, ds.timeline->events_used());
    for (DeviceState& ds : devices_) {
      FERRY_RETURN_IF_ERROR(ds.timeline->Reserve(most));
      FERRY_RETURN_IF_ERROR(ds.timeline->Collect(*trace_));
    }
    return Status::Ok();
  }

  // After a failed step or call: a slot whose upload failed part-way holds no whole stage.
  void ForgetSlots() {
    for (DeviceState& ds : devices_) {
      for (auto& h : ds.slot_holds) h = {DeviceState::kNone, -1};
    }
    ForgetFrozenBases();
    round_robin_.Forget();
    DropReadAhead();
  }
  // No slot's frozen base may be reused: the next upload of each stage is whole.
  void ForgetFrozenBases() {
    for (DeviceState& ds : devices_) {
      for (auto& f : ds.slot_frozen) f = {DeviceState::kNone, nullptr};
    }
    std::fill(mirror_frozen_.begin(), mirror_frozen_.end(), nullptr);
  }

  void SynchronizeAll() {
    for (DeviceState& ds : devices_) (void)ds.device->Synchronize();
  }

  // grads == nullptr: forward only.
  Result<double> RunStep(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                         HostTensors* grads) {
    const int64_t N = shape_.tokens();
    forward_only_ = grads == nullptr;
    if (forward_only_ ? batches.empty() || int64_t(batches.size()) > p_.micro_batches
                      : int64_t(batches.size()) != p_.micro_batches) {
      return Status::InvalidArgument("the plan runs " + std::to_string(p_.micro_batches) +
                                     " micro-batches per step" +
                                     (forward_only_ ? " (an evaluation at most that many)" : "") +
                                     ", got " + std::to_string(batches.size()));
    }
    M_ = batches.size();
    // The caller's host threads pack weights and add gradients for this step only.
    struct StepThreads {
      ThreadPool*& slot;
      ~StepThreads() { slot = nullptr; }
    } step_threads{host_threads_ = batches.empty() ? nullptr : batches.front().host_pool};
    for (size_t m = 0; m < batches.size(); ++m) {
      if (int64_t(batches[m].targets.size()) != N || !(batches[m].normalizer > 0)) {
        return Status::InvalidArgument("micro-batch " + std::to_string(m) +
                                       ": targets must hold B*T ids and the normalizer be > 0");
      }
      std::memcpy(targets_[m].data(), batches[m].targets.data(), size_t(N) * 4);
      FERRY_RETURN_IF_ERROR(SetLayout(m, batches[m]));
    }
    ++weights_version_;
    packed_from_ = &weights;
    // The first stage's weights read ahead at the last step's end hold for this step if nothing
    // ran between (an evaluation or a generation counts a version too) and the caller's master
    // copy is the one read and has not changed since.
    const bool ahead = ahead_version_ == weights_version_ && !forward_only_ &&
                       ahead_from_ == &weights && !hooks_->weights_changed;
    if (ahead) {
      ++stats_.stages_read_ahead;
    } else {
      DropReadAhead();
    }
    ahead_unread_ = ahead;
    ahead_version_ = -1;
    if (stream_base_) FERRY_RETURN_IF_ERROR(BaseServedFromFiles(weights));
    FERRY_RETURN_IF_ERROR(WeightsNeeded({0, 1}));
    FERRY_RETURN_IF_ERROR(Embed(weights, batches));
    FERRY_RETURN_IF_ERROR(WeightsRead({0, 1}));
    FERRY_RETURN_IF_ERROR(ScheduleStages());
    for (size_t i = 0; i < runs_.size(); ++i) {
      FERRY_RETURN_IF_ERROR(EnqueueStage(i, weights, batches));
    }
    if (forward_only_) {
      for (DeviceState& ds : devices_) FERRY_RETURN_IF_ERROR(ds.device->Synchronize());
      return SummedLoss(batches);
    }
    // The first micro-batch's overwrite request covers the step: each stage stores its
    // gradients, and what no stage wrote is zeroed before the embedding's scatter-add. Stages add
    // in the step's order whatever order their devices finish in.
    GradOverwrite overwrite;
    GradOverwrite* ow = batches.front().overwrite_grads ? &overwrite : nullptr;
    if (isolate_) {  // no host work beside a kernel: the gradients are added once all have run
      for (DeviceState& ds : devices_) FERRY_RETURN_IF_ERROR(ds.device->Synchronize());
    }
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (runs_[i].kind == StageKind::kForward) continue;
      DeviceState& ds = devices_[runs_[i].device];
      // Before waiting for the last stage: the next step's first weights, read ahead, upload
      // while its gradients download.
      if (i + 1 == runs_.size() && ReadsAhead()) FERRY_RETURN_IF_ERROR(ReadAhead(weights));
      FERRY_RETURN_IF_ERROR(ds.device->Synchronize(ds.grads_landed[i]));
      HostSpan span;  // a stage with gradients (not a LoRA job's frozen head), as the plan has it
      if (trace_ != nullptr && runs_[i].params->grads_bytes() > 0) {
        span = HostSpan(trace_, plan::LaneKind::kHostMemory, plan::TaskKind::kGradientAdd,
                        TaskName('A', i, -1), -1, int(i));
      }
      FERRY_RETURN_IF_ERROR(runs_[i].params->AddGrads(*grads, ow, host_threads_));
      span.End();
      // What lands here is final (after the tail's last part) unless it is tied to the embedding
      // (its layer lands last), and the caller's optimizer may use it while the devices go on.
      const bool more_parts = runs_[i].kind == StageKind::kTail && i + 1 < runs_.size() &&
                              runs_[i + 1].kind == StageKind::kTail;
      if (hooks_->grads_landed && !more_parts) {
        FERRY_RETURN_IF_ERROR(hooks_->grads_landed(runs_[i].range.first, runs_[i].range.last));
      }
    }
    if (ow != nullptr) ow->ZeroUnwritten(*grads);
    // The step's end: the losses and the last input gradients (unless the embedding is frozen)
    // are read on the host below.
    for (DeviceState& ds : devices_) FERRY_RETURN_IF_ERROR(ds.device->Synchronize());
    if (!lora_.enabled()) FERRY_RETURN_IF_ERROR(EmbeddingGrads(batches, *grads));
    if (hooks_->grads_landed) FERRY_RETURN_IF_ERROR(hooks_->grads_landed(0, 1));
    return SummedLoss(batches);
  }

  // Each micro-batch's per-token losses summed over its normalizer, then over the micro-batches.
  double SummedLoss(std::span<const MicroBatchInput> batches) const {
    const int64_t N = shape_.tokens();
    double total = 0;
    for (size_t m = 0; m < batches.size(); ++m) {
      const float* loss = reinterpret_cast<const float*>(loss_[m].data());
      double sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += loss[n];
      total += sum / batches[m].normalizer;
    }
    return total;
  }

  // The step's stages in order (forward, tail, backward), each handed to the next device in turn,
  // and the weight slot each takes there (plan::StageRoundRobin, which the planner prices).
  Status ScheduleStages() {
    const int64_t S = int64_t(p_.stages.size()), head = int64_t(layers_.size()) - 1;
    // The tail's parts (plan.tail_parts; one in generation, at most one per micro-batch of an
    // evaluation).
    parts_ = decoding_ ? 1 : std::clamp<int64_t>(p_.tail_parts, 1, int64_t(M_));
    const int64_t P = parts_;
    for (DeviceState& ds : devices_) {
      if (ds.timeline) ds.timeline->set_tail_parts(int(P));
    }
    std::vector<size_t> kept(devices_.size(), 0);  // per device: entries its stages keep so far
    runs_.clear();
    runs_.resize(size_t(forward_only_ ? S + P : 2 * S + P));
    // An evaluation starts where the next step will (a copy of the round robin): its stages find
    // the frozen base where the last step left it, and leave it where the next step looks.
    std::vector<plan::StageRoundRobin::Placement> at;
    if (!decoding_) {
      plan::StageRoundRobin eval = round_robin_;
      std::vector<int> ranges = plan::StepStageRanges(int(S), int(P));
      ranges.resize(runs_.size());  // an evaluation's: its forward stages and the tail's parts
      at = (forward_only_ ? eval : round_robin_).Place(int(runs_.size()), lora_.enabled(), ranges);
    }
    for (int64_t i = 0; i < int64_t(runs_.size()); ++i) {
      StageRun& st = runs_[size_t(i)];
      st.first_micro_batch = 0;
      st.last_micro_batch = M_;
      if (i < S) {
        st.kind = StageKind::kForward;
        st.range = p_.stages[size_t(i)];
      } else if (i < S + P) {
        st.kind = StageKind::kTail;
        st.range = {int(head), int(head) + 1};
        st.part = int(i - S);
        st.first_micro_batch = size_t(plan::TailPartStart(i - S, int64_t(M_), P));
        st.last_micro_batch = size_t(plan::TailPartStart(i - S + 1, int64_t(M_), P));
      } else {
        st.kind = StageKind::kBackward;
        st.forward = plan::StepStageRange(int(i), int(S), int(P));
        st.range = p_.stages[size_t(st.forward)];
      }
      if (decoding_) {
        // Generation: forward stage s on plan::GenerationDevice(s) (the head on the next) and a
        // device's stages in its two slots in turn from the first, at every call, so its blocks'
        // caches and, when its stages fit its slots, their weights stay where they are.
        st.device = size_t(plan::GenerationDevice(size_t(i), int(devices_.size())));
        st.slot = int(i / int64_t(devices_.size()) % 2);
      } else {
        st.device = size_t(at[size_t(i)].device);
        st.slot = at[size_t(i)].slot;
      }
      // Each device keeps its forward stages' blocks, in stage order, from its region's start.
      if (st.kind == StageKind::kForward) {
        st.kept_first = kept[st.device];
        kept[st.device] += size_t(st.range.size()) * size_t(p_.micro_batches);
      } else if (st.kind == StageKind::kBackward) {
        st.kept_first = runs_[size_t(st.forward)].kept_first;
        if (keep_ && st.device != runs_[size_t(st.forward)].device) {
          return Status::Internal("kept activations of blocks [" + std::to_string(st.range.first) +
                                  ", " + std::to_string(st.range.last) +
                                  ") are on another device than their backward stage");
        }
      }
    }
    range_readers_.assign(mirrors_.size(), 0);
    range_prepared_.assign(mirrors_.size(), 0);
    for (size_t i = 0; i < runs_.size(); ++i) ++range_readers_[RangeIndex(i)];
    stats_.stages_run = int64_t(runs_.size());
    return Status::Ok();
  }

  // The stages whose downloads of micro-batch m stage i reads: the stage before it that ran m (a
  // tail's part reads the last forward stage; the first backward stage the part that ran m)
  // and, for a backward stage, the forward stages that saved its layers' inputs and activations.
  std::vector<size_t> Producers(size_t i, size_t m) const {
    std::vector<size_t> from;
    size_t before = i;
    while (before > 0) {
      const StageRun& b = runs_[--before];
      if (m >= b.first_micro_batch && m < b.last_micro_batch) {
        from.push_back(before);
        break;
      }
    }
    const StageRun& st = runs_[i];
    if (st.kind == StageKind::kBackward) {
      from.push_back(size_t(st.forward));
      if (st.forward > 0) from.push_back(size_t(st.forward - 1));
    }
    return from;
  }

  // Makes the upload stream of stage i's device wait until micro-batch m's inputs have landed.
  Status AwaitInputs(size_t i, size_t m) {
    Device& d = *devices_[runs_[i].device].device;
    std::vector<size_t> waited;
    for (size_t j : Producers(i, m)) {
      const size_t from = runs_[j].device;
      if (std::find(waited.begin(), waited.end(), from) != waited.end()) continue;
      waited.push_back(from);
      FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kUpload, devices_[from].landed[m]));
    }
    return Status::Ok();
  }

  // The host mirrors stage i's parameters use: its range's, but a tail's later part lands its
  // gradients in a buffer of its own (its weights span is the range's).
  const std::shared_ptr<HostMirrors>& MirrorsOf(size_t i) const {
    const StageRun& st = runs_[i];
    const std::shared_ptr<HostMirrors>& range = mirrors_[RangeIndex(i)];
    if (st.kind != StageKind::kTail || st.part < 1 || size_t(st.part) > tail_landing_.size()) {
      return range;
    }
    return tail_landing_[size_t(st.part - 1)];
  }
  // The plan's name for a task of stage i (plan::RoundRobinTaskName).
  std::string TaskName(char what, size_t i, int micro_batch) const {
    return plan::RoundRobinTaskName(what, int(i), int(p_.stages.size()), micro_batch, int(parts_));
  }

  // The layer range (its index: forward stage, or the head's after them) stage i runs.
  size_t RangeIndex(size_t i) const {
    const StageRun& st = runs_[i];
    return st.kind == StageKind::kForward ? i
           : st.kind == StageKind::kTail  ? p_.stages.size()
                                          : size_t(st.forward);
  }

  // Builds stage i's parameters, blocks or head in its planned blocks, and packs its weights
  // into the host mirror. No device work.
  Status Prepare(size_t i, const HostTensors& weights) {
    StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    FERRY_RETURN_IF_ERROR(WeightsNeeded(st.range));
    std::optional<KeptSlots> kept;
    if (keep_ && st.kind != StageKind::kTail) {
      kept = KeptSlots{st.kept_first, kept_stride_, kept_input_};
    }
    st.source = std::make_unique<PlannedSource>(ds, st.slot, GradsOf(st), kept);
    std::vector<LayerSpec> layers(layers_.begin() + st.range.first,
                                  layers_.begin() + st.range.last);
    FERRY_RETURN_IF_ERROR(stream_base_ ? PrepareStreamed(i, layers, weights)
                                       : PrepareMirrored(i, layers, weights));
    if (st.kind == StageKind::kTail) {
      FERRY_ASSIGN_OR_RETURN(
          DeviceStack stack,
          BuildDeviceStack(*ds.device, c_, *st.params,
                           {.shape = decoding_ && last_only_ ? BatchShape{1, 1} : shape_,
                            .blocks = false,
                            .head = p_.job.forward_only ? HeadMode::kForwardOnly : HeadMode::kTrain,
                            .loss_chunk_tokens = plan::kLossChunkTokens,
                            .source = st.source.get()}));
      st.head = std::move(stack.head);
      return Status::Ok();
    }
    const Shape tokens{shape_.tokens()};
    Tensor positions, inv_freq;
    if (auto it = ds.regions.find("positions"); it != ds.regions.end()) {
      positions = {it->second.data, DType::kI32, tokens};
    }
    if (auto it = ds.regions.find("rope.inv_freq"); it != ds.regions.end()) {
      inv_freq = {it->second.data, DType::kF32, Shape{c_.head_dim / 2}};
    }
    FERRY_ASSIGN_OR_RETURN(
        DeviceStack stack,
        BuildDeviceStack(
            *ds.device, c_, *st.params,
            {.shape = shape_,
             .inputs = {.positions = positions,
                        .doc_ids = {ds.regions.at("doc_ids").data, DType::kI32, tokens},
                        .inv_freq = inv_freq},  // RopeInvFreq: plain or Llama 3-scaled
             .num_slots = keep_ ? st.range.size() * p_.micro_batches : 2,
             .first_block = st.range.first - 1,
             .kv_cache = decoding_ ? &ds.kv : nullptr,
             .source = st.source.get()}));
    st.blocks = std::move(stack.blocks);
    return Status::Ok();
  }

  // Stage i's parameters over its range's host mirror: a forward stage's layers are those of its
  // backward stage, so one mirror, packed once a step (the master copy does not change in between),
  // which the backward stage's upload reads while the forward stage's may still run.
  Status PrepareMirrored(size_t i, const std::vector<LayerSpec>& layers,
                         const HostTensors& weights) {
    StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const size_t r = RangeIndex(i);
    FERRY_ASSIGN_OR_RETURN(
        DeviceParams params,
        DeviceParams::Create(*ds.device, c_, lora_, layers, st.source.get(),
                             p_.job.forward_only ? ParamGrads::kNone : ParamGrads::kAllocate,
                             dtype_, MirrorsOf(i)));
    st.params = std::make_unique<DeviceParams>(std::move(params));
    if (packed_[r] == weights_version_) {
      // Read ahead at the last step's end: the caller hears the read now.
      const bool ahead = r == 0 && std::exchange(ahead_unread_, false);
      return ahead ? WeightsRead(st.range) : Status::Ok();
    }
    FERRY_RETURN_IF_ERROR(
        PackMirror(r, *st.params, weights, weights_version_, TaskName('P', i, -1), int(i)));
    return WeightsRead(st.range);
  }

  // Packs range r's host mirror from `weights` through `params` (over that mirror) as weights
  // version `version`, traced as `name` of stage `stage`.
  Status PackMirror(size_t r, DeviceParams& params, const HostTensors& weights, int64_t version,
                    const std::string& name, int stage) {
    // A LoRA job's frozen base in the mirror was packed from this master copy, whose frozen
    // tensors do not change between calls (Step's contract): only the trainable ones are. Nor
    // do the tensors its model's files serve (an evaluation's whole base).
    const bool same_base = !decoding_ && mirror_frozen_[r] == packed_from_;
    const bool trainable_only = lora_.enabled() && same_base;
    HostSpan span;  // traced when it writes anything, as the plan prices it
    if (trace_ != nullptr && (!trainable_only || params.has_trainable_weights())) {
      span = HostSpan(trace_, plan::LaneKind::kHostMemory, plan::TaskKind::kWeightPack, name, -1,
                      stage);
    }
    mirror_frozen_[r] = nullptr;  // until the packing has succeeded
    packed_[r] = -1;
    FERRY_RETURN_IF_ERROR(params.PackWeights(weights, host_threads_, trainable_only, same_base));
    mirror_frozen_[r] = packed_from_;
    stats_.frozen_packs_skipped +=
        trainable_only || (same_base && (!weights.files.empty() || !weights.nf4_served.empty()));
    span.End();
    packed_[r] = version;
    return Status::Ok();
  }

  // Stage i's parameters over its device's next image, the frozen base streamed from NVMe:
  // packed whole (the base read from the model's files or its converted copy) unless the device's
  // weight slot already holds its layers' base (ResidentBases), then its trainable tensors only;
  // nothing when the slot holds all of its weights. The image's last upload is waited for first.
  // Both stages over a range pack its trainable tensors: the updates of its layers wait
  // (StepHooks::weights_read) until the last of them has.
  Status PrepareStreamed(size_t i, const std::vector<LayerSpec>& layers,
                         const HostTensors& weights) {
    StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const size_t r = RangeIndex(i);
    const int k = ds.next_image;
    ds.next_image ^= 1;
    if (ds.image_busy[k]) {
      FERRY_RETURN_IF_ERROR(ds.device->Synchronize(ds.image_free[size_t(k)]));
      ds.image_busy[k] = false;
    }
    st.image = k;
    auto mirrors = std::make_shared<HostMirrors>();
    mirrors->weights = ds.images[k];
    mirrors->grads = MirrorsOf(i)->grads;
    FERRY_ASSIGN_OR_RETURN(DeviceParams params,
                           DeviceParams::Create(*ds.device, c_, lora_, layers, st.source.get(),
                                                ParamGrads::kAllocate, dtype_, std::move(mirrors)));
    st.params = std::make_unique<DeviceParams>(std::move(params));
    const bool holds = ds.slot_holds[st.slot] == std::pair<size_t, int64_t>{r, weights_version_};
    const bool base_held =
        ds.slot_frozen[st.slot] == std::pair<size_t, const HostTensors*>{r, packed_from_};
    if (!holds) {
      const double started = trace_ != nullptr ? trace_->Now() : 0;
      const uint64_t drive = base_reader_ ? base_reader_->disk_bytes() : 0;
      const double reading = base_reader_ ? base_reader_->read_seconds() : 0;
      FERRY_RETURN_IF_ERROR(st.params->PackWeights(weights, host_threads_, base_held, false,
                                                   base_reader_ ? &*base_reader_ : nullptr));
      if (trace_ != nullptr) {
        TraceStreamedPack(i, started, base_reader_ ? base_reader_->disk_bytes() - drive : 0,
                          base_reader_ ? base_reader_->read_seconds() - reading : 0);
      }
      if (base_held) {
        ++stats_.frozen_packs_skipped;
      } else {
        stats_.base_bytes_streamed += ServedFrozenBytes(layers, weights);
      }
    }
    // The range's last reader this step: the last of its stages to be prepared (a forward stage
    // and its backward stage, or the tail's parts). Not always the last in the step: a stage is
    // prepared when its device's stage before it is enqueued, so with more devices than that gap a
    // backward stage, or a later part, is prepared before an earlier stage over its layers.
    const bool last_reader = ++range_prepared_[r] == range_readers_[r];
    return last_reader ? WeightsRead(st.range) : Status::Ok();
  }

  // The plan streams the frozen base from NVMe: every frozen block and head weight must be served
  // from a file there (HostTensors::files or nf4_served: the model's own, or the copy converted
  // for it, engine/model/converted_base.h), never silently held in RAM.
  Status BaseServedFromFiles(const HostTensors& weights) const {
    for (const LayerSpec& l : layers_) {
      if (l.kind == LayerKind::kEmbedding) continue;  // gathered on the host, not streamed
      for (const ParamSpec& p : l.params) {
        const std::string& owner = p.storage_name();
        const FileTensor* in_file = nullptr;  // where the drive would read it from
        if (auto f = weights.files.find(owner); f != weights.files.end()) in_file = &f->second;
        if (auto q = weights.nf4_served.find(owner); q != weights.nf4_served.end()) {
          in_file = &q->second.parts_file;
        }
        if (in_file != nullptr && in_file->offset >= 0 && !base_reader_) {
          return Status::FailedPrecondition(
              "the plan streams the frozen base from NVMe but holds no buffer to read it through "
              "(weights.base_read: a plan from an older version?), yet '" +
              owner + "' is read from " + in_file->path + ": re-plan with this version");
        }
        if (p.trainable || weights.files.contains(owner) || weights.nf4_served.contains(owner)) {
          continue;
        }
        return Status::InvalidArgument(
            "the plan streams the frozen base from NVMe, and '" + owner +
            "' is served neither from the model's files nor from a copy converted there (it is "
            "held in RAM): convert it to NVMe first, or plan with the frozen weights in host "
            "RAM");
      }
    }
    return Status::Ok();
  }

  // The bytes of the frozen tensors of `layers` served from files, as stored there (an NF4
  // weight's codes and quant state).
  static uint64_t ServedFrozenBytes(const std::vector<LayerSpec>& layers,
                                    const HostTensors& weights) {
    uint64_t bytes = 0;
    for (const LayerSpec& l : layers) {
      for (const ParamSpec& p : l.params) {
        if (p.trainable) continue;
        const std::string& owner = p.storage_name();
        if (auto f = weights.files.find(owner); f != weights.files.end()) {
          bytes += f->second.bytes.size();
        } else if (p.nf4 && weights.nf4_served.contains(owner)) {
          bytes += uint64_t(p.bytes());
        }
      }
    }
    return bytes;
  }

  // A streamed stage's packing that began at `started` (trace clock) and ends now: its reads
  // from the drive (`drive_bytes` in `read_s` seconds), then the rest, as the plan's "R" task on
  // the NVMe read lane and its "P" task (the reads are interleaved with the converting; their
  // times are summed and shown first, as the plan orders them).
  void TraceStreamedPack(size_t i, double started, uint64_t drive_bytes, double read_s) const {
    const int64_t step = trace_->step();
    double at = started;
    if (drive_bytes > 0) {
      trace_->Add({.name = TaskName('R', i, -1),
                   .kind = plan::TaskKind::kNvmeRead,
                   .lane = {plan::LaneKind::kNvmeRead, 0},
                   .step = step,
                   .stage = int(i),
                   .bytes = double(drive_bytes),
                   .start_s = at,
                   .end_s = at + read_s});
      at += read_s;
    }
    trace_->Add({.name = TaskName('P', i, -1),
                 .kind = plan::TaskKind::kWeightPack,
                 .lane = {plan::LaneKind::kHostMemory, 0},
                 .step = step,
                 .stage = int(i),
                 .start_s = at,
                 .end_s = std::max(at, trace_->Now())});
  }

  // Enqueues chunk k of `chunks` of stage i's weights on its device's upload stream; the first
  // waits until the slot's last stage has stopped computing with it.
  Status SendWeights(size_t i, size_t k, size_t chunks) {
    return SendWeightsOf(runs_[i], RangeIndex(i), weights_version_, int(i), k, chunks);
  }
  // SendWeights of `st`, over range `r`, as weights version `version`, traced as stage `stage`
  // of the step (-1: the next step's first stage, read ahead).
  Status SendWeightsOf(StageRun& st, size_t r, int64_t version, int stage, size_t k,
                       size_t chunks) {
    DeviceState& ds = devices_[st.device];
    const bool ahead = stage < 0;
    const std::string_view slot = kWeights[st.slot];
    const size_t bytes = st.params->weights_bytes();
    constexpr size_t kAlign = 64;  // chunk boundaries on cache lines
    const size_t lo = k == 0 ? 0 : bytes * k / chunks / kAlign * kAlign;
    const size_t hi = k + 1 == chunks ? bytes : bytes * (k + 1) / chunks / kAlign * kAlign;
    // The slot still holds these weights: packed from the same master copy for a stage over the
    // same layers before it on this device (in a step, the forward stage whose backward stage
    // is the device's next in that slot; in generation, an earlier call of the sequence).
    const std::pair<size_t, int64_t> holds{r, version};
    if (ds.slot_holds[st.slot] == holds) {
      if (k + 1 < chunks) return Status::Ok();
      st.weights_sent = true;
      if (observer_ && !ahead) observer_(Enqueued::kWeights, stage, *ds.device);
      return Status::Ok();
    }
    // The slot holds these layers' frozen weights from the same master copy (a LoRA job's base):
    // only the trainable ranges change.
    const std::pair<size_t, const HostTensors*> frozen{r, packed_from_};
    const bool trainable_only = lora_.enabled() && !decoding_ && ds.slot_frozen[st.slot] == frozen;
    if (k == 0) ds.slot_holds[st.slot] = {DeviceState::kNone, -1};
    if (k == 0 && !trainable_only) ds.slot_frozen[st.slot] = {DeviceState::kNone, nullptr};
    if (k == 0) FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kUpload, {}, {slot}));
    FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kUpload));
    size_t sent = hi - lo;
    if (trainable_only) {
      FERRY_ASSIGN_OR_RETURN(sent, st.params->UploadTrainableWeights(*ds.device, lo, hi - lo));
    } else {
      FERRY_RETURN_IF_ERROR(st.params->UploadWeights(*ds.device, lo, hi - lo));
    }
    stats_.weight_bytes_uploaded += sent;
    if (ds.timeline) {
      FERRY_RETURN_IF_ERROR(ds.timeline->End(StreamId::kUpload, 'W', plan::TaskKind::kWeightUpload,
                                             std::max(stage, 0), -1, double(sent),
                                             ahead ? -1 : int(k), ahead ? kNextStep : ""));
    }
    if (k + 1 < chunks) return Status::Ok();
    FERRY_RETURN_IF_ERROR(ds.hazards.After(StreamId::kUpload, {}, {slot}));
    if (r == 0 && st.image < 0 && ReadsAhead()) {  // packing the mirror again waits for this copy
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.first_mirror_free[0], StreamId::kUpload));
      ds.first_mirror_read = true;
    }
    if (st.image >= 0) {  // the image may be packed again once this copy is done
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.image_free[size_t(st.image)], StreamId::kUpload));
      ds.image_busy[st.image] = true;
    }
    ds.slot_holds[st.slot] = holds;
    ds.slot_frozen[st.slot] = frozen;
    st.weights_sent = true;
    if (isolate_) {  // no kernel of this device runs beside the copy
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.weights_up[0], StreamId::kUpload));
      FERRY_RETURN_IF_ERROR(ds.device->Wait(StreamId::kCompute, ds.weights_up[0]));
    }
    if (observer_ && !ahead) observer_(Enqueued::kWeights, stage, *ds.device);
    return Status::Ok();
  }

  // Whether the step in flight reads the next step's first weights ahead (StepHooks::read_ahead):
  // a training step of a plan whose weights go through the host mirrors.
  bool ReadsAhead() const {
    return hooks_ != nullptr && hooks_->read_ahead && !forward_only_ && !decoding_ &&
           !stream_base_ && !isolate_;
  }
  // The next step's first stage's weights, read now (the caller's master copy stays as it is
  // until then: StepHooks::read_ahead) into the first range's mirror, once this step's copies from
  // it are done, and uploaded into the weight slot the round robin will give that stage, behind
  // the slot's last compute, so they go up while this step's last gradients come down. Kept as
  // the next weights version, which the next step's RunStep takes or drops.
  Status ReadAhead(const HostTensors& weights) {
    plan::StageRoundRobin next = round_robin_;  // the next step places its stages from here
    const int S = int(p_.stages.size());
    const plan::StageRoundRobin::Placement at =
        next.Place(int(runs_.size()), lora_.enabled(), plan::StepStageRanges(S, int(parts_)))
            .front();
    for (DeviceState& ds : devices_) {
      if (std::exchange(ds.first_mirror_read, false)) {
        FERRY_RETURN_IF_ERROR(ds.device->Synchronize(ds.first_mirror_free[0]));
      }
    }
    StageRun& st = ahead_run_;
    st = StageRun{};
    st.range = p_.stages[0];
    st.device = size_t(at.device);
    st.slot = at.slot;
    DeviceState& ds = devices_[st.device];
    st.source = std::make_unique<PlannedSource>(ds, st.slot, GradsOf(st));
    const std::vector<LayerSpec> layers(layers_.begin() + st.range.first,
                                        layers_.begin() + st.range.last);
    FERRY_ASSIGN_OR_RETURN(DeviceParams params,
                           DeviceParams::Create(*ds.device, c_, lora_, layers, st.source.get(),
                                                ParamGrads::kNone, dtype_, mirrors_[0]));
    st.params = std::make_unique<DeviceParams>(std::move(params));
    const int64_t version = weights_version_ + 1;
    FERRY_RETURN_IF_ERROR(WeightsNeeded(st.range));
    // Marked first, so a failure part-way leaves nothing a later step would take (ForgetSlots).
    ahead_version_ = version;
    ahead_from_ = &weights;
    FERRY_RETURN_IF_ERROR(PackMirror(0, *st.params, weights, version,
                                     TaskName('P', 0, -1) + std::string(kNextStep), 0));
    return SendWeightsOf(st, 0, version, -1, 0, 1);
  }
  // Forgets what was read ahead: the first range's mirror and the slot it went to hold no
  // version a later step would take.
  void DropReadAhead() {
    if (ahead_version_ < 0) return;
    if (packed_[0] == ahead_version_) packed_[0] = -1;
    for (DeviceState& ds : devices_) {
      for (auto& h : ds.slot_holds) {
        if (h == std::pair<size_t, int64_t>{0, ahead_version_}) h = {DeviceState::kNone, -1};
      }
    }
    ahead_version_ = -1;
    ahead_unread_ = false;
  }

  // Stage i's device's next stage this step, to be prefetched in `chunks` pieces (one per group
  // of stage i's activation uploads).
  // It is prepared (its weights packed from the master copy) only when its first chunk is sent,
  // so a caller's pending updates of its layers (StepHooks::weights_needed) can run meanwhile.
  Prefetch NextOnDevice(size_t i, size_t chunks, const HostTensors& weights) const {
    const size_t next = i + devices_.size();
    if (next >= runs_.size()) return Prefetch{};
    return Prefetch{next, std::max<size_t>(chunks, 1), 0, &weights};
  }
  // The prefetch's next chunk, if any is left.
  Status PrefetchChunk(Prefetch& p) {
    if (!p.stage || p.sent == p.chunks) return Status::Ok();
    if (p.sent == 0 && runs_[*p.stage].params == nullptr) {
      FERRY_RETURN_IF_ERROR(Prepare(*p.stage, *p.weights));
    }
    return SendWeights(*p.stage, p.sent++, p.chunks);
  }
  Status WeightsNeeded(plan::LayerRange r) const {
    return hooks_->weights_needed ? hooks_->weights_needed(r.first, r.last) : Status::Ok();
  }
  Status WeightsRead(plan::LayerRange r) const {
    return hooks_->weights_read ? hooks_->weights_read(r.first, r.last) : Status::Ok();
  }
  Status FinishPrefetch(Prefetch& p) {
    while (p.stage && p.sent < p.chunks) FERRY_RETURN_IF_ERROR(PrefetchChunk(p));
    return Status::Ok();
  }

  Status EnqueueStage(size_t i, const HostTensors& weights,
                      std::span<const MicroBatchInput> batches) {
    StageRun& st = runs_[i];
    if (st.params == nullptr) FERRY_RETURN_IF_ERROR(Prepare(i, weights));
    if (!st.weights_sent) FERRY_RETURN_IF_ERROR(SendWeights(i, 0, 1));  // first on its device
    const size_t M = M_;
    const size_t layers = size_t(st.range.last - st.range.first);
    switch (st.kind) {
      case StageKind::kForward: {
        Prefetch next = NextOnDevice(i, M, weights);
        FERRY_RETURN_IF_ERROR(ForwardStage(i, next));
        break;
      }
      case StageKind::kTail: {
        Prefetch next = NextOnDevice(i, st.last_micro_batch - st.first_micro_batch, weights);
        FERRY_RETURN_IF_ERROR(decoding_ ? LogitsTail(i, next) : Tail(i, batches, next));
        break;
      }
      case StageKind::kBackward: {
        Prefetch next = NextOnDevice(i, M * layers, weights);
        FERRY_RETURN_IF_ERROR(BackwardStage(i, next));
        break;
      }
    }
    if (observer_) observer_(Enqueued::kStage, int64_t(i), *devices_[st.device].device);
    return Status::Ok();
  }

  // Micro-batch m's positions (learned-position models only: RoPE reads them on the device).
  std::span<const int32_t> Positions(size_t m) const {
    if (!c_.learned_positions) return {};
    return {reinterpret_cast<const int32_t*>(layout_[m].data()), size_t(shape_.tokens())};
  }

  // Writes micro-batch m's row layout into its staging: positions (0..T-1 per row unless packed)
  // then document ids (one document per row unless packed), as the reference runner does.
  Status SetLayout(size_t m, const MicroBatchInput& mb) {
    const int64_t N = shape_.tokens(), T = shape_.seq_len;
    for (auto [span, name] :
         {std::pair{mb.doc_ids, "doc_ids"}, std::pair{mb.positions, "positions"}}) {
      if (!span.empty() && int64_t(span.size()) != N) {
        return Status::InvalidArgument("micro-batch " + std::to_string(m) + ": " + name + " hold " +
                                       std::to_string(span.size()) +
                                       " values, expected B*T = " + std::to_string(N));
      }
    }
    int32_t* pos = reinterpret_cast<int32_t*>(layout_[m].data());
    int32_t* doc = pos + N;
    for (int64_t n = 0; n < N; ++n) {
      pos[n] = mb.positions.empty() ? int32_t(n % T) : mb.positions[size_t(n)];
      doc[n] = mb.doc_ids.empty() ? 0 : mb.doc_ids[size_t(n)];
      if (pos[n] < 0) {
        return Status::InvalidArgument("micro-batch " + std::to_string(m) + ": position " +
                                       std::to_string(pos[n]) + " at token " + std::to_string(n) +
                                       " is negative");
      }
    }
    return Status::Ok();
  }

  // Copies `bytes` of `src` from `offset` to `dst` in plan buffer `buffer` on the upload stream,
  // once the device's other streams are done with `buffer`.
  static Status ToDevice(DeviceState& ds, std::string_view buffer, DevicePtr<std::byte> dst,
                         HostMemorySpan src, size_t bytes, size_t offset = 0) {
    FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kUpload, {}, {buffer}));
    FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kUpload));
    FERRY_RETURN_IF_ERROR(ds.device->CopyToDevice(dst, src.Sub(offset, bytes), bytes));
    FERRY_RETURN_IF_ERROR(
        ds.TraceEnd(StreamId::kUpload, 'I', plan::TaskKind::kActivationUpload, double(bytes)));
    return ds.hazards.After(StreamId::kUpload, {}, {buffer});
  }
  // Copies `bytes` of `src` in plan buffer `buffer` to `dst` on the download stream, once the
  // compute that wrote `buffer` is done.
  static Status ToHost(DeviceState& ds, HostMemorySpan dst, std::string_view buffer,
                       DevicePtr<const std::byte> src, size_t bytes) {
    FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kDownload, {buffer}, {}));
    FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kDownload));
    FERRY_RETURN_IF_ERROR(ds.device->CopyToHost(dst.Sub(0, bytes), src, bytes));
    FERRY_RETURN_IF_ERROR(
        ds.TraceEnd(StreamId::kDownload, 'O', plan::TaskKind::kActivationDownload, double(bytes)));
    return ds.hazards.After(StreamId::kDownload, {buffer}, {});
  }
  // ---- Saved activations on NVMe (plan.activations == Tier::kNvme) ----
  // Every block input that does not start a stage (kind kInput) and every saved set (kSaved) of
  // every micro-batch is an entry of the activation store, written by its forward stage's
  // download stream and read back by its backward stage's upload stream through the devices'
  // staging rings; the reader first waits for the write (its handle in written_), which the
  // micro-batch's landed event orders before it.
  enum EntryKind { kInput = 0, kSavedSet = 1 };
  // One ring slot: the larger of a hidden buffer and a saved set, page-rounded (as the plan).
  size_t StagingSlotBytes() const {
    return plan::RoundUp(std::max(HiddenBytes(), saved_bytes_), plan::kHostPageBytes);
  }
  size_t EntryIndex(EntryKind kind, size_t li, size_t m) const {
    return (size_t(kind) * layers_.size() + li) * size_t(p_.micro_batches) + m;
  }
  static std::string EntryName(EntryKind kind, size_t li, size_t m) {
    return std::string(kind == kInput ? "input." : "saved.") + std::to_string(li) + "." +
           std::to_string(m);
  }
  std::string EntryWhat(size_t i, EntryKind kind, size_t li, size_t m, const char* verb) const {
    return "stage " + std::to_string(i) + ", layer " + std::to_string(li) + ", micro-batch " +
           std::to_string(m) + ": " + verb + " its " +
           (kind == kInput ? "input" : "saved activations") + " on NVMe";
  }

  // Downloads `bytes` of plan buffer `buffer` (at `src`) into the device's next outgoing slot and
  // writes them to the store, all on the download stream: the download waits until the slot's
  // last write is done.
  Status Spill(DeviceState& ds, size_t i, EntryKind kind, size_t li, size_t m,
               std::string_view buffer, DevicePtr<const std::byte> src, size_t bytes) {
    const size_t k = size_t(ds.spills++ % 2);
    PendingIo* ring = &ds.writes[k];
    FERRY_RETURN_IF_ERROR(
        ds.device->LaunchHostFunc(StreamId::kDownload, [ring] { return ring->Wait(); }));
    FERRY_RETURN_IF_ERROR(ToHost(ds, ds.outgoing[k], buffer, src, bytes));
    return ds.device->LaunchHostFunc(
        StreamId::kDownload, [store = store_, ring, written = &written_[EntryIndex(kind, li, m)],
                              name = EntryName(kind, li, m), from = ds.outgoing[k].Sub(0, bytes),
                              what = EntryWhat(i, kind, li, m, "writing")] {
          const TransferHandle h =
              store->WriteAsync(name, from.as<const std::byte>(), TransferPriority::kSpill);
          *ring = {h, what};
          *written = {h, what};
          return Status::Ok();
        });
  }
  // Micro-batch m of backward stage i: lists its entries in upload order (per layer, last
  // first: the saved set unless recomputed, then the input unless it starts the stage) and
  // starts the first two reads, on the upload stream (after its wait for m's inputs).
  Status StartFetches(DeviceState& ds, size_t i, size_t m) {
    const plan::LayerRange r = runs_[i].range;
    ds.fetches.clear();
    ds.fetched = 0;
    for (int li = r.last - 1; li >= r.first; --li) {
      if (!p_.recompute[size_t(li)]) ds.fetches.push_back({kSavedSet, size_t(li), m});
      if (!StageInput(size_t(li))) ds.fetches.push_back({kInput, size_t(li), m});
    }
    for (size_t j = 0; j < std::min<size_t>(2, ds.fetches.size()); ++j) {
      FERRY_RETURN_IF_ERROR(SubmitRead(ds, i, j));
    }
    return Status::Ok();
  }
  // Starts reading entry j of the list into incoming slot j % 2 once its write is done.
  Status SubmitRead(DeviceState& ds, size_t i, size_t j) {
    const EntryKind kind = EntryKind(ds.fetches[j].kind);
    const size_t li = ds.fetches[j].layer, m = ds.fetches[j].micro_batch;
    const size_t bytes = kind == kInput ? HiddenBytes() : saved_bytes_;
    return ds.device->LaunchHostFunc(StreamId::kUpload, [store = store_, ring = &ds.reads[j % 2],
                                                         written =
                                                             &written_[EntryIndex(kind, li, m)],
                                                         name = EntryName(kind, li, m),
                                                         to = ds.incoming[j % 2].Sub(0, bytes),
                                                         what =
                                                             EntryWhat(i, kind, li, m, "reading")] {
      // The slot's last read is done (its upload waited for it, unless a failed step skipped
      // that wait), then this entry's write.
      (void)ring->Wait();
      FERRY_RETURN_IF_ERROR(written->Wait());
      *ring = {store->ReadAsync(name, to.as<std::byte>(), TransferPriority::kActivationNow), what};
      return Status::Ok();
    });
  }
  // Uploads the list's next entry into plan buffer `buffer` (at `dst`) once its read is done,
  // then starts the read two entries on into the slot it leaves.
  Status Fetch(DeviceState& ds, size_t i, std::string_view buffer, DevicePtr<std::byte> dst,
               size_t bytes) {
    const size_t j = ds.fetched++;
    PendingIo* ring = &ds.reads[j % 2];
    FERRY_RETURN_IF_ERROR(
        ds.device->LaunchHostFunc(StreamId::kUpload, [ring] { return ring->Wait(); }));
    FERRY_RETURN_IF_ERROR(ToDevice(ds, buffer, dst, ds.incoming[j % 2], bytes));
    return j + 2 < ds.fetches.size() ? SubmitRead(ds, i, j + 2) : Status::Ok();
  }

  // Enqueues kernels on the compute stream that read `reads` and write `writes`.
  template <typename Kernels>
  static Status Compute(DeviceState& ds, StreamHazards::Names reads, StreamHazards::Names writes,
                        Kernels&& enqueue) {
    FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kCompute, reads, writes));
    FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kCompute));
    FERRY_RETURN_IF_ERROR(enqueue());
    FERRY_RETURN_IF_ERROR(ds.TraceEnd(StreamId::kCompute, 0, plan::TaskKind::kOther));
    return ds.hazards.After(StreamId::kCompute, reads, writes);
  }

  // The bytes between the row layout's two slots in "positions" and "doc_ids" (as the plan).
  size_t LayoutStride() const { return plan::RowLayoutSlotBytes(shape_.tokens()); }
  // Micro-batch m's row layout on the device: slot m % 2 of "positions" (RoPE models; else
  // empty) and "doc_ids".
  std::pair<Tensor, Tensor> Layout(DeviceState& ds, size_t m) {
    const int64_t N = shape_.tokens();
    const size_t offset = (m % 2) * LayoutStride(), bytes = size_t(N) * 4;
    Tensor positions;
    if (ds.regions.count("positions") != 0) {
      positions = {ds.Use("positions", offset + bytes) + std::ptrdiff_t(offset), DType::kI32,
                   Shape{N}};
    }
    return {positions,
            {ds.Use("doc_ids", offset + bytes) + std::ptrdiff_t(offset), DType::kI32, Shape{N}}};
  }
  // Uploads micro-batch m's row layout into its slot (Layout) and points stage `st`'s blocks at
  // it for the micro-batch's calls.
  Status UploadLayout(DeviceState& ds, const StageRun& st, size_t m) {
    const size_t bytes = size_t(shape_.tokens()) * 4;
    const auto [positions, doc_ids] = Layout(ds, m);
    const bool rope = ds.regions.count("positions") != 0;
    FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kUpload, {}, {kLayout[m % 2]}));
    FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kUpload));
    if (rope) {
      FERRY_RETURN_IF_ERROR(
          ds.device->CopyToDevice(positions.data, layout_[m].Sub(0, bytes), bytes));
    }
    FERRY_RETURN_IF_ERROR(
        ds.device->CopyToDevice(doc_ids.data, layout_[m].Sub(bytes, bytes), bytes));
    FERRY_RETURN_IF_ERROR(ds.TraceEnd(StreamId::kUpload, 'I', plan::TaskKind::kActivationUpload,
                                      double(bytes * (rope ? 2 : 1))));
    st.blocks->SetRowLayout(positions, doc_ids);
    return ds.hazards.After(StreamId::kUpload, {}, {kLayout[m % 2]});
  }

  // The accumulator stage `st` adds its gradients into.
  std::string_view GradsOf(const StageRun& st) const {
    return kGrads[accumulators_ > 1 ? st.slot : 0];
  }
  Status ZeroGrads(DeviceState& ds, const StageRun& st) {
    return Compute(ds, {}, {GradsOf(st)}, [&] { return st.params->ZeroGrads(*ds.device); });
  }
  // Stage i's gradients to its host mirror, then grads_landed[i].
  Status DownloadGrads(size_t i) {
    DeviceState& ds = devices_[runs_[i].device];
    FERRY_RETURN_IF_ERROR(ds.hazards.Before(StreamId::kDownload, {GradsOf(runs_[i])}, {}));
    // A stage without gradients (a LoRA job's frozen head) copies nothing: no span, as the plan
    // has no task for it.
    const bool traced = ds.timeline && runs_[i].params->grads_bytes() > 0;
    if (traced) FERRY_RETURN_IF_ERROR(ds.TraceBegin(StreamId::kDownload));
    FERRY_RETURN_IF_ERROR(runs_[i].params->DownloadGrads(*ds.device));
    if (traced) {
      FERRY_RETURN_IF_ERROR(ds.timeline->End(StreamId::kDownload, 'G',
                                             plan::TaskKind::kGradientDownload, int(i), -1,
                                             double(runs_[i].params->grads_bytes())));
    }
    FERRY_RETURN_IF_ERROR(ds.hazards.After(StreamId::kDownload, {GradsOf(runs_[i])}, {}));
    return ds.device->Record(ds.grads_landed[i], StreamId::kDownload);
  }

  Status Embed(const HostTensors& weights, std::span<const MicroBatchInput> batches) {
    FERRY_ASSIGN_OR_RETURN(const HostEmbedding e, FindHostEmbedding(c_, weights));
    const size_t hb = HiddenBytes();
    for (size_t m = 0; m < batches.size(); ++m) {
      HostSpan span(trace_, plan::LaneKind::kHostMemory, plan::TaskKind::kForward, "E", int(m));
      FERRY_RETURN_IF_ERROR(e.ForwardAs(batches[m].tokens, Positions(m), dtype_,
                                        act_[1][m].Sub(0, hb).as<std::byte>(), embed_f32_));
    }
    return Status::Ok();
  }

  Status EmbeddingGrads(std::span<const MicroBatchInput> batches, HostTensors& grads) {
    FERRY_ASSIGN_OR_RETURN(const HostEmbeddingGrads g, FindHostEmbeddingGrads(c_, grads));
    const size_t hb = HiddenBytes();
    for (size_t m = 0; m < batches.size(); ++m) {
      HostSpan span(trace_, plan::LaneKind::kHostMemory, plan::TaskKind::kBackward, "EB", int(m));
      g.BackwardFrom(dtype_, bgrad_[m].Sub(0, hb).as<const std::byte>(), embed_f32_,
                     batches[m].tokens, Positions(m));
    }
    return Status::Ok();
  }

  // The start of saved-set slot `slot` (0 or 1): a block's tensors (compute-dtype activations,
  // fp32 statistics) travel as saved_bytes_ raw bytes.
  static DevicePtr<std::byte> SlotData(DeviceState& ds, int slot) {
    return ds.regions.at(std::string(kSaved[slot])).data;
  }

  // Kept activations: the input of stage `st`'s layer `li` (a block) for micro-batch m in its
  // device's "activations.keep".
  Tensor Kept(DeviceState& ds, const StageRun& st, int li, size_t m) const {
    const size_t entry = st.kept_first + size_t(li - st.range.first) * size_t(p_.micro_batches) + m;
    return Tensor{ds.regions.at("activations.keep").data + std::ptrdiff_t(entry * kept_stride_),
                  dtype_, Shape{shape_.tokens(), c_.hidden_size}};
  }

  // A forward stage that keeps every layer's input and saved set on its device: only the stage's
  // input comes from the host (into its entry, kKeepInput) and its output goes there.
  Status KeptForwardStage(size_t i, Prefetch& next) {
    const StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const size_t hb = HiddenBytes(), M = size_t(p_.micro_batches);
    const std::string_view w = kWeights[st.slot];
    for (size_t m = 0; m < M_; ++m) {
      ds.task_stage = int(i), ds.task_micro_batch = int(m);
      const int yi = int(m % 2);
      FERRY_RETURN_IF_ERROR(AwaitInputs(i, m));
      const Tensor x0 = Kept(ds, st, st.range.first, m);
      ds.Use("activations.keep", (st.kept_first + m) * kept_stride_ + hb);
      FERRY_RETURN_IF_ERROR(
          ToDevice(ds, kKeepInput[m % 2], x0.data, act_[size_t(st.range.first)][m], hb));
      FERRY_RETURN_IF_ERROR(UploadLayout(ds, st, m));
      FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
      for (int li = st.range.first; li < st.range.last; ++li) {
        const int64_t b = li - 1;
        const bool last = li + 1 == st.range.last;
        const Tensor x = Kept(ds, st, li, m), y = last ? Hidden(ds, yi) : Kept(ds, st, li + 1, m);
        const int slot = int(size_t(li - st.range.first) * M + m);
        ++stats_.block_forward_calls;
        FERRY_RETURN_IF_ERROR(Compute(ds,
                                      {"activations.keep", kKeepInput[m % 2], w, kLayout[m % 2]},
                                      {"activations.keep", kHidden[yi], "grad.work"},
                                      [&] { return st.blocks->Forward(b, slot, x, y); }));
      }
      FERRY_RETURN_IF_ERROR(
          ToHost(ds, act_[size_t(st.range.last)][m], kHidden[yi], Hidden(ds, yi).data, hb));
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.landed[m], StreamId::kDownload));
    }
    return FinishPrefetch(next);
  }

  Status ForwardStage(size_t i, Prefetch& next) {
    if (keep_) return KeptForwardStage(i, next);
    const StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const size_t hb = HiddenBytes(), head = layers_.size() - 1;
    const std::string_view w = kWeights[st.slot];
    HiddenRotation& h = ds.forward_hidden;
    for (size_t m = 0; m < M_; ++m) {
      ds.task_stage = int(i), ds.task_micro_batch = int(m);
      int xi = h.in, yi = h.other;
      FERRY_RETURN_IF_ERROR(AwaitInputs(i, m));
      FERRY_RETURN_IF_ERROR(
          ToDevice(ds, kHidden[xi], Hidden(ds, xi).data, act_[size_t(st.range.first)][m], hb));
      FERRY_RETURN_IF_ERROR(UploadLayout(ds, st, m));
      FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
      for (int li = st.range.first; li < st.range.last; ++li) {
        const int64_t b = li - 1;
        const int s = std::exchange(ds.next_saved_slot, 1 - ds.next_saved_slot);
        const Tensor x = Hidden(ds, xi), y = Hidden(ds, yi);
        ++stats_.block_forward_calls;
        FERRY_RETURN_IF_ERROR(Compute(ds, {kHidden[xi], w, kLayout[m % 2]},
                                      {kHidden[yi], kSaved[s], "grad.work"},
                                      [&] { return st.blocks->Forward(b, s, x, y); }));
        // Forward only: nothing is saved, and only the stage's output travels.
        if (!p_.recompute[size_t(li)] && !forward_only_) {
          FERRY_RETURN_IF_ERROR(
              spill_
                  ? Spill(ds, i, kSavedSet, size_t(li), m, kSaved[s], SlotData(ds, s), saved_bytes_)
                  : ToHost(ds, saved_[size_t(li)][m], kSaved[s], SlotData(ds, s), saved_bytes_));
        }
        if (size_t(li) + 1 <= head && (!forward_only_ || li + 1 == st.range.last)) {
          FERRY_RETURN_IF_ERROR(
              spill_ && !StageInput(size_t(li) + 1)
                  ? Spill(ds, i, kInput, size_t(li) + 1, m, kHidden[yi], y.data, hb)
                  : ToHost(ds, act_[size_t(li) + 1][m], kHidden[yi], y.data, hb));
        }
        std::swap(xi, yi);
      }
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.landed[m], StreamId::kDownload));
      h.Next(xi);  // the last layer's output (swapped into x)
    }
    return FinishPrefetch(next);
  }

  Status Tail(size_t i, std::span<const MicroBatchInput> batches, Prefetch& next) {
    const StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const int64_t N = shape_.tokens();
    const int head = int(layers_.size()) - 1;
    const std::string_view w = kWeights[st.slot];
    Head& hd = *st.head;
    // Zeroing the gradients is traced as the part's first micro-batch's compute ("T.<first>"):
    // the plan's schedule has no task of its own for it and counts it in the stage's first compute.
    ds.task_stage = int(i), ds.task_micro_batch = int(st.first_micro_batch);
    if (!forward_only_) FERRY_RETURN_IF_ERROR(ZeroGrads(ds, st));
    HiddenRotation& h = ds.forward_hidden;
    for (size_t m = st.first_micro_batch; m < st.last_micro_batch; ++m) {
      ds.task_micro_batch = int(m);
      const int xi = h.in, dxi = h.other;
      const Tensor x = Hidden(ds, xi), dx = Hidden(ds, dxi);
      FERRY_RETURN_IF_ERROR(AwaitInputs(i, m));
      FERRY_RETURN_IF_ERROR(
          ToDevice(ds, kHidden[xi], x.data, act_[size_t(head)][m], HiddenBytes()));
      // The targets live in the head's workspace (grad.work).
      FERRY_RETURN_IF_ERROR(
          ToDevice(ds, "grad.work", hd.targets().data, targets_[m], size_t(N) * 4));
      FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
      // The per-token loss lives in the head's saved set (saved.slot0).
      FERRY_RETURN_IF_ERROR(
          Compute(ds, {kHidden[xi], w}, {kHidden[dxi], kSaved[0], GradsOf(st), "grad.work"}, [&] {
            return forward_only_
                       ? hd.Forward(x)
                       : hd.ForwardBackward(x, batches[m].normalizer, dx, batches[m].loss_scale);
          }));
      // The loss first: the next micro-batch's compute overwrites it (its slot is the head's
      // one saved set), and behind the gradient's download it would wait for that too.
      FERRY_RETURN_IF_ERROR(ToHost(ds, loss_[m], kSaved[0], hd.token_loss().data, size_t(N) * 4));
      if (!forward_only_) {
        FERRY_RETURN_IF_ERROR(ToHost(ds, bgrad_[m], kHidden[dxi], dx.data, HiddenBytes()));
      }
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.landed[m], StreamId::kDownload));
      h.Next(dxi);
    }
    if (!forward_only_) FERRY_RETURN_IF_ERROR(DownloadGrads(i));
    return FinishPrefetch(next);
  }

  // Generation's tail: the head over the last token's (or every token's) output, its logits to
  // the host.
  Status LogitsTail(size_t i, Prefetch& next) {
    const StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const int64_t n = shape_.tokens(), rows = last_only_ ? 1 : n, V = c_.vocab_size;
    const size_t row = size_t(c_.hidden_size) * DTypeSize(dtype_), lb = size_t(rows * V) * 4;
    ds.task_stage = int(i), ds.task_micro_batch = 0;
    const Tensor x = ds.Hidden(0, rows, c_.hidden_size, dtype_);
    FERRY_RETURN_IF_ERROR(AwaitInputs(i, 0));
    FERRY_RETURN_IF_ERROR(ToDevice(ds, kHidden[0], x.data, act_[layers_.size() - 1][0],
                                   size_t(rows) * row, size_t(n - rows) * row));
    FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
    const Tensor logits{ds.Use("logits", lb), DType::kF32, Shape{rows, V}};
    FERRY_RETURN_IF_ERROR(Compute(ds, {kHidden[0], kWeights[st.slot]}, {"logits", kSaved[0]},
                                  [&] { return st.head->Logits(x, logits); }));
    FERRY_RETURN_IF_ERROR(ToHost(ds, logits_host_, "logits", logits.data, lb));
    FERRY_RETURN_IF_ERROR(ds.device->Record(ds.landed[0], StreamId::kDownload));
    return FinishPrefetch(next);
  }

  Status BackwardStage(size_t i, Prefetch& next) {
    const StageRun& st = runs_[i];
    DeviceState& ds = devices_[st.device];
    const std::string_view w = kWeights[st.slot];
    // Zeroing the gradients is traced as micro-batch 0's compute ("T.0", "B<s>.0"): the plan's
    // schedule has no task of its own for it and counts it in the stage's first compute.
    ds.task_stage = int(i), ds.task_micro_batch = 0;
    FERRY_RETURN_IF_ERROR(ZeroGrads(ds, st));
    // Layer inputs alternate between hidden.1 and hidden.3 (one running counter over the stage's
    // layers and micro-batches), so a layer's input uploads while the layer before it (in
    // backward order) still computes from the other; kept activations are where the forward
    // stage left them. The residual gradient ping-pongs within a micro-batch and turns over
    // three buffers between them (0, 2 and 4; 0, 2 and 1 when the inputs are kept), so the next
    // micro-batch's dY uploads while this one computes and the one before's dX downloads.
    // Saved sets alternate between the slots as in the forward stages, from slot 1: slot 0 is the
    // head's (the tail's set), which the first backward stage after it would wait for.
    int inputs = 0, saves = 1;
    HiddenRotation g{.in = 0, .other = 2, .idle = keep_ ? 1 : 4};
    for (size_t m = 0; m < M_; ++m) {
      ds.task_micro_batch = int(m);
      int dyi = g.in, dxi = g.other;
      FERRY_RETURN_IF_ERROR(AwaitInputs(i, m));
      FERRY_RETURN_IF_ERROR(
          ToDevice(ds, kHidden[dyi], Hidden(ds, dyi).data, bgrad_[m], HiddenBytes()));
      FERRY_RETURN_IF_ERROR(UploadLayout(ds, st, m));
      if (spill_) FERRY_RETURN_IF_ERROR(StartFetches(ds, i, m));
      for (int li = st.range.last - 1; li >= st.range.first; --li) {
        const int64_t b = li - 1;
        if (keep_) {  // the layer's input and saved set are where its forward stage left them
          FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
          const Tensor x = Kept(ds, st, li, m), dy = Hidden(ds, dyi), dx = Hidden(ds, dxi);
          const int kept = int(size_t(li - st.range.first) * size_t(p_.micro_batches) + m);
          FERRY_RETURN_IF_ERROR(Compute(ds, {"activations.keep", kHidden[dyi], w, kLayout[m % 2]},
                                        {kHidden[dxi], GradsOf(st), "grad.work"},
                                        [&] { return st.blocks->Backward(b, kept, x, dy, dx); }));
          std::swap(dyi, dxi);
          continue;
        }
        const int s = saves++ % 2;  // as the forward stages alternate them
        const std::string_view slot = kSaved[s];
        const int xi = inputs++ % 2 == 0 ? 1 : 3;
        const Tensor x = Hidden(ds, xi), dy = Hidden(ds, dyi), dx = Hidden(ds, dxi);
        // The saved set first: its slot is idle while the layer before computes, the input's
        // buffer is not.
        if (!p_.recompute[size_t(li)]) {
          FERRY_RETURN_IF_ERROR(
              spill_ ? Fetch(ds, i, slot, SlotData(ds, s), saved_bytes_)
                     : ToDevice(ds, slot, SlotData(ds, s), saved_[size_t(li)][m], saved_bytes_));
        }
        FERRY_RETURN_IF_ERROR(
            spill_ && !StageInput(size_t(li))
                ? Fetch(ds, i, kHidden[xi], x.data, HiddenBytes())
                : ToDevice(ds, kHidden[xi], x.data, act_[size_t(li)][m], HiddenBytes()));
        FERRY_RETURN_IF_ERROR(PrefetchChunk(next));
        if (p_.recompute[size_t(li)]) {
          ++stats_.block_forward_calls;
          FERRY_RETURN_IF_ERROR(  // dx: scratch output
              Compute(ds, {kHidden[xi], w, kLayout[m % 2]}, {kHidden[dxi], slot, "grad.work"},
                      [&] { return st.blocks->Forward(b, s, x, dx); }));
        }
        FERRY_RETURN_IF_ERROR(Compute(ds, {kHidden[xi], kHidden[dyi], slot, w, kLayout[m % 2]},
                                      {kHidden[dxi], GradsOf(st), "grad.work"},
                                      [&] { return st.blocks->Backward(b, s, x, dy, dx); }));
        std::swap(dyi, dxi);
      }
      // The first block's input gradient feeds the embedding's scatter-add, or nothing when the
      // embedding is frozen (a LoRA job): then it stays on the device.
      if (st.range.first > 1 || !lora_.enabled()) {
        FERRY_RETURN_IF_ERROR(
            ToHost(ds, bgrad_[m], kHidden[dyi], Hidden(ds, dyi).data, HiddenBytes()));
      }
      FERRY_RETURN_IF_ERROR(ds.device->Record(ds.landed[m], StreamId::kDownload));
      g.Next(dyi);  // the last layer's input gradient (swapped into dy)
    }
    FERRY_RETURN_IF_ERROR(DownloadGrads(i));
    return FinishPrefetch(next);
  }

  // Hidden buffer k of a device: (B*T, C) in the compute dtype.
  Tensor Hidden(DeviceState& ds, int k) const {
    return ds.Hidden(k, shape_.tokens(), c_.hidden_size, dtype_);
  }
  // Bytes of one hidden buffer's contents (B*T x C in the compute dtype).
  size_t HiddenBytes() const {
    return size_t(shape_.tokens() * c_.hidden_size) * DTypeSize(dtype_);
  }

  // The pinned host pool staging comes from: the caller's, or own_pool_ (sized to the plan).
  std::unique_ptr<HostPool> own_pool_;
  // Create's isolate_compute: weight copies and the host's gradient adds never run beside a
  // kernel.
  const bool isolate_;
  HostPool* host_pool_;
  // MicroBatchInput::host_pool of the step running (RunStep), else null: the threads that pack
  // the stages' weights into their host mirrors and add their gradients from them.
  ThreadPool* host_threads_ = nullptr;
  NvmeStore* const store_;  // saved activations on NVMe: where (borrowed); else null
  const ModelConfig c_;
  const plan::Plan p_;
  const LoraConfig lora_;
  const DType dtype_;  // weights, activations and activation gradients on the devices
  const EnqueueObserver observer_;
  TraceRecorder* const trace_;        // null: no trace
  const StepHooks* hooks_ = nullptr;  // the step in flight's
  // What the host mirrors and weight slots were packed from: a new version every step, every
  // evaluation and every generated sequence (within one, the weights do not change).
  int64_t weights_version_ = 0;
  // The generation step in flight (Decode), and whether only its last token's logits are
  // wanted. decoding_ is false outside Decode.
  bool decoding_ = false, last_only_ = false;
  // runs_ holds the stages of the last generation step, one token with last_only, whole.
  bool one_token_runs_ = false;
  HostMemorySpan logits_host_;  // generation: the logits' pinned staging
  bool forward_only_ = false;   // the step in flight is an evaluation
  size_t M_ = 0;                // the step in flight's micro-batches
  // Per layer range (forward stage index; the head last): its host mirrors, and the weights
  // version last packed into them.
  std::vector<std::shared_ptr<HostMirrors>> mirrors_;
  // The gradient landing of the tail's parts after the first (training plans with
  // plan.tail_parts > 1), in part order.
  std::vector<std::shared_ptr<HostMirrors>> tail_landing_;
  int64_t parts_ = 1;  // the step in flight's tail parts
  // Per layer range (RangeIndex): the step's stages over it, and those PrepareStreamed has
  // prepared so far.
  std::vector<int> range_readers_, range_prepared_;
  std::vector<int64_t> packed_;
  std::vector<DeviceState> devices_;
  std::vector<LayerSpec> layers_;
  BatchShape shape_;
  size_t saved_bytes_ = 0;
  // Kept activations (plan.keep_activations, training only): a device's "activations.keep"
  // holds, per block of its forward stages this step and micro-batch (entry
  // StageRun::kept_first + (block - the stage's first) * M + m: Kept), its input then its saved
  // slot, kept_stride_ bytes in all, the input's share kept_input_.
  const bool keep_ = p_.keep_activations && !p_.job.forward_only;
  // Gradient accumulators per device (plan.grad_accumulators; none in a forward-only plan).
  const int accumulators_ = p_.job.forward_only ? 1 : p_.grad_accumulators;
  size_t kept_stride_ = 0, kept_input_ = 0;
  // Saved activations on NVMe (a training plan's activations tier): per entry (EntryIndex), its
  // latest write, set on the writing device's download stream and read on the reading device's
  // upload stream after the landed event that orders them.
  const bool spill_ = p_.activations == Tier::kNvme && !p_.job.forward_only && !keep_;
  // The frozen base streamed from NVMe each step (a LoRA training plan's frozen weights there:
  // the model's files, or a copy converted once): DeviceState::images instead of per-range weight
  // mirrors.
  const bool stream_base_ = p_.frozen_weights == Tier::kNvme;
  // What reads a streamed base from the drive, the model's files and the converted copy (plan
  // "weights.base_read").
  std::optional<BaseFileReader> base_reader_;
  std::vector<PendingIo> written_;
  // Training and evaluation stages over the devices and their slots; a LoRA job's step starts
  // where the last one ended, so its stages find their frozen base where the last step left it.
  plan::StageRoundRobin round_robin_{1};  // set for devices_ by the constructor
  // The master copy the step in flight packs its weights from.
  const HostTensors* packed_from_ = nullptr;
  // Per layer range: the master copy its host mirror's frozen tensors were packed from (LoRA
  // jobs), or null.
  std::vector<const HostTensors*> mirror_frozen_;
  std::vector<StageRun> runs_;  // the step in flight
  // The next step's first stage's weights, read ahead (ReadAhead): the stage they were sent for,
  // the weights version they hold (-1: none) and the master copy they were packed from; and,
  // in the step that took them, whether the caller has yet to hear their read.
  StageRun ahead_run_;
  int64_t ahead_version_ = -1;
  const HostTensors* ahead_from_ = nullptr;
  bool ahead_unread_ = false;
  // Pinned host staging (TakeHostStaging): one host-pool block per plan entry, by plan name, and
  // the spans carved from them.
  std::vector<std::pair<std::string, HostBlock>> pinned_;
  HostMemorySpan inv_freq_;                               // RoPE's table (Llama family)
  std::vector<HostMemorySpan> layout_;                    // per micro-batch: positions, doc ids
  std::vector<HostMemorySpan> targets_, loss_, bgrad_;    // per micro-batch
  std::vector<std::vector<HostMemorySpan>> act_, saved_;  // per layer, per micro-batch
  std::vector<float> embed_f32_;  // (N, C) fp32 gather / gradient; empty when dtype_ is f32
  ExecutorStats stats_;
};

Status Validate(const std::vector<Device*>& devices, const ModelConfig& c, const plan::Plan& p,
                const NvmeStore* activation_store) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(c));
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(p.job.lora));
  if (devices.empty()) return Status::InvalidArgument("the executor needs at least one device");
  for (Device* d : devices) {
    // Op scratch depends on the device kind and, on CPU devices, on the thread count.
    const bool cpu = d->kind() == DeviceKind::kCpu;
    const int threads = cpu ? static_cast<const CpuDevice*>(d)->options().compute_threads : 0;
    if (cpu == p.job.scratch.cuda || (cpu && threads != p.job.scratch.cpu_threads)) {
      return Status::InvalidArgument(
          "device '" + d->name() + "' is " +
          (cpu ? "a CPU device with " + std::to_string(threads) + " threads" : "a CUDA device") +
          " but the plan sized op scratch for " +
          (p.job.scratch.cuda ? std::string("CUDA devices")
                              : std::to_string(p.job.scratch.cpu_threads) + "-thread CPU devices") +
          ": plan for the devices it runs on");
    }
  }
  // f16 runs with the Trainer's dynamic loss scaling (engine/train/loss_scaler.h): the executor
  // only passes each micro-batch's loss_scale to the head.
  if (p.job.compute_dtype != DType::kF32 && p.job.compute_dtype != DType::kBF16 &&
      p.job.compute_dtype != DType::kF16) {
    return Status::InvalidArgument(
        "the executor stores weights and activations in f32, bf16 or "
        "f16, not " +
        std::string(DTypeName(p.job.compute_dtype)));
  }
  // Frozen weights on NVMe are streamed from there (the model's files, or a copy converted once:
  // BaseServedFromFiles), for LoRA training only: any other such plan is refused here, before
  // any step, rather than run in RAM against its own memory figures; saved activations go there
  // only through a store. (Optimizer state on NVMe is the Trainer's to honour,
  // OptimizerStateOptions::nvme_dir: the executor never touches it.)
  if (p.frozen_weights != Tier::kHost && !plan::CanStreamBase(p.job)) {
    return Status::InvalidArgument(
        "the plan puts frozen weights on NVMe, which the executor streams for LoRA training "
        "only, not for this job: plan with more host memory, or without an NVMe budget");
  }
  if (p.activations != Tier::kHost && !p.job.forward_only) {
    if (activation_store == nullptr) {
      return Status::InvalidArgument(
          "the plan puts activations on NVMe, and the executor was given no store there: open "
          "one in the job's NVMe directory (--nvme-dir)");
    }
    if (int(devices.size()) != p.gpus) {  // each device has its own staging ring
      return Status::InvalidArgument("the plan stages activations on NVMe for " +
                                     std::to_string(p.gpus) + " devices, the executor runs " +
                                     std::to_string(devices.size()) +
                                     ": plan for the devices it runs on");
    }
  }
  if (p.keep_activations && !p.job.forward_only) {
    if (devices.size() > 2 || int(devices.size()) != p.gpus) {
      return Status::InvalidArgument(
          "the plan keeps activations on its " + std::to_string(p.gpus) +
          " device(s), and the executor runs " + std::to_string(devices.size()) +
          " (kept activations need one device or two): plan for the devices it runs on");
    }
    if (std::any_of(p.recompute.begin(), p.recompute.end(), [](bool r) { return r; })) {
      return Status::InvalidArgument(
          "the plan keeps activations on the device and also recomputes layers: a kept plan "
          "saves every layer (plan it again)");
    }
  }
  if (p.micro_batches < 1 || p.micro_batch_size < 1 || p.job.seq_len < 1) {
    return Status::InvalidArgument("the plan's micro-batches must be at least 1 x 1 x 1");
  }
  const int64_t most_parts = std::min<int64_t>(p.micro_batches, int64_t(devices.size()));
  if (p.tail_parts < 1 || p.tail_parts > most_parts) {
    return Status::InvalidArgument("the plan splits the tail into " + std::to_string(p.tail_parts) +
                                   " parts; it takes 1 to " + std::to_string(most_parts) +
                                   " (its micro-batches, at most one part per device)");
  }
  if (p.grad_accumulators < 1 || p.grad_accumulators > 2) {
    return Status::InvalidArgument("the plan has " + std::to_string(p.grad_accumulators) +
                                   " gradient accumulators per device; it takes 1 or 2");
  }
  if (p.tail_parts > 1 && p.keep_activations && !p.job.forward_only) {
    // A backward stage runs where its forward stage ran only when the tail is one stage.
    return Status::InvalidArgument(
        "the plan keeps activations on the device and splits the tail: a kept plan runs the "
        "tail in one part (plan it again)");
  }
  if (c.learned_positions && p.job.seq_len > c.max_position_embeddings) {
    return Status::InvalidArgument("seq_len " + std::to_string(p.job.seq_len) +
                                   " exceeds the model's " +
                                   std::to_string(c.max_position_embeddings) +
                                   " learned positions; use a shorter sequence length");
  }
  if (int64_t(p.recompute.size()) != c.num_layers + 2) {
    return Status::InvalidArgument("the plan's recompute list has " +
                                   std::to_string(p.recompute.size()) + " entries, expected " +
                                   std::to_string(c.num_layers + 2) + " (one per layer)");
  }
  int next = 1;
  for (const plan::LayerRange& r : p.stages) {
    if (r.first != next || r.last <= r.first) {
      return Status::InvalidArgument("the plan's stages must cover blocks 1.." +
                                     std::to_string(c.num_layers) + " in order without gaps");
    }
    next = r.last;
  }
  if (next != c.num_layers + 1) {
    return Status::InvalidArgument("the plan's stages end at layer " + std::to_string(next - 1) +
                                   ", not at the last block " + std::to_string(c.num_layers));
  }
  return Status::Ok();
}

}  // namespace

NvmeStoreOptions ActivationStoreOptions(const plan::Plan& plan, std::string directory) {
  NvmeStoreOptions o;
  o.directory = std::move(directory);
  o.queue_depth = unsigned(plan::kActivationQueueDepth);  // its bounce buffers: activations.store
  if (plan.memory.nvme_activation_block_bytes > 0) {
    o.block_bytes = plan.memory.nvme_activation_block_bytes;
  }
  for (const plan::Allocation& a : plan.memory.nvme.allocations) {
    if (a.name == "activations.saved") o.segment_bytes = std::max<size_t>(a.bytes, o.block_bytes);
  }
  return o;
}

Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    std::vector<Device*> devices, const ModelConfig& config, const plan::Plan& plan,
    EnqueueObserver observer, TraceRecorder* trace, HostPool* host_pool,
    NvmeStore* activation_store, bool isolate_compute) {
  FERRY_RETURN_IF_ERROR(Validate(devices, config, plan, activation_store));
  if (trace != nullptr && trace->devices() != int(devices.size())) {
    return Status::InvalidArgument("the trace records " + std::to_string(trace->devices()) +
                                   " devices, the executor runs " + std::to_string(devices.size()));
  }
  auto e = std::make_unique<Executor>(std::move(devices), config, plan, std::move(observer), trace,
                                      host_pool, activation_store, isolate_compute);
  FERRY_RETURN_IF_ERROR(e->Init());
  return std::unique_ptr<PipelineExecutor>(std::move(e));
}

}  // namespace ferry::exec
