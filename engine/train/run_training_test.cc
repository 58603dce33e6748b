// TrainingDevicesBytes (what `ferry train` and `ferry eval` check against physical memory) is
// what CreateTrainingRunner then creates, for one device and for several, training and forward
// only.
#include "engine/train/run_training.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/job/job_devices.h"
#include "engine/job/job_spec.h"
#include "engine/json.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/testing/golden_files.h"
#include "engine/train/training_data.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/testing/gpu_testing.h"

namespace ferry {
namespace {

constexpr int kThreads = 4;

TEST(TrainingDevicesBytes, IsWhatCreateTrainingRunnerCreates) {
  for (const char* dtype : {"f32", "bf16"}) {
    for (const auto& [devices, forward_only] :
         {std::pair<int64_t, bool>{1, false}, {2, false}, {3, false}, {1, true}, {2, true}}) {
      SCOPED_TRACE(std::string("--dtype ") + dtype + " --devices " + std::to_string(devices) +
                   (forward_only ? ", forward only" : ""));
      JobSpec job;
      job.batch_size = 4;
      job.micro_batches = 2;
      job.seq_len = 32;
      job.devices = devices;
      job.dtype = dtype;
      Result<ModelConfig> model = ResolveModel(job);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      Result<TrainingRunner> t =
          CreateTrainingRunner(job, *model, kThreads, /*trace=*/false, forward_only);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(int64_t(t->devices.size()), devices);
      // Each device's capacity is the bytes asked, rounded down to its arena alignment.
      uint64_t created = 0;
      for (const auto& d : t->devices) created += d->capacity();
      const uint64_t bytes = TrainingDevicesBytes(job, *model, kThreads, forward_only);
      EXPECT_GE(bytes, created);
      EXPECT_LT(bytes - created, uint64_t(devices) * CpuDeviceOptions{}.alignment);
      // A forward-only plan leaves out the gradients and the backward's buffers.
      if (forward_only) {
        EXPECT_LT(bytes, TrainingDevicesBytes(job, *model, kThreads));
      }
    }
  }
}

// A dataset file's packed rows are in the plan: "data.rows", their host bytes (at least the ids
// and target flags of rows x T, 5 bytes a token) in whole pages.
TEST(CreateTrainingRunner, ThePlanCountsThePackedRows) {
  const std::string data =
      ::testing::TempDir() + "/ferry_rows_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 50; ++i)
      f << R"({"text": "row )" << i << R"( of the ferry's data"})"
        << "\n";
  }
  JobSpec job;
  job.data = data;
  job.batch_size = 4;
  job.seq_len = 32;
  Result<ModelConfig> model = ResolveModel(job);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Result<std::unique_ptr<TrainingData>> loaded = TrainingData::Load(job, *model);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const plan::DataCounts counts = (*loaded)->Counts(job.micro_batch_size());
  const uint64_t rows = uint64_t((*loaded)->training_rows());
  ASSERT_GT(rows, 0u);
  EXPECT_GE(counts.host_bytes, rows * 32 * 5);
  Result<TrainingRunner> t = CreateTrainingRunner(job, *model, kThreads, false, false, counts);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->plan->memory.pageable_host.bytes_of("data.rows"),
            (counts.host_bytes + 4095) / 4096 * 4096);
  std::remove(data.c_str());
}

// CreateTrainingRunner on --devices cpu,cpu: CPU devices named as JobDeviceNames names them,
// whatever GPUs the machine has, and the job's "auto" dtype is f32 there.
TEST(CreateTrainingRunner, CpuDevicesAsListed) {
  JobSpec job;
  job.batch_size = 4;
  job.micro_batches = 2;
  job.seq_len = 32;
  ASSERT_TRUE(ParseDevicesOption("cpu,cpu", job).ok());
  Result<ModelConfig> model = ResolveModel(job);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Result<TrainingRunner> t = CreateTrainingRunner(job, *model, kThreads);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->devices.size(), 2u);
  EXPECT_EQ(t->devices[0]->name(), "cpu0");
  EXPECT_EQ(t->devices[1]->name(), "cpu1");
  EXPECT_EQ(t->devices[0]->kind(), DeviceKind::kCpu);
  EXPECT_EQ(t->summary.rfind("2 CPU devices, ", 0), 0u) << t->summary;
  ASSERT_TRUE(t->plan.has_value());
  EXPECT_EQ(t->plan->job.compute_dtype, DType::kF32);
}

