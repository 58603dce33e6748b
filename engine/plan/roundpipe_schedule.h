// RoundPipe's schedule replayed on ferry's simulator, to calibrate the simulator against a
// published system (issue 17). RoundPipe (Luo et al., "Efficient Training on Multiple Consumer
// GPUs with RoundPipe", arXiv 2604.27085; github.com/ITcarrot/RoundPipe) runs the same
// round-robin dispatch as ferry — a global counter hands each stage to the next GPU, which runs
// it for every micro-batch — and differs in what this file reproduces:
// - its partition (roundpipe/scheduler.py, ModelExecutePlan.auto("fused")): a stage may take up
//   to `upper_threshold` x the slowest layer's time; forward stages and backward stages are cut
//   separately (asymmetric), each filled from the last layer down; the fused tail is the last
//   layers whose recompute + backward fits one stage, run forward then backward on one GPU with
//   no recomputation; of the candidate stage sizes it keeps the one minimising
//   max(stages, min_stages) x stage size; a stage's weights (and, backward, its gradients) stay
//   under half of 60% of the GPU's memory (RoundPipe prefetches one stage while another runs);
// - every layer is recomputed in backward (the inputs of the layers where backward stages start
//   go to the host in forward);
// - the embedding is a GPU layer (its weights upload and its gradient downloads like any other);
//   gradients come back in the compute dtype;
// - updates (roundpipe/roundpipe.py, step; attribute.py, LayerAttribute): the CPU optimizer waits
//   for every gradient, updates the whole model, then refreshes the compute-dtype parameters
//   from its fp32 copy (reading 4 and writing 2 bytes per parameter). Synchronous mode
//   (`step(is_async=False)`) starts the next step after that: makespan + optimizer + refresh.
//   The default one-step-stale mode returns from forward_backward once the fused tail has
//   finished every micro-batch, so the next step's stages queue on the GPUs behind this step's
//   backward stages (the device counter runs on); its forward waits for the refresh, which waits
//   for this step's last backward stage to begin uploading. The step is the period of such
//   overlapped iterations (simulated two at a time), or the optimizer's time when longer.
// Layer times come from ferry's cost model at the profile's rate for the job's mode (fp16acc:
// RoundPipe's benchmark enables fp16 accumulation). No cost constant enters here but RoundPipe's
// own defaults, quoted from its source.
//
// Pure functions over value types; thread-safe.
#pragma once

#include <vector>

#include "engine/model/model_config.h"
#include "engine/plan/hardware_profile.h"
#include "engine/plan/memory_model.h"
#include "engine/plan/pipeline_schedules.h"
#include "engine/plan/planner.h"
#include "kernels/status.h"

namespace ferry::plan {

// RoundPipe's defaults (roundpipe/scheduler.py, ModelExecutePlan.auto).
struct RoundPipeSettings {
  int min_stages = 0;            // 0: the GPU count
  double upper_threshold = 1.1;  // a stage takes at most this x the slowest layer
  // Of the GPU memory a program may use (RoundPipe: free + reserved, cudaMemGetInfo), for stage
  // weights and gradients; half per stage (one prefetched while another runs).
  double memory_fraction = 0.6;
};

// One layer as RoundPipe's partitioner sees it, per micro-batch.
struct RoundPipeLayer {
  double fwd_s = 0;         // forward (= its recomputation)
  double bwd_s = 0;         // backward alone; RoundPipe's "backward time" is fwd_s + bwd_s
  double bytes = 0;         // parameters in the compute dtype
  double grad_bytes = 0;    // their gradients (compute dtype)
  double input_bytes = 0;   // the hidden state coming in
  double output_bytes = 0;  // the hidden state going out
  double params = 0;        // parameters the optimizer updates (tied ones once)
};

struct RoundPipePartition {
  std::vector<LayerRange> forward;   // layer order
  LayerRange tail;                   // fused forward + backward of the last layers
  std::vector<LayerRange> backward;  // execution order (deepest first), after the tail
  double stage_s = 0;                // the stage size chosen (RoundPipe's max_stage_workload)
};

// RoundPipe's ModelExecutePlan.auto("fused") for one model. InvalidArgument when `layers` is
// empty or min_stages < 1.
[[nodiscard]] Result<RoundPipePartition> PartitionLikeRoundPipe(
    const std::vector<RoundPipeLayer>& layers, int min_stages, double upper_threshold,
    double stage_memory_bytes);

// The round-robin job of a RoundPipe partition: stage costs and transfers, no optimizer tasks
// (ReplayRoundPipe prices the optimizer per update mode).
RoundRobinJob RoundPipeJobOf(const std::vector<RoundPipeLayer>& layers,
                             const RoundPipePartition& partition, int gpus, int micro_batches);

struct RoundPipeReplay {
  RoundPipePartition partition;
  double makespan_s = 0;    // one iteration alone: every micro-batch, all transfers
  double period_s = 0;      // stale mode: between the ends of two overlapped iterations
  double optimizer_s = 0;   // the CPU optimizer over every parameter
  double param_copy_s = 0;  // the refresh of the compute-dtype parameters from the optimizer's
  double sync_step_s = 0;   // makespan + optimizer + refresh
  double stale_step_s = 0;  // max(period, optimizer + refresh)
  double bubble_fraction = 0;
  double sync_tokens_per_s = 0;
  double stale_tokens_per_s = 0;
};

// The period of back-to-back iterations of `one`, a round-robin schedule of `stages` stages,
// overlapped as RoundPipe's stale mode runs them: the next iteration's stages continue the
// device counter and queue behind this one's on every lane; it launches once this one's tail has
// finished every micro-batch, its last stage has begun uploading and a host-memory task of
// `refresh_bytes` (the parameter refresh; 0: none) has run. Optimizer tasks are not waited for.
// Simulates two iterations; the period is the distance between their ends.
[[nodiscard]] Result<double> OverlappedIterationPeriod(const Schedule& one, int stages,
                                                       double refresh_bytes,
                                                       const LaneRates& rates);

// RoundPipe's published throughput, tokens/s, on 8x RTX 4090 for RoundPipeBenchmarkJob (arXiv
// 2604.27085, as quoted in issue 17; the stale figures are also in github.com/ITcarrot/RoundPipe's
// README). `model` names the preset in configs/models.
struct RoundPipePublished {
  const char* model;
  double sync_tokens_per_s;
  double stale_tokens_per_s;
};
inline constexpr RoundPipePublished kRoundPipePublished[] = {
    {"qwen3-1.7b", 56489, 65417}, {"llama-3.1-8b", 18888, 24275}, {"qwen3-32b", 4164, 5516}};

// The job behind those figures: full fine-tuning, batch 20 x 2048 tokens, 10 micro-batches, fp16
// with fp16 accumulation (RoundPipe's benchmark/train.py sets allow_fp16_accumulation).
PlanJob RoundPipeBenchmarkJob();

// RoundPipe's layers for `job` on `hw` (embedding, blocks, head + loss).
std::vector<RoundPipeLayer> RoundPipeLayersOf(const ModelConfig& model, const PlanJob& job,
                                              const HardwareProfile& hw, int micro_batches);

// Replays RoundPipe's schedule for `job` (full fine-tuning; job.micro_batches must divide the
// batch and be >= 1) on `hw`. InvalidArgument for a job RoundPipe's replay does not cover.
[[nodiscard]] Result<RoundPipeReplay> ReplayRoundPipe(const ModelConfig& model, const PlanJob& job,
                                                      const HardwareProfile& hw,
                                                      const RoundPipeSettings& settings = {});

}  // namespace ferry::plan
