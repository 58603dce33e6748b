// Packed rows (several documents per row, MicroBatchInput::doc_ids and positions) compute exactly
// what each document computes alone: logits, the forward-only loss and the gradients, element by
// element, for a Llama-style model (RoPE positions), Qwen3 (GQA, q/k norms) and GPT-2 (learned
// positions).
#include <gtest/gtest.h>

#include <random>

#include "engine/model/model_runner.h"
#include "engine/testing/reference_runner.h"
#include "engine/testing/runner_fixture.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::RunnerFixture;

// The same per-token arithmetic runs in both layouts; only the GEMM panels (a different number of
// rows N) and the attention tiles may sum in another order. Dot products are of length <= 128 in
// fp32 over O(1) values, so a few dozen eps of the magnitudes bound the difference: logits atol
// 64 eps (as the golden tests). A weight gradient sums the outer products of ~10 tokens, each
// carrying such a forward difference, and the two documents' sums are regrouped: 64 eps absolute
// (measured worst 3.2e-6 = 27 eps, Qwen3's v_proj) plus 1e-5 relative.
constexpr float kEps = DTypeEpsilon(DType::kF32);
constexpr float kLogitAtol = 64 * kEps, kLogitRtol = 8 * kEps;
constexpr float kGradAtol = 64 * kEps, kGradRtol = 1e-5f;

constexpr int64_t kT = 16;           // the packed row
constexpr int64_t kLens[] = {7, 5};  // two documents, then 4 tokens of padding

struct Doc {
  std::vector<int32_t> tokens, targets;
};

Doc MakeDoc(int64_t len, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, int32_t(vocab - 1));
  Doc d;
  for (int64_t t = 0; t < len; ++t) d.tokens.push_back(id(rng));
  for (int64_t t = 0; t < len; ++t) {
    d.targets.push_back(t + 1 < len ? d.tokens[size_t(t) + 1] : -100);
  }
  return d;
}

class PackedRunnerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PackedRunnerTest, PackedRowMatchesEachDocumentAlone) {
  ReferenceRunnerOptions packed_options;
  packed_options.shape = {1, kT};
  Result<std::unique_ptr<RunnerFixture>> packed = RunnerFixture::Create(GetParam(), packed_options);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  const int64_t V = (*packed)->golden.config.vocab_size;
  std::mt19937 rng(7);
  std::vector<Doc> docs;
  for (int64_t len : kLens) docs.push_back(MakeDoc(len, V, rng));

  std::vector<int32_t> tokens, targets, doc_ids, positions;
  for (size_t d = 0; d < docs.size(); ++d) {
    for (size_t t = 0; t < docs[d].tokens.size(); ++t) {
      tokens.push_back(docs[d].tokens[t]);
      targets.push_back(docs[d].targets[t]);
      doc_ids.push_back(int32_t(d));
      positions.push_back(int32_t(t));
    }
  }
  for (int32_t p = 0; int64_t(tokens.size()) < kT; ++p) {  // padding: its own document
    tokens.push_back(0);
    targets.push_back(-100);
    doc_ids.push_back(int32_t(docs.size()));
    positions.push_back(p);
  }
  const MicroBatchInput in{.tokens = tokens,
                           .targets = targets,
                           .normalizer = 1,
                           .doc_ids = doc_ids,
                           .positions = positions};
  Result<std::vector<float>> logits = (*packed)->runner->PackedLogits(in);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  Result<double> eval_loss = (*packed)->runner->EvaluateLoss(in);
  ASSERT_TRUE(eval_loss.ok()) << eval_loss.status().ToString();
  HostTensors packed_grads = (*packed)->ZeroGrads();
  Result<double> packed_loss = (*packed)->runner->AccumulateGradients(in, packed_grads);
  ASSERT_TRUE(packed_loss.ok()) << packed_loss.status().ToString();
  // The forward-only loss is the training forward's loss, bit for bit.
  EXPECT_EQ(*eval_loss, *packed_loss);

  HostTensors alone_grads = (*packed)->ZeroGrads();
  double alone_loss = 0;
  size_t offset = 0;
  for (const Doc& d : docs) {
    ReferenceRunnerOptions o;
    o.shape = {1, int64_t(d.tokens.size())};
    Result<std::unique_ptr<RunnerFixture>> alone = RunnerFixture::Create(GetParam(), o);
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    Result<std::vector<float>> want = (*alone)->runner->Logits(d.tokens);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    const std::vector<float> got(logits->begin() + int64_t(offset) * V,
                                 logits->begin() + int64_t(offset + d.tokens.size()) * V);
    ExpectClose(got, *want, kLogitAtol, kLogitRtol, "logits of a packed document");
    Result<double> loss = (*alone)->runner->AccumulateGradients(
        {.tokens = d.tokens, .targets = d.targets, .normalizer = 1}, alone_grads);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    alone_loss += *loss;
    offset += d.tokens.size();
  }
  // Sums of 10 -log p of O(1): relative 1e-6 covers the regrouped fp32 partial sums.
  EXPECT_NEAR(*packed_loss, alone_loss, 1e-6 * alone_loss);
  for (const auto& [name, g] : packed_grads.tensors) {
    ExpectClose(g, alone_grads.tensors.at(name), kGradAtol, kGradRtol, name);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, PackedRunnerTest, ::testing::Values("llama", "qwen3", "gpt2"));

TEST(PackedRunnerTest, RejectsLayoutOfTheWrongSize) {
  ReferenceRunnerOptions o;
  o.shape = {1, 8};
  Result<std::unique_ptr<RunnerFixture>> f = RunnerFixture::Create("llama", o);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<int32_t> tokens(8, 1), targets(8, 1), short_ids(7, 0);
  Result<double> r = (*f)->runner->EvaluateLoss(
      {.tokens = tokens, .targets = targets, .normalizer = 1, .doc_ids = short_ids});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("doc_ids"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace ferry
