// NvmeStore: Open (backend and O_DIRECT choice), the index, and the public API. The I/O loop is in
// store_dispatcher.cc.
#include "offload/nvme_store.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>

#include "offload/store_impl.h"

namespace ferry {
namespace {

std::shared_ptr<TransferHandle::State> NewHandleState() {
  return std::make_shared<TransferHandle::State>();
}

std::shared_ptr<Transfer> NewTransfer(Transfer::Kind kind, TransferPriority priority) {
  auto t = std::make_shared<Transfer>();
  t->kind = kind;
  t->priority = priority;
  t->handle = NewHandleState();
  return t;
}

TransferHandle Failed(Status s) {
  auto st = NewHandleState();
  st->Finish(std::move(s));
  return TransferHandle(st);
}

// Whether O_DIRECT works in `dir`: open a probe file with it and write one aligned page.
// Returns an empty string when it does, else the reason it does not.
std::string ProbeDirectIo(IoEnv& env, const std::string& dir) {
  const std::string path = dir + "/.odirect-probe";
  const int fd = env.Open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0) {
    env.Unlink(path);
    return std::string("open with O_DIRECT: ") + std::strerror(-fd);
  }
  std::string reason;
  auto page = HostAllocation::Map(kDirectAlign, "O_DIRECT probe");
  if (!page.ok()) {
    reason = page.status().ToString();
  } else {
    const ssize_t n = env.Pwrite(fd, page->data(), kDirectAlign, 0);
    if (n != ssize_t(kDirectAlign)) {
      reason = std::string("aligned O_DIRECT write: ") +
               (n < 0 ? std::strerror(int(-n)) : "short write");
    }
  }
  env.Close(fd);
  env.Unlink(path);
  return reason;
}

}  // namespace

// ---- handles and versions -------------------------------------------------------------------

void TransferHandle::State::Finish(Status s) {
  {
    std::lock_guard lock(mu);
    status = std::move(s);
    done = true;
  }
  cv.notify_all();
}

bool TransferHandle::done() const {
  assert(state_ != nullptr);
  std::lock_guard lock(state_->mu);
  return state_->done;
}

