// The end of a `ferry train --devices N` run: what was measured against what its plan predicted
// (DESIGN.md, "Plan": the same plan, run on the simulator, predicts the step time; the memory
// model predicts every tier's bytes), so a user sees at once how far the plan's hardware profile
// is from this machine.
//
// Pure functions over values, except PeakResidentBytes (reads /proc). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/planner.h"
#include "kernels/status.h"
#include "offload/process_memory.h"  // the measured side: RSS, its peak

namespace ferry {

struct MeasuredRun {
  std::vector<double> step_seconds;  // wall time of each update this run (the trainer's Step)
  struct Device {
    std::string name;
    uint64_t peak_bytes = 0;  // its arena's high-water mark
    uint64_t capacity = 0;    // its arena's size (on a CPU device, host memory)
    // Host RAM its arena occupies at the end (Device::host_resident_bytes: a CPU device's touched
    // pages, never released, so no fewer than at the peak; 0 for a GPU).
    uint64_t host_resident = 0;
  };
  std::vector<Device> devices;
  uint64_t host_peak_bytes = 0;  // the process's peak resident set; 0: unknown
  // Its resident set when the run started (ferry's code and libraries, the parsed job): what the
  // plan does not count; 0: unknown.
  uint64_t host_start_bytes = 0;
  // What the resident set, less its file-backed pages, grew by from the start while the run set
  // up its data, devices and plan (measured before the weights are built), less the plan's own
  // memory in RAM by then (the data's rows, pinned staging locked for a GPU, the executor's
  // embedding gather, NVMe bounce buffers registered with io_uring): the threads started by then
  // (their stacks and heaps), the libraries' state once initialized (a GEMM library's buffers,
  // the CUDA runtime's), the tokenizer, none of which the plan counts; 0: none or unknown.
  uint64_t host_setup_bytes = 0;
  // File-backed pages the run added to the resident set, measured at its end (RssFile then minus
  // at the start): libraries' code paged in at first use (a GEMM library's kernels, say) and
  // pages of mapped files. The kernel drops them when memory is short, and the plan, which counts
  // what ferry allocates, does not hold them; 0: none or unknown.
  uint64_t host_file_growth_bytes = 0;
  // Optimizer state on NVMe (the trainer's VersionedStore): the space its files take; saved
  // activations on NVMe: the space their store's files take; the bytes both read and wrote over
  // the run's steps, per step (checkpoints' reads left out); a streamed frozen base: the blocks
  // the drive read of it in the last step (the model's files or its copy), added to the reads.
  uint64_t nvme_bytes = 0, nvme_activation_bytes = 0;
  // The frozen base's copy converted to NVMe (engine/model/converted_base.h), as written.
  uint64_t nvme_base_copy_bytes = 0;
  double nvme_read_per_step = 0, nvme_written_per_step = 0;
  // A streamed base: whether its reads are in nvme_read_per_step (not when the last step was the
  // run's first here or followed an evaluation).
  bool base_reads_measured = true;
};

// Lines like (`ferry train --devices 2 --steps 6` on two shared cores)
//   measured vs predicted (plan for profile cpu-devices, rates measured here, 2 devices, 4 ...):
//     step time  223 ms (median of 5 after the first; min 210 ms, max 250 ms)   predicted 378 ms
//     cpu0 peak  74.30 MiB (arena)                                              planned 74.30 MiB
//     cpu1 peak  74.30 MiB (arena)                                              planned 74.30 MiB
//     host peak  48.37 MiB (the rest of the process's peak RSS, below)          planned 46.99 MiB
//                peak RSS 395.30 MiB = 187.18 MiB at start + 4.56 MiB set-up (threads,
//                libraries) + 148.60 MiB device arenas in RAM                   [one line]
//                  + 6.59 MiB code and files paged in + 48.37 MiB the rest
//                planned: pinned 21.43 MiB + pageable 25.56 MiB
//   ("the rest", what the run's own buffers took beyond the arenas, is what compares with the
//   plan's host total; the arenas count the pages they filled, not their size, since a CPU
//   device's arena is mapped whole and filled as used; "set-up (threads, libraries)"
//   (MeasuredRun::host_setup_bytes) and "code and files paged in" only when there are any;
//   without a start figure: "(process RSS; 148.60 MiB of it device arenas in RAM)")
//     NVMe       38.36 MiB (optimizer state)                               planned 38.36 MiB
//     NVMe/step  19.18 MiB read, 19.18 MiB written                         planned 19.18 MiB each
//   (the NVMe rows only when the plan puts bytes there)
// each ending in '\n'. The step time is the median over the steps after the first (which also
// creates what later steps reuse) when there are several.
std::string MeasuredVsPredicted(const plan::Plan& plan, const MeasuredRun& run);

}  // namespace ferry
