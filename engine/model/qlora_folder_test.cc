// QLoRA from a folder pre-quantized by transformers + bitsandbytes (tests/goldens/llama_bnb4/):
// the job adopts the folder's NF4 base (AdoptPreQuantizedBase), InitialWeights takes its NF4
// weights as they are (no fp32 copy, no requantization), and ferry's forward over them gives the
// logits transformers computed for that folder; a full fine-tune of it is refused naming what to
// give. Inference over it (LoadModelFolder, the reference runner and the Generator) gives them too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/exec/planned_generator.h"
#include "engine/job/job_spec.h"
#include "engine/model/bnb_folder.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/model/model_runner.h"
#include "engine/model/weights_io.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/reference_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

std::string Bnb4Dir() { return testing::SourceDir() + "/tests/goldens/llama_bnb4"; }

TEST(QloraFolderTest, AJobOnAPreQuantizedFolderAdoptsItsBase) {
  JobSpec job;
  job.model = Bnb4Dir();
  job.lora.rank = 4;
  job.lora.double_quant = false;  // the folder's setting wins
  ASSERT_TRUE(AdoptPreQuantizedBase(job).ok());
  EXPECT_EQ(job.lora.quantize, BaseQuant::kNf4);
  EXPECT_TRUE(job.lora.double_quant);

  JobSpec full;
  full.model = Bnb4Dir();
  const Status s = AdoptPreQuantizedBase(full);
  ASSERT_FALSE(s.ok());
  for (const char* part : {"pre-quantized", "--lora-rank"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString();
  }
  JobSpec plain;
  plain.model = testing::SourceDir() + "/tests/goldens/llama";
  plain.lora.rank = 4;
  ASSERT_TRUE(AdoptPreQuantizedBase(plain).ok());
  EXPECT_EQ(plain.lora.quantize, BaseQuant::kNone);
}

// --quantize nf4 over an ordinary (fp32) folder: InitialWeights serves each block projection from
// the file, quantized when packed (no fp32 or NF4 copy stays), the same NF4 weight QuantizeNf4
// gives for the fp32 values, at every making.
TEST(QloraFolderTest, AnUnquantizedFolderIsQuantizedAsItLoads) {
  const std::string dir = testing::SourceDir() + "/tests/goldens/llama";
  Result<ModelConfig> c = LoadHfConfig(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  LoraConfig lora{.rank = 4, .alpha = 8, .targets = kLoraAll, .quantize = BaseQuant::kNf4};
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, lora);
  Result<HostTensors> w = InitialWeights(dir, *c, layers, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->nf4_served.size(), size_t(7 * c->num_layers));
  EXPECT_TRUE(w->nf4.empty());
  Result<SafetensorsFile> f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.nf4) continue;
      EXPECT_EQ(w->tensors.count(p.name), 0u) << p.name;
      std::vector<float> fp32(size_t(p.numel()));
      ASSERT_TRUE(LoadParameter(*f, p, fp32).ok()) << p.name;
      Result<Nf4Host> want = QuantizeNf4(fp32, MasterShape(p), /*nested=*/true);
      ASSERT_TRUE(want.ok());
      for (int making = 0; making < 2; ++making) {
        Nf4Host made;
        Result<const Nf4Host*> got = w->FindNf4(p.name, made);
        ASSERT_TRUE(got.ok() && *got != nullptr) << p.name;
        EXPECT_EQ((*got)->packed, want->packed) << p.name;
        EXPECT_EQ((*got)->absmax_q, want->absmax_q) << p.name;
        EXPECT_EQ((*got)->nested_absmax, want->nested_absmax) << p.name;
        EXPECT_EQ((*got)->nested_offset, want->nested_offset) << p.name;
      }
    }
  }
}

