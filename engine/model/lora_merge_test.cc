// The merge of a LoRA adapter into its base, element by element against the sum written out here
// in double (W + alpha / r * B A) for a Llama model (gate/up fused on devices) and for GPT-2
// (Conv1D weights stored (in, out), its q/k/v one fused c_attn); every other tensor as it was;
// errors.
#include "engine/model/lora_merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/model/weights_io.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/tiny_models.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

constexpr char kLlama[] = R"({"model_type": "llama", "vocab_size": 40, "hidden_size": 16,
  "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "torch_dtype": "bfloat16"})";
constexpr char kGpt2[] = R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 16, "n_layer": 2,
  "n_head": 2, "n_positions": 32})";

// A model of `config_json` with a rank-3 adapter on every projection, every tensor (the LoRA B
// matrices too) drawn at random.
LoadedModel Model(const char* config_json) {
  Result<ModelConfig> c = ParseHfConfig(config_json);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  LoadedModel m;
  m.config = *c;
  m.lora = {.rank = 3, .alpha = 5.0};
  m.layers = BuildLayerSpecs(m.config, m.lora);
  m.weights = testing::TinyWeights(m.layers, 11);
  return m;
}

// Writes the merge of `m` into a fresh folder and checks each tensor of its model.safetensors.
void ExpectMerged(const LoadedModel& m, const std::string& dir, int64_t want_projections) {
  ModelFolderWriteOptions f32;
  f32.dtype = DType::kF32;
  Result<MergeSummary> s = WriteMergedModelFolder(dir, m, f32);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->projections, want_projections);
  Result<SafetensorsFile> f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const double scaling = m.lora.scaling();
  int64_t merged = 0, tensors = 0;
  for (const LayerSpec& layer : m.layers) {
    for (const ParamSpec& p : layer.params) {
      if (!p.tied_to.empty()) continue;
      if (p.lora) {
        EXPECT_EQ(f->Find(p.name), nullptr) << p.name << ": no adapter in a merged folder";
        continue;
      }
      ++tensors;
      Result<std::vector<float>> got = f->ReadFloats(p.name, &p.shape);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const std::vector<float>& w = m.weights.tensors.at(p.name);  // master layout (out, in)
      const std::string module = p.name.substr(0, p.name.size() - std::string(".weight").size());
      const std::string a_name = std::string(kPeftPrefix) + module + ".lora_A.weight";
      auto a = m.weights.tensors.find(a_name);
      if (!p.name.ends_with(".weight") || a == m.weights.tensors.end()) {
        // Not adapted: written as it was (f32 to f32, laid out as stored).
        std::vector<float> laid;
        const std::span<const float> stored = CheckpointLayout(p, w, laid);
        ASSERT_EQ(got->size(), stored.size()) << p.name;
        for (size_t i = 0; i < stored.size(); ++i) ASSERT_EQ((*got)[i], stored[i]) << p.name;
        continue;
      }
      ++merged;
      const std::vector<float>& b =
          m.weights.tensors.at(std::string(kPeftPrefix) + module + ".lora_B.weight");
      const std::vector<int64_t> master = MasterShape(p);
      const int64_t out = master[0], in = master[1], r = m.lora.rank;
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          double delta = 0, size = 0;
          for (int64_t k = 0; k < r; ++k) {
            delta += double(b[size_t(o * r + k)]) * double(a->second[size_t(k * in + i)]);
            size += std::abs(double(b[size_t(o * r + k)]) * double(a->second[size_t(k * in + i)]));
          }
          const double want = double(w[size_t(o * in + i)]) + scaling * delta;
          // Stored (in, out) when the checkpoint transposes (GPT-2's Conv1D).
          const size_t at = size_t(p.transposed ? i * out + o : o * in + i);
          ASSERT_NEAR((*got)[at], want, 1e-6 * (std::abs(want) + scaling * size) + 1e-30)
              << p.name << " [" << o << ", " << i << "]";
        }
      }
    }
  }
  EXPECT_EQ(merged, want_projections);
  EXPECT_EQ(s->tensors, tensors);
  // A plain model folder: config.json reads back as the model, with no adapter beside it.
  Result<ModelConfig> c = LoadHfConfig(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, m.config.family);
  EXPECT_EQ(c->weights_dtype, DType::kF32);
  EXPECT_FALSE(fs::exists(dir + "/adapter_config.json"));
}

