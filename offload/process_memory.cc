#include "offload/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "offload/file_io.h"

namespace ferry {

namespace {

// A "Key:  123456 kB" line of /proc/self/status, in bytes.
Result<uint64_t> ProcStatusBytes(std::string_view key, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const std::string status, ReadWholeFile("/proc/self/status"));
  const size_t at = status.find(std::string(key) + ":");
  if (at == std::string::npos) {
    return Status::NotFound("/proc/self/status has no " + std::string(key) + " (" +
                            std::string(what) + ")");
  }
  return uint64_t(std::strtoull(status.c_str() + at + key.size() + 1, nullptr, 10)) * 1024;
}

}  // namespace

Result<uint64_t> PeakResidentBytes() { return ProcStatusBytes("VmHWM", "peak resident set"); }

Result<uint64_t> ResidentBytes() { return ProcStatusBytes("VmRSS", "resident set"); }

Result<uint64_t> ResidentFileBytes() {
  return ProcStatusBytes("RssFile", "file-backed resident set");
}

Status ResetPeakResidentBytes() {
  // Written in place (WriteTextFile would write a new file and rename it over this one).
  const char* path = "/proc/self/clear_refs";
  const std::string what = std::string("resetting the peak resident set: ") + path;
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status::FromErrno(err, what);
  }
  const ssize_t n = ::write(fd, "5", 1);
  const int err = n < 0 ? errno : EIO;  // 0 bytes written: no errno to report
  ::close(fd);
  if (n != 1) return Status::FromErrno(err, what);
  return Status::Ok();
}

}  // namespace ferry
