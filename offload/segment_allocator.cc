#include "offload/segment_allocator.h"

#include <fcntl.h>

#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry {

SegmentAllocator::SegmentAllocator(IoEnv& env, std::string directory, size_t slot_bytes,
                                   size_t segment_bytes, int open_flags)
    : env_(env),
      directory_(std::move(directory)),
      slot_bytes_(slot_bytes),
      segment_bytes_(segment_bytes),
      open_flags_(open_flags) {
  assert(slot_bytes > 0 && segment_bytes % slot_bytes == 0 && segment_bytes > 0);
}

SegmentAllocator::~SegmentAllocator() {
  for (size_t i = 0; i < fds_.size(); ++i) {
    env_.Close(fds_[i]);
    env_.Unlink(SegmentPath(uint32_t(i)));  // scratch space: nothing persists
  }
}

std::string SegmentAllocator::SegmentPath(uint32_t segment) const {
  char name[32];
  std::snprintf(name, sizeof name, "segment-%05u.ferry", segment);
  return directory_ + "/" + name;
}

Status SegmentAllocator::AddSegmentLocked() {
  const uint32_t seg = uint32_t(fds_.size());
  const std::string path = SegmentPath(seg);
  const int fd = env_.Open(path, O_RDWR | O_CREAT | O_TRUNC | open_flags_, 0600);
  if (fd < 0) {
    if (fd == -ENOENT) {
      return Status::NotFound("store directory " + directory_ +
                              " has vanished (creating " + path +
                              "); entries already written stay readable");
    }
    return Status::FromErrno(-fd, "creating store segment " + path);
  }
  const int rc = env_.Fallocate(fd, 0, off_t(segment_bytes_));
  if (rc < 0 && rc != -EOPNOTSUPP) {
    env_.Close(fd);
    env_.Unlink(path);
    const std::string what = "reserving " + std::to_string(segment_bytes_ >> 10) +
                             " KiB for store segment " + path;
    const Status s = Status::FromErrno(-rc, what);
    if (s.code() != StatusCode::kNoSpace) return s;
    return Status::NoSpace(s.message() +
                           " (free disk space, raise the file-size limit or point the store at "
                           "a bigger disk; entries already written stay readable)");
  }
  fds_.push_back(fd);
  const uint64_t per = segment_bytes_ / slot_bytes_;
  for (uint64_t i = 0; i < per; ++i) free_.insert(seg * per + i);
  return Status::Ok();
}

Status SegmentAllocator::Reserve(size_t bytes) {
  std::lock_guard lock(mu_);
  while (fds_.size() * segment_bytes_ < bytes) FERRY_RETURN_IF_ERROR(AddSegmentLocked());
  return Status::Ok();
}

Result<std::vector<Slot>> SegmentAllocator::Allocate(size_t count) {
  std::lock_guard lock(mu_);
  while (free_.size() < count) FERRY_RETURN_IF_ERROR(AddSegmentLocked());
  const uint64_t per = segment_bytes_ / slot_bytes_;
  std::vector<Slot> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t id = *free_.begin();
    free_.erase(free_.begin());
    const uint32_t seg = uint32_t(id / per);
    out.push_back({fds_[seg], seg, (id % per) * slot_bytes_, id});
  }
  return out;
}

void SegmentAllocator::Free(const std::vector<Slot>& slots) {
  std::lock_guard lock(mu_);
  for (const Slot& s : slots) free_.insert(s.id);
}

size_t SegmentAllocator::capacity_bytes() const {
  std::lock_guard lock(mu_);
  return fds_.size() * segment_bytes_;
}

size_t SegmentAllocator::free_slots() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace ferry