// A GPU census without a GPU: one 4090 with `free` bytes free.
GpuCensus OneGpu(uint64_t free) {
  return {.gpus = {{.ordinal = 0,
                    .name = "NVIDIA GeForce RTX 4090",
                    .total_bytes = uint64_t(24) << 30,
                    .free_bytes = free,
                    .compute_capability = 89}},
          .none_reason = ""};
}

TEST(JobGpuBudget, MayOnlyLowerEachDevicesShare) {
  const GpuCensus census = OneGpu(uint64_t(20) << 30);
  JobSpec job;
  ASSERT_TRUE(ParseDevicesOption("cuda:0,cuda:0", job).ok());
  ASSERT_TRUE(ResolveJobDevices(job, census).ok());
  const uint64_t share = GpuDeviceBytes(job, census);
  EXPECT_EQ(share, uint64_t(double(uint64_t(20) << 30) * kGpuMemoryFraction / 2));
  Result<uint64_t> b = JobGpuBudget(job, census);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, share);
  job.gpu_memory = "4GiB";
  b = JobGpuBudget(job, census);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, uint64_t(4) << 30);
  for (const char* bad : {"10GiB", "0", "lots", "-1G"}) {
    job.gpu_memory = bad;
    b = JobGpuBudget(job, census);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("--gpu-memory"), std::string::npos) << b.status().message();
  }
  job.gpu_memory = "10GiB";
  EXPECT_NE(JobGpuBudget(job, census).status().message().find("split between the devices"),
            std::string::npos);
  // CPU devices have no GPU memory to cap.
  JobSpec cpu;
  ASSERT_TRUE(ParseDevicesOption("cpu", cpu).ok());
  b = JobGpuBudget(cpu, census);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, 0u);
  cpu.gpu_memory = "4GiB";
  b = JobGpuBudget(cpu, census);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("CUDA devices"), std::string::npos) << b.status().message();
}

// A GPU job's plan obeys --gpu-memory: a cap at the plan's own bytes still fits, half of them
// makes the model stream through the GPU in stages (weights and optimizer state live on the host),
// and a cap below what any plan needs is refused naming the GPU memory and the cap.
TEST(PlanJobDevices, AGpuPlanObeysGpuMemory) {
  const GpuCensus census = OneGpu(uint64_t(20) << 30);
  JobSpec job;
  job.batch_size = 4;
  job.micro_batches = 2;
  job.seq_len = 256;
  ASSERT_TRUE(ParseDevicesOption("cuda:0", job).ok());
  ASSERT_TRUE(ResolveJobDevices(job, census).ok());
  // Planned only (no weights are read): Qwen3-0.6B's 28 blocks leave room for many stages.
  Result<ModelConfig> model =
      LoadHfConfig(testing::SourceDir() + "/configs/models/qwen3-0.6b.json");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Result<plan::Plan> uncapped = PlanJobDevices(job, *model, kThreads, false, census);
  ASSERT_TRUE(uncapped.ok()) << uncapped.status().ToString();
  const uint64_t need = uncapped->memory.gpu.total();
  EXPECT_LE(need, GpuDeviceBytes(job, census));
  job.gpu_memory = std::to_string(need);
  Result<plan::Plan> capped = PlanJobDevices(job, *model, kThreads, false, census);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_LE(capped->memory.gpu.total(), need);
  job.gpu_memory = std::to_string(need / 2);
  Result<plan::Plan> half = PlanJobDevices(job, *model, kThreads, false, census);
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  EXPECT_LE(half->memory.gpu.total(), need / 2);
  EXPECT_GT(half->stages.size(), uncapped->stages.size());
  job.gpu_memory = "1GiB";
  Result<plan::Plan> none = PlanJobDevices(job, *model, kThreads, false, census);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no plan fits 1 CUDA device: GPU memory is short"),
            std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("(usable 1.00 GiB)"), std::string::npos)
      << none.status().message();
}

