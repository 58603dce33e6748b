// The family descriptions and their derived views: PEFT's module names and target matching, fused
// projections in the parameter specs, and the block buffers' bytes against what the blocks
// themselves allocate.
#include "engine/model/model_stack.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/model/head.h"
#include "engine/testing/golden_files.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/device.h"

namespace ferry {
namespace {

ModelConfig Config(const char* dir) {
  Result<ModelConfig> c = LoadHfConfig(testing::GoldenPath(dir, "config.json"));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

// The bytes `requester` asked the arena of `d` for (0 when it asked nothing).
size_t Requested(const Device& d, std::string_view requester) {
  for (const ArenaRecord& r : d.arena_log()) {
    if (r.requester == requester) return r.bytes;
  }
  return 0;
}

TEST(ModelStackTest, PeftNamesAreTheShortestSuffixNoOtherProjectionShares) {
  const ModelConfig llama = Config("llama"), gpt2 = Config("gpt2");
  EXPECT_EQ(PeftTargetModules(llama, kLoraQ | kLoraV),
            (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(PeftTargetModules(llama, kLoraAll),
            (std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                      "up_proj", "v_proj"}));
  // GPT-2: q, k and v share c_attn; its two c_proj are told apart by their parent.
  EXPECT_EQ(PeftTargetModules(gpt2, kLoraK), (std::vector<std::string>{"c_attn"}));
  EXPECT_EQ(PeftTargetModules(gpt2, kLoraO | kLoraDown),
            (std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}));
  EXPECT_FALSE(PeftFanInFanOut(llama));
  EXPECT_TRUE(PeftFanInFanOut(gpt2));
}

TEST(ModelStackTest, PeftTargetsArePathSuffixesOfBlockProjections) {
  const ModelConfig llama = Config("llama"), gpt2 = Config("gpt2");
  struct Case {
    const ModelConfig* c;
    const char* target;
    uint32_t bits;  // 0: refused
  };
  for (const Case& t : std::vector<Case>{
           {&llama, "q_proj", kLoraQ},
           {&llama, "self_attn.q_proj", kLoraQ},
           {&llama, "model.layers.0.mlp.gate_proj", kLoraGate},
           {&llama, "q", 0},        // not a module name
           {&llama, "proj", 0},     // a part of a name, not a path suffix
           {&llama, "lm_head", 0},  // not a block projection
           {&gpt2, "c_attn", kLoraQ | kLoraK | kLoraV},
           {&gpt2, "c_proj", kLoraO | kLoraDown},
           {&gpt2, "attn.c_proj", kLoraO},
           {&gpt2, "transformer.h.3.mlp.c_proj", kLoraDown},
           {&gpt2, "q_proj", 0},
       }) {
    Result<uint32_t> bits = PeftTargetBits(*t.c, t.target);
    if (t.bits == 0) {
      ASSERT_FALSE(bits.ok()) << t.target;
      EXPECT_NE(bits.status().message().find(t.target), std::string::npos);
    } else {
      ASSERT_TRUE(bits.ok()) << t.target << ": " << bits.status().ToString();
      EXPECT_EQ(*bits, t.bits) << t.target;
    }
  }
}

// BlockBuffersOf counts the very layouts the blocks carve: built on a CPU device, the blocks'
// saved slot and workspace take exactly those bytes (with and without LoRA, gate and up adapted
// together, and GPT-2's fused c_attn).
TEST(ModelStackTest, BlockBuffersEqualWhatTheBlocksAllocate) {
  struct Case {
    const char* dir;
    LoraConfig lora;
  };
  for (const Case& t : std::vector<Case>{
           {"llama", {}},
           {"llama", {.rank = 4, .alpha = 8, .targets = kLoraQ | kLoraGate | kLoraUp}},
           {"qwen3", {}},
           {"gpt2", {}},
           {"gpt2", {.rank = 2, .alpha = 4, .targets = kLoraQ | kLoraDown}},
       }) {
    SCOPED_TRACE(t.dir);
    const ModelConfig c = Config(t.dir);
    const BatchShape shape{.batch = 2, .seq_len = 7};
    const std::vector<LayerSpec> all = BuildLayerSpecs(c, t.lora);
    const std::vector<LayerSpec> layers = {all[1]};  // block 0
    Result<std::unique_ptr<CpuDevice>> device =
        CpuDevice::Create({.memory_bytes = size_t(64) << 20});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    CpuDevice& d = **device;
    Result<DeviceParams> params = DeviceParams::Create(d, c, t.lora, layers);
    ASSERT_TRUE(params.ok()) << params.status().ToString();
    Result<std::unique_ptr<DecoderBlocks>> blocks =
        CreateDecoderBlocks(MakeBlocksContext(d, c, *params, shape, {}));
    ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
    const BlockBufferBytes b = BlockBuffersOf(c, layers[0], shape.tokens(), DType::kF32);
    EXPECT_EQ(Requested(d, "blocks.saved.0"), b.saved);
    EXPECT_EQ(Requested(d, "blocks.workspace"), b.workspace);
    // The saved set's own bytes, counted by hand from the blocks' list of saved tensors: fp32
    // activations and statistics, and x A^T (N, r) per adapted projection.
    const int64_t N = shape.tokens(), C = c.hidden_size, I = c.intermediate_size;
    const int64_t H = c.num_heads, Hkv = c.num_kv_heads, q = c.q_dim(), kv = c.kv_dim();
    int64_t values = c.family == ModelFamily::kGpt2
                         ? N * (7 * C + 2 * I) + N * (4 + H)
                         : N * (3 * C + 2 * q + 2 * kv + 3 * I) + N * (2 + H);
    if (c.qk_norm) values += N * (q + kv) + N * (H + Hkv);
    for (LoraTarget bit : {kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown}) {
      // GPT-2's c_attn is one projection for q, k and v.
      const bool fused_qkv = c.family == ModelFamily::kGpt2 && (bit == kLoraK || bit == kLoraV);
      if (t.lora.Targets(bit) && !fused_qkv) values += N * t.lora.rank;
    }
    EXPECT_EQ(b.saved_unaligned, size_t(values) * sizeof(float));
    EXPECT_LT(b.saved_unaligned, b.saved);
  }
}

// HeadBuffersOf counts the head's layouts: the bytes Head::Create takes for its saved set and
// workspace, training and loss-only, RMSNorm and LayerNorm; the saved set's own bytes by hand.
TEST(ModelStackTest, HeadBuffersEqualWhatTheHeadAllocates) {
  for (const char* dir : {"llama", "gpt2"}) {
    for (HeadMode mode : {HeadMode::kTrain, HeadMode::kForwardOnly}) {
      SCOPED_TRACE(std::string(dir) + (mode == HeadMode::kTrain ? " train" : " forward-only"));
      const ModelConfig c = Config(dir);
      const BatchShape shape{.batch = 3, .seq_len = 5};
      const std::vector<LayerSpec> all = BuildLayerSpecs(c, {});
      const std::vector<LayerSpec> layers = {all.back()};
      Result<std::unique_ptr<CpuDevice>> device =
          CpuDevice::Create({.memory_bytes = size_t(64) << 20});
      ASSERT_TRUE(device.ok()) << device.status().ToString();
      CpuDevice& d = **device;
      Result<DeviceParams> params = DeviceParams::Create(d, c, {}, layers);
      ASSERT_TRUE(params.ok()) << params.status().ToString();
      Result<std::unique_ptr<Head>> head = Head::Create(d, c, *params, shape, 4, mode);
      ASSERT_TRUE(head.ok()) << head.status().ToString();
      const HeadBufferBytes b = HeadBuffersOf(c, shape.tokens(), DType::kF32, mode);
      EXPECT_EQ(Requested(d, "head.saved"), b.saved);
      EXPECT_EQ(Requested(d, "head.workspace"), b.workspace);
      const int64_t N = shape.tokens(), stats = c.norm == NormKind::kLayerNorm ? 2 : 1;
      EXPECT_EQ(b.saved_unaligned, size_t(N * c.hidden_size + N * (stats + 1)) * sizeof(float));
    }
  }
}

// A fused projection is the family's word (BlockLinear::fused), carried by every parameter of its
// parts: Llama's gate_proj (part 0) and up_proj (part 1) of "mlp.gate_up_proj", weight, bias and
// LoRA A/B alike, and one LoRA group for both; GPT-2 fuses nothing.
TEST(ModelStackTest, FusedProjectionsComeFromTheFamilyAndReachEveryPartsParameter) {
  ModelConfig llama = Config("llama");
  llama.mlp_bias = true;
  const LoraConfig lora{.rank = 4, .targets = kLoraAll};
  const LayerSpec block = BuildLayerSpecs(llama, lora)[1];
  const std::string fused = BlockPrefix(llama, 0) + "mlp.gate_up_proj";
  int parts[2] = {0, 0};
  for (const ParamSpec& p : block.params) {
    SCOPED_TRACE(p.name);
    const bool gate = p.name.find(".mlp.gate_proj.") != std::string::npos;
    const bool up = p.name.find(".mlp.up_proj.") != std::string::npos;
    EXPECT_EQ(p.fused_module, gate || up ? fused : "");
    EXPECT_EQ(p.fused_part, up ? 1 : 0);
    EXPECT_EQ(p.fused_parts, gate || up ? 2 : 1);
    if (gate || up) ++parts[up ? 1 : 0];
    if (p.lora && (gate || up)) {
      EXPECT_EQ(LoraGroupOf(p), fused);
    }
  }
  EXPECT_EQ(parts[0], 4);  // weight, bias, lora_A, lora_B
  EXPECT_EQ(parts[1], 4);
  EXPECT_EQ(LoraGroupRanks(block).size(), 6u);  // q, k, v, o, gate+up, down

  const LayerSpec gpt2 = BuildLayerSpecs(Config("gpt2"), lora)[1];
  for (const ParamSpec& p : gpt2.params) EXPECT_TRUE(p.fused_module.empty()) << p.name;
}

}  // namespace
}  // namespace ferry