Status TransferHandle::Wait() const {
  assert(state_ != nullptr);
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

EntryVersion::~EntryVersion() {
  if (allocator == nullptr) return;
  std::vector<Slot> slots;
  slots.reserve(blocks.size());
  for (const StoredBlock& b : blocks) slots.push_back(b.slot);
  allocator->Free(slots);
}

// ---- Impl -----------------------------------------------------------------------------------

NvmeStore::Impl::Impl(NvmeStoreOptions o)
    : options(std::move(o)),
      env(options.env != nullptr ? options.env : &default_env),
      queues(options.starvation_quota),
      codec(options.compression_level) {}

NvmeStore::Impl::~Impl() {
  if (dispatcher.joinable()) {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    engine->Wake();
    dispatcher.join();
  }
  engine.reset();  // before the bounce buffers it may have registered
  index.clear();   // versions free their slots into the allocator, destroyed after
  std::lock_guard lock(mu);
  for (const ExternalFile& f : externals) env->Close(f.fd);
}

void NvmeStore::Impl::Log(std::string_view line) const {
  if (options.log) {
    options.log(line);
  } else {
    std::fprintf(stderr, "ferry: %.*s\n", int(line.size()), line.data());
  }
}

TransferHandle NvmeStore::Impl::Submit(std::shared_ptr<Transfer> t) {
  TransferHandle h(t->handle);
  if (t->num_blocks == 0) {
    Finalize(t);
  } else {
    Enqueue(std::move(t));
  }
  return h;
}

void NvmeStore::Impl::Enqueue(std::shared_ptr<Transfer> t) {
  {
    std::lock_guard lock(mu);
    if (stop) {
      t->handle->Finish(Status::Cancelled("the NVMe store is shutting down"));
      return;
    }
    const TransferPriority p = t->priority;
    queues.Push(p, std::move(t));
  }
  engine->Wake();
}

// ---- Open -----------------------------------------------------------------------------------

NvmeStore::NvmeStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvmeStore::~NvmeStore() = default;

Result<std::unique_ptr<NvmeStore>> NvmeStore::Open(NvmeStoreOptions options) {
  if (options.directory.empty()) return Status::InvalidArgument("NVMe store: no directory given");
  if (options.block_bytes == 0 || options.block_bytes % kDirectAlign != 0 ||
      options.block_bytes > (size_t{64} << 20)) {
    return Status::InvalidArgument("NVMe store block size " + std::to_string(options.block_bytes) +
                                   " must be a positive multiple of 4096 of at most 64 MiB");
  }
  if (options.queue_depth < 1 || options.queue_depth > 1024) {
    return Status::InvalidArgument("NVMe store queue depth " + std::to_string(options.queue_depth) +
                                   " must be in 1..1024");
  }
  if (options.starvation_quota < 1) options.starvation_quota = 1;
  options.segment_bytes =
      AlignUp(std::max(options.segment_bytes, options.block_bytes), options.block_bytes);

  auto impl = std::make_unique<Impl>(std::move(options));
  Impl& s = *impl;
  const NvmeStoreOptions& o = s.options;
  IoEnv& env = *s.env;
  if (const int rc = env.MakeDirectory(o.directory); rc < 0) {
    return Status::FromErrno(-rc, "creating NVMe store directory " + o.directory +
                                      " (its parent must exist and be writable)");
  }

  // O_DIRECT, then the backend.
  std::string why_buffered = "O_DIRECT not requested";
  if (o.direct_io) {
    why_buffered = ProbeDirectIo(env, o.directory);
    s.direct = why_buffered.empty();
  }
  std::string why_threads;
  bool use_uring = false;
  switch (o.backend) {
    case StoreBackend::kThreadPool:
      why_threads = "thread pool forced by option";
      break;
    case StoreBackend::kIoUring:
      use_uring = true;
      break;
    case StoreBackend::kAuto:
      use_uring = s.direct;
      if (!s.direct) why_threads = "O_DIRECT refused by the filesystem (" + why_buffered + ")";
      break;
  }

  const size_t B = o.block_bytes;
  FERRY_ASSIGN_OR_RETURN(s.bounce,
                         HostAllocation::Map(B * o.queue_depth, "NVMe store bounce buffers"));
  std::string reg_report;
  if (use_uring) {
    std::vector<iovec> iov;
    const size_t registrable = std::min<size_t>(o.queue_depth, o.max_registered_bytes / B);
    for (size_t i = 0; i < registrable; ++i) iov.push_back({s.bounce.data() + i * B, B});
    auto engine = CreateUringEngine(env, o.queue_depth, iov, &reg_report);
    if (engine.ok()) {
      s.engine = std::move(engine).value();
    } else if (o.backend == StoreBackend::kIoUring) {
      return engine.status().WithContext("NVMe store in " + o.directory + " (io_uring forced)");
    } else {
      why_threads = engine.status().message();
    }
  }
  if (s.engine == nullptr) s.engine = CreateThreadEngine(env, o.queue_depth, o.io_threads);

  s.allocator = std::make_unique<SegmentAllocator>(env, o.directory, B, o.segment_bytes,
                                                   s.direct ? O_DIRECT : 0);
  FERRY_RETURN_IF_ERROR(s.allocator->Reserve(o.reserve_bytes));

  s.inflight.resize(o.queue_depth);
  for (unsigned i = o.queue_depth; i > 0; --i) s.free_buffers.push_back(i - 1);
  s.report = "NVMe store " + o.directory + ": backend " + std::string(s.engine->name()) +
             (why_threads.empty() ? "" : " (" + why_threads + ")") + ", O_DIRECT " +
             (s.direct ? "on" : "off (" + why_buffered + ")") + ", block " +
             std::to_string(B >> 10) + " KiB, queue depth " + std::to_string(o.queue_depth);
  if (!reg_report.empty()) s.report += ", " + reg_report;
  s.Log(s.report);
  std::promise<Status> bound;
  s.dispatcher = std::thread([&s, &bound] {
    Status b = s.engine->Bind();
    const bool ok = b.ok();
    bound.set_value(std::move(b));
    if (ok) s.Run();
  });
  if (Status b = bound.get_future().get(); !b.ok()) {
    s.dispatcher.join();
    return b.WithContext("NVMe store in " + o.directory);
  }
  return std::unique_ptr<NvmeStore>(new NvmeStore(std::move(impl)));
}

// ---- entries --------------------------------------------------------------------------------

TransferHandle NvmeStore::WriteAsync(std::string name, std::span<const std::byte> src,
                                     TransferPriority priority, Compression compression) {
  Impl& s = *impl_;
  const size_t B = s.options.block_bytes;
  auto t = NewTransfer(Transfer::Kind::kWrite, priority);
  t->name = std::move(name);
  t->src = src;
  t->compression = compression;
  t->num_blocks = (src.size() + B - 1) / B;
  auto slots = s.allocator->Allocate(t->num_blocks);
  if (!slots.ok()) return Failed(slots.status().WithContext("writing entry '" + t->name + "'"));
  t->version = std::make_shared<EntryVersion>();
  t->version->size = src.size();
  t->version->allocator = s.allocator.get();
  t->version->blocks.resize(t->num_blocks);
  for (size_t i = 0; i < t->num_blocks; ++i) t->version->blocks[i].slot = (*slots)[i];
  return s.Submit(std::move(t));
}

TransferHandle NvmeStore::ReadAsync(const std::string& name, std::span<std::byte> dst,
                                    TransferPriority priority) {
  Impl& s = *impl_;
  auto t = NewTransfer(Transfer::Kind::kRead, priority);
  t->name = name;
  t->dst = dst;
  {
    std::lock_guard lock(s.mu);
    auto it = s.index.find(name);
    if (it == s.index.end()) {
      return Failed(Status::NotFound("NVMe store has no entry '" + name + "'"));
    }
    t->version = it->second;
  }
  if (t->version->size != dst.size()) {
    return Failed(Status::InvalidArgument("reading entry '" + name + "' of " +
                                          std::to_string(t->version->size) +
                                          " bytes into a buffer of " + std::to_string(dst.size())));
  }
  t->num_blocks = t->version->blocks.size();
  return s.Submit(std::move(t));
}

Status NvmeStore::Write(std::string name, std::span<const std::byte> src, TransferPriority priority,
                        Compression compression) {
  return WriteAsync(std::move(name), src, priority, compression).Wait();
}

Status NvmeStore::Read(const std::string& name, std::span<std::byte> dst,
                       TransferPriority priority) {
  return ReadAsync(name, dst, priority).Wait();
}

Result<size_t> NvmeStore::EntrySize(const std::string& name) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) return Status::NotFound("NVMe store has no entry '" + name + "'");
  return it->second->size;
}

