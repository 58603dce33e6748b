// PipelineExecutor on several CpuDevices:
//  - correctness: a multi-stage plan gives the losses and gradients of the single-device
//    reference runner (itself checked against PyTorch in model_runner_test.cc) on the same weights
//    and micro-batches, in f32 and in bf16 (bit for bit against the bf16 runner);
//  - exactness of the memory model: each device arena's allocation log is the plan's GPU map
//    (engine/plan/memory_model.h), name by name and byte by byte, the measured peak equals the
//    predicted per-device bytes, every component fits the block it is placed in, and a device one
//    alignment unit smaller fails with the arena's OutOfMemory naming the allocation;
//  - concurrency: while device 0's compute stream is held, device 1 runs its stage and device 0
//    prefetches its next stage's weights; random delays on every stream change no bit.
#include "engine/exec/pipeline_executor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "engine/exec/pipeline_runner.h"
#include "engine/json.h"
#include "engine/model/converted_base.h"
#include "engine/model/device_params.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/plan/pipeline_schedules.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/reference_runner.h"
#include "engine/testing/stream_gate.h"
#include "engine/train/grad_clip.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/lm_head_loss.h"
#include "offload/offload_test_util.h"
#include "offload/process_memory.h"
#include "offload/versioned_store.h"

namespace ferry::exec {
namespace {

constexpr int kThreads = 2;  // per device; the memory model sizes CPU scratch for it

struct Model {
  ModelConfig config;
  LoraConfig lora;
};

// A golden's config (tests/goldens/<name>/config.json) with 4 blocks, so plans have several
// stages.
Model LoadModel(const std::string& golden, int rank = 0, bool nf4 = false) {
  nlohmann::json j =
      nlohmann::json::parse(testing::ReadTextFile(testing::GoldenPath(golden, "config.json")));
  j[j.contains("n_layer") ? "n_layer" : "num_hidden_layers"] = 4;
  if (j.contains("n_positions")) j["n_positions"] = 64;  // GPT-2's learned positions: T <= 64
  Result<ModelConfig> c = ParseHfConfig(j.dump());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Model m{*c, {}};
  if (rank > 0) {
    m.lora.rank = rank;
    m.lora.alpha = 2 * rank;
    m.lora.targets = kLoraAll;
    if (nf4) m.lora.quantize = BaseQuant::kNf4;
  }
  return m;
}

// Deterministic weights: norms near 1, everything else small (LoRA B non-zero so its gradients
// and A's are not trivially zero).
HostTensors RandomWeights(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.08f, 0.08f);
  HostTensors w;
  for (const LayerSpec& l : BuildLayerSpecs(m.config, m.lora)) {
    for (const ParamSpec& p : l.params) {
      if (!p.tied_to.empty()) continue;
      std::vector<float>& t = w.tensors[p.name];
      t.resize(size_t(p.numel()));
      const bool norm = p.shape.size() == 1 && p.name.find("bias") == std::string::npos;
      for (float& v : t) v = (norm ? 1.0f : 0.0f) + u(rng);
    }
  }
  // QLoRA: the block projections in NF4 (a no-op without).
  EXPECT_TRUE(QuantizeFrozenBase(BuildLayerSpecs(m.config, m.lora), w).ok());
  return w;
}

HostTensors ZeroGrads(const Model& m) {
  HostTensors g;
  for (const LayerSpec& l : BuildLayerSpecs(m.config, m.lora)) {
    for (const ParamSpec& p : l.params) {
      if (p.trainable && p.tied_to.empty()) g.tensors[p.name].assign(size_t(p.numel()), 0.0f);
    }
  }
  return g;
}

struct Batches {
  std::vector<std::vector<int32_t>> tokens, targets, doc_ids, positions;
  std::vector<MicroBatchInput> inputs;
};
// `seq_len` > 0 packs the rows: each row of seq_len tokens holds documents of random lengths,
// with doc ids and positions restarting at 0 per document (as packed_dataset.h lays them out).
Batches MakeBatches(const Model& m, int count, int64_t tokens, uint32_t seed, int64_t seq_len = 0) {
  std::mt19937 rng(seed);
  Batches b;
  b.tokens.resize(size_t(count));
  b.targets.resize(size_t(count));
  b.doc_ids.resize(size_t(count));
  b.positions.resize(size_t(count));
  double valid = 0;
  for (int i = 0; i < count; ++i) {
    for (int64_t n = 0, doc = 0, pos = 0; seq_len > 0 && n < tokens; ++n) {
      if (n % seq_len == 0 || rng() % 6 == 0) {  // a new row or a new document (~6 tokens long)
        ++doc;
        pos = 0;
      }
      b.doc_ids[size_t(i)].push_back(int32_t(doc));
      b.positions[size_t(i)].push_back(int32_t(pos++));
    }
    for (int64_t n = 0; n < tokens; ++n) {
      b.tokens[size_t(i)].push_back(int32_t(rng() % uint32_t(m.config.vocab_size)));
      const bool masked = rng() % 5 == 0;
      b.targets[size_t(i)].push_back(masked ? kIgnoreIndex
                                            : int32_t(rng() % uint32_t(m.config.vocab_size)));
      valid += masked ? 0 : 1;
    }
  }
  for (int i = 0; i < count; ++i) {
    b.inputs.push_back({.tokens = b.tokens[size_t(i)],
                        .targets = b.targets[size_t(i)],
                        .normalizer = valid,
                        .doc_ids = b.doc_ids[size_t(i)],
                        .positions = b.positions[size_t(i)]});
  }
  return b;
}

struct PlanSpec {
  std::vector<plan::LayerRange> stages;
  std::vector<int> recomputed;  // layer indices (blocks are 1..L)
  int micro_batches = 1;
  int64_t batch = 2, seq_len = 32;  // B*T = 64 tokens
  int gpus = 2;
  DType dtype = DType::kF32;  // the plan's compute dtype, and the reference runner's
  bool forward_only = false;  // a forward-only plan (evaluation)
  bool optimizer_on_nvme = false;
  bool keep = false;                 // one device keeps every saved activation (policy "keep")
  bool activations_on_nvme = false;  // saved activations in an NVMe store (Tier::kNvme)
  bool base_streamed = false;        // a LoRA base streamed from NVMe (the frozen weights there)
  int tail_parts = 1;         // the tail's micro-batches over this many devices (plan.tail_parts)
  int grad_accumulators = 1;  // per device (plan.grad_accumulators)
};

plan::Plan MakeTestPlan(const Model& m, const PlanSpec& s) {
  plan::Plan p;
  p.gpus = s.gpus;
  p.job.global_batch = s.batch * s.micro_batches;
  p.job.seq_len = s.seq_len;
  p.job.micro_batches = s.micro_batches;
  p.job.lora = m.lora;
  p.job.compute_dtype = s.dtype;
  p.job.scratch = {.cuda = false, .cpu_threads = kThreads};
  p.job.forward_only = s.forward_only;
  p.micro_batches = s.micro_batches;
  p.micro_batch_size = s.batch;
  p.stages = s.stages;
  p.tail_parts = s.tail_parts;
  p.grad_accumulators = s.grad_accumulators;
  p.recompute.assign(size_t(m.config.num_layers) + 2, false);
  for (int li : s.recomputed) p.recompute[size_t(li)] = true;
  p.activations = s.activations_on_nvme ? Tier::kNvme : Tier::kHost;
  p.keep_activations = s.keep;
  p.activation_policy = s.keep ? "keep" : "save";
  p.optimizer_state = s.optimizer_on_nvme ? Tier::kNvme : Tier::kHost;
  p.frozen_weights = s.base_streamed ? Tier::kNvme : Tier::kHost;
  p.job.frozen_base_from_files = s.base_streamed;
  p.memory = plan::ComputeMemory(plan::MemoryInputOf(m.config, p));
  return p;
}

std::vector<std::unique_ptr<CpuDevice>> MakeDevices(int count, size_t bytes,
                                                    uint32_t max_delay_us = 0, uint64_t seed = 0) {
  std::vector<std::unique_ptr<CpuDevice>> out;
  for (int i = 0; i < count; ++i) {
    CpuDeviceOptions o;
    o.name = "cpu" + std::to_string(i);
    o.memory_bytes = bytes;
    o.compute_threads = kThreads;
    o.max_random_delay_us = max_delay_us;
    o.random_delay_seed = seed * 64 + uint64_t(i) + 1;
    Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(o);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (d.ok()) out.push_back(std::move(*d));
  }
  return out;
}

std::vector<Device*> Raw(const std::vector<std::unique_ptr<CpuDevice>>& ds) {
  std::vector<Device*> out;
  for (const auto& d : ds) out.push_back(d.get());
  return out;
}

// This process's major page faults so far (every thread): pages read back from disk, which
// /proc/self/io's read_bytes counts too.
uint64_t MajorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_majflt);
}

// Whether files in `dir` open with O_DIRECT on a drive (not tmpfs, which takes O_DIRECT since
// Linux 6.6 but reads no drive): then reads bypass the page cache and /proc/self/io counts every
// block (on a filesystem of 4096-byte blocks, as every test machine's is).
bool DirectIoWorks(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) return false;  // RAM: no drive
  const std::string path = dir + "/.direct_probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(path.c_str());
  return fd >= 0;
}

// This process's storage I/O counter `key` ("read_bytes", "write_bytes") from /proc/self/io.
uint64_t ProcIo(const std::string& key) {
  std::ifstream f("/proc/self/io");
  std::string k;
  uint64_t v = 0;
  while (f >> k >> v) {
    if (k == key + ":") return v;
  }
  return 0;
}

// The store a plan's saved activations go to when it puts them on NVMe: opened in a temporary
// folder on the first Get of such a plan (the folder goes with it); null for other plans.
class ActivationStore {
 public:
  NvmeStore* Get(const plan::Plan& p, IoEnv* env = nullptr) {
    if (p.activations != Tier::kNvme) return nullptr;
    if (store_ == nullptr) {
      EXPECT_FALSE(dir_.path().empty()) << "could not create a temporary directory";
      NvmeStoreOptions o = ActivationStoreOptions(p, dir_.path() + "/activations");
      o.env = env;
      o.log = [](std::string_view) {};
      Result<std::unique_ptr<NvmeStore>> s = NvmeStore::Open(std::move(o));
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (s.ok()) store_ = std::move(*s);
    }
    return store_.get();
  }
  NvmeStore* get() const { return store_.get(); }
  // The store's segment files: one holds the plan's space, so a second means it undercounts.
  int Segments() const {
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/activations", ec)) {
      n += e.path().filename().string().rfind("segment-", 0) == 0;
    }
    return n;
  }

 private:
  ferry::testing::TempDir dir_;
  std::unique_ptr<NvmeStore> store_;  // destroyed before the folder
};

// PipelineExecutor::Create with the plan's activation store (from `store`) when it needs one.
Result<std::unique_ptr<PipelineExecutor>> CreateExecutor(
    const std::vector<std::unique_ptr<CpuDevice>>& devs, const Model& m, const plan::Plan& p,
    ActivationStore& store, HostPool* pool = nullptr) {
  return PipelineExecutor::Create(Raw(devs), m.config, p, nullptr, nullptr, pool, store.Get(p));
}

// Each device's arena log is the plan's GPU map (names, sizes, peak), and each planned
// allocation is what the code takes from it, rounded up to the arena's alignment: both ways, so
// an over-count fails as well as an under-count. The two weight slots count as one: which stages
// a slot holds moves from step to step with the global counter, so both are sized for the
// largest stage, and one step fills one of them with it; so do two gradient accumulators, which
// follow the weight slots.
void ExpectArenasAreThePlan(const std::vector<std::unique_ptr<CpuDevice>>& devs,
                            const PipelineExecutor& e, const plan::Plan& p) {
  for (const auto& d : devs) {
    const std::vector<ArenaRecord> log = d->arena_log();
    ASSERT_EQ(log.size(), p.memory.gpu.allocations.size()) << d->name();
    for (size_t i = 0; i < log.size(); ++i) {
      EXPECT_EQ(log[i].requester, p.memory.gpu.allocations[i].name) << d->name();
      EXPECT_EQ(log[i].reserved, p.memory.gpu.allocations[i].bytes) << log[i].requester;
    }
    EXPECT_EQ(d->arena_stats().peak, p.memory.gpu.total()) << d->name();
  }
  std::map<std::string, uint64_t> planned;
  for (const plan::Allocation& a : p.memory.gpu.allocations) planned[a.name] = a.bytes;
  std::map<std::string, uint64_t> used;
  for (const plan::Allocation& u : e.stats().used) {
    EXPECT_LE(u.bytes, planned.count(u.name) ? planned.at(u.name) : 0) << u.name;
    used[u.name] = u.bytes;
  }
  for (const auto& [name, bytes] : planned) {
    uint64_t took = used.count(name) ? used.at(name) : 0;
    if (name.rfind("weights.slot", 0) == 0) {
      took = std::max(used["weights.slot0"], used["weights.slot1"]);
    }
    if (name.rfind("grads.accum", 0) == 0 && planned.count("grads.accum1")) {
      took = std::max(used["grads.accum"], used["grads.accum1"]);
      // A stage with gradients accumulates in its weight slot's accumulator (a step's first,
      // placed afresh by plan::StageRoundRobin): a backward stage, and the tail's parts unless
      // the head is frozen (a LoRA job).
      const int S = int(p.stages.size()), P = p.tail_parts, K = 2 * S + P;
      const auto at = plan::StageRoundRobin(p.gpus).Place(K, false, plan::StepStageRanges(S, P));
      bool in_slot = false;
      for (int k = S; k < K; ++k) {
        const bool grads = k >= S + P || !p.job.lora.enabled();
        in_slot |= grads && at[size_t(k)].slot == (name == "grads.accum1" ? 1 : 0);
      }
      EXPECT_EQ(used[name] > 0, in_slot) << name << ": a stage accumulates in it";
    }
    EXPECT_EQ((took + plan::kArenaAlignment - 1) / plan::kArenaAlignment * plan::kArenaAlignment,
              bytes)
        << name << ": the code takes " << took << " bytes of it";
    ::testing::Test::RecordProperty(name, std::to_string(took) + " of " + std::to_string(bytes));
  }
  for (const auto& [name, bytes] : used) EXPECT_TRUE(planned.count(name)) << name;
}

