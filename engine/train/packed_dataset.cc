#include "engine/train/packed_dataset.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "engine/model/counter_rng.h"

namespace ferry {
namespace {

// One piece of an example: tokens [begin, end) of examples[example].
struct Piece {
  size_t example;
  int64_t begin, end;
};

// Targets inside [begin, end): the next token where it is trained.
int64_t PieceTargets(const Example& e, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t t = begin + 1; t < end; ++t) n += e.trained[size_t(t)] != 0;
  return n;
}

}  // namespace

Result<LongExamples> ParseLongExamples(std::string_view name) {
  if (name == "split") return LongExamples::kSplit;
  if (name == "truncate") return LongExamples::kTruncate;
  return Status::InvalidArgument("--long-examples '" + std::string(name) +
                                 "' is not one of split, truncate");
}

uint64_t PermuteIndex(uint64_t i, uint64_t n, uint64_t key) {
  int bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  do {
    uint64_t left = i >> half, right = i & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = Mix64(key ^ Mix64((round << 56) ^ right)) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    i = (left << half) | right;
  } while (i >= n);  // cycle-walk: a bijection on [0, 4^k) restricted to [0, n)
  return i;
}

std::vector<Example> ShuffleExamples(std::vector<Example> examples, uint64_t seed) {
  const uint64_t n = examples.size(), key = Mix64(seed ^ 0x73687566666c65ull);  // "shuffle"
  std::vector<Example> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = std::move(examples[PermuteIndex(i, n, key)]);
  return out;
}

std::vector<Example> SplitValidation(std::vector<Example>& examples, double fraction) {
  const int64_t n = int64_t(examples.size());
  if (!(fraction > 0) || n < 2) return {};
  const int64_t k = std::clamp<int64_t>(std::llround(fraction * double(n)), 1, n - 1);
  std::vector<Example> val(std::make_move_iterator(examples.end() - k),
                           std::make_move_iterator(examples.end()));
  examples.resize(size_t(n - k));
  return val;
}

PackedRows PackedRows::Pack(std::span<const Example> examples, int64_t seq_len, LongExamples mode,
                            int32_t pad_id) {
  const int64_t T = seq_len;
  PackedRows p;
  p.seq_len_ = T;
  p.pad_id_ = pad_id;
  std::vector<std::vector<Piece>> rows;
  std::multimap<int64_t, size_t> room;  // free tokens -> row (rows with any room left)
  auto place = [&](const Piece& piece) {
    const int64_t len = piece.end - piece.begin;
    auto it = room.lower_bound(len);  // best fit: the least room that suffices
    size_t row;
    int64_t left;
    if (it == room.end()) {
      row = rows.size();
      rows.emplace_back();
      left = T;
    } else {
      row = it->second;
      left = it->first;
      room.erase(it);
    }
    rows[row].push_back(piece);
    if (left - len > 0) room.emplace(left - len, row);
  };
  for (size_t x = 0; x < examples.size(); ++x) {
    const Example& e = examples[x];
    const int64_t n = e.size();
    const int64_t last_begin = mode == LongExamples::kTruncate ? 0 : std::max<int64_t>(0, n - T);
    for (int64_t b = 0;; b += std::max<int64_t>(1, T - 1)) {
      const Piece piece{x, b, std::min(n, b + T)};
      if (PieceTargets(e, piece.begin, piece.end) > 0) {
        place(piece);
      } else {
        ++p.dropped_;
      }
      if (b >= last_begin) break;
    }
  }
  p.rows_ = int64_t(rows.size());
  const size_t total = size_t(p.rows_ * T);
  p.tokens_.assign(total, pad_id);
  p.next_trained_.assign(total, 0);
  p.row_pieces_.assign(size_t(p.rows_) + 1, 0);
  p.row_valid_.assign(size_t(p.rows_), 0);
  p.row_documents_.assign(size_t(p.rows_), 0);
  size_t pieces = 0;
  for (const std::vector<Piece>& row : rows) pieces += row.size();
  p.piece_lengths_.reserve(pieces);
  for (size_t r = 0; r < rows.size(); ++r) {
    size_t at = r * size_t(T);
    int64_t doc = 0;
    for (const Piece& piece : rows[r]) {
      const Example& e = examples[piece.example];
      for (int64_t t = piece.begin; t < piece.end; ++t, ++at) {
        p.tokens_[at] = e.tokens[size_t(t)];
        if (t + 1 < piece.end && e.trained[size_t(t) + 1] != 0) {
          p.next_trained_[at] = 1;
          ++p.row_valid_[r];
        }
      }
      p.piece_lengths_.push_back(int32_t(piece.end - piece.begin));
      ++doc;
      ++p.pieces_;
    }
    p.row_pieces_[r + 1] = int64_t(p.piece_lengths_.size());
    const int64_t padding = int64_t((r + 1) * size_t(T) - at);
    p.row_documents_[r] = doc + (padding > 0 ? 1 : 0);
    p.padding_ += padding;
    p.valid_targets_ += p.row_valid_[r];
  }
  return p;
}