// transformers' input ids and logits for the folder (io.safetensors): (batch, seq) and
// (batch, seq, vocab).
struct TransformersIo {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> ids;
  std::vector<float> logits;
};
void ReadTransformersIo(TransformersIo* io) {
  Result<SafetensorsFile> f = SafetensorsFile::Open(Bnb4Dir() + "/io.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<std::vector<int64_t>> ids = f->ReadInts("input_ids");
  Result<std::vector<float>> want = f->ReadFloats("logits");
  ASSERT_TRUE(ids.ok() && want.ok());
  const SafetensorsTensorInfo* shape = f->Find("input_ids");
  ASSERT_NE(shape, nullptr);
  io->batch = shape->shape[0];
  io->seq = shape->shape[1];
  io->ids.assign(ids->begin(), ids->end());
  io->logits = *want;
}

// transformers ran the folder's Linear4bit layers with bnb_4bit_compute_dtype bfloat16 (the input
// and the dequantized weight rounded to bf16, the product accumulated in fp32), ferry in fp32: each
// projection's output differs by about a bf16 rounding of its inputs (2^-9 relative), through two
// blocks and the head (measured: 0.0107 of 2.32). The bound, 8 bf16 epsilons of the largest logit,
// holds that with margin; a wrong weight, block or nibble order moves logits by O(1).
void ExpectTransformersLogits(const std::vector<float>& got, const std::vector<float>& want,
                              const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float mag = 0, worst = 0;
  for (float v : want) mag = std::max(mag, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  std::printf("[ llama_bnb4 %s ] largest logit difference %.3g of max |logit| %.3g\n", what, worst,
              mag);
  EXPECT_LE(worst, 8 * DTypeEpsilon(DType::kBF16) * mag) << what;
}

std::unique_ptr<CpuDevice> SmallDevice() {
  Result<std::unique_ptr<CpuDevice>> d =
      CpuDevice::Create({.memory_bytes = size_t(64) << 20, .compute_threads = 2});
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(*d) : nullptr;
}

// The reference runner over `weights` gives transformers' logits (all rows at once).
void ExpectRunnerGivesTransformersLogits(const ModelConfig& c, const LoraConfig& lora,
                                         const HostTensors& weights, const char* what) {
  TransformersIo io;
  ASSERT_NO_FATAL_FAILURE(ReadTransformersIo(&io));
  std::unique_ptr<CpuDevice> d = SmallDevice();
  ASSERT_NE(d, nullptr);
  ReferenceRunnerOptions o;
  o.shape = {io.batch, io.seq};
  Result<std::unique_ptr<ModelRunner>> r = CreateReferenceRunner(*d, c, lora, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE((*r)->UploadWeights(weights).ok());
  Result<std::vector<float>> got = (*r)->Logits(io.ids);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectTransformersLogits(*got, io.logits, what);
}

TEST(QloraFolderTest, LogitsOfThePreQuantizedFolderMatchTransformers) {
  Result<ModelConfig> c = LoadHfConfig(Bnb4Dir() + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  LoraConfig lora{.rank = 4, .alpha = 8, .targets = kLoraAll, .quantize = BaseQuant::kNf4};
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, lora);
  Result<HostTensors> w = InitialWeights(Bnb4Dir(), *c, layers, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->nf4_served.size(), size_t(7 * c->num_layers));  // read again when packed
  EXPECT_TRUE(w->nf4.empty());
  for (const auto& [name, q] : w->nf4_served) EXPECT_EQ(w->tensors.count(name), 0u) << name;

  // LoRA's B starts at zero (PEFT's init): the adapter adds nothing yet.
  ExpectRunnerGivesTransformersLogits(*c, lora, *w, "QLoRA runner");
}

// Inference (ferry eval, ferry generate): the folder loaded by LoadModelFolder (NF4 as stored, no
// LoRA), run by the reference runner and by the Generator one sequence at a time.
TEST(QloraFolderTest, InferenceOverThePreQuantizedFolderMatchesTransformers) {
  Result<LoadedModel> m = LoadModelFolder(Bnb4Dir());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->lora.quantize, BaseQuant::kNf4);
  ASSERT_FALSE(m->lora.enabled());
  ExpectRunnerGivesTransformersLogits(m->config, m->lora, m->weights, "runner");

  TransformersIo io;
  ASSERT_NO_FATAL_FAILURE(ReadTransformersIo(&io));
  std::unique_ptr<CpuDevice> d = SmallDevice();
  ASSERT_NE(d, nullptr);
  const plan::Plan p =
      exec::GenerationPlan(m->config, m->lora, {}, 1, io.seq, io.seq, io.seq,
                           {.cuda = false, .cpu_threads = d->options().compute_threads});
  Result<std::unique_ptr<exec::PlannedGenerator>> g =
      exec::CreatePlannedGenerator({d.get()}, m->config, p, m->weights);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<float> got;
  for (int64_t b = 0; b < io.batch; ++b) {  // the cache reset between sequences
    (*g)->Reset();
    const std::span<const int32_t> row(io.ids.data() + b * io.seq, size_t(io.seq));
    Result<std::vector<float>> step = (*g)->Forward(row, /*last_only=*/false);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    got.insert(got.end(), step->begin(), step->end());
  }
  ExpectTransformersLogits(got, io.logits, "generator");
}

}  // namespace
}  // namespace ferry
