// The process's own memory as the kernel counts it (/proc/self/status), for the measured side of
// the memory model: `ferry train`'s report (engine/train/run_report.h) and the tests that check
// nothing grows over steps.
//
// Stateless; thread-safe (each call reads the file afresh).
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace ferry {

// The process's peak resident set size (VmHWM in /proc/self/status). Errors: NotFound when the
// kernel does not report it.
Result<uint64_t> PeakResidentBytes();
// The process's resident set size now (VmRSS), likewise.
Result<uint64_t> ResidentBytes();
// The file-backed part of it now (RssFile: mapped code and files), likewise.
Result<uint64_t> ResidentFileBytes();
// Resets the process's peak resident set (VmHWM) to its resident set now (writes 5 to
// /proc/self/clear_refs, Linux 4.0 and later). Errors: NotFound when the kernel has no
// clear_refs; IOError when it refuses.
Status ResetPeakResidentBytes();

}  // namespace ferry
