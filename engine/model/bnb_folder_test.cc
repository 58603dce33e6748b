// Pre-quantized bitsandbytes 4-bit folders: the golden folder transformers + bitsandbytes wrote
// (tests/goldens/llama_bnb4) reads completely, every NF4 weight dequantizes (by nf4.h's formula,
// written out below) to bitsandbytes' own dequantize_4bit output bit for bit, and corrupted copies
// are refused naming the tensor. (kernels/nf4.cc's DequantizeNf4 is checked against the same
// golden in bnb_dequant_test.cc.)
#include "engine/model/bnb_folder.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "engine/job/model_source.h"
#include "engine/json.h"
#include "engine/model/weights_io.h"
#include "engine/testing/golden_files.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::GoldenJson;
using testing::GoldenPath;
using testing::ReadTextFile;

constexpr const char* kQ = "model.layers.0.self_attn.q_proj.weight";  // (64, 64): 64 blocks

std::string GoldenDir(const char* golden = "llama_bnb4") {
  return fs::path(GoldenPath(golden, "config.json")).parent_path();
}

// A safetensors file as raw tensors, to corrupt and write back.
struct RawTensor {
  SafetensorsDType dtype = SafetensorsDType::kU8;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

RawTensors ReadRaw(const std::string& path) {
  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  RawTensors out;
  if (!f.ok()) return out;
  for (const SafetensorsTensorInfo& t : f->tensors()) {
    std::span<const std::byte> d = f->Data(t);
    out[t.name] = {t.dtype, t.shape, {d.begin(), d.end()}};
  }
  return out;
}

void WriteRaw(const std::string& path, const RawTensors& tensors) {
  std::vector<SafetensorsWriteTensor> list;
  for (const auto& [name, t] : tensors) {
    list.push_back({.name = name, .shape = t.shape, .data = t.bytes, .file_dtype = t.dtype});
  }
  ASSERT_TRUE(WriteSafetensors(path, list).ok());
}

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::string Text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// The quant-state tensor of `weight` as JSON, and back.
json QuantState(const RawTensors& t, const std::string& weight) {
  return json::parse(Text(t.at(weight + std::string(kBnbQuantStateSuffix)).bytes));
}
void SetQuantState(RawTensors& t, const std::string& weight, const json& j) {
  RawTensor& r = t[weight + std::string(kBnbQuantStateSuffix)];
  r.bytes = Bytes(j.dump());
  r.shape = {int64_t(r.bytes.size())};
}

// A copy of the golden folder (config.json, model.safetensors) in a temporary folder, edited by
// `edit_tensors` and `edit_config` before it is written.
class EditedFolder {
 public:
  explicit EditedFolder(const std::function<void(RawTensors&)>& edit_tensors,
                        const std::function<void(json&)>& edit_config = nullptr) {
    RawTensors t = ReadRaw(GoldenDir() + "/model.safetensors");
    json config = json::parse(ReadTextFile(GoldenDir() + "/config.json"));
    if (edit_tensors) edit_tensors(t);
    if (edit_config) edit_config(config);
    WriteRaw(dir_.path() + "/model.safetensors", t);
    std::ofstream(dir_.path() + "/config.json") << config.dump(2);
  }
  const std::string& path() const { return dir_.path(); }
  Status Load() const { return LoadBnb4bitFolder(path()).status(); }

 private:
  testing::TempDir dir_;
};

// Expects `s` to be an error whose message holds every one of `parts`.
void ExpectError(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok()) << "accepted; expected an error naming " << *parts.begin();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos)
        << "error lacks '" << p << "': " << s.ToString();
  }
}

// nf4.h's dequantization, written out for the test (fp32: code[q] * absmax[block], a nested absmax
// being nested_code[q] * nested_absmax + offset).
std::vector<float> ReferenceDequant(const Nf4Host& w) {
  int64_t n = 1;
  for (int64_t d : w.shape) n *= d;
  const int64_t blocks = (n + w.block - 1) / w.block;
  std::vector<float> absmax(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    if (!w.nested()) {
      absmax[b] = w.absmax[b];
      continue;
    }
    const float scaled = w.nested_code[w.absmax_q[b]] * w.nested_absmax[b / w.nested_block];
    absmax[b] = scaled + w.nested_offset;
  }
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = w.packed[i / 2];
    const int q = i % 2 == 0 ? byte >> 4 : byte & 0xf;
    out[i] = w.code[q] * absmax[i / w.block];
  }
  return out;
}

// The golden folders: a Llama, and a GPT-2 whose Conv1D weights are quantized transposed.
constexpr const char* kGoldens[] = {"llama_bnb4", "gpt2_bnb4"};

