#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/model/master_weights.h"
#include "engine/train/grad_clip.h"

namespace ferry {

Trainer::Trainer(ModelRunner* runner, std::vector<LayerSpec> layers, HostTensors weights,
                 const OptimizerOptions& options, ThreadPool* pool)
    : runner_(runner),
      layers_(std::move(layers)),
      weights_(std::move(weights)),
      options_(options),
      pool_(pool) {}

Result<std::unique_ptr<Trainer>> Trainer::Create(ModelRunner* runner, std::vector<LayerSpec> layers,
                                                 HostTensors weights,
                                                 const OptimizerOptions& options,
                                                 ThreadPool* pool) {
  FERRY_RETURN_IF_ERROR(ValidateAdamWHyperparameters({.lr = options.schedule.lr,
                                                      .beta1 = options.beta1,
                                                      .beta2 = options.beta2,
                                                      .eps = options.eps,
                                                      .weight_decay = options.weight_decay})
                            .WithContext("optimizer"));
  if (!(options.grad_clip >= 0)) {
    return Status::InvalidArgument("grad_clip must be >= 0 (0 disables clipping)");
  }
  std::unique_ptr<Trainer> t(
      new Trainer(runner, std::move(layers), std::move(weights), options, pool));
  for (const ParamSpec* p : StorageParams(t->layers_)) {
    auto it = t->weights_.tensors.find(p->name);
    if (it == t->weights_.tensors.end() || int64_t(it->second.size()) != p->numel()) {
      return Status::InvalidArgument("master weights lack " + p->name +
                                     " or hold the wrong number of elements");
    }
    if (!p->trainable) continue;
    const size_t n = size_t(p->numel());
    t->grads_.tensors[p->name].assign(n, 0.0f);
    t->state_[p->name] = State{p, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
    t->order_.push_back(p->name);
  }
  FERRY_RETURN_IF_ERROR(runner->UploadWeights(t->weights_));
  return t;
}

size_t Trainer::optimizer_state_bytes() const {
  size_t bytes = 0;
  for (const auto& [name, s] : state_) bytes += (s.m.size() + s.v.size()) * sizeof(float);
  return bytes;
}

Status Trainer::RestoreOptimizer(int64_t steps_done, const HostTensors& exp_avg,
                                 const HostTensors& exp_avg_sq) {
  if (steps_done < 0) return Status::InvalidArgument("a negative step count to restore");
  for (const auto& [name, s] : state_) {
    for (const HostTensors* t : {&exp_avg, &exp_avg_sq}) {
      auto it = t->tensors.find(name);
      if (it == t->tensors.end() || it->second.size() != s.m.size()) {
        return Status::InvalidArgument(std::string("optimizer state ") +
                                       (t == &exp_avg ? "exp_avg" : "exp_avg_sq") + " of " + name +
                                       " is missing or has the wrong number of elements");
      }
    }
  }
  for (auto& [name, s] : state_) {
    s.m = exp_avg.tensors.at(name);
    s.v = exp_avg_sq.tensors.at(name);
  }
  step_ = steps_done;
  return Status::Ok();
}

Result<StepStats> Trainer::Step(std::span<const MicroBatch> micro_batches) {
  StepStats st;
  st.step = step_;
  for (const MicroBatch& mb : micro_batches) {
    st.valid_targets += mb.valid_targets;
    st.tokens += mb.batch * mb.seq_len;
  }
  if (st.valid_targets <= 0) {
    return Status::InvalidArgument("step " + std::to_string(step_) +
                                   ": the batch has no non-masked target to learn from");
  }
  // The first micro-batch overwrites the gradients (MicroBatchInput::overwrite_grads): no
  // zeroing pass.
  std::vector<MicroBatchInput> inputs;
  for (const MicroBatch& mb : micro_batches) {
    inputs.push_back(RunnerInput(mb, double(st.valid_targets)));
    inputs.back().overwrite_grads = inputs.size() == 1;
    inputs.back().host_pool = pool_;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  FERRY_ASSIGN_OR_RETURN(st.loss, runner_->AccumulateStep(inputs, grads_));
  const Clock::time_point t1 = Clock::now();
  st.compute_seconds = std::chrono::duration<double>(t1 - t0).count();
  double sum_sq = 0;
  for (const std::string& name : order_) {
    const std::vector<float>& g = grads_.tensors.at(name);
    sum_sq += kernel_.SumOfSquares(g.data(), DType::kF32, int64_t(g.size()), pool_);
  }
  st.grad_norm = std::sqrt(sum_sq);
  st.clip_coef = ClipCoefficient(sum_sq, options_.grad_clip);
  st.lr = options_.schedule.At(step_);
  for (const std::string& name : order_) {
    State& s = state_.at(name);
    std::vector<float>& p = weights_.tensors.at(name);
    const AdamWHyperparameters h{.lr = st.lr,
                                 .beta1 = options_.beta1,
                                 .beta2 = options_.beta2,
                                 .eps = options_.eps,
                                 .weight_decay = s.spec->decays ? options_.weight_decay : 0.0,
                                 .step = step_ + 1,
                                 .grad_scale = st.clip_coef};
    const cpu::AdamWHostTensor t{p.data(),         grads_.tensors.at(name).data(),
                                 DType::kF32,      s.m.data(),
                                 s.v.data(),       nullptr,
                                 int64_t(p.size())};
    FERRY_RETURN_IF_ERROR(kernel_.Update(h, t, pool_).WithContext(name));
  }
  FERRY_RETURN_IF_ERROR(runner_->UploadWeights(weights_));
  st.optimizer_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  ++step_;
  return st;
}

}  // namespace ferry
