#include "offload/store_rate.h"

#include <chrono>
#include <cstring>

#include "kernels/host_memory.h"

namespace ferry {

Result<StoreRate> MeasureStoreRate(NvmeStoreOptions options, size_t bytes,
                                   const StoreFileHook& while_open,
                                   const StoreFileHook& before_timing, HostPages pages) {
  using Clock = std::chrono::steady_clock;
  if (bytes == 0) return Status::InvalidArgument("MeasureStoreRate: zero bytes");
  const size_t B = options.block_bytes;
  const size_t file_bytes = (bytes + B - 1) / B * B;
  options.segment_bytes = file_bytes;  // one file
  options.reserve_bytes = file_bytes;
  if (!options.log) options.log = [](std::string_view) {};
  FERRY_ASSIGN_OR_RETURN(auto store, NvmeStore::Open(options));
  FERRY_ASSIGN_OR_RETURN(HostAllocation src,
                         HostAllocation::Map(bytes, "store rate source", pages));
  FERRY_ASSIGN_OR_RETURN(HostAllocation dst,
                         HostAllocation::Map(bytes, "store rate target", pages));
  // Incompressible data (xorshift), so no layer below can cheat with zero pages.
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto* words = reinterpret_cast<uint64_t*>(src.data());
  for (size_t i = 0; i < src.size() / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
  std::memset(dst.data(), 0, dst.size());  // fault the pages in now, not inside the timing
  const auto data = std::span<const std::byte>(src.data(), bytes);
  const std::string name = "store-rate";
  FERRY_RETURN_IF_ERROR(store->Write(name, data, TransferPriority::kSpill));  // lay out
  FERRY_ASSIGN_OR_RETURN(const BlockLocation loc, store->LocateBlock(name, 0));
  FERRY_RETURN_IF_ERROR(store->Remove(name));  // the overwrite reuses the same slots
  if (before_timing) before_timing(loc.path, file_bytes);

  StoreRate rate;
  auto t0 = Clock::now();
  FERRY_RETURN_IF_ERROR(store->Write(name, data, TransferPriority::kSpill));
  rate.write_bytes_per_s = bytes / std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  FERRY_RETURN_IF_ERROR(store->Read(name, {dst.data(), bytes}, TransferPriority::kActivationNow));
  rate.read_bytes_per_s = bytes / std::chrono::duration<double>(Clock::now() - t0).count();
  if (std::memcmp(src.data(), dst.data(), bytes) != 0) {
    return Status::Corruption("MeasureStoreRate: data read back differs from what was written");
  }
  rate.backend = std::string(store->backend_name());
  rate.direct_io = store->direct_io();
  rate.report = store->report();
  if (while_open) while_open(loc.path, file_bytes);
  return rate;
}

}  // namespace ferry
