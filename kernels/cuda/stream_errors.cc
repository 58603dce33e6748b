#include "kernels/cuda/stream_errors.h"

#include <algorithm>
#include <cassert>

namespace ferry {

std::pair<std::unique_lock<std::mutex>, std::unique_lock<std::mutex>> StreamErrorBook::LockBoth(
    const StreamErrorBook& a, const StreamErrorBook& b) {
  std::unique_lock<std::mutex> la(a.mu_, std::defer_lock), lb(b.mu_, std::defer_lock);
  if (&a == &b) {
    la.lock();
  } else {
    std::lock(la, lb);  // deadlock-free whatever the order other threads use
  }
  return {std::move(la), std::move(lb)};
}

uint64_t StreamErrorBook::EnqueueHostItem(int stream) {
  std::lock_guard<std::mutex> lock(mu_);
  StreamState& s = streams_[stream];
  s.last_host_item = s.next_seq++;
  return s.last_host_item;
}

StreamErrorBook::Mark StreamErrorBook::MarkRecord(int stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const StreamState& s = streams_[stream];
  return Mark{stream, s.next_seq, s.last_host_item};
}

void StreamErrorBook::SetErrorLocked(int stream, const Status& status, uint64_t seq) {
  StreamState& s = streams_[stream];
  if (!s.error.ok()) return;  // the first error stays
  s.error = status;
  s.error_seq = seq;
  s.error_order = ++errors_raised_;
}

bool StreamErrorBook::Wait(StreamErrorBook& src, const Mark& mark, StreamErrorBook& dst,
                           int dst_stream) {
  auto locks = LockBoth(src, dst);
  const StreamState& s = src.streams_[mark.stream];
  if (!s.error.ok() && s.error_seq < mark.seq) {
    // Known failed: everything dst runs after this wait is poisoned.
    StreamState& d = dst.streams_[dst_stream];
    const uint64_t seq = d.next_seq++;
    dst.SetErrorLocked(dst_stream, s.error, seq);
    return false;
  }
  return mark.last_host_item > s.done_seq;
}

bool StreamErrorBook::Poisoned(int stream, uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  const StreamState& s = streams_[stream];
  return !s.error.ok() && s.error_seq < seq;
}

void StreamErrorBook::Finish(int stream, uint64_t seq, const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) SetErrorLocked(stream, status, seq);
  StreamState& s = streams_[stream];
  s.done_seq = std::max(s.done_seq, seq);
}

void StreamErrorBook::Propagate(const StreamErrorBook& src, const Mark& mark, StreamErrorBook& dst,
                                int dst_stream, uint64_t dst_seq) {
  auto locks = LockBoth(src, dst);
  const StreamState& s = src.streams_[mark.stream];
  if (!s.error.ok() && s.error_seq < mark.seq) dst.SetErrorLocked(dst_stream, s.error, dst_seq);
  StreamState& d = dst.streams_[dst_stream];
  d.done_seq = std::max(d.done_seq, dst_seq);
}

Status StreamErrorBook::ErrorBefore(int stream, uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  const StreamState& s = streams_[stream];
  if (!s.error.ok() && s.error_seq < seq) return s.error;
  return Status::Ok();
}

uint64_t StreamErrorBook::NextSeq(int stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_[stream].next_seq;
}

Status StreamErrorBook::TakeFirstError() {
  std::lock_guard<std::mutex> lock(mu_);
  StreamState* first = nullptr;
  for (StreamState& s : streams_) {
    if (!s.error.ok() && (first == nullptr || s.error_order < first->error_order)) first = &s;
  }
  Status result = first != nullptr ? first->error : Status::Ok();
  for (StreamState& s : streams_) s.error = Status::Ok();
  return result;
}

}  // namespace ferry
