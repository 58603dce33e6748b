#include "engine/job/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <vector>

#include "engine/model/model_folder.h"
#include "offload/file_io.h"

namespace ferry {
namespace fs = std::filesystem;
namespace {

// Every name ferry writes at the top of a run folder besides the tokenizer files
// (kTokenizerFileNames): run_training.h, master_weights.h, checkpoint.h, PrepareRunFolder's probe;
// WriteFileAtomically's ".tmp" partners are stripped before the lookup.
constexpr std::string_view kRunFolderNames[] = {kRunMarker,
                                                "job.json",
                                                "metrics.jsonl",
                                                "model.safetensors",
                                                "config.json",
                                                "adapter_model.safetensors",
                                                "adapter_config.json",
                                                "checkpoints",
                                                ".ferry-write-test"};

constexpr std::string_view kResumableKeys[] = {
    "steps", "epochs", "threads", "save_every", "keep_checkpoints", "checkpoint_compress"};
// Not compared: where the run is, and what JobSpecToJson adds for the reader.
constexpr std::string_view kUncomparedKeys[] = {"out", "model_path", "schedule", "model_config"};

bool IsFerryName(const std::string& name) {
  std::string base = name;
  if (base.size() > 4 && base.ends_with(".tmp")) base.resize(base.size() - 4);
  return std::find(std::begin(kRunFolderNames), std::end(kRunFolderNames), base) !=
             std::end(kRunFolderNames) ||
         std::find(std::begin(kTokenizerFileNames), std::end(kTokenizerFileNames), base) !=
             std::end(kTokenizerFileNames);
}

// `inner` equals `outer` or lies under it (both canonical).
bool IsWithin(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end() || (std::next(o) == outer.end() && o->empty());
}

fs::path Resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  fs::path r = fs::weakly_canonical(abs, ec);
  return ec ? abs.lexically_normal() : r;
}

// --out against the sources: never `/`, never equal to, inside or around one of them.
Status CheckOutAgainstSources(const JobSpec& job) {
  const fs::path out = Resolved(job.out);
  if (out == out.root_path()) {
    return Status::InvalidArgument("--out '" + job.out +
                                   "' is the filesystem root; choose a new --out folder");
  }
  struct Source {
    const char* option;
    const std::string& path;
    bool used;
  };
  const Source sources[] = {{"--model", job.model, job.model != "tiny"},
                            {"--data", job.data, job.data != "builtin"},
                            {"--val-data", job.val_data, !job.val_data.empty()}};
  for (const Source& s : sources) {
    if (!s.used) continue;
    const fs::path src = Resolved(s.path);
    const char* how = out == src           ? "is"
                      : IsWithin(out, src) ? "lies inside"
                      : IsWithin(src, out) ? "holds"
                                           : nullptr;
    if (how == nullptr) continue;
    return Status::InvalidArgument("--out '" + job.out + "' " + how + " " + s.option + " '" +
                                   s.path + "' (resolved: " + src.string() +
                                   "); ferry never writes under its sources: choose a new --out");
  }
  return Status::Ok();
}

Result<std::vector<std::string>> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return Status::IOError("cannot list run folder '" + dir + "': " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

Result<RunFolderLock> Lock(const std::string& dir) {
  const std::string marker = dir + "/" + kRunMarker;
  Result<FileLock> lock =
      FileLock::Take(marker, "run folder '" + dir + "' is in use by another ferry run (" + marker +
                                 " is locked); wait for it to end or choose a new --out");
  if (!lock.ok()) {
    if (lock.status().code() == StatusCode::kFailedPrecondition) return lock.status();
    return lock.status().WithContext("cannot write the run folder's marker (choose another --out)");
  }
  static constexpr char kText[] = "ferry run folder (locked while a run uses it)\n";
  if (::pwrite(lock->fd(), kText, sizeof(kText) - 1, 0) != ssize_t(sizeof(kText) - 1)) {
    return Status::FromErrno(errno, "cannot write " + marker);
  }
  return lock;
}

std::optional<nlohmann::json> ReadJobJson(const std::string& dir) {
  Result<std::string> text = ReadWholeFile(dir + "/job.json");
  if (!text.ok()) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

}  // namespace

Result<FileLock> FileLock::Take(const std::string& path, const std::string& busy) {
  FileLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (!lock.held()) return Status::FromErrno(errno, "cannot open " + path);
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Status::FailedPrecondition(busy);
    return Status::FromErrno(errno, "cannot lock " + path);
  }
  return lock;
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    Release();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

bool FileLock::StillAt(const std::string& path) const {
  struct stat held, now;
  return fd_ >= 0 && ::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &now) == 0 &&
         held.st_ino == now.st_ino && held.st_dev == now.st_dev;
}

void FileLock::Release() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  fd_ = -1;
}

