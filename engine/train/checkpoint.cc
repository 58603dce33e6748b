#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "engine/job/run_folder.h"
#include "engine/model/master_weights.h"
#include "engine/model/safetensors.h"
#include "offload/crc32c.h"
#include "offload/file_io.h"
#include "offload/zstd_codec.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

constexpr int kFormat = 1;
constexpr const char* kExpAvg = "/exp_avg";
constexpr const char* kExpAvgSq = "/exp_avg_sq";
constexpr const char* kStepPrefix = "step-";

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

Status Hook(const CheckpointOptions& options, int64_t step, std::string_view stage) {
  return options.fault_hook ? options.fault_hook(step, stage) : Status::Ok();
}

// The step of a folder named "step-<digits>", or -1.
int64_t StepOfName(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.size() == std::strlen(kStepPrefix)) return -1;
  int64_t step = 0;
  for (size_t i = std::strlen(kStepPrefix); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t(1) << 50)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Checkpoint folders of `dir`, newest first.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = StepOfName(name);
    if (step >= 0 && e.is_directory(ec)) out.emplace_back(step, name);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Removes a folder by renaming it to ".trash-<name>" first, so a kill midway never leaves a
// half-removed folder under a checkpoint's name.
void RemoveFolder(const std::string& parent, const std::string& name) {
  const std::string trash = parent + "/.trash-" + name;
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(parent + "/" + name, trash, ec);
  if (!ec) fs::remove_all(trash, ec);
}

// The job saved in `dir`/state.json, when it can be read.
std::optional<nlohmann::json> SavedJob(const std::string& dir) {
  Result<std::string> text = ReadWholeFile(dir + "/state.json");
  if (!text.ok()) return std::nullopt;
  nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
  if (state.is_discarded() || !state.is_object() || !state.contains("job") ||
      !state["job"].is_object()) {
    return std::nullopt;
  }
  return state["job"];
}

// True when checkpoint folder `dir` holds a readable job other than `job` (copied in from another
// run): never counted, pruned or resumed from as this run's.
bool OfAnotherJob(const std::string& dir, const nlohmann::json& job) {
  const std::optional<nlohmann::json> saved = SavedJob(dir);
  return saved && !CompareSavedJob(*saved, job, dir).ok();
}

// Writes one safetensors file of `tensors` into the temporary folder as it is produced: the
// header, then each tensor's bytes as `bytes_of(i)` gives them (valid until its next call), so
// one tensor at a time is in memory, never a copy of the file. Compressed when asked, in zstd
// frames of at most kFrameBytes raw bytes each (a reader decompresses the frames as one). Records
// the file's raw and stored sizes and the stored bytes' checksum in `files`.
constexpr size_t kFrameBytes = size_t(16) << 20;
Status WriteTensorFile(const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::function<Result<std::span<const std::byte>>(size_t)>& bytes_of,
                       const std::string& tmp_dir, const std::string& name, bool compress,
                       nlohmann::json& files) {
  FERRY_ASSIGN_OR_RETURN(const std::string header, SafetensorsHeaderBytes(tensors));
  const std::string stored_name = compress ? name + ".zst" : name;
  const std::string path = tmp_dir + "/" + stored_name;
  FERRY_ASSIGN_OR_RETURN(AppendFile file, AppendFile::Open(path, /*truncate=*/true));
  std::optional<ZstdCodec> codec;
  if (compress) codec.emplace(3);
  std::vector<std::byte> packed;
  uint64_t raw = 0, stored = 0;
  uint32_t crc = 0;
  auto put = [&](std::span<const std::byte> piece) -> Status {
    raw += piece.size();
    for (size_t at = 0; at < piece.size(); at += kFrameBytes) {
      std::span<const std::byte> out = piece.subspan(at, std::min(kFrameBytes, piece.size() - at));
      if (codec) {
        packed.resize(ZstdCodec::CompressBound(out.size()));
        FERRY_ASSIGN_OR_RETURN(const size_t n, codec->Compress(out, packed));
        out = std::span<const std::byte>(packed.data(), n);
      }
      crc = Crc32c(out, crc);
      stored += out.size();
      FERRY_RETURN_IF_ERROR(file.Append(out));
    }
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(put(AsBytes(header)));
  for (size_t i = 0; i < tensors.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(const std::span<const std::byte> bytes, bytes_of(i));
    if (bytes.size() != SafetensorsDataBytes(tensors[i])) {
      return Status::Internal("checkpoint tensor '" + tensors[i].name + "' gave " +
                              std::to_string(bytes.size()) + " bytes, its shape needs " +
                              std::to_string(SafetensorsDataBytes(tensors[i])));
    }
    FERRY_RETURN_IF_ERROR(put(bytes));
  }
  FERRY_RETURN_IF_ERROR(file.Sync());
  files[stored_name] = {{"raw_bytes", raw},
                        {"compression", compress ? "zstd" : "none"},
                        {"bytes", stored},
                        {"crc32c", crc}};
  return Status::Ok();
}

// Reads exactly `out.size()` bytes at the descriptor's position.
Status ReadExactly(int fd, std::span<std::byte> out, const std::string& path) {
  for (size_t done = 0; done < out.size();) {
    const ssize_t r = ::read(fd, out.data() + done, std::min<size_t>(out.size() - done, 1 << 26));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "read " + path);
    if (r == 0) return Status::Corruption(path + " ends early (truncated?)");
    done += size_t(r);
  }
  return Status::Ok();
}

