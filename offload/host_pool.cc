#include "offload/host_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace ferry {
namespace {

constexpr int kMpolBind = 2;  // MPOL_BIND from <linux/mempolicy.h>

std::string Bytes(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) {
    return std::to_string(n >> 20) + " MiB";
  }
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

std::string MemlockLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return Bytes(rl.rlim_cur);
}

// Keeps a mapping locked and registered with the devices; undoes both when destroyed.
class PinnedRegistration final : public HostRegistration {
 public:
  PinnedRegistration(void* p, size_t n) : p_(p), n_(n) {}
  ~PinnedRegistration() override {
    devices_.clear();  // unregister before unlocking
    munlock(p_, n_);
  }
  void Add(std::unique_ptr<HostRegistration> r) { devices_.push_back(std::move(r)); }

 private:
  void* p_;
  size_t n_;
  std::vector<std::unique_ptr<HostRegistration>> devices_;
};

}  // namespace

std::string_view HostMemoryKindName(HostMemoryKind k) {
  return k == HostMemoryKind::kPinned ? "pinned" : "pageable";
}

int HostPool::NumaNodes() {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.compare(0, 4, "node") == 0 &&
        std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      ++n;
    }
  }
  return n > 0 ? n : 1;
}

Result<std::unique_ptr<HostPool>> HostPool::Create(HostPoolOptions options) {
  const int nodes = NumaNodes();
  std::string report;
  if (options.numa_node >= nodes) {
    return Status::InvalidArgument("host pool: NUMA node " + std::to_string(options.numa_node) +
                                   " requested, but this machine has " + std::to_string(nodes));
  }
  if (options.numa_node < 0) {
    report = std::to_string(nodes) + " NUMA node(s); no placement requested";
  } else if (nodes == 1) {
    report = "1 NUMA node: placement on node 0 is what the kernel does anyway";
  } else {
    report = "mappings bound to NUMA node " + std::to_string(options.numa_node) + " of " +
             std::to_string(nodes);
  }
  if (options.chunk_bytes == 0) options.chunk_bytes = size_t{256} << 20;
  auto pool = std::unique_ptr<HostPool>(new HostPool(std::move(options)));
  pool->numa_report_ = std::move(report);
  pool->stats_[0].budget = pool->options_.pinned_budget;
  pool->stats_[1].budget = pool->options_.pageable_budget;
  return pool;
}

HostPool::~HostPool() = default;

Result<size_t> HostPool::MapChunkLocked(size_t bytes, HostMemoryKind kind,
                                        std::string_view requester) {
  HostPoolStats& st = stats_[int(kind)];
  const size_t page = HostPageSize();
  size_t size = std::max(bytes, std::min(options_.chunk_bytes, st.budget - st.mapped));
  size = (size + page - 1) / page * page;
  const std::string name = std::string(HostMemoryKindName(kind)) + " host pool mapping";
  FERRY_ASSIGN_OR_RETURN(HostAllocation m, HostAllocation::Map(size, name));
  if (options_.numa_node >= 0) {
    unsigned long mask[16] = {};
    mask[options_.numa_node / 64] = 1ul << (options_.numa_node % 64);
    if (syscall(SYS_mbind, m.data(), m.size(), kMpolBind, mask, 16 * 64, 0) != 0) {
      return Status::FromErrno(errno, "binding " + Bytes(size) + " of host memory to NUMA node " +
                                          std::to_string(options_.numa_node));
    }
  }
  if (kind == HostMemoryKind::kPinned) {
    if (options_.lock_pinned && mlock(m.data(), m.size()) != 0) {
      const int err = errno;
      size_t locked = 0;
      for (const Chunk& c : chunks_) {
        if (c.kind == HostMemoryKind::kPinned) locked += c.mapping.size();
      }
      return Status::OutOfMemory(
          "host pool: locking " + Bytes(size) + " of pinned memory for '" + std::string(requester) +
          "' failed (" + std::strerror(err) + "); RLIMIT_MEMLOCK is " + MemlockLimit() +
          " and this pool has locked " + Bytes(locked) +
          ". Raise the limit: `ulimit -l unlimited` in the shell that starts ferry, a "
          "`<user> - memlock unlimited` line in /etc/security/limits.conf, or "
          "LimitMEMLOCK=infinity for a systemd service / --ulimit memlock=-1 for docker");
    }
    auto reg = std::make_unique<PinnedRegistration>(m.data(), m.size());
    bool cuda_registered = false;
    for (Device* d : options_.devices) {
      // cudaHostRegister(Portable) pins the range for every GPU of the process, and a second
      // registration of it is refused (cudaErrorHostMemoryAlreadyRegistered): once per process.
      if (d->kind() == DeviceKind::kCuda && std::exchange(cuda_registered, true)) continue;
      auto r = d->RegisterHost(m);
      if (!r.ok()) {
        return r.status().WithContext("host pool: registering " + Bytes(size) +
                                      " of pinned memory with " + d->name());
      }
      reg->Add(std::move(r).value());
    }
    m.Attach(std::move(reg));
  }
  st.mapped += m.size();
  ++st.mappings;
  Chunk c{std::move(m), kind, {}};
  c.free[0] = c.mapping.size();
  chunks_.push_back(std::move(c));
  return chunks_.size() - 1;
}

Result<HostBlock> HostPool::Allocate(size_t bytes, HostMemoryKind kind,
                                     std::string_view requester) {
  assert(bytes > 0);
  const size_t page = HostPageSize();
  const size_t reserved = (bytes + page - 1) / page * page;
  std::lock_guard lock(mu_);
  HostPoolStats& st = stats_[int(kind)];
  const auto refuse = [&](std::string_view why) {
    return Status::OutOfMemory("host pool: '" + std::string(requester) + "' asked for " +
                               Bytes(bytes) + " of " + std::string(HostMemoryKindName(kind)) +
                               " memory; " + std::string(why) + ": in use " + Bytes(st.in_use) +
                               ", mapped " + Bytes(st.mapped) + ", budget " + Bytes(st.budget) +
                               " (raise the host budget or lower what the plan keeps in RAM)");
  };
  if (st.in_use + reserved > st.budget) return refuse("over the budget");
  // First fit in an existing mapping of this kind.
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    if (c.kind != kind) continue;
    for (auto it = c.free.begin(); it != c.free.end(); ++it) {
      if (it->second < reserved) continue;
      const size_t offset = it->first;
      const size_t left = it->second - reserved;
      c.free.erase(it);
      if (left > 0) c.free[offset + reserved] = left;
      HostBlock b;
      b.pool_ = this;
      b.span_ = c.mapping.Span(offset, bytes);
      b.kind_ = kind;
      b.chunk_ = ci;
      b.offset_ = offset;
      b.reserved_ = reserved;
      st.in_use += reserved;
      st.peak = std::max(st.peak, st.in_use);
      return b;
    }
  }
  if (st.mapped + reserved > st.budget) {
    return refuse("the budget's mappings are fragmented (no free range fits)");
  }
  FERRY_ASSIGN_OR_RETURN(const size_t ci, MapChunkLocked(reserved, kind, requester));
  Chunk& c = chunks_[ci];
  c.free.clear();
  if (c.mapping.size() > reserved) c.free[reserved] = c.mapping.size() - reserved;
  HostBlock b;
  b.pool_ = this;
  b.span_ = c.mapping.Span(0, bytes);
  b.kind_ = kind;
  b.chunk_ = ci;
  b.offset_ = 0;
  b.reserved_ = reserved;
  st.in_use += reserved;
  st.peak = std::max(st.peak, st.in_use);
  return b;
}

void HostPool::Free(size_t chunk, size_t offset, size_t bytes, HostMemoryKind kind) {
  std::lock_guard lock(mu_);
  stats_[int(kind)].in_use -= bytes;
  auto& free = chunks_[chunk].free;
  auto [it, inserted] = free.emplace(offset, bytes);
  assert(inserted);
  // Coalesce with the following and the preceding free range.
  auto next = std::next(it);
  if (next != free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free.erase(next);
  }
  if (it != free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free.erase(it);
    }
  }
}

HostPoolStats HostPool::stats(HostMemoryKind kind) const {
  std::lock_guard lock(mu_);
  return stats_[int(kind)];
}

size_t HostPool::ResidentBytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = 0;
  for (const Chunk& c : chunks_) bytes += c.mapping.ResidentBytes();
  return bytes;
}

// ---- HostBlock ------------------------------------------------------------------------------

HostBlock::~HostBlock() { Release(); }

HostBlock::HostBlock(HostBlock&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)),
      span_(o.span_),
      kind_(o.kind_),
      chunk_(o.chunk_),
      offset_(o.offset_),
      reserved_(o.reserved_) {}

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = std::exchange(o.pool_, nullptr);
    span_ = o.span_;
    kind_ = o.kind_;
    chunk_ = o.chunk_;
    offset_ = o.offset_;
    reserved_ = o.reserved_;
  }
  return *this;
}

void HostBlock::Release() {
  if (pool_ != nullptr) pool_->Free(chunk_, offset_, reserved_, kind_);
  pool_ = nullptr;
}

}  // namespace ferry
