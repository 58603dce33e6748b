#include "kernels/cuda/cuda_device.h"

#include <array>
#include <cassert>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "kernels/arena.h"
#include "kernels/backend_access.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_errors.h"

namespace ferry {
namespace {

// ---- RAII owners of CUDA handles (destruction errors are ignored: nothing to do about them) ----
struct StreamDeleter {
  void operator()(cudaStream_t s) const { (void)cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const { (void)cudaEventDestroy(e); }
};
struct CublasDeleter {
  void operator()(cublasHandle_t h) const { (void)cublasDestroy(h); }
};
struct CublasLtDeleter {
  void operator()(cublasLtHandle_t h) const { (void)cublasLtDestroy(h); }
};
struct DeviceMemoryDeleter {
  void operator()(std::byte* p) const { (void)cudaFree(p); }
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDeleter>;
using UniqueCublas = std::unique_ptr<cublasContext, CublasDeleter>;
using UniqueCublasLt = std::unique_ptr<cublasLtContext, CublasLtDeleter>;
struct PinnedHostDeleter {
  void operator()(std::byte* p) const { (void)cudaFreeHost(p); }
};
using UniqueDeviceMemory = std::unique_ptr<std::byte, DeviceMemoryDeleter>;
using UniquePinnedHost = std::unique_ptr<std::byte, PinnedHostDeleter>;

class CudaHostRegistration final : public HostRegistration {
 public:
  explicit CudaHostRegistration(void* p) : p_(p) {}
  ~CudaHostRegistration() override { (void)cudaHostUnregister(p_); }

 private:
  void* p_;
};

// What a Wait needs from the event's latest Record.
struct RecordInfo {
  std::shared_ptr<StreamErrorBook> book;  // the recording device's
  StreamErrorBook::Mark mark;
};

class CudaEventImpl final : public EventImpl {
 public:
  CudaEventImpl(const void* owner, UniqueEvent event, bool timed)
      : owner_(owner), event_(std::move(event)), timed_(timed) {}
  const void* owner() const { return owner_; }
  bool timed() const { return timed_; }
  cudaEvent_t event() const { return event_.get(); }
  // Held across cudaEventRecord / cudaStreamWaitEvent and the RecordInfo they go with.
  std::mutex& mu() const { return mu_; }
  std::optional<RecordInfo>& record() { return record_; }  // guarded by mu()
  const std::optional<RecordInfo>& record() const { return record_; }

 private:
  const void* owner_;  // the CudaDevice that records it
  UniqueEvent event_;
  const bool timed_;  // created without cudaEventDisableTiming
  mutable std::mutex mu_;
  std::optional<RecordInfo> record_;  // guarded by mu_; empty until the first Record
};

// A host function or the hidden error-carrying item of a Wait, owned by its CUDA callback.
struct HostItem {
  std::shared_ptr<StreamErrorBook> book;
  int stream = 0;
  uint64_t seq = 0;
  std::string where;                    // "<device>/<stream>", for errors
  std::function<Status()> fn;           // a LaunchHostFunc item
  std::optional<RecordInfo> propagate;  // a Wait item
};

void CUDART_CB RunHostItem(void* arg) {
  std::unique_ptr<HostItem> item(static_cast<HostItem*>(arg));
  if (item->propagate) {
    StreamErrorBook::Propagate(*item->propagate->book, item->propagate->mark, *item->book,
                               item->stream, item->seq);
    return;
  }
  if (item->book->Poisoned(item->stream, item->seq)) {
    item->book->Finish(item->stream, item->seq, Status::Ok());  // skipped
    return;
  }
  Status status = item->fn();
  item->book->Finish(item->stream, item->seq, status.WithContext(item->where + ": host function"));
}

bool IsPowerOfTwo(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

struct CudaDevice::Impl {
  CudaDeviceOptions options;
  std::string name;
  size_t capacity = 0;
  UniqueDeviceMemory memory;    // the arena, one cudaMalloc
  UniquePinnedHost check_host;  // kCheckBytes for EnqueueComputeCheck (compute stream only)
  std::array<UniqueStream, kNumStreams> streams;
  UniqueCublas cublas;
  UniqueCublasLt cublas_lt;
  std::unique_ptr<Arena> arena;
  size_t workspace_handle = 0;  // the cuBLAS workspace's arena block
  CudaContext context;
  CudnnAttention attention;  // context.attention; its cuDNN handle is created on first use
  std::shared_ptr<StreamErrorBook> errors = std::make_shared<StreamErrorBook>();
  // Serializes enqueues per stream (so sequence numbers follow stream order) and the use of the
  // cuBLAS handles on the compute stream.
  std::array<std::mutex, kNumStreams> enqueue_mu;

  Status MakeCurrent() const {
    return CudaStatus(cudaSetDevice(options.ordinal),
                      "cudaSetDevice(" + std::to_string(options.ordinal) + ")");
  }
  cudaStream_t stream(StreamId s) const { return streams[int(s)].get(); }
  std::byte* base() const { return memory.get(); }
  std::string Where(StreamId s) const { return name + "/" + std::string(StreamName(s)); }
  // InvalidArgument unless [p, p + bytes) lies inside the arena (a stray pointer would fault the
  // GPU and lose the whole CUDA context).
  Status CheckRange(DevicePtr<const std::byte> p, size_t bytes, std::string_view what) const {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base());
    const uintptr_t a = p.address();
    if (a < lo || a > lo + capacity || bytes > lo + capacity - a) {
      return Status::InvalidArgument(std::string(what) + ": " + FormatBytes(bytes) +
                                     " at a pointer outside device '" + name + "' memory");
    }
    return Status::Ok();
  }
  // InvalidArgument when a host span is shorter than a copy.
  static Status CheckSpan(HostSpan span, size_t bytes, std::string_view what) {
    if (span.size() >= bytes) return Status::Ok();
    return Status::InvalidArgument(std::string(what) + ": host span of " +
                                   FormatBytes(span.size()) + " is smaller than the copy (" +
                                   FormatBytes(bytes) + ")");
  }
  // Enqueues a host item (already numbered) on `s`. REQUIRES: enqueue_mu[s] held.
  Status LaunchHostItem(StreamId s, std::unique_ptr<HostItem> item) {
    cudaError_t err = cudaLaunchHostFunc(stream(s), RunHostItem, item.get());
    if (err != cudaSuccess) {
      // Never enqueued: finish it so the stream's bookkeeping does not wait on it.
      errors->Finish(int(s), item->seq, Status::Ok());
      return CudaStatus(err, "cudaLaunchHostFunc on " + Where(s));
    }
    (void)item.release();  // RunHostItem owns it now
    return Status::Ok();
  }
};

Result<int> CudaDevice::CountDevices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  if (count == 0) return Status::Unavailable("cudaGetDeviceCount: no CUDA device is visible");
  return count;
}

Result<CudaDeviceInfo> CudaDevice::Describe(int ordinal) {
  FERRY_ASSIGN_OR_RETURN(const int count, CountDevices());
  if (ordinal < 0 || ordinal >= count) {
    return Status::Unavailable("CUDA device " + std::to_string(ordinal) + " does not exist: " +
                               std::to_string(count) + " visible (check CUDA_VISIBLE_DEVICES)");
  }
  FERRY_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  CudaDeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.multiprocessors = prop.multiProcessorCount;
  info.compute_capability = prop.major * 10 + prop.minor;
  FERRY_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  char bus[32] = {};
  FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, int(sizeof(bus)), ordinal));
  info.pci_bus_id = bus;
  return info;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(const int count, CountDevices());
  if (options.ordinal < 0 || options.ordinal >= count) {
    return Status::Unavailable("CUDA device " + std::to_string(options.ordinal) +
                               " does not exist: " + std::to_string(count) +
                               " visible (check CUDA_VISIBLE_DEVICES)");
  }
  if (!(options.memory_fraction > 0 && options.memory_fraction <= 1)) {
    return Status::InvalidArgument("memory_fraction must be in (0, 1], got " +
                                   std::to_string(options.memory_fraction));
  }
  if (!IsPowerOfTwo(options.alignment)) {
    return Status::InvalidArgument("alignment must be a power of two, got " +
                                   std::to_string(options.alignment));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->name = options.name.empty() ? "cuda" + std::to_string(options.ordinal) : options.name;
  FERRY_RETURN_IF_ERROR(impl->MakeCurrent());

  size_t free_bytes = 0, total_bytes = 0;
  FERRY_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  size_t capacity = options.memory_bytes != 0
                        ? options.memory_bytes
                        : size_t(double(free_bytes) * options.memory_fraction);
  capacity = capacity / options.alignment * options.alignment;
  const std::string where = "device '" + impl->name + "'";
  if (capacity == 0) return Status::InvalidArgument(where + ": the arena capacity is zero");
  if (capacity > free_bytes) {
    return Status::OutOfMemory(where + ": an arena of " + FormatBytes(capacity) +
                               " was asked for but only " + FormatBytes(free_bytes) + " of " +
                               FormatBytes(total_bytes) +
                               " are free; lower the memory cap or free the GPU");
  }
  if (options.cublas_workspace_bytes >= capacity) {
    return Status::InvalidArgument(where + ": the cuBLAS workspace (" +
                                   FormatBytes(options.cublas_workspace_bytes) +
                                   ") does not fit in the arena (" + FormatBytes(capacity) + ")");
  }
  void* base = nullptr;
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&base, capacity),
                                   where + ": cudaMalloc of the " + FormatBytes(capacity) +
                                       " arena (" + FormatBytes(free_bytes) + " free)"));
  impl->memory.reset(static_cast<std::byte*>(base));
  impl->capacity = capacity;

  void* check_host = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&check_host, kCheckBytes, cudaHostAllocPortable));
  impl->check_host.reset(static_cast<std::byte*>(check_host));

  for (int s = 0; s < kNumStreams; ++s) {
    cudaStream_t stream = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    impl->streams[s].reset(stream);
  }
  cublasHandle_t cublas = nullptr;
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas));
  impl->cublas.reset(cublas);
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas, impl->stream(StreamId::kCompute)));
  cublasLtHandle_t cublas_lt = nullptr;
  FERRY_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublas_lt));
  impl->cublas_lt.reset(cublas_lt);

  impl->arena = std::make_unique<Arena>(impl->name, capacity, options.alignment);
  CudaContext& c = impl->context;
  c.ordinal = options.ordinal;
  c.compute = impl->stream(StreamId::kCompute);
  c.cublas = cublas;
  c.cublas_lt = cublas_lt;
  if (options.cublas_workspace_bytes > 0) {
    FERRY_ASSIGN_OR_RETURN(
        Arena::Block ws, impl->arena->Allocate(options.cublas_workspace_bytes, "cublas workspace"));
    impl->workspace_handle = ws.handle;
    c.workspace = impl->base() + ws.offset;
    c.workspace_bytes = options.cublas_workspace_bytes;
    FERRY_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas, c.workspace, c.workspace_bytes));
  }
  FERRY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&c.multiprocessors, cudaDevAttrMultiProcessorCount, c.ordinal));
  int major = 0, minor = 0;
  FERRY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c.ordinal));
  FERRY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c.ordinal));
  c.compute_capability = major * 10 + minor;
  c.attention = &impl->attention;
  return std::unique_ptr<CudaDevice>(new CudaDevice(std::move(impl)));
}