uint64_t PackedRows::host_bytes() const {
  uint64_t b = 0;
  b += tokens_.capacity() * sizeof(int32_t) + next_trained_.capacity() * sizeof(uint8_t) +
       piece_lengths_.capacity() * sizeof(int32_t);
  for (const std::vector<int64_t>* v : {&row_pieces_, &row_valid_, &row_documents_}) {
    b += v->capacity() * sizeof(int64_t);
  }
  return b;
}

plan::DataCounts PackedRows::Counts(int64_t max_rows) const {
  return {.documents_in_rows = MostDocuments(max_rows), .host_bytes = host_bytes()};
}

std::vector<int64_t> PackedRows::MostDocuments(int64_t max_rows) const {
  std::vector<int64_t> counts = row_documents_;
  std::sort(counts.begin(), counts.end(), std::greater<>());
  std::vector<int64_t> most;
  int64_t sum = 0;
  for (int64_t b = 0; b < max_rows; ++b) {
    sum += size_t(b) < counts.size() ? counts[size_t(b)] : 1;  // beyond rows(): a padding row
    most.push_back(sum);
  }
  return most;
}

double PackedRows::fill() const {
  return rows_ == 0 ? 0.0 : 1.0 - double(padding_) / double(rows_ * seq_len_);
}

int64_t PackedRows::CopyRow(int64_t row, MicroBatch& mb, int64_t slot) const {
  const size_t T = size_t(seq_len_), dst = size_t(slot) * T;
  if (row >= rows_) {
    std::fill_n(mb.tokens.begin() + int64_t(dst), T, pad_id_);
    std::fill_n(mb.targets.begin() + int64_t(dst), T, kIgnoreTarget);
    std::fill_n(mb.doc_ids.begin() + int64_t(dst), T, 0);
    for (size_t t = 0; t < T; ++t) mb.positions[dst + t] = int32_t(t);
    return 0;
  }
  const size_t src = size_t(row) * T;
  std::copy_n(tokens_.begin() + int64_t(src), T, mb.tokens.begin() + int64_t(dst));
  // A trained position's target is the next id: the same piece's, so never past the row.
  for (size_t t = 0; t < T; ++t) {
    mb.targets[dst + t] = next_trained_[src + t] != 0 ? tokens_[src + t + 1] : kIgnoreTarget;
  }
  // Each piece a document with positions from 0; the padding after them one more.
  size_t at = dst;
  int32_t doc = 0;
  for (int64_t k = row_pieces_[size_t(row)]; k < row_pieces_[size_t(row) + 1]; ++k, ++doc) {
    for (int32_t pos = 0; pos < piece_lengths_[size_t(k)]; ++pos, ++at) {
      mb.doc_ids[at] = doc;
      mb.positions[at] = pos;
    }
  }
  for (int32_t pos = 0; at < dst + T; ++pos, ++at) {
    mb.doc_ids[at] = doc;
    mb.positions[at] = pos;
  }
  return row_valid_[size_t(row)];
}

MicroBatch EmptyPackedMicroBatch(int64_t batch, int64_t seq_len) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq_len = seq_len;
  const size_t n = size_t(batch * seq_len);
  mb.tokens.resize(n);
  mb.targets.resize(n);
  mb.doc_ids.resize(n);
  mb.positions.resize(n);
  return mb;
}

MicroBatch SequentialMicroBatch(const PackedRows& rows, int64_t first, int64_t batch) {
  MicroBatch mb = EmptyPackedMicroBatch(batch, rows.seq_len());
  for (int64_t r = 0; r < batch; ++r) mb.valid_targets += rows.CopyRow(first + r, mb, r);
  return mb;
}

Result<PackedBatcher> PackedBatcher::Create(const PackedRows* rows, int64_t micro_batch,
                                            int64_t micro_batches, uint64_t seed) {
  if (micro_batch <= 0 || micro_batches <= 0) {
    return Status::InvalidArgument("micro-batch rows and micro-batches must be positive");
  }
  if (rows->rows() == 0) {
    return Status::InvalidArgument(
        "the dataset packs into no rows: no example has a target to learn from");
  }
  return PackedBatcher(rows, micro_batch, micro_batches, seed);
}

int64_t PackedBatcher::RowOf(int64_t global_row) const {
  const uint64_t n = uint64_t(rows_->rows());
  const uint64_t epoch = uint64_t(global_row) / n;
  const uint64_t key = Mix64(seed_ ^ Mix64(epoch ^ 0x65706f6368ull));  // "epoch"
  return int64_t(PermuteIndex(uint64_t(global_row) % n, n, key));
}

MicroBatch PackedBatcher::MakeMicroBatch(int64_t step, int64_t micro) const {
  MicroBatch mb = EmptyPackedMicroBatch(micro_batch_, rows_->seq_len());
  const int64_t first = (step * micro_batches_ + micro) * micro_batch_;
  for (int64_t r = 0; r < micro_batch_; ++r) {
    mb.valid_targets += rows_->CopyRow(RowOf(first + r), mb, r);
  }
  return mb;
}

}  // namespace ferry