// The reference: the reference runner on one device, micro-batch after micro-batch.
double RunnerStep(const Model& m, const PlanSpec& s, const HostTensors& w, const Batches& b,
                  HostTensors& grads) {
  std::vector<std::unique_ptr<CpuDevice>> dev = MakeDevices(1, size_t(64) << 20);
  ReferenceRunnerOptions o;
  o.shape = {s.batch, s.seq_len};
  o.compute_dtype = s.dtype;
  o.recompute.assign(s.recomputed.empty() ? 0 : size_t(m.config.num_layers), false);
  for (int li : s.recomputed) o.recompute[size_t(li - 1)] = true;  // layer li is block li - 1
  Result<std::unique_ptr<ModelRunner>> r = CreateReferenceRunner(*dev[0], m.config, m.lora, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return NAN;
  EXPECT_TRUE((*r)->UploadWeights(w).ok());
  double loss = 0;
  for (const MicroBatchInput& mb : b.inputs) {
    Result<double> l = (*r)->AccumulateGradients(mb, grads);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    loss += l.ok() ? *l : NAN;
  }
  return loss;
}

struct Case {
  const char* golden;
  int lora_rank;
  PlanSpec spec;
  int devices;
  bool packed = false;  // packed rows: several documents per row (doc_ids, positions)
  bool nf4 = false;     // QLoRA: the frozen block projections in NF4
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.golden << " lora " << c.lora_rank << ", " << c.spec.stages.size() << " stages, "
      << c.spec.micro_batches << " micro-batches, " << c.devices << " devices, "
      << DTypeName(c.spec.dtype) << (c.packed ? ", packed rows" : "") << (c.nf4 ? ", nf4" : "")
      << (c.spec.keep ? ", activations kept" : "")
      << (c.spec.activations_on_nvme ? ", activations on NVMe" : "")
      << (c.spec.tail_parts > 1 ? ", the tail in " + std::to_string(c.spec.tail_parts) + " parts"
                                : "")
      << (c.spec.grad_accumulators > 1 ? ", two gradient accumulators" : "");
}

Batches MakeCaseBatches(const Model& m, const Case& k, uint32_t seed) {
  return MakeBatches(m, k.spec.micro_batches, k.spec.batch * k.spec.seq_len, seed,
                     k.packed ? k.spec.seq_len : 0);
}

class ExecutorTest : public ::testing::TestWithParam<Case> {};

std::string CaseName(const ::testing::TestParamInfo<Case>& i) {
  return std::string(i.param.golden) + (i.param.lora_rank ? "_lora" : "") +
         (i.param.nf4 ? "_nf4" : "") + (i.param.packed ? "_packed" : "") +
         (i.param.spec.activations_on_nvme ? "_nvme" : "") +
         (i.param.spec.tail_parts > 1 ? "_tail" + std::to_string(i.param.spec.tail_parts) : "") +
         (i.param.spec.grad_accumulators > 1 ? "_acc2" : "") + "_" + std::to_string(i.index);
}

// Tolerance: the executor runs the same kernels in the same order on the same inputs (layer
// inputs and saved sets round-trip through host memory bit for bit, in f32 or bf16), so one
// micro-batch gives bit-identical results. With several micro-batches the parameter gradients
// accumulate on the device (g1 + g2 inside the GEMM's C += A B) instead of on the host (0 + g1,
// then + g2), and with tied embeddings the head's gradient joins the embedding's before rather
// than between the micro-batches' scatter-adds: the sums are reassociated, each addition rounding
// by at most half an ulp of the running sum, so a few eps of the gradient's magnitude per
// micro-batch: atol 8 eps * max|g| of the tensor, rtol 8 eps, with fp32's eps in either dtype
// (parameter gradients are fp32 sums in both).
TEST_P(ExecutorTest, MatchesSingleDeviceRunner) {
  const Case& k = GetParam();
  const Model m = LoadModel(k.golden, k.lora_rank, k.nf4);
  const plan::Plan p = MakeTestPlan(m, k.spec);
  const HostTensors w = RandomWeights(m, 7);
  const Batches b = MakeCaseBatches(m, k, 11);

  HostTensors want = ZeroGrads(m);
  const double want_loss = RunnerStep(m, k.spec, w, b, want);

  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(k.devices, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // The weights a step copies, stage by stage as plan::StageRoundRobin places them: none when the
  // stage's slot holds its layers from earlier in the step (a backward stage after the forward
  // stage over its layers there); in a LoRA job, only the adapters when the slot holds the layers'
  // frozen base from an earlier step; else all of them.
  const std::vector<LayerSpec> specs = BuildLayerSpecs(m.config, m.lora);
  auto range_bytes = [&](plan::LayerRange r, bool trainable_only) {
    Result<DeviceParams::Bytes> b = DeviceParams::Measure(
        m.config, m.lora, {specs.begin() + r.first, specs.begin() + r.last}, k.spec.dtype);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return !b.ok() ? 0 : uint64_t(trainable_only ? b->trainable_weights : b->weights);
  };
  const int S = int(k.spec.stages.size()), head = int(specs.size()) - 1;
  const int stages = 2 * S + k.spec.tail_parts;
  std::vector<plan::LayerRange> ranges;  // per stage of a step
  for (int r : plan::StepStageRanges(S, k.spec.tail_parts)) {
    ranges.push_back(r < S ? k.spec.stages[size_t(r)] : plan::LayerRange{head, head + 1});
  }
  if (m.lora.enabled()) {
    EXPECT_LT(range_bytes(ranges[0], true), range_bytes(ranges[0], false) / 2);
  }
  plan::StageRoundRobin placement(k.devices);
  std::map<std::pair<int, int>, std::pair<int, int>> held;  // slot -> (first layer, step)
  auto step_weights = [&](int step) {
    uint64_t bytes = 0;
    const auto at =
        placement.Place(stages, m.lora.enabled(), plan::StepStageRanges(S, k.spec.tail_parts));
    for (int i = 0; i < stages; ++i) {
      auto it = held.try_emplace({at[size_t(i)].device, at[size_t(i)].slot}, -1, -1).first;
      if (it->second != std::pair{ranges[size_t(i)].first, step}) {
        bytes += range_bytes(ranges[size_t(i)],
                             m.lora.enabled() && it->second.first == ranges[size_t(i)].first);
      }
      it->second = {ranges[size_t(i)].first, step};
    }
    return bytes;
  };
  uint64_t weights_uploaded = 0;
  // Saved activations on NVMe: a step writes and reads each entry once, in whole 4096-byte
  // blocks, which is what the plan counts, by the store's count and by /proc/self/io.
  const uint64_t planned_nvme = p.memory.nvme_activation_step_bytes;
  EXPECT_EQ(planned_nvme > 0, k.spec.activations_on_nvme);
  for (int step = 0; step < 2; ++step) {  // a second step reuses every buffer
    HostTensors got = ZeroGrads(m);
    const StoreStats io0 = store.get() ? store.get()->stats() : StoreStats{};
    const uint64_t r0 = ProcIo("read_bytes"), w0 = ProcIo("write_bytes"), f0 = MajorFaults();
    Result<double> loss = (*e)->Step(w, b.inputs, got);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    if (store.get() != nullptr) {
      const StoreStats io1 = store.get()->stats();
      EXPECT_EQ(io1.disk_bytes_written - io0.disk_bytes_written, planned_nvme);
      EXPECT_EQ(io1.disk_bytes_read - io0.disk_bytes_read, planned_nvme);
      // By the kernel's count too, once the store exists (the first step also creates its
      // segment file): O_DIRECT, so the page cache hides nothing. The counters are the whole
      // process's: a step that took a major page fault (the test binary's own pages read back
      // from disk, as NvmeOptimizerTest saw under TSan) reads more, so it is not judged by them.
      const uint64_t faults = MajorFaults() - f0;
      if (step > 0 && store.get()->direct_io() && faults == 0) {
        EXPECT_EQ(ProcIo("write_bytes") - w0, planned_nvme);
        EXPECT_EQ(ProcIo("read_bytes") - r0, planned_nvme);
      } else if (step > 0 && faults > 0) {
        std::printf("[ note ] step %d took %llu major page faults: /proc/self/io not compared\n",
                    step, static_cast<unsigned long long>(faults));
      }
    }
    const bool exact = k.spec.micro_batches == 1;
    if (exact) {
      EXPECT_EQ(*loss, want_loss);
    } else {
      EXPECT_NEAR(*loss, want_loss, 1e-12 * std::abs(want_loss));  // same per-batch sums
    }
    const float eps = DTypeEpsilon(DType::kF32);
    for (const auto& [name, g] : want.tensors) {
      const std::vector<float>& h = got.tensors.at(name);
      float mag = 0;
      for (float v : g) mag = std::max(mag, std::abs(v));
      int bad = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        const float tol = exact ? 0.0f : 8 * eps * (mag + std::abs(g[i]));
        if (!(std::abs(h[i] - g[i]) <= tol) && ++bad <= 3) {
          ADD_FAILURE() << name << "[" << i << "]: executor " << h[i] << " runner " << g[i];
        }
      }
      EXPECT_EQ(bad, 0) << name;
    }
    if (store.get() != nullptr) {
      EXPECT_EQ(store.Segments(), 1);
      // The host memory the store maps itself is the plan's too.
      uint64_t planned = 0;
      for (const plan::Allocation& a : p.memory.pageable_host.allocations) {
        if (a.name == "activations.store") planned = a.bytes;
      }
      EXPECT_EQ(store.get()->bounce_bytes(), planned);
    }
    const ExecutorStats st = (*e)->stats();
    EXPECT_EQ(st.stages_run, int64_t(stages));
    weights_uploaded += step_weights(step);
    EXPECT_EQ(st.weight_bytes_uploaded, weights_uploaded) << "step " << step;
    // A LoRA job's second step packs the adapters only (each forward range and the head's): the
    // host mirrors keep the base packed from the same master copy, and the results stay exact.
    const int64_t ranges = int64_t(k.spec.stages.size()) + 1;
    EXPECT_EQ(st.frozen_packs_skipped, k.lora_rank > 0 && step > 0 ? ranges : 0) << "step " << step;
  }
}

// Overwriting gradient buffers full of NaN (MicroBatchInput::overwrite_grads on the first
// micro-batch) gives the same values as adding into zeroed ones, as on one device
// (model_runner_test.cc): each stage stores its share, the tied head's share joins its owner's,
// LoRA factors start from zero, and what no stage writes (the embeddings) is zeroed before the
// host's scatter-add.
TEST_P(ExecutorTest, OverwritingGradientsEqualsAddingToZeros) {
  const Case& k = GetParam();
  const Model m = LoadModel(k.golden, k.lora_rank, k.nf4);
  const plan::Plan p = MakeTestPlan(m, k.spec);
  const HostTensors w = RandomWeights(m, 5);
  Batches b = MakeCaseBatches(m, k, 13);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(k.devices, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  HostTensors added = ZeroGrads(m);
  Result<double> want = (*e)->Step(w, b.inputs, added);
  ASSERT_TRUE(want.ok()) << want.status().ToString();

  HostTensors stored = ZeroGrads(m);
  for (auto& [name, g] : stored.tensors) std::fill(g.begin(), g.end(), NAN);
  b.inputs.front().overwrite_grads = true;
  Result<double> got = (*e)->Step(w, b.inputs, stored);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, *want);
  ASSERT_EQ(stored.tensors.size(), added.tensors.size());
  for (const auto& [name, g] : added.tensors) {
    const std::vector<float>& h = stored.tensors.at(name);
    ASSERT_EQ(g.size(), h.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], h[i]) << name << "[" << i << "] differs when overwriting";
    }
  }
}

// The step's host threads (MicroBatchInput::host_pool) pack the stages' weights into bf16 and add
// their gradients in pieces; the pieces are elementwise, so a step on two threads gives the bits
// of a step on none. The vocabulary is widened so that the head's 4096 x 64 weight is large
// enough to be split (the embedding is gathered on the host, not packed). A wrong piece offset
// fails it (checked once).
// One step of `p` on `count` fresh devices; the loss, and the gradients in `g`.
// `env`: the activation store's (when the plan puts activations on NVMe).
double ExecutorStep(const Model& m, const plan::Plan& p, int count, const HostTensors& w,
                    const Batches& b, HostTensors& g, uint32_t delay_us = 0, uint64_t seed = 0,
                    IoEnv* env = nullptr) {
  std::vector<std::unique_ptr<CpuDevice>> devs =
      MakeDevices(count, p.memory.gpu.total(), delay_us, seed);
  ActivationStore store;
  store.Get(p, env);
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return NAN;
  Result<double> loss = (*e)->Step(w, b.inputs, g);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  return loss.ok() ? *loss : NAN;
}

TEST(ExecutorHostThreadsTest, PackingAndAddingOnThreadsChangeNoBit) {
  Model m = LoadModel("llama");
  m.config.vocab_size = 4096;
  const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 32, 2, DType::kBF16};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 5);
  ThreadPool threads(2);
  auto step = [&](ThreadPool* pool, HostTensors& grads) -> double {
    Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 13);
    for (MicroBatchInput& in : b.inputs) in.host_pool = pool;
    return ExecutorStep(m, p, spec.gpus, w, b, grads);
  };
  HostTensors inline_grads = ZeroGrads(m), pooled_grads = ZeroGrads(m);
  const double inline_loss = step(nullptr, inline_grads);
  EXPECT_EQ(step(&threads, pooled_grads), inline_loss);
  ASSERT_GE(inline_grads.tensors.at("lm_head.weight").size(), size_t(4096 * 64));
  for (const auto& [name, g] : inline_grads.tensors) {
    const std::vector<float>& h = pooled_grads.tensors.at(name);
    ASSERT_EQ(g.size(), h.size()) << name;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], h[i]) << name << "[" << i << "] differs on two threads";
    }
  }
}

// Every device's arena holds exactly the plan's map (names and bytes, in its order), its peak is
// the predicted per-device total, every component fitted its planned block, and one alignment
// unit less fails naming the allocation that no longer fits.
// (The body, shared with the f16 plans' check, F16TrainingTest.ArenaMatchesMemoryModel.)
void CheckArenaMatchesMemoryModel(const Case& k) {
  const Model m = LoadModel(k.golden, k.lora_rank, k.nf4);
  const plan::Plan p = MakeTestPlan(m, k.spec);
  const uint64_t predicted = p.memory.gpu.total();
  const HostTensors w = RandomWeights(m, 3);
  const Batches b = MakeCaseBatches(m, k, 5);
  {
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(k.devices, predicted);
    ActivationStore store;
    Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    HostTensors g = ZeroGrads(m);
    Result<double> loss = (*e)->Step(w, b.inputs, g);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    ExpectArenasAreThePlan(devs, **e, p);
  }
  std::vector<std::unique_ptr<CpuDevice>> small =
      MakeDevices(k.devices, predicted - plan::kArenaAlignment);
  ActivationStore small_store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(small, m, p, small_store);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().ToString();
  EXPECT_NE(e.status().message().find(p.memory.gpu.allocations.back().name), std::string::npos)
      << e.status().ToString();
}
TEST_P(ExecutorTest, ArenaMatchesMemoryModel) { CheckArenaMatchesMemoryModel(GetParam()); }

// The executor's pinned host staging comes from the host pool as the plan's pinned map says: one
// block per entry, named as the plan names it, each the plan's bytes, so the pool's peak is the
// plan's pinned total exactly (an over-count in the plan fails here as well as an under-count),
// over a step and after it; a pool one page short fails at Create naming the entry that no longer
// fits. The pool makes one mapping, registered once with each device.
TEST_P(ExecutorTest, PinnedHostMatchesMemoryModel) {
  const Case& k = GetParam();
  const Model m = LoadModel(k.golden, k.lora_rank, k.nf4);
  const plan::Plan p = MakeTestPlan(m, k.spec);
  const uint64_t planned = p.memory.pinned_host.total();
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(k.devices, p.memory.gpu.total());
  {
    ActivationStore store;
    Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const ExecutorStats at_create = (*e)->stats();
    ASSERT_EQ(at_create.host_pinned.size(), p.memory.pinned_host.allocations.size());
    for (size_t i = 0; i < at_create.host_pinned.size(); ++i) {
      EXPECT_EQ(at_create.host_pinned[i].name, p.memory.pinned_host.allocations[i].name);
      EXPECT_EQ(at_create.host_pinned[i].bytes, p.memory.pinned_host.allocations[i].bytes)
          << at_create.host_pinned[i].name;
      ::testing::Test::RecordProperty(at_create.host_pinned[i].name,
                                      std::to_string(at_create.host_pinned[i].bytes));
    }
    EXPECT_EQ(at_create.pinned.peak, planned);
    EXPECT_EQ(at_create.pinned.budget, planned);
    EXPECT_EQ(at_create.pinned.mappings, 1u);  // one mapping, registered once per device
    HostTensors g = ZeroGrads(m);
    const Batches b = MakeCaseBatches(m, k, 5);
    Result<double> loss = (*e)->Step(RandomWeights(m, 3), b.inputs, g);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    const ExecutorStats after = (*e)->stats();
    EXPECT_EQ(after.pinned.peak, planned);
    EXPECT_EQ(after.pinned.in_use, planned);
    EXPECT_EQ(after.host_mappings, 1);  // no mirror of its own: the plan's map holds them all
  }
  ActivationStore short_store;
  auto short_pool = HostPool::Create({.pinned_budget = planned - plan::kHostPageBytes,
                                      .chunk_bytes = planned - plan::kHostPageBytes,
                                      .devices = Raw(devs)});
  ASSERT_TRUE(short_pool.ok()) << short_pool.status().ToString();
  Result<std::unique_ptr<PipelineExecutor>> e =
      CreateExecutor(devs, m, p, short_store, short_pool->get());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().ToString();
  EXPECT_NE(e.status().message().find("'" + p.memory.pinned_host.allocations.back().name + "'"),
            std::string::npos)
      << e.status().ToString();
}

