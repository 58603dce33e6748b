#include "engine/job/job_spec.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/job/chat_format.h"
#include "engine/job/job_devices.h"
#include "engine/job/model_source.h"
#include "engine/job/run_limits.h"
#include "engine/json.h"
#include "engine/model/model_stack.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

Status Bad(std::string msg) { return Status::InvalidArgument(std::move(msg)); }

// The dataset options (the files themselves are checked when they are read).
Status ValidateDataOptions(const JobSpec& job) {
  const bool builtin = job.data == "builtin";
  if (builtin && (!job.val_data.empty() || job.val_fraction > 0)) {
    return Bad("validation needs a dataset file: pass --data FILE with --val-data/--val-fraction");
  }
  if (!(job.val_fraction >= 0 && job.val_fraction < 1)) {
    return Bad("--val-fraction must lie in [0, 1)");
  }
  if (!job.val_data.empty() && job.val_fraction > 0) {
    return Bad("give either --val-data or --val-fraction, not both");
  }
  if (job.eval_every < 0 || job.eval_batches < 0) {
    return Bad("--eval-every and --eval-batches must be 0 or more");
  }
  if (job.eval_every > 0 && job.val_data.empty() && !(job.val_fraction > 0)) {
    return Bad("--eval-every needs a validation set: --val-data FILE or --val-fraction F");
  }
  if (job.chat_template != "auto" && !ParseChatFormat(job.chat_template).ok()) {
    return Bad("--chat-template '" + job.chat_template + "' is not one of auto, " +
               ChatFormatNames());
  }
  if (job.long_examples != "split" && job.long_examples != "truncate") {
    return Bad("--long-examples '" + job.long_examples + "' is not one of split, truncate");
  }
  if (!builtin && job.seq_len < 2) return Bad("--seq-len must be at least 2 with --data FILE");
  return Status::Ok();
}

// An option held as a value in the job and as its name in job.json (lora_targets: LoraTarget bits
// and "q,v" or "all"; quantize: BaseQuant and "nf4"). `V` is the field's type, const when the job
// is; `name` writes the value, `parse` reads it back (errors name what is wrong).
template <typename V, typename Name, typename Parse>
struct NamedField {
  V& value;
  Name name;
  Parse parse;
};
template <typename V, typename Name, typename Parse>
NamedField(V&, Name, Parse) -> NamedField<V, Name, Parse>;
template <typename T>
constexpr bool IsNamed = false;
template <typename V, typename Name, typename Parse>
constexpr bool IsNamed<NamedField<V, Name, Parse>> = true;

// Every option of the job under its job.json key: the one list JobSpecToJson writes and
// JobSpecFromJson reads, so an option that is saved is restored on --resume. `visit(key, field)`
// gets a reference to the field (const when `job` is) or a NamedField.
template <typename Job, typename Visit>
void ForEachJobOption(Job& job, Visit&& visit) {
  visit("model", job.model);
  visit("data", job.data);
  visit("val_data", job.val_data);
  visit("val_fraction", job.val_fraction);
  visit("eval_every", job.eval_every);
  visit("eval_batches", job.eval_batches);
  visit("chat_template", job.chat_template);
  visit("long_examples", job.long_examples);
  visit("skip_bad_lines", job.skip_bad_lines);
  visit("train_on_prompt", job.train_on_prompt);
  visit("steps", job.steps);
  visit("epochs", job.epochs);
  visit("batch_size", job.batch_size);
  visit("micro_batches", job.micro_batches);
  visit("seq_len", job.seq_len);
  visit("lr", job.lr);
  visit("warmup_steps", job.warmup_steps);
  visit("min_lr_ratio", job.min_lr_ratio);
  visit("lr_schedule", NamedField{job.lr_schedule, &LrDecayName, &ParseLrDecay});
  visit("weight_decay", job.weight_decay);
  visit("beta1", job.beta1);
  visit("beta2", job.beta2);
  visit("adam_eps", job.adam_eps);
  visit("grad_clip", job.grad_clip);
  visit("stale_updates", job.stale_updates);
  visit("seed", job.seed);
  visit("lora_rank", job.lora.rank);
  visit("lora_alpha", job.lora.alpha);
  visit("lora_rslora", job.lora.rslora);
  visit("lora_targets", NamedField{job.lora.targets, &LoraTargetsToString, &ParseLoraTargets});
  visit("quantize", NamedField{job.lora.quantize, &BaseQuantName, &ParseBaseQuant});
  visit("double_quant", job.lora.double_quant);
  visit("threads", job.threads);
  visit("devices", job.devices);
  visit("device_kind", job.device_kind);
  visit("gpus", job.gpus);
  visit("dtype", job.dtype);
  visit("loss_scale", job.loss_scale);
  visit("loss_scale_growth_interval", job.loss_scale_growth_interval);
  visit("host_memory", job.host_memory);
  visit("gpu_memory", job.gpu_memory);
  visit("nvme_dir", job.nvme_dir);
  visit("out", job.out);
  visit("save_every", job.save_every);
  visit("keep_checkpoints", job.keep_checkpoints);
  visit("checkpoint_compress", job.checkpoint_compress);
}

