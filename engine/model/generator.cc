// Generator's one implementation: host embedding, the training DecoderBlocks (attention over the
// KV cache) and Head over DeviceParams (engine/model/generator.h has the contract).
#include "engine/model/generator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/model/device_params.h"
#include "engine/model/model_stack.h"
#include "engine/model/param_spec.h"
#include "engine/model/tensor_carver.h"

namespace ferry {
namespace {

// The buffers of a step of n tokens: blocks (and, unless only the last token's logits are wanted,
// the head) planned for a batch of 1 x n.
struct Stage {
  int64_t n = 0;
  DeviceBuffer io;
  Tensor positions;  // i32 (n)
  Tensor inv_freq;   // f32 (head_dim / 2): RoPE table (Llama family)
  Tensor hidden[2];  // (n, C) x2: the blocks' input and output, ping-pong
  Tensor logits;     // (n, V), or null without a head
  std::unique_ptr<DecoderBlocks> blocks;
  std::unique_ptr<Head> head;  // null: the one-token stage's head serves the last row
  HostAllocation host;         // staging: hidden (n*C f32), positions (n i32), logits (n*V f32)
  size_t host_positions = 0, host_inv_freq = 0, host_logits = 0;
};

class Gen final : public Generator {
 public:
  Gen(Device& d, const ModelConfig& c, const LoraConfig& lora) : d_(d), c_(c), lora_(lora) {}
  ~Gen() override { SynchronizeStreams(); }

  Status Init(const HostTensors& weights, int64_t max_tokens) {
    const std::vector<LayerSpec> layers = BuildLayerSpecs(c_, lora_);
    FERRY_ASSIGN_OR_RETURN(params_, DeviceParams::Create(d_, c_, lora_, layers, /*source=*/nullptr,
                                                         ParamGrads::kNone));
    FERRY_RETURN_IF_ERROR(params_.Upload(d_, weights));
    FERRY_ASSIGN_OR_RETURN(const HostEmbedding e, FindHostEmbedding(c_, weights));
    wte_.assign(e.wte.begin(), e.wte.end());
    wpe_.assign(e.wpe.begin(), e.wpe.end());
    kv_.capacity = max_tokens;
    const Shape cache_shape{max_tokens, c_.kv_dim()};
    FERRY_ASSIGN_OR_RETURN(cache_, AllocateCarved(d_, "generator.kv_cache", [&](TensorCarver& cv) {
                             kv_.k.clear();
                             kv_.v.clear();
                             for (int64_t i = 0; i < c_.num_layers; ++i) {
                               kv_.k.push_back(cv.Take(DType::kF32, cache_shape));
                               kv_.v.push_back(cv.Take(DType::kF32, cache_shape));
                             }
                           }));
    FERRY_ASSIGN_OR_RETURN(step_, MakeStage(1, /*with_head=*/true));
    return Status::Ok();
  }

  Result<std::vector<float>> Forward(std::span<const int32_t> tokens, bool last_only) override {
    const int64_t n = int64_t(tokens.size());
    if (n < 1) return Status::InvalidArgument("generator: no tokens to run");
    if (kv_.length + n > kv_.capacity) {
      return Status::InvalidArgument(
          "generator: the KV cache holds " + std::to_string(kv_.capacity) + " positions, " +
          std::to_string(kv_.length) + " used; " + std::to_string(n) +
          " more do not fit: raise the token limit (prompt + new tokens)");
    }
    std::unique_ptr<Stage> prefill;  // freed when this call returns
    if (n != 1) {
      FERRY_ASSIGN_OR_RETURN(prefill, MakeStage(n, /*with_head=*/!last_only));
    }
    Stage& st = n == 1 ? *step_ : *prefill;
    Result<std::vector<float>> logits = Run(st, tokens, last_only);
    if (!logits.ok()) {
      SynchronizeStreams();  // nothing may still use the stage; the cache's length is unchanged
      return logits.status();
    }
    kv_.length += n;
    return logits;
  }

  int64_t length() const override { return kv_.length; }
  int64_t capacity() const override { return kv_.capacity; }
  void Reset() override { kv_.length = 0; }