// The planner's own choice (stages, micro-batches, recompute) for a small machine whose GPUs are
// CPU devices: it runs, within the predicted bytes exactly, and matches the single-device runner.
TEST(ExecutorPlannerTest, PlannerChosenPlanRunsInItsPredictedBytes) {
  plan::HardwareProfile h;
  h.name = "cpu devices";
  h.gpu = {"cpu", 3, 8ull << 20, 0, 8ull << 20, 1e12, 0, 0.5, 1e11, false, "test"};
  h.pcie = {4, 16, 2e10, 2e10, 1e10, 1e10, "test"};
  h.host = {1ull << 30, 1ull << 30, 1e11, 1, 8, "test"};
  h.nvme = {"", 0, 3e9, 3e9, 1.5e9, 0, "test"};
  h.optimizer = {1e9, "test"};
  Model m{TinyLlamaPreset(), {}};
  m.config.num_layers = 6;
  m.config.hidden_size = 64;
  m.config.intermediate_size = 96;
  m.config.num_heads = 4;
  m.config.num_kv_heads = 2;
  m.config.head_dim = 16;
  plan::PlanJob job;
  job.global_batch = 8;
  job.seq_len = 24;
  job.compute_dtype = DType::kF32;
  job.scratch = {.cuda = false, .cpu_threads = kThreads};
  Result<plan::PlanOutcome> r = plan::MakePlan("tiny", m.config, job, h, /*suggest=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->feasible) << r->binding;
  const plan::Plan& p = r->plan;
  ASSERT_GT(p.stages.size(), 1u) << "the test wants a multi-stage plan";
  const uint64_t predicted = p.memory.gpu.total();
  ASSERT_LE(predicted, h.gpu.memory_usable_bytes);
  std::cout << "[ plan ] " << p.stages.size() << " stages, " << p.micro_batches << " x "
            << p.micro_batch_size << " sequences, activations " << p.activation_policy << ", "
            << predicted << " bytes per device\n";

  const HostTensors w = RandomWeights(m, 1);
  const Batches b = MakeBatches(m, p.micro_batches, p.micro_batch_size * job.seq_len, 2);
  const PlanSpec spec{p.stages, {}, p.micro_batches, p.micro_batch_size, job.seq_len, 3};
  HostTensors want = ZeroGrads(m);
  const double want_loss = RunnerStep(m, spec, w, b, want);

  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(3, predicted);
  Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  HostTensors got = ZeroGrads(m);
  Result<double> loss = (*e)->Step(w, b.inputs, got);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, want_loss, 1e-12 * std::abs(want_loss));
  // Tolerance as MatchesSingleDeviceRunner (device- vs host-side accumulation order).
  const float eps = DTypeEpsilon(DType::kF32);
  for (const auto& [name, g] : want.tensors) {
    float mag = 0;
    for (float v : g) mag = std::max(mag, std::abs(v));
    const std::vector<float>& x = got.tensors.at(name);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_LE(std::abs(x[i] - g[i]), 8 * eps * (mag + std::abs(g[i]))) << name << "[" << i << "]";
    }
  }
  for (const auto& d : devs) EXPECT_EQ(d->arena_stats().peak, predicted) << d->name();
}

// A tail in more parts than the plan's micro-batches or the executor's devices is refused.
TEST(ExecutorRaceTest, RefusesMoreTailPartsThanMicroBatchesOrDevices) {
  const Model m = LoadModel("llama");
  for (const auto& [micro_batches, parts] : {std::pair{3, 3}, {1, 2}, {3, 0}}) {
    PlanSpec spec{{{1, 3}, {3, 5}}, {}, micro_batches};
    spec.tail_parts = parts;
    const plan::Plan p = MakeTestPlan(m, spec);
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
    ASSERT_FALSE(e.ok()) << parts << " parts";
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("splits the tail into " + std::to_string(parts)),
              std::string::npos)
        << e.status().ToString();
  }
}

// A plan with other than one or two gradient accumulators per device is refused, and so is one
// that asks for two while its GPU map holds one (a map made for one accumulator).
TEST(ExecutorRaceTest, RefusesGradientAccumulatorsItDoesNotHave) {
  const Model m = LoadModel("llama");
  for (const int accumulators : {0, 3, 2}) {
    PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2};
    plan::Plan p = MakeTestPlan(m, spec);  // sized for one
    p.grad_accumulators = accumulators;
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
    ASSERT_FALSE(e.ok()) << accumulators;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(accumulators == 2 ? "lacks 'grads.accum1'"
                                                          : std::to_string(accumulators) +
                                                                " gradient accumulators"),
              std::string::npos)
        << e.status().ToString();
  }
}

// Devices with other thread counts than the plan's scratch was sized for are refused at Create,
// naming the threads.
TEST(ExecutorRaceTest, RefusesDevicesThePlanWasNotSizedFor) {
  const Model m = LoadModel("llama");
  const plan::Plan p = MakeTestPlan(m, {{{1, 3}, {3, 5}}, {}, 1, 2, 16, 2});
  std::vector<std::unique_ptr<CpuDevice>> devs;
  CpuDeviceOptions o;
  o.memory_bytes = p.memory.gpu.total();
  o.compute_threads = kThreads + 1;
  Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(o);
  ASSERT_TRUE(d.ok());
  devs.push_back(std::move(*d));
  Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("3 threads"), std::string::npos) << e.status().ToString();
}

void ExpectSameBits(const HostTensors& got, const HostTensors& want, const std::string& what) {
  for (const auto& [name, g] : want.tensors) {
    EXPECT_EQ(got.tensors.at(name), g) << name << " differs " << what;
  }
}

// A LoRA job's host mirrors keep the frozen base from step to step (Step's contract: with the
// same master copy only trainable tensors change): adapters changed between steps give what a
// fresh executor gives, bit for bit; another master copy is packed whole.
TEST(ExecutorLoraMirrorTest, KeptBaseWithChangedAdaptersEqualsAFreshExecutor) {
  const Model m = LoadModel("llama", 4);
  const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2};
  const plan::Plan p = MakeTestPlan(m, spec);
  HostTensors w = RandomWeights(m, 3);
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(spec.gpus, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  HostTensors first = ZeroGrads(m);
  ASSERT_TRUE((*e)->Step(w, b.inputs, first).ok());
  EXPECT_EQ((*e)->stats().frozen_packs_skipped, 0);
  int changed = 0;
  for (auto& [name, t] : w.tensors) {
    if (name.find("lora_") == std::string::npos) continue;
    for (size_t i = 0; i < t.size(); ++i) t[i] += 0.01f * float(i % 7 + 1);
    ++changed;
  }
  ASSERT_GT(changed, 0);
  HostTensors kept = ZeroGrads(m), fresh = ZeroGrads(m);
  Result<double> loss = (*e)->Step(w, b.inputs, kept);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  const int64_t ranges = int64_t(spec.stages.size()) + 1;
  EXPECT_EQ((*e)->stats().frozen_packs_skipped, ranges);
  EXPECT_EQ(*loss, ExecutorStep(m, p, spec.gpus, w, b, fresh));
  ExpectSameBits(kept, fresh, "with the kept base");
  // Another master copy with another base: packed whole, as a fresh executor would.
  HostTensors other = w;
  for (auto& [name, t] : other.tensors) {
    if (name.find("mlp.down_proj.weight") != std::string::npos) t[0] += 0.5f;
  }
  HostTensors again = ZeroGrads(m), fresh_other = ZeroGrads(m);
  loss = (*e)->Step(other, b.inputs, again);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ((*e)->stats().frozen_packs_skipped, ranges);
  EXPECT_EQ(*loss, ExecutorStep(m, p, spec.gpus, other, b, fresh_other));
  ExpectSameBits(again, fresh_other, "after another master copy");
}

// A LoRA job's frozen base served from the model's safetensors files (HostTensors::files: packed
// into the upload mirrors straight from the file, the embedding gathered from it) gives the
// loss and adapter gradients of the same base read into fp32 tensors by the independent loader
// (LoadParameter), bit for bit: a file in the compute dtype (copied), in another dtype
// (converted), and GPT-2's transposed Conv1D weights with its tied head and learned positions.
TEST(ExecutorFileBaseTest, ABaseServedFromItsFilesEqualsItsFp32Copy) {
  struct Case {
    const char* golden;
    DType file, compute;
  };
  for (const Case& k :
       {Case{"llama", DType::kBF16, DType::kBF16}, Case{"llama", DType::kF32, DType::kBF16},
        Case{"gpt2", DType::kBF16, DType::kF32}}) {
    const std::string what = std::string(k.golden) + ", " + std::string(DTypeName(k.file)) +
                             " file, " + std::string(DTypeName(k.compute)) + " compute";
    const Model m = LoadModel(k.golden, 4);
    const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2, k.compute};
    const plan::Plan p = MakeTestPlan(m, spec);
    const HostTensors random = RandomWeights(m, 21);
    testing::TempDir dir;
    const std::vector<LayerSpec> lora_layers = BuildLayerSpecs(m.config, m.lora);
    ModelFolderWriteOptions as;
    as.dtype = k.file;
    ASSERT_TRUE(WriteModelFolder(dir.path(), m.config, lora_layers, random, as).ok());
    Result<FolderWeights> folder = FolderWeights::Open(dir.path());
    ASSERT_TRUE(folder.ok()) << folder.status().ToString();
    // Served: the LoRA layers' frozen base from the file; read: a full fine-tune's layers (base
    // trainable) read it into fp32. Both take the same adapters.
    HostTensors served, read;
    ASSERT_TRUE(LoadBaseWeights(*folder, m.config, lora_layers, served).ok()) << what;
    ASSERT_TRUE(
        LoadBaseWeights(*folder, m.config, BuildLayerSpecs(m.config, LoraConfig{}), read).ok())
        << what;
    for (const ParamSpec* q : StorageParams(lora_layers)) {
      if (q->lora) {
        served.tensors[q->name] = read.tensors[q->name] = random.tensors.at(q->name);
      } else {
        EXPECT_TRUE(served.files.contains(q->name) && !served.tensors.contains(q->name))
            << q->name << " is not served from the file (" << what << ")";
      }
    }
    const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
    HostTensors from_files = ZeroGrads(m), from_ram = ZeroGrads(m);
    const double loss = ExecutorStep(m, p, spec.gpus, served, b, from_files);
    EXPECT_TRUE(std::isfinite(loss)) << what;
    EXPECT_EQ(loss, ExecutorStep(m, p, spec.gpus, read, b, from_ram)) << what;
    ExpectSameBits(from_files, from_ram, "with the base served from its file, " + what);
  }
}

// `weights`' base written to a model folder in `dir` (in `dtype`) and served from it
// (LoadBaseWeights) into `served`.
void ServeFromFolder(const Model& m, const std::vector<LayerSpec>& layers,
                     const HostTensors& weights, const std::string& dir, HostTensors& served,
                     DType dtype = DType::kBF16) {
  ASSERT_FALSE(dir.empty());
  ModelFolderWriteOptions as;
  as.dtype = dtype;
  ASSERT_TRUE(WriteModelFolder(dir, m.config, layers, weights, as).ok());
  Result<FolderWeights> folder = FolderWeights::Open(dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  ASSERT_TRUE(LoadBaseWeights(*folder, m.config, layers, served).ok());
}

// Three steps of a LoRA job with its frozen base streamed and kept in the host mirrors, as
// AStreamedBaseEqualsTheBaseKeptInTheMirrors says: the base served from a model folder in
// `folder` dtype when given (else held), then what the files do not serve moved to a converted
// copy (MoveBaseToNvme) when `convert`.
void StreamBaseSteps(const Model& m, const std::string& source, std::optional<DType> folder,
                     bool convert, const std::vector<int>& device_counts = {2, 1},
                     int tail_parts = 1) {
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  const HostTensors random = RandomWeights(m, 31);
  testing::TempDir dir, nvme;
  HostTensors served = random;
  if (folder) {
    served = {};
    ASSERT_NO_FATAL_FAILURE(ServeFromFolder(m, layers, random, dir.path(), served, *folder));
    for (const ParamSpec* q : StorageParams(layers)) {
      if (q->lora) served.tensors[q->name] = random.tensors.at(q->name);
    }
  }
  const HostTensors kept_base = served;
  if (convert) {
    Result<ConvertedBase> moved =
        MoveBaseToNvme(layers, DType::kBF16, folder.value_or(DType::kF32), nvme.path(), served);
    ASSERT_TRUE(moved.ok()) << moved.status().ToString();
    ASSERT_GT(moved->weights, 0);
  }
  for (const int gpus : device_counts) {
    const std::string what = std::to_string(gpus) + " device(s), " + source;
    PlanSpec spec{{{1, 2}, {2, 3}, {3, 5}}, {}, 2, 2, 16, gpus, DType::kBF16};
    spec.tail_parts = tail_parts;
    const plan::Plan kept_plan = MakeTestPlan(m, spec);
    spec.base_streamed = true;
    Model stored = m;  // as the folder stores it: the plan reads what the files serve from them
    if (folder) stored.config.weights_dtype = *folder;
    const plan::Plan streamed_plan = MakeTestPlan(stored, spec);
    std::vector<std::unique_ptr<CpuDevice>> kept_devs =
        MakeDevices(gpus, kept_plan.memory.gpu.total());
    // Random delays (0-1 ms) in every stream of the streaming devices: an image is packed again
    // only once its last upload is done.
    std::vector<std::unique_ptr<CpuDevice>> streamed_devs =
        MakeDevices(gpus, streamed_plan.memory.gpu.total(), 1000, 7);
    ActivationStore kept_store, streamed_store;
    Result<std::unique_ptr<PipelineExecutor>> kept =
        CreateExecutor(kept_devs, m, kept_plan, kept_store);
    Result<std::unique_ptr<PipelineExecutor>> streamed =
        CreateExecutor(streamed_devs, m, streamed_plan, streamed_store);
    ASSERT_TRUE(kept.ok()) << kept.status().ToString();
    ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
    const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
    // Each executor's master copy, whose adapters a weights_read hook changes as an update that
    // waits for the step's reads would: a range's stages must all have packed them by then (the
    // streamed backward stage packs them again), else the two runs part. Each range is reported
    // once a step.
    HostTensors kept_w = kept_base, streamed_w = served;
    std::map<std::pair<int64_t, int64_t>, int> reported;
    auto hooks_for = [&](HostTensors& master, bool count) {
      StepHooks h;
      h.weights_read = [&master, &reported, count](int64_t first, int64_t last) {
        if (count) ++reported[{first, last}];
        for (auto& [name, t] : master.tensors) {
          for (int64_t li = first; li < last; ++li) {
            if (li == 0 ||
                name.find("layers." + std::to_string(li - 1) + ".") == std::string::npos ||
                name.find("lora_") == std::string::npos) {
              continue;
            }
            for (float& v : t) v *= 1.5f;
          }
        }
        return Status::Ok();
      };
      return h;
    };
    uint64_t last_step_read = 0;
    // Each step after the first: the base's bytes read (the files' and the copy's), what the
    // reader took from the drive for them, and what the kernel counted (/proc/self/io) with no
    // page of the process read back meanwhile (else 0 kernel bytes are compared).
    std::vector<std::array<uint64_t, 3>> file_steps;
    for (int step = 0; step < 3; ++step) {
      HostTensors want = ZeroGrads(m), got = ZeroGrads(m);
      const ExecutorStats before = (*streamed)->stats();
      reported.clear();
      Result<double> kept_loss = (*kept)->Step(kept_w, b.inputs, want, hooks_for(kept_w, false));
      const uint64_t io0 = ProcIo("read_bytes"), faults0 = MajorFaults();
      Result<double> streamed_loss =
          (*streamed)->Step(streamed_w, b.inputs, got, hooks_for(streamed_w, true));
      const uint64_t io = ProcIo("read_bytes") - io0;
      const ExecutorStats after = (*streamed)->stats();
      if (step > 0) {
        file_steps.push_back({after.base_file_bytes - before.base_file_bytes,
                              after.base_bytes_from_drive - before.base_bytes_from_drive,
                              MajorFaults() == faults0 ? io : 0});
      }
      for (const auto& [range, calls] : reported) {
        EXPECT_EQ(calls, 1) << range.first << "-" << range.second << ", " << what;
      }
      EXPECT_EQ(reported.size(), spec.stages.size() + 2) << what;  // embedding, stages, head
      ExpectSameBits(kept_w, streamed_w, "the master copies, " + what);
      ASSERT_TRUE(kept_loss.ok()) << kept_loss.status().ToString();
      ASSERT_TRUE(streamed_loss.ok()) << streamed_loss.status().ToString();
      EXPECT_EQ(*streamed_loss, *kept_loss) << what << ", step " << step;
      ExpectSameBits(got, want, "with the base streamed, " + what);
      last_step_read = after.base_bytes_streamed - before.base_bytes_streamed;
      for (HostTensors* master : {&kept_w, &streamed_w}) {
        for (auto& [name, t] : master->tensors) {
          if (name.find("lora_") == std::string::npos) continue;
          for (size_t i = 0; i < t.size(); ++i) t[i] += 0.01f * float((i + size_t(step)) % 5 + 1);
        }
      }
    }
    EXPECT_GT(last_step_read, 0u) << what;
    // The base comes from the drive in whole blocks: the plan counts them from where the folder's
    // files hold its tensors (as `ferry train` plans it) and where the copy puts each weight (on
    // a block of its own), and, with O_DIRECT, the kernel counts them too in a fault-free step.
    Result<std::shared_ptr<const TensorFileLayout>> offsets =
        FolderTensorLayout(dir.path(), m.config);
    ASSERT_TRUE(offsets.ok()) << offsets.status().ToString();
    EXPECT_EQ(*offsets != nullptr, folder.has_value()) << what;
    const StreamedBaseSource source{.from_files = folder.has_value(),
                                    .files = folder.value_or(DType::kF32),
                                    .upload = DType::kBF16,
                                    .file_layout = *offsets};
    const double planned_read =
        plan::StreamedBaseBytes(layers, source, spec.stages, gpus, tail_parts);
    bool counted = false;
    for (const auto& [tensors, drive, kernel] : file_steps) {
      std::printf(
          "streamed base, %s: its tensors %llu B, read from the drive %llu B (planned %.0f B), "
          "/proc/self/io %llu B\n",
          what.c_str(), (unsigned long long)tensors, (unsigned long long)drive, planned_read,
          (unsigned long long)kernel);
      // Every byte of the base a step reads, the files' and the copy's, comes from the drive.
      EXPECT_EQ(tensors, last_step_read) << what;
      EXPECT_EQ(double(drive), planned_read) << what;
      if (kernel > 0 && DirectIoWorks(dir.path()) && DirectIoWorks(nvme.path())) {
        EXPECT_EQ(kernel, drive) << what;
        counted = true;
      }
    }
    if (DirectIoWorks(dir.path()) && DirectIoWorks(nvme.path())) {
      EXPECT_TRUE(counted) << what << ": no step was counted";
    }
    // Without the files' layout (a plan made from a config alone) the plan counts the most the
    // blocks can be.
    if (folder) {
      StreamedBaseSource unknown = source;
      unknown.file_layout = nullptr;
      EXPECT_GT(plan::StreamedBaseBytes(layers, unknown, spec.stages, gpus, tail_parts),
                planned_read)
          << what;
    }
    std::map<std::string, uint64_t> pinned, planned;
    for (const plan::Allocation& a : (*streamed)->stats().host_pinned) pinned[a.name] = a.bytes;
    for (const plan::Allocation& a : streamed_plan.memory.pinned_host.allocations) {
      planned[a.name] = a.bytes;
    }
    EXPECT_EQ(pinned, planned) << what;
    EXPECT_EQ(pinned.count("weights.upload"), 0u) << what;
    EXPECT_GT(pinned.count("weights.nvme_staging"), 0u) << what;
  }
}

// A LoRA job's frozen base streamed from NVMe (the plan's frozen weights there): each stage packs
// its device's next pinned image, the base read from the model's files (a bf16 folder) or from a
// copy converted once (MoveBaseToNvme: a base held in fp32, QLoRA's NF4 base, GPT-2's f32 files
// with transposed weights and a tied head) unless the
// device's weight slot holds it already. Over three steps, the adapters changed between them as
// updates change them, the losses and adapter gradients equal those of the base kept in the host
// mirrors, bit for bit, on two devices and on one (whose slots keep more of the base), with random
// stream delays and a weights_read hook that changes the adapters; the pinned staging is the
// plan's images, and the last step reads the plan's bytes from NVMe.
TEST(ExecutorFileBaseTest, AStreamedBaseEqualsTheBaseKeptInTheMirrors) {
  ASSERT_NO_FATAL_FAILURE(StreamBaseSteps(LoadModel("llama", 4), "files", DType::kBF16, false));
  ASSERT_NO_FATAL_FAILURE(StreamBaseSteps(LoadModel("llama", 4), "converted", {}, true));
  ASSERT_NO_FATAL_FAILURE(
      StreamBaseSteps(LoadModel("llama", 4, /*nf4=*/true), "converted nf4", {}, true, {2}));
  // GPT-2 from f32 files into bf16: its transposed and f32 weights converted, the tied head's
  // table kept in the file (the embedding adds the positions to its f32 values).
  ASSERT_NO_FATAL_FAILURE(
      StreamBaseSteps(LoadModel("gpt2", 4), "gpt2 f32 files", DType::kF32, true, {2}));
  // The tail in two parts, each packing the head's base into its device's image, on four
  // devices: stages are prepared out of step order there (the backward stage over the last
  // forward stage's layers is prefetched behind stage 0, before that forward stage packs), so a
  // range is reported read only once all of its stages have packed.
  ASSERT_NO_FATAL_FAILURE(StreamBaseSteps(LoadModel("llama", 4), "files, the tail in 2 parts",
                                          DType::kBF16, false, {4}, 2));
}

