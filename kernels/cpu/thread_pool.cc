#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cassert>

namespace ferry {

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  workers_.reserve(size_t(threads_ - 1));
  for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(std::unique_lock<std::mutex>& lock, int worker) {
  while (job_ != nullptr && next_chunk_begin_ < job_n_) {
    const int64_t begin = next_chunk_begin_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    next_chunk_begin_ = end;
    const auto* job = job_;
    lock.unlock();
    (*job)(begin, end, worker);
    lock.lock();
  }
}

void ThreadPool::WorkerLoop(int worker) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = 0;
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++active_;
    RunChunks(lock, worker);
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // Aim for a few chunks per thread so uneven chunks balance, never below the grain.
  const int64_t target_chunks = int64_t(threads_) * 4;
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  if (threads_ == 1 || n <= chunk) {
    fn(0, n, 0);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_begin_ = 0;
  ++generation_;
  work_cv_.notify_all();
  RunChunks(lock, 0);
  // Workers that woke for this generation finish their chunks; then the job is retired.
  done_cv_.wait(lock, [&] { return active_ == 0 && next_chunk_begin_ >= job_n_; });
  job_ = nullptr;
}

}  // namespace ferry
