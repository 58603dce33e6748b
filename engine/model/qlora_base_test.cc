// The llama_qlora golden's base (tests/goldens/llama_qlora/base_nf4.safetensors: bitsandbytes'
// Linear4bit on the CPU over the llama golden's fp32 weights) against ferry's own quantization of
// the same weights as QuantizeFrozenBase does it (kernels/nf4.h, bitsandbytes' CPU rounding, the
// nearest code): the packed codes, the 8-bit absmax codes, the nested absmax, code tables and
// offset, and the dequantized weight, bit for bit. The trainer and runner golden tests then check
// the logits, gradients and five steps of a QLoRA job on that base (llama_qlora).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/model/master_weights.h"
#include "engine/model/weights_io.h"
#include "engine/testing/golden_model.h"
#include "engine/testing/runner_fixture.h"

namespace ferry {
namespace {

template <typename T>
std::vector<T> Raw(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensorInfo* info = f.Find(name);
  EXPECT_NE(info, nullptr) << name;
  if (info == nullptr) return {};
  const std::span<const std::byte> d = f.Data(*info);
  std::vector<T> out(d.size() / sizeof(T));
  std::memcpy(out.data(), d.data(), out.size() * sizeof(T));
  return out;
}

TEST(QloraBaseGoldenTest, FerryQuantizesTheBaseAsBitsandbytesDid) {
  Result<testing::GoldenModel> g = testing::GoldenModel::Load("llama_qlora");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Result<SafetensorsFile> want =
      SafetensorsFile::Open(testing::GoldenPath("llama_qlora", "base_nf4.safetensors"));
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  const LoraConfig lora = testing::GoldenLora(*g);
  ASSERT_EQ(lora.quantize, BaseQuant::kNf4);
  ASSERT_TRUE(lora.double_quant);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(g->config, lora);
  HostTensors w;
  int quantized = 0;
  for (const ParamSpec* p : StorageParams(layers)) {
    if (p->lora) continue;
    std::vector<float>& t = w.tensors[p->name];
    t.resize(size_t(p->numel()));
    ASSERT_TRUE(LoadParameter(g->weights, *p, t).ok()) << p->name;
    quantized += p->nf4 ? 1 : 0;
  }
  EXPECT_EQ(quantized, 7 * g->config.num_layers);
  ASSERT_TRUE(QuantizeFrozenBase(layers, w, testing::kNf4GoldenRounding).ok());
  EXPECT_EQ(w.nf4.size(), size_t(quantized));
  int offsets_apart = 0;
  for (auto& [name, q] : w.nf4) {
    SCOPED_TRACE(name);
    EXPECT_EQ(w.tensors.count(name), 0u) << "the fp32 copy stays";
    // bitsandbytes' nested offset is torch's fp32 mean of absmax, summed in an order that depends
    // on the CPU's vector width; ferry's is the exact mean rounded once (kernels/nf4.h). They may
    // be an ulp apart: within one ulp, and then nested again around bitsandbytes' own offset,
    // everything else must be bit for bit.
    const float offset = Raw<float>(*want, name + ".nested_offset").at(0);
    EXPECT_LE(std::abs(q.nested_offset - offset), std::abs(offset) * DTypeEpsilon(DType::kF32) * 2);
    if (q.nested_offset != offset) {
      ++offsets_apart;
      q.absmax = Nf4Absmax(q);
      q.absmax_q.clear();
      q.nested_absmax.clear();
      q.nested_code.clear();
      ASSERT_TRUE(NestNf4Absmax(&q, offset, testing::kNf4GoldenRounding).ok());
    }
    EXPECT_EQ(q.packed, Raw<uint8_t>(*want, name + ".packed"));
    EXPECT_EQ(q.absmax_q, Raw<uint8_t>(*want, name + ".absmax_q"));
    EXPECT_EQ(q.nested_absmax, Raw<float>(*want, name + ".nested_absmax"));
    EXPECT_EQ(q.nested_code, Raw<float>(*want, name + ".nested_code"));
    EXPECT_EQ(q.code, Raw<float>(*want, name + ".code"));
    std::vector<float> got(size_t(q.numel()));
    DequantizeNf4(q, DType::kF32, got.data());
    const std::vector<float> dq = Raw<float>(*want, name + ".dequantized");
    ASSERT_EQ(got.size(), dq.size());
    EXPECT_EQ(0, std::memcmp(got.data(), dq.data(), got.size() * sizeof(float)));
  }
  std::printf("[ llama_qlora ] %d of %zu nested offsets an ulp from torch's fp32 mean\n",
              offsets_apart, w.nf4.size());
}

}  // namespace
}  // namespace ferry