// A plan that streams the frozen base needs a base served from NVMe (the model's files or a
// converted copy): one held in RAM is refused at the step, naming a weight, never run from RAM
// against the plan.
TEST(ExecutorFileBaseTest, AStreamedPlanRefusesABaseHeldInRam) {
  const Model m = LoadModel("llama", 4);
  PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2, DType::kBF16};
  spec.base_streamed = true;
  const plan::Plan p = MakeTestPlan(m, spec);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(spec.gpus, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
  HostTensors g = ZeroGrads(m);
  Result<double> loss = (*e)->Step(RandomWeights(m, 3), b.inputs, g);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loss.status().message().find("(it is held in RAM)"), std::string::npos)
      << loss.status().ToString();

  // A plan with no buffer to read the base through (made by an older version) and a base served
  // from the model's files: refused naming a weight and the file, never read from the mappings
  // behind the plan's back.
  plan::Plan old = p;
  std::erase_if(old.memory.pageable_host.allocations,
                [](const plan::Allocation& a) { return a.name == "weights.base_read"; });
  ASSERT_EQ(old.memory.pageable_host.allocations.size() + 1,
            p.memory.pageable_host.allocations.size());
  std::vector<std::unique_ptr<CpuDevice>> older_devs =
      MakeDevices(spec.gpus, old.memory.gpu.total());
  ActivationStore older_store;
  Result<std::unique_ptr<PipelineExecutor>> older = CreateExecutor(older_devs, m, old, older_store);
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  testing::TempDir dir;
  HostTensors served;
  ASSERT_NO_FATAL_FAILURE(ServeFromFolder(m, layers, RandomWeights(m, 3), dir.path(), served));
  for (const ParamSpec* q : StorageParams(layers)) {
    if (q->lora) served.tensors[q->name] = RandomWeights(m, 3).tensors.at(q->name);
  }
  loss = (*older)->Step(served, b.inputs, g);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(loss.status().message().find("model.safetensors: re-plan with this version"),
            std::string::npos)
      << loss.status().ToString();
  // The same base through the plan's buffer runs.
  loss = (*e)->Step(served, b.inputs, g);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();

  // So with QLoRA's NF4 base in a copy converted on NVMe.
  const Model q = LoadModel("llama", 4, /*nf4=*/true);
  plan::Plan q_old = MakeTestPlan(q, spec);
  std::erase_if(q_old.memory.pageable_host.allocations,
                [](const plan::Allocation& a) { return a.name == "weights.base_read"; });
  std::vector<std::unique_ptr<CpuDevice>> q_devs = MakeDevices(spec.gpus, q_old.memory.gpu.total());
  ActivationStore q_store;
  Result<std::unique_ptr<PipelineExecutor>> q_older = CreateExecutor(q_devs, q, q_old, q_store);
  ASSERT_TRUE(q_older.ok()) << q_older.status().ToString();
  HostTensors q_weights = RandomWeights(q, 3);
  testing::TempDir nvme;
  Result<ConvertedBase> moved = MoveBaseToNvme(BuildLayerSpecs(q.config, q.lora), DType::kBF16,
                                               DType::kF32, nvme.path(), q_weights);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  ASSERT_FALSE(q_weights.nf4_served.empty());
  // Only the NF4 weights keep their place in the copy, so they are the ones refused.
  for (auto& [name, t] : q_weights.files) t.offset = -1;
  HostTensors q_grads = ZeroGrads(q);
  loss = (*q_older)->Step(q_weights, b.inputs, q_grads);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(loss.status().message().find("(the frozen base in bf16): re-plan with this version"),
            std::string::npos)
      << loss.status().ToString();
}

// QLoRA from a model folder: each NF4 weight is made from the file when its stage is packed
// (HostTensors::nf4_served: quantized from a bf16 file, or read as a pre-quantized folder would
// be), never held. Over two steps of one executor (the second reuses the mirrors' base and makes
// nothing) it gives the losses and adapter gradients of the same NF4 weights held in RAM, bit for
// bit, and a changed adapter is still picked up.
TEST(ExecutorFileBaseTest, AnNf4BaseMadeWhenPackedEqualsTheSameBaseHeld) {
  const Model m = LoadModel("llama", 4, /*nf4=*/true);
  const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2, DType::kBF16};
  const plan::Plan p = MakeTestPlan(m, spec);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  HostTensors random = RandomWeights(m, 29);
  testing::TempDir dir;
  HostTensors served;
  ASSERT_NO_FATAL_FAILURE(ServeFromFolder(m, layers, random, dir.path(), served));
  EXPECT_TRUE(served.nf4.empty());
  HostTensors held = served;  // the same weights, each made once and kept
  size_t made = 0;
  for (const ParamSpec* q : StorageParams(layers)) {
    if (q->lora) {
      served.tensors[q->name] = random.tensors.at(q->name);
      for (float& v : served.tensors[q->name]) v += 0.01f;  // B starts at zero: make it count
      held.tensors[q->name] = served.tensors[q->name];
    }
    if (!q->nf4) continue;
    ASSERT_TRUE(served.nf4_served.contains(q->name)) << q->name;
    Nf4Host one;
    Result<const Nf4Host*> r = served.FindNf4(q->name, one);
    ASSERT_TRUE(r.ok() && *r != nullptr) << q->name;
    held.nf4[q->name] = **r;
    held.nf4_served.erase(q->name);
    ++made;
  }
  ASSERT_EQ(made, size_t(7 * m.config.num_layers));
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(spec.gpus, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const int64_t ranges = int64_t(spec.stages.size()) + 1;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {  // a changed adapter, as after an update
      for (HostTensors* w : {&served, &held}) {
        for (auto& [name, t] : w->tensors) {
          if (name.find("lora_") != std::string::npos) t[0] += 0.25f;
        }
      }
    }
    HostTensors got = ZeroGrads(m), want = ZeroGrads(m);
    Result<double> loss = (*e)->Step(served, b.inputs, got);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    EXPECT_EQ((*e)->stats().frozen_packs_skipped, step * ranges) << "step " << step;
    EXPECT_TRUE(std::isfinite(*loss));
    EXPECT_EQ(*loss, ExecutorStep(m, p, spec.gpus, held, b, want)) << "step " << step;
    ExpectSameBits(got, want, "an NF4 base made when packed, step " + std::to_string(step));
  }
}

// An evaluation over a whole base served from the model's files (as `ferry eval` loads one)
// packs it into the host mirrors once: later evaluations with the same weights object keep it
// (frozen_packs_skipped counts each range), and give the losses of the base read into fp32.
TEST(ExecutorFileBaseTest, EvaluationsKeepTheServedBasePacked) {
  const Model m = LoadModel("llama");
  const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2, DType::kF32, /*forward_only=*/true};
  const plan::Plan p = MakeTestPlan(m, spec);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  testing::TempDir dir;
  ModelFolderWriteOptions as;
  as.dtype = DType::kBF16;
  ASSERT_TRUE(WriteModelFolder(dir.path(), m.config, layers, RandomWeights(m, 4), as).ok());
  Result<FolderWeights> folder = FolderWeights::Open(dir.path());
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  HostTensors served, read;
  ASSERT_TRUE(LoadBaseWeights(*folder, m.config, layers, served, {}, ServedBase::kAll).ok());
  ASSERT_TRUE(LoadBaseWeights(*folder, m.config, layers, read).ok());
  ASSERT_TRUE(served.tensors.empty());
  ASSERT_TRUE(read.files.empty());
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 31);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(spec.gpus, p.memory.gpu.total());
  Result<std::unique_ptr<PipelineExecutor>> from_files =
      PipelineExecutor::Create(Raw(devs), m.config, p);
  ASSERT_TRUE(from_files.ok()) << from_files.status().ToString();
  std::vector<std::unique_ptr<CpuDevice>> devs2 = MakeDevices(spec.gpus, p.memory.gpu.total());
  Result<std::unique_ptr<PipelineExecutor>> from_ram =
      PipelineExecutor::Create(Raw(devs2), m.config, p);
  ASSERT_TRUE(from_ram.ok()) << from_ram.status().ToString();
  const int64_t ranges = int64_t(spec.stages.size()) + 1;
  for (int call = 0; call < 3; ++call) {
    Result<double> got = (*from_files)->Evaluate(served, b.inputs);
    Result<double> want = (*from_ram)->Evaluate(read, b.inputs);
    ASSERT_TRUE(got.ok() && want.ok()) << got.status().ToString() << want.status().ToString();
    EXPECT_EQ(*got, *want) << "call " << call;
    EXPECT_EQ((*from_files)->stats().frozen_packs_skipped, call * ranges) << "call " << call;
    EXPECT_EQ((*from_ram)->stats().frozen_packs_skipped, 0) << "fp32 weights are packed each call";
  }
}

// Random delays of 0-2 ms before every stream task (the CPU device's race detector), on five
// seeds, leave the results bit for bit unchanged and do not deadlock: every copy is ordered
// against the compute that reads or writes its buffer, and every hand-off between devices is an
// event.
// A LoRA job, and a full one with the tail split over the three devices (each part's head
// gradients landing apart while the backward stages read the parts' outputs) and two gradient
// accumulators per device (a stage's accumulating racing the download of the one before).
TEST(ExecutorRaceTest, RandomStreamDelaysChangeNothing) {
  for (const auto& [rank, accumulators] : {std::pair{2, 1}, {0, 1}, {0, 2}}) {
    const Model m = LoadModel("llama", rank);
    PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {2}, 3, 2, 16, 3};
    if (rank == 0) spec.tail_parts = 3;
    spec.grad_accumulators = accumulators;
    const plan::Plan p = MakeTestPlan(m, spec);
    const HostTensors w = RandomWeights(m, 9);
    const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 4);
    HostTensors plain = ZeroGrads(m);
    const double want = ExecutorStep(m, p, 3, w, b, plain);
    constexpr int kSeeds = 5;
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      HostTensors delayed = ZeroGrads(m);
      const std::string what = "rank " + std::to_string(rank) + ", " +
                               std::to_string(accumulators) +
                               " accumulator(s), with delays, seed " + std::to_string(seed);
      EXPECT_EQ(ExecutorStep(m, p, 3, w, b, delayed, 2000, seed), want) << what;
      ExpectSameBits(delayed, plain, what);
    }
  }
}

// The same with the saved activations on NVMe and the store's completions delayed too (0-2 ms,
// three seeds): the host-RAM run's bits, no deadlock. Every read waits for its entry's write and
// every staging slot's reuse for its last transfer.
TEST(ExecutorRaceTest, RandomStreamAndDiskDelaysChangeNothingWithActivationsOnNvme) {
  const Model m = LoadModel("llama", 2);
  PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {2}, 3, 2, 16, 3};
  const HostTensors w = RandomWeights(m, 9);
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 4);
  HostTensors plain = ZeroGrads(m);
  const double want = ExecutorStep(m, MakeTestPlan(m, spec), 3, w, b, plain);
  spec.activations_on_nvme = true;
  const plan::Plan p = MakeTestPlan(m, spec);
  constexpr int kSeeds = 3;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    ferry::testing::DelayingEnv env(2000, seed);
    HostTensors delayed = ZeroGrads(m);
    EXPECT_EQ(ExecutorStep(m, p, 3, w, b, delayed, 2000, seed, &env), want) << "seed " << seed;
    ExpectSameBits(delayed, plain, "on NVMe with delays, seed " + std::to_string(seed));
  }
}

// Only a concurrent executor passes. Two stages on two devices: device 0 runs forward stage 0, the
// tail and backward stage 0; device 1 forward stage 1 and backward stage 1. Once forward stage 0
// is enqueued, the test holds device 0's compute stream behind it. Then device 1 must run forward
// stage 1 to its end (it needs only stage 0's downloads), and device 0 must meanwhile copy the
// tail's weights into its free slot (they depend on nothing the held stream still has to do).
// After the gate opens the step ends with the bits of a one-device run. A serial executor, which
// waits for each stage's end before enqueuing the next, never enqueues stage 1: the test fails
// after its deadline with the message below, then opens the gate so the step can finish.
TEST(ExecutorConcurrencyTest, DeviceOneRunsAndDeviceZeroPrefetchesWhileDeviceZeroIsHeld) {
  const Model m = LoadModel("llama");
  const PlanSpec spec{{{1, 3}, {3, 5}}, {4}, 3, 2, 16, 2};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 17);
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 19);
  HostTensors want = ZeroGrads(m);
  const double want_loss = ExecutorStep(m, p, 1, w, b, want);

  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
  testing::Gate gate;
  testing::Signal stage1_done;
  Result<Event> tail_weights = devs[0]->CreateEvent();
  ASSERT_TRUE(tail_weights.ok());
  std::atomic<bool> tail_weights_recorded{false};
  constexpr int64_t kForward1 = 1, kTail = 2;
  auto observe = [&](Enqueued what, int64_t stage, Device& d) {
    Status s;
    if (what == Enqueued::kStage && stage == 0) {
      s = d.LaunchHostFunc(StreamId::kCompute, [&] { return gate.Pass(); });
    } else if (what == Enqueued::kStage && stage == kForward1) {
      s = d.LaunchHostFunc(StreamId::kCompute, [&] {
        stage1_done.Set();
        return Status::Ok();
      });
    } else if (what == Enqueued::kWeights && stage == kTail) {
      s = d.Record(*tail_weights, StreamId::kUpload);
      tail_weights_recorded = true;
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
  };
  Result<std::unique_ptr<PipelineExecutor>> e =
      PipelineExecutor::Create(Raw(devs), m.config, p, observe);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  HostTensors got = ZeroGrads(m);
  Result<double> loss = Status::Internal("the step did not run");
  std::thread stepper([&] { loss = (*e)->Step(w, b.inputs, got); });

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const bool held = gate.reached.WaitUntil(deadline);
  const bool ran = stage1_done.WaitUntil(deadline);
  bool prefetched = false;
  while (!prefetched && std::chrono::steady_clock::now() < deadline) {
    if (tail_weights_recorded) {
      Result<bool> done = devs[0]->Query(*tail_weights);
      prefetched = done.ok() && *done;
    }
    if (!prefetched) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  gate.Open();
  stepper.join();
  EXPECT_TRUE(held) << "device 0 never finished forward stage 0";
  EXPECT_TRUE(ran) << "device 1 did not run forward stage 1 within 20 s while device 0's compute "
                      "stream was held: the executor does not run devices concurrently";
  EXPECT_TRUE(prefetched) << "device 0 did not copy the tail's weights within 20 s while its "
                             "compute stream was held: no prefetch into the free weight slot";
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ(*loss, want_loss);
  ExpectSameBits(got, want, "after the held step");
}

// The single-device reference runner for micro-batches of batch x seq_len (the reference the
// pipeline is compared with), with its device; runner is null (and the test failed) when it cannot
// be made.
struct SingleDevice {
  std::vector<std::unique_ptr<CpuDevice>> device;
  std::unique_ptr<ModelRunner> runner;
};
SingleDevice MakeSingleDevice(const Model& m, int64_t batch, int64_t seq_len) {
  SingleDevice s;
  s.device = MakeDevices(1, size_t(64) << 20);
  ReferenceRunnerOptions ro;
  ro.shape = {batch, seq_len};
  Result<std::unique_ptr<ModelRunner>> r =
      CreateReferenceRunner(*s.device[0], m.config, m.lora, ro);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) s.runner = std::move(*r);
  return s;
}

// `count` steps of spec.micro_batches micro-batches each (the same batches every step: the
// comparisons below are about the updates, not the data).
std::vector<std::vector<MicroBatch>> TrainingSteps(const Model& m, const PlanSpec& spec,
                                                   int count) {
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < count; ++s) {
    Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 100);
    std::vector<MicroBatch> mbs;
    for (int i = 0; i < spec.micro_batches; ++i) {
      MicroBatch mb{spec.batch, spec.seq_len, b.tokens[size_t(i)], b.targets[size_t(i)], 0};
      for (int32_t t : mb.targets) mb.valid_targets += t != kIgnoreIndex;
      mbs.push_back(std::move(mb));
    }
    steps.push_back(std::move(mbs));
  }
  return steps;
}

// The same global batch each step, so the loss must fall (the comparison is not moot).
// Tolerance: the gradients differ by reassociation only (see MatchesSingleDeviceRunner, a few eps
// of each tensor's largest gradient). AdamW normalizes each element by its own sqrt(v), so an
// element whose gradient is near that noise level can see a relative difference of its update
// far above eps, but an update never exceeds ~lr (1e-2) per step: weights within 1e-4 (1% of one
// step; measured worst 2.4e-5, a GPT-2 bias with a near-zero gradient). The first loss is computed
// from identical weights (1e-12 relative: the per-micro-batch sums are the same), later ones
// within 1e-5 relative.
class PipelineTrainerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PipelineTrainerTest, ThreeStepsMatchTheSingleDeviceTrainer) {
  const Model m = LoadModel(GetParam());
  const PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {3}, 3, 2, 16, 3};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 21);
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 3, 0.1};
  o.weight_decay = 0.01;
  o.grad_clip = 1.0;
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 3);
  auto train = [&](ModelRunner* runner, std::vector<double>& losses) -> HostTensors {
    auto t = Trainer::Create(runner, BuildLayerSpecs(m.config, m.lora), w, o, nullptr);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    for (const auto& mbs : steps) {
      Result<StepStats> st = (*t)->Step(mbs);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      losses.push_back(st.ok() ? st->loss : NAN);
    }
    const Status finished = (*t)->FinishUpdates();
    EXPECT_TRUE(finished.ok()) << finished.ToString();
    return (*t)->weights();
  };
  std::vector<std::unique_ptr<CpuDevice>> one = MakeDevices(1, size_t(64) << 20);
  ReferenceRunnerOptions ro;
  ro.shape = {spec.batch, spec.seq_len};
  Result<std::unique_ptr<ModelRunner>> single =
      CreateReferenceRunner(*one[0], m.config, m.lora, ro);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  std::vector<double> want_losses, got_losses;
  const HostTensors want = train(single->get(), want_losses);

  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(3, p.memory.gpu.total());
  Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(devs), m.config, p);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  const HostTensors got = train(pipe->get(), got_losses);
  ASSERT_EQ(got_losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(got_losses[s], want_losses[s], (s == 0 ? 1e-12 : 1e-5) * std::abs(want_losses[s]))
        << "step " << s;
  }
  EXPECT_GT(want_losses[0], want_losses[2]);  // it learns something: the comparison is not moot
  for (const auto& [name, x] : want.tensors) {
    const std::vector<float>& y = got.tensors.at(name);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(y[i], x[i], 1e-4) << name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineTrainerTest, ::testing::Values("llama", "gpt2"));

// A runner that passes what the tests below do not change to another one.
class ForwardingRunner : public ModelRunner {
 public:
  explicit ForwardingRunner(ModelRunner* r) : r_(r) {}
  Result<double> AccumulateGradients(const MicroBatchInput& mb, HostTensors& grads) override {
    return r_->AccumulateGradients(mb, grads);
  }
  Result<std::vector<float>> Logits(std::span<const int32_t> tokens) override {
    return r_->Logits(tokens);
  }
  RunnerStats stats() const override { return r_->stats(); }

