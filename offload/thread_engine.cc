// The thread-pool backend of IoEngine (see io_engine.h): blocking pread/pwrite on worker threads.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "offload/io_engine.h"

namespace ferry {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  ThreadEngine(IoEnv& env, unsigned depth, int threads) : env_(env), depth_(depth) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~ThreadEngine() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::string_view name() const override { return "threads"; }
  unsigned depth() const override { return depth_; }

  void Push(const IoRequest& r) override {
    {
      std::lock_guard lock(mu_);
      pending_.push_back(r);
    }
    work_cv_.notify_one();
  }
  Status Flush() override { return Status::Ok(); }

  Status Wait(std::vector<IoCompletion>& out) override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return !done_.empty() || woken_; });
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
    woken_ = false;
    return Status::Ok();
  }

  void Wake() override {
    {
      std::lock_guard lock(mu_);
      woken_ = true;
    }
    done_cv_.notify_one();
  }

 private:
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      const IoRequest r = pending_.front();
      pending_.pop_front();
      lock.unlock();
      ssize_t n = r.kind == IoKind::kRead ? env_.Pread(r.fd, r.buf, r.len, off_t(r.offset))
                                          : env_.Pwrite(r.fd, r.buf, r.len, off_t(r.offset));
      const int res = env_.FilterCompletion(r, int(n));
      lock.lock();
      done_.push_back({r.user_data, res});
      done_cv_.notify_one();
    }
  }

  IoEnv& env_;
  const unsigned depth_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // with mu_
  std::condition_variable done_cv_;  // with mu_
  std::deque<IoRequest> pending_;    // guarded by mu_
  std::vector<IoCompletion> done_;   // guarded by mu_
  bool woken_ = false;               // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> CreateThreadEngine(IoEnv& env, unsigned depth, int threads) {
  return std::make_unique<ThreadEngine>(env, depth, threads < 1 ? 1 : threads);
}

}  // namespace ferry
