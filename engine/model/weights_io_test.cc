#include "engine/model/weights_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/model/embedding.h"
#include "engine/testing/golden_model.h"

namespace ferry {
namespace {

const ParamSpec* FindSpec(const std::vector<LayerSpec>& layers, const std::string& name) {
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.name == name) return &p;
    }
  }
  return nullptr;
}

TEST(WeightsIoTest, Gpt2Conv1DLoadsTransposedAndSavesBack) {
  Result<testing::GoldenModel> g = testing::GoldenModel::Load("gpt2");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<LayerSpec> layers = BuildLayerSpecs(g->config, LoraConfig{});
  const ParamSpec* p = FindSpec(layers, "transformer.h.1.mlp.c_fc.weight");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(MasterShape(*p), (std::vector<int64_t>{128, 48}));  // (out, in)
  std::vector<float> master(size_t(p->numel()));
  ASSERT_TRUE(LoadParameter(g->weights, *p, master).ok());
  Result<std::vector<float>> stored = g->weights.ReadFloats(p->name);  // (in 48, out 128)
  ASSERT_TRUE(stored.ok());
  for (int64_t o = 0; o < 128; ++o) {
    for (int64_t i = 0; i < 48; ++i) {
      ASSERT_EQ(master[size_t(o * 48 + i)], (*stored)[size_t(i * 128 + o)]) << o << "," << i;
    }
  }
  // Saving restores the checkpoint layout bit for bit.
  const std::string path =
      ::testing::TempDir() + "/ferry_wio_" + std::to_string(::getpid()) + ".safetensors";
  SafetensorsWriter w;
  AddParameter(w, *p, master);
  ASSERT_TRUE(w.Write(path).ok());
  Result<SafetensorsFile> back = SafetensorsFile::Open(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Find(p->name)->shape, p->shape);
  EXPECT_EQ(*back->ReadFloats(p->name), *stored);
  ::unlink(path.c_str());
}

TEST(WeightsIoTest, LoadsEveryGoldenParameterAndNamesBadOnes) {
  for (const char* model : {"llama", "qwen3", "gpt2"}) {
    Result<testing::GoldenModel> g = testing::GoldenModel::Load(model);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (const LayerSpec& l : BuildLayerSpecs(g->config, LoraConfig{})) {
      for (const ParamSpec& p : l.params) {
        if (!p.tied_to.empty()) continue;
        std::vector<float> v(size_t(p.numel()));
        EXPECT_TRUE(LoadParameter(g->weights, p, v).ok()) << model << " " << p.name;
      }
    }
  }
  Result<testing::GoldenModel> g = testing::GoldenModel::Load("llama");
  ASSERT_TRUE(g.ok());
  ParamSpec wrong;
  wrong.name = "model.norm.weight";
  wrong.shape = {65};
  std::vector<float> v(65);
  Status s = LoadParameter(g->weights, wrong, v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos);
  ParamSpec missing = wrong;
  missing.name = "model.nope.weight";
  EXPECT_EQ(LoadParameter(g->weights, missing, v).code(), StatusCode::kNotFound);
}