TEST(BnbFolderTest, GoldenFoldersReadEveryWeight) {
  for (const char* golden : kGoldens) {
    SCOPED_TRACE(golden);
    const std::string dir = GoldenDir(golden);
    Result<Bnb4bitModel> m = LoadBnb4bitFolder(dir);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Bnb4bitSettings& s = m->quantized.settings;
    EXPECT_EQ(s.quant_type, "nf4");
    EXPECT_TRUE(s.double_quant);
    EXPECT_EQ(s.compute_dtype, DType::kBF16);
    EXPECT_EQ(s.quant_storage, "uint8");
    EXPECT_TRUE(s.skip_modules.empty());

    // Exactly the decoder-block projections golden.json lists, complete and double-quantized.
    const json info = GoldenJson(golden);
    ASSERT_TRUE(info.is_object() && info.contains("quantized") && info.contains("base"));
    ASSERT_EQ(m->quantized.weights.size(), info["quantized"].size());
    const RawTensors raw = ReadRaw(dir + "/model.safetensors");
    for (const json& q : info["quantized"]) {
      const std::string name = q["name"];
      SCOPED_TRACE(name);
      auto it = m->quantized.weights.find(name);
      ASSERT_NE(it, m->quantized.weights.end());
      const Nf4Host& w = it->second;
      EXPECT_EQ(w.shape, q["shape"].get<std::vector<int64_t>>());
      const int64_t numel = w.shape[0] * w.shape[1];
      const int64_t blocks = (numel + kNf4Block - 1) / kNf4Block;
      EXPECT_EQ(w.block, kNf4Block);
      EXPECT_EQ(w.packed.size(), size_t(numel / 2));
      ASSERT_EQ(w.code.size(), 16u);
      for (int i = 0; i < 16; ++i) EXPECT_EQ(w.code[i], kNf4Code[i]) << "quant_map[" << i << "]";
      EXPECT_TRUE(w.nested());
      EXPECT_TRUE(w.absmax.empty());
      EXPECT_EQ(w.absmax_q.size(), size_t(blocks));
      EXPECT_EQ(w.nested_block, kNf4NestedBlock);
      EXPECT_EQ(w.nested_absmax.size(), size_t((blocks + kNf4NestedBlock - 1) / kNf4NestedBlock));
      EXPECT_EQ(w.nested_code.size(), 256u);
      EXPECT_EQ(w.nested_offset, QuantState(raw, name)["nested_offset"].get<float>());
      // The bytes are the file's, untouched.
      EXPECT_EQ(0, std::memcmp(w.packed.data(), raw.at(name).bytes.data(), w.packed.size()));
      EXPECT_FALSE(m->weights.tensors.contains(name)) << "a quantized weight loaded as floats";
    }

    // The unquantized parameters load as from any folder: the base golden's values (f32).
    const std::string base_name = fs::path(info["base"].get<std::string>()).filename();
    Result<SafetensorsFile> base =
        SafetensorsFile::Open(GoldenPath(base_name, "model.safetensors"));
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    size_t unquantized = 0;
    for (const LayerSpec& l : m->layers) {
      for (const ParamSpec& p : l.params) {
        if (!p.tied_to.empty() || m->quantized.weights.contains(p.name)) continue;
        ++unquantized;
        ASSERT_TRUE(m->weights.tensors.contains(p.name)) << p.name;
        std::vector<float> want(size_t(p.numel()));
        ASSERT_TRUE(LoadParameter(*base, p, want).ok()) << p.name;
        EXPECT_EQ(m->weights.tensors.at(p.name), want) << p.name;
      }
    }
    EXPECT_EQ(unquantized, m->weights.tensors.size());
  }
}

