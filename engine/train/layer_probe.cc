#include "engine/train/layer_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <utility>

#include "engine/model/device_params.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_stack.h"
#include "engine/plan/device_probe.h"
#include "engine/plan/memory_model.h"
#include "kernels/arena.h"
#include "kernels/host_memory.h"

namespace ferry {
namespace {

constexpr uint64_t kF32 = 4;

using Step = std::function<Status()>;

// Runs `steps` (forward, backward: each timed, the device synchronized after it; d == nullptr for
// host work) warmup + repeats times and keeps the medians of the timed runs in `out`: the first
// step's as forward_s, the second's as backward_s (0 without one).
Status MedianOfRuns(Device* d, const LayerProbeOptions& o, std::span<const Step> steps,
                    plan::MeasuredLayerTime& out) {
  FERRY_ASSIGN_OR_RETURN(const std::vector<std::vector<double>> s,
                         plan::TimeRuns(d, o.warmup, o.repeats, steps));
  out.forward_s = plan::MedianOf(s[0]);
  out.backward_s = s.size() > 1 ? plan::MedianOf(s[1]) : 0.0;
  return Status::Ok();
}

// The layers whose master copies a layer's probe needs on the host: the layer, and for a head
// whose weight is tied, the embedding that owns it.
std::vector<LayerSpec> HostLayers(const std::vector<LayerSpec>& all, const LayerSpec& layer) {
  std::vector<LayerSpec> out{layer};
  for (const ParamSpec& p : layer.params) {
    if (!p.tied_to.empty()) out.insert(out.begin(), all.front());
  }
  return out;
}

uint64_t MasterBytes(const std::vector<LayerSpec>& layers) {
  uint64_t bytes = 0;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) bytes += p.tied_to.empty() ? uint64_t(p.numel()) * kF32 : 0;
  }
  return bytes;
}

// Device tensors of one probe: RoPE tables and packed-document ids, the hidden states.
struct ProbeIo {
  Tensor positions, doc_ids, inv_freq, x, y, dy, dx;
};

// Uploads `bytes` from `src` to `dst` through a fresh host mapping; waits for the copy.
Status UploadBytes(Device& d, DevicePtr<std::byte> dst, const void* src, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(HostAllocation host, HostAllocation::Map(bytes, "layer probe staging"));
  std::memcpy(host.data(), src, bytes);
  FERRY_RETURN_IF_ERROR(d.CopyToDevice(dst, host.Whole(), bytes));
  return d.Synchronize(StreamId::kUpload);
}

std::vector<float> RandomNormal(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Allocates and fills the probe's io tensors: positions 0..T-1 per row, one document per row, the
// model's RoPE table, random hidden states and output gradients (in `dtype`, the plan's compute
// dtype, as the executor's stages hold them).
Result<DeviceBuffer> MakeIo(Device& d, const ModelConfig& c, BatchShape micro, DType dtype,
                            std::mt19937_64& rng, ProbeIo& io) {
  const int64_t N = micro.tokens(), C = c.hidden_size;
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer buf, AllocateCarved(d, "probe.io", [&](TensorCarver& cv) {
                           io.positions = cv.Take(DType::kI32, {N});
                           io.doc_ids = cv.Take(DType::kI32, {N});
                           if (!c.learned_positions) {
                             io.inv_freq = cv.Take(DType::kF32, {c.head_dim / 2});
                           }
                           for (Tensor* t : {&io.x, &io.y, &io.dy, &io.dx}) {
                             *t = cv.Take(dtype, {N, C});
                           }
                         }));
  std::vector<int32_t> positions(static_cast<size_t>(N)), docs(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) positions[size_t(n)] = int32_t(n % micro.seq_len);
  FERRY_RETURN_IF_ERROR(UploadBytes(d, io.positions.data, positions.data(), size_t(N) * 4));
  FERRY_RETURN_IF_ERROR(UploadBytes(d, io.doc_ids.data, docs.data(), size_t(N) * 4));
  if (!c.learned_positions) {
    const std::vector<float> inv_freq = RopeInvFreq(c);
    FERRY_RETURN_IF_ERROR(
        UploadBytes(d, io.inv_freq.data, inv_freq.data(), inv_freq.size() * sizeof(float)));
  }
  for (Tensor* t : {&io.x, &io.dy}) {
    const std::vector<float> v = RandomNormal(size_t(N * C), rng);
    std::vector<std::byte> bytes(v.size() * DTypeSize(dtype));
    ConvertFromFloat(v.data(), dtype, bytes.data(), v.size());
    FERRY_RETURN_IF_ERROR(UploadBytes(d, t->data, bytes.data(), bytes.size()));
  }
  return buf;
}

