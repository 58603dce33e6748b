// Run folders: the folder `ferry train --out DIR` writes is ferry's own. A run claims its folder
// before it writes anything:
//   - `--out` and the sources are compared after realpath (symlinks resolved): a run folder may
//     not be `/`, nor equal to, inside or around `--model`, `--data` or `--val-data`, so nothing
//     under the source model or data is ever written;
//   - an existing non-empty folder is used only when it is a run of this same job (its job.json
//     equals this job apart from the keys a resume may change), or a run folder holding nothing
//     but a job.json (a run that failed before training); otherwise the error names the
//     folder and the ways out (`--resume DIR`, a new `--out`, or `--force` for a run folder);
//   - `--force` empties one of ferry's run folders first, and never one holding a file ferry does
//     not write (the error names it);
//   - the marker file (kRunMarker) is written first and stays flock()ed while the run uses the
//     folder, so a second run into it is refused.
// A folder is ferry's when it holds the marker, or job.json (run folders written before the
// marker existed: they resume, and get the marker then).
//
// Thread-compatible; FileLock is move-only and owns the lock's descriptor.
#pragma once

#include <string>
#include <string_view>

#include "engine/job/job_spec.h"
#include "engine/json.h"
#include "kernels/status.h"

namespace ferry {

inline constexpr const char kRunMarker[] = ".ferry-run";

enum class RunFolderMode {
  kNew,     // `ferry train --out DIR`
  kForce,   // `--out DIR --force`: replace a run folder of ferry's
  kResume,  // `--resume DIR`
};

// A file held under an exclusive flock() until released or destroyed (closing its descriptor
// releases the lock): a run folder's marker, a run's NVMe folder's lock file.
class FileLock {
 public:
  // Opens `path` (created when missing) and locks it without waiting. Errors:
  // FailedPrecondition(`busy`) when another process holds it; NotFound when its folder is gone;
  // NoSpace; IOError; each naming the file.
  static Result<FileLock> Take(const std::string& path, const std::string& busy);

  FileLock() = default;
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { Release(); }

  bool held() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Whether `path` still names the locked file: a process that removes a locked folder unlinks
  // the file while holding it, so a process that was waiting for it takes the new one.
  bool StillAt(const std::string& path) const;
  void Release();

 private:
  int fd_ = -1;
};
using RunFolderLock = FileLock;  // the run folder's marker (kRunMarker)

// The job.json keys a resumed run may change (--steps or --epochs, --threads, the checkpoint
// options).
bool IsResumableJobKey(std::string_view key);

// Ok when `saved` (a job.json or a checkpoint's saved job) describes the job `current`
// (JobSpecToJson) apart from the resumable keys, `out` and the informational keys; keys absent
// from `saved` (older formats) are not compared. Otherwise InvalidArgument naming `what`, the
// first key that differs and both values.
Status CompareSavedJob(const nlohmann::json& saved, const nlohmann::json& current,
                       const std::string& what);

// Checks and claims `job.out` for a run of `job_json` (JobSpecToJson(job, ...)) as described
// above, creating it when absent; the returned lock must be held for the whole run.
Result<RunFolderLock> ClaimRunFolder(const JobSpec& job, const nlohmann::json& job_json,
                                     RunFolderMode mode);

}  // namespace ferry