 protected:
  ModelRunner* r_;
};

// A runner over a pipeline runner that hides its streaming: the Trainer then takes the norm and
// updates every parameter after the whole step, then uploads (the whole-step order), the
// reference the per-layer updates must equal bit for bit.
class WholeStepRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  Status UploadWeights(const HostTensors& w) override {
    copy_ = w;
    return r_->UploadWeights(copy_);
  }
  Result<double> AccumulateStep(std::span<const MicroBatchInput> batches, HostTensors& grads,
                                const StepHooks&) override {
    return r_->AccumulateStep(batches, grads, {});
  }

 private:
  HostTensors copy_;
};

// A streaming runner that watches the hooks the Trainer gives the pipeline: what was pending when
// each stage's weights were read, and whether a landed layer's weights changed within the step.
class HookSpy final : public ForwardingRunner {
 public:
  HookSpy(ModelRunner* r, std::string watched)
      : ForwardingRunner(r), watched_(std::move(watched)) {}
  const Trainer* trainer = nullptr;
  std::vector<std::string> log;  // "need a-b pending|none", "landed a-b"
  // In the first step (nothing pending from an earlier one): whether the watched parameter was
  // updated before the step ended.
  bool watched_changed_in_first_step = false;

  Status UploadWeights(const HostTensors& w) override {
    w_ = &w;
    return r_->UploadWeights(w);
  }
  bool streams_weights() const override { return true; }
  Result<double> AccumulateStep(std::span<const MicroBatchInput> batches, HostTensors& grads,
                                const StepHooks& hooks) override {
    const std::vector<float> before = w_->tensors.at(watched_);
    const bool first = steps_++ == 0;
    StepHooks spy;
    spy.weights_needed = [&](int64_t a, int64_t b) {
      Status st = hooks.weights_needed(a, b);
      log.push_back("need " + std::to_string(a) + "-" + std::to_string(b) +
                    (trainer->updates_pending() ? " pending" : " none"));
      return st;
    };
    spy.grads_landed = [&](int64_t a, int64_t b) {
      Status st = hooks.grads_landed(a, b);
      log.push_back("landed " + std::to_string(a) + "-" + std::to_string(b));
      // Read before the step ends: the runner is still running later (earlier) stages.
      if (first && w_->tensors.at(watched_) != before) watched_changed_in_first_step = true;
      return st;
    };
    return r_->AccumulateStep(batches, grads, spy);
  }

 private:
  std::string watched_;
  const HostTensors* w_ = nullptr;
  int steps_ = 0;
};

struct PerLayerCase {
  const char* model;
  int lora_rank;
  double grad_clip;
  int tail_parts = 1;  // the head's gradients land once its last part has
};

class PerLayerOptimizerTest : public ::testing::TestWithParam<PerLayerCase> {};

// The optimizer per layer inside the step (without clipping: as each layer's gradients land;
// with clipping: in the next step, just before each stage reads its layers) gives the whole-step
// order's losses, weights and moments bit for bit over four steps, on 2 devices and 3 stages.
TEST_P(PerLayerOptimizerTest, EqualsTheWholeStepOrderBitForBit) {
  const PerLayerCase c = GetParam();
  const Model m = LoadModel(c.model, c.lora_rank);
  PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {3}, 2, 2, 16, 2};
  spec.tail_parts = c.tail_parts;
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 5);
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 4, 0.1};
  o.weight_decay = 0.01;
  o.grad_clip = c.grad_clip;
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 4);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  // The last block's first trainable parameter: it lands with the first backward stage.
  std::string watched;
  for (const ParamSpec& q : layers[layers.size() - 2].params) {
    if (q.trainable && q.tied_to.empty() && watched.empty()) watched = q.name;
  }
  ASSERT_FALSE(watched.empty());

  struct Run {
    std::vector<double> losses, norms;
    std::unique_ptr<Trainer> trainer;
  };
  auto train = [&](ModelRunner* runner, HookSpy* spy) {
    Run r;
    auto t = Trainer::Create(runner, layers, w, o, nullptr);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return r;
    r.trainer = std::move(*t);
    if (spy != nullptr) spy->trainer = r.trainer.get();
    for (const auto& mbs : steps) {
      Result<StepStats> st = r.trainer->Step(mbs);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      r.losses.push_back(st.ok() ? st->loss : NAN);
      r.norms.push_back(st.ok() ? st->grad_norm : NAN);
      EXPECT_EQ(r.trainer->updates_pending(), spy != nullptr && c.grad_clip > 0);
    }
    const Status finished = r.trainer->FinishUpdates();
    EXPECT_TRUE(finished.ok()) << finished.ToString();
    EXPECT_FALSE(r.trainer->updates_pending());
    return r;
  };
  std::vector<std::unique_ptr<CpuDevice>> d1 = MakeDevices(2, p.memory.gpu.total());
  Result<std::unique_ptr<ModelRunner>> p1 = CreatePipelineRunner(Raw(d1), m.config, p);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  WholeStepRunner whole(p1->get());
  const Run want = train(&whole, nullptr);

  std::vector<std::unique_ptr<CpuDevice>> d2 = MakeDevices(2, p.memory.gpu.total());
  Result<std::unique_ptr<ModelRunner>> p2 = CreatePipelineRunner(Raw(d2), m.config, p);
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  HookSpy spy(p2->get(), watched);
  const Run got = train(&spy, &spy);
  ASSERT_TRUE(want.trainer && got.trainer);

  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_GT(want.losses[0], want.losses[3]);  // it learns: the comparison is not moot
  for (const std::string& name : want.trainer->trainable_names()) {
    EXPECT_EQ(got.trainer->weights().tensors.at(name), want.trainer->weights().tensors.at(name))
        << name;
    const std::span<const float> m0 = want.trainer->exp_avg(name), m1 = got.trainer->exp_avg(name);
    const std::span<const float> v0 = want.trainer->exp_avg_sq(name),
                                 v1 = got.trainer->exp_avg_sq(name);
    EXPECT_TRUE(std::equal(m0.begin(), m0.end(), m1.begin(), m1.end())) << name;
    EXPECT_TRUE(std::equal(v0.begin(), v0.end(), v1.begin(), v1.end())) << name;
  }
  // How the updates interleaved with the steps.
  EXPECT_EQ(spy.watched_changed_in_first_step, c.grad_clip == 0) << watched;
  std::string log;
  for (const std::string& e : spy.log) log += e + "; ";
  // Every step announces the embedding's read, then each stage's, and reports the tail's and the
  // backward stages' gradients in reverse order, the embedding's last.
  const std::string landed = "landed 5-6; landed 4-5; landed 2-4; landed 1-2; landed 0-1; ";
  EXPECT_NE(log.find(landed), std::string::npos) << log;
  if (c.grad_clip > 0) {
    // From the second step on, the first stage's weights are read while later layers' updates
    // are still pending (they run as later stages are prepared).
    EXPECT_NE(log.find(landed + "need 0-1 pending; need 1-2 pending;"), std::string::npos) << log;
  } else {
    EXPECT_EQ(log.find("pending"), std::string::npos) << log;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PerLayerOptimizerTest,
                         ::testing::Values(PerLayerCase{"llama", 0, 1.0},
                                           PerLayerCase{"llama", 0, 0.0},
                                           PerLayerCase{"qwen3", 0, 1.0},  // tied head
                                           PerLayerCase{"gpt2", 0, 0.0},   // tied, biases
                                           PerLayerCase{"qwen3", 2, 0.5},  // LoRA
                                           PerLayerCase{"llama", 0, 0.0, 2},
                                           PerLayerCase{"qwen3", 0, 1.0, 2}),
                         [](const ::testing::TestParamInfo<PerLayerCase>& i) {
                           return std::string(i.param.model) +
                                  (i.param.lora_rank > 0 ? "_lora" : "") +
                                  (i.param.grad_clip > 0 ? "_clip" : "_noclip") +
                                  (i.param.tail_parts > 1 ? "_tail2" : "");
                         });

// torch.optim.AdamW's element update on fp32 tensors, written out here from its definition
// (every scalar computed in double and rounded to fp32 once, each tensor operation correctly
// rounded), independently of ferry's kernels.
void ReferenceAdamW(std::vector<float>& p, const std::vector<float>& grad, std::vector<float>& m,
                    std::vector<float>& v, double lr, double wd, const OptimizerOptions& o,
                    int64_t step, double grad_scale) {
  const float scale = float(grad_scale), decay = float(1 - lr * wd), a = float(1 - o.beta1);
  const float b2 = float(o.beta2), c2 = float(1 - o.beta2);
  const float bc2 = float(std::sqrt(1 - std::pow(o.beta2, double(step)))), eps = float(o.eps);
  const float step_size = float(-lr / (1 - std::pow(o.beta1, double(step))));
  for (size_t i = 0; i < p.size(); ++i) {
    const float g = grad[i] * scale;
    if (wd != 0) p[i] = p[i] * decay;
    m[i] = std::fma(a, g - m[i], m[i]);
    v[i] = v[i] * b2 + (c2 * g) * g;
    const float d = std::sqrt(v[i]) / bc2 + eps;
    p[i] = p[i] + (step_size * m[i]) / d;
  }
}

struct StaleCase {
  const char* model;
  double grad_clip;
  int lora_rank = 0;
  int devices = 2;  // as many stages
};

class StaleUpdatesTest : public ::testing::TestWithParam<StaleCase> {};

// --stale-updates on a 2-stage pipeline over 2 devices (or 3 over 3) equals a reference stale AdamW
// over the single-device runner (one micro-batch: the same gradients bit for bit): step k runs on
// w_{k-1} (the first two on w_0), and w_{k+1} = AdamW(w_k, g(w_{k-1})). Losses and final
// weights are compared bit for bit over five steps; the stale run also differs from the
// synchronous one. Every step after the first takes its first stage's weights read ahead at the
// step before's end. A second stale run calls FinishUpdates after the second step (as a
// checkpoint does): the third step then runs on the newest weights, and reads nothing ahead.
TEST_P(StaleUpdatesTest, EqualsAReferenceStaleAdamW) {
  const StaleCase c = GetParam();
  const Model m = LoadModel(c.model, c.lora_rank);
  PlanSpec spec{{{1, 3}, {3, 5}}, {2}, 1};
  if (c.devices == 3) spec = {.stages = {{1, 2}, {2, 4}, {4, 5}}, .recomputed = {2}, .gpus = 3};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w0 = RandomWeights(m, 17);
  OptimizerOptions o;
  o.schedule = {2e-2, 1, 5, 0.1};
  o.weight_decay = 0.05;
  o.grad_clip = c.grad_clip;
  constexpr int kSteps = 5, kSyncAfter = 2;
  // The same batch every step: losses compare across steps.
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, kSteps);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);

  // The reference, synchronized after `sync_after` steps (0: never): R is what a step reads, W
  // the newest weights.
  struct Run {
    std::vector<double> losses;
    HostTensors weights;
    int64_t read_ahead = 0;
  };
  auto reference = [&](int sync_after) {
    Run r;
    HostTensors R = w0, W = w0, mom1, mom2;
    SingleDevice one = MakeSingleDevice(m, spec.batch, spec.seq_len);
    EXPECT_TRUE(one.runner);
    if (!one.runner) return r;
    std::vector<const ParamSpec*> trainable;
    for (const ParamSpec* q : StorageParams(layers)) {
      if (!q->trainable) continue;
      trainable.push_back(q);
      mom1.tensors[q->name].assign(size_t(q->numel()), 0.0f);
      mom2.tensors[q->name].assign(size_t(q->numel()), 0.0f);
    }
    for (int k = 0; k < kSteps; ++k) {
      if (k > 0 && k == sync_after) R = W;
      EXPECT_TRUE(one.runner->UploadWeights(R).ok());
      HostTensors g = ZeroGrads(m);
      const MicroBatch& mb = steps[size_t(k)][0];
      Result<double> loss =
          one.runner->AccumulateGradients(RunnerInput(mb, double(mb.valid_targets)), g);
      EXPECT_TRUE(loss.ok()) << loss.status().ToString();
      r.losses.push_back(loss.ok() ? *loss : NAN);
      double sum_sq = 0;
      for (const ParamSpec* q : trainable) {
        for (float x : g.tensors.at(q->name)) sum_sq += double(x) * x;
      }
      const double coef = ClipCoefficient(sum_sq, o.grad_clip);
      R = W;
      for (const ParamSpec* q : trainable) {
        ReferenceAdamW(W.tensors.at(q->name), g.tensors.at(q->name), mom1.tensors.at(q->name),
                       mom2.tensors.at(q->name), o.schedule.At(k), q->decays ? o.weight_decay : 0,
                       o, k + 1, coef);
      }
    }
    r.weights = W;
    return r;
  };

  auto train = [&](bool stale, int sync_after) {
    Run r;
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(c.devices, p.memory.gpu.total());
    Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(devs), m.config, p);
    EXPECT_TRUE(pipe.ok()) << pipe.status().ToString();
    if (!pipe.ok()) return r;
    OptimizerOptions so = o;
    so.stale_updates = stale;
    auto t = Trainer::Create(pipe->get(), layers, w0, so, nullptr);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return r;
    for (int k = 0; k < kSteps; ++k) {
      if (k > 0 && k == sync_after) {
        EXPECT_TRUE((*t)->FinishUpdates().ok());
      }
      Result<StepStats> st = (*t)->Step(steps[size_t(k)]);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      r.losses.push_back(st.ok() ? st->loss : NAN);
    }
    EXPECT_TRUE((*t)->FinishUpdates().ok());
    r.weights = (*t)->weights();
    r.read_ahead = (*pipe)->stats().stages_read_ahead;
    return r;
  };
  const Run want = reference(0), want_synced = reference(kSyncAfter);
  const Run got = train(true, 0), got_synced = train(true, kSyncAfter), sync = train(false, 0);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.losses[0], sync.losses[0]);
  EXPECT_EQ(got.losses[1], got.losses[0]);   // the second step runs on the initial weights too
  EXPECT_NE(got.losses[1], sync.losses[1]);  // stale is not synchronous
  EXPECT_GT(got.losses[0], got.losses[4]);   // and it learns
  EXPECT_EQ(got_synced.losses, want_synced.losses);
  EXPECT_NE(got_synced.losses[kSyncAfter], got.losses[kSyncAfter]);
  for (const auto& [name, x] : want.weights.tensors) {
    EXPECT_EQ(got.weights.tensors.at(name), x) << name;
    EXPECT_EQ(got_synced.weights.tensors.at(name), want_synced.weights.tensors.at(name)) << name;
  }
  EXPECT_EQ(got.read_ahead, kSteps - 1);
  EXPECT_EQ(got_synced.read_ahead, kSteps - 2);
  EXPECT_EQ(sync.read_ahead, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, StaleUpdatesTest,
                         ::testing::Values(StaleCase{"llama", 1.0}, StaleCase{"llama", 0.0},
                                           StaleCase{"qwen3", 0.5},  // tied: read twice a step
                                           StaleCase{"llama", 1.0, 4, 3}),  // LoRA, 3 devices
                         [](const ::testing::TestParamInfo<StaleCase>& i) {
                           return std::string(i.param.model) +
                                  (i.param.grad_clip > 0 ? "_clip" : "_noclip") +
                                  (i.param.lora_rank > 0 ? "_lora" : "") +
                                  (i.param.devices != 2
                                       ? "_" + std::to_string(i.param.devices) + "_devices"
                                       : "");
                         });

// Stale updates need the pipeline's per-layer reads: with a single-device runner they are
// refused, saying what to use.
TEST(StaleUpdatesTest, RefusedWithARunnerThatHoldsItsWeights) {
  const Model m = LoadModel("llama");
  std::vector<std::unique_ptr<CpuDevice>> one = MakeDevices(1, size_t(64) << 20);
  ReferenceRunnerOptions ro;
  ro.shape = {2, 16};
  Result<std::unique_ptr<ModelRunner>> runner =
      CreateReferenceRunner(*one[0], m.config, m.lora, ro);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  OptimizerOptions o;
  o.stale_updates = true;
  auto t = Trainer::Create(runner->get(), BuildLayerSpecs(m.config, m.lora), RandomWeights(m, 1), o,
                           nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("reads the weights during the step"), std::string::npos)
      << t.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecutorTest,
    ::testing::Values(
        // Llama, 3 devices, three uneven stages, one block recomputed, three micro-batches.
        Case{"llama", 0, {{{1, 2}, {2, 4}, {4, 5}}, {2}, 3}, 3},
        // Llama, one micro-batch, two stages on two devices: bit-identical to the runner.
        Case{"llama", 0, {{{1, 3}, {3, 5}}, {}, 1}, 2},
        // Qwen3 (q/k norms, tied): every block recomputed, two micro-batches, 2 devices.
        Case{"qwen3", 0, {{{1, 3}, {3, 5}}, {1, 2, 3, 4}, 2}, 2},
        // GPT-2 (tied, learned positions): one block per stage, four micro-batches, 3 devices.
        Case{"gpt2", 0, {{{1, 2}, {2, 3}, {3, 4}, {4, 5}}, {3}, 4}, 3},
        // Llama with LoRA on every projection (frozen head: no dW at all), two micro-batches.
        Case{"llama", 4, {{{1, 3}, {3, 5}}, {4}, 2}, 2},
        // Awkward sizes: 1 x 25 tokens (no tensor a multiple of the alignment), LoRA rank 3, a
        // one-block stage then a three-block one, 2 micro-batches on 3 devices.
        Case{"qwen3", 3, {{{1, 2}, {2, 5}}, {3}, 2, 1, 25}, 3},
        Case{"gpt2", 0, {{{1, 4}, {4, 5}}, {1}, 3, 1, 25}, 2},
        // Packed rows (documents of ~6 tokens, doc ids and positions per micro-batch): Llama
        // (RoPE positions on the device), GPT-2 (learned positions on the host), and Qwen3 with
        // LoRA, each against the single-device runner on the same packed batches.
        Case{"llama", 0, {{{1, 2}, {2, 5}}, {3}, 3}, 2, true},
        Case{"gpt2", 0, {{{1, 3}, {3, 5}}, {2}, 2}, 3, true},
        Case{"qwen3", 2, {{{1, 3}, {3, 5}}, {}, 2}, 2, true},
        // Llama 3 RoPE scaling (the device's "rope.inv_freq" holds the scaled table), plain rows
        // (one micro-batch: bit-identical) and packed rows.
        Case{"llama3_rope", 0, {{{1, 3}, {3, 5}}, {}, 1}, 2},
        Case{"llama3_rope", 0, {{{1, 2}, {2, 4}, {4, 5}}, {2}, 2}, 3, true},
        // QLoRA: Llama's block projections in NF4 (dequantized into the blocks' scratch for
        // each product), LoRA on every projection, a recomputed block; and Qwen3 (q/k norms,
        // tied) at awkward sizes (25 tokens, rank 3).
        Case{"llama", 4, {{{1, 3}, {3, 5}}, {2}, 2}, 2, false, true},
        Case{"qwen3", 3, {{{1, 2}, {2, 5}}, {3}, 2, 1, 25}, 3, false, true}),
    CaseName);