// The layer's parameters on `d` in `dtype`, uploaded from fresh master weights, gradients zeroed.
Result<DeviceParams> LayerParams(Device& d, const ModelConfig& c, const LoraConfig& lora,
                                 DType dtype, const std::vector<LayerSpec>& all,
                                 const LayerSpec& layer, uint64_t seed) {
  FERRY_ASSIGN_OR_RETURN(DeviceParams params, DeviceParams::Create(d, c, lora, {layer}, nullptr,
                                                                   ParamGrads::kAllocate, dtype));
  {
    HostTensors weights = InitMasterWeights(HostLayers(all, layer), seed);
    FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(HostLayers(all, layer), weights));  // QLoRA's NF4
    FERRY_RETURN_IF_ERROR(params.Upload(d, weights));
  }  // the host copy is freed before the timed runs
  FERRY_RETURN_IF_ERROR(params.ZeroGrads(d));
  return params;
}

Status ProbeBlock(Device& d, const ModelConfig& c, const LoraConfig& lora, DType dtype,
                  const std::vector<LayerSpec>& all, const LayerSpec& layer, BatchShape micro,
                  const LayerProbeOptions& o, plan::MeasuredLayerTime& out) {
  std::mt19937_64 rng(o.seed);
  FERRY_ASSIGN_OR_RETURN(DeviceParams params, LayerParams(d, c, lora, dtype, all, layer, o.seed));
  ProbeIo io;
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer io_buffer, MakeIo(d, c, micro, dtype, rng, io));
  FERRY_ASSIGN_OR_RETURN(
      DeviceStack stack,
      BuildDeviceStack(
          d, c, params,
          {.shape = micro,
           .inputs = {.positions = io.positions, .doc_ids = io.doc_ids, .inv_freq = io.inv_freq},
           .first_block = layer.block}));
  std::unique_ptr<DecoderBlocks> blocks = std::move(stack.blocks);
  const Step steps[] = {[&] { return blocks->Forward(layer.block, 0, io.x, io.y); },
                        [&] { return blocks->Backward(layer.block, 0, io.x, io.dy, io.dx); }};
  return MedianOfRuns(&d, o, steps, out);
}

Status ProbeHead(Device& d, const ModelConfig& c, const LoraConfig& lora, DType dtype,
                 const std::vector<LayerSpec>& all, const LayerSpec& layer, BatchShape micro,
                 const LayerProbeOptions& o, plan::MeasuredLayerTime& out) {
  std::mt19937_64 rng(o.seed);
  const int64_t N = micro.tokens();
  FERRY_ASSIGN_OR_RETURN(DeviceParams params, LayerParams(d, c, lora, dtype, all, layer, o.seed));
  ProbeIo io;
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer io_buffer, MakeIo(d, c, micro, dtype, rng, io));
  FERRY_ASSIGN_OR_RETURN(DeviceStack stack,
                         BuildDeviceStack(d, c, params,
                                          {.shape = micro,
                                           .blocks = false,
                                           .head = HeadMode::kTrain,
                                           .loss_chunk_tokens = plan::kLossChunkTokens}));
  std::unique_ptr<Head> head = std::move(stack.head);
  std::uniform_int_distribution<int32_t> token(0, int32_t(c.vocab_size - 1));
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int32_t& t : targets) t = token(rng);
  FERRY_RETURN_IF_ERROR(UploadBytes(d, head->targets().data, targets.data(), size_t(N) * 4));
  const Step steps[] = {[&] { return head->Forward(io.x); },
                        [&] { return head->ForwardBackward(io.x, double(N), io.dx); }};
  FERRY_ASSIGN_OR_RETURN(const std::vector<std::vector<double>> s,
                         plan::TimeRuns(&d, o.warmup, o.repeats, steps));
  // backward_s: the fused pass less the loss-only pass of the same run.
  std::vector<double> backward(s[1].size());
  for (size_t r = 0; r < backward.size(); ++r) backward[r] = std::max(0.0, s[1][r] - s[0][r]);
  out.forward_s = plan::MedianOf(s[0]);
  out.backward_s = plan::MedianOf(backward);
  return Status::Ok();
}