// A checkpoint file's raw bytes, read in order a piece at a time: decompressed as they come when
// stored with zstd, the CRC-32C of the stored bytes taken as they are read. Nothing read is
// verified until Finish: a caller uses it only once Finish succeeds.
class StoredFileReader {
 public:
  // Errors: the file cannot be opened, or its size is not state.json's (Corruption).
  static Result<StoredFileReader> Open(const std::string& dir, const std::string& name,
                                       const nlohmann::json& entry) {
    StoredFileReader r;
    r.path_ = dir + "/" + name;
    r.fd_ = ::open(r.path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (r.fd_ < 0) return Status::FromErrno(errno, "open " + r.path_);
    struct stat st {};
    if (::fstat(r.fd_, &st) != 0) return Status::FromErrno(errno, "stat " + r.path_);
    r.stored_left_ = size_t(st.st_size);
    const size_t want = entry.value("bytes", size_t(0));
    if (r.stored_left_ != want) {
      return Status::Corruption(r.path_ + " holds " + std::to_string(r.stored_left_) +
                                " bytes, state.json says " + std::to_string(want) +
                                " (truncated?)");
    }
    r.crc_want_ = entry.value("crc32c", uint32_t(0));
    r.raw_size_ = r.stored_left_;
    if (entry.value("compression", "none") == "zstd") {
      r.stream_.emplace();
      r.raw_size_ = entry.value("raw_bytes", size_t(0));
    }
    return r;
  }
  StoredFileReader(StoredFileReader&& o) noexcept
      : path_(std::move(o.path_)),
        fd_(std::exchange(o.fd_, -1)),
        stored_left_(o.stored_left_),
        raw_size_(o.raw_size_),
        crc_(o.crc_),
        crc_want_(o.crc_want_),
        stream_(std::move(o.stream_)),
        stored_(std::move(o.stored_)),
        pending_(o.pending_) {}
  StoredFileReader& operator=(StoredFileReader&&) = delete;
  ~StoredFileReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }
  // The raw bytes the file holds (as state.json says, for a compressed one: checked by Finish).
  size_t raw_size() const { return raw_size_; }

  // The next out.size() raw bytes. Errors: the file ends first, a read error, a damaged frame.
  Status Read(std::span<std::byte> out) {
    if (!stream_) {
      FERRY_RETURN_IF_ERROR(ReadStored(out));
      return Status::Ok();
    }
    while (!out.empty()) {
      if (pending_.empty()) {
        if (stored_left_ == 0) {
          return Status::Corruption(path_ + " ends early (truncated?)");
        }
        stored_.resize(std::min(stored_left_, kPieceBytes));
        FERRY_RETURN_IF_ERROR(ReadStored(stored_));
        pending_ = stored_;
      }
      FERRY_RETURN_IF_ERROR(stream_->Decompress(pending_, out).WithContext(path_));
    }
    return Status::Ok();
  }

