// The planner: a pure function from a model, a job and a machine (hardware
// profile with its budgets applied) to a Plan — the partition into stages,
// micro-batches, per-layer activation policy, the tier of each tensor group,
// the exact memory of every tier (memory_model.h) and the predicted step time
// from the simulator's round-robin schedule (DESIGN.md, "Plan").
//
// Search: every candidate in a fixed grid — layers per stage, micro-batch
// count, activation policy (keep, save all, per-layer choice, recompute all),
// the tail's parts, gradient accumulators per device (one or two) and tier of
// each group (host or NVMe) — is sized by the memory model; the fastest
// candidate that fits every budget wins (ties: Preferred's order). Since the grid does not depend
// on the budgets, more memory can only add candidates, so it never yields a slower predicted step.
// When nothing fits, the outcome names the binding constraint (the tier short by the largest factor
// in the candidate closest to fitting) and the smallest changes that fit — each re-planned.
//
// Stages: forward and backward stages use the same layer ranges (balanced by
// forward plus backward cost); the head + loss is the fused tail.
//
// Updates: synchronous by default (the next step's forward of a stage waits for its update, so
// the update of the first stage, whose gradients land last, is on the critical path). Every plan
// also prices one-step-stale updates (the next step runs on weights one update older, so the
// optimizer overlaps the next step: the step is bounded by the last gradient download or by the
// optimizer's total time, whichever is longer; and its first stage's weights are read ahead, as
// the executor does: packed and uploaded after the step before's last compute, not at the step's
// start, RoundRobinJob::first_weights_ahead). Stale updates change the numerics: the planner
// never chooses them by itself; PlanJob::stale_updates opts in (candidates are then ranked by the
// stale price and step_s is it).
//
// Pure functions over value types; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_fwd.h"
#include "engine/model/converted_base.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/plan/hardware_profile.h"
#include "engine/plan/memory_model.h"
#include "engine/plan/pipeline_schedules.h"
#include "kernels/status.h"
#include "offload/tier.h"

