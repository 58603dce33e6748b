#include "kernels/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

size_t HostPageSize() { return size_t(sysconf(_SC_PAGESIZE)); }

size_t HostHugePageSize() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  size_t bytes = 0;
  return f >> bytes ? bytes : 0;
}

std::string TransparentHugePagesMode() {
  // The file reads e.g. "always [madvise] never": the bracketed word is the mode.
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "unavailable";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

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

size_t HostAllocation::ResidentBytes() const {
  if (data_ == nullptr || size_ == 0) return 0;
  const size_t page = HostPageSize();
  const size_t pages = (size_ + page - 1) / page;
  std::vector<unsigned char> in_ram(pages);
  if (::mincore(data_, size_, in_ram.data()) != 0) return 0;
  size_t resident = 0;
  for (unsigned char v : in_ram) resident += (v & 1) != 0 ? 1 : 0;
  return resident * page;
}

Result<HostAllocation> HostAllocation::Map(size_t bytes, std::string name, HostPages pages) {
  const size_t page = HostPageSize();
  const size_t size = bytes == 0 ? page : (bytes + page - 1) / page * page;
  const size_t huge = pages == HostPages::kHugeWhereLarge ? HostHugePageSize() : 0;
  // Aligned to the huge page: map one huge page more, then unmap the unaligned head and the tail.
  const size_t slack = huge >= page && size >= huge ? huge : 0;
  void* p = mmap(nullptr, size + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return Status::OutOfMemory("host mapping '" + name + "' of " + std::to_string(size) +
                               " bytes refused: " + Status::FromErrno(err, "mmap").message());
  }
  if (slack > 0) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + huge - 1) / huge * huge;
    if (aligned > start) munmap(p, aligned - start);
    if (const size_t tail = start + slack - aligned; tail > 0) {
      munmap(reinterpret_cast<void*>(aligned + size), tail);
    }
    p = reinterpret_cast<void*>(aligned);
    // Advice only: a kernel in mode "never" refuses it, and base pages serve as before.
    madvise(p, size, MADV_HUGEPAGE);
  } else if (pages == HostPages::kBase) {
    madvise(p, size, MADV_NOHUGEPAGE);
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