  // Reads whatever is left (nothing may be), then checks the checksum: Corruption when raw bytes
  // are left over, a frame is cut short or the checksum fails.
  Status Finish() {
    std::byte extra[1];
    if (stream_) {
      if (Read(extra).ok()) {
        return Status::Corruption(path_ + " holds more than the " + std::to_string(raw_size_) +
                                  " bytes state.json says");
      }
      if (!stream_->at_frame_end()) return Status::Corruption(path_ + " ends inside a frame");
    } else if (stored_left_ > 0) {
      return Status::Corruption(path_ + " holds more than its data (the file is corrupt)");
    }
    if (stored_left_ != 0 || crc_ != crc_want_) {
      return Status::Corruption(path_ + " fails its CRC-32C checksum (the file is corrupt)");
    }
    return Status::Ok();
  }

 private:
  static constexpr size_t kPieceBytes = size_t(4) << 20;
  StoredFileReader() = default;
  Status ReadStored(std::span<std::byte> out) {
    if (out.size() > stored_left_) return Status::Corruption(path_ + " ends early (truncated?)");
    FERRY_RETURN_IF_ERROR(ReadExactly(fd_, out, path_));
    stored_left_ -= out.size();
    crc_ = Crc32c(out, crc_);
    return Status::Ok();
  }

  std::string path_;
  int fd_ = -1;
  size_t stored_left_ = 0, raw_size_ = 0;
  uint32_t crc_ = 0, crc_want_ = 0;
  std::optional<ZstdDecompressStream> stream_;  // set for a compressed file
  std::vector<std::byte> stored_;               // a piece of it, read
  std::span<const std::byte> pending_;          // its part not yet decompressed
};

// A verified file of a checkpoint, decompressed (its bytes in a string), read a piece at a time.
Result<std::string> ReadVerified(const std::string& dir, const std::string& name,
                                 const nlohmann::json& entry) {
  FERRY_ASSIGN_OR_RETURN(StoredFileReader file, StoredFileReader::Open(dir, name, entry));
  std::string out;
  while (out.size() < file.raw_size()) {  // grown as it is read: a size state.json invents fails
    const size_t at = out.size();
    out.resize(std::min(file.raw_size(), at + (size_t(4) << 20)));
    FERRY_RETURN_IF_ERROR(file.Read(std::as_writable_bytes(std::span(out)).subspan(at)));
  }
  FERRY_RETURN_IF_ERROR(file.Finish());
  return out;
}

// The F32 tensors of a checkpoint's tensor file, verified. Read a piece at a time straight into
// its tensors (decompressed as it comes when stored with zstd), its checksum taken as it goes and
// checked before anything is returned, so the file's bytes never sit in RAM beside them.
Result<std::map<std::string, std::vector<float>>> ReadTensorFile(const std::string& dir,
                                                                 const std::string& name,
                                                                 const nlohmann::json& entry) {
  FERRY_ASSIGN_OR_RETURN(StoredFileReader file, StoredFileReader::Open(dir, name, entry));
  const std::string& path = file.path();
  const size_t size = file.raw_size();
  std::vector<std::byte> head(std::min<size_t>(size, 8));
  FERRY_RETURN_IF_ERROR(file.Read(head));
  uint64_t n = 0;
  for (size_t i = head.size(); i-- > 0;) n = (n << 8) | uint64_t(head[i]);
  // A length past the file or the format's bound is left to the parse below to name.
  if (head.size() == 8 && n <= size - 8 && n <= kSafetensorsMaxHeaderBytes) {
    head.resize(8 + n);
    FERRY_RETURN_IF_ERROR(file.Read(std::span(head).subspan(8)));
  }
  // The header is read before the checksum can be checked: whatever is wrong with it is a
  // corrupt file, as a failed checksum would have said.
  Result<SafetensorsHeader> header = ParseSafetensorsHeader(head, size, path);
  if (!header.ok()) return Status::Corruption(header.status().message());
  std::vector<const SafetensorsTensorInfo*> in_file;  // the order to read them in
  for (const SafetensorsTensorInfo& t : header->tensors) {
    if (t.dtype != SafetensorsDType::kF32) {
      return Status::Corruption(path + ": tensor " + t.name + " is not F32");
    }
    in_file.push_back(&t);
  }
  std::ranges::sort(in_file, [](const SafetensorsTensorInfo* a, const SafetensorsTensorInfo* b) {
    return std::pair(a->offset, a->bytes) < std::pair(b->offset, b->bytes);
  });
  std::map<std::string, std::vector<float>> out;
  size_t at = head.size();
  std::vector<std::byte> gap;  // bytes between tensors, read (a piece at a time) for the checksum
  auto skip_to = [&](size_t offset) -> Status {
    while (at < offset) {
      gap.resize(std::min<size_t>(offset - at, size_t(4) << 20));
      FERRY_RETURN_IF_ERROR(file.Read(gap));
      at += gap.size();
    }
    return Status::Ok();
  };
  for (const SafetensorsTensorInfo* t : in_file) {
    std::vector<float>& v = out[t->name];
    if (t->bytes == 0) continue;  // nothing to read, wherever it says it is
    if (t->offset < at) {
      return Status::Corruption(path + ": tensor " + t->name + " overlaps the one before it");
    }
    FERRY_RETURN_IF_ERROR(skip_to(t->offset));
    v.resize(t->bytes / sizeof(float));
    FERRY_RETURN_IF_ERROR(file.Read(std::as_writable_bytes(std::span(v))));
    at += t->bytes;
  }
  FERRY_RETURN_IF_ERROR(skip_to(size));
  FERRY_RETURN_IF_ERROR(file.Finish());
  return out;
}

