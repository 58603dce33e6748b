// PipelineExecutor's implementation (the contract is in pipeline_executor.h).
#include "engine/exec/pipeline_executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "engine/model/device_params.h"
#include "engine/model/model_stack.h"
#include "kernels/arena.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/host_memory.h"

namespace ferry::exec {
namespace {

struct Region {
  DevicePtr<std::byte> data;
  size_t bytes = 0;
};

// One device's planned arena blocks, by plan name.
struct DeviceState {
  Device* device = nullptr;
  std::vector<DeviceBuffer> buffers;
  std::map<std::string, Region, std::less<>> regions;
  std::map<std::string, size_t, std::less<>> used;  // plan name -> most bytes a component used
  int64_t stages_run = 0;
  // The start of plan allocation `name`, counting `bytes` of it as used (the executor's own
  // direct uses; components carve through PlannedSource, which counts theirs).
  DevicePtr<std::byte> Use(const std::string& name, size_t bytes) {
    size_t& u = used[name];
    u = std::max(u, bytes);
    return regions.at(name).data;
  }
  Tensor Hidden(int k, int64_t n, int64_t c) {
    return Tensor{Use("hidden." + std::to_string(k), size_t(n * c) * 4), DType::kF32, Shape{n, c}};
  }
};

// Places a stage's components into the device's planned blocks (see the header's table).
class PlannedSource final : public CarveSource {
 public:
  PlannedSource(DeviceState& ds, int weight_slot) : ds_(ds) {
    const std::string w = "weights.slot" + std::to_string(weight_slot);
    map_ = {{"params.weights", w},
            {"params.grads", "grads.accum"},
            {"blocks.saved.0", "saved.slot0"},
            {"blocks.saved.1", "saved.slot1"},
            {"head.saved", "saved.slot0"},
            {"blocks.workspace", "grad.work"},
            {"head.workspace", "grad.work"},
            {"blocks.scratch", "scratch"},
            {"head.scratch", "scratch"}};
  }

  Result<DevicePtr<std::byte>> Region(std::string_view requester, size_t bytes) override {
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
  std::map<std::string, std::string, std::less<>> map_;
};

// Copies ordered after the compute enqueued so far on `d` and before the compute enqueued next
// (ToDevice reads `bytes` of `src` from `offset`).
Status ToDevice(Device& d, DevicePtr<std::byte> dst, const HostAllocation& src, size_t bytes,
                size_t offset = 0) {
  FERRY_ASSIGN_OR_RETURN(Event computed, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(computed, StreamId::kCompute));
  FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kUpload, computed));
  FERRY_RETURN_IF_ERROR(d.CopyToDevice(dst, src.Span(offset, bytes), bytes));
  FERRY_ASSIGN_OR_RETURN(Event uploaded, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(uploaded, StreamId::kUpload));
  return d.Wait(StreamId::kCompute, uploaded);
}
Status ToHost(Device& d, const HostAllocation& dst, DevicePtr<const std::byte> src, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(Event computed, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(computed, StreamId::kCompute));
  FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kDownload, computed));
  FERRY_RETURN_IF_ERROR(d.CopyToHost(dst.Span(0, bytes), src, bytes));
  FERRY_ASSIGN_OR_RETURN(Event downloaded, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(downloaded, StreamId::kDownload));
  return d.Wait(StreamId::kCompute, downloaded);
}

Result<HostAllocation> HostBuffer(size_t bytes, std::string name) {
  return HostAllocation::Map(std::max<size_t>(bytes, 1), std::move(name));
}

class Executor final : public PipelineExecutor {
 public:
  Executor(std::vector<Device*> devices, const ModelConfig& c, const plan::Plan& p)
      : c_(c), p_(p), lora_(p.job.lora) {
    for (Device* d : devices) devices_.push_back(DeviceState{d, {}, {}, {}, 0});
  }

  ~Executor() override {
    for (DeviceState& ds : devices_) (void)ds.device->Synchronize();
  }

