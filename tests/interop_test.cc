// Interop: ferry's logits for the tiny models of engine/testing/tiny_models.h (deterministic
// weights) against the logits transformers and peft computed for the very same model folders and
// adapters that ferry wrote (tests/goldens/interop/, written by scripts/interop_check.py). The
// script proves transformers/peft load ferry's files; this test keeps ferry's side of that
// comparison checked in CI without torch.
#include <gtest/gtest.h>

#include "engine/model/safetensors.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/tiny_models.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

// Both sides compute in fp32 from identical fp32 weights, in different summation orders (and
// transformers' eager softmax vs ferry's online softmax). The tiny models' logits are O(1) (at most
// 1.9) and their dot products at most 256 long, each carrying ~sqrt(K) eps = 16 eps of relative
// rounding; two blocks and the head compose a few of those: atol 32 eps (3.8e-6), rtol 8 eps.
// Measured worst: 5.7e-7 (mistral), i.e. 5 eps (golden.json: max_abs_diff per model).
constexpr float kAtol = 32 * DTypeEpsilon(DType::kF32);
constexpr float kRtol = 8 * DTypeEpsilon(DType::kF32);

class InteropTest : public ::testing::TestWithParam<testing::TinyModel> {};

TEST_P(InteropTest, LogitsMatchTransformersAndPeft) {
  const testing::TinyModel& m = GetParam();
  const std::string path = testing::GoldenPath("interop", std::string(m.name) + ".safetensors");
  Result<SafetensorsFile> golden = SafetensorsFile::Open(path);
  ASSERT_TRUE(golden.ok()) << golden.status().ToString()
                           << " (run scripts/interop_check.py to write it)";
  Result<std::vector<int64_t>> tokens = golden->ReadInts("tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(std::vector<int32_t>(tokens->begin(), tokens->end()), testing::TinyTokens());
  Result<ModelConfig> c = ParseHfConfig(m.config_json);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const LoraConfig lora = testing::TinyLora();
  const HostTensors w = testing::TinyWeights(BuildLayerSpecs(*c, lora), 2026);
  for (const auto& [tensor, adapter] :
       {std::pair{"logits", LoraConfig{}}, std::pair{"lora_logits", lora}}) {
    Result<std::vector<float>> want = golden->ReadFloats(tensor);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    Result<std::vector<float>> got = testing::TinyLogits(*c, adapter, w, testing::TinyTokens());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    testing::ExpectClose(*got, *want, kAtol, kRtol, std::string(m.name) + " " + tensor);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, InteropTest, ::testing::ValuesIn(testing::kTinyModels),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry
