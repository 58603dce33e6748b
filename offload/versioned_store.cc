#include "offload/versioned_store.h"

#include <fcntl.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <utility>

#include "offload/crc32c.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

constexpr uint64_t kMagic = 0x3153564f59525246ull;  // "FRRYOVS1" as little-endian bytes

// Follows a slot's record bytes; little-endian as the host (the files are scratch of one machine).
struct SlotHeader {
  uint64_t magic = kMagic;
  uint32_t record = 0;
  uint32_t payload_crc = 0;
  int64_t step = 0;
  uint64_t payload_bytes = 0;
  uint64_t reserved = 0;
  uint32_t pad = 0;
  uint32_t header_crc = 0;  // CRC-32C of the bytes above
};
static_assert(sizeof(SlotHeader) == kVersionedSlotHeaderBytes);

uint32_t HeaderCrc(const SlotHeader& h) {
  return Crc32c(std::as_bytes(std::span(&h, 1)).first(offsetof(SlotHeader, header_crc)));
}

std::string SlotName(const std::string& path, int slot) {
  return "slot " + std::to_string(slot) + " of " + path;
}

// Reads or writes `bytes` at `offset` of `fd` whole: one pread/pwrite, a short transfer resumed
// from its last whole O_DIRECT block, EAGAIN/EINTR retried; each result through the env's
// FilterCompletion (the tests' fault injection). A transfer of 0 bytes (end of file) is an
// error, never a retry. `what` ("slot 0 of <file>") names the slot in errors.
Status TransferWhole(IoEnv& env, IoKind kind, int fd, std::byte* buf, size_t bytes, uint64_t offset,
                     const std::string& what) {
  const bool read = kind == IoKind::kRead;
  size_t done = 0;
  while (done < bytes) {
    IoRequest req{.kind = kind,
                  .fd = fd,
                  .buf = buf + done,
                  .len = uint32_t(bytes - done),
                  .offset = offset + done};
    const int rc = read ? int(env.Pread(req.fd, req.buf, req.len, off_t(req.offset)))
                        : int(env.Pwrite(req.fd, req.buf, req.len, off_t(req.offset)));
    const ssize_t n = env.FilterCompletion(req, rc);
    if (n == -EAGAIN || n == -EINTR) continue;
    if (n < 0) return Status::FromErrno(int(-n), (read ? "read " : "write ") + what);
    if (n == 0) return Status::Corruption((read ? "read " : "write ") + what + ": end of file");
    if (size_t(n) == req.len) break;
    done = (done + size_t(n)) / kVersionedSlotAlign * kVersionedSlotAlign;  // aligned resubmit
  }
  return Status::Ok();
}

}  // namespace

VersionedStore::VersionedStore(VersionedStoreOptions options, std::vector<size_t> record_bytes)
    : options_(std::move(options)), record_bytes_(std::move(record_bytes)) {
  static IoEnv real_env;  // stateless (io_env.h)
  env_ = options_.env != nullptr ? options_.env : &real_env;
}

VersionedStore::~VersionedStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (io_thread_.joinable()) io_thread_.join();
  for (int fd : fds_) {
    if (fd >= 0) (void)env_->Close(fd);
  }
}

Status VersionedStore::OpenFiles(bool create) {
  if (options_.staging_buffers < 1) {
    return Status::InvalidArgument("a versioned store needs at least one staging buffer");
  }
  if (create) {
    const int rc = env_->MakeDirectory(options_.directory);
    if (rc < 0) return Status::FromErrno(-rc, "create " + options_.directory);
  }
  direct_io_ = options_.direct_io;
  for (size_t r = 0; r < record_bytes_.size(); ++r) {
    char name[48];
    std::snprintf(name, sizeof(name), "/record-%05zu.slots", r);
    paths_.push_back(options_.directory + name);
    const int flags = O_RDWR | (create ? O_CREAT | O_TRUNC : 0);
    int fd = direct_io_ ? env_->Open(paths_[r], flags | O_DIRECT, 0600) : -EINVAL;
    if (fd == -EINVAL) {  // the filesystem refuses O_DIRECT (tmpfs): the page cache serves
      direct_io_ = false;
      fd = env_->Open(paths_[r], flags, 0600);
    }
    if (fd < 0) return Status::FromErrno(-fd, "open " + paths_[r]);
    fds_.push_back(fd);
    const size_t file_bytes = 2 * VersionedSlotBytes(record_bytes_[r]);
    if (create) {
      const int frc = env_->Fallocate(fd, 0, off_t(file_bytes));
      if (frc < 0) return Status::FromErrno(-frc, "reserve " + paths_[r]);
    } else if (const int64_t size = env_->FileSize(fd); size != int64_t(file_bytes)) {
      return Status::Corruption(
          paths_[r] + " holds " + std::to_string(size) + " bytes; two slots of a record of " +
          std::to_string(record_bytes_[r]) + " bytes take " + std::to_string(file_bytes));
    }
  }
  committed_slot_.assign(record_bytes_.size(), 0);
  step_.assign(record_bytes_.size(), 0);
  return AllocateStaging();
}

Status VersionedStore::AllocateStaging() {
  for (size_t b : record_bytes_) buffer_bytes_ = std::max(buffer_bytes_, VersionedSlotBytes(b));
  buffer_bytes_ = std::max(buffer_bytes_, kVersionedSlotAlign);
  FERRY_ASSIGN_OR_RETURN(staging_,
                         HostAllocation::Map(buffer_bytes_ * size_t(options_.staging_buffers),
                                             "versioned store staging"));
  buffers_.assign(size_t(options_.staging_buffers), Buffer{});
  io_thread_ = std::thread([this] { IoThread(); });
  return Status::Ok();
}

Result<std::unique_ptr<VersionedStore>> VersionedStore::Create(
    VersionedStoreOptions options, std::vector<size_t> record_bytes, int64_t step,
    const std::function<void(size_t, std::span<std::byte>)>& init) {
  std::unique_ptr<VersionedStore> s(
      new VersionedStore(std::move(options), std::move(record_bytes)));
  FERRY_RETURN_IF_ERROR(s->OpenFiles(/*create=*/true));
  std::byte* buf = s->buffer_data(0);  // no prefetch runs before the store is returned
  for (size_t r = 0; r < s->records(); ++r) {
    std::memset(buf, 0, s->buffer_bytes_);
    init(r, std::span(buf, s->record_bytes_[r]));
    FERRY_RETURN_IF_ERROR(s->WriteSlot(r, 0, step, buf));
    s->step_[r] = step;
  }
  FERRY_RETURN_IF_ERROR(SyncDirectory(s->options_.directory));
  return s;
}

Result<std::unique_ptr<VersionedStore>> VersionedStore::Open(VersionedStoreOptions options,
                                                             std::vector<size_t> record_bytes) {
  std::unique_ptr<VersionedStore> s(
      new VersionedStore(std::move(options), std::move(record_bytes)));
  FERRY_RETURN_IF_ERROR(s->OpenFiles(/*create=*/false));
  std::byte* buf = s->buffer_data(0);
  for (size_t r = 0; r < s->records(); ++r) {
    int best = -1;
    int64_t best_step = 0;
    std::string why;
    for (int slot = 0; slot < 2; ++slot) {
      Result<int64_t> step = s->ReadSlot(r, slot, buf);
      if (!step.ok()) {
        why += (why.empty() ? "" : "; ") + step.status().message();
        continue;
      }
      if (best < 0 || *step > best_step) best = slot, best_step = *step;
    }
    if (best < 0) return Status::Corruption(s->paths_[r] + " has no valid slot: " + why);
    s->committed_slot_[r] = best;
    s->step_[r] = best_step;
  }
  return s;
}

int64_t VersionedStore::step(size_t r) const {
  std::lock_guard lock(mu_);
  return step_[r];
}

uint64_t VersionedStore::disk_bytes() const {
  uint64_t bytes = 0;
  for (size_t b : record_bytes_) bytes += 2 * VersionedSlotBytes(b);
  return bytes;
}

VersionedStoreStats VersionedStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Result<int64_t> VersionedStore::ReadSlot(size_t r, int slot, std::byte* dst) {
  const size_t bytes = VersionedSlotBytes(record_bytes_[r]);
  FERRY_RETURN_IF_ERROR(TransferWhole(*env_, IoKind::kRead, fds_[r], dst, bytes,
                                      uint64_t(slot) * bytes, SlotName(paths_[r], slot)));
  {
    std::lock_guard lock(mu_);
    stats_.bytes_read += bytes;
  }
  SlotHeader h;
  std::memcpy(&h, dst + record_bytes_[r], sizeof(h));
  const std::string where = SlotName(paths_[r], slot);
  if (h.magic != kMagic) return Status::Corruption(where + ": never written");
  if (h.header_crc != HeaderCrc(h)) return Status::Corruption(where + ": header checksum fails");
  if (h.record != r || h.payload_bytes != record_bytes_[r]) {
    return Status::Corruption(where + ": holds record " + std::to_string(h.record) + " of " +
                              std::to_string(h.payload_bytes) + " bytes");
  }
  if (Crc32c(std::span(dst, record_bytes_[r])) != h.payload_crc) {
    return Status::Corruption(where + ": the record's checksum fails (a torn write)");
  }
  return h.step;
}

Status VersionedStore::WriteSlot(size_t r, int slot, int64_t step, std::byte* src) {
  const size_t bytes = VersionedSlotBytes(record_bytes_[r]);
  SlotHeader h;
  h.record = uint32_t(r);
  h.step = step;
  h.payload_bytes = record_bytes_[r];
  h.payload_crc = Crc32c(std::span(src, record_bytes_[r]));
  h.header_crc = HeaderCrc(h);
  std::memcpy(src + record_bytes_[r], &h, sizeof(h));
  std::memset(src + record_bytes_[r] + sizeof(h), 0, bytes - record_bytes_[r] - sizeof(h));
  FERRY_RETURN_IF_ERROR(TransferWhole(*env_, IoKind::kWrite, fds_[r], src, bytes,
                                      uint64_t(slot) * bytes, SlotName(paths_[r], slot)));
  const int rc = env_->Fdatasync(fds_[r]);
  if (rc < 0) return Status::FromErrno(-rc, "fdatasync " + paths_[r]);
  std::lock_guard lock(mu_);
  stats_.bytes_written += bytes;
  return Status::Ok();
}

int VersionedStore::FindLocked(size_t r) const {
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].state != BufferState::kFree && buffers_[b].record == r) return int(b);
  }
  return -1;
}

void VersionedStore::Prefetch(size_t r) {
  std::lock_guard lock(mu_);
  if (r >= records() || FindLocked(r) >= 0) return;
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].state != BufferState::kFree) continue;
    buffers_[b] = Buffer{.state = BufferState::kReading, .record = r, .status = Status::Ok()};
    queue_.push_back(b);
    cv_.notify_all();
    return;
  }
}

void VersionedStore::IoThread() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t b = queue_.front();
    queue_.pop_front();
    const size_t r = buffers_[b].record;
    const int slot = committed_slot_[r];
    const int64_t want = step_[r];
    lock.unlock();
    Result<int64_t> step = ReadSlot(r, slot, buffer_data(b));
    Status s = !step.ok()      ? step.status()
               : *step != want ? Status::Corruption(SlotName(paths_[r], slot) + " holds step " +
                                                    std::to_string(*step) + ", committed " +
                                                    std::to_string(want))
                               : Status::Ok();
    lock.lock();
    buffers_[b].status = std::move(s);
    buffers_[b].state = BufferState::kReady;
    cv_.notify_all();
  }
}

Result<std::span<std::byte>> VersionedStore::Acquire(size_t r) {
  std::unique_lock lock(mu_);
  if (r >= records()) return Status::InvalidArgument("no record " + std::to_string(r));
  for (;;) {
    const int b = FindLocked(r);
    if (b >= 0) {
      Buffer& buf = buffers_[size_t(b)];
      if (buf.state == BufferState::kAcquired) {
        return Status::FailedPrecondition("record " + std::to_string(r) + " is already acquired");
      }
      cv_.wait(lock, [&] { return buf.state != BufferState::kReading; });
      if (!buf.status.ok()) {
        Status s = std::move(buf.status);
        buf = Buffer{};
        return s;
      }
      buf.state = BufferState::kAcquired;
      return std::span(buffer_data(size_t(b)), record_bytes_[r]);
    }
    // Not staged: take a free buffer, else drop a prefetched one nobody asked for yet, else wait.
    int take = -1;
    for (size_t i = 0; i < buffers_.size() && take < 0; ++i) {
      if (buffers_[i].state == BufferState::kFree) take = int(i);
    }
    for (size_t i = 0; i < buffers_.size() && take < 0; ++i) {
      if (buffers_[i].state == BufferState::kReady) take = int(i), ++stats_.wasted_prefetches;
    }
    if (take < 0) {
      cv_.wait(lock);
      continue;
    }
    ++stats_.unprefetched;
    buffers_[size_t(take)] =
        Buffer{.state = BufferState::kReading, .record = r, .status = Status::Ok()};
    queue_.push_front(size_t(take));  // ahead of any read-ahead
    cv_.notify_all();
  }
}

Status VersionedStore::Commit(size_t r, int64_t step) {
  int b, slot;
  {
    std::lock_guard lock(mu_);
    b = FindLocked(r);
    assert(b >= 0 && buffers_[size_t(b)].state == BufferState::kAcquired);
    slot = 1 - committed_slot_[r];
  }
  Status s = WriteSlot(r, slot, step, buffer_data(size_t(b)));
  std::lock_guard lock(mu_);
  if (s.ok()) {
    committed_slot_[r] = slot;
    step_[r] = step;
    ++stats_.commits;
  }
  buffers_[size_t(b)] = Buffer{};
  cv_.notify_all();
  return s;
}

void VersionedStore::Release(size_t r) {
  std::lock_guard lock(mu_);
  const int b = FindLocked(r);
  assert(b >= 0 && buffers_[size_t(b)].state == BufferState::kAcquired);
  buffers_[size_t(b)] = Buffer{};
  cv_.notify_all();
}

}  // namespace ferry
