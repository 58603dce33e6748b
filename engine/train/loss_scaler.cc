#include "engine/train/loss_scaler.h"

#include <cmath>
#include <limits>
#include <string>

namespace ferry {
namespace {

bool PowerOfTwo(double x) {
  int e = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &e) == 0.5;
}

}  // namespace

Status ValidateLossScalerOptions(const LossScalerOptions& o) {
  if (!PowerOfTwo(o.initial_scale) || o.initial_scale < 1 || o.initial_scale > 0x1p100) {
    return Status::InvalidArgument(
        "loss scaling: the initial scale must be a power of two in [1, 2^100] (so unscaling is "
        "exact), e.g. 65536");
  }
  if (o.growth_interval < 1) {
    return Status::InvalidArgument("loss scaling: the growth interval must be at least 1");
  }
  return Status::Ok();
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  if (options_.enabled) state_.scale = options_.initial_scale;
}

Status LossScaler::Restore(const LossScalerState& s) {
  if (!PowerOfTwo(s.scale) || s.growth_tracker < 0 || s.skipped_steps < 0 ||
      (!options_.enabled && (s.scale != 1 || s.growth_tracker != 0 || s.skipped_steps != 0))) {
    return Status::InvalidArgument("loss scaler state (scale " + std::to_string(s.scale) +
                                   ", growth tracker " + std::to_string(s.growth_tracker) +
                                   ", skipped " + std::to_string(s.skipped_steps) +
                                   ") does not fit this run's loss scaling");
  }
  state_ = s;
  return Status::Ok();
}

bool LossScaler::Update(bool grads_finite) {
  if (!options_.enabled) return true;
  if (!grads_finite) {
    state_.scale *= kBackoffFactor;
    state_.growth_tracker = 0;
    ++state_.skipped_steps;
    return false;
  }
  if (++state_.growth_tracker == options_.growth_interval) {
    const double grown = state_.scale * kGrowthFactor;
    if (grown <= double(std::numeric_limits<float>::max())) state_.scale = grown;
    state_.growth_tracker = 0;
  }
  return true;
}

}  // namespace ferry
