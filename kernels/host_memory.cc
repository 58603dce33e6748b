#include "kernels/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <utility>

namespace ferry {

size_t HostPageSize() { return size_t(sysconf(_SC_PAGESIZE)); }

HostAllocation::~HostAllocation() { Release(); }

HostAllocation::HostAllocation(HostAllocation&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      name_(std::move(o.name_)),
      registration_(std::move(o.registration_)) {}

HostAllocation& HostAllocation::operator=(HostAllocation&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    registration_ = std::move(o.registration_);
  }
  return *this;
}

void HostAllocation::Release() {
  registration_.reset();  // unregister before unmapping
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Result<HostAllocation> HostAllocation::Map(size_t bytes, std::string name) {
  const size_t page = HostPageSize();
  const size_t size = bytes == 0 ? page : (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return Status::OutOfMemory("host mapping '" + name + "' of " + std::to_string(size) +
                               " bytes refused: " + Status::FromErrno(err, "mmap").message());
  }
  HostAllocation a;
  a.data_ = static_cast<std::byte*>(p);
  a.size_ = size;
  a.name_ = std::move(name);
  return a;
}

HostSpan HostAllocation::Span(size_t offset, size_t bytes) const {
  assert(offset <= size_ && bytes <= size_ - offset);
  return HostSpan(data_ + offset, bytes);
}

HostSpan HostAllocation::Whole() const { return HostSpan(data_, size_); }

HostSpan HostSpan::Sub(size_t offset, size_t bytes) const {
  assert(offset <= size_ && bytes <= size_ - offset);
  return HostSpan(data_ + offset, bytes);
}

}  // namespace ferry
