#include "engine/exec/pipeline_runner.h"

namespace ferry::exec {
namespace {

class PipelineRunner final : public ModelRunner {
 public:
  explicit PipelineRunner(std::unique_ptr<PipelineExecutor> e) : e_(std::move(e)) {}

  Status UploadWeights(const HostTensors& weights) override {
    weights_ = &weights;
    return Status::Ok();
  }
  bool streams_weights() const override { return true; }
  Result<double> AccumulateStep(std::span<const MicroBatchInput> batches, HostTensors& grads,
                                const StepHooks& hooks) override {
    if (weights_ == nullptr) {
      return Status::FailedPrecondition("UploadWeights must name the master weights first");
    }
    return e_->Step(*weights_, batches, grads, hooks);
  }
  Result<double> AccumulateGradients(const MicroBatchInput&, HostTensors&) override {
    return Status::FailedPrecondition(
        "a pipeline runs all micro-batches of a step at once: call AccumulateStep");
  }
  Result<double> EvaluateLoss(const MicroBatchInput& mb) override {
    if (weights_ == nullptr) {
      return Status::FailedPrecondition("UploadWeights must name the master weights first");
    }
    return e_->Evaluate(*weights_, {&mb, 1});
  }
  Result<std::vector<float>> Logits(std::span<const int32_t>) override {
    return Status::FailedPrecondition(
        "the pipeline executor does not compute full logits: use the generator (engine/exec/"
        "planned_generator.h) or, in tests, the reference runner");
  }
  uint64_t host_resident_bytes() const override { return e_->HostResidentBytes(); }
  RunnerStats stats() const override {
    RunnerStats s;
    const ExecutorStats e = e_->stats();
    s.block_forward_calls = e.block_forward_calls;
    s.base_bytes_from_drive = e.base_bytes_from_drive;
    s.stages_read_ahead = e.stages_read_ahead;
    return s;
  }

 private:
  std::unique_ptr<PipelineExecutor> e_;
  const HostTensors* weights_ = nullptr;  // borrowed: the caller's master copy
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreatePipelineRunner(std::vector<Device*> devices,
                                                          const ModelConfig& config,
                                                          const plan::Plan& plan,
                                                          TraceRecorder* trace,
                                                          NvmeStore* activation_store) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<PipelineExecutor> e,
                         PipelineExecutor::Create(std::move(devices), config, plan, nullptr, trace,
                                                  nullptr, activation_store));
  return std::unique_ptr<ModelRunner>(std::make_unique<PipelineRunner>(std::move(e)));
}

}  // namespace ferry::exec
