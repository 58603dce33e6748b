#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "engine/model/master_weights.h"
#include "engine/train/grad_clip.h"

namespace ferry {

Trainer::Trainer(ModelRunner* runner, std::vector<LayerSpec> layers, HostTensors weights,
                 const OptimizerOptions& options, ThreadPool* pool, OptimizerStateOptions state)
    : runner_(runner),
      layers_(std::move(layers)),
      weights_(std::move(weights)),
      options_(options),
      state_options_(std::move(state)),
      pool_(pool),
      scaler_(options.loss_scaling) {}

Result<std::unique_ptr<Trainer>> Trainer::Create(ModelRunner* runner, std::vector<LayerSpec> layers,
                                                 HostTensors weights,
                                                 const OptimizerOptions& options, ThreadPool* pool,
                                                 OptimizerStateOptions state) {
  FERRY_RETURN_IF_ERROR(ValidateAdamWHyperparameters({.lr = options.schedule.lr,
                                                      .beta1 = options.beta1,
                                                      .beta2 = options.beta2,
                                                      .eps = options.eps,
                                                      .weight_decay = options.weight_decay})
                            .WithContext("optimizer"));
  if (!(options.grad_clip >= 0)) {
    return Status::InvalidArgument("grad_clip must be >= 0 (0 disables clipping)");
  }
  if (options.loss_scaling.enabled) {
    FERRY_RETURN_IF_ERROR(ValidateLossScalerOptions(options.loss_scaling));
  }
  if (options.stale_updates && !runner->streams_weights()) {
    return Status::InvalidArgument(
        "one-step-stale updates need a runner that reads the weights during the step (a "
        "pipeline: `ferry train` runs every job through one); this runner holds its own copy");
  }
  std::unique_ptr<Trainer> t(
      new Trainer(runner, std::move(layers), std::move(weights), options, pool, state));
  std::map<std::string, size_t> index;  // trainable name -> its place in order_
  for (const ParamSpec* p : StorageParams(t->layers_)) {
    if (p->nf4) {  // a frozen NF4 base weight: held as its codes and quant state
      const bool held =
          t->weights_.nf4.contains(p->name) || t->weights_.nf4_served.contains(p->name);
      if (!held || t->weights_.numel(p->name) != p->numel()) {
        return Status::InvalidArgument("master weights lack the NF4 weight " + p->name +
                                       " or hold the wrong number of elements");
      }
      continue;
    }
    // A frozen weight may be served from its model file (HostTensors::files); a trainable one
    // needs its fp32 values in RAM, for the optimizer.
    const bool held =
        p->trainable ? t->weights_.tensors.contains(p->name) : t->weights_.numel(p->name) >= 0;
    if (!held || t->weights_.numel(p->name) != p->numel()) {
      return Status::InvalidArgument("master weights lack " + p->name +
                                     " or hold the wrong number of elements");
    }
    if (!p->trainable) continue;
    const size_t n = size_t(p->numel());
    t->grads_.tensors[p->name].assign(n, 0.0f);
    // Zeros in RAM, unless a resume brings the moments (below) or they live on NVMe.
    const size_t in_ram = state.nvme_dir.empty() && state.resume == nullptr ? n : 0;
    t->state_[p->name] = State{p, std::vector<float>(in_ram, 0.0f),
                               std::vector<float>(in_ram, 0.0f), t->order_.size()};
    index[p->name] = t->order_.size();
    t->order_.push_back(p->name);
  }
  for (const LayerSpec& l : t->layers_) {
    std::vector<size_t>& lands = t->lands_.emplace_back();
    std::vector<size_t>& reads = t->reads_.emplace_back();
    for (const ParamSpec& p : l.params) {
      auto it = index.find(p.storage_name());
      if (it == index.end()) continue;
      if (p.tied_to.empty()) lands.push_back(it->second);
      reads.push_back(it->second);
    }
  }
  t->readers_.assign(t->order_.size(), 0);
  for (const std::vector<size_t>& reads : t->reads_) {
    for (size_t k : reads) ++t->readers_[k];
  }
  t->pending_.assign(t->order_.size(), 0);
  if (!state.nvme_dir.empty()) {
    t->record_of_.assign(t->order_.size(), 0);
    t->record_offset_.assign(t->order_.size(), 0);
    for (size_t l = 0; l < t->lands_.size(); ++l) {
      if (t->lands_[l].empty()) continue;
      size_t offset = 0;  // floats
      for (size_t k : t->lands_[l]) {
        t->record_of_[k] = t->record_layer_.size();
        t->record_offset_[k] = offset;
        offset += 3 * t->weights_.tensors.at(t->order_[k]).size();
      }
      t->record_layer_.push_back(l);
      t->record_params_.push_back(t->lands_[l]);
    }
    // The layer whose read applies a record's update (SetUpdateOrder): the first that reads one
    // of its parameters, or with stale updates the last.
    std::vector<size_t> first_read(t->order_.size(), t->reads_.size()), last_read(t->order_.size());
    for (size_t l = 0; l < t->reads_.size(); ++l) {
      for (size_t k : t->reads_[l]) {
        first_read[k] = std::min(first_read[k], l);
        last_read[k] = l;
      }
    }
    std::vector<std::pair<size_t, size_t>> by_read;  // (the layer that applies it, record)
    for (size_t g = 0; g < t->record_params_.size(); ++g) {
      size_t at = options.stale_updates ? 0 : t->reads_.size();
      for (size_t k : t->record_params_[g]) {
        at = options.stale_updates ? std::max(at, last_read[k]) : std::min(at, first_read[k]);
      }
      by_read.emplace_back(at, g);
    }
    std::ranges::sort(by_read);
    std::vector<size_t> order;
    for (const auto& [at, g] : by_read) order.push_back(g);
    t->SetUpdateOrder(order);
    if (state.resume == nullptr) FERRY_RETURN_IF_ERROR(t->CreateStore(0, nullptr, nullptr));
  }
  if (state.resume != nullptr) {
    OptimizerStateOptions::Resumed& r = *state.resume;
    FERRY_RETURN_IF_ERROR(t->RestoreOptimizer(r.steps_done, std::move(r.exp_avg),
                                              std::move(r.exp_avg_sq), r.loss_scaler));
    t->state_options_.resume = nullptr;
  }
  FERRY_RETURN_IF_ERROR(runner->UploadWeights(t->weights_));
  return t;
}

void Trainer::SetUpdateOrder(std::span<const size_t> order) {
  update_order_.assign(order.begin(), order.end());
  update_next_.assign(order.size(), order.size());
  for (size_t i = 1; i < order.size(); ++i) update_next_[order[i - 1]] = order[i];
}

Status Trainer::CreateStore(int64_t step, const HostTensors* exp_avg,
                            const HostTensors* exp_avg_sq) {
  std::vector<size_t> bytes;
  for (const std::vector<size_t>& params : record_params_) {
    size_t n = 0;
    for (size_t k : params) n += weights_.tensors.at(order_[k]).size();
    bytes.push_back(3 * n * sizeof(float));
  }
  store_.reset();  // Create truncates its files
  auto fill = [&](size_t g, std::span<std::byte> record) {
    float* f = reinterpret_cast<float*>(record.data());  // page-aligned staging
    for (size_t k : record_params_[g]) {
      const std::string& name = order_[k];
      const std::vector<float>& w = weights_.tensors.at(name);
      float* p = f + record_offset_[k];
      std::copy(w.begin(), w.end(), p);
      if (exp_avg != nullptr) std::ranges::copy(exp_avg->tensors.at(name), p + w.size());
      if (exp_avg_sq != nullptr) std::ranges::copy(exp_avg_sq->tensors.at(name), p + 2 * w.size());
    }
  };
  Result<std::unique_ptr<VersionedStore>> s =
      VersionedStore::Create({.directory = state_options_.nvme_dir, .env = state_options_.env},
                             std::move(bytes), step, fill);
  if (!s.ok()) return s.status().WithContext("optimizer state on NVMe");
  store_ = std::move(*s);
  return Status::Ok();
}

size_t Trainer::optimizer_state_bytes() const {
  size_t bytes = 0;
  for (const auto& [name, s] : state_) bytes += (s.m.size() + s.v.size()) * sizeof(float);
  return bytes;
}

void Trainer::RequireNoPending(const char* what) const {
  if (pending_count_ == 0) return;
  std::fprintf(stderr, "ferry: Trainer::%s read with %zu updates pending: call FinishUpdates\n",
               what, pending_count_);
  std::abort();
}

const HostTensors& Trainer::weights() const {
  RequireNoPending("weights");
  return weights_;
}
void Trainer::RequireStateInRam(const char* what) const {
  if (!on_nvme()) return;
  std::fprintf(stderr,
               "ferry: Trainer::%s read with the optimizer state on NVMe: call "
               "ReadOptimizerState\n",
               what);
  std::abort();
}
std::span<const float> Trainer::exp_avg(const std::string& name) const {
  RequireNoPending("exp_avg");
  RequireStateInRam("exp_avg");
  return state_.at(name).m;
}
std::span<const float> Trainer::exp_avg_sq(const std::string& name) const {
  RequireNoPending("exp_avg_sq");
  RequireStateInRam("exp_avg_sq");
  return state_.at(name).v;
}

Trainer::OptimizerStateReader Trainer::StateReader() const {
  RequireNoPending("StateReader");
  return OptimizerStateReader(*this);
}

void Trainer::OptimizerStateReader::Release() {
  if (held_) t_.store_->Release(*held_);
  held_.reset();
}

Result<Trainer::OptimizerStateReader::Moments> Trainer::OptimizerStateReader::Read(
    const std::string& name) {
  const State& s = t_.state_.at(name);
  if (!t_.on_nvme()) return Moments{s.m, s.v};
  const size_t g = t_.record_of_[s.index];
  if (held_ != g) {
    Release();
    FERRY_RETURN_IF_ERROR(t_.RequireStore());
    Result<std::span<std::byte>> record = t_.store_->Acquire(g);
    if (!record.ok()) {
      return record.status().WithContext("layer " + std::to_string(t_.record_layer_[g]) +
                                         " (optimizer state on NVMe)");
    }
    held_ = g;
    record_ = *record;
    t_.store_->Prefetch(g + 1);  // the next layer's, read next in layer order
  }
  const size_t n = t_.weights_.tensors.at(name).size();
  const float* p = reinterpret_cast<const float*>(record_.data()) + t_.record_offset_[s.index];
  return Moments{{p + n, n}, {p + 2 * n, n}};
}

Status Trainer::ReadOptimizerState(const std::string& name, std::vector<float>* exp_avg,
                                   std::vector<float>* exp_avg_sq) const {
  OptimizerStateReader reader = StateReader();
  FERRY_ASSIGN_OR_RETURN(const OptimizerStateReader::Moments m, reader.Read(name));
  exp_avg->assign(m.exp_avg.begin(), m.exp_avg.end());
  exp_avg_sq->assign(m.exp_avg_sq.begin(), m.exp_avg_sq.end());
  return Status::Ok();
}

Status Trainer::Apply(size_t k, const Update& u) {
  State& s = state_.at(order_[k]);
  return UpdateParam(k, u, weights_.tensors.at(order_[k]).data(), s.m.data(), s.v.data());
}

Status Trainer::ApplyRecord(size_t g, const Update& u) {
  const std::string where =
      "layer " + std::to_string(record_layer_[g]) + " (optimizer state on NVMe)";
  FERRY_RETURN_IF_ERROR(RequireStore());
  Result<std::span<std::byte>> record = store_->Acquire(g);
  if (!record.ok()) return record.status().WithContext(where);
  // Read the next record in update order while this one is updated.
  if (updates_descend_) {  // as gradients land, backward
    if (g > 0) store_->Prefetch(g - 1);
  } else if (pending_count_ > 0) {  // waiting updates: the next one still pending in their order
    size_t next = update_next_[g];
    while (next < update_next_.size() && !pending_[record_params_[next].front()]) {
      next = update_next_[next];
    }
    store_->Prefetch(next);
  } else {  // after the step, forward
    store_->Prefetch(g + 1);
  }
  float* f = reinterpret_cast<float*>(record->data());
  for (size_t k : record_params_[g]) {
    std::vector<float>& w = weights_.tensors.at(order_[k]);
    float* p = f + record_offset_[k];
    if (Status s = UpdateParam(k, u, p, p + w.size(), p + 2 * w.size()); !s.ok()) {
      store_->Release(g);
      return s.WithContext(where);
    }
    // The copy the runner uploads from. Should the commit below fail, the run stops with its
    // error; the layer's committed state (and any checkpoint) is still the step before.
    std::copy(p, p + w.size(), w.begin());
  }
  FERRY_RETURN_IF_ERROR(store_->Commit(g, u.version).WithContext(where));
  if (state_options_.committed) state_options_.committed(u.version, int64_t(record_layer_[g]));
  return Status::Ok();
}

Status Trainer::RequireStore() const {
  if (store_ != nullptr) return Status::Ok();
  return Status::FailedPrecondition(
      "optimizer state on NVMe: its store could not be (re)created, so the state is lost; "
      "resume from a checkpoint");
}

Status Trainer::ApplyAndClear(size_t k, const Update& u) {
  if (!on_nvme()) {
    FERRY_RETURN_IF_ERROR(Apply(k, u));
    pending_[k] = 0;
    --pending_count_;
    return Status::Ok();
  }
  const size_t g = record_of_[k];
  FERRY_RETURN_IF_ERROR(ApplyRecord(g, u));
  for (size_t j : record_params_[g]) {
    if (pending_[j]) pending_[j] = 0, --pending_count_;
  }
  applied_.push_back(g);
  return Status::Ok();
}

Status Trainer::LandLayer(size_t l, const Update& u) {
  bool landed_now = false;
  for (size_t k : lands_[l]) {
    if (landed_[k]) continue;
    FERRY_RETURN_IF_ERROR(Land(k, u));
    landed_now = true;
  }
  if (!on_nvme() || !landed_now || updates_wait()) return Status::Ok();
  return ApplyRecord(record_of_[lands_[l].front()], u);
}

Status Trainer::UpdateParam(size_t k, const Update& u, float* p, float* m, float* v) {
  const std::string& name = order_[k];
  const State& s = state_.at(name);
  const int64_t n = int64_t(weights_.tensors.at(name).size());
  const AdamWHyperparameters h{.lr = u.lr,
                               .beta1 = options_.beta1,
                               .beta2 = options_.beta2,
                               .eps = options_.eps,
                               .weight_decay = s.spec->decays ? options_.weight_decay : 0.0,
                               .step = u.step,
                               .grad_scale = u.grad_scale};
  const cpu::AdamWHostTensor t{p, grads_.tensors.at(name).data(), DType::kF32, m, v, nullptr, n};
  return kernel_.Update(h, t, pool_).WithContext(name);
}

Status Trainer::CheckLayers(int64_t first, int64_t last) const {
  if (0 <= first && first <= last && last <= int64_t(layers_.size())) return Status::Ok();
  return Status::InvalidArgument("the runner named layers [" + std::to_string(first) + ", " +
                                 std::to_string(last) + ") of a model with " +
                                 std::to_string(layers_.size()));
}

Status Trainer::ApplyPending(int64_t first, int64_t last) {
  FERRY_RETURN_IF_ERROR(CheckLayers(first, last));
  for (int64_t l = first; l < last && pending_count_ > 0; ++l) {
    exec::HostSpan span;  // opened with the layer's first update
    bool traced = false;
    for (size_t k : reads_[size_t(l)]) {
      if (!pending_[k]) continue;
      if (!std::exchange(traced, true)) span = exec::OptimizerSpan(trace_, int(l));
      FERRY_RETURN_IF_ERROR(ApplyAndClear(k, pending_update_));
    }
  }
  return Status::Ok();
}

Status Trainer::FinishUpdates() {
  if (pending_count_ > 0) changed_between_steps_ = true;
  if (!on_nvme()) return ApplyPending(0, int64_t(reads_.size()));
  // On NVMe: in the order the store reads ahead (the one a step's reads would apply them in).
  for (size_t g : update_order_) {
    if (pending_count_ == 0) break;
    if (!pending_[record_params_[g].front()]) continue;
    exec::HostSpan span = exec::OptimizerSpan(trace_, int(record_layer_[g]));
    FERRY_RETURN_IF_ERROR(ApplyAndClear(record_params_[g].front(), pending_update_));
  }
  return Status::Ok();
}

Status Trainer::Land(size_t k, const Update& u) {
  if (pending_[k]) {  // its gradient is already overwritten: the update would use the new one
    return Status::Internal("the runner reported the gradient of " + order_[k] +
                            " before announcing its weights' read (StepHooks)");
  }
  const std::vector<float>& g = grads_.tensors.at(order_[k]);
  sum_sq_[k] = kernel_.SumOfSquares(g.data(), DType::kF32, int64_t(g.size()), pool_);
  landed_[k] = 1;
  // On NVMe the layer's record is updated whole once all of it landed (LandLayer).
  if (updates_wait() || on_nvme()) return Status::Ok();
  return Apply(k, u);
}

Status Trainer::RestoreOptimizer(int64_t steps_done, HostTensors exp_avg, HostTensors exp_avg_sq,
                                 const std::optional<LossScalerState>& loss_scaler) {
  RequireNoPending("RestoreOptimizer");
  if (steps_done < 0) return Status::InvalidArgument("a negative step count to restore");
  LossScaler scaler(options_.loss_scaling);
  if (loss_scaler.has_value()) {
    FERRY_RETURN_IF_ERROR(scaler.Restore(*loss_scaler));
    if (loss_scaler->skipped_steps > steps_done) {
      return Status::InvalidArgument("loss scaler state: more skipped steps than steps done");
    }
  }
  for (const auto& [name, s] : state_) {
    for (const HostTensors* t : {&exp_avg, &exp_avg_sq}) {
      auto it = t->tensors.find(name);
      if (it == t->tensors.end() || it->second.size() != weights_.tensors.at(name).size()) {
        return Status::InvalidArgument(std::string("optimizer state ") +
                                       (t == &exp_avg ? "exp_avg" : "exp_avg_sq") + " of " + name +
                                       " is missing or has the wrong number of elements");
      }
    }
  }
  if (on_nvme()) {  // resume rebuilds the store from the checkpoint
    FERRY_RETURN_IF_ERROR(CreateStore(steps_done, &exp_avg, &exp_avg_sq));
  } else {
    for (auto& [name, s] : state_) {
      s.m = std::move(exp_avg.tensors.at(name));
      s.v = std::move(exp_avg_sq.tensors.at(name));
    }
  }
  step_ = steps_done;
  scaler_ = scaler;
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
    inputs.back().loss_scale = scaler_.scale();
    inputs.back().host_pool = pool_;
  }
  const bool streams = runner_->streams_weights();
  if (!streams) FERRY_RETURN_IF_ERROR(FinishUpdates());  // the device copy is uploaded below
  st.lr = options_.schedule.At(step_);
  st.loss_scale = scaler_.scale();
  // AdamW's step counts the updates made: a step skipped by the loss scaler is not one.
  const int64_t adam_step = step_ - scaler_.state().skipped_steps + 1;
  // Without clipping each update is complete once its gradient lands (grad_scale 1 is
  // ClipCoefficient's value for max_norm 0).
  const Update now{.lr = st.lr, .step = adam_step, .version = step_ + 1, .grad_scale = 1.0};
  sum_sq_.assign(order_.size(), 0.0);
  landed_.assign(order_.size(), 0);
  // Updates made as gradients land follow the backward order when the runner reports landings,
  // the forward order otherwise; the store reads ahead in that order.
  const bool immediate = !updates_wait();
  updates_descend_ = streams && immediate;
  if (store_ != nullptr && immediate && store_->records() > 0) {
    store_->Prefetch(updates_descend_ ? store_->records() - 1 : 0);
  }
  unread_ = readers_;
  record_unread_.clear();
  for (const std::vector<size_t>& params : record_params_) record_unread_.push_back(params.size());
  using Clock = std::chrono::steady_clock;
  double in_step = 0;  // optimizer time inside the step, overlapping the devices
  auto timed = [&in_step](auto&& fn) {
    const Clock::time_point a = Clock::now();
    Status s = fn();
    in_step += std::chrono::duration<double>(Clock::now() - a).count();
    return s;
  };
  StepHooks hooks;
  if (streams && !options_.stale_updates) {
    hooks.weights_needed = [&](int64_t first, int64_t last) {
      return timed([&] { return ApplyPending(first, last); });
    };
  }
  if (streams && options_.stale_updates) {
    // Nothing changes the weights between this step's reads and the next step's (the updates
    // wait for those), unless FinishUpdates applies them first: the runner may read ahead.
    hooks.read_ahead = true;
    hooks.weights_changed = std::exchange(changed_between_steps_, false);
    // The last step's update of a parameter, once this step has read it everywhere it reads it.
    hooks.weights_read = [&](int64_t first, int64_t last) -> Status {
      FERRY_RETURN_IF_ERROR(CheckLayers(first, last));
      return timed([&]() -> Status {
        for (int64_t l = first; l < last; ++l) {
          exec::HostSpan span;  // opened with the layer's first update
          bool traced = false;
          for (size_t k : reads_[size_t(l)]) {
            if (--unread_[k] > 0 || !pending_[k]) continue;
            // On NVMe a record is updated whole, once all of its parameters have been read.
            if (on_nvme() && --record_unread_[record_of_[k]] > 0) continue;
            if (!std::exchange(traced, true)) span = exec::OptimizerSpan(trace_, int(l));
            FERRY_RETURN_IF_ERROR(ApplyAndClear(k, pending_update_));
          }
        }
        return Status::Ok();
      });
    };
  }
  if (streams) {
    hooks.grads_landed = [&](int64_t first, int64_t last) -> Status {
      FERRY_RETURN_IF_ERROR(CheckLayers(first, last));
      return timed([&]() -> Status {
        for (int64_t l = last; l-- > first;) {  // backward order, as the updates run
          if (lands_[size_t(l)].empty()) continue;
          exec::HostSpan span = exec::OptimizerSpan(trace_, int(l));
          FERRY_RETURN_IF_ERROR(LandLayer(size_t(l), now));
        }
        return Status::Ok();
      });
    };
  }
  const Clock::time_point t0 = Clock::now();
  applied_.clear();
  Result<double> loss = runner_->AccumulateStep(inputs, grads_, hooks);
  // Waiting updates on NVMe: the next step applies its records in the order this one did.
  if (loss.ok() && updates_wait() && applied_.size() == update_order_.size() && !applied_.empty()) {
    SetUpdateOrder(applied_);
  }
  if (!loss.ok()) return loss.status();
  st.loss = *loss;
  const Clock::time_point t1 = Clock::now();
  st.compute_seconds = std::chrono::duration<double>(t1 - t0).count() - in_step;
  st.optimizer_in_step_seconds = in_step;
  for (size_t l = 0; l < lands_.size(); ++l) {  // what the runner did not report, layer by layer
    if (std::ranges::all_of(lands_[l], [&](size_t k) { return landed_[k] != 0; })) continue;
    exec::HostSpan span = exec::OptimizerSpan(trace_, int(l));
    FERRY_RETURN_IF_ERROR(LandLayer(l, now));
  }
  double sum_sq = 0;  // in parameter order, whatever order the layers landed in
  for (double x : sum_sq_) sum_sq += x;
  // Loss scaling: finite squares sum to a finite double, so this is the global overflow check.
  // Unscaled by a power of two (exact); without loss scaling inv_scale is 1 and nothing changes.
  const double inv_scale = 1.0 / st.loss_scale;
  const bool finite = std::isfinite(sum_sq);
  sum_sq *= inv_scale * inv_scale;
  st.grad_norm = std::sqrt(sum_sq);
  st.clip_coef = ClipCoefficient(sum_sq, options_.grad_clip);
  st.skipped = !scaler_.Update(finite);
  if (updates_wait() && !st.skipped) {
    pending_update_ = {.lr = st.lr,
                       .step = adam_step,
                       .version = step_ + 1,
                       .grad_scale = st.clip_coef * inv_scale};
    pending_.assign(order_.size(), 1);
    pending_count_ = order_.size();
    updates_descend_ = false;  // applied in forward order (the next step's reads, FinishUpdates)
    if (store_ != nullptr && !update_order_.empty()) store_->Prefetch(update_order_.front());
  }
  if (!streams) {
    FERRY_RETURN_IF_ERROR(FinishUpdates());
    FERRY_RETURN_IF_ERROR(runner_->UploadWeights(weights_));
  }
  st.optimizer_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  ++step_;
  return st;
}

}  // namespace ferry