// The tail's micro-batches split over devices (plan.tail_parts): each part uploads the head,
// runs its share of the micro-batches, lands its gradients in a buffer of its own and adds them
// on the host, and the first backward stage reads each micro-batch from the part that ran it.
// The head's gradient sums reassociate (tolerance as with several micro-batches). Parts on
// every device and fewer parts than devices; full (Llama), tied heads (Qwen3; GPT-2 with packed
// rows), LoRA (a frozen head: parts without gradients), bf16, activations on NVMe.
Case SplitTail(Case c, int parts) {
  c.spec.tail_parts = parts;
  return c;
}
INSTANTIATE_TEST_SUITE_P(
    SplitTailPlans, ExecutorTest,
    ::testing::Values(
        SplitTail(Case{"llama", 0, {{{1, 2}, {2, 4}, {4, 5}}, {2}, 4}, 3}, 3),
        SplitTail(Case{"qwen3", 0, {{{1, 3}, {3, 5}}, {1}, 3}, 2}, 2),
        SplitTail(Case{"gpt2", 0, {{{1, 3}, {3, 5}}, {2}, 3}, 3, true}, 2),
        SplitTail(Case{"llama", 4, {{{1, 3}, {3, 5}}, {4}, 2}, 2}, 2),
        SplitTail(Case{"llama", 4, {{{1, 2}, {2, 3}, {3, 5}}, {}, 2, 2, 16, 4, DType::kBF16}, 4},
                  2),
        SplitTail(Case{"llama", 0, {{{1, 2}, {2, 3}, {3, 5}}, {}, 2, 2, 16, 4, DType::kBF16}, 4},
                  2),
        SplitTail(Case{"qwen3", 0, {{{1, 3}, {3, 5}}, {2}, 3, 2, 32, 3, DType::kBF16}, 3}, 3),
        SplitTail(Case{"llama",
                       0,
                       {{{1, 2}, {2, 4}, {4, 5}},
                        {2},
                        3,
                        2,
                        32,
                        3,
                        DType::kF32,
                        false,
                        false,
                        false,
                        true},
                       3},
                  2)),
    CaseName);

// bf16 plans (bf16 weights, activations, activation gradients and their host staging; fp32
// parameter gradients) against the single-device reference runner in bf16: one micro-batch runs the
// same kernels in the same order on the same bits, so losses and gradients are bit for bit the
// runner's on 1, 2 and 3 devices (several micro-batches reassociate the fp32 gradient sums, as in
// f32). Pairwise coverage of devices x {full, LoRA} x {recompute on, off}, plus GPT-2 (learned
// positions gathered on the host, then converted) and awkward sizes (bf16 hidden states of
// 25 x C values, no multiple of the alignment).
INSTANTIATE_TEST_SUITE_P(
    Bf16Plans, ExecutorTest,
    ::testing::Values(
        Case{"llama", 0, {{{1, 3}, {3, 5}}, {}, 1, 2, 32, 1, DType::kBF16}, 1},
        Case{"qwen3", 2, {{{1, 2}, {2, 5}}, {2, 3}, 1, 2, 32, 1, DType::kBF16}, 1},
        Case{"llama3_rope", 0, {{{1, 2}, {2, 4}, {4, 5}}, {3}, 1, 2, 32, 2, DType::kBF16}, 2},
        Case{"llama", 4, {{{1, 3}, {3, 5}}, {}, 1, 2, 32, 2, DType::kBF16}, 2, true},
        Case{"gpt2", 0, {{{1, 2}, {2, 3}, {3, 5}}, {}, 1, 2, 32, 3, DType::kBF16}, 3},
        Case{"llama", 2, {{{1, 2}, {2, 4}, {4, 5}}, {1, 4}, 1, 1, 25, 3, DType::kBF16}, 3},
        // Three micro-batches: the fp32 gradient sums reassociate (tolerance as in f32).
        Case{"qwen3", 0, {{{1, 3}, {3, 5}}, {2}, 3, 2, 32, 3, DType::kBF16}, 3},
        // QLoRA in bf16: NF4 dequantized straight to bf16.
        Case{"llama", 4, {{{1, 3}, {3, 5}}, {}, 1, 2, 32, 2, DType::kBF16}, 2, false, true}),
    CaseName);

// Two gradient accumulators per device (plan.grad_accumulators): a device's consecutive stages
// alternate between them as they alternate weight slots, so a stage accumulates while the one
// before it downloads. The single-device runner's results, each arena the plan's map (the second
// accumulator sized and used like the first), the pinned host the plan's: one device (all its
// stages alternate), two and four, the tail in parts (a part's head gradients in one, the next
// backward stage's in the other), full, tied and LoRA heads, bf16, kept activations.
Case TwoAccumulators(Case c) {
  c.spec.grad_accumulators = 2;
  return c;
}
INSTANTIATE_TEST_SUITE_P(
    TwoAccumulatorPlans, ExecutorTest,
    ::testing::Values(
        TwoAccumulators(Case{"llama", 0, {{{1, 2}, {2, 4}, {4, 5}}, {2}, 2}, 1}),
        TwoAccumulators(SplitTail(Case{"llama", 0, {{{1, 2}, {2, 4}, {4, 5}}, {2}, 4}, 3}, 3)),
        TwoAccumulators(SplitTail(Case{"qwen3", 0, {{{1, 3}, {3, 5}}, {1}, 3}, 2}, 2)),
        TwoAccumulators(Case{"llama", 4, {{{1, 3}, {3, 5}}, {4}, 2}, 2}),
        TwoAccumulators(Case{
            "llama", 0, {{{1, 2}, {2, 3}, {3, 5}}, {}, 2, 2, 16, 4, DType::kBF16}, 4}),
        TwoAccumulators(Case{
            "llama", 0, {{{1, 3}, {3, 5}}, {}, 2, 2, 32, 2, DType::kF32, false, false, true}, 2})),
    CaseName);

// Devices keeping every block's input and saved set ("activations.keep": no saved activation
// crosses the host): the single-device runner's losses and gradients (bit for bit with one
// micro-batch), each arena the plan's map both ways, the pinned host the plan's. One device and
// two (each keeps its forward stages' blocks, where their backward stages run; with three
// stages one device keeps two of them, which sizes the region), one to three stages, full and
// LoRA, f32 and bf16, packed rows, NF4, awkward sizes.
INSTANTIATE_TEST_SUITE_P(
    KeptPlans, ExecutorTest,
    ::testing::Values(
        Case{"llama", 0, {{{1, 5}}, {}, 1, 2, 32, 1, DType::kF32, false, false, true}, 1},
        Case{"llama", 4, {{{1, 3}, {3, 5}}, {}, 2, 2, 32, 1, DType::kF32, false, false, true}, 1},
        Case{"qwen3", 3, {{{1, 2}, {2, 5}}, {}, 2, 1, 25, 1, DType::kF32, false, false, true}, 1},
        Case{"gpt2", 0, {{{1, 5}}, {}, 3, 2, 32, 1, DType::kF32, false, false, true}, 1, true},
        Case{"llama",
             4,
             {{{1, 5}}, {}, 1, 2, 32, 1, DType::kBF16, false, false, true},
             1,
             false,
             true},
        Case{"llama", 0, {{{1, 3}, {3, 5}}, {}, 2, 2, 32, 2, DType::kF32, false, false, true}, 2},
        Case{"qwen3",
             3,
             {{{1, 2}, {2, 3}, {3, 5}}, {}, 3, 1, 25, 2, DType::kF32, false, false, true},
             2,
             true},
        Case{"gpt2", 2, {{{1, 3}, {3, 5}}, {}, 2, 2, 32, 2, DType::kBF16, false, false, true}, 2}),
    CaseName);

// Saved activations on NVMe (every block input that does not start a stage and every saved set an
// entry of the store, through each device's four staging slots): the single-device runner's
// losses and gradients (bit for bit with one micro-batch), each step writing and reading exactly
// the plan's NVMe bytes, each arena the plan's map, the pinned host (stage inputs and staging)
// the plan's. 1, 2 and 3 devices; full and LoRA; recompute on and off; packed rows; bf16;
// awkward sizes.
INSTANTIATE_TEST_SUITE_P(
    NvmePlans, ExecutorTest,
    ::testing::Values(
        Case{"llama", 0, {{{1, 5}}, {}, 1, 2, 32, 1, DType::kF32, false, false, false, true}, 1},
        Case{"llama",
             0,
             {{{1, 2}, {2, 4}, {4, 5}}, {2}, 3, 2, 32, 3, DType::kF32, false, false, false, true},
             3},
        Case{"qwen3",
             3,
             {{{1, 2}, {2, 5}}, {3}, 2, 1, 25, 2, DType::kF32, false, false, false, true},
             2},
        Case{"gpt2",
             0,
             {{{1, 3}, {3, 5}}, {}, 2, 2, 32, 2, DType::kF32, false, false, false, true},
             2,
             true},
        Case{"llama",
             4,
             {{{1, 3}, {3, 5}}, {4}, 1, 2, 32, 1, DType::kBF16, false, false, false, true},
             1}),
    CaseName);

// A failed activation write or read stops the step with an error naming the device, stage, layer
// and micro-batch, without hanging; the executor can be destroyed at once after it.
TEST(ExecutorNvmeFaultTest, AnIoErrorStopsTheStepNamingTheLayer) {
  const Model m = LoadModel("llama");
  PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2};
  spec.activations_on_nvme = true;
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 3);
  const Batches b = MakeBatches(m, 2, spec.batch * spec.seq_len, 9, 0);
  for (IoKind kind : {IoKind::kWrite, IoKind::kRead}) {
    ferry::testing::FaultyEnv env;
    ActivationStore store;
    ASSERT_NE(store.Get(p, &env), nullptr);
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    HostTensors g = ZeroGrads(m);
    ASSERT_TRUE((*e)->Step(w, b.inputs, g).ok());
    env.AddRule({.kind = kind,
                 .action = ferry::testing::FaultyEnv::Action::kError,
                 .error = EIO,
                 .skip = 2});
    Result<double> loss = (*e)->Step(w, b.inputs, g);
    ASSERT_FALSE(loss.ok());
    const std::string msg = loss.status().ToString();
    EXPECT_EQ(loss.status().code(), StatusCode::kIOError) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;  // the device's stream
    EXPECT_NE(msg.find(", layer "), std::string::npos) << msg;
    EXPECT_NE(msg.find(kind == IoKind::kWrite ? "writing its" : "reading its"), std::string::npos)
        << msg;
  }
}

// QLoRA's plumbing against an independent path: a model whose block projections are NF4 gives
// the loss and the LoRA gradients of the plain model whose base weights are those NF4 weights
// dequantized on the host (kernels/nf4.h: DequantizeNf4), bit for bit, in f32 and bf16, over a
// multi-stage plan. The device dequantizes each part into the blocks' scratch before each product,
// the fused gate_up from its two tensors; the plain model holds the same values as weights. With
// and without double quantization: the device holds the weights nested as the host does.
TEST(ExecutorNf4Test, EqualsThePlainModelOnDequantizedWeights) {
  for (const auto& [dtype, nested] :
       {std::pair{DType::kF32, true}, {DType::kBF16, true}, {DType::kF32, false}}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)) + (nested ? " nested" : " fp32 absmax"));
    Model q = LoadModel("llama", 4, /*nf4=*/true);
    q.lora.double_quant = nested;
    const Model plain = LoadModel("llama", 4);
    const PlanSpec spec{{{1, 3}, {3, 5}}, {3}, 1, 2, 32, 2, dtype};
    const HostTensors wq = RandomWeights(q, 21);
    ASSERT_FALSE(wq.nf4.empty());
    HostTensors wp;
    wp.tensors = wq.tensors;
    std::vector<float> scratch;
    for (const LayerSpec& l : BuildLayerSpecs(q.config, q.lora)) {
      for (const ParamSpec& p : l.params) {
        if (!p.nf4) continue;
        EXPECT_FALSE(wq.tensors.count(p.name)) << p.name << " kept its fp32 copy";
        Result<std::span<const float>> v = ParameterValues(p, wq, scratch);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        wp.tensors[p.name].assign(v->begin(), v->end());
      }
    }
    const Batches b = MakeBatches(q, 1, 64, 23);
    auto step = [&](const Model& m, const HostTensors& w, HostTensors& g) -> double {
      return ExecutorStep(m, MakeTestPlan(m, spec), 2, w, b, g);
    };
    HostTensors gq = ZeroGrads(q), gp = ZeroGrads(plain);
    const double lq = step(q, wq, gq), lp = step(plain, wp, gp);
    EXPECT_EQ(lq, lp);
    EXPECT_TRUE(std::isfinite(lq));
    ASSERT_EQ(gq.tensors.size(), gp.tensors.size());
    for (const auto& [name, g] : gp.tensors) {
      const std::vector<float>& h = gq.tensors.at(name);
      int bad = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        if (h[i] != g[i] && ++bad <= 3) {
          ADD_FAILURE() << name << "[" << i << "]: nf4 " << h[i] << " plain " << g[i];
        }
      }
      EXPECT_EQ(bad, 0) << name;
    }
  }
}

// Weights quantized with the other nesting than the device layout was made for are refused at
// upload, naming the tensor and the option, not dequantized from the wrong bytes.
TEST(ExecutorNf4Test, RefusesWeightsNestedOtherwiseThanTheLayout) {
  for (bool nested : {true, false}) {
    Model layout = LoadModel("llama", 4, /*nf4=*/true), host = layout;
    layout.lora.double_quant = nested;
    host.lora.double_quant = !nested;
    const std::vector<LayerSpec> layers = BuildLayerSpecs(layout.config, layout.lora);
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(1, size_t(64) << 20);
    Result<ferry::DeviceParams> params =
        ferry::DeviceParams::Create(*devs[0], layout.config, layout.lora, {layers[1]});
    ASSERT_TRUE(params.ok()) << params.status().ToString();
    const Status s = params->Upload(*devs[0], RandomWeights(host, 3));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("double-quantized"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("--[no-]double-quant"), std::string::npos) << s.ToString();
  }
}

// After the first step nothing is allocated: no arena block, no event, no host mapping (the
// stages' host mirrors are carved from the host pool at Create and shared, though 7 stages on 2
// devices land on the other device and weight slot from one step to the next), and the resident
// set does not grow past malloc's slack (not checked under sanitizers, whose allocators keep
// freed memory). With the saved activations in host RAM and on NVMe (the store's staging and
// bounce buffers are taken at Create and Open; each step rewrites the same entries).
class ExecutorAllocationTest : public ::testing::TestWithParam<bool> {};

TEST_P(ExecutorAllocationTest, NothingIsAllocatedAfterTheFirstStep) {
  const Model m = LoadModel("llama", 0);
  PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {2}, 2};
  spec.activations_on_nvme = GetParam();
  const plan::Plan p = MakeTestPlan(m, spec);
  ASSERT_EQ(p.activations, GetParam() ? Tier::kNvme : Tier::kHost);
  const HostTensors w = RandomWeights(m, 3);
  const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 8);
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
  ActivationStore store;
  Result<std::unique_ptr<PipelineExecutor>> e = CreateExecutor(devs, m, p, store);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  HostTensors g = ZeroGrads(m);
  struct Counts {
    std::vector<size_t> arena_blocks;
    std::vector<int64_t> events;
    int64_t host_mappings = 0;
    bool operator==(const Counts&) const = default;
  };
  auto counts = [&] {
    Counts c;
    for (const auto& d : devs) {
      c.arena_blocks.push_back(d->arena_log().size());
      c.events.push_back(d->events_created());
    }
    c.host_mappings = (*e)->stats().host_mappings;
    return c;
  };
  auto step = [&] {
    Result<double> loss = (*e)->Step(w, b.inputs, g);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  };
  const Counts at_create = counts();
  step();
  const Counts first = counts();
  EXPECT_EQ(first.arena_blocks, at_create.arena_blocks);
  EXPECT_EQ(first.events, at_create.events);
  // The layer ranges' weight and gradient mirrors are carved from the host pool at Create too.
  EXPECT_EQ(first.host_mappings, at_create.host_mappings);
  // Steps 2..4 put every stage on every device and weight slot once (pages touched the first
  // time count as resident then); steps 5..20 then add nothing but malloc's own pages.
  // A leak grows the resident set in every window of steps; a one-off growth (another thread's
  // malloc arena, the kernel's page accounting under load) shows in one window only, so the
  // smaller growth of two windows is what must stay within the slack.
  for (int s = 0; s < 3; ++s) step();
  const Result<uint64_t> rss0 = ResidentBytes();  // unread under sanitizers
  for (int s = 0; s < 8; ++s) step();
  const Result<uint64_t> rss1 = ResidentBytes();
  for (int s = 0; s < 8; ++s) step();
  const Result<uint64_t> rss2 = ResidentBytes();
  EXPECT_TRUE(counts() == first);
  size_t weight_bytes = 0;  // what one step's mirrors hold: a leak of them would show
  for (const auto& [name, x] : w.tensors) weight_bytes += x.size() * sizeof(float);
  constexpr int64_t kSlack = 64 << 10;
  ASSERT_GT(int64_t(weight_bytes), kSlack);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  ASSERT_TRUE(rss0.ok() && rss1.ok() && rss2.ok()) << rss0.status().ToString();
  const int64_t grew1 = int64_t(*rss1) - int64_t(*rss0), grew2 = int64_t(*rss2) - int64_t(*rss1);
  EXPECT_LE(std::min(grew1, grew2), kSlack)
      << "the resident set grew over steps 5..12 by " << grew1 << " bytes and over steps "
      << "13..20 by " << grew2;