 private:
  Result<std::unique_ptr<Stage>> MakeStage(int64_t n, bool with_head) {
    auto st = std::make_unique<Stage>();
    st->n = n;
    const int64_t C = c_.hidden_size, V = c_.vocab_size;
    FERRY_ASSIGN_OR_RETURN(st->io, AllocateCarved(d_, "generator.io", [&](TensorCarver& cv) {
                             st->positions = cv.Take(DType::kI32, {n});
                             if (!c_.learned_positions) {
                               st->inv_freq = cv.Take(DType::kF32, {c_.head_dim / 2});
                             }
                             st->hidden[0] = cv.Take(DType::kF32, {n, C});
                             st->hidden[1] = cv.Take(DType::kF32, {n, C});
                             if (with_head) st->logits = cv.Take(DType::kF32, {n, V});
                           }));
    const BatchShape shape{1, n};
    std::optional<HeadMode> head;
    if (with_head) head = HeadMode::kForwardOnly;
    FERRY_ASSIGN_OR_RETURN(
        DeviceStack stack,
        BuildDeviceStack(d_, c_, params_,
                         {.shape = shape,
                          .inputs = {.positions = st->positions, .inv_freq = st->inv_freq},
                          .kv_cache = &kv_,
                          .head = head,
                          .loss_chunk_tokens = std::min<int64_t>(n, 256)}));
    st->blocks = std::move(stack.blocks);
    st->head = std::move(stack.head);
    st->host_positions = size_t(n * C) * 4;
    st->host_inv_freq = st->host_positions + size_t(n) * 4;
    st->host_logits = st->host_inv_freq + size_t(c_.head_dim / 2) * 4;
    const size_t logit_rows = with_head ? size_t(n) : 1;
    FERRY_ASSIGN_OR_RETURN(
        st->host,
        HostAllocation::Map(st->host_logits + logit_rows * size_t(V) * 4, "generator staging"));
    if (!c_.learned_positions) {  // RoPE's table (Llama 3 scaling included), uploaded once
      const std::vector<float> inv_freq = RopeInvFreq(c_);
      const size_t bytes = inv_freq.size() * sizeof(float);
      std::memcpy(st->host.data() + st->host_inv_freq, inv_freq.data(), bytes);
      FERRY_RETURN_IF_ERROR(
          d_.CopyToDevice(st->inv_freq.data, st->host.Span(st->host_inv_freq, bytes), bytes));
    }
    return st;
  }

  Result<std::vector<float>> Run(Stage& st, std::span<const int32_t> tokens, bool last_only) {
    const int64_t n = st.n, C = c_.hidden_size, V = c_.vocab_size, L = c_.num_layers;
    const int64_t rows = last_only ? 1 : n;
    const size_t hidden_bytes = size_t(n * C) * 4, logits_bytes = size_t(rows * V) * 4;
    std::span<int32_t> pos = st.host.Span(st.host_positions, size_t(n) * 4).as<int32_t>();
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(kv_.length + i);
    const HostEmbedding e{EmbeddingShapeOf(c_), wte_, wpe_};
    FERRY_RETURN_IF_ERROR(e.Forward(
        tokens, c_.learned_positions ? std::span<const int32_t>(pos) : std::span<const int32_t>(),
        st.host.Span(0, hidden_bytes).as<float>()));
    FERRY_RETURN_IF_ERROR(
        d_.CopyToDevice(st.hidden[0].data, st.host.Span(0, hidden_bytes), hidden_bytes));
    FERRY_RETURN_IF_ERROR(d_.CopyToDevice(
        st.positions.data, st.host.Span(st.host_positions, size_t(n) * 4), size_t(n) * 4));
    FERRY_RETURN_IF_ERROR(Order(StreamId::kUpload, StreamId::kCompute));
    for (int64_t i = 0; i < L; ++i) {
      FERRY_RETURN_IF_ERROR(st.blocks->Forward(i, 0, st.hidden[i % 2], st.hidden[(i + 1) % 2]));
    }
    // The last row alone goes through the one-token stage's head (its buffers are idle now).
    Tensor x = st.hidden[L % 2];
    Head* head = st.head.get();
    Tensor logits = st.logits;
    if (last_only) {
      x.data = x.data + std::ptrdiff_t((n - 1) * C * 4);
      x.shape = Shape{1, C};
      head = step_->head.get();
      logits = step_->logits;
    }
    FERRY_RETURN_IF_ERROR(head->Logits(x, logits));
    FERRY_RETURN_IF_ERROR(Order(StreamId::kCompute, StreamId::kDownload));
    FERRY_RETURN_IF_ERROR(
        d_.CopyToHost(st.host.Span(st.host_logits, logits_bytes), logits.data, logits_bytes));
    FERRY_RETURN_IF_ERROR(d_.Synchronize(StreamId::kDownload));
    const float* p = reinterpret_cast<const float*>(st.host.data() + st.host_logits);
    return std::vector<float>(p, p + rows * V);
  }

