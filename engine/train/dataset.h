// Token datasets and the batcher that cuts them into micro-batches.
//
// A TokenStream is documents laid end to end, each as <bos> tokens... <eos>. The Batcher draws
// each row of a micro-batch as a window of T + 1 consecutive tokens of the stream: the row's
// tokens are the first T, its targets the last T (targets[t] is the label of position t, already
// shifted). A target that is a <bos> (the start of the next document, which nothing before it can
// predict) is masked with kIgnoreTarget. Window starts come from a counter-based hash of
// (seed, step, micro-batch, row), so a micro-batch is a pure function of its coordinates: the same
// on any device, after recomputation, and after a resume — no hidden RNG state.
//
// Thread-safety: both types are immutable after construction; MakeMicroBatch is const and may be
// called from several threads.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/model_runner.h"
#include "kernels/status.h"

namespace ferry {

inline constexpr int32_t kIgnoreTarget = -100;  // a masked target, as in PyTorch

// The documents of `text`: runs of lines separated by blank lines (spaces, tabs and \r only),
// without their trailing newlines; empty documents are dropped.
std::vector<std::string_view> SplitDocuments(std::string_view text);

class TokenStream {
 public:
  // Splits `text` into documents at blank lines and tokenizes them byte by byte
  // (ByteTokenizer), each wrapped in <bos> ... <eos>.
  static TokenStream FromText(std::string_view text);
  // The built-in dataset (BuiltinText()).
  static TokenStream Builtin();

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t documents_ = 0;
};

struct MicroBatch {
  int64_t batch = 0;                    // B rows
  int64_t seq_len = 0;                  // T tokens per row
  std::vector<int32_t> tokens;          // (B, T)
  std::vector<int32_t> targets;         // (B, T), kIgnoreTarget where masked
  int64_t valid_targets = 0;            // targets that are not masked
  std::vector<int32_t> doc_ids = {};    // (B, T) for packed rows (packed_dataset.h); empty: one
                                        // document per row
  std::vector<int32_t> positions = {};  // (B, T) for packed rows, restarting at 0 per document
};

// The runner's view of `mb` (spans into it), with the global batch's loss normalizer.
inline MicroBatchInput RunnerInput(const MicroBatch& mb, double normalizer) {
  return {.tokens = mb.tokens,
          .targets = mb.targets,
          .normalizer = normalizer,
          .doc_ids = mb.doc_ids,
          .positions = mb.positions};
}

// Where micro-batches come from: a pure function of (step, micro), so a resume needs only the
// step number. Implementations are immutable and thread-safe.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Micro-batch `micro` of optimizer step `step`.
  virtual MicroBatch MakeMicroBatch(int64_t step, int64_t micro) const = 0;
  // The number of unmasked targets over micro-batches 0 .. micro_batches-1 of `step`: the
  // denominator of the step's mean loss, known before the step runs.
  int64_t ValidTargets(int64_t step, int64_t micro_batches) const {
    int64_t n = 0;
    for (int64_t m = 0; m < micro_batches; ++m) n += MakeMicroBatch(step, m).valid_targets;
    return n;
  }
};

class Batcher final : public BatchSource {
 public:
  // `micro_batch` rows of `seq_len` tokens each. Fails with InvalidArgument when the stream is
  // shorter than one window (seq_len + 1 tokens), naming both sizes.
  static Result<Batcher> Create(const TokenStream* stream, int64_t micro_batch, int64_t seq_len,
                                uint64_t seed);

  MicroBatch MakeMicroBatch(int64_t step, int64_t micro) const override;

 private:
  Batcher(const TokenStream* stream, int64_t micro_batch, int64_t seq_len, uint64_t seed)
      : stream_(stream), micro_batch_(micro_batch), seq_len_(seq_len), seed_(seed) {}
  const TokenStream* stream_;  // not owned; outlives the Batcher
  int64_t micro_batch_;
  int64_t seq_len_;
  uint64_t seed_;
};

}  // namespace ferry