namespace ferry::plan {

struct PlanJob {
  int64_t global_batch = 16;  // sequences per optimizer update
  int64_t seq_len = 2048;
  int64_t micro_batches = 0;  // 0: auto (at least GPUs + 1 when the batch allows)
  LoraConfig lora;            // rank 0: full fine-tuning
  DType compute_dtype = DType::kBF16;
  // fp16 GEMMs accumulating in fp16 (RoundPipe's mode; `--dtype fp16acc`), priced at the GPU's
  // fp16-accumulate rate. The planner's price only: no executor runs it yet. REQUIRES: fp16.
  bool fp16_accumulate = false;
  ScratchTarget scratch;       // CUDA unless planning for CPU devices
  bool stale_updates = false;  // opt-in one-step-stale updates (changes the numerics)
  // The most forward stages a plan may have (0: any). `ferry train` on one CPU device asks for
  // 1: there a copy takes the cores the compute needs, so streaming weights never pays.
  int max_stages = 0;
  // The most parts the fused head + loss tail's micro-batches may be split into, each part a
  // stage of the round robin on the next device (RoundRobinJob::tail_parts; each part after the
  // first lands the head's gradients in a host buffer of its own); 0: up to min(micro-batches,
  // GPUs); 1: the tail on one device.
  int max_tail_parts = 0;
  // Forward only (evaluation): the memory model's forward-only map (memory_model.h); the
  // predicted times still price a training step.
  bool forward_only = false;
  // Generation (forward only, one sequence, a KV cache of this many tokens; memory_model.h's
  // MemoryPlanInput::generate_positions): seq_len is the longest step (the prompt), global_batch 1;
  // f32 (decode attention's storage). `logit_rows`: the most tokens a step returns logits of.
  int64_t generate_positions = 0;
  int64_t logit_rows = 1;
  // The frozen base stays in host RAM. Without it, a LoRA training job may stream its base from
  // NVMe each step (the frozen weights there), as the executor runs it: from the model's files
  // where they serve it as uploaded, else from a copy converted once, which the memory model
  // counts (weights.frozen on NVMe; engine/model/converted_base.h).
  bool host_frozen_weights = false;
  // The frozen base comes from the model's safetensors files, which serve it (memory_model.h's
  // MemoryPlanInput::frozen_base_from_files): any model but `tiny`, whose base is made from the
  // seed and held in fp32.
  bool frozen_base_from_files = false;
  // Where each tensor lies in those files (FolderTensorLayout), when the plan is made
  // from the folder: a streamed base is read in whole blocks of the drive, and the plan counts
  // them. nullptr: the most they can be (StreamedBaseSource::DriveBytes).
  std::shared_ptr<const TensorFileLayout> base_file_layout = nullptr;
  // Packed data's documents: [b - 1] is the most documents any b of its rows hold (a row's pieces
  // and its padding each count; PackedRows::MostDocuments), for b up to global_batch. Empty: one
  // per sequence. A micro-batch of B rows is planned (and run) with max_documents [B - 1].
  std::vector<int64_t> documents_in_rows = {};
  // The packed data's rows in host RAM (training and validation: PackedRows::host_bytes), which
  // the plan counts as "data.rows" (pageable). 0: none counted (the built-in text, a preset's
  // data that is not read).
  uint64_t data_host_bytes = 0;
};

// What a job's data tells its plan: PlanJob::documents_in_rows and data_host_bytes.
struct DataCounts {
  std::vector<int64_t> documents_in_rows = {};
  uint64_t host_bytes = 0;
};

// One micro-batch of `micro_batch_size` sequences of the job: B x T and the most documents B rows
// hold (PlanJob::documents_in_rows; 0 when it is empty or shorter than B).
BatchShape MicroBatchShape(const PlanJob& job, int64_t micro_batch_size);

// The `--dtype` name of fp16 with fp16 accumulation.
inline constexpr std::string_view kFp16AccumulateName = "fp16acc";

// The job's compute mode as `--dtype` spells it: "fp16acc" or the compute dtype's name.
std::string ComputeModeName(const PlanJob& job);

struct Plan {
  std::string model_name;
  std::string hardware_name;
  int gpus = 1;
  PlanJob job;
  int micro_batches = 1;
  int64_t micro_batch_size = 1;    // sequences
  std::vector<LayerRange> stages;  // forward stages in layer order; backward runs them reversed
  int tail_parts = 1;              // the tail's micro-batches over this many devices
  int grad_accumulators = 1;       // per device, 1 or 2 (RoundRobinJob::grad_accumulators)
  std::vector<bool> recompute;     // per layer (embedding, blocks, head)
  // "keep" (each device keeps its blocks' inputs and saved sets: keep_activations), "save",
  // "per-layer", "recompute".
  std::string activation_policy;
  Tier activations = Tier::kHost;
  bool keep_activations = false;  // memory_model.h's MemoryPlanInput::keep_activations
  Tier optimizer_state = Tier::kHost;
  Tier frozen_weights = Tier::kHost;
  MemoryEstimate memory;
  uint64_t gpu_budget = 0;
  uint64_t host_budget = 0;
  uint64_t nvme_budget = 0;
  // Predictions per optimizer step.
  double step_s = 0;        // with the job's update mode
  double sync_step_s = 0;   // with synchronous updates
  double stale_step_s = 0;  // with one-step-stale updates (priced, used only when opted in)
  double tokens_per_s = 0;
  double bubble_fraction = 0;
  double pcie_h2d_bytes = 0;  // all GPUs together
  double pcie_d2h_bytes = 0;
  double nvme_read_bytes = 0;
  double nvme_write_bytes = 0;
  // A base streamed from the model's files whose layout the plan lacks (PlanJob::base_file_layout):
  // the reads of the weights they serve are counted at the most they can take.
  bool base_reads_at_most = false;
  // The executor's host thread per step, as the simulator ran it (synchronous updates): packing
  // the weights into the upload mirrors, adding the landed gradients, the embedding's gather and
  // scatter-add: each task's simulated time, its share of the host's bandwidth beside the copies
  // included (time of the host thread, not of the step: much of it overlaps the GPUs).
  double host_pack_s = 0;
  double host_grad_add_s = 0;
  double host_embedding_s = 0;
  // Where each layer's compute time came from, per layer of BuildLayerSpecs: true when the
  // hardware profile's layer_times had the layer's LayerTimeKey (measured), false for the FLOP
  // formulas at the profile's effective rate.
  std::vector<bool> measured_times;
  // NVMe wear; the profile's layer times unused: it has some but none for this job (naming the
  // dtype they were measured in when only the dtype differs: `ferry probe --model` measures f32).
  std::vector<std::string> warnings;