// What a one-step GPU test runs: a tiny model of a family (full or LoRA) in bf16, its weights
// and two micro-batches of random tokens. The goldens' GPT-2 is widened to head_dim 16: cuDNN's
// attention takes head dimensions that are multiples of 8 only.
struct GpuStepCase {
  const char* name;
  const char* golden;  // tests/goldens/<golden>/config.json; "" for the built-in tiny Llama
  int64_t lora_rank;
};

struct OneStep {
  JobSpec job;
  ModelConfig model;
  std::vector<LayerSpec> layers;
  HostTensors weights;
  std::vector<int32_t> tokens;
  std::vector<MicroBatchInput> batches;

  explicit OneStep(const GpuStepCase& c) {
    job.batch_size = 4;
    job.micro_batches = 2;
    job.seq_len = 32;
    job.dtype = "bf16";
    job.lora.rank = c.lora_rank;
    job.lora.alpha = 2.0 * double(c.lora_rank);
    Result<ModelConfig> m = ResolveModel(job);
    if (*c.golden != '\0') {
      nlohmann::json j = nlohmann::json::parse(
          testing::ReadTextFile(testing::GoldenPath(c.golden, "config.json")));
      if (j.contains("n_embd")) {
        j["n_embd"] = 64;
        j["n_positions"] = 64;
      }
      m = ParseHfConfig(j.dump());
    }
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return;
    model = *m;
    layers = BuildLayerSpecs(model, job.lora);
    weights = InitMasterWeights(layers, 7);
    std::mt19937 rng(3);
    // LoRA's B starts at zero, which would leave A's gradients zero: give it small values.
    std::uniform_real_distribution<float> small(-0.02f, 0.02f);
    for (auto& [name, t] : weights.tensors) {
      if (name.find("lora_B") != std::string::npos) {
        for (float& v : t) v = small(rng);
      }
    }
    tokens.resize(size_t(job.batch_size * job.seq_len));
    for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(model.vocab_size));
    const size_t half = tokens.size() / 2;
    const double normalizer = double(tokens.size());
    batches = {{.tokens = std::span(tokens).first(half),
                .targets = std::span(tokens).first(half),
                .normalizer = normalizer,
                .overwrite_grads = true},
               {.tokens = std::span(tokens).subspan(half),
                .targets = std::span(tokens).subspan(half),
                .normalizer = normalizer}};
  }

  // The step's loss on `devices` (as --devices takes them); its gradients in `grads`.
  double Run(const std::string& devices, HostTensors& grads) const {
    JobSpec j = job;
    EXPECT_TRUE(ParseDevicesOption(devices, j).ok());
    Result<TrainingRunner> t = CreateTrainingRunner(j, model, kThreads);
    EXPECT_TRUE(t.ok()) << devices << ": " << t.status().ToString();
    if (!t.ok()) return NAN;
    for (const LayerSpec& l : layers) {
      for (const ParamSpec& p : l.params) {
        if (p.trainable && p.tied_to.empty()) grads.tensors[p.name].assign(size_t(p.numel()), 0);
      }
    }
    EXPECT_TRUE(t->runner->UploadWeights(weights).ok());
    Result<double> loss = t->runner->AccumulateStep(batches, grads, {});
    EXPECT_TRUE(loss.ok()) << devices << ": " << loss.status().ToString();
    return loss.ok() ? *loss : NAN;
  }
};