// Keys JobSpecToJson adds for the reader, derived from the options (or the model): never read.
constexpr std::string_view kInformationalKeys[] = {"model_path", "micro_batch_size", "schedule",
                                                   "model_config"};

}  // namespace

Result<ModelConfig> ResolveModel(const JobSpec& job) {
  FERRY_ASSIGN_OR_RETURN(ModelSource source, ResolveModelSource(job.model, "", ModelUse::kTrain));
  return source.config;
}

Status AdoptPreQuantizedBase(JobSpec& job) {
  if (job.model == "tiny") return Status::Ok();
  FERRY_ASSIGN_OR_RETURN(ModelSource source, ResolveModelSource(job.model, "", ModelUse::kTrain));
  if (!source.bnb4bit.has_value()) return Status::Ok();
  if (!job.lora.enabled()) {
    return Bad("--model " + job.model +
               " is pre-quantized by bitsandbytes (NF4): ferry fine-tunes such a base with LoRA "
               "only (QLoRA); give --lora-rank N, or the unquantized model for full fine-tuning");
  }
  job.lora.quantize = BaseQuant::kNf4;
  job.lora.double_quant = source.bnb4bit->double_quant;
  return Status::Ok();
}

Status ValidateJobSpec(const JobSpec& job, const ModelConfig& model) {
  FERRY_RETURN_IF_ERROR(CheckTrainable(model));
  FERRY_RETURN_IF_ERROR(ValidateDataOptions(job));
  if (job.data == "builtin" && model.vocab_size < kTinyVocabSize) {
    return Bad("--model's vocabulary (" + std::to_string(model.vocab_size) +
               " tokens) is smaller than the built-in dataset's byte tokens (" +
               std::to_string(kTinyVocabSize) + "); give a larger model");
  }
  FERRY_RETURN_IF_ERROR(ValidateJobShape(job, model));
  if (!(job.lr > 0) || !std::isfinite(job.lr)) return Bad("--lr must be a positive number");
  if (job.warmup_steps < 0) return Bad("--warmup-steps must be 0 or more");
  // A warm-up longer than the run is allowed (the run warms up for all of it: `--steps 3`
  // with the default 20 warm-up updates is a smoke test, not a mistake); the run notes it.
  if (!(job.min_lr_ratio >= 0 && job.min_lr_ratio <= 1)) {
    return Bad("--min-lr-ratio must lie in [0, 1]");
  }
  if (!(job.weight_decay >= 0) || !std::isfinite(job.weight_decay)) {
    return Bad("--weight-decay must be 0 or a positive number");
  }
  if (job.weight_decay * job.lr >= 1) {
    return Bad("--weight-decay x --lr = " + std::to_string(job.weight_decay * job.lr) +
               " would flip the weights' sign; it must stay below 1");
  }
  if (!(job.beta1 >= 0 && job.beta1 < 1) || !(job.beta2 >= 0 && job.beta2 < 1)) {
    return Bad("--beta1 and --beta2 must lie in [0, 1)");
  }
  if (!(job.adam_eps > 0)) return Bad("--adam-eps must be positive");
  if (!(job.grad_clip >= 0) || !std::isfinite(job.grad_clip)) {
    return Bad("--grad-clip must be 0 (off) or a positive number");
  }
  FERRY_RETURN_IF_ERROR(ValidateJobDevices(job));
  // The Trainer's own check (engine/train/loss_scaler.h) says the same without the flags' names.
  int exponent = 0;
  if (!(job.loss_scale >= 1 && job.loss_scale <= 0x1p100) ||
      std::frexp(job.loss_scale, &exponent) != 0.5) {
    return Bad("--loss-scale " + std::to_string(job.loss_scale) +
               ": must be a power of two in [1, 2^100] (so unscaling is exact), e.g. 65536");
  }
  if (job.loss_scale_growth_interval < 1) {
    return Bad("--loss-scale-growth-interval must be at least 1");
  }
  if (job.out.empty()) return Bad("--out must name a folder");
  if (job.save_every < 0) return Bad("--save-every must be 0 (only at the end) or more");
  if (job.keep_checkpoints < 1) return Bad("--keep-checkpoints must be at least 1");
  return Status::Ok();
}

