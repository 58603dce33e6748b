#include "kernels/cpu/blas.h"

#include <cblas.h>

#include <mutex>

namespace ferry::cpu {

// OpenBLAS's thread count is process-wide library state; every ferry caller wants 1, so it is
// set once and never changed.
void UseCallingThreadOnlyInBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace ferry::cpu