#endif
  if (store.get() != nullptr) {
    EXPECT_EQ(store.Segments(), 1);  // the entries' space, reused
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, ExecutorAllocationTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "ActivationsOnNvme" : "ActivationsInRam");
                         });

// Evaluate runs the forward stages and the tail's loss-only pass: each micro-batch's loss equals
// the single-device runner's EvaluateLoss bit for bit (f32: the same kernels in the same order),
// for one micro-batch and for fewer than the plan's; it leaves the training step unchanged; and
// more micro-batches than the plan runs are refused.
// With the tail in two parts too: an evaluation of one micro-batch runs it in one.
TEST(ExecutorEvaluateTest, EqualsTheRunnersForwardOnlyLoss) {
  for (const auto& [name, parts] :
       {std::pair{"llama", 1}, {"gpt2", 1}, {"qwen3", 1}, {"llama", 2}, {"qwen3", 2}}) {
    const Model m = LoadModel(name);
    PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {2}, 3};
    spec.tail_parts = parts;
    const plan::Plan p = MakeTestPlan(m, spec);
    const HostTensors w = RandomWeights(m, 9);
    const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 77);
    SingleDevice one = MakeSingleDevice(m, spec.batch, spec.seq_len);
    ASSERT_TRUE(one.runner);
    std::unique_ptr<ModelRunner>* runner = &one.runner;
    ASSERT_TRUE((*runner)->UploadWeights(w).ok());
    std::vector<double> want;
    for (const MicroBatchInput& mb : b.inputs) {
      Result<double> l = (*runner)->EvaluateLoss(mb);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      want.push_back(*l);
    }
    std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    HostTensors g0 = ZeroGrads(m), g1 = ZeroGrads(m);
    Result<double> before = (*e)->Step(w, b.inputs, g0);
    ASSERT_TRUE(before.ok()) << before.status().ToString();
    for (size_t k = 0; k < b.inputs.size(); ++k) {
      Result<double> got = (*e)->Evaluate(w, {&b.inputs[k], 1});
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, want[k]) << name << " micro-batch " << k;
    }
    Result<double> two = (*e)->Evaluate(w, std::span(b.inputs).first(2));
    ASSERT_TRUE(two.ok()) << two.status().ToString();
    EXPECT_EQ(*two, want[0] + want[1]) << name;
    Result<double> after = (*e)->Step(w, b.inputs, g1);
    ASSERT_TRUE(after.ok()) << after.status().ToString();
    EXPECT_EQ(*after, *before) << name;
    for (const auto& [n, x] : g0.tensors) EXPECT_EQ(g1.tensors.at(n), x) << name << " " << n;
    std::vector<MicroBatchInput> four = b.inputs;
    four.push_back(b.inputs[0]);
    Result<double> bad = (*e)->Evaluate(w, four);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("at most"), std::string::npos) << bad.status().ToString();
  }
}

// A forward-only plan (evaluation: no gradients, no saved activations, a loss-only head) gives
// the runner's forward-only losses bit for bit, on one device and over three stages on two; its
// arenas are its GPU map exactly (both ways), its pinned pool peak is its pinned total, and it
// has no gradient buffer anywhere; Step is refused.
TEST(ExecutorEvaluateTest, ForwardOnlyPlanIsExactAndEqualsTheRunner) {
  for (const char* name : {"llama", "gpt2", "qwen3"}) {
    for (const int devices : {1, 2}) {
      const Model m = LoadModel(name);
      PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {}, 2};
      if (devices == 1) spec.stages = {{1, 5}};
      spec.gpus = devices;
      spec.forward_only = true;
      const plan::Plan p = MakeTestPlan(m, spec);
      for (const plan::Allocation& a : p.memory.gpu.allocations) {
        EXPECT_NE(a.name, "grads.accum");
        EXPECT_NE(a.name, "hidden.3");
      }
      for (const plan::Allocation& a : p.memory.pinned_host.allocations) {
        EXPECT_NE(a.name, "grads.landing");
        EXPECT_NE(a.name, "activations.grad");
      }
      const HostTensors w = RandomWeights(m, 9);
      const Batches b = MakeBatches(m, spec.micro_batches, spec.batch * spec.seq_len, 78);
      SingleDevice one = MakeSingleDevice(m, spec.batch, spec.seq_len);
      ASSERT_TRUE(one.runner);
      ASSERT_TRUE(one.runner->UploadWeights(w).ok());
      std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(devices, p.memory.gpu.total());
      Result<std::unique_ptr<PipelineExecutor>> e =
          PipelineExecutor::Create(Raw(devs), m.config, p);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      double want = 0;
      for (const MicroBatchInput& mb : b.inputs) {
        Result<double> l = one.runner->EvaluateLoss(mb);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        want += *l;
      }
      Result<double> got = (*e)->Evaluate(w, b.inputs);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, want) << name << " on " << devices;
      ExpectArenasAreThePlan(devs, **e, p);
      EXPECT_EQ((*e)->stats().pinned.peak, p.memory.pinned_host.total()) << name;
      HostTensors g = ZeroGrads(m);
      Result<double> step = (*e)->Step(w, b.inputs, g);
      ASSERT_FALSE(step.ok());
      EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(step.status().message().find("Evaluate"), std::string::npos)
          << step.status().ToString();
    }
  }
}

// A plan that puts frozen weights on NVMe, or activations there without a store to put them in,
// is refused at Create, naming the group, rather than run in host RAM against its own memory
// figures. (Optimizer state on NVMe is the Trainer's: the executor never touches it; see
// NvmeOptimizerTest.)
TEST(ExecutorTierTest, RefusesNvmeTiersNamingTheGroup) {
  const Model m = LoadModel("llama");
  const plan::Plan base = MakeTestPlan(m, {{{1, 3}, {3, 5}}, {}, 1});
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(1, base.memory.gpu.total());
  for (const auto& [group, tier] : {std::pair{"activations", &plan::Plan::activations},
                                    {"frozen weights", &plan::Plan::frozen_weights}}) {
    plan::Plan p = base;
    p.*tier = Tier::kNvme;
    Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
    ASSERT_FALSE(e.ok()) << group;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(std::string(group) + " on NVMe"), std::string::npos)
        << e.status().ToString();
  }
}

// A compute dtype the executor does not store (i32) is refused at Create, naming it; f16 is
// taken (it runs with the Trainer's loss scaling: F16TrainingTest below).
TEST(ExecutorDTypeTest, TakesF16AndRefusesOtherDtypesNamingThem) {
  const Model m = LoadModel("llama");
  const plan::Plan p = MakeTestPlan(m, {{{1, 3}, {3, 5}}, {}, 1, 2, 16, 1, DType::kF16});
  std::vector<std::unique_ptr<CpuDevice>> devs = MakeDevices(1, p.memory.gpu.total());
  Result<std::unique_ptr<PipelineExecutor>> e = PipelineExecutor::Create(Raw(devs), m.config, p);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  plan::Plan bad = p;
  bad.job.compute_dtype = DType::kI32;
  Result<std::unique_ptr<PipelineExecutor>> r = PipelineExecutor::Create(Raw(devs), m.config, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not i32"), std::string::npos) << r.status().ToString();
}

// ---- Optimizer state on NVMe (Trainer with OptimizerStateOptions::nvme_dir) ----

// A trainer's weights and moments after FinishUpdates, wherever they live.
struct OptimizerSnapshot {
  HostTensors w, m, v;
};
OptimizerSnapshot Snapshot(Trainer& t) {
  OptimizerSnapshot s;
  EXPECT_TRUE(t.FinishUpdates().ok());
  Trainer::OptimizerStateReader reader = t.StateReader();  // as a checkpoint reads them
  for (const std::string& name : t.trainable_names()) {
    s.w.tensors[name] = t.weights().tensors.at(name);
    Result<Trainer::OptimizerStateReader::Moments> read = reader.Read(name);
    EXPECT_TRUE(read.ok()) << read.status().ToString();
    if (!read.ok()) continue;
    s.m.tensors[name].assign(read->exp_avg.begin(), read->exp_avg.end());
    s.v.tensors[name].assign(read->exp_avg_sq.begin(), read->exp_avg_sq.end());
  }
  return s;
}
void ExpectSameState(const OptimizerSnapshot& got, const OptimizerSnapshot& want,
                     const std::string& what) {
  ExpectSameBits(got.w, want.w, what + " weights");
  ExpectSameBits(got.m, want.m, what + " exp_avg");
  ExpectSameBits(got.v, want.v, what + " exp_avg_sq");
}

// The trainable storage-owning parameters of each layer that has some: one record each, in
// layer order, laid out [master | exp_avg | exp_avg_sq] per parameter (trainer.h).
std::vector<std::vector<const ParamSpec*>> RecordParams(const std::vector<LayerSpec>& layers) {
  std::vector<std::vector<const ParamSpec*>> out;
  for (const LayerSpec& l : layers) {
    std::vector<const ParamSpec*> ps;
    for (const ParamSpec& p : l.params) {
      if (p.trainable && p.tied_to.empty()) ps.push_back(&p);
    }
    if (!ps.empty()) out.push_back(std::move(ps));
  }
  return out;
}

struct NvmeCase {
  const char* model;
  double grad_clip;
  bool stale = false;  // --stale-updates: records updated in the order the step reads them
};
class NvmeOptimizerTest : public ::testing::TestWithParam<NvmeCase> {
 protected:
  void SetUp() override {
    if (dir_.path().empty()) GTEST_SKIP() << "could not create a temporary directory";
  }
  ferry::testing::TempDir dir_;
};

// Optimizer state on NVMe gives the losses, weights and moments of the state in RAM bit for bit
// over four steps on 2 devices and 3 stages, and each step reads and writes exactly the plan's
// bytes (one slot of every layer each way), by the store's count and by the kernel's
// (/proc/self/io: O_DIRECT, so the page cache hides nothing). With stale updates too (the RAM
// run equals an independent stale AdamW: StaleUpdatesTest); no read ahead is wasted, though a
// tied embedding's record is updated last, after the head has read it.
TEST_P(NvmeOptimizerTest, EqualsHostRamBitForBitAndMovesThePlannedBytes) {
  const NvmeCase c = GetParam();
  const Model m = LoadModel(c.model);
  PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {3}, 2, 2, 16, 2};
  spec.optimizer_on_nvme = true;
  const plan::Plan p = MakeTestPlan(m, spec);
  uint64_t planned = 0;  // per step and direction: half the two-slot allocation (planner.cc)
  for (const plan::Allocation& a : p.memory.nvme.allocations) {
    if (a.name == "optimizer.slots") planned = a.bytes / 2;
  }
  ASSERT_GT(planned, 0u);
  const HostTensors w = RandomWeights(m, 5);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 4, 0.1};
  o.weight_decay = 0.01;
  o.grad_clip = c.grad_clip;
  o.stale_updates = c.stale;
  constexpr int kSteps = 4;
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, kSteps);

  struct Run {
    std::vector<double> losses;
    OptimizerSnapshot state;
    uint64_t store_read = 0, store_written = 0, io_read = 0, io_written = 0, wasted = 0;
    uint64_t faults = 0;                  // major page faults while the counters ran
    uint64_t unprefetched_last_step = 0;  // records the last step's updates waited to read
    uint64_t snapshot_read = 0,
             snapshot_wasted = 0;  // reading every moment back, as checkpoints do
    bool direct = false;
  };
  auto train = [&](const std::string& state_dir) {
    Run r;
    std::vector<std::unique_ptr<CpuDevice>> d = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(d), m.config, p);
    EXPECT_TRUE(pipe.ok()) << pipe.status().ToString();
    if (!pipe.ok()) return r;
    auto t = Trainer::Create(pipe->get(), layers, w, o, nullptr, {.nvme_dir = state_dir});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return r;
    const VersionedStore* store = (*t)->state_store();
    EXPECT_EQ(store != nullptr, !state_dir.empty());
    const VersionedStoreStats s0 = store ? store->stats() : VersionedStoreStats{};
    const uint64_t r0 = ProcIo("read_bytes"), w0 = ProcIo("write_bytes"), f0 = MajorFaults();
    uint64_t unprefetched = 0;
    for (const auto& mbs : steps) {
      if (store != nullptr) unprefetched = store->stats().unprefetched;
      Result<StepStats> st = (*t)->Step(mbs);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      r.losses.push_back(st.ok() ? st->loss : NAN);
    }
    if (store != nullptr) r.unprefetched_last_step = store->stats().unprefetched - unprefetched;
    EXPECT_TRUE((*t)->FinishUpdates().ok());
    if (store != nullptr) {
      const VersionedStoreStats s1 = store->stats();
      r.store_read = s1.bytes_read - s0.bytes_read;
      r.store_written = s1.bytes_written - s0.bytes_written;
      r.io_read = ProcIo("read_bytes") - r0;
      r.io_written = ProcIo("write_bytes") - w0;
      r.faults = MajorFaults() - f0;
      r.wasted = s1.wasted_prefetches;
      r.direct = store->direct_io();
      for (const plan::Allocation& a : p.memory.pageable_host.allocations) {
        if (a.name == "optimizer.staging") {
          EXPECT_EQ(store->staging_bytes(), a.bytes);
        }
      }
    }
    const VersionedStoreStats before = store ? store->stats() : VersionedStoreStats{};
    r.state = Snapshot(**t);
    if (store != nullptr) {
      r.snapshot_read = store->stats().bytes_read - before.bytes_read;
      r.snapshot_wasted = store->stats().wasted_prefetches - before.wasted_prefetches;
    }
    return r;
  };
  const Run ram = train("");
  // /proc/self/io counts the whole process: a page of the test binary read back from disk inside
  // the window (its NVMe-only code runs first there) shows in read_bytes, and a page another
  // thread dirties (seen once under TSan: one page more written) in write_bytes. Such a run is
  // repeated, each in a fresh folder; one of three must show exactly the plan's bytes.
  Run nvme;
  for (int run = 0; run < 3; ++run) {
    nvme = train(dir_.path() + "/optim" + std::to_string(run));
    const bool exact = nvme.io_read == kSteps * planned && nvme.io_written == kSteps * planned;
    if (!nvme.direct || (nvme.faults == 0 && exact)) break;
  }
  EXPECT_EQ(nvme.losses, ram.losses);
  EXPECT_GT(ram.losses[0], ram.losses[kSteps - 1]);  // it learns: the comparison is not moot
  ExpectSameState(nvme.state, ram.state, "NVMe vs RAM");
  EXPECT_EQ(nvme.store_read, kSteps * planned);
  EXPECT_EQ(nvme.store_written, kSteps * planned);
  EXPECT_EQ(nvme.wasted, 0u);
  // Reading every moment back (a checkpoint) reads each layer's record once.
  EXPECT_EQ(nvme.snapshot_read, planned);
  EXPECT_EQ(nvme.snapshot_wasted, 0u);
  // Every record the last step updated was read ahead, in the order the step applied them (with
  // stale updates: the order of its stages' reads, learned from the step before).
  EXPECT_EQ(nvme.unprefetched_last_step, 0u);
  std::printf(
      "NVMe optimizer bytes per step: planned %llu each way; measured store %llu read, "
      "%llu written; /proc/self/io %llu read, %llu written (O_DIRECT %s; %llu major faults)\n",
      (unsigned long long)planned, (unsigned long long)(nvme.store_read / kSteps),
      (unsigned long long)(nvme.store_written / kSteps),
      (unsigned long long)(nvme.io_read / kSteps), (unsigned long long)(nvme.io_written / kSteps),
      nvme.direct ? "on" : "off", (unsigned long long)nvme.faults);
  if (!nvme.direct) GTEST_SKIP() << "O_DIRECT refused here: /proc/self/io would not show the disk";
  EXPECT_EQ(nvme.faults, 0u) << "every run read pages of the process back from disk";
  EXPECT_EQ(nvme.io_read, kSteps * planned);
  EXPECT_EQ(nvme.io_written, kSteps * planned);
}

// With a runner that holds its weights (one device: no per-layer hooks, every update after the
// step, in forward order), optimizer state on NVMe gives the RAM run's bits too, and reads ahead
// in that order: no prefetch is wasted.
class NvmeOneDeviceTest : public NvmeOptimizerTest {};
TEST_P(NvmeOneDeviceTest, OnOneDeviceEqualsHostRamBitForBit) {
  const NvmeCase c = GetParam();
  const Model m = LoadModel(c.model);
  const PlanSpec spec{{{1, 5}}, {}, 2, 2, 16, 1};
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 3, 0.1};
  o.grad_clip = c.grad_clip;
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 3);
  auto train = [&](const std::string& state_dir, std::vector<double>& losses) {
    SingleDevice one = MakeSingleDevice(m, spec.batch, spec.seq_len);
    OptimizerSnapshot s;
    auto t = Trainer::Create(one.runner.get(), layers, RandomWeights(m, 7), o, nullptr,
                             {.nvme_dir = state_dir});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return s;
    for (const auto& mbs : steps) {
      Result<StepStats> st = (*t)->Step(mbs);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      losses.push_back(st.ok() ? st->loss : NAN);
    }
    if (const VersionedStore* store = (*t)->state_store(); store != nullptr) {
      EXPECT_EQ(store->stats().wasted_prefetches, 0u);
    }
    return Snapshot(**t);
  };
  std::vector<double> ram_losses, nvme_losses;
  const OptimizerSnapshot ram = train("", ram_losses);
  const OptimizerSnapshot nvme = train(dir_.path() + "/optim", nvme_losses);
  EXPECT_EQ(nvme_losses, ram_losses);
  ExpectSameState(nvme, ram, "one device, NVMe vs RAM");
}