TEST(WeightsIoTest, InitIsDeterministicAndShaped) {
  LoraConfig lora{.rank = 4, .alpha = 8};
  std::vector<LayerSpec> layers = BuildLayerSpecs(TinyLlamaPreset(), lora);
  const ParamSpec* q = FindSpec(layers, "model.layers.0.self_attn.q_proj.weight");
  const ParamSpec* k = FindSpec(layers, "model.layers.0.self_attn.k_proj.weight");
  const ParamSpec* norm = FindSpec(layers, "model.layers.0.input_layernorm.weight");
  const ParamSpec* a =
      FindSpec(layers, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const ParamSpec* b =
      FindSpec(layers, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  ASSERT_TRUE(q && k && norm && a && b);
  std::vector<float> q1(size_t(q->numel())), q2(q1.size()), q3(q1.size());
  InitParameter(*q, 7, q1);
  InitParameter(*q, 7, q2);
  InitParameter(*q, 8, q3);
  EXPECT_EQ(q1, q2);
  EXPECT_NE(q1, q3);
  std::vector<float> k1(size_t(k->numel()));
  InitParameter(*k, 7, k1);
  EXPECT_NE(std::vector<float>(q1.begin(), q1.begin() + 16),
            std::vector<float>(k1.begin(), k1.begin() + 16));  // streams keyed by name
  // 36,864 samples of N(0, 0.02^2): the sample std is within 2% of 0.02 with overwhelming odds
  // (its relative standard error is 1/sqrt(2n) = 0.37%), and the mean within 0.05 std.
  double sum = 0, sq = 0;
  for (float x : q1) sum += x, sq += double(x) * x;
  const double n = double(q1.size()), mean = sum / n;
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(mean, 0.0, 0.05 * 0.02);
  std::vector<float> nv(size_t(norm->numel())), av(size_t(a->numel())), bv(size_t(b->numel()));
  InitParameter(*norm, 7, nv);
  InitParameter(*a, 7, av);
  InitParameter(*b, 7, bv);
  for (float x : nv) ASSERT_EQ(x, 1.0f);
  for (float x : bv) ASSERT_EQ(x, 0.0f);
  const float bound = 1.0f / std::sqrt(float(a->shape[1]));
  for (float x : av) ASSERT_LE(std::abs(x), bound);
}

TEST(EmbeddingTest, GatherAndScatterAdd) {
  const EmbeddingShape s{.vocab = 3, .positions = 4, .hidden = 2};
  const std::vector<float> wte = {1, 2, 3, 4, 5, 6}, wpe = {10, 20, 30, 40, 50, 60, 70, 80};
  const std::vector<int32_t> tokens = {2, 0, 2}, pos = {0, 1, 3};
  std::vector<float> out(6);
  ASSERT_TRUE(EmbeddingForward(s, wte, wpe, tokens, pos, out).ok());
  EXPECT_EQ(out, (std::vector<float>{15, 26, 31, 42, 75, 86}));
  std::vector<float> dwte(6, 1.0f), dwpe(8, 0.0f);
  EmbeddingBackward(s, std::vector<float>{1, 2, 3, 4, 5, 6}, tokens, pos, dwte, dwpe);
  EXPECT_EQ(dwte, (std::vector<float>{1 + 3, 1 + 4, 1, 1, 1 + 1 + 5, 1 + 2 + 6}));  // += twice
  EXPECT_EQ(dwpe, (std::vector<float>{1, 2, 3, 4, 0, 0, 5, 6}));
  // Bad ids are errors naming the index, not crashes.
  Status bad = EmbeddingForward(s, wte, wpe, std::vector<int32_t>{0, 3, 0}, pos, out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("index 1"), std::string::npos) << bad.message();
  EXPECT_FALSE(EmbeddingForward(s, wte, wpe, tokens, std::vector<int32_t>{0, 4, 0}, out).ok());
  const EmbeddingShape no_pos{.vocab = 3, .positions = 0, .hidden = 2};
  ASSERT_TRUE(EmbeddingForward(no_pos, wte, {}, tokens, {}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2, 5, 6}));
}

// Tables served from a model file: bf16 or f16 bytes at any alignment, gathered as the fp32
// tables of the same values (rows longer than the gather's 1024-value pieces included).
TEST(EmbeddingTest, GathersFileTablesAsTheirFp32Values) {
  const EmbeddingShape s{.vocab = 5, .positions = 3, .hidden = 1500};
  std::vector<float> wte(size_t(s.vocab * s.hidden)), wpe(size_t(s.positions * s.hidden));
  for (size_t i = 0; i < wte.size(); ++i) wte[i] = BF16ToFloat(FloatToBF16(0.37f * float(i % 97)));
  for (size_t i = 0; i < wpe.size(); ++i) wpe[i] = BF16ToFloat(FloatToBF16(-0.11f * float(i % 13)));
  const std::vector<int32_t> tokens = {4, 0, 4, 2}, pos = {0, 2, 1, 0};
  std::vector<float> want(tokens.size() * size_t(s.hidden));
  ASSERT_TRUE(EmbeddingForward(s, wte, wpe, tokens, pos, want).ok());
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    // One byte in, so no row is aligned.
    auto unaligned = [t](const std::vector<float>& values) {
      std::vector<float> converted(values.size());  // aligned for any dtype, then moved in
      ConvertFromFloat(values.data(), t, converted.data(), values.size());
      std::vector<std::byte> bytes(1 + values.size() * DTypeSize(t));
      std::memcpy(bytes.data() + 1, converted.data(), bytes.size() - 1);
      return bytes;
    };
    const std::vector<std::byte> wte_bytes = unaligned(wte), wpe_bytes = unaligned(wpe);
    std::vector<float> got(want.size());
    ASSERT_TRUE(EmbeddingForward(s, EmbeddingTable(std::span(wte_bytes).subspan(1), t),
                                 EmbeddingTable(std::span(wpe_bytes).subspan(1), t), tokens, pos,
                                 got)
                    .ok());
    if (t == DType::kF16) {  // bf16 values need not be f16 ones: compare with f16's rounding
      auto as_f16 = [](std::vector<float> v) {
        for (float& x : v) x = F16ToFloat(FloatToF16(x));
        return v;
      };
      const std::vector<float> wte16 = as_f16(wte), wpe16 = as_f16(wpe);
      std::vector<float> want16(want.size());
      ASSERT_TRUE(EmbeddingForward(s, wte16, wpe16, tokens, pos, want16).ok());
      EXPECT_EQ(got, want16);
    } else {
      EXPECT_EQ(got, want) << DTypeName(t);
    }
  }
}

}  // namespace
}  // namespace ferry