// The embedding runs on the host (engine/model/embedding.h): no device.
Status ProbeEmbedding(const ModelConfig& c, const LayerSpec& layer, BatchShape micro,
                      const LayerProbeOptions& o, plan::MeasuredLayerTime& out) {
  std::mt19937_64 rng(o.seed);
  const int64_t N = micro.tokens(), C = c.hidden_size;
  HostTensors weights = InitMasterWeights({layer}, o.seed);
  FERRY_ASSIGN_OR_RETURN(const HostEmbedding e, FindHostEmbedding(c, weights));
  std::vector<int32_t> tokens(static_cast<size_t>(N)), positions;
  std::uniform_int_distribution<int32_t> token(0, int32_t(c.vocab_size - 1));
  for (int32_t& t : tokens) t = token(rng);
  if (c.learned_positions) {
    for (int64_t n = 0; n < N; ++n) positions.push_back(int32_t(n % micro.seq_len));
  }
  bool trainable = false;
  for (const ParamSpec& p : layer.params) trainable = trainable || p.trainable;
  std::vector<float> hidden(size_t(N * C)), dwte(trainable ? e.wte.size() : 0);
  std::vector<float> dwpe(trainable ? e.wpe.size() : 0);
  const HostEmbeddingGrads g{e.shape, dwte, dwpe};
  const Step steps[] = {[&] { return e.Forward(tokens, positions, hidden); },
                        [&] {
                          g.Backward(hidden, tokens, positions);
                          return Status::Ok();
                        }};
  // A frozen table has no backward: only the gather is run (backward_s 0).
  return MedianOfRuns(nullptr, o, std::span(steps, trainable ? 2 : 1), out);
}

}  // namespace

LayerProbeBytes LayerProbeNeeds(const ModelConfig& c, const plan::PlanJob& job,
                                const LayerSpec& layer, BatchShape micro,
                                const LayerProbeOptions& o) {
  const std::vector<LayerSpec> all = BuildLayerSpecs(c, job.lora, job.compute_dtype);
  // (Sized in f32, an upper bound for bf16 and f16 storage; the scratch as the dtype asks.)
  const uint64_t N = uint64_t(micro.tokens()), C = uint64_t(c.hidden_size);
  const uint64_t hidden = N * C * kF32;
  LayerProbeBytes b;
  if (layer.kind == LayerKind::kEmbedding) {
    // Tables, their gradients when trainable, tokens, positions, the hidden state.
    const uint64_t tables = MasterBytes({layer});
    b.host = tables * (layer.params.front().trainable ? 2 : 1) + hidden + 2 * N * 4;
    return b;
  }
  // Host: fresh master weights while uploading, the staging of one io tensor at a time.
  b.host = MasterBytes(HostLayers(all, layer)) + hidden;
  // Device: weights (a tied head weight has its own device copy), gradients of trainable ones
  // (a frozen LM head gets a V x C sink: the fused op always accumulates a dW), the io tensors,
  // one saved set, the workspace (a few hidden states and the MLP width, and for the head the
  // logits chunk and its gradient) and the largest op scratch; a quarter more for the LoRA packing
  // (block-diagonal B), alignment and per-op temporaries.
  uint64_t device = 0;
  for (const ParamSpec& p : layer.params) {
    const bool sink = layer.kind == LayerKind::kHead && !p.trainable;
    device += uint64_t(p.numel()) * kF32 * (p.trainable || sink ? 2 : 1);
  }
  const LayerCost cost = ComputeLayerCost(c, job.lora, layer, micro);
  device += 4 * hidden + 2 * N * 4 + uint64_t(c.head_dim) * 2;
  device += cost.saved_bytes + N * (8 * C + 4 * uint64_t(c.intermediate_size)) * kF32;
  if (layer.kind == LayerKind::kHead) {
    device += 2 * std::min<uint64_t>(N, plan::kLossChunkTokens) * uint64_t(c.vocab_size) * kF32;
  }
  device += plan::OpScratchBytes(c, layer, micro, job.compute_dtype,
                                 {.cuda = !o.device_memory_is_host, .cpu_threads = o.cpu_threads});
  b.device = device + device / 4 + (uint64_t(16) << 20);
  return b;
}

