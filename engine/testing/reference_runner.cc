// The reference runner: host embedding, DecoderBlocks, Head over DeviceParams, with per-block
// recomputation (engine/testing/reference_runner.h; engine/model/model_runner.h has the contract).
#include "engine/testing/reference_runner.h"

#include <cstring>

#include "engine/model/device_params.h"
#include "engine/model/model_stack.h"
#include "engine/model/tensor_carver.h"
#include "kernels/ops/gemm.h"

namespace ferry {
namespace {

// Byte offsets of the regions of the host staging allocation.
struct Staging {
  size_t hidden = 0;     // (N, C) compute dtype: block 0's input up, its gradient down
  size_t targets = 0;    // (N) i32
  size_t positions = 0;  // (N) i32
  size_t doc_ids = 0;    // (N) i32
  size_t loss = 0;       // (N) f32
  size_t inv_freq = 0;   // (head_dim / 2) f32: RoPE's table, uploaded once
  size_t bytes = 0;
};

class Runner final : public ModelRunner {
 public:
  Runner(Device& d, const ModelConfig& c, const LoraConfig& lora, const ReferenceRunnerOptions& o)
      : d_(d), c_(c), lora_(lora), o_(o) {}

  Status Init() {
    const int64_t N = o_.shape.tokens(), C = c_.hidden_size, L = c_.num_layers;
    layers_ = BuildLayerSpecs(c_, lora_);
    FERRY_ASSIGN_OR_RETURN(
        params_, DeviceParams::Create(d_, c_, lora_, layers_, /*source=*/nullptr,
                                      o_.inference_only ? ParamGrads::kNone : ParamGrads::kAllocate,
                                      o_.compute_dtype));
    const DType act = o_.compute_dtype;
    FERRY_ASSIGN_OR_RETURN(io_buffer_, AllocateCarved(d_, "runner.io", [&](TensorCarver& cv) {
                             positions_ = cv.Take(DType::kI32, {N});
                             doc_ids_ = cv.Take(DType::kI32, {N});
                             if (!c_.learned_positions) {
                               inv_freq_ = cv.Take(DType::kF32, {c_.head_dim / 2});
                             }
                             hidden_.clear();
                             for (int64_t i = 0; i <= L; ++i)
                               hidden_.push_back(cv.Take(act, {N, C}));
                             if (o_.inference_only) return;  // no backward, no gradients
                             grad_[0] = cv.Take(act, {N, C});
                             grad_[1] = cv.Take(act, {N, C});
                           }));
    // Slots: a block kept whole has its own; recomputed blocks share the last
    // one.
    int slots = 0;
    bool any_recompute = false;
    for (int64_t i = 0; i < L; ++i) {
      if (Recomputed(i)) {
        any_recompute = true;
      } else {
        slot_.push_back(slots++);
        continue;
      }
      slot_.push_back(-1);
    }
    if (any_recompute) {
      for (int& s : slot_) s = s < 0 ? slots : s;
      ++slots;
    }
    FERRY_ASSIGN_OR_RETURN(
        DeviceStack stack,
        BuildDeviceStack(
            d_, c_, params_,
            {.shape = o_.shape,
             .inputs = {.positions = positions_, .doc_ids = doc_ids_, .inv_freq = inv_freq_},
             .num_slots = std::max(slots, 1),
             .head = o_.inference_only ? HeadMode::kForwardOnly : HeadMode::kTrain,
             .loss_chunk_tokens = o_.loss_chunk_tokens}));
    blocks_ = std::move(stack.blocks);
    head_ = std::move(stack.head);

    if (act != DType::kF32) hidden_f32_.resize(size_t(N * C));  // the gather's output, converted
    staging_.hidden = 0;
    staging_.targets = (size_t(N * C) * DTypeSize(act) + 3) / 4 * 4;  // i32-aligned
    staging_.positions = staging_.targets + size_t(N) * 4;
    staging_.doc_ids = staging_.positions + size_t(N) * 4;
    staging_.loss = staging_.doc_ids + size_t(N) * 4;
    staging_.inv_freq = staging_.loss + size_t(N) * 4;
    staging_.bytes = staging_.inv_freq + size_t(c_.head_dim / 2) * 4;
    FERRY_ASSIGN_OR_RETURN(host_, HostAllocation::Map(staging_.bytes, "runner staging"));
    FERRY_RETURN_IF_ERROR(SetLayout({}, {}));
    if (!c_.learned_positions) {
      const std::vector<float> inv_freq = RopeInvFreq(c_);
      const size_t bytes = inv_freq.size() * sizeof(float);
      std::memcpy(host_.data() + staging_.inv_freq, inv_freq.data(), bytes);
      FERRY_RETURN_IF_ERROR(
          d_.CopyToDevice(inv_freq_.data, host_.Span(staging_.inv_freq, bytes), bytes));
    }
    return Upload();  // ordered before any compute by the event
  }