  Status Init() {
    layers_ = BuildLayerSpecs(c_, lora_);
    shape_ = {p_.micro_batch_size, p_.job.seq_len};
    const int64_t N = shape_.tokens(), C = c_.hidden_size;
    for (DeviceState& ds : devices_) {
      for (const plan::Allocation& a : p_.memory.gpu.allocations) {
        FERRY_ASSIGN_OR_RETURN(DeviceBuffer b, ds.device->Allocate(a.bytes, a.name));
        ds.regions[a.name] = {b.data(), a.bytes};
        ds.buffers.push_back(std::move(b));
      }
      for (const char* name :
           {"hidden.0", "hidden.1", "hidden.2", "saved.slot0", "saved.slot1", "doc_ids"}) {
        if (!ds.regions.count(name)) {
          return Status::InvalidArgument(std::string("the plan's GPU map lacks '") + name + "'");
        }
      }
      if (ds.regions.at("hidden.0").bytes < size_t(N * C) * 4) {
        return Status::InvalidArgument("the plan's hidden buffers are smaller than B*T x C f32");
      }
    }
    saved_bytes_ = devices_[0].regions.at("saved.slot0").bytes;
    // Host staging: RoPE's table; per micro-batch the row layout (positions, then doc ids),
    // targets, losses, boundary gradients; per layer and micro-batch its input and (unless
    // recomputed) saved set.
    const size_t M = size_t(p_.micro_batches), head = layers_.size() - 1;
    act_.resize(layers_.size());
    saved_.resize(layers_.size());
    for (size_t m = 0; m < M; ++m) {
      FERRY_ASSIGN_OR_RETURN(HostAllocation r, HostBuffer(size_t(N) * 8, "executor row layout"));
      layout_.push_back(std::move(r));
      FERRY_ASSIGN_OR_RETURN(HostAllocation t, HostBuffer(size_t(N) * 4, "executor targets"));
      targets_.push_back(std::move(t));
      FERRY_ASSIGN_OR_RETURN(HostAllocation l, HostBuffer(size_t(N) * 4, "executor losses"));
      loss_.push_back(std::move(l));
      FERRY_ASSIGN_OR_RETURN(HostAllocation g, HostBuffer(size_t(N * C) * 4, "activations.grad"));
      bgrad_.push_back(std::move(g));
      for (size_t li = 1; li <= head; ++li) {
        FERRY_ASSIGN_OR_RETURN(HostAllocation a, HostBuffer(size_t(N * C) * 4, "layer input"));
        act_[li].push_back(std::move(a));
        if (li == head || p_.recompute[li]) continue;
        FERRY_ASSIGN_OR_RETURN(HostAllocation s, HostBuffer(saved_bytes_, "activations.saved"));
        saved_[li].push_back(std::move(s));
      }
    }
    if (c_.learned_positions) return Status::Ok();
    // RoPE's inverse frequencies (plain or Llama 3-scaled), uploaded once to every device.
    const std::vector<float> inv_freq = RopeInvFreq(c_);
    const size_t fb = inv_freq.size() * sizeof(float);
    FERRY_ASSIGN_OR_RETURN(inv_freq_, HostBuffer(fb, "executor rope table"));
    std::memcpy(inv_freq_.data(), inv_freq.data(), fb);
    for (DeviceState& ds : devices_) {
      auto it = ds.regions.find("rope.inv_freq");
      if (it == ds.regions.end() || it->second.bytes < fb) {
        return Status::InvalidArgument("the plan's GPU map lacks a 'rope.inv_freq' of " +
                                       FormatBytes(fb) + ": re-plan with this version");
      }
      FERRY_RETURN_IF_ERROR(ToDevice(*ds.device, ds.Use("rope.inv_freq", fb), inv_freq_, fb));
      FERRY_RETURN_IF_ERROR(ds.device->Synchronize(StreamId::kUpload));
    }
    return Status::Ok();
  }

  Result<double> Step(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                      HostTensors& grads) override {
    Result<double> r = RunStep(weights, batches, grads);
    if (!r.ok()) {
      for (DeviceState& ds : devices_) (void)ds.device->Synchronize();
    }
    return r;
  }

  ExecutorStats stats() const override {
    ExecutorStats s = stats_;
    std::map<std::string, size_t> used;
    for (const DeviceState& ds : devices_) {
      for (const auto& [name, bytes] : ds.used) used[name] = std::max(used[name], bytes);
    }
    for (const auto& [name, bytes] : used) s.used.push_back({name, bytes});
    return s;
  }