CudaDevice::CudaDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaDevice::~CudaDevice() {
  // Enqueued work may still use the arena and host items reference the streams: drain first.
  if (impl_->MakeCurrent().ok()) {
    for (int s = 0; s < kNumStreams; ++s) (void)cudaStreamSynchronize(impl_->streams[s].get());
  }
  assert(impl_->arena->live_allocations() == (impl_->workspace_handle != 0 ? 1u : 0u) &&
         "DeviceBuffers must be destroyed before their CudaDevice");
}

const std::string& CudaDevice::name() const { return impl_->name; }
size_t CudaDevice::capacity() const { return impl_->capacity; }
int CudaDevice::ordinal() const { return impl_->options.ordinal; }
bool CudaDevice::gemm_f16_accumulate() const { return impl_->options.gemm_f16_accumulate; }

// ---- memory ------------------------------------------------------------------------------

Result<DeviceBuffer> CudaDevice::Allocate(size_t bytes, std::string_view requester) {
  if (bytes == 0) {
    return Status::InvalidArgument("device '" + impl_->name + "': zero-byte allocation for '" +
                                   std::string(requester) + "'");
  }
  FERRY_ASSIGN_OR_RETURN(Arena::Block block, impl_->arena->Allocate(bytes, requester));
  return MakeBuffer(this, BackendAccess::Wrap(impl_->base() + block.offset), bytes, block.handle);
}

