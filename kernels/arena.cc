#include "kernels/arena.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <iterator>

namespace ferry {

std::string FormatBytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s (%zu bytes)", v, kUnits[u], bytes);
  }
  return buf;
}

Arena::Arena(std::string device_name, size_t capacity, size_t alignment)
    : device_name_(std::move(device_name)), capacity_(capacity), alignment_(alignment) {
  assert(alignment_ != 0 && (alignment_ & (alignment_ - 1)) == 0);
  assert(capacity_ % alignment_ == 0);
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

Result<Arena::Block> Arena::Allocate(size_t bytes, std::string_view requester) {
  assert(bytes > 0);
  const size_t reserved = (bytes + alignment_ - 1) / alignment_ * alignment_;
  std::lock_guard<std::mutex> lock(mu_);
  auto best = free_.end();
  size_t largest = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    largest = std::max(largest, it->second);
    if (it->second >= reserved && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) {
    return Status::OutOfMemory(
        "device '" + device_name_ + "': cannot allocate " + FormatBytes(reserved) + " for '" +
        std::string(requester) + "': " + FormatBytes(in_use_) + " of " + FormatBytes(capacity_) +
        " in use, largest free block " + FormatBytes(largest) +
        ". Give the device more memory or plan smaller buffers (shorter sequences, fewer tokens "
        "per micro-batch).");
  }
  const size_t offset = best->first;
  const size_t remaining = best->second - reserved;
  free_.erase(best);
  if (remaining > 0) free_.emplace(offset + reserved, remaining);
  const size_t handle = next_handle_++;
  live_.emplace(handle, Live{offset, reserved, log_.size()});
  log_.push_back(ArenaRecord{std::string(requester), offset, bytes, reserved, true});
  in_use_ += reserved;
  peak_ = std::max(peak_, in_use_);
  return Block{offset, handle};
}

void Arena::Free(size_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(handle);
  assert(it != live_.end() && "Arena::Free of an unknown handle");
  if (it == live_.end()) return;
  size_t offset = it->second.offset;
  size_t size = it->second.reserved;
  log_[it->second.log_index].live = false;
  in_use_ -= size;
  live_.erase(it);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_.emplace(offset, size);
}

ArenaStats Arena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ArenaStats{capacity_, alignment_, in_use_, peak_, live_.size()};
}

std::vector<ArenaRecord> Arena::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void Arena::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
  // Keep the live records, in allocation order, and re-point the handles at them.
  std::vector<std::pair<size_t, Live*>> order;  // old log index, live block
  order.reserve(live_.size());
  for (auto& entry : live_) order.emplace_back(entry.second.log_index, &entry.second);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ArenaRecord> kept;
  kept.reserve(order.size());
  for (auto& [old_index, live] : order) {
    live->log_index = kept.size();
    kept.push_back(std::move(log_[old_index]));
  }
  log_.swap(kept);
}

size_t Arena::live_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

}  // namespace ferry
