// MeasureStoreRate: the NVMe store's own sequential write and read rate, as `ferry probe` and
// bench/nvme_bench measure it (the planner's hardware profile uses these figures).
//
// Opens a fresh store in options.directory (block size, queue depth and backend as given), lays
// out one entry of `bytes`, then times an overwrite of it and a read of it back (so the write
// figure is not an allocation figure, and the read never touches unwritten holes). Data is
// incompressible and compression is off. The source and target memory are mapped with `pages`
// (huge pages, as the host pool's memory, by default).
//
// Thread-safety: a free function; concurrent calls on the same directory interfere (timing).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "kernels/host_memory.h"
#include "kernels/status.h"
#include "offload/nvme_store.h"

namespace ferry {

struct StoreRate {
  double write_bytes_per_s = 0;
  double read_bytes_per_s = 0;
  std::string backend;  // "io_uring" or "threads"
  bool direct_io = false;
  std::string report;  // the store's Open line
};

using StoreFileHook = std::function<void(const std::string& path, size_t file_bytes)>;

// `while_open`, when given, runs after the timings while the store's file (path, bytes written)
// still exists, e.g. to run fio on the same file; `before_timing` runs on that file after it is
// laid out and before the timings (a bench alternates the two so that neither side always
// follows the layout write).
Result<StoreRate> MeasureStoreRate(NvmeStoreOptions options, size_t bytes,
                                   const StoreFileHook& while_open = nullptr,
                                   const StoreFileHook& before_timing = nullptr,
                                   HostPages pages = HostPages::kHugeWhereLarge);

}  // namespace ferry