void CudaDevice::Free(size_t handle) { impl_->arena->Free(handle); }
ArenaStats CudaDevice::arena_stats() const { return impl_->arena->stats(); }
std::vector<ArenaRecord> CudaDevice::arena_log() const { return impl_->arena->log(); }
void CudaDevice::ResetPeak() { impl_->arena->ResetPeak(); }

Result<std::unique_ptr<HostRegistration>> CudaDevice::RegisterHost(const HostAllocation& a) {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  FERRY_RETURN_IF_ERROR(CudaStatus(
      cudaHostRegister(a.data(), a.size(), cudaHostRegisterPortable),
      "cudaHostRegister of host allocation '" + a.name() + "' (" + FormatBytes(a.size()) + ")"));
  return std::unique_ptr<HostRegistration>(std::make_unique<CudaHostRegistration>(a.data()));
}

// ---- events ------------------------------------------------------------------------------

Result<Event> CudaDevice::CreateEvent() {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  cudaEvent_t e = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(std::make_unique<CudaEventImpl>(this, UniqueEvent(e), /*timed=*/false));
}

Result<Event> CudaDevice::CreateTimedEvent() {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  cudaEvent_t e = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return Event(std::make_unique<CudaEventImpl>(this, UniqueEvent(e), /*timed=*/true));
}

namespace {
// The CUDA event behind `event`, or InvalidArgument when it comes from another device kind.
Result<CudaEventImpl*> CudaEventOf(const Event& event, const std::string& device) {
  auto* impl = dynamic_cast<CudaEventImpl*>(event.impl());
  if (impl == nullptr) {
    return Status::InvalidArgument("device '" + device + "': the event is " +
                                   (event.valid() ? "not a CUDA event" : "empty") +
                                   "; create it with a CudaDevice's CreateEvent");
  }
  return impl;
}
}  // namespace

Status CudaDevice::Record(Event& event, StreamId stream) {
  FERRY_ASSIGN_OR_RETURN(CudaEventImpl * e, CudaEventOf(event, impl_->name));
  if (e->owner() != this) {
    return Status::InvalidArgument("device '" + impl_->name +
                                   "': an event is recorded only on the device that created it "
                                   "(it may be waited on by any CUDA device)");
  }
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  std::lock_guard<std::mutex> enqueue(impl_->enqueue_mu[int(stream)]);
  std::lock_guard<std::mutex> lock(e->mu());
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(e->event(), impl_->stream(stream)),
                                   "cudaEventRecord on " + impl_->Where(stream)));
  e->record() = RecordInfo{impl_->errors, impl_->errors->MarkRecord(int(stream))};
  return Status::Ok();
}

Status CudaDevice::Wait(StreamId stream, const Event& event) {
  FERRY_ASSIGN_OR_RETURN(CudaEventImpl * e, CudaEventOf(event, impl_->name));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  std::lock_guard<std::mutex> enqueue(impl_->enqueue_mu[int(stream)]);
  std::lock_guard<std::mutex> lock(e->mu());
  if (!e->record()) return Status::Ok();  // never recorded: a no-op, as in CUDA
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(impl_->stream(stream), e->event(), 0),
                                   "cudaStreamWaitEvent on " + impl_->Where(stream)));
  const RecordInfo& r = *e->record();
  if (!StreamErrorBook::Wait(*r.book, r.mark, *impl_->errors, int(stream))) return Status::Ok();
  // Host items before the record may still fail: carry their outcome across in stream order.
  auto item = std::make_unique<HostItem>();
  item->book = impl_->errors;
  item->stream = int(stream);
  item->seq = impl_->errors->EnqueueHostItem(int(stream));
  item->propagate = r;
  return impl_->LaunchHostItem(stream, std::move(item));
}

