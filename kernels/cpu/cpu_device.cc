#include "kernels/cpu/cpu_device.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "kernels/arena.h"
#include "kernels/backend_access.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/virtual_clock.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

// One Record of an event: completes once, with the status of the work it captured; a timed
// event's record also notes when its stream reached it. Every record notes its stream's virtual
// time (0 without a virtual clock), which waits and host synchronizations carry on.
struct Signal {
  explicit Signal(bool timed) : timed(timed) {}
  const bool timed;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;      // guarded by mu
  Status status;          // guarded by mu
  Clock::time_point at;   // guarded by mu; when done, for a timed record
  double virtual_at = 0;  // guarded by mu; when done, the stream's virtual time at the record

  void Complete(Status s, double virtual_time) {
    // Read before the lock: the stream thread's own clock at the record, as a GPU stamps it.
    const Clock::time_point now = timed ? Clock::now() : Clock::time_point();
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      status = std::move(s);
      at = now;
      virtual_at = virtual_time;
    }
    cv.notify_all();
  }
  Status Await() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }
  // REQUIRES: done (after Await).
  double VirtualAt() {
    std::lock_guard<std::mutex> lock(mu);
    return virtual_at;
  }
  bool IsDone() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

class CpuEvent final : public EventImpl {
 public:
  CpuEvent(const void* owner, bool timed) : owner_(owner), timed_(timed) {}
  const void* owner() const { return owner_; }  // the CpuDevice that created it
  bool timed() const { return timed_; }
  std::shared_ptr<Signal> Latest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }
  void SetLatest(std::shared_ptr<Signal> s) {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = std::move(s);
  }

 private:
  const void* const owner_;
  const bool timed_;
  mutable std::mutex mu_;
  std::shared_ptr<Signal> latest_;  // guarded by mu_; null until first Record
};

// A task on a stream. Normal tasks are skipped once the stream is poisoned; completion tasks
// (event records) always run and carry the poison to the event. The virtual fields are read only
// under a virtual clock.
struct Task {
  std::string what;
  std::function<Status()> run;        // normal task
  std::shared_ptr<Signal> completes;  // completion task when non-null
  std::shared_ptr<Signal> waits_for;  // a wait's record: the task starts no earlier than it
  double virtual_s = 0;               // the task's virtual duration
  double not_before_s = 0;            // the enqueuer's virtual time at the enqueue
};

}  // namespace

// One ordered worker.
class CpuStream {
 public:
  CpuStream(std::string name, uint32_t max_delay_us, uint64_t seed, VirtualClock* clock)
      : name_(std::move(name)), max_delay_us_(max_delay_us), clock_(clock), rng_(seed) {
    worker_ = std::thread([this] { Loop(); });
  }
  ~CpuStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void Enqueue(Task t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_all();
  }

  // The stream's first error since the last ClearError (ok when healthy), and its sequence.
  std::pair<Status, uint64_t> Error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {error_, error_seq_};
  }
  void ClearError() {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = Status();
    error_seq_ = 0;
  }
  const std::string& name() const { return name_; }

  std::atomic<uint64_t>* error_counter = nullptr;  // device-wide order of first errors

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      Task t = std::move(queue_.front());
      queue_.pop_front();
      Status poison = error_;
      uint32_t delay =
          max_delay_us_ ? uint32_t(rng_() % (max_delay_us_ + 1)) : 0;  // rng_ under mu_
      lock.unlock();
      if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      if (clock_ != nullptr) virtual_s_ = std::max(virtual_s_, t.not_before_s);
      if (t.completes) {
        t.completes->Complete(poison, virtual_s_);
      } else if (poison.ok()) {
        Status s;
        {
          const VirtualClock::StreamScope scope(clock_, &virtual_s_);
          s = t.run();
        }
        if (clock_ != nullptr) {
          if (t.waits_for) virtual_s_ = std::max(virtual_s_, t.waits_for->VirtualAt());
          virtual_s_ += t.virtual_s;
        }
        if (!s.ok()) {
          lock.lock();
          if (error_.ok()) {
            error_ = s.WithContext(name_ + ": " + t.what);
            error_seq_ = error_counter ? error_counter->fetch_add(1) + 1 : 1;
          }
          lock.unlock();
        }
      }
      lock.lock();
    }
  }

  const std::string name_;
  const uint32_t max_delay_us_;
  VirtualClock* const clock_;  // null: real time only
  double virtual_s_ = 0;       // the worker's own: the stream's virtual time
  mutable std::mutex mu_;
  std::condition_variable cv_;  // guarded by mu_
  std::deque<Task> queue_;      // guarded by mu_
  Status error_;                // guarded by mu_
  uint64_t error_seq_ = 0;      // guarded by mu_
  std::mt19937_64 rng_;         // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::thread worker_;
};

// The link model: copies in one direction share one link of a given bandwidth. A copy occupies
// the link from max(now, link free) for bytes / rate seconds.
class Link {
 public:
  explicit Link(double bytes_per_s) : rate_(bytes_per_s) {}
  void Throttle(size_t bytes, Clock::time_point started) {
    if (rate_ <= 0) return;
    Clock::time_point finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto begin = std::max(started, free_at_);
      finish = begin + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(double(bytes) / rate_));
      free_at_ = finish;
    }
    std::this_thread::sleep_until(finish);
  }

 private:
  const double rate_;
  std::mutex mu_;
  Clock::time_point free_at_{};  // guarded by mu_
};

struct CpuDevice::Impl {
  std::atomic<int64_t> events_created{0};  // CreateEvent calls, for tests
  explicit Impl(const CpuDeviceOptions& o, HostAllocation mem)
      : options(o),
        memory(std::move(mem)),
        arena(o.name, o.memory_bytes, o.alignment),
        pool(o.compute_threads),
        upload_link(o.upload_bytes_per_s),
        download_link(o.download_bytes_per_s) {
    for (int i = 0; i < kNumStreams; ++i) {
      streams[i] = std::make_unique<CpuStream>(
          o.name + "/" + std::string(StreamName(StreamId(i))), o.max_random_delay_us,
          o.random_delay_seed * 1000003ull + uint64_t(i), o.virtual_clock);
      streams[i]->error_counter = &error_counter;
    }
  }

  CpuStream& stream(StreamId s) { return *streams[int(s)]; }

  // REQUIRES: the range is checked by CheckRange first.
  std::byte* Raw(DevicePtr<const std::byte> p) {
    return const_cast<std::byte*>(BackendAccess::Raw(p));
  }
  Status CheckRange(DevicePtr<const std::byte> p, size_t bytes, std::string_view what) const {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(memory.data());
    const uintptr_t a = p.address();
    if (a < lo || a > lo + options.memory_bytes || bytes > lo + options.memory_bytes - a) {
      return Status::InvalidArgument(std::string(what) + ": " + std::to_string(bytes) +
                                     " bytes at a pointer outside device '" + options.name +
                                     "' memory");
    }
    return Status::Ok();
  }

  // `virtual_s`: the task's virtual duration; `waits_for`: a wait's record (see Task).
  Status Enqueue(StreamId s, std::string what, std::function<Status()> fn, double virtual_s = 0,
                 std::shared_ptr<Signal> waits_for = nullptr) {
    stream(s).Enqueue(Task{.what = std::move(what),
                           .run = std::move(fn),
                           .completes = nullptr,
                           .waits_for = std::move(waits_for),
                           .virtual_s = virtual_s,
                           .not_before_s = VirtualNow()});
    return Status::Ok();
  }

  std::shared_ptr<Signal> Mark(StreamId s, bool timed = false) {
    auto sig = std::make_shared<Signal>(timed);
    stream(s).Enqueue(Task{.what = "record",
                           .run = nullptr,
                           .completes = sig,
                           .waits_for = nullptr,
                           .virtual_s = 0,
                           .not_before_s = VirtualNow()});
    return sig;
  }

  // The enqueuer's virtual time (the host's, or a stream's inside one of its host functions).
  double VirtualNow() const { return clock ? clock->Now() : 0; }
  // Virtual seconds a copy of `bytes` takes over a link of `bytes_per_s` (0: unthrottled).
  static double CopySeconds(size_t bytes, double bytes_per_s) {
    return bytes_per_s > 0 ? double(bytes) / bytes_per_s : 0;
  }
  // The host has waited for `sig` (completed): under a virtual clock its time moves up to it.
  void HostWaited(Signal& sig) {
    if (clock) clock->HostReached(sig.VirtualAt());
  }

  CpuDeviceOptions options;
  VirtualClock* const clock = options.virtual_clock;  // borrowed; null: real time only
  HostAllocation memory;                              // the arena's real, fixed-size allocation
  Arena arena;
  ThreadPool pool;
  Link upload_link;
  Link download_link;
  std::atomic<uint64_t> error_counter{0};
  // Host ranges registered with this device (RegisterHost), start -> end, as the CUDA driver
  // keeps them: a range that overlaps one of these is refused.
  std::mutex registered_mu;
  std::map<uintptr_t, uintptr_t> registered;        // guarded by registered_mu
  std::unique_ptr<CpuStream> streams[kNumStreams];  // destroyed (joined) first
};

namespace {

// Undoes a CpuDevice::RegisterHost: the range may be registered again once this is gone.
// REQUIRES: destroyed before the device.
class CpuHostRegistration final : public HostRegistration {
 public:
  using Ranges = std::map<uintptr_t, uintptr_t>;
  CpuHostRegistration(std::mutex* mu, Ranges* ranges, uintptr_t start)
      : mu_(mu), ranges_(ranges), start_(start) {}
  ~CpuHostRegistration() override {
    std::lock_guard lock(*mu_);
    ranges_->erase(start_);
  }

 private:
  std::mutex* mu_;  // the device's
  Ranges* ranges_;  // guarded by *mu_
  uintptr_t start_;
};

}  // namespace

Result<std::unique_ptr<CpuDevice>> CpuDevice::Create(const CpuDeviceOptions& options) {
  if (options.memory_bytes == 0) {
    return Status::InvalidArgument("CPU device '" + options.name + "': memory_bytes is zero");
  }
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return Status::InvalidArgument("CPU device '" + options.name +
                                   "': alignment must be a power of two");
  }
  if (options.compute_threads < 1) {
    return Status::InvalidArgument("CPU device '" + options.name +
                                   "': compute_threads must be at least 1");
  }
  // The GEMM library is loaded (its kernels chosen from the CPU's flags) before any of the
  // device's threads start, and a library that cannot load is this call's error.
  if (Result<const cpu::CpuBlas*> blas = cpu::CpuBlas::Load(); !blas.ok()) {
    return Status::Unavailable("CPU device '" + options.name + "': " + blas.status().message());
  }
  CpuDeviceOptions o = options;
  o.memory_bytes = o.memory_bytes / o.alignment * o.alignment;
  if (o.memory_bytes == 0) {
    return Status::InvalidArgument("CPU device '" + options.name +
                                   "': memory_bytes is smaller than the alignment");
  }
  FERRY_ASSIGN_OR_RETURN(HostAllocation mem,
                         HostAllocation::Map(o.memory_bytes, "device memory of " + o.name));
  return std::unique_ptr<CpuDevice>(new CpuDevice(std::make_unique<Impl>(o, std::move(mem))));
}

CpuDevice::CpuDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CpuDevice::~CpuDevice() {
  (void)Synchronize();
  for (auto& s : impl_->streams) s.reset();
  if (impl_->arena.live_allocations() != 0) {
    std::fprintf(stderr,
                 "ferry: device '%s' destroyed with %zu live buffers (destroy buffers "
                 "before their device)\n",
                 impl_->options.name.c_str(), impl_->arena.live_allocations());
    assert(false && "DeviceBuffer outlived its CpuDevice");
  }
}

const std::string& CpuDevice::name() const { return impl_->options.name; }
size_t CpuDevice::capacity() const { return impl_->options.memory_bytes; }
size_t CpuDevice::host_resident_bytes() const { return impl_->memory.ResidentBytes(); }
const CpuDeviceOptions& CpuDevice::options() const { return impl_->options; }
ThreadPool& CpuDevice::pool() { return impl_->pool; }

Result<DeviceBuffer> CpuDevice::Allocate(size_t bytes, std::string_view requester) {
  if (bytes == 0) {
    return Status::InvalidArgument("device '" + name() + "': zero-byte allocation for '" +
                                   std::string(requester) + "'");
  }
  FERRY_ASSIGN_OR_RETURN(Arena::Block block, impl_->arena.Allocate(bytes, requester));
  return MakeBuffer(this, BackendAccess::Wrap(impl_->memory.data() + block.offset), bytes,
                    block.handle);
}

void CpuDevice::Free(size_t handle) { impl_->arena.Free(handle); }
ArenaStats CpuDevice::arena_stats() const { return impl_->arena.stats(); }
std::vector<ArenaRecord> CpuDevice::arena_log() const { return impl_->arena.log(); }
void CpuDevice::ResetPeak() { impl_->arena.ResetPeak(); }

