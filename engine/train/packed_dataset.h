// Packing of tokenized examples (examples.h) into rows of T tokens, and the batcher that draws
// micro-batches of those rows.
//
// Packing. Each example becomes one or more pieces of at most T tokens: an example longer than T
// is split (LongExamples::kSplit, the default: pieces start every T - 1 tokens, so each target is
// predicted exactly once, and each piece is a document of its own, its positions restarting at 0)
// or truncated to its first T tokens (kTruncate). Pieces with nothing to learn are dropped. Pieces
// are placed, in the order given, best-fit into rows (the fullest row with room, else a new one);
// the rest of a row is padding (pad id, masked targets). Within a row every piece is a document:
// a doc id of its own (0, 1, ... in the row; the padding takes the next), positions 0..len-1, and
// targets only inside it (the last token of a piece predicts nothing) — so a packed row computes
// exactly what each piece computes alone (attention never crosses documents: model_runner.h).
//
// Order. Examples are shuffled once before packing (ShuffleExamples); each epoch then visits the
// rows in a fresh permutation: global row g = (step * micro_batches + micro) * B + r is row
// PermuteIndex(g mod R, R, key(seed, epoch = g / R)) — a counter-based permutation, so a
// micro-batch is a pure function of (seed, step, micro) and a resume needs only the step.
//
// Thread-safety: immutable after construction; const methods may be called from several threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/plan/planner.h"
#include "engine/train/dataset.h"
#include "engine/train/examples.h"
#include "kernels/status.h"

namespace ferry {

enum class LongExamples { kSplit, kTruncate };

// "split" | "truncate"; InvalidArgument naming --long-examples otherwise.
Result<LongExamples> ParseLongExamples(std::string_view name);

// A pseudo-random permutation of [0, n) keyed by `key`, evaluated one index at a time (a 4-round
// Feistel network over the next power of four, cycle-walking back into range). REQUIRES: i < n.
uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t key);

// `examples` reordered by PermuteIndex under `seed`.
std::vector<Example> ShuffleExamples(std::vector<Example> examples, uint64_t seed);

// Moves round(fraction * n) examples (at least 1 when fraction > 0, and never all) from the end
// of `examples` into the returned validation set. Shuffle first for a random split.
std::vector<Example> SplitValidation(std::vector<Example>& examples, double fraction);

class PackedRows {
 public:
  // REQUIRES: seq_len >= 2.
  static PackedRows Pack(std::span<const Example> examples, int64_t seq_len, LongExamples mode,
                         int32_t pad_id);

  int64_t rows() const { return rows_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t pieces() const { return pieces_; }                // documents placed
  int64_t dropped_pieces() const { return dropped_; }       // pieces with nothing to learn
  int64_t valid_targets() const { return valid_targets_; }  // over all rows
  double fill() const;  // fraction of row tokens that are not padding
  // [b - 1]: the most documents any b rows hold, for b in [1, max_rows] (a row's pieces and its
  // padding each count as one, as the attention's doc_ids tell them apart; a padding row beyond
  // rows() is one): what a micro-batch of b rows is planned for (plan::PlanJob::
  // documents_in_rows).
  std::vector<int64_t> MostDocuments(int64_t max_rows) const;
  // The host memory the rows take (their arrays' capacities): what a plan counts as data.rows.
  uint64_t host_bytes() const;
  // What a plan is told of these rows: MostDocuments(max_rows) and host_bytes().
  plan::DataCounts Counts(int64_t max_rows) const;

  // Copies row `row` into row `slot` of `mb` (sized B x T with doc_ids and positions); returns its
  // valid targets. A row >= rows() writes a fully masked padding row.
  int64_t CopyRow(int64_t row, MicroBatch& mb, int64_t slot) const;

 private:
  int64_t seq_len_ = 0, rows_ = 0, pieces_ = 0, dropped_ = 0, valid_targets_ = 0, padding_ = 0;
  int32_t pad_id_ = 0;
  // What CopyRow writes, held in 5 bytes a token: the ids, and whether each position's target is
  // the next id (else it is masked); the documents' ids and positions follow from the lengths of
  // the pieces each row holds, in order (row r's are piece_lengths_[row_pieces_[r] ..
  // row_pieces_[r + 1])), the padding after them a document of its own.
  std::vector<int32_t> tokens_;        // (rows, T)
  std::vector<uint8_t> next_trained_;  // (rows, T)
  std::vector<int32_t> piece_lengths_;
  std::vector<int64_t> row_pieces_;     // (rows + 1)
  std::vector<int64_t> row_valid_;      // (rows)
  std::vector<int64_t> row_documents_;  // (rows)
};

// An empty B x T micro-batch with doc_ids and positions, for CopyRow.
MicroBatch EmptyPackedMicroBatch(int64_t batch, int64_t seq_len);

// Rows [first, first + batch) in order, padding past the end: evaluation sweeps.
MicroBatch SequentialMicroBatch(const PackedRows& rows, int64_t first, int64_t batch);

class PackedBatcher final : public BatchSource {
 public:
  // Fails with InvalidArgument when `rows` holds no row (the dataset packs to nothing).
  static Result<PackedBatcher> Create(const PackedRows* rows, int64_t micro_batch,
                                      int64_t micro_batches, uint64_t seed);

  MicroBatch MakeMicroBatch(int64_t step, int64_t micro) const override;
  // The packed row that global row g (see above) reads.
  int64_t RowOf(int64_t global_row) const;

 private:
  PackedBatcher(const PackedRows* rows, int64_t micro_batch, int64_t micro_batches, uint64_t seed)
      : rows_(rows), micro_batch_(micro_batch), micro_batches_(micro_batches), seed_(seed) {}
  const PackedRows* rows_;  // not owned; outlives the batcher
  int64_t micro_batch_, micro_batches_;
  uint64_t seed_;
};

}  // namespace ferry