// The file of `files` whose name starts with `stem` (the plain or the .zst one).
Result<std::string> FileNamed(const nlohmann::json& files, const std::string& stem,
                              const std::string& dir) {
  for (const std::string& name : {stem, stem + ".zst"}) {
    if (files.contains(name)) return name;
  }
  return Status::Corruption(dir + "/state.json lists no " + stem);
}

// Keeps the newest `keep` checkpoints of this job (`name` just saved among them) and removes its
// older ones; another job's are left alone and not counted.
void PruneCheckpoints(const std::string& parent, const std::string& name, const nlohmann::json& job,
                      int64_t keep) {
  int64_t kept = 1;  // `name`
  for (const auto& [old_step, old_name] : ListCheckpoints(parent)) {
    if (old_name == name || OfAnotherJob(parent + "/" + old_name, job)) continue;
    if (kept < keep) {
      ++kept;
    } else {
      RemoveFolder(parent, old_name);
    }
  }
}

}  // namespace

std::string CheckpointsDir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

std::string CheckpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%08lld", kStepPrefix, (long long)step);
  return buf;
}

Result<std::string> SaveCheckpoint(const std::string& run_dir, const Trainer& trainer,
                                   const CheckpointMeta& meta, const CheckpointOptions& options) {
  if (options.keep < 1) return Status::InvalidArgument("--keep-checkpoints must be at least 1");
  const std::string parent = CheckpointsDir(run_dir);
  const int64_t step = trainer.steps_done();
  const std::string name = CheckpointName(step);
  const std::string final_dir = parent + "/" + name;
  const std::string tmp_dir = parent + "/.tmp-" + name;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Status::IOError("cannot create " + parent + ": " + ec.message());
  // This step saved before by this job (a resumed run saving the step it resumed from): by
  // determinism it holds the same state, and it is kept rather than replaced. Another job's
  // folder of this step (or a corrupt one) is replaced once the new one is complete.
  const bool exists = fs::exists(final_dir, ec);
  if (exists && !OfAnotherJob(final_dir, meta.job) && ReadCheckpoint(final_dir).ok()) {
    FERRY_RETURN_IF_ERROR(
        WriteFileAtomically(parent + "/latest", name + "\n").WithContext("checkpoint " + name));
    PruneCheckpoints(parent, name, meta.job, options.keep);
    return final_dir;
  }
  if (exists && options.warn) {
    options.warn("replacing " + final_dir + " (" +
                 (OfAnotherJob(final_dir, meta.job) ? "a checkpoint of another job"
                                                    : "an unreadable checkpoint") +
                 ") with this run's");
  }
  // Leftovers of a killed save (temporary and half-removed folders).
  std::vector<fs::path> leftovers;
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".trash-", 0) == 0) leftovers.push_back(e.path());
  }
  for (const fs::path& p : leftovers) fs::remove_all(p, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return Status::IOError("cannot create " + tmp_dir + ": " + ec.message());

  auto write_all = [&]() -> Status {
    nlohmann::json files = nlohmann::json::object();
    // Straight from the trainer's buffers (fp32, stored as it is); with the optimizer state on
    // NVMe, the moments from each layer's committed slot, read once.
    const std::vector<std::string>& names = trainer.trainable_names();
    std::vector<SafetensorsWriteTensor> weights, moments;
    for (const std::string& n : names) {
      const std::vector<int64_t> shape = {int64_t(trainer.weights().tensors.at(n).size())};
      weights.push_back({.name = n, .shape = shape});
      moments.push_back({.name = n + kExpAvg, .shape = shape});
      moments.push_back({.name = n + kExpAvgSq, .shape = shape});
    }
    auto weight_bytes = [&](size_t i) -> Result<std::span<const std::byte>> {
      return std::as_bytes(std::span(trainer.weights().tensors.at(names[i])));
    };
    FERRY_RETURN_IF_ERROR(WriteTensorFile(weights, weight_bytes, tmp_dir, "trainable.safetensors",
                                          options.compress, files));
    FERRY_RETURN_IF_ERROR(Hook(options, step, "trainable"));
    {
      Trainer::OptimizerStateReader moments_of = trainer.StateReader();
      auto moment_bytes = [&](size_t i) -> Result<std::span<const std::byte>> {
        FERRY_ASSIGN_OR_RETURN(const Trainer::OptimizerStateReader::Moments m,
                               moments_of.Read(names[i / 2]));
        return std::as_bytes(i % 2 == 0 ? m.exp_avg : m.exp_avg_sq);
      };
      FERRY_RETURN_IF_ERROR(WriteTensorFile(moments, moment_bytes, tmp_dir, "optimizer.safetensors",
                                            options.compress, files));
    }
    FERRY_RETURN_IF_ERROR(Hook(options, step, "optimizer"));
    FERRY_RETURN_IF_ERROR(WriteFileDurably(tmp_dir + "/metrics.jsonl", Bytes(meta.metrics)));
    files["metrics.jsonl"] = {{"bytes", meta.metrics.size()},
                              {"raw_bytes", meta.metrics.size()},
                              {"compression", "none"},
                              {"crc32c", Crc32c(Bytes(meta.metrics))}};
    FERRY_RETURN_IF_ERROR(Hook(options, step, "metrics"));
    nlohmann::json state = {
        {"format", kFormat},
        {"step", step},
        {"data_position", step},
        {"rng",
         "none: a micro-batch is a pure function of (seed, step, micro) and initialization of "
         "(seed, name, index); the data position is the step"},
        {"elapsed_s", meta.elapsed_s},
        {"job", meta.job},
        {"files", files}};
    if (trainer.loss_scaling()) {  // f16 only: other runs' state.json stays as it was
      const LossScalerState& ls = trainer.loss_scaler_state();
      state["loss_scaler"] = {{"scale", ls.scale},
                              {"growth_tracker", ls.growth_tracker},
                              {"skipped_steps", ls.skipped_steps}};
    }
    FERRY_RETURN_IF_ERROR(WriteFileDurably(tmp_dir + "/state.json", Bytes(state.dump(2) + "\n")));
    FERRY_RETURN_IF_ERROR(Hook(options, step, "state"));
    FERRY_RETURN_IF_ERROR(SyncDirectory(tmp_dir));
    return Hook(options, step, "publish");
  };
  Status s = write_all();
  if (s.ok() && exists) RemoveFolder(parent, name);  // replaced below
  if (s.ok()) {
    fs::rename(tmp_dir, final_dir, ec);
    if (ec)
      s = Status::IOError("cannot rename " + tmp_dir + " to " + final_dir + ": " + ec.message());
  }
  if (s.ok()) s = SyncDirectory(parent);
  if (s.ok()) s = WriteFileAtomically(parent + "/latest", name + "\n");
  if (!s.ok()) {
    fs::remove_all(tmp_dir, ec);
    return s.WithContext("checkpoint " + final_dir);
  }
  PruneCheckpoints(parent, name, meta.job, options.keep);
  return final_dir;
}