Status NvmeStore::Remove(const std::string& name) {
  std::shared_ptr<EntryVersion> dropped;  // released outside the lock
  std::lock_guard lock(impl_->mu);
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) return Status::NotFound("NVMe store has no entry '" + name + "'");
  dropped = std::move(it->second);
  impl_->index.erase(it);
  return Status::Ok();
}

Result<BlockLocation> NvmeStore::LocateBlock(const std::string& name, size_t block) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) return Status::NotFound("NVMe store has no entry '" + name + "'");
  if (block >= it->second->blocks.size()) {
    return Status::InvalidArgument("entry '" + name + "' has " +
                                   std::to_string(it->second->blocks.size()) + " blocks");
  }
  const StoredBlock& b = it->second->blocks[block];
  return BlockLocation{impl_->allocator->SegmentPath(b.slot.segment), b.slot.offset, b.stored_len,
                       b.compressed};
}

// ---- external files -------------------------------------------------------------------------

Result<int> NvmeStore::OpenExternal(const std::string& path) {
  Impl& s = *impl_;
  int fd = s.direct ? s.env->Open(path, O_RDONLY | O_DIRECT, 0) : -EINVAL;
  if (fd == -EINVAL) fd = s.env->Open(path, O_RDONLY, 0);  // filesystem without O_DIRECT
  if (fd < 0) return Status::FromErrno(-fd, "opening " + path + " for reading");
  const int64_t size = s.env->FileSize(fd);
  if (size < 0) {
    s.env->Close(fd);
    return Status::FromErrno(int(-size), "stat " + path);
  }
  std::lock_guard lock(s.mu);
  s.externals.push_back({path, fd, uint64_t(size)});
  return int(s.externals.size() - 1);
}

