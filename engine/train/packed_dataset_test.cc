#include "engine/train/packed_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace ferry {
namespace {

Example Ex(std::vector<int32_t> tokens, std::vector<uint8_t> trained = {}) {
  Example e;
  if (trained.empty()) trained.assign(tokens.size(), 1);
  e.tokens = std::move(tokens);
  e.trained = std::move(trained);
  return e;
}

TEST(PermuteIndexTest, IsAPermutationForEverySize) {
  for (uint64_t n : {1, 2, 3, 5, 16, 17, 100, 1000}) {
    for (uint64_t key : {0ull, 1ull, 0x9e3779b97f4a7c15ull}) {
      std::vector<uint64_t> seen(n, 0);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t p = PermuteIndex(i, n, key);
        ASSERT_LT(p, n);
        ++seen[p];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), int64_t(n)) << "n " << n;
    }
  }
  // Different keys give different orders (1000! orders: equal ones would be a bug).
  std::vector<uint64_t> a, b;
  for (uint64_t i = 0; i < 1000; ++i) {
    a.push_back(PermuteIndex(i, 1000, 1));
    b.push_back(PermuteIndex(i, 1000, 2));
  }
  EXPECT_NE(a, b);
}

TEST(PackedRowsTest, RowsHoldDocumentsWithTheirOwnPositionsAndTargets) {
  // T = 8: {5 tokens} and {3 tokens} share a row; the prompt token of the second is masked.
  const std::vector<Example> ex = {Ex({10, 11, 12, 13, 14}), Ex({20, 21, 22}, {0, 0, 1})};
  const PackedRows p = PackedRows::Pack(ex, 8, LongExamples::kSplit, /*pad_id=*/99);
  ASSERT_EQ(p.rows(), 1);
  MicroBatch mb = SequentialMicroBatch(p, 0, 1);
  EXPECT_EQ(mb.tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 20, 21, 22}));
  EXPECT_EQ(mb.targets, (std::vector<int32_t>{11, 12, 13, 14, -100, -100, 22, -100}));
  EXPECT_EQ(mb.doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(mb.valid_targets, 5);
  EXPECT_EQ(p.valid_targets(), 5);
  EXPECT_DOUBLE_EQ(p.fill(), 1.0);
  // Past the last row: a masked padding row.
  mb = SequentialMicroBatch(p, 1, 1);
  EXPECT_EQ(mb.valid_targets, 0);
  EXPECT_EQ(mb.tokens, std::vector<int32_t>(8, 99));
}

// MostDocuments counts what the CUDA attention counts: runs of one doc id in a row (pieces, and
// the padding after them), summed over the b rows that hold the most; a row past the last is one.
TEST(PackedRowsTest, MostDocumentsAreTheDocIdRunsOfTheFullestRows) {
  const std::vector<Example> ex = {Ex({1, 2, 3, 4, 5}), Ex({6, 7, 8}), Ex({1, 2}),
                                   Ex({3, 4}),          Ex({5, 6}),    Ex({1, 2, 3, 4, 5, 6, 7})};
  const PackedRows p = PackedRows::Pack(ex, 8, LongExamples::kSplit, 0);
  std::vector<int64_t> runs;
  for (int64_t r = 0; r < p.rows(); ++r) {
    const MicroBatch mb = SequentialMicroBatch(p, r, 1);
    int64_t n = 1;
    for (size_t t = 1; t < mb.doc_ids.size(); ++t) n += mb.doc_ids[t] != mb.doc_ids[t - 1];
    runs.push_back(n);
  }
  std::sort(runs.begin(), runs.end(), std::greater<>());
  ASSERT_GE(runs.size(), 2u);
  EXPECT_GE(runs[0], 3);  // some row holds several short examples
  const int64_t max_rows = p.rows() + 2;
  const std::vector<int64_t> most = p.MostDocuments(max_rows);
  ASSERT_EQ(most.size(), size_t(max_rows));
  int64_t sum = 0;
  for (int64_t b = 0; b < max_rows; ++b) {
    sum += size_t(b) < runs.size() ? runs[size_t(b)] : 1;
    EXPECT_EQ(most[size_t(b)], sum) << "b = " << b + 1;
  }
}