  // Makes `later` wait for everything enqueued on `earlier` so far.
  Status Order(StreamId earlier, StreamId later) {
    FERRY_ASSIGN_OR_RETURN(Event e, d_.CreateEvent());
    FERRY_RETURN_IF_ERROR(d_.Record(e, earlier));
    return d_.Wait(later, e);
  }

  void SynchronizeStreams() {
    for (StreamId s : {StreamId::kUpload, StreamId::kCompute, StreamId::kDownload}) {
      (void)d_.Synchronize(s);
    }
  }

  Device& d_;
  const ModelConfig c_;
  const LoraConfig lora_;
  DeviceParams params_;
  std::vector<float> wte_, wpe_;  // host copies of the embedding tables (the gather runs here)
  KvCache kv_;
  DeviceBuffer cache_;
  std::unique_ptr<Stage> step_;  // the one-token step's buffers
};

}  // namespace

Result<std::unique_ptr<Generator>> Generator::Create(Device& device, const ModelConfig& config,
                                                     const LoraConfig& lora,
                                                     const HostTensors& weights,
                                                     int64_t max_tokens) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(config));
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(lora));
  if (max_tokens < 1) {
    return Status::InvalidArgument("generate: the token limit must be at least 1, got " +
                                   std::to_string(max_tokens));
  }
  if (config.learned_positions && max_tokens > config.max_position_embeddings) {
    return Status::InvalidArgument("generate: " + std::to_string(max_tokens) +
                                   " tokens (prompt + new) exceed the model's " +
                                   std::to_string(config.max_position_embeddings) +
                                   " learned positions; use a shorter prompt or fewer new tokens");
  }
  auto g = std::make_unique<Gen>(device, config, lora);
  FERRY_RETURN_IF_ERROR(g->Init(weights, max_tokens));
  return std::unique_ptr<Generator>(std::move(g));
}

Result<std::vector<int32_t>> Generate(Generator& g, std::span<const int32_t> prompt,
                                      const GenerateOptions& o,
                                      const std::function<Status(int32_t)>& on_token) {
  FERRY_RETURN_IF_ERROR(ValidateSamplingOptions(o.sampling));
  if (prompt.empty()) return Status::InvalidArgument("generate: the prompt has no tokens");
  if (o.max_new_tokens < 0) return Status::InvalidArgument("generate: max_new_tokens < 0");
  const int64_t need = int64_t(prompt.size()) + std::max<int64_t>(o.max_new_tokens - 1, 0);
  if (need > g.capacity()) {
    return Status::InvalidArgument(
        "generate: " + std::to_string(prompt.size()) + " prompt tokens and " +
        std::to_string(o.max_new_tokens) + " new ones need " + std::to_string(need) +
        " positions; the generator holds " + std::to_string(g.capacity()));
  }
  g.Reset();
  std::vector<int32_t> out;
  if (o.max_new_tokens == 0) return out;
  FERRY_ASSIGN_OR_RETURN(std::vector<float> logits, g.Forward(prompt, /*last_only=*/true));
  const size_t vocab = logits.size();
  std::span<const float> last(logits.data(), vocab);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int32_t token = SampleToken(last, o.sampling, uint64_t(i));
    if (o.eos && token == *o.eos) break;
    out.push_back(token);
    FERRY_RETURN_IF_ERROR(on_token(token));
    if (i + 1 == o.max_new_tokens) break;
    FERRY_ASSIGN_OR_RETURN(logits, g.Forward(std::span<const int32_t>(&token, 1), true));
    last = std::span<const float>(logits.data(), vocab);
  }
  return out;
}

}  // namespace ferry