Status CudaDevice::Synchronize(const Event& event) {
  FERRY_ASSIGN_OR_RETURN(CudaEventImpl * e, CudaEventOf(event, impl_->name));
  std::optional<RecordInfo> r;
  {
    std::lock_guard<std::mutex> lock(e->mu());
    r = e->record();
  }
  // cudaEventSynchronize waits for the latest record, which may be newer than `r` when another
  // thread records concurrently; the error check then covers the older point (still correct).
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(e->event()),
                                   "cudaEventSynchronize on device '" + impl_->name + "'"));
  if (!r) return Status::Ok();
  return r->book->ErrorBefore(r->mark.stream, r->mark.seq);
}

Status CudaDevice::Synchronize(StreamId stream) {
  const uint64_t end = impl_->errors->NextSeq(int(stream));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(impl_->stream(stream)),
                                   "cudaStreamSynchronize on " + impl_->Where(stream)));
  return impl_->errors->ErrorBefore(int(stream), end);
}

Status CudaDevice::Synchronize() {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  Status cuda_error;
  for (int s = 0; s < kNumStreams; ++s) {
    Status st = CudaStatus(cudaStreamSynchronize(impl_->streams[s].get()),
                           "cudaStreamSynchronize on " + impl_->Where(StreamId(s)));
    if (cuda_error.ok()) cuda_error = std::move(st);
  }
  Status host_error = impl_->errors->TakeFirstError();
  return cuda_error.ok() ? host_error : cuda_error;
}

Result<double> CudaDevice::ElapsedSeconds(const Event& from, const Event& to) {
  const CudaEventImpl* ends[2];
  for (int i = 0; i < 2; ++i) {
    FERRY_ASSIGN_OR_RETURN(CudaEventImpl * e, CudaEventOf(i == 0 ? from : to, impl_->name));
    if (!e->timed() || e->owner() != this) {
      return Status::InvalidArgument("device '" + impl_->name +
                                     "': ElapsedSeconds needs timed "
                                     "events of this device (CreateTimedEvent)");
    }
    std::lock_guard<std::mutex> lock(e->mu());
    if (!e->record()) {
      return Status::FailedPrecondition("device '" + impl_->name +
                                        "': ElapsedSeconds of an event never recorded");
    }
    ends[i] = e;
  }
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  // Both records must have completed: asked first, so cudaEventElapsedTime never answers
  // cudaErrorNotReady.
  for (const CudaEventImpl* e : ends) {
    const cudaError_t err = cudaEventQuery(e->event());
    if (err == cudaErrorNotReady) {
      return Status::FailedPrecondition("device '" + impl_->name +
                                        "': ElapsedSeconds of a record that has not completed "
                                        "(synchronize on the event first)");
    }
    FERRY_RETURN_IF_ERROR(CudaStatus(err, "cudaEventQuery on device '" + impl_->name + "'"));
  }
  float ms = 0;
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, ends[0]->event(), ends[1]->event()),
                                   "cudaEventElapsedTime on device '" + impl_->name + "'"));
  return double(ms) * 1e-3;
}

Result<bool> CudaDevice::Query(const Event& event) {
  FERRY_ASSIGN_OR_RETURN(CudaEventImpl * e, CudaEventOf(event, impl_->name));
  cudaError_t err = cudaEventQuery(e->event());
  if (err == cudaErrorNotReady) return false;
  FERRY_RETURN_IF_ERROR(CudaStatus(err, "cudaEventQuery on device '" + impl_->name + "'"));
  return true;
}

// ---- copies and host functions -------------------------------------------------------------

