// Generator: forward-only inference with a KV cache, for text generation (`ferry generate`). The
// prompt is run once (prefill), then one token at a time; each step's keys and values are appended
// to a per-block cache sized up front (capacity() rows), so a step costs O(length) attention
// instead of a forward over the whole prefix.
//
// Its one implementation is a generation plan run by the pipeline executor
// (engine/exec/planned_generator.h: PipelineExecutor::Decode): the training path's blocks and head
// (the same DecoderBlocks forward, with attention switched to the cache: decoder_blocks.h KvCache,
// kernels/ops/decode_attention.h) over the same DeviceParams, in the plan's exact memory. RoPE
// positions continue from the cache's length; GPT-2's learned positions are gathered on the host
// with the embedding. LoRA is applied at run time, as in training (y = x W^T + scaling (x A^T) B^T
// per adapted projection): nothing is merged. Compute is f32.
//
// Thread-safety: one host thread drives a generator at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/model/sampler.h"
#include "kernels/status.h"

namespace ferry {

class Generator {
 public:
  virtual ~Generator() = default;

  // Runs `tokens` (n >= 1) at positions [length(), length() + n), appends their keys and values to
  // the cache and returns their logits, (n, V) f32 row-major — or, with last_only, the last
  // token's alone (V): a prefill then never plans an (n, V) buffer. Errors: InvalidArgument when
  // the cache would overflow (length() + n > capacity()) or a token id is outside the vocabulary;
  // the cache is unchanged then.
  virtual Result<std::vector<float>> Forward(std::span<const int32_t> tokens,
                                             bool last_only = false) = 0;

  // Positions held in the cache; capacity() = max_tokens.
  virtual int64_t length() const = 0;
  virtual int64_t capacity() const = 0;
  // Empties the cache (a new sequence starts at position 0).
  virtual void Reset() = 0;
};

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 0;  // >= 0
  // Stop when one of these is drawn (EOS, a chat template's end of turn); it is neither passed on
  // nor returned.
  std::vector<int32_t> stop_ids;
};

// Resets `g`, runs `prompt` (>= 1 token) in one step, then draws up to max_new_tokens tokens (draw
// i with SampleToken(..., step = i)), feeding each back one at a time; calls on_token with each as
// it is drawn (its error stops generation and is returned). Returns the new tokens. REQUIRES:
// g.capacity() >= prompt.size() + max_new_tokens - 1 (checked: InvalidArgument).
Result<std::vector<int32_t>> Generate(Generator& g, std::span<const int32_t> prompt,
                                      const GenerateOptions& o,
                                      const std::function<Status(int32_t)>& on_token);

}  // namespace ferry