TEST(BnbFolderTest, WeightsDequantizeToBitsandbytesOutputBitForBit) {
  for (const char* golden : kGoldens) {
    SCOPED_TRACE(golden);
    Result<Bnb4bitModel> m = LoadBnb4bitFolder(GoldenDir(golden));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    Result<SafetensorsFile> want = SafetensorsFile::Open(GoldenPath(golden, "dequant.safetensors"));
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_EQ(want->tensors().size(), m->quantized.weights.size());
    for (const auto& [name, w] : m->quantized.weights) {
      Result<std::vector<float>> expected = want->ReadFloats(name, &w.shape);
      ASSERT_TRUE(expected.ok()) << expected.status().ToString();
      const std::vector<float> got = ReferenceDequant(w);
      ASSERT_EQ(got.size(), expected->size()) << name;
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        differ += std::memcmp(&got[i], &(*expected)[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ, 0u) << name << ": not bit-identical to bitsandbytes' dequantize_4bit";
    }
  }
}

TEST(BnbFolderTest, AnyQuantStorageReadsTheSameBytes) {
  // bnb_4bit_quant_storage="bfloat16": the packed bytes viewed as bf16, shape (numel / 4, 1).
  const EditedFolder dir(
      [](RawTensors& t) {
        for (auto& [name, r] : t) {
          if (!t.contains(name + std::string(kBnbQuantStateSuffix))) continue;
          r.dtype = SafetensorsDType::kBF16;
          r.shape = {int64_t(r.bytes.size() / 2), 1};
        }
      },
      [](json& c) { c["quantization_config"]["bnb_4bit_quant_storage"] = "bfloat16"; });
  Result<Bnb4bitModel> got = LoadBnb4bitFolder(dir.path());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  Result<Bnb4bitModel> want = LoadBnb4bitFolder(GoldenDir());
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(got->quantized.settings.quant_storage, "bfloat16");
  ASSERT_EQ(got->quantized.weights.size(), want->quantized.weights.size());
  for (const auto& [name, w] : want->quantized.weights) {
    EXPECT_EQ(got->quantized.weights.at(name).packed, w.packed) << name;
  }
}

TEST(BnbFolderTest, TruncatedQuantStateIsRefused) {
  const EditedFolder dir([](RawTensors& t) {
    RawTensor& r = t[kQ + std::string(kBnbQuantStateSuffix)];
    r.bytes.resize(r.bytes.size() / 2);
    r.shape = {int64_t(r.bytes.size())};
  });
  ExpectError(dir.Load(), {kQ + std::string(kBnbQuantStateSuffix), "truncated"});
}

TEST(BnbFolderTest, UnparsableQuantStateIsRefused) {
  const EditedFolder dir([](RawTensors& t) {
    RawTensor& r = t[kQ + std::string(kBnbQuantStateSuffix)];
    r.bytes = Bytes("not json at all");
    r.shape = {int64_t(r.bytes.size())};
  });
  ExpectError(dir.Load(), {kQ + std::string(kBnbQuantStateSuffix), "well-formed JSON"});
}

TEST(BnbFolderTest, QuantStateMissingAFieldIsRefused) {
  const EditedFolder dir([](RawTensors& t) {
    json j = QuantState(t, kQ);
    j.erase("nested_offset");
    SetQuantState(t, kQ, j);
  });
  ExpectError(dir.Load(), {kQ + std::string(kBnbQuantStateSuffix), "'nested_offset'", "missing"});
}

TEST(BnbFolderTest, AbsmaxOfTheWrongLengthIsRefused) {
  const EditedFolder dir([](RawTensors& t) {
    RawTensor& r = t[kQ + std::string(".absmax")];
    r.bytes.pop_back();
    r.shape = {int64_t(r.bytes.size())};
  });
  ExpectError(dir.Load(), {kQ + std::string(".absmax"), "63", "expected 64"});
}

TEST(BnbFolderTest, PackedCodesOfTheWrongSizeAreRefused) {
  const EditedFolder dir([](RawTensors& t) {
    RawTensor& r = t[kQ];
    r.bytes.resize(r.bytes.size() - 2);
    r.shape = {int64_t(r.bytes.size()), 1};
  });
  ExpectError(dir.Load(), {std::string("'") + kQ + "'", "2046 bytes", "expected 2048"});
}

TEST(BnbFolderTest, BlockSize128IsRefused) {
  const EditedFolder dir([](RawTensors& t) {
    json j = QuantState(t, kQ);
    j["blocksize"] = 128;
    SetQuantState(t, kQ, j);
  });
  ExpectError(dir.Load(),
              {kQ + std::string(kBnbQuantStateSuffix), "blocksize", "128", "blocks of 64"});
}

TEST(BnbFolderTest, ShapeThatDisagreesWithConfigIsRefused) {
  // config.json says the MLP is 96 wide: gate_proj should be (96, 64), the folder's is (64, 64).
  const EditedFolder dir(nullptr, [](json& c) { c["intermediate_size"] = 96; });
  ExpectError(dir.Load(),
              {"model.layers.0.mlp.gate_proj.weight", "[64, 64]", "config.json implies [96, 64]"});
}

TEST(BnbFolderTest, Fp4IsRefusedAsNotSupportedYet) {
  // In config.json ...
  const EditedFolder config(
      nullptr, [](json& c) { c["quantization_config"]["bnb_4bit_quant_type"] = "fp4"; });
  ExpectError(config.Load(), {"bnb_4bit_quant_type", "fp4", "not supported yet"});
  // ... and in a weight's own quant state (its tensor named __fp4, as bitsandbytes writes it).
  const EditedFolder tensor([](RawTensors& t) {
    json j = QuantState(t, kQ);
    j["quant_type"] = "fp4";
    t.erase(kQ + std::string(kBnbQuantStateSuffix));
    RawTensor& r = t[kQ + std::string(".quant_state.bitsandbytes__fp4")];
    r.bytes = Bytes(j.dump());
    r.shape = {int64_t(r.bytes.size())};
  });
  ExpectError(tensor.Load(),
              {kQ + std::string(".quant_state.bitsandbytes__fp4"), "fp4", "not support"});
}

TEST(BnbFolderTest, MissingCompanionTensorsAreRefused) {
  for (const char* suffix : {".nested_quant_map", ".nested_absmax", ".quant_map", ".absmax",
                             ".quant_state.bitsandbytes__nf4"}) {
    SCOPED_TRACE(suffix);
    const EditedFolder dir([&](RawTensors& t) { t.erase(kQ + std::string(suffix)); });
    ExpectError(dir.Load(), {kQ + std::string(suffix), "lacks"});
  }
}

TEST(BnbFolderTest, InconsistentDoubleQuantizationIsRefused) {
  // Nested tensors without nested fields in the quant state.
  const EditedFolder fields([](RawTensors& t) {
    json j = QuantState(t, kQ);
    for (const char* k : {"nested_blocksize", "nested_dtype", "nested_offset"}) j.erase(k);
    SetQuantState(t, kQ, j);
  });
  ExpectError(fields.Load(), {kQ + std::string(kBnbQuantStateSuffix), "inconsistent"});
  // config.json's bnb_4bit_use_double_quant against the weights.
  const EditedFolder config(
      nullptr, [](json& c) { c["quantization_config"]["bnb_4bit_use_double_quant"] = false; });
  ExpectError(config.Load(), {"bnb_4bit_use_double_quant", "is double-quantized"});
}

TEST(BnbFolderTest, QuantizationConfigIsParsed) {
  Result<std::optional<Bnb4bitSettings>> none = ParseBnb4bitSettings(R"({"model_type": "llama"})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  Result<std::optional<Bnb4bitSettings>> s = ParseBnb4bitSettings(R"({"quantization_config": {
      "quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_compute_dtype": "float16", "bnb_4bit_quant_storage": "bfloat16",
      "llm_int8_skip_modules": ["lm_head", "mlp.down_proj"]}})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->has_value());
  EXPECT_FALSE((*s)->double_quant);
  EXPECT_EQ((*s)->compute_dtype, DType::kF16);
  EXPECT_EQ((*s)->quant_storage, "bfloat16");
  EXPECT_EQ((*s)->skip_modules, (std::vector<std::string>{"lm_head", "mlp.down_proj"}));

  const std::pair<const char*, const char*> bad[] = {
      {R"({"quant_method": "gptq", "bits": 4})", R"("gptq" is not supported)"},
      {R"({"quant_method": "bitsandbytes", "load_in_8bit": true})", "8-bit"},
      {R"({"quant_method": "bitsandbytes", "load_in_4bit": false})", "load_in_4bit"},
      // transformers' default quant type is fp4.
      {R"({"quant_method": "bitsandbytes", "load_in_4bit": true})", "not supported yet"},
      {R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_compute_dtype": "int8"})",
       "bnb_4bit_compute_dtype"},
      {R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_use_double_quant": "yes"})",
       "bnb_4bit_use_double_quant"},
  };
  for (const auto& [q, want] : bad) {
    SCOPED_TRACE(q);
    Result<std::optional<Bnb4bitSettings>> r =
        ParseBnb4bitSettings(std::string(R"({"quantization_config": )") + q + "}");
    ExpectError(r.status(), {"quantization_config", want});
  }
}

// Every reader takes a pre-quantized folder (LoadModelFolder's NF4 base: nf4_inference_test.cc);
// reading its quantized tensors as floats (a config.json without its quantization_config) is one
// error naming the tensor and what is missing.
TEST(BnbFolderTest, EveryReaderTakesAPreQuantizedFolder) {
  Result<LoadedModel> m = LoadModelFolder(GoldenDir());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->lora.quantize, BaseQuant::kNf4);

  Result<FolderWeights> folder = FolderWeights::Open(GoldenDir());
  ASSERT_TRUE(folder.ok());
  Result<ModelConfig> c = LoadHfConfig(GoldenDir() + "/config.json");
  ASSERT_TRUE(c.ok());
  HostTensors w;
  Status base = LoadBaseWeights(*folder, *c, BuildLayerSpecs(*c, LoraConfig{}), w);
  EXPECT_EQ(base.code(), StatusCode::kFailedPrecondition) << base.ToString();
  ExpectError(base, {GoldenDir(), "quantized by bitsandbytes", "quantization_config"});

  for (ModelUse use : {ModelUse::kConfigOnly, ModelUse::kTrain, ModelUse::kInference}) {
    Result<ModelSource> s = ResolveModelSource(GoldenDir(), "", use);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(s->bnb4bit.has_value());
    EXPECT_TRUE(s->bnb4bit->double_quant);
  }
  Result<ModelSource> plain =
      ResolveModelSource(fs::path(GoldenPath("llama", "x")).parent_path(), "", ModelUse::kTrain);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->bnb4bit.has_value());
}

}  // namespace
}  // namespace ferry
