#include "kernels/cpu/virtual_clock.h"

#include <algorithm>

namespace ferry {

double VirtualClock::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(std::this_thread::get_id());
  return it != streams_.end() ? *it->second : host_s_;
}

double VirtualClock::HostNow() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_s_;
}

void VirtualClock::HostReached(double t) {
  std::lock_guard<std::mutex> lock(mu_);
  host_s_ = std::max(host_s_, t);
}

VirtualClock::StreamScope::StreamScope(VirtualClock* clock, const double* stream_time)
    : clock_(clock) {
  if (clock_ == nullptr) return;
  std::lock_guard<std::mutex> lock(clock_->mu_);
  clock_->streams_[std::this_thread::get_id()] = stream_time;
}

VirtualClock::StreamScope::~StreamScope() {
  if (clock_ == nullptr) return;
  std::lock_guard<std::mutex> lock(clock_->mu_);
  clock_->streams_.erase(std::this_thread::get_id());
}

}  // namespace ferry