Result<uint64_t> NvmeStore::ExternalSize(int file) const {
  std::lock_guard lock(impl_->mu);
  if (file < 0 || size_t(file) >= impl_->externals.size()) {
    return Status::InvalidArgument("no external file " + std::to_string(file));
  }
  return impl_->externals[file].size;
}

TransferHandle NvmeStore::ReadExternalAsync(int file, uint64_t offset, std::span<std::byte> dst,
                                            TransferPriority priority) {
  Impl& s = *impl_;
  auto t = NewTransfer(Transfer::Kind::kReadExternal, priority);
  t->dst = dst;
  t->offset = offset;
  {
    std::lock_guard lock(s.mu);
    if (file < 0 || size_t(file) >= s.externals.size()) {
      return Failed(Status::InvalidArgument("no external file " + std::to_string(file)));
    }
    t->name = s.externals[file].path;
    t->fd = s.externals[file].fd;
    t->file_size = s.externals[file].size;
  }
  if (offset > t->file_size || dst.size() > t->file_size - offset) {
    return Failed(Status::InvalidArgument(
        "reading [" + std::to_string(offset) + ", " + std::to_string(offset + dst.size()) +
        ") of " + t->name + ", which has " + std::to_string(t->file_size) + " bytes"));
  }
  t->aligned_begin = offset / kDirectAlign * kDirectAlign;
  t->aligned_end = AlignUp(offset + dst.size(), kDirectAlign);
  const size_t B = s.options.block_bytes;
  t->num_blocks = dst.empty() ? 0 : (t->aligned_end - t->aligned_begin + B - 1) / B;
  return s.Submit(std::move(t));
}

// ---- introspection --------------------------------------------------------------------------

std::string_view NvmeStore::backend_name() const { return impl_->engine->name(); }
bool NvmeStore::direct_io() const { return impl_->direct; }
unsigned NvmeStore::registered_buffers() const { return impl_->engine->registered_buffers(); }
size_t NvmeStore::block_bytes() const { return impl_->options.block_bytes; }
size_t NvmeStore::bounce_bytes() const { return impl_->bounce.size(); }
size_t NvmeStore::bounce_resident_bytes() const { return impl_->bounce.ResidentBytes(); }
const std::string& NvmeStore::report() const { return impl_->report; }

StoreStats NvmeStore::stats() const {
  const Impl& s = *impl_;
  StoreStats st;
  st.bytes_written = s.bytes_written.load();
  st.bytes_read = s.bytes_read.load();
  st.disk_bytes_written = s.disk_written.load();
  st.disk_bytes_read = s.disk_read.load();
  st.short_resubmits = s.short_resubmits.load();
  st.again_resubmits = s.again_resubmits.load();
  st.compressed_blocks = s.compressed_blocks.load();
  st.checksum_failures = s.checksum_failures.load();
  st.compression_decisions_yes = s.decisions_yes.load();
  st.compression_decisions_no = s.decisions_no.load();
  st.zero_copy_blocks = s.zero_copy_blocks.load();
  return st;
}

}  // namespace ferry
