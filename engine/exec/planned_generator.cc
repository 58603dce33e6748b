// The executor's Generator (engine/exec/planned_generator.h has the contract).
#include "engine/exec/planned_generator.h"

#include <string>
#include <utility>

#include "engine/exec/pipeline_executor.h"
#include "engine/plan/memory_model.h"

namespace ferry::exec {
namespace {

class Impl final : public PlannedGenerator {
 public:
  Impl(std::unique_ptr<PipelineExecutor> e, const HostTensors& weights, int64_t capacity)
      : e_(std::move(e)), weights_(weights), capacity_(capacity) {}

  Result<std::vector<float>> Forward(std::span<const int32_t> tokens, bool last_only) override {
    FERRY_ASSIGN_OR_RETURN(std::vector<float> logits,
                           e_->Decode(weights_, tokens, length_, last_only));
    length_ += int64_t(tokens.size());
    return logits;
  }
  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  void Reset() override { length_ = 0; }
  ExecutorStats stats() const override { return e_->stats(); }

 private:
  std::unique_ptr<PipelineExecutor> e_;
  const HostTensors& weights_;
  const int64_t capacity_;
  int64_t length_ = 0;
};

}  // namespace

Result<std::unique_ptr<PlannedGenerator>> CreatePlannedGenerator(std::vector<Device*> devices,
                                                                 const ModelConfig& config,
                                                                 const plan::Plan& plan,
                                                                 const HostTensors& weights) {
  if (plan.job.generate_positions < 1) {
    return Status::InvalidArgument(
        "generation needs a generation plan (a KV cache: PlanJob::generate_positions)");
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<PipelineExecutor> e,
                         PipelineExecutor::Create(std::move(devices), config, plan));
  return std::unique_ptr<PlannedGenerator>(
      new Impl(std::move(e), weights, plan.job.generate_positions));
}

plan::Plan GenerationPlan(const ModelConfig& config, const LoraConfig& lora,
                          std::vector<plan::LayerRange> stages, int gpus, int64_t positions,
                          int64_t max_step, int64_t logit_rows, plan::ScratchTarget scratch) {
  if (stages.empty()) stages = {{1, int(config.num_layers) + 1}};
  plan::Plan p;
  p.gpus = gpus;
  p.job.global_batch = 1;
  p.job.seq_len = max_step;
  p.job.micro_batches = 1;
  p.job.lora = lora;
  p.job.compute_dtype = DType::kF32;
  p.job.scratch = scratch;
  p.job.forward_only = true;
  p.job.generate_positions = positions;
  p.job.logit_rows = logit_rows;
  p.micro_batches = 1;
  p.micro_batch_size = 1;
  p.stages = std::move(stages);
  p.recompute.assign(size_t(config.num_layers) + 2, false);
  p.activation_policy = "save";
  p.memory = plan::ComputeMemory(plan::MemoryInputOf(config, p));
  return p;
}

}  // namespace ferry::exec
