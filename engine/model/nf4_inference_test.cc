// Inference over an NF4 base (what `ferry eval` and `ferry generate` run): LoadModelFolder reads a
// folder pre-quantized by transformers + bitsandbytes (tests/goldens/llama_bnb4/) into NF4 weights
// with no fp32 copy, with or without a PEFT adapter on top, and quantizes an unquantized folder on
// load when asked. (The Generator's and the reference runner's logits over the pre-quantized folder
// against transformers': qlora_folder_test.cc.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/job/model_source.h"
#include "engine/json.h"
#include "engine/model/bnb_folder.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/model/model_stack.h"
#include "engine/testing/golden_files.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

std::string Bnb4Dir() { return testing::SourceDir() + "/tests/goldens/llama_bnb4"; }

// The NF4 weight `name` of `w`, made from its file (HostTensors::nf4_served).
Nf4Host Made(const HostTensors& w, const std::string& name) {
  Nf4Host made;
  Result<const Nf4Host*> q = w.FindNf4(name, made);
  EXPECT_TRUE(q.ok() && *q != nullptr)
      << name << ": " << (q.ok() ? "absent" : q.status().ToString());
  return q.ok() && *q != nullptr ? **q : Nf4Host{};
}

// Every NF4 parameter of `m` is served from the folder (weights.nf4_served: made when packed,
// never held) and nowhere else; every other storage-owning parameter is an fp32 tensor, or
// served from its file when frozen.
void ExpectNf4Base(const LoadedModel& m) {
  size_t nf4 = 0;
  for (const ParamSpec* p : StorageParams(m.layers)) {
    if (p->nf4) {
      ++nf4;
      EXPECT_TRUE(m.weights.nf4_served.contains(p->name)) << p->name;
      EXPECT_FALSE(m.weights.nf4.contains(p->name)) << p->name << " is held in RAM";
      EXPECT_FALSE(m.weights.tensors.contains(p->name)) << p->name << " has an fp32 copy";
      EXPECT_EQ(Made(m.weights, p->name).numel(), p->numel()) << p->name;
    } else {
      EXPECT_TRUE(p->trainable ? m.weights.tensors.contains(p->name)
                               : m.weights.files.contains(p->name))
          << p->name;
      EXPECT_EQ(m.weights.numel(p->name), p->numel()) << p->name;
    }
  }
  EXPECT_EQ(nf4, size_t(7 * m.config.num_layers));  // q, k, v, o, gate, up, down
  EXPECT_EQ(m.weights.nf4_served.size(), nf4);
}

TEST(Nf4InferenceTest, APreQuantizedFolderLoadsAsItsNf4Weights) {
  Result<LoadedModel> m = LoadModelFolder(Bnb4Dir());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->lora.enabled());
  EXPECT_EQ(m->lora.quantize, BaseQuant::kNf4);
  EXPECT_TRUE(m->lora.double_quant);  // the folder's bnb_4bit_use_double_quant
  ExpectNf4Base(*m);
  for (const ParamSpec* p : StorageParams(m->layers)) EXPECT_FALSE(p->trainable) << p->name;
  // As stored: the same bytes the folder reader gives, not a requantization.
  Result<Bnb4bitModel> stored = LoadBnb4bitFolder(Bnb4Dir());
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  for (const auto& [name, q] : stored->quantized.weights) {
    const Nf4Host got = Made(m->weights, name);
    EXPECT_EQ(got.packed, q.packed) << name;
    EXPECT_EQ(got.absmax_q, q.absmax_q) << name;
    EXPECT_EQ(got.nested_absmax, q.nested_absmax) << name;
  }

  // A PEFT adapter goes on top (llama_qlora's: same shapes, rank 4); the base stays NF4.
  const std::string adapter = testing::SourceDir() + "/tests/goldens/llama_qlora";
  Result<LoadedModel> with = LoadModelFolder(Bnb4Dir(), adapter);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->lora.rank, 4);
  EXPECT_EQ(with->lora.quantize, BaseQuant::kNf4);
  ExpectNf4Base(*with);
  EXPECT_TRUE(with->weights.tensors.contains(
      "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
}

// An unquantized folder with --quantize nf4: the base's block projections quantized when packed
// as training quantizes them (QuantizeFrozenBase), nothing held.
TEST(Nf4InferenceTest, AnUnquantizedFolderIsQuantizedOnLoadWhenAsked) {
  const std::string dir = testing::SourceDir() + "/tests/goldens/llama";
  Result<LoadedModel> m = LoadModelFolder(dir, "", BaseQuant::kNf4);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->lora.quantize, BaseQuant::kNf4);
  ExpectNf4Base(*m);
  Result<LoadedModel> plain = LoadModelFolder(dir);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->weights.nf4.empty());
  std::vector<LayerSpec> layers = BuildLayerSpecs(plain->config, m->lora);
  ASSERT_TRUE(QuantizeFrozenBase(layers, plain->weights).ok());
  for (const auto& [name, q] : plain->weights.nf4) {
    EXPECT_EQ(Made(m->weights, name).packed, q.packed) << name;
    EXPECT_EQ(Made(m->weights, name).absmax_q, q.absmax_q) << name;
  }
}