TEST(LoraMerge, LlamaProjectionsGainScaledBATheRestAsWritten) {
  testing::TempDir tmp;
  // Seven projections a block: q, k, v, o, gate, up, down.
  ExpectMerged(Model(kLlama), tmp.path() + "/llama", 2 * 7);
}

TEST(LoraMerge, Gpt2Conv1DWeightsMergeInTheirStoredLayout) {
  testing::TempDir tmp;
  // c_attn (q, k and v fused), attn.c_proj, mlp.c_fc, mlp.c_proj a block.
  ExpectMerged(Model(kGpt2), tmp.path() + "/gpt2", 2 * 4);
}

// PEFT's own merge_and_unload of the llama_lora golden adapter (B not zero) onto its base
// (scripts/make_merge_goldens.py), in fp32 and with the base in bf16 (PEFT adds its fp32 delta to
// the bf16 weight and rounds once, as ferry does; ferry reads that base from a bf16 copy of the
// golden's fp32 folder, rounded as torch rounds). On the machine that wrote this every value
// matched bit for bit; the bounds allow what another BLAS kernel may do: PEFT's B A and ferry's
// SGEMM each sum the rank's four products in their own order, so an fp32 value may be a rounding
// or two away, and a bf16 one a step away where those sums straddle a rounding boundary.
TEST(LoraMerge, MatchesPeftsMergeAndUnload) {
  testing::TempDir tmp;
  const std::string base = testing::GoldenPath("llama", "");
  const std::string adapter = testing::GoldenPath("llama_lora", "");
  {
    Result<LoadedModel> f32 = LoadModelFolder(base);
    ASSERT_TRUE(f32.ok()) << f32.status().ToString();
    ModelFolderWriteOptions bf16;
    bf16.dtype = DType::kBF16;
    ASSERT_TRUE(
        WriteModelFolder(tmp.path() + "/base_bf16", f32->config, f32->layers, f32->weights, bf16)
            .ok());
  }
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    Result<LoadedModel> m =
        LoadModelFolder(dtype == DType::kF32 ? base : tmp.path() + "/base_bf16", adapter);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const std::string dir = tmp.path() + "/" + std::string(DTypeName(dtype));
    ModelFolderWriteOptions options;
    options.dtype = dtype;
    Result<MergeSummary> s = WriteMergedModelFolder(dir, *m, options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->projections, 2 * 7);
    Result<SafetensorsFile> got = SafetensorsFile::Open(dir + "/model.safetensors");
    Result<SafetensorsFile> want = SafetensorsFile::Open(testing::GoldenPath(
        "llama_lora", dtype == DType::kF32 ? "merged.safetensors" : "merged_bf16.safetensors"));
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->tensors().size(), want->tensors().size());
    int64_t values = 0, off = 0;
    for (const SafetensorsTensorInfo& t : want->tensors()) {
      const SafetensorsTensorInfo* g = got->Find(t.name);
      ASSERT_NE(g, nullptr) << t.name;
      ASSERT_EQ(g->dtype, t.dtype) << t.name;
      ASSERT_EQ(g->shape, t.shape) << t.name;
      Result<std::vector<float>> a = got->ReadFloats(t.name), b = want->ReadFloats(t.name);
      ASSERT_TRUE(a.ok() && b.ok()) << t.name;
      for (size_t i = 0; i < b->size(); ++i) {
        ++values;
        if ((*a)[i] == (*b)[i]) continue;
        ++off;
        if (dtype == DType::kF32) {
          EXPECT_NEAR((*a)[i], (*b)[i], 4e-7 * (std::abs((*b)[i]) + 0.05)) << t.name << " " << i;
        } else {  // one bf16 step apart: their f32 bit patterns differ by 1 << 16
          uint32_t x, y;
          std::memcpy(&x, &(*a)[i], 4);
          std::memcpy(&y, &(*b)[i], 4);
          EXPECT_EQ(x > y ? x - y : y - x, 1u << 16) << t.name << " " << i;
        }
      }
    }
    std::printf("[ INFO     ] %s: %lld of %lld values differ from PEFT's merge\n",
                std::string(DTypeName(dtype)).c_str(), (long long)off, (long long)values);
    EXPECT_LT(off, values / (dtype == DType::kF32 ? 4 : 100)) << DTypeName(dtype);
  }
}