// Nothing to pin on a CPU device, but the bookkeeping is CUDA's (cudaHostRegister answers
// cudaErrorHostMemoryAlreadyRegistered for a range that overlaps a registered one), so a caller
// that registers a buffer twice fails here as it would on a GPU.
Result<std::unique_ptr<HostRegistration>> CpuDevice::RegisterHost(const HostAllocation& a) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(a.data()), end = start + a.size();
  if (a.data() == nullptr || a.size() == 0) {
    return Status::InvalidArgument("device '" + impl_->options.name +
                                   "': registering an empty host allocation '" + a.name() + "'");
  }
  std::lock_guard lock(impl_->registered_mu);
  auto& reg = impl_->registered;
  auto next = reg.lower_bound(end);  // the first range starting at or after our end
  if (next != reg.begin() && std::prev(next)->second > start) {
    const auto [lo, hi] = *std::prev(next);
    return Status::FailedPrecondition(
        "device '" + impl_->options.name + "': host allocation '" + a.name() + "' (" +
        FormatBytes(a.size()) + ") overlaps a range already registered with it (" +
        FormatBytes(hi - lo) +
        "); a range is registered once per process, as cudaHostRegister refuses it twice "
        "(cudaErrorHostMemoryAlreadyRegistered)");
  }
  reg.emplace(start, end);
  return std::unique_ptr<HostRegistration>(
      new CpuHostRegistration(&impl_->registered_mu, &reg, start));
}

Result<Event> CpuDevice::CreateEvent() {
  impl_->events_created.fetch_add(1, std::memory_order_relaxed);
  return Event(std::make_unique<CpuEvent>(this, /*timed=*/false));
}
Result<Event> CpuDevice::CreateTimedEvent() {
  impl_->events_created.fetch_add(1, std::memory_order_relaxed);
  return Event(std::make_unique<CpuEvent>(this, /*timed=*/true));
}

int64_t CpuDevice::events_created() const {
  return impl_->events_created.load(std::memory_order_relaxed);
}

static CpuEvent* AsCpuEvent(const Event& e) { return dynamic_cast<CpuEvent*>(e.impl()); }

Status CpuDevice::Record(Event& event, StreamId stream) {
  CpuEvent* ev = AsCpuEvent(event);
  if (ev == nullptr) return Status::InvalidArgument("Record: not an event of a CPU device");
  // The record is captured now, in enqueue order: a Wait enqueued later sees this signal.
  ev->SetLatest(impl_->Mark(stream, ev->timed()));
  return Status::Ok();
}

Status CpuDevice::Wait(StreamId stream, const Event& event) {
  CpuEvent* ev = AsCpuEvent(event);
  if (ev == nullptr) return Status::InvalidArgument("Wait: not an event of a CPU device");
  std::shared_ptr<Signal> sig = ev->Latest();  // the latest record at enqueue time
  if (sig == nullptr) return Status::Ok();     // never recorded: no-op, as CUDA
  return impl_->Enqueue(
      stream, "wait on event", [sig] { return sig->Await(); }, 0, sig);
}

Status CpuDevice::Synchronize(const Event& event) {
  CpuEvent* ev = AsCpuEvent(event);
  if (ev == nullptr) return Status::InvalidArgument("Synchronize: not an event of a CPU device");
  std::shared_ptr<Signal> sig = ev->Latest();
  if (sig == nullptr) return Status::Ok();
  Status s = sig->Await();
  impl_->HostWaited(*sig);
  return s;
}

Status CpuDevice::Synchronize(StreamId stream) {
  std::shared_ptr<Signal> mark = impl_->Mark(stream);
  Status s = mark->Await();
  impl_->HostWaited(*mark);
  return s;
}

Status CpuDevice::Synchronize() {
  std::shared_ptr<Signal> marks[kNumStreams];
  for (int i = 0; i < kNumStreams; ++i) marks[i] = impl_->Mark(StreamId(i));
  for (auto& m : marks) {
    (void)m->Await();
    impl_->HostWaited(*m);
  }
  Status first;
  uint64_t first_seq = 0;
  for (auto& s : impl_->streams) {
    auto [err, seq] = s->Error();
    if (!err.ok() && (first.ok() || seq < first_seq)) {
      first = err;
      first_seq = seq;
    }
    s->ClearError();
  }
  return first;
}