  // "measured" (every layer), "formulas" (none) or "mixed".
  std::string_view LayerTimeSource() const;
};

// The memory model's input for `plan` of `model`: its job, stages, recomputation, micro-batches,
// device count and tiers, so ComputeMemory(MemoryInputOf(model, plan)) is its memory map (for a
// plan made or changed outside the planner).
MemoryPlanInput MemoryInputOf(const ModelConfig& model, const Plan& plan);

// Where `job`'s streamed base is read from (engine/model/converted_base.h).
StreamedBaseSource StreamedBaseSourceOf(const ModelConfig& model, const PlanJob& job);

// The bytes of the frozen base a LoRA training step reads from NVMe when it streams it (the frozen
// weights on NVMe), over `layers` (BuildLayerSpecs) split into `stages` on `gpus` devices: the
// drive's blocks that each stage's layers' base takes where `source` reads it (each of the tail's
// `tail_parts` parts the head's), unless its device's weight slot holds them already
// (ResidentBases, as the executor places the stages step after step).
double StreamedBaseBytes(const std::vector<LayerSpec>& layers, const StreamedBaseSource& source,
                         const std::vector<LayerRange>& stages, int gpus, int tail_parts = 1);
// The drive's blocks a block's or the head's frozen base takes where `source` reads it (an
// embedding: 0).
double LayerBaseBytes(const LayerSpec& layer, const StreamedBaseSource& source);
// Whether the executor can stream `job`'s frozen base from NVMe (its frozen weights there): LoRA
// training. The planner offers that tier only then (and not with host_frozen_weights); the
// executor refuses any other plan that puts frozen weights there.
bool CanStreamBase(const PlanJob& job);

// The margin NVMe advice adds to the space a plan puts on the drive (PlanSuggestion).
inline constexpr uint64_t kNvmeSpaceMarginPercent = 10;

struct PlanSuggestion {
  std::string change;  // "--seq-len 1024", "--host-memory 512GiB", ...
  Plan plan;           // the re-planned job, which fits
};

// One candidate MakePlan weighed: its choices, whether it fits, and what the simulator predicts
// for it (for one that does not fit, only when explaining). `ferry plan --explain` lists them
// (ExplainCandidates).
struct PlanCandidate {
  int micro_batches = 0;
  int stages = 0;
  int tail_parts = 1;
  int grad_accumulators = 1;
  std::string policy;  // activation policy: keep, save, per-layer, recompute
  int recomputed = 0;  // blocks recomputed in backward
  Tier activations = Tier::kHost, optimizer = Tier::kHost, frozen = Tier::kHost;
  bool fits = false;
  // The tightest tier's need over its budget (<= 1: fits) and its name ("GPU memory", "host
  // memory", "NVMe space").
  double need_ratio = 0;
  std::string tightest;
  uint64_t tightest_bytes = 0;  // that tier's need (one of the three below)
  // Simulated: the step (the job's update mode) and its bubble; for one that does not fit, what
  // it would take if the budgets allowed it, and 0 unless MakePlan was explaining (or when its
  // schedule could not be simulated).
  double step_s = 0, bubble_fraction = 0;
  uint64_t gpu_bytes = 0, host_bytes = 0, nvme_bytes = 0;  // per GPU; pinned + pageable; space
  double nvme_read_bytes = 0;                              // per step
};

// The order MakePlan chooses by, among candidates that fit: the shorter step, then at equal
// speed the frozen base kept in RAM over one streamed from NVMe, then less NVMe space, fewer NVMe
// reads, less host memory, less GPU memory. True when `a` wins over `b`.
bool Preferred(const PlanCandidate& a, const PlanCandidate& b);

struct PlanOutcome {
  bool feasible = false;
  Plan plan;            // the chosen plan when feasible; else only its `job` is set
  std::string binding;  // when infeasible: what is short, with the numbers
  std::vector<PlanSuggestion> suggestions;
  // Every candidate the search weighed, in search order, fitting or not; the chosen plan's is
  // the first of them in Preferred order.
  std::vector<PlanCandidate> candidates;
};

// Validates the inputs (InvalidArgument naming the option), then searches.
// `suggest`: compute suggestions when nothing fits (each re-plans the job
// several times). `explain`: simulate the candidates that do not fit too (what more memory
// would buy, ExplainCandidates); the choice is the same either way.
[[nodiscard]] Result<PlanOutcome> MakePlan(const std::string& model_name, const ModelConfig& model,
                                           const PlanJob& job, const HardwareProfile& hardware,
                                           bool suggest = true, bool explain = false);

// When `job` fits nowhere on `hardware`: the smallest changes that do fit, each
// re-planned (the longest sequence that fits, one sequence per micro-batch,
// LoRA rank 16 on all projections, the host RAM needed, an NVMe directory).
// Empty when none of them fits.
std::vector<PlanSuggestion> SuggestChanges(const std::string& model_name, const ModelConfig& model,
                                           const PlanJob& job, const HardwareProfile& hardware);

// Re-prices `plan` (made by MakePlan for `model`, maybe on another profile) on `hardware`: the
// same stages, tail parts, gradient accumulators, micro-batches, recomputation, kept activations
// and tiers, simulated with its rates and layer times, so its step, bubble, traffic, host work,
// measured_times and tokens/s are what MakePlan would have found for that candidate on `hardware`
// (hardware_name becomes its name). Memory, budgets, NVMe traffic and warnings are left as they
// are (an NVMe warning's per-day figure stays the first pricing's). Errors: InvalidArgument when
// the model, job or profile do not validate, or the profile's device count or the model's layers
// are not the plan's; those of building and simulating the schedule. On an error the plan is
// unchanged.
[[nodiscard]] Status PricePlan(const ModelConfig& model, const HardwareProfile& hardware,
                               Plan& plan);

// The plan's stages as the simulator's round-robin job, and the 1F1B baseline's
// stages (one per GPU, weights resident, activations saved on the GPU).
RoundRobinJob RoundRobinJobOf(const ModelConfig& model, const Plan& plan,
                              const HardwareProfile& hardware);
std::vector<StageCost> BaselineStagesOf(const ModelConfig& model, const PlanJob& job,
                                        int micro_batches, const HardwareProfile& hardware);
// Bytes per GPU the 1F1B baseline needs: resident bf16 weights, fp32 gradients,
// master and moments of its stage, and the saved activations of the
// micro-batches in flight on GPU 0.
uint64_t BaselineGpuBytes(const ModelConfig& model, const PlanJob& job, int micro_batches,
                          int gpus);

nlohmann::json PlanToJson(const Plan& plan);
nlohmann::json OutcomeToJson(const PlanOutcome& outcome);
// A readable summary and a per-device memory table.
// The key of a layer's measured time in a hardware profile (MeasuredLayerTime): the layer's kind
// and name ("block", "head", "embedding"), the model shapes it computes with, the micro-batch
// (rows x sequence length), the compute dtype and LoRA (rank, targets, or "full"); e.g.
// "block llama C=64 I=96 H=4 KV=2 D=16 V=260 B=2 T=24 f32 full". A block's key also names what
// changes its time beyond the sizes: q/k RMSNorm ("qknorm", Qwen3), biases ("bias=qkv,o,mlp"
// as present) and a sliding window shorter than the sequence ("window=4096"; a longer one
// computes as full causal attention). The planner uses a profile's times for a key it finds, its
// FLOP formulas (at the profile's effective rate) otherwise.
std::string LayerTimeKey(const ModelConfig& model, const PlanJob& job, const LayerSpec& layer,
                         BatchShape micro);

// One key MakePlan looks up: the first layer (index into BuildLayerSpecs) that has it and the
// micro-batch shape it is looked up for.
struct LayerTimeQuery {
  std::string key;
  int layer = 0;
  BatchShape micro;
};
// Every distinct key MakePlan(model, job, hardware) looks up in hardware.layer_times, where
// hardware has `gpus` GPUs: each distinct layer shape at each micro-batch size the search tries
// (one with --micro-batches, up to five otherwise). What a layer probe must measure for the plan
// to use measured times only. REQUIRES: the model and job validate.
std::vector<LayerTimeQuery> LayerTimeQueries(const ModelConfig& model, const PlanJob& job,
                                             int gpus);

std::string PlanSummary(const Plan& plan);
std::string OutcomeSummary(const PlanOutcome& outcome);
// Why the plan won (`ferry plan --explain`): how many candidates were weighed and how many fit
// (and, of the rest, which tier each was short of), a table of the chosen plan and the `most`
// fastest runners-up in Preferred order, each with what lost it the choice ("+4.10% step", "equal
// speed, base streamed from NVMe", "equal speed, 3.33 GiB more NVMe space", ...); then, of those
// that do not fit, up to 3 that would be faster than the chosen plan (what more memory would
// buy; the 3 fastest when nothing fits) and the 3 that came closest to fitting, each with its
// step when simulated and what it is short of. Each line ends in '\n'.
std::string ExplainCandidates(const PlanOutcome& outcome, size_t most = 10);
// The candidates as JSON (an array of objects, in search order), for `--json --explain`.
nlohmann::json CandidatesToJson(const std::vector<PlanCandidate>& candidates);

}  // namespace ferry::plan
