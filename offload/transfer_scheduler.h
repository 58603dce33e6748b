// Transfer priorities and the queue discipline that serves them.
//
// Transfers wait in one FIFO queue per priority. The next piece of work comes from the most
// urgent non-empty queue, except that a non-empty queue passed over `quota` times in a row is
// served next (the longest-waiting such queue first): urgent traffic keeps the disk, yet a spill
// or a gradient write-out is never starved. A queued item waits at most about quota + number of
// priorities picks after reaching the head of its queue.
//
// Thread-safety: none; the owner (NvmeStore) guards it with its mutex.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <deque>
#include <string_view>

namespace ferry {

// In order of urgency.
enum class TransferPriority : int {
  kActivationNow = 0,  // activations the running stage needs now
  kNextWeights = 1,    // the next stage's weights
  kGradientOut = 2,    // gradients going out
  kSpill = 3,          // spills of state nobody needs soon
};
inline constexpr int kNumTransferPriorities = 4;
std::string_view TransferPriorityName(TransferPriority p);

template <typename T>
class PriorityQueues {
 public:
  // REQUIRES: quota >= 1.
  explicit PriorityQueues(int quota) : quota_(quota) { assert(quota >= 1); }

  void Push(TransferPriority p, T item) { queues_[int(p)].push_back(std::move(item)); }
  bool empty() const {
    for (const auto& q : queues_) {
      if (!q.empty()) return false;
    }
    return true;
  }
  size_t size() const {
    size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }

  // Chooses the queue to serve next and counts the choice; -1 when all are empty. The caller then
  // takes work from Front(queue) and pops it with PopFront(queue) when it is used up (one item
  // may be served by several picks, e.g. one block of a transfer per pick).
  int Pick() {
    int chosen = -1;
    for (int q = 0; q < kNumTransferPriorities; ++q) {
      if (queues_[q].empty()) {
        skipped_[q] = 0;
        continue;
      }
      if (chosen < 0) chosen = q;
    }
    if (chosen < 0) return -1;
    int starved = -1;
    for (int q = 0; q < kNumTransferPriorities; ++q) {
      if (!queues_[q].empty() && skipped_[q] >= quota_ &&
          (starved < 0 || skipped_[q] > skipped_[starved])) {
        starved = q;
      }
    }
    if (starved >= 0) chosen = starved;
    for (int q = 0; q < kNumTransferPriorities; ++q) {
      if (q == chosen) {
        skipped_[q] = 0;
      } else if (!queues_[q].empty()) {
        ++skipped_[q];
      }
    }
    return chosen;
  }
  T& Front(int queue) { return queues_[queue].front(); }
  void PopFront(int queue) { queues_[queue].pop_front(); }
  // Removes everything (for shutdown), calling fn on each item.
  template <typename Fn>
  void Drain(Fn&& fn) {
    for (auto& q : queues_) {
      while (!q.empty()) {
        fn(q.front());
        q.pop_front();
      }
    }
  }

 private:
  const int quota_;
  std::array<std::deque<T>, kNumTransferPriorities> queues_;
  std::array<int, kNumTransferPriorities> skipped_{};
};

}  // namespace ferry