Result<double> CpuDevice::ElapsedSeconds(const Event& from, const Event& to) {
  Clock::time_point at[2];
  double virtual_at[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const CpuEvent* ev = AsCpuEvent(i == 0 ? from : to);
    // As CUDA: untimed events and another device's events cannot be timed here.
    if (ev == nullptr || !ev->timed() || ev->owner() != this) {
      return Status::InvalidArgument("device '" + name() +
                                     "': ElapsedSeconds needs timed events of this device "
                                     "(CreateTimedEvent)");
    }
    std::shared_ptr<Signal> sig = ev->Latest();
    if (sig == nullptr) {
      return Status::FailedPrecondition("device '" + name() +
                                        "': ElapsedSeconds of an event never recorded");
    }
    std::lock_guard<std::mutex> lock(sig->mu);
    if (!sig->done) {
      return Status::FailedPrecondition("device '" + name() +
                                        "': ElapsedSeconds of a record that has not completed "
                                        "(synchronize on the event first)");
    }
    at[i] = sig->at;
    virtual_at[i] = sig->virtual_at;
  }
  if (impl_->clock != nullptr) return virtual_at[1] - virtual_at[0];
  return std::chrono::duration<double>(at[1] - at[0]).count();
}

Result<bool> CpuDevice::Query(const Event& event) {
  CpuEvent* ev = AsCpuEvent(event);
  if (ev == nullptr) return Status::InvalidArgument("Query: not an event of a CPU device");
  std::shared_ptr<Signal> sig = ev->Latest();
  return sig == nullptr || sig->IsDone();
}

Status CpuDevice::CopyToDevice(DevicePtr<std::byte> dst, HostSpan src, size_t bytes,
                               StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(dst, bytes, "CopyToDevice"));
  if (src.size() < bytes) {
    return Status::InvalidArgument("CopyToDevice: host span of " + std::to_string(src.size()) +
                                   " bytes is smaller than the copy (" + std::to_string(bytes) +
                                   ")");
  }
  std::byte* d = impl_->Raw(dst);
  Impl* impl = impl_.get();
  // Under a virtual clock the link is its duration, not a sleep.
  return impl_->Enqueue(
      stream, "copy to device",
      [impl, d, src, bytes] {
        const auto started = Clock::now();
        std::memcpy(d, src.data(), bytes);
        if (impl->clock == nullptr) impl->upload_link.Throttle(bytes, started);
        return Status::Ok();
      },
      Impl::CopySeconds(bytes, impl_->options.upload_bytes_per_s));
}

Status CpuDevice::CopyToHost(HostSpan dst, DevicePtr<const std::byte> src, size_t bytes,
                             StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(src, bytes, "CopyToHost"));
  if (dst.size() < bytes) {
    return Status::InvalidArgument("CopyToHost: host span of " + std::to_string(dst.size()) +
                                   " bytes is smaller than the copy (" + std::to_string(bytes) +
                                   ")");
  }
  const std::byte* s = impl_->Raw(src);
  Impl* impl = impl_.get();
  return impl_->Enqueue(
      stream, "copy to host",
      [impl, dst, s, bytes] {
        const auto started = Clock::now();
        std::memcpy(dst.data(), s, bytes);
        if (impl->clock == nullptr) impl->download_link.Throttle(bytes, started);
        return Status::Ok();
      },
      Impl::CopySeconds(bytes, impl_->options.download_bytes_per_s));
}

Status CpuDevice::Zero(DevicePtr<std::byte> dst, size_t bytes, StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(dst, bytes, "Zero"));
  std::byte* d = impl_->Raw(dst);
  const double virtual_s =
      impl_->clock ? impl_->clock->KernelSeconds("zero", {.flops = 0, .bytes = double(bytes)}) : 0;
  return impl_->Enqueue(
      stream, "zero",
      [d, bytes] {
        std::memset(d, 0, bytes);
        return Status::Ok();
      },
      virtual_s);
}

Status CpuDevice::LaunchHostFunc(StreamId stream, std::function<Status()> fn) {
  return impl_->Enqueue(stream, "host function", std::move(fn));
}

Status CpuDevice::EnqueueCompute(std::string_view op, std::function<Status(ThreadPool&)> kernel,
                                 const KernelWork& work) {
  ThreadPool* pool = &impl_->pool;
  const double virtual_s = impl_->clock ? impl_->clock->KernelSeconds(op, work) : 0;
  return impl_->Enqueue(
      StreamId::kCompute, std::string(op), [pool, k = std::move(kernel)] { return k(*pool); },
      virtual_s);
}

}  // namespace ferry