Status ValidateJobShape(const JobSpec& job, const ModelConfig& model, bool micro_batches_auto) {
  if (job.steps <= 0) return Bad("--steps must be at least 1");
  if (!(job.epochs >= 0) || !(job.epochs <= 1e6)) {
    return Bad("--epochs must be 0 (off: --steps decides) or a positive number up to 1e6");
  }
  if (job.epochs > 0 && job.data == "builtin") {
    return Bad(
        "--epochs needs a --data file: the built-in text is drawn in random windows, "
        "which make no epochs; give --steps");
  }
  if (job.batch_size <= 0) return Bad("--batch-size must be at least 1");
  if (job.micro_batches < (micro_batches_auto ? 0 : 1)) {
    return Bad(micro_batches_auto ? "--micro-batches must be 0 (auto) or more"
                                  : "--micro-batches must be at least 1");
  }
  if (job.micro_batches > 0 && job.batch_size % job.micro_batches != 0) {
    return Bad("--batch-size " + std::to_string(job.batch_size) +
               " must be a multiple of --micro-batches " + std::to_string(job.micro_batches));
  }
  if (job.seq_len <= 0) return Bad("--seq-len must be at least 1");
  RunLimits run;
  run.threads = job.threads;
  run.positions = job.seq_len;
  run.positions_from = "--seq-len " + std::to_string(job.seq_len);
  run.rows = job.batch_size;
  run.device_from = "--batch-size " + std::to_string(job.batch_size) + " x --seq-len " +
                    std::to_string(job.seq_len);
  FERRY_RETURN_IF_ERROR(ValidateRunLimits(run, model));
  FERRY_RETURN_IF_ERROR(ValidateTrainingLora(job.lora));
  if (Status q = CheckBaseQuant(model, job.lora.quantize); !q.ok()) {
    return Bad("--quantize nf4: " + q.message() + ": drop --quantize");
  }
  return Status::Ok();
}

Status ValidateThreads(int64_t threads) {
  return ValidateThreads(threads, std::max<int64_t>(1, std::thread::hardware_concurrency()));
}

Status ValidateThreads(int64_t threads, int64_t cores) {
  if (threads < 0) return Bad("--threads must be 0 (all cores) or more");
  if (threads > kThreadsPerCore * cores) {
    return Bad("--threads " + std::to_string(threads) + " exceeds " +
               std::to_string(kThreadsPerCore * cores) + " (" + std::to_string(kThreadsPerCore) +
               " x this machine's " + std::to_string(cores) +
               " hardware threads); give at most that, or 0 for all cores");
  }
  return Status::Ok();
}

