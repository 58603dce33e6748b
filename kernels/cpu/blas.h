// The BLAS that CPU kernels call: the pthread OpenBLAS, held to one thread so that each call runs
// on the calling pool worker only. (Debian's serial OpenBLAS is not safe to call from several
// threads at once: concurrent cblas_sgemm calls return wrong products; see
// CpuGemm.ConcurrentBlasCallsAreSafe.) Every kernel that calls BLAS calls
// UseCallingThreadOnlyInBlas() first; it is idempotent and thread-safe.
#pragma once

namespace ferry::cpu {

void UseCallingThreadOnlyInBlas();

}  // namespace ferry::cpu