Result<CheckpointState> ReadCheckpoint(const std::string& dir) {
  const std::string state_path = dir + "/state.json";
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(state_path));
  const nlohmann::json state = nlohmann::json::parse(text, nullptr, false);
  if (state.is_discarded() || !state.is_object() || !state.contains("files") ||
      !state["files"].is_object() || !state.contains("step") ||
      !state["step"].is_number_integer()) {
    return Status::Corruption(state_path + " is not a valid checkpoint state");
  }
  if (state.value("format", 0) != kFormat) {
    return Status::InvalidArgument(state_path + " has checkpoint format " +
                                   state.value("format", nlohmann::json()).dump() +
                                   "; this ferry reads format " + std::to_string(kFormat));
  }
  CheckpointState out;
  out.dir = dir;
  out.step = state["step"].get<int64_t>();
  out.meta.elapsed_s = state.value("elapsed_s", 0.0);
  out.meta.job = state.value("job", nlohmann::json::object());
  if (state.contains("loss_scaler")) {
    const nlohmann::json& ls = state["loss_scaler"];
    if (!ls.is_object() || !ls.value("scale", nlohmann::json()).is_number() ||
        !ls.value("growth_tracker", nlohmann::json()).is_number_integer() ||
        !ls.value("skipped_steps", nlohmann::json()).is_number_integer()) {
      return Status::Corruption(state_path +
                                ": loss_scaler is not {scale, growth_tracker, "
                                "skipped_steps}");
    }
    out.loss_scaler = LossScalerState{.scale = ls["scale"].get<double>(),
                                      .growth_tracker = ls["growth_tracker"].get<int64_t>(),
                                      .skipped_steps = ls["skipped_steps"].get<int64_t>()};
  }
  const nlohmann::json& files = state["files"];
  for (const auto& [name, entry] : files.items()) {
    if (!entry.is_object()) return Status::Corruption(state_path + ": bad entry for " + name);
  }
  FERRY_ASSIGN_OR_RETURN(
      out.meta.metrics,
      ReadVerified(dir, "metrics.jsonl", files.value("metrics.jsonl", nlohmann::json::object())));

  FERRY_ASSIGN_OR_RETURN(std::string weights_name, FileNamed(files, "trainable.safetensors", dir));
  FERRY_ASSIGN_OR_RETURN(out.trainable.tensors,
                         ReadTensorFile(dir, weights_name, files[weights_name]));

  FERRY_ASSIGN_OR_RETURN(std::string moments_name, FileNamed(files, "optimizer.safetensors", dir));
  FERRY_ASSIGN_OR_RETURN(auto moment_tensors,
                         ReadTensorFile(dir, moments_name, files[moments_name]));
  for (auto& [name, values] : moment_tensors) {
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() > suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(kExpAvgSq)) {
      out.exp_avg_sq.tensors[name.substr(0, name.size() - std::strlen(kExpAvgSq))] =
          std::move(values);
    } else if (ends_with(kExpAvg)) {
      out.exp_avg.tensors[name.substr(0, name.size() - std::strlen(kExpAvg))] = std::move(values);
    } else {
      return Status::Corruption(dir + "/" + moments_name + ": unexpected tensor " + name);
    }
  }
  return out;
}