  Status UploadWeights(const HostTensors& weights) override {
    FERRY_ASSIGN_OR_RETURN(const HostEmbedding e, FindHostEmbedding(c_, weights));
    // The runner's own fp32 copies (a frozen table may be served from its file).
    wte_.resize(e.wte.size);
    ReadEmbeddingTable(e.wte, wte_);
    wpe_.resize(e.wpe.size);
    if (e.wpe.size > 0) ReadEmbeddingTable(e.wpe, wpe_);
    FERRY_RETURN_IF_ERROR(params_.Upload(d_, weights));
    uploaded_ = true;
    return Status::Ok();
  }

  Result<double> AccumulateGradients(const MicroBatchInput& mb, HostTensors& grads) override {
    if (o_.inference_only) {
      return Status::FailedPrecondition(
          "this model runner was built for inference only: it has no gradient buffers");
    }
    Result<double> loss = Accumulate(mb, grads);
    if (!loss.ok()) SynchronizeStreams();  // no copy may still touch the staging memory
    return loss;
  }

 private:
  Result<double> Accumulate(const MicroBatchInput& mb, HostTensors& grads) {
    const int64_t N = o_.shape.tokens(), L = c_.num_layers;
    FERRY_RETURN_IF_ERROR(UploadInputs(mb));
    FERRY_RETURN_IF_ERROR(params_.ZeroGrads(d_));
    for (int64_t i = 0; i < L; ++i) FERRY_RETURN_IF_ERROR(BlockForward(i));
    Tensor dy = grad_[0], dx = grad_[1];
    FERRY_RETURN_IF_ERROR(
        head_->ForwardBackward(hidden_[size_t(L)], mb.normalizer, dy, mb.loss_scale));
    for (int64_t i = L - 1; i >= 0; --i) {
      if (Recomputed(i)) FERRY_RETURN_IF_ERROR(BlockForward(i));
      FERRY_RETURN_IF_ERROR(blocks_->Backward(i, slot_[size_t(i)], hidden_[size_t(i)], dy, dx));
      std::swap(dy, dx);
    }
    // dy now holds the gradient of block 0's input (the embedding output).
    FERRY_RETURN_IF_ERROR(Download(dy, staging_.hidden));
    FERRY_RETURN_IF_ERROR(Download(head_->token_loss(), staging_.loss));
    FERRY_RETURN_IF_ERROR(d_.Synchronize(StreamId::kDownload));
    GradOverwrite overwrite;
    GradOverwrite* ow = mb.overwrite_grads ? &overwrite : nullptr;
    FERRY_RETURN_IF_ERROR(params_.DownloadAndAddGrads(d_, grads, ow, mb.host_pool));
    if (ow != nullptr) ow->ZeroUnwritten(grads);
    if (!lora_.enabled()) FERRY_RETURN_IF_ERROR(EmbeddingGrad(mb.tokens, grads));
    const float* loss = reinterpret_cast<const float*>(host_.data() + staging_.loss);
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) sum += loss[n];
    return sum / mb.normalizer;
  }

 public:
  // Enqueued copies and kernels read the staging memory and the device buffers: let them finish
  // before either is freed.
  ~Runner() override { SynchronizeStreams(); }

  Result<double> EvaluateLoss(const MicroBatchInput& mb) override {
    Result<double> loss = Evaluate(mb);
    if (!loss.ok()) SynchronizeStreams();
    return loss;
  }

  Result<std::vector<float>> Logits(std::span<const int32_t> tokens) override {
    return PackedLogits({.tokens = tokens});
  }