 private:
  Result<double> RunStep(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                         HostTensors& grads) {
    const int64_t N = shape_.tokens();
    if (int64_t(batches.size()) != p_.micro_batches) {
      return Status::InvalidArgument("the plan runs " + std::to_string(p_.micro_batches) +
                                     " micro-batches per step, got " +
                                     std::to_string(batches.size()));
    }
    for (size_t m = 0; m < batches.size(); ++m) {
      if (int64_t(batches[m].targets.size()) != N || !(batches[m].normalizer > 0)) {
        return Status::InvalidArgument("micro-batch " + std::to_string(m) +
                                       ": targets must hold B*T ids and the normalizer be > 0");
      }
      std::memcpy(targets_[m].data(), batches[m].targets.data(), size_t(N) * 4);
      FERRY_RETURN_IF_ERROR(SetLayout(m, batches[m]));
    }
    FERRY_RETURN_IF_ERROR(Embed(weights, batches));
    stats_.stages_run = 0;
    const int64_t S = int64_t(p_.stages.size());
    for (int64_t s = 0; s < S; ++s) {
      FERRY_RETURN_IF_ERROR(ForwardStage(Next(), p_.stages[size_t(s)], weights));
    }
    // The first micro-batch's overwrite request covers the step: each stage stores its
    // gradients, and what no stage wrote is zeroed before the embedding's scatter-add.
    GradOverwrite overwrite;
    GradOverwrite* ow = batches.front().overwrite_grads ? &overwrite : nullptr;
    FERRY_RETURN_IF_ERROR(Tail(Next(), weights, batches, grads, ow));
    for (int64_t s = S - 1; s >= 0; --s) {
      FERRY_RETURN_IF_ERROR(BackwardStage(Next(), p_.stages[size_t(s)], weights, grads, ow));
    }
    if (ow != nullptr) ow->ZeroUnwritten(grads);
    if (!lora_.enabled()) FERRY_RETURN_IF_ERROR(EmbeddingGrads(batches, grads));
    double total = 0;
    for (size_t m = 0; m < batches.size(); ++m) {
      const float* loss = reinterpret_cast<const float*>(loss_[m].data());
      double sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += loss[n];
      total += sum / batches[m].normalizer;
    }
    return total;
  }

  // The device the global counter hands the next stage to.
  DeviceState& Next() {
    DeviceState& ds = devices_[size_t(counter_++ % int64_t(devices_.size()))];
    ++stats_.stages_run;
    return ds;
  }

  // Micro-batch m's positions (learned-position models only: RoPE reads them on the device).
  std::span<const int32_t> Positions(size_t m) const {
    if (!c_.learned_positions) return {};
    return {reinterpret_cast<const int32_t*>(layout_[m].data()), size_t(shape_.tokens())};
  }

  // Writes micro-batch m's row layout into its staging: positions (0..T-1 per row unless packed)
  // then document ids (one document per row unless packed), as ModelRunner does.
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

  // Uploads micro-batch m's row layout into the device's "positions" (RoPE models) and "doc_ids".
  Status UploadLayout(DeviceState& ds, size_t m) {
    const size_t bytes = size_t(shape_.tokens()) * 4;
    if (ds.regions.count("positions")) {
      FERRY_RETURN_IF_ERROR(ToDevice(*ds.device, ds.Use("positions", bytes), layout_[m], bytes));
    }
    return ToDevice(*ds.device, ds.Use("doc_ids", bytes), layout_[m], bytes, bytes);
  }

  Status Embed(const HostTensors& weights, std::span<const MicroBatchInput> batches) {
    FERRY_ASSIGN_OR_RETURN(const HostEmbedding e, FindHostEmbedding(c_, weights));
    const size_t n = size_t(shape_.tokens() * c_.hidden_size);
    for (size_t m = 0; m < batches.size(); ++m) {
      std::span<float> out(reinterpret_cast<float*>(act_[1][m].data()), n);
      FERRY_RETURN_IF_ERROR(e.Forward(batches[m].tokens, Positions(m), out));
    }
    return Status::Ok();
  }

  Status EmbeddingGrads(std::span<const MicroBatchInput> batches, HostTensors& grads) {
    FERRY_ASSIGN_OR_RETURN(const HostEmbeddingGrads g, FindHostEmbeddingGrads(c_, grads));
    const size_t n = size_t(shape_.tokens() * c_.hidden_size);
    for (size_t m = 0; m < batches.size(); ++m) {
      g.Backward({reinterpret_cast<const float*>(bgrad_[m].data()), n}, batches[m].tokens,
                 Positions(m));
    }
    return Status::Ok();
  }