Result<CheckpointState> LoadLatestCheckpoint(
    const std::string& run_dir, const std::function<void(const std::string&)>& warn,
    const std::function<Status(const CheckpointState&)>& accept) {
  const std::string parent = CheckpointsDir(run_dir);
  std::vector<std::string> order;
  if (Result<std::string> latest = ReadWholeFile(parent + "/latest"); latest.ok()) {
    std::string name = std::move(*latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (StepOfName(name) >= 0) order.push_back(name);
  }
  for (const auto& [step, name] : ListCheckpoints(parent)) {
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
  }
  for (const std::string& name : order) {
    Result<CheckpointState> c = ReadCheckpoint(parent + "/" + name);
    Status s = c.ok() && accept ? accept(*c) : c.status();
    if (s.ok()) return c;
    if (warn) warn("skipping checkpoint " + name + ": " + s.message());
  }
  return Status::NotFound("no intact checkpoint in " + parent +
                          "; start a new run (ferry train --out ...) instead of --resume");
}

Status ApplyCheckpointWeights(CheckpointState& checkpoint, const std::vector<LayerSpec>& layers,
                              HostTensors& weights) {
  for (const ParamSpec* p : StorageParams(layers)) {
    if (!p->trainable) continue;
    auto it = checkpoint.trainable.tensors.find(p->name);
    if (it == checkpoint.trainable.tensors.end() || int64_t(it->second.size()) != p->numel()) {
      return Status::InvalidArgument("checkpoint " + checkpoint.dir + " lacks " + p->name +
                                     " or holds it at another size: it is not of this job's model");
    }
  }
  for (const ParamSpec* p : StorageParams(layers)) {  // all present: moved, not copied
    if (p->trainable)
      weights.tensors.at(p->name) = std::move(checkpoint.trainable.tensors[p->name]);
  }
  checkpoint.trainable = {};
  return Status::Ok();
}

}  // namespace ferry