uint64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string name;
    uint64_t kib = 0;
    if (in >> name >> kib && name == "MemAvailable:") return kib * 1024;
  }
  return uint64_t(::sysconf(_SC_AVPHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
}

Result<std::vector<LayerProbeEntry>> ProbeLayerTimes(const ModelConfig& model,
                                                     const plan::PlanJob& job, int gpus,
                                                     const ProbeDeviceFactory& make_device,
                                                     const LayerProbeOptions& o) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(model));
  FERRY_RETURN_IF_ERROR(ValidateTrainingLora(job.lora));
  // Each layer runs in the plan's storage dtype, as the executor's stages hold it (CPU devices
  // do the math in f32 whatever the storage).
  if (job.fp16_accumulate) {
    return Status::InvalidArgument(
        "fp16acc: the layer probe does not measure fp16-accumulating GEMMs yet (plan prices them "
        "at the profile's fp16-accumulate rate); probe with --dtype f16");
  }
  if (job.global_batch < 1 || job.seq_len < 1 || gpus < 1 || o.repeats < 1 || o.warmup < 0 ||
      (job.micro_batches > 0 && job.global_batch % job.micro_batches != 0)) {
    return Status::InvalidArgument(
        "layer probe: batch, sequence length and repeats must be at least 1 and --micro-batches "
        "must divide --batch-size");
  }
  const std::vector<LayerSpec> all = BuildLayerSpecs(model, job.lora, job.compute_dtype);
  const std::vector<plan::LayerTimeQuery> queries = plan::LayerTimeQueries(model, job, gpus);
  const uint64_t available = o.host_memory_bytes > 0 ? o.host_memory_bytes : AvailableHostMemory();
  std::vector<LayerProbeEntry> out;
  for (const plan::LayerTimeQuery& q : queries) {
    const LayerSpec& layer = all[size_t(q.layer)];
    LayerProbeEntry e{{q.key, 0, 0}, layer.name, q.micro, {}};
    e.bytes = LayerProbeNeeds(model, job, layer, q.micro, o);
    const uint64_t need = e.bytes.host + (o.device_memory_is_host ? e.bytes.device : 0);
    if (need > available) {
      return Status::OutOfMemory(
          "layer probe: " + layer.name + " at " + std::to_string(q.micro.batch) + " x " +
          std::to_string(q.micro.seq_len) + " tokens needs " + FormatBytes(need) +
          " of host memory (" + FormatBytes(e.bytes.host) + " host copies" +
          (o.device_memory_is_host ? " + " + FormatBytes(e.bytes.device) + " device arena" : "") +
          "), " + FormatBytes(available) +
          " available; probe a shorter --seq-len, fewer sequences per micro-batch (more "
          "--micro-batches) or on a machine with more RAM");
    }
    out.push_back(std::move(e));
  }
  for (LayerProbeEntry& e : out) {
    const LayerSpec& layer = *std::find_if(all.begin(), all.end(),
                                           [&](const LayerSpec& l) { return l.name == e.layer; });
    if (layer.kind == LayerKind::kEmbedding) {
      FERRY_RETURN_IF_ERROR(ProbeEmbedding(model, layer, e.micro, o, e.time));
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Device> d, make_device(size_t(e.bytes.device)));
    const Status s =
        layer.kind == LayerKind::kHead
            ? ProbeHead(*d, model, job.lora, job.compute_dtype, all, layer, e.micro, o, e.time)
            : ProbeBlock(*d, model, job.lora, job.compute_dtype, all, layer, e.micro, o, e.time);
    FERRY_RETURN_IF_ERROR(s.WithContext("layer probe of " + layer.name));
  }
  return out;
}

void MergeLayerTimes(const std::vector<LayerProbeEntry>& times, plan::HardwareProfile& profile) {
  for (const LayerProbeEntry& e : times) {
    auto same = [&](const plan::MeasuredLayerTime& t) { return t.key == e.time.key; };
    auto it = std::find_if(profile.layer_times.begin(), profile.layer_times.end(), same);
    if (it != profile.layer_times.end()) {
      *it = e.time;
    } else {
      profile.layer_times.push_back(e.time);
    }
  }
}

}  // namespace ferry
