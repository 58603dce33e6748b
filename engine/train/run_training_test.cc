// EstimateDeviceBytes (the device size `ferry train` and `ferry eval` give one runner): the
// forward-only estimate leaves out exactly the backward's buffers, and each estimate covers what
// the runner it sizes really allocates. TrainingDevicesBytes (what `ferry train` checks against
// physical memory) is what CreateTrainingRunner then creates, for one device and for several.
#include "engine/train/run_training.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/job/job_spec.h"
#include "engine/model/model_runner.h"
#include "engine/testing/tiny_models.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

using testing::kTinyModels;
using testing::TinyModel;

ModelConfig Parse(const char* config_json) {
  Result<ModelConfig> c = ParseHfConfig(config_json);
  EXPECT_TRUE(c.ok()) << config_json << ": " << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

// Every architecture and quirk of the tiny models.
std::vector<ModelConfig> TinyConfigs() {
  std::vector<ModelConfig> models;
  for (const TinyModel& m : kTinyModels) models.push_back(Parse(m.config_json));
  return models;
}

// Llama (untied head, GQA) and GPT-2 (LayerNorm, biases, tied head, learned positions) wide
// enough that the buffers, not the arena's 256-byte rounding of each allocation, make up what a
// runner allocates: at the tiny models' sizes the rounding alone exceeds the buffers.
std::vector<ModelConfig> WideConfigs() {
  return {Parse(R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 176,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "tie_word_embeddings": false})"),
          Parse(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
              "vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 4,
              "n_positions": 64})")};
}

const LoraConfig kLoras[] = {LoraConfig{}, testing::TinyLora()};
constexpr int kThreads = 4;

TEST(EstimateDeviceBytes, ForwardOnlyLeavesOutExactlyTheBackwardBuffers) {
  const BatchShape shape{2, 6};
  const int64_t N = shape.tokens();
  std::vector<ModelConfig> models = TinyConfigs();
  for (ModelConfig& c : WideConfigs()) models.push_back(std::move(c));
  for (const ModelConfig& c : models) {
    for (const LoraConfig& lora : kLoras) {
      for (int64_t loss_chunk : {int64_t(5), int64_t(256)}) {  // chunk below N, and all of N
        SCOPED_TRACE(c.model_type + (lora.enabled() ? " + LoRA" : "") + ", chunk " +
                     std::to_string(loss_chunk));
        const int64_t C = c.hidden_size, chunk = std::min(N, loss_chunk);
        // The buffers only a training runner has: the trainable parameters' gradients
        // ("params.grads"), a dh partial (chunk, C) per thread in the loss scratch (64-byte
        // aligned; the dW is f32, so no dW panel), the head's input gradient (N, C) and
        // frozen-norm sink (2C) ("head.workspace"), the runner's two (N, C) gradient streams.
        size_t backward = 0;
        for (const LayerSpec& l : BuildLayerSpecs(c, lora)) {
          for (const ParamSpec& p : l.params) {
            if (p.trainable && p.tied_to.empty()) backward += p.bytes();
          }
        }
        const size_t dh_partial = (size_t(chunk * C) * sizeof(float) + 63) / 64 * 64;
        backward += size_t(kThreads) * dh_partial;
        backward += size_t(N * C + 2 * C + 2 * N * C) * sizeof(float);
        const size_t train = EstimateDeviceBytes(c, lora, shape, loss_chunk, kThreads);
        const size_t forward = EstimateDeviceBytes(c, lora, shape, loss_chunk, kThreads, false);
        // The estimate adds a quarter of what it counts (rounded down): a difference of
        // `backward` bytes, a multiple of 4 (f32 buffers), is a difference of exactly
        // backward + backward / 4 in the estimates.
        ASSERT_EQ(backward % 4, 0u);
        EXPECT_EQ(train - forward, backward + backward / 4);
      }
    }
  }
}