  Result<std::vector<float>> PackedLogits(const MicroBatchInput& mb) override {
    const int64_t N = o_.shape.tokens(), L = c_.num_layers, V = c_.vocab_size;
    // Evaluation only: the (N, V) logits are allocated for this call, not planned.
    const size_t bytes = size_t(N * V) * 4;
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer buf, d_.Allocate(bytes, "runner.logits"));
    const DType act = o_.compute_dtype;
    const size_t scratch_bytes =
        std::max<size_t>(GemmScratchBytes(d_, N, V, c_.hidden_size, {act, act, DType::kF32}), 4);
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                           d_.Allocate(scratch_bytes, "runner.logits.scratch"));
    FERRY_ASSIGN_OR_RETURN(HostAllocation host, HostAllocation::Map(bytes, "logits staging"));
    auto run = [&]() -> Status {
      FERRY_RETURN_IF_ERROR(SetLayout(mb.doc_ids, mb.positions));
      FERRY_RETURN_IF_ERROR(EmbedAndUpload(mb.tokens));
      FERRY_RETURN_IF_ERROR(Upload());
      for (int64_t i = 0; i < L; ++i) FERRY_RETURN_IF_ERROR(BlockForward(i));
      FERRY_RETURN_IF_ERROR(head_->Logits(hidden_[size_t(L)], buf.View(DType::kF32, {N, V}),
                                          scratch.View(DType::kF32, {int64_t(scratch_bytes / 4)})));
      FERRY_ASSIGN_OR_RETURN(Event done, d_.CreateEvent());
      FERRY_RETURN_IF_ERROR(d_.Record(done, StreamId::kCompute));
      FERRY_RETURN_IF_ERROR(d_.Wait(StreamId::kDownload, done));
      FERRY_RETURN_IF_ERROR(d_.CopyToHost(host.Whole(), buf.data(), bytes));
      return d_.Synchronize(StreamId::kDownload);
    };
    const Status status = run();
    if (!status.ok()) {
      SynchronizeStreams();  // buf and host die here: nothing may still use them
      return status;
    }
    const float* p = reinterpret_cast<const float*>(host.data());
    return std::vector<float>(p, p + N * V);
  }

  RunnerStats stats() const override {
    RunnerStats s = stats_;
    s.arena_peak_bytes = d_.arena_stats().peak;
    return s;
  }

 private:
  Result<double> Evaluate(const MicroBatchInput& mb) {
    const int64_t N = o_.shape.tokens(), L = c_.num_layers;
    FERRY_RETURN_IF_ERROR(UploadInputs(mb));
    for (int64_t i = 0; i < L; ++i) FERRY_RETURN_IF_ERROR(BlockForward(i));
    FERRY_RETURN_IF_ERROR(head_->Forward(hidden_[size_t(L)]));
    FERRY_RETURN_IF_ERROR(Download(head_->token_loss(), staging_.loss));
    FERRY_RETURN_IF_ERROR(d_.Synchronize(StreamId::kDownload));
    const float* loss = reinterpret_cast<const float*>(host_.data() + staging_.loss);
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) sum += loss[n];
    return sum / mb.normalizer;
  }

  // Checks the micro-batch, then uploads its layout, embedded tokens and targets, ordered before
  // the compute that follows.
  Status UploadInputs(const MicroBatchInput& mb) {
    const int64_t N = o_.shape.tokens();
    if (int64_t(mb.targets.size()) != N) {
      return Status::InvalidArgument("micro-batch targets hold " +
                                     std::to_string(mb.targets.size()) +
                                     " ids, expected B*T = " + std::to_string(N));
    }
    if (!(mb.normalizer > 0)) {
      return Status::InvalidArgument(
          "the loss normalizer must be positive (the number of "
          "non-masked targets in the global batch)");
    }
    FERRY_RETURN_IF_ERROR(SetLayout(mb.doc_ids, mb.positions));
    FERRY_RETURN_IF_ERROR(EmbedAndUpload(mb.tokens));
    std::memcpy(host_.data() + staging_.targets, mb.targets.data(), size_t(N) * 4);
    FERRY_RETURN_IF_ERROR(d_.CopyToDevice(
        head_->targets().data, host_.Span(staging_.targets, size_t(N) * 4), size_t(N) * 4));
    return Upload();
  }

  // Writes the rows' document ids and positions into staging and uploads them (defaults when
  // empty: one document per row, positions 0..T-1).
  Status SetLayout(std::span<const int32_t> doc_ids, std::span<const int32_t> positions) {
    const int64_t N = o_.shape.tokens(), T = o_.shape.seq_len;
    for (auto [span, name] : {std::pair{doc_ids, "doc_ids"}, std::pair{positions, "positions"}}) {
      if (!span.empty() && int64_t(span.size()) != N) {
        return Status::InvalidArgument("micro-batch " + std::string(name) + " hold " +
                                       std::to_string(span.size()) +
                                       " values, expected B*T = " + std::to_string(N));
      }
    }
    // An earlier upload may still read the staging layout.
    FERRY_RETURN_IF_ERROR(d_.Synchronize(StreamId::kUpload));
    int32_t* pos = reinterpret_cast<int32_t*>(host_.data() + staging_.positions);
    int32_t* doc = reinterpret_cast<int32_t*>(host_.data() + staging_.doc_ids);
    for (int64_t n = 0; n < N; ++n) {
      pos[n] = positions.empty() ? int32_t(n % T) : positions[size_t(n)];
      doc[n] = doc_ids.empty() ? 0 : doc_ids[size_t(n)];
      if (pos[n] < 0) {
        return Status::InvalidArgument("micro-batch position " + std::to_string(pos[n]) +
                                       " at token " + std::to_string(n) + " is negative");
      }
    }
    FERRY_RETURN_IF_ERROR(d_.CopyToDevice(
        positions_.data, host_.Span(staging_.positions, size_t(N) * 4), size_t(N) * 4));
    return d_.CopyToDevice(doc_ids_.data, host_.Span(staging_.doc_ids, size_t(N) * 4),
                           size_t(N) * 4);
  }

  // Waits for this runner's work on every stream (errors are reported by the calls that
  // enqueued the work, or the next synchronize).
  void SynchronizeStreams() {
    for (StreamId s : {StreamId::kUpload, StreamId::kCompute, StreamId::kDownload}) {
      (void)d_.Synchronize(s);
    }
  }

  bool Recomputed(int64_t i) const { return !o_.recompute.empty() && o_.recompute[size_t(i)]; }

  Status BlockForward(int64_t i) {
    ++stats_.block_forward_calls;
    return blocks_->Forward(i, slot_[size_t(i)], hidden_[size_t(i)], hidden_[size_t(i) + 1]);
  }

  // Host gather of the embedding into staging, then its upload into hidden_[0].
  Status EmbedAndUpload(std::span<const int32_t> tokens) {
    const int64_t N = o_.shape.tokens();
    if (!uploaded_) {
      return Status::FailedPrecondition("ModelRunner: call UploadWeights before running a batch");
    }
    if (int64_t(tokens.size()) != N) {
      return Status::InvalidArgument("micro-batch tokens hold " + std::to_string(tokens.size()) +
                                     " ids, expected B*T = " + std::to_string(N));
    }
    // The previous batch's downloads read the staging memory: they finished
    // (synchronized).
    const size_t bytes = hidden_[0].bytes();
    const HostEmbedding e{EmbeddingShapeOf(c_), wte_, wpe_};
    FERRY_RETURN_IF_ERROR(e.ForwardAs(tokens, Positions(), hidden_[0].dtype,
                                      host_.Span(staging_.hidden, bytes).as<std::byte>(),
                                      hidden_f32_));
    return d_.CopyToDevice(hidden_[0].data, host_.Span(staging_.hidden, bytes), bytes);
  }

  std::span<const int32_t> Positions() const {
    if (!c_.learned_positions) return {};
    return host_.Span(staging_.positions, size_t(o_.shape.tokens()) * 4).as<const int32_t>();
  }

  // Makes the compute stream wait for everything enqueued on the upload stream
  // so far.
  Status Upload() {
    FERRY_ASSIGN_OR_RETURN(Event uploaded, d_.CreateEvent());
    FERRY_RETURN_IF_ERROR(d_.Record(uploaded, StreamId::kUpload));
    return d_.Wait(StreamId::kCompute, uploaded);
  }

  // Enqueues the download of `t` into staging at `offset` after the compute
  // enqueued so far.
  Status Download(Tensor t, size_t offset) {
    FERRY_ASSIGN_OR_RETURN(Event computed, d_.CreateEvent());
    FERRY_RETURN_IF_ERROR(d_.Record(computed, StreamId::kCompute));
    FERRY_RETURN_IF_ERROR(d_.Wait(StreamId::kDownload, computed));
    return d_.CopyToHost(host_.Span(offset, t.bytes()), t.data, t.bytes());
  }

  // Scatter-adds the downloaded gradient of the embedding output into the table
  // gradients.
  Status EmbeddingGrad(std::span<const int32_t> tokens, HostTensors& grads) {
    FERRY_ASSIGN_OR_RETURN(const HostEmbeddingGrads g, FindHostEmbeddingGrads(c_, grads));
    g.BackwardFrom(hidden_[0].dtype,
                   host_.Span(staging_.hidden, hidden_[0].bytes()).as<const std::byte>(),
                   hidden_f32_, tokens, Positions());
    return Status::Ok();
  }

  Device& d_;
  const ModelConfig c_;
  const LoraConfig lora_;
  const ReferenceRunnerOptions o_;
  std::vector<LayerSpec> layers_;
  DeviceParams params_;
  DeviceBuffer io_buffer_;
  Tensor positions_;            // i32 (N)
  Tensor doc_ids_;              // i32 (N)
  Tensor inv_freq_;             // f32 (head_dim / 2), Llama family
  std::vector<Tensor> hidden_;  // L + 1 of (N, C): each block's input, then the head's
  Tensor grad_[2];              // (N, C) x2: the backward's gradient stream, training only
  std::vector<int> slot_;       // per block: its saved-activation slot
  std::unique_ptr<DecoderBlocks> blocks_;
  std::unique_ptr<Head> head_;
  Staging staging_;
  HostAllocation host_;
  std::vector<float> wte_,
      wpe_;  // host copies of the embedding tables (the gather runs here)
  // (N, C) fp32 on the host when the compute dtype is not: the gather's output and the
  // embedding output's gradient, converted from and to the staging's compute dtype.
  std::vector<float> hidden_f32_;
  bool uploaded_ = false;
  RunnerStats stats_;
};

