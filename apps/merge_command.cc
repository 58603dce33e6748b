#include "apps/merge_command.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "apps/job_options.h"
#include "engine/job/model_source.h"
#include "engine/model/lora_merge.h"
#include "engine/plan/byte_size.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// The folders earlier merges into `out` left beside it when they were killed
// (".NAME.merging-PID" whose process is gone), removed.
void RemoveStalePartials(const fs::path& out) {
  const std::string prefix = "." + out.filename().string() + ".merging-";
  std::error_code ec;
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    pid_t pid = 0;  // the whole rest of the name, or it is not such a folder
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size();
    const auto [ptr, err] = std::from_chars(first, last, pid);
    if (err != std::errc() || ptr != last || pid <= 0) continue;
    std::error_code removed;
    if (kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(it->path(), removed);
  }
}

Status Run(const MergeCommand& cmd) {
  if (cmd.out.empty()) return Status::InvalidArgument("--out DIR is required");
  std::error_code ec;
  fs::path out = fs::absolute(cmd.out, ec).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "merged/", "."
  if (ec || !out.has_filename() || out == fs::current_path(ec)) {
    return Status::InvalidArgument("--out " + cmd.out + ": give a new folder to write");
  }
  if (fs::is_symlink(out, ec)) {
    return Status::InvalidArgument("--out " + cmd.out +
                                   " is a symbolic link: give the folder it names, or a new one");
  }
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    return Status::InvalidArgument("--out " + cmd.out +
                                   " exists and is not an empty folder: give a new folder (the "
                                   "merge never writes over files)");
  }
  Result<uint64_t> shard = plan::ParseByteSize(cmd.max_shard_size);
  if (!shard.ok()) return shard.status().WithContext("--max-shard-size");
  // Resolved before anything is loaded: a folder without an adapter fails here.
  FERRY_ASSIGN_OR_RETURN(const ModelSource source,
                         ResolveModelSource(cmd.model, cmd.adapter, ModelUse::kInference));
  if (source.adapter_dir.empty()) {
    return Status::InvalidArgument(
        "--model " + cmd.model +
        " has no LoRA adapter to merge: give a LoRA run folder of ferry train, or a model "
        "folder with --adapter naming a PEFT adapter folder");
  }
  FERRY_ASSIGN_OR_RETURN(const LoadedModel m,
                         LoadSourceWeights(source, /*seed=*/0, cmd.quantize, cmd.double_quant));
  ModelFolderWriteOptions options;
  options.dtype = m.config.weights_dtype;
  if (cmd.dtype != "auto") {
    FERRY_ASSIGN_OR_RETURN(options.dtype, ParseDType(cmd.dtype));
  }
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF16) {
    return Status::InvalidArgument("--dtype " + cmd.dtype +
                                   ": the merged weights are written as "
                                   "f32, bf16 or f16 (auto: the base's)");
  }
  options.max_shard_bytes = size_t(*shard);
  options.tokenizer_from = source.tokenizer_dir;
  options.config_from = source.config_path;  // the base's own fields kept
  // Written beside --out, then renamed onto it: a failure leaves no half-written model there.
  RemoveStalePartials(out);
  const fs::path partial =
      out.parent_path() / ("." + out.filename().string() + ".merging-" + std::to_string(getpid()));
  fs::remove_all(partial, ec);
  Result<MergeSummary> merged = WriteMergedModelFolder(partial.string(), m, options);
  if (merged.ok()) {
    fs::remove(out, ec);  // the empty folder, if any
    fs::rename(partial, out, ec);
    if (ec) {
      merged = Status::IOError("cannot rename " + partial.string() + " to " + out.string() + ": " +
                               ec.message());
    }
  }
  if (!merged.ok()) {
    fs::remove_all(partial, ec);
    return merged.status().WithContext("--out " + cmd.out);
  }
  std::fprintf(
      stderr,
      "ferry merge: merged %lld adapted projections (rank %lld, scaling %g) into the base; "
      "wrote %lld tensors (%s) to %s\n",
      (long long)merged->projections, (long long)m.lora.rank, m.lora.scaling(),
      (long long)merged->tensors, std::string(DTypeName(options.dtype)).c_str(), cmd.out.c_str());
  return Status::Ok();
}

}  // namespace

void AddMergeCommand(CLI::App& parent, MergeCommand* cmd) {
  CLI::App* m = parent.add_subcommand(
      "merge",
      "Merge a LoRA adapter into its base model and write one Hugging Face model folder "
      "(no adapter needed to load it).");
  cmd->app = m;
  m->add_option("--model", cmd->model,
                "A LoRA run folder of ferry train, or a Hugging Face model folder (with --adapter)")
      ->required();
  m->add_option("--adapter", cmd->adapter,
                "PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors); "
                "default: the run folder's own");
  m->add_option("--out", cmd->out, "Folder to write (must not exist, or be empty)")->required();
  m->add_option("--dtype", cmd->dtype,
                "Weights' dtype: auto (the base's torch_dtype), f32, bf16 or f16")
      ->capture_default_str();
  m->add_option("--max-shard-size", cmd->max_shard_size,
                "Largest safetensors file (e.g. 5GB, 2GiB; 0: one model.safetensors)")
      ->capture_default_str();
  AddQuantizeOptions(*m, &cmd->quantize, &cmd->double_quant, QuantizeUse::kInference);
}

int RunMergeCommand(MergeCommand& cmd) {
  const Status s = Run(cmd);
  if (s.ok()) return 0;
  std::fprintf(stderr, "ferry merge: %s\n", s.message().c_str());
  return 1;
}

}  // namespace ferry