// Every gradient of `got` within `rel` of `want`'s norm (tensor by tensor, in the L2 norm).
void ExpectGradsNear(const HostTensors& got, const HostTensors& want, double rel,
                     const std::string& what) {
  ASSERT_FALSE(want.tensors.empty());
  for (const auto& [name, ref] : want.tensors) {
    auto it = got.tensors.find(name);
    ASSERT_NE(it, got.tensors.end()) << what << ": no gradient of " << name;
    ASSERT_EQ(it->second.size(), ref.size()) << what << ": " << name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      diff += (double(it->second[i]) - ref[i]) * (double(it->second[i]) - ref[i]);
      norm += double(ref[i]) * ref[i];
    }
    EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm) + 1e-6) << what << ": " << name;
  }
}

// One training step of a tiny model of each family, fully and with LoRA, in bf16 on two logical
// devices sharing GPU 0, against the same job on two CPU devices (bf16 storage, fp32 math): the
// loss and every gradient agree within what bf16 storage allows (each device rounds activations
// to 8 significant bits, in different kernels and orders; cuDNN's attention backward is not
// deterministic): the loss within 2%, each gradient within 5% of its norm.
class CudaTrainingRunner : public ::testing::TestWithParam<GpuStepCase> {};

TEST_P(CudaTrainingRunner, StepMatchesCpuDevicesInBf16) {
  FERRY_SKIP_WITHOUT_GPU();
  const OneStep step(GetParam());
  HostTensors cpu_grads, gpu_grads;
  const double cpu = step.Run("cpu,cpu", cpu_grads);
  const double gpu = step.Run("cuda:0,cuda:0", gpu_grads);
  EXPECT_NEAR(gpu, cpu, 2e-2 * std::abs(cpu));
  ExpectGradsNear(gpu_grads, cpu_grads, 5e-2, "two logical GPU devices vs two CPU devices");
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, CudaTrainingRunner,
    ::testing::Values(GpuStepCase{"llama", "", 0}, GpuStepCase{"llama_lora", "", 4},
                      GpuStepCase{"qwen3", "qwen3", 0}, GpuStepCase{"qwen3_lora", "qwen3", 4},
                      GpuStepCase{"gpt2", "gpt2", 0}, GpuStepCase{"gpt2_lora", "gpt2", 4}),
    [](const ::testing::TestParamInfo<GpuStepCase>& i) { return std::string(i.param.name); });

// The same comparison on CPU devices in bf16, where nothing is non-deterministic: 2 and 4 devices
// give one device's loss bit for bit and its gradients to 1e-6 (and the helpers the GPU tests use
// are exercised without a GPU).
TEST(CpuTrainingRunnerDevices, TwoAndFourDevicesGiveTheBitsOfOne) {
  const OneStep step(GpuStepCase{"llama", "", 0});
  HostTensors one_grads;
  const double one = step.Run("cpu", one_grads);
  EXPECT_TRUE(std::isfinite(one));
  for (const char* devices : {"cpu,cpu", "cpu,cpu,cpu,cpu"}) {
    HostTensors grads;
    EXPECT_EQ(step.Run(devices, grads), one) << devices;
    ExpectGradsNear(grads, one_grads, 0.0, std::string(devices) + " vs cpu");
  }
}

// The multi-device executor on 2 and 4 logical devices of GPU 0 against one device: the same
// kernels on the same bf16 values, stage boundaries adding no rounding (hidden states are bf16
// between blocks either way), so only cuDNN's non-deterministic attention backward (fp32 atomics
// in dq) separates them: the loss within 1e-3, each gradient within 1% of its norm.
TEST(CudaTrainingRunnerDevices, LogicalDevicesOfOneGpuMatchOneDevice) {
  FERRY_SKIP_WITHOUT_GPU();
  const OneStep step(GpuStepCase{"llama", "", 0});
  HostTensors one_grads;
  const double one = step.Run("cuda:0", one_grads);
  for (const char* devices : {"cuda:0,cuda:0", "cuda:0,cuda:0,cuda:0,cuda:0"}) {
    HostTensors grads;
    EXPECT_NEAR(step.Run(devices, grads), one, 1e-3 * std::abs(one)) << devices;
    ExpectGradsNear(grads, one_grads, 1e-2, std::string(devices) + " vs cuda:0");
  }
}

}  // namespace
}  // namespace ferry