Status PrepareRunFolder(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::IOError("cannot create run folder '" + dir + "': " + ec.message() +
                           "; choose another --out");
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::InvalidArgument("--out '" + dir +
                                   "' exists and is not a folder; choose another --out");
  }
  const std::string probe = dir + "/.ferry-write-test";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return Status::FromErrno(err,
                             "run folder '" + dir + "' is not writable (choose another --out)");
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

nlohmann::json JobSpecToJson(const JobSpec& job, const ModelConfig& model) {
  nlohmann::json j;
  ForEachJobOption(job, [&j](const char* key, const auto& field) {
    if constexpr (IsNamed<std::decay_t<decltype(field)>>) {
      j[key] = field.name(field.value);
    } else {
      j[key] = field;
    }
  });
  // For the reader (kInformationalKeys): not read back.
  if (job.model != "tiny") {
    // Where the base is, from anywhere (a LoRA run folder's adapter loads onto it).
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(job.model, ec);
    j["model_path"] = ec ? job.model : abs.lexically_normal().string();
  }
  j["micro_batch_size"] = job.micro_batch_size();
  j["schedule"] = job.lr_schedule == LrDecay::kConstant
                      ? "linear warm-up, then constant lr (engine/train/lr_schedule.h)"
                      : "linear warm-up, then " + std::string(LrDecayName(job.lr_schedule)) +
                            " to min_lr_ratio * lr (engine/train/lr_schedule.h)";
  j["model_config"] = ToHfConfigJson(model);
  return j;
}

Status WriteJobJson(const JobSpec& job, const ModelConfig& model) {
  // Written beside and renamed over: a full disk leaves no partial job.json behind.
  const std::string path = job.out + "/job.json";
  Status s = WriteFileAtomically(path, JobSpecToJson(job, model).dump(2) + "\n");
  if (s.code() == StatusCode::kNoSpace) {
    return s.WithContext(
        "the disk is full (or the file size limit is reached); free space or "
        "choose another --out");
  }
  if (!s.ok()) return s.WithContext("cannot write the job; choose another --out");
  return Status::Ok();
}

Result<JobSpec> JobSpecFromJson(const nlohmann::json& j, const std::string& what,
                                std::vector<std::string>* unknown_keys) {
  if (!j.is_object()) return Bad(what + " is not a JSON object");
  JobSpec job;
  std::map<std::string, std::string> names;  // named fields' text, parsed once all types check
  std::set<std::string, std::less<>> known(std::begin(kInformationalKeys),
                                           std::end(kInformationalKeys));
  std::string bad_key;
  ForEachJobOption(job, [&](const char* key, auto&& field) {
    known.insert(key);
    if (!j.contains(key) || !bad_key.empty()) return;
    try {
      if constexpr (IsNamed<std::decay_t<decltype(field)>>) {
        j.at(key).get_to(names[key]);
      } else {
        j.at(key).get_to(field);
      }
    } catch (const nlohmann::json::exception&) {
      bad_key = key;
    }
  });
  if (!bad_key.empty()) return Bad(what + ": key '" + bad_key + "' has the wrong type");
  Status parsed = Status::Ok();
  ForEachJobOption(job, [&](const char* key, auto&& field) {
    if constexpr (IsNamed<std::decay_t<decltype(field)>>) {
      auto it = names.find(key);
      if (it == names.end() || !parsed.ok()) return;
      auto value = field.parse(it->second);
      if (value.ok()) {
        field.value = *value;
      } else {
        parsed = value.status().WithContext(what + ": " + key);
      }
    }
  });
  FERRY_RETURN_IF_ERROR(parsed);
  if (unknown_keys != nullptr) {
    unknown_keys->clear();
    for (const auto& [key, value] : j.items()) {
      if (known.count(key) == 0) unknown_keys->push_back(key);
    }
  }
  return job;
}

}  // namespace ferry