TEST(PackedRowsTest, LongExamplesSplitWithoutLosingTargetsOrTruncate) {
  std::vector<int32_t> ids(10);
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<Example> ex = {Ex(ids)};
  // T = 4: pieces [0,4) [3,7) [6,10): every one of the 9 targets predicted exactly once.
  const PackedRows split = PackedRows::Pack(ex, 4, LongExamples::kSplit, 0);
  EXPECT_EQ(split.pieces(), 3);
  EXPECT_EQ(split.valid_targets(), 9);
  std::multiset<int32_t> targets;
  for (int64_t r = 0; r < split.rows(); ++r) {
    const MicroBatch mb = SequentialMicroBatch(split, r, 1);
    for (int32_t t : mb.targets) {
      if (t != kIgnoreTarget) targets.insert(t);
    }
  }
  EXPECT_EQ(targets, (std::multiset<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const PackedRows trunc = PackedRows::Pack(ex, 4, LongExamples::kTruncate, 0);
  EXPECT_EQ(trunc.pieces(), 1);
  EXPECT_EQ(trunc.valid_targets(), 3);
}

// Random examples (token ex * 1000 + i, so each id says where it came from; random masks, some
// longer than a row), packed at several row lengths: every row reads as documents that are
// slices of one example each, their positions from 0 and their targets the next id where the
// example trains it, then padding; and in split mode every trained target of every example is
// predicted exactly once.
TEST(PackedRowsTest, RowsAreSlicesOfTheExamplesAndPredictEveryTargetOnce) {
  std::mt19937 rng(7);
  std::vector<Example> ex;
  for (int32_t x = 0; x < 60; ++x) {
    const int n = 1 + int(rng() % 40);
    Example e;
    for (int i = 0; i < n; ++i) {
      e.tokens.push_back(x * 1000 + i);
      e.trained.push_back(uint8_t(rng() % 4 != 0));
    }
    ex.push_back(std::move(e));
  }
  constexpr int32_t kPad = 999999;
  for (int64_t T : {2, 5, 16, 64}) {
    for (LongExamples mode : {LongExamples::kSplit, LongExamples::kTruncate}) {
      const PackedRows p = PackedRows::Pack(ex, T, mode, kPad);
      std::map<std::pair<int32_t, int32_t>, int> predicted;  // (example, position) -> times
      int64_t valid = 0;
      for (int64_t r = 0; r < p.rows(); ++r) {
        const MicroBatch mb = SequentialMicroBatch(p, r, 1);
        int64_t row_valid = 0;
        for (size_t t = 0; t < size_t(T);) {
          const int32_t doc = mb.doc_ids[t];
          ASSERT_EQ(doc, t == 0 ? 0 : mb.doc_ids[t - 1] + 1) << "T " << T << " row " << r;
          size_t end = t;
          while (end < size_t(T) && mb.doc_ids[end] == doc) ++end;
          const bool padding = mb.tokens[t] == kPad;
          const int32_t x = mb.tokens[t] / 1000, b = mb.tokens[t] % 1000;
          for (size_t i = t; i < end; ++i) {
            ASSERT_EQ(mb.positions[i], int32_t(i - t));
            if (padding) {
              ASSERT_EQ(end, size_t(T)) << "padding ends the row";
              ASSERT_EQ(mb.tokens[i], kPad);
              ASSERT_EQ(mb.targets[i], kIgnoreTarget);
              continue;
            }
            const int32_t at = b + int32_t(i - t);
            ASSERT_EQ(mb.tokens[i], x * 1000 + at);
            const bool trains = i + 1 < end && ex[size_t(x)].trained[size_t(at) + 1] != 0;
            ASSERT_EQ(mb.targets[i], trains ? x * 1000 + at + 1 : kIgnoreTarget)
                << "T " << T << " row " << r << " token " << i;
            if (trains) ++predicted[{x, at + 1}], ++row_valid;
          }
          if (!padding && mode == LongExamples::kTruncate) {
            ASSERT_EQ(b, 0);
          }
          t = end;
        }
        EXPECT_EQ(mb.valid_targets, row_valid);
        valid += row_valid;
      }
      EXPECT_EQ(p.valid_targets(), valid);
      if (mode != LongExamples::kSplit) continue;
      for (int32_t x = 0; x < int32_t(ex.size()); ++x) {
        for (int32_t j = 1; j < int32_t(ex[size_t(x)].tokens.size()); ++j) {
          const auto it = predicted.find({x, j});
          EXPECT_EQ(it == predicted.end() ? 0 : it->second, ex[size_t(x)].trained[size_t(j)])
              << "T " << T << " example " << x << " target " << j;
        }
      }
    }
  }
}

TEST(PackedRowsTest, DropsExamplesWithNothingToLearn) {
  const std::vector<Example> ex = {Ex({1, 2}, {0, 0}), Ex({3}), Ex({4, 5})};
  const PackedRows p = PackedRows::Pack(ex, 4, LongExamples::kSplit, 0);
  EXPECT_EQ(p.dropped_pieces(), 2);
  EXPECT_EQ(p.pieces(), 1);
}

TEST(PackedBatcherTest, PureFunctionOfCoordinatesAndEachEpochVisitsEveryRowOnce) {
  std::vector<Example> ex;
  for (int32_t i = 0; i < 37; ++i) ex.push_back(Ex({i, i, i, i}));  // one row each at T = 4
  const PackedRows p = PackedRows::Pack(ex, 4, LongExamples::kSplit, 0);
  ASSERT_EQ(p.rows(), 37);
  Result<PackedBatcher> a = PackedBatcher::Create(&p, 3, 2, 42);
  Result<PackedBatcher> b = PackedBatcher::Create(&p, 3, 2, 42);
  Result<PackedBatcher> c = PackedBatcher::Create(&p, 3, 2, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  // The same coordinates give the same batch, in any order of calls (a resume needs only the
  // step); another seed gives another order.
  const MicroBatch late = a->MakeMicroBatch(9, 1);
  EXPECT_EQ(a->MakeMicroBatch(0, 0).tokens, b->MakeMicroBatch(0, 0).tokens);
  EXPECT_EQ(late.tokens, b->MakeMicroBatch(9, 1).tokens);
  EXPECT_NE(a->MakeMicroBatch(0, 0).tokens, c->MakeMicroBatch(0, 0).tokens);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> rows;
    for (int64_t g = epoch * 37; g < (epoch + 1) * 37; ++g) rows.insert(a->RowOf(g));
    EXPECT_EQ(rows.size(), 37u) << "epoch " << epoch;
  }
  std::vector<int64_t> e0, e1;
  for (int64_t g = 0; g < 37; ++g) {
    e0.push_back(a->RowOf(g));
    e1.push_back(a->RowOf(37 + g));
  }
  EXPECT_NE(e0, e1);  // epochs are reshuffled
}

TEST(PackedBatcherTest, ShuffleAndValidationSplitAreDeterministic) {
  std::vector<Example> ex;
  for (int32_t i = 0; i < 20; ++i) ex.push_back(Ex({i, i}));
  std::vector<Example> s1 = ShuffleExamples(ex, 5), s2 = ShuffleExamples(ex, 5);
  std::vector<int32_t> first1, first2;
  for (size_t i = 0; i < ex.size(); ++i) {
    first1.push_back(s1[i].tokens[0]);
    first2.push_back(s2[i].tokens[0]);
  }
  EXPECT_EQ(first1, first2);
  std::vector<int32_t> sorted = first1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> all(20);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);  // a permutation
  const std::vector<Example> val = SplitValidation(s1, 0.1);
  EXPECT_EQ(val.size(), 2u);
  EXPECT_EQ(s1.size(), 18u);
  std::vector<Example> tiny = {Ex({1, 2}), Ex({3, 4})};
  EXPECT_EQ(SplitValidation(tiny, 0.001).size(), 1u);  // at least one, never all
  EXPECT_EQ(tiny.size(), 1u);
}

}  // namespace
}  // namespace ferry