bool IsResumableJobKey(std::string_view key) {
  return std::find(std::begin(kResumableKeys), std::end(kResumableKeys), key) !=
         std::end(kResumableKeys);
}

Status CompareSavedJob(const nlohmann::json& saved, const nlohmann::json& current,
                       const std::string& what) {
  if (!saved.is_object()) return Status::InvalidArgument(what + " holds no job");
  for (const auto& [key, value] : current.items()) {
    if (IsResumableJobKey(key) || !saved.contains(key) ||
        std::find(std::begin(kUncomparedKeys), std::end(kUncomparedKeys), key) !=
            std::end(kUncomparedKeys)) {
      continue;
    }
    if (saved[key] != value) {
      return Status::InvalidArgument(what + " is of another job: " + key + " is " +
                                     saved[key].dump() + " there, " + value.dump() + " here");
    }
  }
  return Status::Ok();
}

Result<RunFolderLock> ClaimRunFolder(const JobSpec& job, const nlohmann::json& job_json,
                                     RunFolderMode mode) {
  const std::string& dir = job.out;
  FERRY_RETURN_IF_ERROR(CheckOutAgainstSources(job));
  std::error_code ec;
  if (fs::exists(dir, ec) && fs::is_directory(dir, ec)) {
    FERRY_ASSIGN_OR_RETURN(std::vector<std::string> names, Entries(dir));
    std::erase(names, std::string(kRunMarker));
    const bool ours = fs::exists(dir + "/" + kRunMarker, ec) || fs::exists(dir + "/job.json", ec);
    auto foreign = std::find_if(names.begin(), names.end(),
                                [](const std::string& n) { return !IsFerryName(n); });
    if (!names.empty() && mode != RunFolderMode::kResume) {
      if (!ours || foreign != names.end()) {
        return Status::FailedPrecondition("--out '" + dir +
                                          "' already holds files ferry did not write ('" +
                                          (foreign != names.end() ? *foreign : names.front()) +
                                          "'); ferry never replaces them: choose a new --out");
      }
      // A run that stopped before training (bad data, say) left only its job file: nothing to
      // lose, so another job may take the folder.
      const bool started = std::any_of(names.begin(), names.end(), [](const std::string& n) {
        return n != "job.json" && n != "job.json.tmp" && n != ".ferry-write-test";
      });
      if (mode == RunFolderMode::kNew && started) {
        const std::optional<nlohmann::json> saved = ReadJobJson(dir);
        Status same = saved ? CompareSavedJob(*saved, job_json, dir + "/job.json")
                            : Status::InvalidArgument(dir + " has no readable job.json");
        if (!same.ok()) {
          return Status::FailedPrecondition("--out '" + dir + "' is a run folder of another job (" +
                                            same.message() + "); continue that run with --resume " +
                                            dir +
                                            ", choose a new --out, or replace it with --force");
        }
      }
    }
    FERRY_ASSIGN_OR_RETURN(RunFolderLock lock, Lock(dir));
    if (mode == RunFolderMode::kForce) {
      for (const std::string& n : names) {
        fs::remove_all(fs::path(dir) / n, ec);
        if (ec)
          return Status::IOError("--force: cannot remove " + dir + "/" + n + ": " + ec.message());
      }
    }
    FERRY_RETURN_IF_ERROR(PrepareRunFolder(dir));
    return lock;
  }
  if (mode == RunFolderMode::kResume) {
    return Status::NotFound(dir + " is not a run folder of ferry train (it does not exist)");
  }
  FERRY_RETURN_IF_ERROR(PrepareRunFolder(dir));
  return Lock(dir);
}

}  // namespace ferry