// A CpuDevice of exactly the estimated size fits the runner and a step (training: forward and
// backward; forward-only: EvaluateLoss, as `ferry eval` runs), and the arena's high-water mark
// stays within the estimate less its fixed 64 MiB slack, which alone would cover these small
// models: what the estimate counts, plus its quarter, must cover every buffer. (Measured: the peak
// is 68-88% of that.)
TEST(EstimateDeviceBytes, CoversWhatTheRunnerAllocates) {
  const BatchShape shape{2, 16};
  std::vector<int32_t> tokens(size_t(shape.tokens())), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(i * 7 % 1000);
    targets[i] = int32_t((i * 7 + 3) % 1000);
  }
  for (const ModelConfig& c : WideConfigs()) {
    for (const LoraConfig& lora : kLoras) {
      const std::vector<LayerSpec> layers = BuildLayerSpecs(c, lora);
      const HostTensors weights = testing::TinyWeights(layers, 1);
      for (const auto& [inference_only, dtype] :
           {std::pair{false, DType::kF32}, {true, DType::kF32}, {false, DType::kBF16}}) {
        SCOPED_TRACE(c.model_type + " " + std::to_string(c.vocab_size) +
                     (lora.enabled() ? " + LoRA" : "") +
                     (inference_only ? ", forward only" : ", training") + " in " +
                     std::string(DTypeName(dtype)));
        ModelRunnerOptions o;
        o.shape = shape;
        o.compute_dtype = dtype;  // a bf16 runner's buffers are at most the f32 estimate's
        o.loss_chunk_tokens = 8;  // several chunks
        o.inference_only = inference_only;
        const size_t estimate =
            EstimateDeviceBytes(c, lora, o.shape, o.loss_chunk_tokens, kThreads, !inference_only);
        Result<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(
            {.name = "estimated", .memory_bytes = estimate, .compute_threads = kThreads});
        ASSERT_TRUE(device.ok()) << device.status().ToString();
        Result<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(**device, c, lora, o);
        ASSERT_TRUE(runner.ok()) << runner.status().ToString();
        ASSERT_TRUE((*runner)->UploadWeights(weights).ok());
        const MicroBatchInput mb{tokens, targets, double(tokens.size())};
        if (inference_only) {
          Result<double> loss = (*runner)->EvaluateLoss(mb);
          ASSERT_TRUE(loss.ok()) << loss.status().ToString();
        } else {
          HostTensors grads;
          for (const LayerSpec& l : layers) {
            for (const ParamSpec& p : l.params) {
              if (p.trainable && p.tied_to.empty()) grads.tensors[p.name].assign(p.numel(), 0.0f);
            }
          }
          Result<double> loss = (*runner)->AccumulateGradients(mb, grads);
          ASSERT_TRUE(loss.ok()) << loss.status().ToString();
        }
        const size_t peak = (*device)->arena_stats().peak;
        EXPECT_GE(estimate - kDeviceEstimateSlackBytes, peak);
      }
    }
  }
}

TEST(TrainingDevicesBytes, IsWhatCreateTrainingRunnerCreates) {
  for (const char* dtype : {"f32", "bf16"}) {
    for (int64_t devices : {1, 2, 3}) {
      SCOPED_TRACE(std::string("--dtype ") + dtype + " --devices " + std::to_string(devices));
      JobSpec job;
      job.batch_size = 4;
      job.micro_batches = 2;
      job.seq_len = 32;
      job.devices = devices;
      job.dtype = dtype;
      Result<ModelConfig> model = ResolveModel(job);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      Result<TrainingRunner> t = CreateTrainingRunner(job, *model, kThreads);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(int64_t(t->devices.size()), devices);
      // Each device's capacity is the bytes asked, rounded down to its arena alignment.
      uint64_t created = 0;
      for (const auto& d : t->devices) created += d->capacity();
      const uint64_t bytes = TrainingDevicesBytes(job, *model, kThreads);
      EXPECT_GE(bytes, created);
      EXPECT_LT(bytes - created, uint64_t(devices) * CpuDeviceOptions{}.alignment);
    }
  }
}

}  // namespace
}  // namespace ferry