// Training refuses a quantized base without LoRA (nothing would train); a model to run takes it.
TEST(Nf4InferenceTest, AQuantizedBaseWithoutLoraIsForInferenceOnly) {
  const LoraConfig run{.rank = 0, .quantize = BaseQuant::kNf4};
  EXPECT_TRUE(ValidateLoraConfig(run).ok());
  const Status train = ValidateTrainingLora(run);
  ASSERT_FALSE(train.ok());
  EXPECT_NE(train.message().find("--lora-rank"), std::string::npos) << train.ToString();
  EXPECT_TRUE(ValidateTrainingLora({.rank = 4, .quantize = BaseQuant::kNf4}).ok());
}

// The family table says which families hold NF4 projections; training's validation asks it.
TEST(Nf4InferenceTest, OnlyTheLlamaFamilyHoldsNf4Projections) {
  ModelConfig gpt2 = TinyLlamaPreset();
  gpt2.family = ModelFamily::kGpt2;
  EXPECT_TRUE(CheckBaseQuant(TinyLlamaPreset(), BaseQuant::kNf4).ok());
  EXPECT_TRUE(CheckBaseQuant(gpt2, BaseQuant::kNone).ok());
  const Status refused = CheckBaseQuant(gpt2, BaseQuant::kNf4);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("GPT-2"), std::string::npos) << refused.ToString();
  EXPECT_EQ(Nf4ModelTypes(), "llama, mistral, qwen2 and qwen3");
  EXPECT_NE(refused.message().find("of llama, mistral, qwen2 and qwen3 models only"),
            std::string::npos)
      << refused.ToString();
  JobSpec job;
  job.lora = {.rank = 4, .quantize = BaseQuant::kNf4};
  EXPECT_TRUE(ValidateJobSpec(job, TinyLlamaPreset()).ok());
  const Status train = ValidateJobSpec(job, gpt2);
  ASSERT_FALSE(train.ok());
  EXPECT_NE(train.message().find("GPT-2"), std::string::npos) << train.ToString();
  EXPECT_NE(train.message().find("drop --quantize"), std::string::npos) << train.ToString();
}

// A QLoRA run folder of a plain base (adapter + job.json saying "quantize": "nf4", the base found
// through job.json's "model"): inference holds the base in NF4, as the adapter was trained, and
// without --quantize, nested as job.json's "double_quant" says (absent: nested, the default) and
// not as inference's --[no-]double-quant does; a LoRA run over a plain base keeps it fp32.
TEST(Nf4InferenceTest, AQloraRunFolderRunsOverAnNf4Base) {
  struct Case {
    const char* quantize;
    std::optional<bool> double_quant;  // job.json's; nullopt: not written
  };
  for (const Case c : {Case{"nf4", std::nullopt}, Case{"nf4", false}, Case{"nf4", true},
                       Case{"none", std::nullopt}}) {
    const char* quantize = c.quantize;
    const bool nested = c.double_quant.value_or(true);
    SCOPED_TRACE(std::string(quantize) + " double_quant " +
                 (c.double_quant ? (*c.double_quant ? "true" : "false") : "absent"));
    testing::TempDir run;
    ASSERT_FALSE(run.path().empty());
    const std::string adapter = testing::SourceDir() + "/tests/goldens/llama_qlora";
    for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) {
      std::filesystem::copy_file(adapter + "/" + f, run.path() + "/" + f);
    }
    std::filesystem::copy_file(testing::SourceDir() + "/tests/goldens/llama/config.json",
                               run.path() + "/config.json");
    nlohmann::json job{{"model", testing::SourceDir() + "/tests/goldens/llama"},
                       {"quantize", quantize}};
    if (c.double_quant) job["double_quant"] = *c.double_quant;
    std::ofstream(run.path() + "/job.json") << job.dump();
    // (The tiny golden has no tokenizer, so LoadInferenceModel stops there; the model part is
    // what it loads before: ResolveModelSource, then LoadModelFolder with the run's storage.)
    Result<ModelSource> s = ResolveModelSource(run.path(), "", ModelUse::kInference);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const bool nf4 = std::string(quantize) == "nf4";
    EXPECT_EQ(s->run_quantize, nf4 ? BaseQuant::kNf4 : BaseQuant::kNone);
    // Whatever inference's own flags say (--no-double-quant here, --quantize none when nested).
    const LoraConfig base = InferenceBaseStorage(*s, BaseQuant::kNone, !nested);
    EXPECT_EQ(base.quantize, s->run_quantize);
    if (nf4) {
      EXPECT_EQ(base.double_quant, nested);
    }
    Result<LoadedModel> lm =
        LoadModelFolder(s->weights_dir, s->adapter_dir, base.quantize, base.double_quant);
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    EXPECT_TRUE(lm->lora.enabled());
    if (nf4) {
      ExpectNf4Base(*lm);
      EXPECT_EQ(lm->lora.double_quant, nested);
      for (const auto& [name, q] : lm->weights.nf4_served) {
        EXPECT_EQ(Made(lm->weights, name).nested(), nested) << name;
      }
    } else {
      EXPECT_TRUE(lm->weights.nf4.empty());
      EXPECT_TRUE(lm->weights.nf4_served.empty());
    }
  }
}

}  // namespace
}  // namespace ferry