// A QLoRA base (a folder pre-quantized by bitsandbytes) is dequantized and merged: each adapted
// weight is bitsandbytes' own dequantization of it (the llama_bnb4 golden's dequant.safetensors)
// plus scaling * B A, written unquantized.
TEST(LoraMerge, DequantizesAnNf4BaseAndMergesIntoIt) {
  testing::TempDir tmp;
  Result<LoadedModel> m = LoadModelFolder(testing::GoldenPath("llama_bnb4", ""),
                                          testing::GoldenPath("llama_qlora", ""));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->lora.quantize, BaseQuant::kNf4);
  ModelFolderWriteOptions f32;
  f32.dtype = DType::kF32;
  Result<MergeSummary> s = WriteMergedModelFolder(tmp.path() + "/merged", *m, f32);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->projections, 2 * 7);
  Result<SafetensorsFile> got = SafetensorsFile::Open(tmp.path() + "/merged/model.safetensors");
  Result<SafetensorsFile> dequant =
      SafetensorsFile::Open(testing::GoldenPath("llama_bnb4", "dequant.safetensors"));
  ASSERT_TRUE(got.ok() && dequant.ok());
  const double scaling = m->lora.scaling();
  for (const SafetensorsTensorInfo& t : dequant->tensors()) {
    Result<std::vector<float>> w = dequant->ReadFloats(t.name), g = got->ReadFloats(t.name);
    ASSERT_TRUE(w.ok() && g.ok()) << t.name;
    const std::string module = t.name.substr(0, t.name.size() - std::string(".weight").size());
    const std::vector<float>& a =
        m->weights.tensors.at(std::string(kPeftPrefix) + module + ".lora_A.weight");
    const std::vector<float>& b =
        m->weights.tensors.at(std::string(kPeftPrefix) + module + ".lora_B.weight");
    const int64_t out = t.shape[0], in = t.shape[1], r = m->lora.rank;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double delta = 0;
        for (int64_t k = 0; k < r; ++k) delta += double(b[o * r + k]) * double(a[k * in + i]);
        const double want = double((*w)[o * in + i]) + scaling * delta;
        ASSERT_NEAR((*g)[o * in + i], want, 1e-6 * (std::abs(want) + 0.05))
            << t.name << " [" << o << ", " << i << "]";
      }
    }
  }
  Result<ModelConfig> c = LoadHfConfig(tmp.path() + "/merged/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<LoadedModel> plain = LoadModelFolder(tmp.path() + "/merged");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->lora.quantize, BaseQuant::kNone) << "the merged folder is not quantized";
}

TEST(LoraMerge, RefusesAModelWithoutAnAdapterOrWithAMissingMatrix) {
  testing::TempDir tmp;
  LoadedModel m = Model(kLlama);
  LoadedModel base = m;
  base.lora = {};
  base.layers = BuildLayerSpecs(base.config, base.lora);
  Result<MergeSummary> none = WriteMergedModelFolder(tmp.path() + "/none", base, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no LoRA adapter"), std::string::npos)
      << none.status().ToString();
  const std::string b = std::string(kPeftPrefix) + "model.layers.1.mlp.down_proj.lora_B.weight";
  ASSERT_EQ(m.weights.tensors.erase(b), 1u);
  Result<MergeSummary> lacking = WriteMergedModelFolder(tmp.path() + "/lacking", m, {});
  ASSERT_FALSE(lacking.ok());
  EXPECT_NE(lacking.status().message().find(b), std::string::npos) << lacking.status().ToString();
  EXPECT_FALSE(fs::exists(tmp.path() + "/lacking"));
}

}  // namespace
}  // namespace ferry
