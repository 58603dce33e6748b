// The pre-quantized golden folders read by LoadBnb4bitFolder and dequantized by kernels/nf4.cc's
// DequantizeNf4 give bitsandbytes' own dequantize_4bit output (tests/goldens/{llama,gpt2}_bnb4/
// dequant.safetensors) bit for bit in f32, and that rounded once in bf16 and f16.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/model/bnb_folder.h"
#include "engine/testing/golden_files.h"
#include "kernels/nf4.h"

namespace ferry {
namespace {

TEST(BnbDequantTest, GoldenFoldersDequantizeToBitsandbytesBitForBit) {
  for (const char* golden : {"llama_bnb4", "gpt2_bnb4"}) {
    SCOPED_TRACE(golden);
    const std::string dir = testing::SourceDir() + "/tests/goldens/" + golden;
    Result<Bnb4bitModel> m = LoadBnb4bitFolder(dir);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    Result<SafetensorsFile> want = SafetensorsFile::Open(dir + "/dequant.safetensors");
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_EQ(want->tensors().size(), m->quantized.weights.size());
    for (const auto& [name, w] : m->quantized.weights) {
      SCOPED_TRACE(name);
      const Status valid = ValidateNf4(w, name);
      ASSERT_TRUE(valid.ok()) << valid.ToString();
      Result<std::vector<float>> expected = want->ReadFloats(name, &w.shape);
      ASSERT_TRUE(expected.ok()) << expected.status().ToString();
      std::vector<float> got(expected->size());
      DequantizeNf4(w, DType::kF32, got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), expected->data(), got.size() * sizeof(float)))
          << "f32 differs from bitsandbytes' dequantize_4bit";
      // bf16 and f16: the f32 value rounded once.
      for (DType t : {DType::kBF16, DType::kF16}) {
        std::vector<uint16_t> narrow(got.size()), rounded(got.size());
        DequantizeNf4(w, t, narrow.data());
        ConvertFromFloat(expected->data(), t, rounded.data(), rounded.size());
        EXPECT_EQ(narrow, rounded) << DTypeName(t);
      }
    }
  }
}

}  // namespace
}  // namespace ferry