  // A stage's parameters in the next weight slot of `ds`, uploaded and with zeroed gradients.
  Result<DeviceParams> StageParams(DeviceState& ds, PlannedSource& src, plan::LayerRange r,
                                   const HostTensors& weights) {
    std::vector<LayerSpec> layers(layers_.begin() + r.first, layers_.begin() + r.last);
    FERRY_ASSIGN_OR_RETURN(DeviceParams params,
                           DeviceParams::Create(*ds.device, c_, lora_, layers, &src));
    FERRY_RETURN_IF_ERROR(params.Upload(*ds.device, weights));
    FERRY_RETURN_IF_ERROR(params.ZeroGrads(*ds.device));
    return params;
  }

  Result<std::unique_ptr<DecoderBlocks>> StageBlocks(DeviceState& ds, PlannedSource& src,
                                                     const DeviceParams& params,
                                                     plan::LayerRange r) {
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
            *ds.device, c_, params,
            {.shape = shape_,
             .inputs = {.positions = positions,
                        .doc_ids = {ds.regions.at("doc_ids").data, DType::kI32, tokens},
                        .inv_freq = inv_freq},  // RopeInvFreq: plain or Llama 3-scaled
             .num_slots = 2,
             .first_block = r.first - 1,
             .source = &src}));
    return std::move(stack.blocks);
  }

  Tensor SlotTensor(DeviceState& ds, int64_t block) const {
    const Region& r = ds.regions.at("saved.slot" + std::to_string(block % 2));
    return Tensor{r.data, DType::kF32, Shape{int64_t(saved_bytes_ / 4)}};
  }

  Status ForwardStage(DeviceState& ds, plan::LayerRange r, const HostTensors& weights) {
    Device& d = *ds.device;
    const int64_t N = shape_.tokens(), C = c_.hidden_size;
    const size_t hb = size_t(N * C) * 4, head = layers_.size() - 1;
    PlannedSource src(ds, int(ds.stages_run++ % 2));
    FERRY_ASSIGN_OR_RETURN(DeviceParams params, StageParams(ds, src, r, weights));
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<DecoderBlocks> blocks, StageBlocks(ds, src, params, r));
    for (size_t m = 0; m < size_t(p_.micro_batches); ++m) {
      Tensor x = ds.Hidden(0, N, C), y = ds.Hidden(1, N, C);
      FERRY_RETURN_IF_ERROR(UploadLayout(ds, m));
      FERRY_RETURN_IF_ERROR(ToDevice(d, x.data, act_[size_t(r.first)][m], hb));
      for (int li = r.first; li < r.last; ++li) {
        const int64_t b = li - 1;
        ++stats_.block_forward_calls;
        FERRY_RETURN_IF_ERROR(blocks->Forward(b, int(b % 2), x, y));
        if (!p_.recompute[size_t(li)]) {
          FERRY_RETURN_IF_ERROR(
              ToHost(d, saved_[size_t(li)][m], SlotTensor(ds, b).data, saved_bytes_));
        }
        if (size_t(li) + 1 <= head) {
          FERRY_RETURN_IF_ERROR(ToHost(d, act_[size_t(li) + 1][m], y.data, hb));
        }
        std::swap(x, y);
      }
    }
    return d.Synchronize();
  }

  Status Tail(DeviceState& ds, const HostTensors& weights, std::span<const MicroBatchInput> batches,
              HostTensors& grads, GradOverwrite* overwrite) {
    Device& d = *ds.device;
    const int64_t N = shape_.tokens(), C = c_.hidden_size;
    const int head = int(layers_.size()) - 1;
    PlannedSource src(ds, int(ds.stages_run++ % 2));
    FERRY_ASSIGN_OR_RETURN(DeviceParams params, StageParams(ds, src, {head, head + 1}, weights));
    FERRY_ASSIGN_OR_RETURN(DeviceStack stack,
                           BuildDeviceStack(d, c_, params,
                                            {.shape = shape_,
                                             .blocks = false,
                                             .head = HeadMode::kTrain,
                                             .loss_chunk_tokens = plan::kLossChunkTokens,
                                             .source = &src}));
    std::unique_ptr<Head> h = std::move(stack.head);
    for (size_t m = 0; m < batches.size(); ++m) {
      Tensor x = ds.Hidden(0, N, C), dx = ds.Hidden(1, N, C);
      FERRY_RETURN_IF_ERROR(ToDevice(d, x.data, act_[size_t(head)][m], size_t(N * C) * 4));
      FERRY_RETURN_IF_ERROR(ToDevice(d, h->targets().data, targets_[m], size_t(N) * 4));
      FERRY_RETURN_IF_ERROR(h->ForwardBackward(x, batches[m].normalizer, dx));
      FERRY_RETURN_IF_ERROR(ToHost(d, bgrad_[m], dx.data, size_t(N * C) * 4));
      FERRY_RETURN_IF_ERROR(ToHost(d, loss_[m], h->token_loss().data, size_t(N) * 4));
    }
    FERRY_RETURN_IF_ERROR(d.Synchronize());
    return params.DownloadAndAddGrads(d, grads, overwrite);
  }

  Status BackwardStage(DeviceState& ds, plan::LayerRange r, const HostTensors& weights,
                       HostTensors& grads, GradOverwrite* overwrite) {
    Device& d = *ds.device;
    const int64_t N = shape_.tokens(), C = c_.hidden_size;
    const size_t hb = size_t(N * C) * 4;
    PlannedSource src(ds, int(ds.stages_run++ % 2));
    FERRY_ASSIGN_OR_RETURN(DeviceParams params, StageParams(ds, src, r, weights));
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<DecoderBlocks> blocks, StageBlocks(ds, src, params, r));
    for (size_t m = 0; m < size_t(p_.micro_batches); ++m) {
      Tensor dy = ds.Hidden(0, N, C), x = ds.Hidden(1, N, C), dx = ds.Hidden(2, N, C);
      FERRY_RETURN_IF_ERROR(UploadLayout(ds, m));
      FERRY_RETURN_IF_ERROR(ToDevice(d, dy.data, bgrad_[m], hb));
      for (int li = r.last - 1; li >= r.first; --li) {
        const int64_t b = li - 1;
        FERRY_RETURN_IF_ERROR(ToDevice(d, x.data, act_[size_t(li)][m], hb));
        if (p_.recompute[size_t(li)]) {
          ++stats_.block_forward_calls;
          FERRY_RETURN_IF_ERROR(blocks->Forward(b, int(b % 2), x, dx));  // dx: scratch output
        } else {
          FERRY_RETURN_IF_ERROR(
              ToDevice(d, SlotTensor(ds, b).data, saved_[size_t(li)][m], saved_bytes_));
        }
        FERRY_RETURN_IF_ERROR(blocks->Backward(b, int(b % 2), x, dy, dx));
        std::swap(dy, dx);
      }
      FERRY_RETURN_IF_ERROR(ToHost(d, bgrad_[m], dy.data, hb));
    }
    FERRY_RETURN_IF_ERROR(d.Synchronize());
    return params.DownloadAndAddGrads(d, grads, overwrite);
  }

  const ModelConfig c_;
  const plan::Plan p_;
  const LoraConfig lora_;
  std::vector<DeviceState> devices_;
  std::vector<LayerSpec> layers_;
  BatchShape shape_;
  size_t saved_bytes_ = 0;
  int64_t counter_ = 0;                 // the global stage counter (round robin over devices)
  HostAllocation inv_freq_;             // RoPE's table (Llama family)
  std::vector<HostAllocation> layout_;  // per micro-batch: positions, doc ids
  std::vector<HostAllocation> targets_, loss_, bgrad_;    // per micro-batch
  std::vector<std::vector<HostAllocation>> act_, saved_;  // per layer, per micro-batch
  ExecutorStats stats_;
};

Status Validate(const std::vector<Device*>& devices, const ModelConfig& c, const plan::Plan& p) {
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
  if (p.job.compute_dtype != DType::kF32) {
    return Status::InvalidArgument(
        "the executor computes in f32 only for now: plan with compute dtype f32");
  }
  if (p.micro_batches < 1 || p.micro_batch_size < 1 || p.job.seq_len < 1) {
    return Status::InvalidArgument("the plan's micro-batches must be at least 1 x 1 x 1");
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

Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(std::vector<Device*> devices,
                                                                   const ModelConfig& config,
                                                                   const plan::Plan& plan) {
  FERRY_RETURN_IF_ERROR(Validate(devices, config, plan));
  auto e = std::make_unique<Executor>(std::move(devices), config, plan);
  FERRY_RETURN_IF_ERROR(e->Init());
  return std::unique_ptr<PipelineExecutor>(std::move(e));
}

}  // namespace ferry::exec