std::string NvmeCaseName(const ::testing::TestParamInfo<NvmeCase>& i) {
  return std::string(i.param.model) + (i.param.grad_clip > 0 ? "_clip" : "_noclip") +
         (i.param.stale ? "_stale" : "");
}
INSTANTIATE_TEST_SUITE_P(Cases, NvmeOptimizerTest,
                         ::testing::Values(NvmeCase{"llama", 0.0}, NvmeCase{"llama", 1.0},
                                           NvmeCase{"qwen3", 0.5},  // tied head
                                           NvmeCase{"llama", 0.0, true},
                                           NvmeCase{"qwen3", 0.5, true}),  // tied, read twice
                         NvmeCaseName);
INSTANTIATE_TEST_SUITE_P(Cases, NvmeOneDeviceTest,
                         ::testing::Values(NvmeCase{"llama", 0.0}, NvmeCase{"llama", 1.0},
                                           NvmeCase{"qwen3", 0.5}),  // tied head
                         NvmeCaseName);

// A write torn in the middle of step 3's updates, after two layers committed step 3: either the
// write fails (EIO: the step stops with an error naming the layer) or the process is killed with
// SIGKILL halfway through the write (a child process, forked before it makes any thread).
// Reopened, every layer is wholly at step 2 or 3 (its master weights and both moments those of
// the uninterrupted run at that step), and a run resumed from the step-2 state repeats the
// uninterrupted run bit for bit.
class NvmeOptimizerCrashTest : public ::testing::TestWithParam<bool> {};

TEST_P(NvmeOptimizerCrashTest, ATornWriteLeavesEveryLayerWholeAndResumeRepeatsTheRun) {
  const bool kill9 = GetParam();
  ferry::testing::TempDir dir;
  if (dir.path().empty()) GTEST_SKIP() << "could not create a temporary directory";
  const Model m = LoadModel("llama");
  const PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {3}, 2, 2, 16, 2};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 9);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  const std::vector<std::vector<const ParamSpec*>> records = RecordParams(layers);
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 4, 0.1};
  constexpr int kSteps = 4;
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, kSteps);
  auto make = [&](std::vector<std::unique_ptr<CpuDevice>>& d, const HostTensors& start,
                  const OptimizerStateOptions& so)
      -> std::pair<std::unique_ptr<ModelRunner>, std::unique_ptr<Trainer>> {
    d = MakeDevices(2, p.memory.gpu.total());
    Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(d), m.config, p);
    EXPECT_TRUE(pipe.ok()) << pipe.status().ToString();
    if (!pipe.ok()) return {};
    auto t = Trainer::Create(pipe->get(), layers, start, o, nullptr, so);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    return {std::move(*pipe), std::move(*t)};
  };

  // The crashing run: creating the store writes one slot per record, each step one per record;
  // the third write of step 3 tears.
  const int n = int(records.size());
  ferry::testing::TornWriteEnv torn(n + 2 * n + 3, kill9);
  OptimizerStateOptions so{.nvme_dir = dir.path() + "/optim", .env = &torn};
  auto crash = [&]() -> Status {  // returns only when the write fails without killing
    std::vector<std::unique_ptr<CpuDevice>> d;
    auto [runner, t] = make(d, w, so);
    if (!t) return Status::Internal("no trainer");
    for (int k = 0; k < 2; ++k) FERRY_RETURN_IF_ERROR(t->Step(steps[size_t(k)]).status());
    Result<StepStats> st = t->Step(steps[2]);
    return st.ok() ? Status::Internal("step 3 did not fail") : st.status();
  };
  if (kill9) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      (void)crash();
      ::_exit(3);  // reached only if the kill did not come
    }
    int wstatus = 0;
    for (int waited_ms = 0; ::waitpid(pid, &wstatus, WNOHANG) == 0; waited_ms += 10) {
      if (waited_ms > 60000) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &wstatus, 0);
        FAIL() << "the training child did not reach the torn write in 60 s";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "status " << wstatus;
  } else {
    const Status st = crash();
    EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
    EXPECT_NE(st.message().find("(optimizer state on NVMe)"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("layer 3"), std::string::npos) << st.ToString();
  }  // the process dies here

  // The uninterrupted run, in RAM: the state after each step.
  std::vector<OptimizerSnapshot> at;
  std::vector<double> losses;
  {
    std::vector<std::unique_ptr<CpuDevice>> d;
    auto [runner, t] = make(d, w, {});
    ASSERT_TRUE(t);
    at.push_back(Snapshot(*t));
    for (const auto& mbs : steps) {
      Result<StepStats> st = t->Step(mbs);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      losses.push_back(st->loss);
      at.push_back(Snapshot(*t));
    }
  }

  std::vector<size_t> bytes;
  for (const auto& ps : records) {
    size_t b = 0;
    for (const ParamSpec* q : ps) b += 3 * size_t(q->numel()) * sizeof(float);
    bytes.push_back(b);
  }
  auto reopened = VersionedStore::Open({.directory = so.nvme_dir}, bytes);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  int at_three = 0;
  for (size_t r = 0; r < records.size(); ++r) {
    const int64_t step = (*reopened)->step(r);
    ASSERT_TRUE(step == 2 || step == 3) << "record " << r << " at step " << step;
    at_three += step == 3;
    auto rec = (*reopened)->Acquire(r);
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    const float* f = reinterpret_cast<const float*>(rec->data());
    for (const ParamSpec* q : records[r]) {
      const size_t k = size_t(q->numel());
      const OptimizerSnapshot& want = at[size_t(step)];
      EXPECT_TRUE(std::equal(f, f + k, want.w.tensors.at(q->name).begin())) << q->name;
      EXPECT_TRUE(std::equal(f + k, f + 2 * k, want.m.tensors.at(q->name).begin())) << q->name;
      EXPECT_TRUE(std::equal(f + 2 * k, f + 3 * k, want.v.tensors.at(q->name).begin())) << q->name;
      f += 3 * k;
    }
    (*reopened)->Release(r);
  }
  EXPECT_EQ(at_three, 2);  // two layers committed step 3 before the third write tore
  reopened->reset();

  // Resume from the step-2 state (what the step-2 checkpoint holds): the store is rebuilt.
  so.env = nullptr;
  std::vector<std::unique_ptr<CpuDevice>> d;
  auto [runner, t] = make(d, at[2].w, so);
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->RestoreOptimizer(2, at[2].m, at[2].v).ok());
  for (size_t r = 0; r < records.size(); ++r) EXPECT_EQ(t->state_store()->step(r), 2);
  for (int k = 2; k < kSteps; ++k) {
    Result<StepStats> st = t->Step(steps[size_t(k)]);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->loss, losses[size_t(k)]) << "step " << k;
  }
  ExpectSameState(Snapshot(*t), at[kSteps], "resumed");
}

INSTANTIATE_TEST_SUITE_P(Crashes, NvmeOptimizerCrashTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "KilledMidWrite" : "WriteFails";
                         });

// An EIO on an optimizer-state read stops the step with an error naming the layer (no hang).
TEST(NvmeOptimizerFaultTest, AReadErrorStopsTheRunNamingTheLayer) {
  ferry::testing::TempDir dir;
  if (dir.path().empty()) GTEST_SKIP() << "could not create a temporary directory";
  const Model m = LoadModel("llama");
  const PlanSpec spec{{{1, 2}, {2, 4}, {4, 5}}, {3}, 2, 2, 16, 2};
  const plan::Plan p = MakeTestPlan(m, spec);
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 2);
  std::vector<std::unique_ptr<CpuDevice>> d = MakeDevices(2, p.memory.gpu.total());
  Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(d), m.config, p);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  ferry::testing::FaultyEnv env;
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 4, 0.1};
  auto t = Trainer::Create(pipe->get(), BuildLayerSpecs(m.config, m.lora), RandomWeights(m, 3), o,
                           nullptr, {.nvme_dir = dir.path() + "/optim", .env = &env});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Step(steps[0]).ok());
  env.AddRule({.kind = IoKind::kRead,
               .action = ferry::testing::FaultyEnv::Action::kError,
               .error = EIO,
               .skip = 1});
  Result<StepStats> st = (*t)->Step(steps[1]);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kIOError);
  EXPECT_NE(st.status().message().find("layer 4 (optimizer state on NVMe)"), std::string::npos)
      << st.status().ToString();
}

// ---- f16 training with dynamic loss scaling (engine/train/loss_scaler.h) ----

struct ScaledRun {
  OptimizerSnapshot initial, final;
  std::vector<StepStats> stats;
  LossScalerState scaler;
};
// `steps` (or, with `until_applied`, steps until the first one not skipped) of a Trainer over a
// pipeline of `devices` CPU devices running `p`.
ScaledRun TrainScaled(const Model& m, const plan::Plan& p, int devices, const HostTensors& w,
                      const OptimizerOptions& o, const std::vector<std::vector<MicroBatch>>& steps,
                      bool until_applied = false) {
  ScaledRun r;
  std::vector<std::unique_ptr<CpuDevice>> d = MakeDevices(devices, p.memory.gpu.total());
  Result<std::unique_ptr<ModelRunner>> pipe = CreatePipelineRunner(Raw(d), m.config, p);
  EXPECT_TRUE(pipe.ok()) << pipe.status().ToString();
  if (!pipe.ok()) return r;
  auto t = Trainer::Create(pipe->get(), BuildLayerSpecs(m.config, m.lora), w, o, nullptr);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return r;
  r.initial = Snapshot(**t);
  for (const auto& mbs : steps) {
    Result<StepStats> st = (*t)->Step(mbs);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (!st.ok()) break;
    r.stats.push_back(*st);
    if (until_applied && !st->skipped) break;
  }
  r.final = Snapshot(**t);
  r.scaler = (*t)->loss_scaler_state();
  return r;
}

// f16 plans' device arenas are the plan's byte for byte, and one alignment unit less fails
// naming the last allocation (loss scaling adds no buffer: memory_model.h).
TEST(F16TrainingTest, ArenaMatchesMemoryModel) {
  CheckArenaMatchesMemoryModel({"llama", 2, {{{1, 3}, {3, 5}}, {2}, 2, 2, 16, 2, DType::kF16}, 2});
  CheckArenaMatchesMemoryModel({"gpt2", 0, {{{1, 2}, {2, 5}}, {}, 1, 2, 16, 2, DType::kF16}, 1});
}

OptimizerOptions ScaledOptions(double initial_scale, int64_t growth_interval) {
  OptimizerOptions o;
  o.schedule = {1e-2, 1, 4, 0.1};
  o.weight_decay = 0.01;
  o.grad_clip = 1.0;
  o.loss_scaling = {
      .enabled = true, .initial_scale = initial_scale, .growth_interval = growth_interval};
  return o;
}

// f16 weights, activations and activation gradients over two stages and two micro-batches: one
// device and two run the same kernels on the same bits in the same order, so every loss, scale,
// weight and moment is the same bit for bit. Growth every 2 finite steps, so the scale changes.
TEST(F16TrainingTest, OneAndTwoDevicesGiveTheSameBits) {
  const Model m = LoadModel("llama", 2);
  const PlanSpec spec{{{1, 3}, {3, 5}}, {2}, 2, 2, 16, 2, DType::kF16};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 31);
  const OptimizerOptions o = ScaledOptions(65536, 2);
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 4);
  const ScaledRun one = TrainScaled(m, p, 1, w, o, steps);
  const ScaledRun two = TrainScaled(m, p, 2, w, o, steps);
  ASSERT_EQ(one.stats.size(), 4u);
  ASSERT_EQ(two.stats.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(two.stats[s].loss, one.stats[s].loss) << "step " << s;
    EXPECT_EQ(two.stats[s].loss_scale, one.stats[s].loss_scale) << "step " << s;
    EXPECT_EQ(two.stats[s].skipped, one.stats[s].skipped) << "step " << s;
  }
  EXPECT_EQ(two.scaler, one.scaler);
  EXPECT_GT(one.scaler.scale, 65536);               // it grew: the scaler was in play
  EXPECT_LT(one.stats[3].loss, one.stats[0].loss);  // it learns: the comparison is not moot
  ExpectSameState(two.final, one.final, "2 devices vs 1");
}

// f16 tracks f32 on the same job. Tolerance from f16's precision: every value a token's forward
// stores in f16 (the embedding, per block the norm, q, k, v, attention, o-projection, residual,
// norm, gate, up, SwiGLU, down projection and residual, then the head's input) is rounded with
// relative error at most u = 2^-11; R = 2 + 13 L such roundings bound the loss's relative error
// by R u to first order (4 blocks: 54 u = 2.6%). Later steps add the updates' differences, which
// AdamW bounds by ~lr per element per step whatever the gradient error; the bound is kept at R u
// and the measured figure printed. f16 must differ from f32 (it ran in f16) and the loss must fall
// by more than the tolerance (the comparison is not moot).
TEST(F16TrainingTest, LossesTrackF32WithinF16Precision) {
  const Model m = LoadModel("llama");
  PlanSpec spec{{{1, 3}, {3, 5}}, {}, 2, 2, 16, 2, DType::kF32};
  const HostTensors w = RandomWeights(m, 33);
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 4);
  OptimizerOptions o32 = ScaledOptions(1, 2000);
  o32.loss_scaling = {};
  o32.schedule = {1e-2, 1, 4, 0.1};
  const ScaledRun f32 = TrainScaled(m, MakeTestPlan(m, spec), 2, w, o32, steps);
  spec.dtype = DType::kF16;
  OptimizerOptions o16 = o32;
  o16.loss_scaling = {.enabled = true};
  const ScaledRun f16 = TrainScaled(m, MakeTestPlan(m, spec), 2, w, o16, steps);
  ASSERT_EQ(f32.stats.size(), 4u);
  ASSERT_EQ(f16.stats.size(), 4u);
  const double tol = double(2 + 13 * m.config.num_layers) * 0x1p-11;
  double worst = 0;
  for (size_t s = 0; s < 4; ++s) {
    const double rel = std::abs(f16.stats[s].loss - f32.stats[s].loss) / f32.stats[s].loss;
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tol) << "step " << s << ": f16 " << f16.stats[s].loss << ", f32 "
                        << f32.stats[s].loss;
    EXPECT_FALSE(f16.stats[s].skipped) << "step " << s;
  }
  EXPECT_NE(f16.stats[0].loss, f32.stats[0].loss);  // f16 storage was in play
  EXPECT_GT((f32.stats[0].loss - f32.stats[3].loss) / f32.stats[0].loss, tol);
  std::printf("f16 vs f32 losses over 4 steps: worst relative difference %.3g (bound %.3g)\n",
              worst, tol);
}

// An initial scale far too large (2^28) overflows the f16 activation gradients: each such step
// is skipped whole (weights and AdamW moments bit for bit the initial ones) and halves the scale,
// until a step is finite. That first update equals a fresh trainer's first update at the scale it
// ran with, bit for bit — AdamW's step count (bias correction) did not advance over the skips
// (the schedule is constant here, so only that could differ) — and training then proceeds.
TEST(F16TrainingTest, OverflowSkipsTheStepHalvesTheScaleAndTrainingProceeds) {
  const Model m = LoadModel("llama");
  const PlanSpec spec{{{1, 3}, {3, 5}}, {}, 1, 2, 16, 2, DType::kF16};
  const plan::Plan p = MakeTestPlan(m, spec);
  const HostTensors w = RandomWeights(m, 35);
  OptimizerOptions o = ScaledOptions(0x1p28, 2000);
  o.schedule = {1e-2, 0, 100, 1.0};  // constant
  const std::vector<std::vector<MicroBatch>> steps = TrainingSteps(m, spec, 28);
  const ScaledRun big = TrainScaled(m, p, 2, w, o, steps, /*until_applied=*/true);
  ASSERT_GE(big.stats.size(), 2u) << "2^28 did not overflow f16: the test is moot";
  ASSERT_FALSE(big.stats.back().skipped) << "no step was finite down to scale 1";
  const size_t skipped = big.stats.size() - 1;
  for (size_t s = 0; s < skipped; ++s) {
    EXPECT_TRUE(big.stats[s].skipped) << "step " << s;
    EXPECT_EQ(big.stats[s].loss_scale, std::ldexp(1.0, 28 - int(s))) << "step " << s;
    EXPECT_TRUE(std::isfinite(big.stats[s].loss)) << "the loss itself is not scaled";
  }
  EXPECT_EQ(big.scaler.skipped_steps, int64_t(skipped));
  EXPECT_EQ(big.scaler.scale, std::ldexp(1.0, 28 - int(skipped)));
  EXPECT_EQ(big.scaler.growth_tracker, 1);

  // The skips changed nothing: a run stopped just before the finite step still has the initial
  // state (checked on a copy that stops there).
  std::vector<std::vector<MicroBatch>> only_skips(steps.begin(), steps.begin() + skipped);
  const ScaledRun stopped = TrainScaled(m, p, 2, w, o, only_skips);
  ExpectSameState(stopped.final, stopped.initial, "after " + std::to_string(skipped) + " skips");

  OptimizerOptions fresh_options = o;
  fresh_options.loss_scaling.initial_scale = big.stats.back().loss_scale;
  const ScaledRun fresh = TrainScaled(m, p, 2, w, fresh_options, {steps[0]});
  ASSERT_EQ(fresh.stats.size(), 1u);
  ASSERT_FALSE(fresh.stats[0].skipped);
  EXPECT_EQ(fresh.stats[0].loss, big.stats.back().loss);
  ExpectSameState(big.final, fresh.final, "first update after skips vs a fresh first update");

  // Training proceeds: eight more steps of the same run lower the loss. (2^17 sits at the edge:
  // a later step may overflow again and halve the scale once more, as GradScaler would.)
  const ScaledRun on =
      TrainScaled(m, p, 2, w, o,
                  std::vector<std::vector<MicroBatch>>(steps.begin(), steps.begin() + skipped + 9));
  ASSERT_EQ(on.stats.size(), skipped + 9);
  int applied = 0;
  for (size_t s = skipped; s < on.stats.size(); ++s) applied += !on.stats[s].skipped;
  EXPECT_GE(applied, 6);
  EXPECT_EQ(on.scaler.skipped_steps, int64_t(on.stats.size()) - applied);
  EXPECT_LT(on.stats.back().loss, on.stats[skipped].loss);
  std::printf("f16 overflow: %zu steps skipped from 2^28 down to 2^%d\n", skipped,
              28 - int(skipped));
}

}  // namespace
}  // namespace ferry::exec
