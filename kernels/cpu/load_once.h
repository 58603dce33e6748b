// LoadOnce: the result of a process-wide library load, computed on the first call and returned
// by reference ever after (CpuBlas, OneDnn: a library is process-wide state of its own).
// Thread-safe: the first callers wait for the one load; later calls copy nothing.
#pragma once

#include <mutex>
#include <optional>

#include "kernels/status.h"

namespace ferry::cpu {

// One instantiation per `Load` function: its result lives as long as the process.
template <typename T, Result<const T*> (*Load)()>
const Result<const T*>& LoadOnce() {
  static std::once_flag once;
  static std::optional<Result<const T*>> loaded;  // written once, under `once`
  std::call_once(once, [] { loaded.emplace(Load()); });
  return *loaded;
}

}  // namespace ferry::cpu