Status CudaDevice::CopyToDevice(DevicePtr<std::byte> dst, HostSpan src, size_t bytes,
                                StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(dst, bytes, "CopyToDevice"));
  FERRY_RETURN_IF_ERROR(Impl::CheckSpan(src, bytes, "CopyToDevice"));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  return CudaStatus(cudaMemcpyAsync(BackendAccess::Raw(dst), src.data(), bytes,
                                    cudaMemcpyHostToDevice, impl_->stream(stream)),
                    "cudaMemcpyAsync of " + FormatBytes(bytes) + " to " + impl_->Where(stream));
}

Status CudaDevice::CopyToHost(HostSpan dst, DevicePtr<const std::byte> src, size_t bytes,
                              StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(src, bytes, "CopyToHost"));
  FERRY_RETURN_IF_ERROR(Impl::CheckSpan(dst, bytes, "CopyToHost"));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  return CudaStatus(cudaMemcpyAsync(dst.data(), BackendAccess::Raw(src), bytes,
                                    cudaMemcpyDeviceToHost, impl_->stream(stream)),
                    "cudaMemcpyAsync of " + FormatBytes(bytes) + " from " + impl_->Where(stream));
}

Status CudaDevice::Zero(DevicePtr<std::byte> dst, size_t bytes, StreamId stream) {
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(dst, bytes, "Zero"));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  return CudaStatus(cudaMemsetAsync(BackendAccess::Raw(dst), 0, bytes, impl_->stream(stream)),
                    "cudaMemsetAsync of " + FormatBytes(bytes) + " on " + impl_->Where(stream));
}

Status CudaDevice::LaunchHostFunc(StreamId stream, std::function<Status()> fn) {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  std::lock_guard<std::mutex> enqueue(impl_->enqueue_mu[int(stream)]);
  auto item = std::make_unique<HostItem>();
  item->book = impl_->errors;
  item->stream = int(stream);
  item->seq = impl_->errors->EnqueueHostItem(int(stream));
  item->where = impl_->Where(stream);
  item->fn = std::move(fn);
  return impl_->LaunchHostItem(stream, std::move(item));
}

Status CudaDevice::EnqueueCompute(std::string_view op,
                                  const std::function<Status(const CudaContext&)>& launch) {
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  std::lock_guard<std::mutex> enqueue(impl_->enqueue_mu[int(StreamId::kCompute)]);
  FERRY_RETURN_IF_ERROR(launch(impl_->context).WithContext("op '" + std::string(op) + "'"));
  // Configuration errors are reported at launch, by cudaGetLastError.
  return CudaStatus(cudaGetLastError(), "kernel launch of op '" + std::string(op) +
                                            "' on device '" + impl_->name + "'");
}

Status CudaDevice::EnqueueComputeCheck(std::string_view op, DevicePtr<const std::byte> src,
                                       size_t bytes,
                                       std::function<Status(const std::byte* host)> check) {
  if (bytes > kCheckBytes) {
    return Status::InvalidArgument("op '" + std::string(op) + "': a check of " +
                                   std::to_string(bytes) + " bytes; at most " +
                                   std::to_string(kCheckBytes));
  }
  FERRY_RETURN_IF_ERROR(impl_->CheckRange(src, bytes, "EnqueueComputeCheck"));
  FERRY_RETURN_IF_ERROR(impl_->MakeCurrent());
  const StreamId s = StreamId::kCompute;
  std::lock_guard<std::mutex> enqueue(impl_->enqueue_mu[int(s)]);
  const std::byte* host = impl_->check_host.get();
  FERRY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(impl_->check_host.get(), BackendAccess::Raw(src), bytes,
                      cudaMemcpyDeviceToHost, impl_->stream(s)),
      "cudaMemcpyAsync of op '" + std::string(op) + "''s check from " + impl_->Where(s)));
  auto item = std::make_unique<HostItem>();
  item->book = impl_->errors;
  item->stream = int(s);
  item->seq = impl_->errors->EnqueueHostItem(int(s));
  item->where = impl_->Where(s);
  item->fn = [host, check = std::move(check)] { return check(host); };
  return impl_->LaunchHostItem(s, std::move(item));
}

}  // namespace ferry