Status ValidateRunner(const ModelConfig& c, const LoraConfig& lora,
                      const ReferenceRunnerOptions& o) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(c));
  FERRY_RETURN_IF_ERROR(CheckTrainable(c));
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(lora));
  if (o.compute_dtype != DType::kF32 && o.compute_dtype != DType::kBF16) {
    return Status::InvalidArgument(
        "ModelRunner stores weights and activations in f32 or bf16, not " +
        std::string(DTypeName(o.compute_dtype)) + ": use compute dtype f32 or bf16");
  }
  if (o.shape.batch < 1 || o.shape.seq_len < 1) {
    return Status::InvalidArgument("micro-batch shape must be at least 1 x 1, got " +
                                   std::to_string(o.shape.batch) + " x " +
                                   std::to_string(o.shape.seq_len));
  }
  if (c.learned_positions && o.shape.seq_len > c.max_position_embeddings) {
    return Status::InvalidArgument("seq_len " + std::to_string(o.shape.seq_len) +
                                   " exceeds the model's " +
                                   std::to_string(c.max_position_embeddings) +
                                   " learned positions; use a shorter sequence length");
  }
  if (!o.recompute.empty() && int64_t(o.recompute.size()) != c.num_layers) {
    return Status::InvalidArgument("recompute has " + std::to_string(o.recompute.size()) +
                                   " entries; give one per decoder block (" +
                                   std::to_string(c.num_layers) + ") or none");
  }
  if (o.loss_chunk_tokens < 1) {
    return Status::InvalidArgument("loss_chunk_tokens must be positive");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreateReferenceRunner(Device& device,
                                                           const ModelConfig& config,
                                                           const LoraConfig& lora,
                                                           const ReferenceRunnerOptions& options) {
  FERRY_RETURN_IF_ERROR(ValidateRunner(config, lora, options));
  auto runner = std::make_unique<Runner>(device, config, lora, options);
  FERRY_RETURN_IF_ERROR(runner->Init());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace ferry
