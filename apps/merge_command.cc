#include "apps/merge_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "engine/job/model_source.h"
#include "engine/model/lora_merge.h"
#include "engine/plan/byte_size.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

Status Run(const MergeCommand& cmd) {
  if (cmd.out.empty()) return Status::InvalidArgument("--out DIR is required");
  std::error_code ec;
  if (fs::exists(cmd.out, ec) && !(fs::is_directory(cmd.out, ec) && fs::is_empty(cmd.out, ec))) {
    return Status::InvalidArgument("--out " + cmd.out +
                                   " exists and is not an empty folder: give a new folder (the "
                                   "merge never writes over files)");
  }
  FERRY_ASSIGN_OR_RETURN(const uint64_t shard, plan::ParseByteSize(cmd.max_shard_size));
  // Resolved before anything is loaded: a folder without an adapter fails here.
  FERRY_ASSIGN_OR_RETURN(const ModelSource source,
                         ResolveModelSource(cmd.model, cmd.adapter, ModelUse::kInference));
  if (source.adapter_dir.empty()) {
    return Status::InvalidArgument(
        "--model " + cmd.model +
        " has no LoRA adapter to merge: give a LoRA run folder of ferry train, or a model "
        "folder with --adapter naming a PEFT adapter folder");
  }
  FERRY_ASSIGN_OR_RETURN(const LoadedModel m, LoadSourceWeights(source, cmd.seed));
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
  options.max_shard_bytes = size_t(shard);
  options.tokenizer_from = source.tokenizer_dir;
  // Written beside --out, then renamed onto it: a failure leaves no half-written model there.
  const fs::path out = fs::absolute(cmd.out, ec).lexically_normal();
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
  m->add_option("--seed", cmd->seed, "Initialization seed of --model tiny")->capture_default_str();
}

int RunMergeCommand(MergeCommand& cmd) {
  const Status s = Run(cmd);
  if (s.ok()) return 0;
  std::fprintf(stderr, "ferry merge: %s\n", s.message().c_str());
  return 1;
}

}  // namespace ferry
