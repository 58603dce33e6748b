// A fixed pool of worker threads owned by one CpuDevice. Never process-global: several devices
// in one process each own theirs, so they don't oversubscribe each other and TSan stays
// meaningful. BLAS calls made inside ParallelFor run on the calling worker only
// (kernels/cpu/blas.h).
//
// Thread-safety: ParallelFor may be called from one thread at a time (the device's compute
// stream worker); it blocks until every chunk has run.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

class ThreadPool {
 public:
  // `threads` >= 1 counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }

  // Splits [0, n) into chunks of at least `grain` items and runs fn(begin, end, worker) on them,
  // worker in [0, size()). Each worker index is used by one thread at a time, so per-worker
  // scratch is race-free. Returns when all chunks are done.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int worker)>& fn);

 private:
  void WorkerLoop(int worker);
  void RunChunks(std::unique_lock<std::mutex>& lock, int worker);  // REQUIRES: lock holds mu_

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // guarded by mu_
  std::condition_variable done_cv_;  // guarded by mu_
  // Current job; all guarded by mu_ except the chunk counter read under it.
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_begin_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace ferry
