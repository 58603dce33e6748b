#include "apps/train_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>

#include "apps/cli_suggestions.h"
#include "engine/job/run_folder.h"
#include "engine/json.h"
#include "engine/train/run_training.h"
#include "engine/train/stop_signals.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

// Job files are TOML whose keys are the job options' long flags without the dashes (`steps = 100`,
// `lora-rank = 8`), shared by `ferry train` and `ferry plan`. CLI11 processes config files on the
// top-level app only, so --config lives there (the subcommands let it fall through) and this
// reader files top-level keys under the subcommand that was selected (train when none was).
// CLI11 2.1 keeps no line numbers, so the reader notes each key's line itself and refuses an
// unknown key naming the file, the line and the closest option ("did you mean").
class JobFile : public CLI::ConfigTOML {
 public:
  explicit JobFile(const CLI::App* parent) : parent_(parent) {}
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string text(std::istreambuf_iterator<char>(input), {});
    std::istringstream copy(text);
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(copy);
    std::string section = "train";
    const std::vector<CLI::App*> selected = parent_->get_subcommands();
    if (!selected.empty()) section = selected.front()->get_name();
    for (CLI::ConfigItem& item : items) {
      if (item.parents.empty()) item.parents = {section};
      if (item.name == "++" || item.name == "--" || item.parents.size() != 1) continue;
      const CLI::App* sub = nullptr;
      for (const CLI::App* s : parent_->get_subcommands([](const CLI::App*) { return true; })) {
        if (s->get_name() == item.parents.front()) sub = s;
      }
      if (sub == nullptr || sub->get_option_no_throw("--" + item.name) != nullptr ||
          parent_->get_option_no_throw("--" + item.name) != nullptr) {
        continue;
      }
      std::vector<std::string> keys;
      for (const std::string& flag : OptionNames(*sub)) keys.push_back(flag.substr(2));
      const std::string near = ClosestName(item.name, keys);
      throw CLI::ConfigError(FileName() + ":" + LineOf(text, item.name) + ": unknown key '" +
                             item.name + "'" +
                             (near.empty() ? "" : "; did you mean '" + near + "'?") +
                             " (keys are `ferry " + sub->get_name() + "` options without dashes)");
    }
    return items;
  }

 private:
  std::string FileName() const {
    const CLI::Option* config = parent_->get_config_ptr();
    return config != nullptr && !config->results().empty() ? config->results().back() : "job file";
  }
  // The first line that sets `key` (`key = ...`, `section.key = ...`), 1-based; "?" if none.
  static std::string LineOf(const std::string& text, const std::string& key) {
    std::istringstream lines(text);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      ++n;
      const size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string k = line.substr(0, eq);
      k.erase(0, k.find_first_not_of(" \t"));
      k.erase(k.find_last_not_of(" \t") + 1);
      if (k == key || (k.size() > key.size() && k.ends_with("." + key))) return std::to_string(n);
    }
    return "?";
  }

  const CLI::App* parent_;
};

}  // namespace

void AddJobOptions(CLI::App& app, JobSpec& j, std::string* lora_targets) {
  app.add_option("--model", j.model,
                 "Model: 'tiny' (built-in preset) or a Hugging Face model folder")
      ->capture_default_str();
  app.add_option("--data", j.data,
                 "Dataset: 'builtin', or a file: .jsonl (text | prompt+completion | messages), "
                 ".txt, .bin/.tok token ids")
      ->capture_default_str();
  app.add_option("--val-data", j.val_data, "Validation dataset file (same formats as --data)");
  app.add_option("--val-fraction", j.val_fraction,
                 "Share of --data's examples held out for validation (0: none)")
      ->capture_default_str();
  app.add_option("--eval-every", j.eval_every,
                 "Validation loss every N updates, written to metrics.jsonl as val_loss (0: off)")
      ->capture_default_str();
  app.add_option("--eval-batches", j.eval_batches,
                 "Micro-batches per validation (0: the whole validation set)")
      ->capture_default_str();
  app.add_option("--chat-template", j.chat_template,
                 "Chat template for 'messages': chatml, llama3, mistral, none, or auto (from the "
                 "model folder)")
      ->capture_default_str();
  app.add_option("--long-examples", j.long_examples,
                 "Examples longer than --seq-len: split (into pieces, nothing lost) or truncate")
      ->capture_default_str();
  app.add_flag("--skip-bad-lines", j.skip_bad_lines,
               "Skip malformed .jsonl lines (and report how many) instead of stopping");
  app.add_option("--steps", j.steps, "Optimizer updates")->capture_default_str();
  app.add_option("--lr", j.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--batch-size", j.batch_size, "Sequences per optimizer update (global batch)")
      ->capture_default_str();
  app.add_option("--micro-batches", j.micro_batches,
                 "Micro-batches per update (gradients accumulate; must divide --batch-size)")
      ->capture_default_str();
  app.add_option("--seq-len", j.seq_len, "Tokens per sequence")->capture_default_str();
  app.add_option("--warmup-steps", j.warmup_steps, "Linear warm-up updates before the cosine decay")
      ->capture_default_str();
  app.add_option("--min-lr-ratio", j.min_lr_ratio, "The cosine ends at this fraction of --lr")
      ->capture_default_str();
  app.add_option("--weight-decay", j.weight_decay,
                 "AdamW decoupled weight decay (never on norms and biases)")
      ->capture_default_str();
  app.add_option("--beta1", j.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", j.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--adam-eps", j.adam_eps, "AdamW epsilon")->capture_default_str();
  app.add_option("--grad-clip", j.grad_clip, "Global gradient-norm clipping threshold (0: off)")
      ->capture_default_str();
  app.add_option("--lora-rank", j.lora.rank, "LoRA rank (0: full fine-tuning)")
      ->capture_default_str();
  app.add_option("--lora-alpha", j.lora.alpha, "LoRA alpha (scaling = alpha / rank)")
      ->capture_default_str();
  app.add_option("--lora-targets", *lora_targets,
                 "Projections that get adapters: comma-separated q,k,v,o,gate,up,down, or all")
      ->capture_default_str();
  app.add_option("--seed", j.seed, "Seed for initialization and data order")->capture_default_str();
}

void AddTrainCommand(CLI::App& parent, TrainCommand* cmd) {
  JobSpec& j = cmd->job;
  CLI::App* t = parent.add_subcommand(
      "train",
      "Fine-tune a model. With no options: the built-in tiny Llama-style model on the "
      "built-in dataset, on the CPU, in a minute or two.\n"
      "--config FILE reads a job file (TOML): each key is one of the options below "
      "without its dashes (steps = 100, lora-rank = 8); options on the command line "
      "win.");
  cmd->app = t;
  t->fallthrough();
  parent.config_formatter(std::make_shared<JobFile>(&parent));
  parent.allow_config_extras(CLI::config_extras_mode::error);
  parent.set_config("--config", "",
                    "Job file (TOML): every key is a train flag without dashes, e.g. "
                    "`steps = 100`; flags given on the command line win");
  AddJobOptions(*t, j, &cmd->lora_targets);
  t->add_option("--threads", j.threads, "CPU threads (0: all cores)")->capture_default_str();
  t->add_option("--devices", j.devices,
                "CPU devices: more than 1 plans the job for them and runs the planned pipeline")
      ->capture_default_str();
  t->add_option("--out", j.out,
                "Run folder (created; an existing one only for the same job): weights, "
                "metrics.jsonl, job.json")
      ->capture_default_str();
  t->add_flag("--force", cmd->force,
              "Replace the run folder --out when it holds another job's run (never a folder "
              "with files ferry did not write)");
  t->add_option("--save-every", j.save_every,
                "Checkpoint every N updates into RUN_DIR/checkpoints (0: only at the end and on "
                "SIGINT/SIGTERM)")
      ->capture_default_str();
  t->add_option("--keep-checkpoints", j.keep_checkpoints, "Newest checkpoints kept")
      ->capture_default_str();
  t->add_flag("--checkpoint-compress", j.checkpoint_compress,
              "zstd-compress the checkpoints' tensor files");
  t->add_option("--resume", cmd->resume,
                "Continue the run in RUN_DIR from its newest intact checkpoint (job from "
                "RUN_DIR/job.json; only --steps, --threads and the checkpoint options may change)");
}

namespace {

// With --resume: the run's job, with the changes the command line may make. Any other option
// given (on the command line or in a --config file) must agree with the run's job.
Result<JobSpec> ResumedJob(const TrainCommand& cmd) {
  const std::string path = cmd.resume + "/job.json";
  Result<std::string> text = ReadWholeFile(path);
  if (text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound(cmd.resume +
                            " is not a run folder of ferry train (it has no job.json)");
  }
  if (!text.ok()) return text.status();
  nlohmann::json saved = nlohmann::json::parse(*text, nullptr, false);
  FERRY_ASSIGN_OR_RETURN(JobSpec job, JobSpecFromJson(saved, path));
  FERRY_ASSIGN_OR_RETURN(ModelConfig model, ResolveModel(job));
  const nlohmann::json given = JobSpecToJson(cmd.job, model);
  nlohmann::json merged = JobSpecToJson(job, model);
  const std::set<std::string> may_change = {"steps", "threads", "save_every", "keep_checkpoints",
                                            "checkpoint_compress"};
  for (const CLI::Option* opt : cmd.app->get_options()) {
    if (opt->count() == 0) continue;
    std::string key = opt->get_name();
    while (!key.empty() && key.front() == '-') key.erase(key.begin());
    for (char& c : key) c = c == '-' ? '_' : c;
    if (key == "resume" || !given.contains(key)) continue;
    if (key == "out") {
      return Status::InvalidArgument("--out cannot be combined with --resume (the run folder is " +
                                     cmd.resume + ")");
    }
    if (may_change.count(key) != 0) {
      merged[key] = given[key];
    } else if (given[key] != merged[key]) {
      return Status::InvalidArgument(opt->get_name() + " " + given[key].dump() +
                                     " differs from the run's " + merged[key].dump() + " (" + path +
                                     "); a resumed run keeps its job: only --steps, "
                                     "--threads and the checkpoint options may change");
    }
  }
  merged["out"] = cmd.resume;
  return JobSpecFromJson(merged, path);
}

}  // namespace

int RunTrainCommand(TrainCommand& cmd) {
  JobSpec& job = cmd.job;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "ferry train: %s\n", s.message().c_str());
    return 1;
  };
  Result<uint32_t> targets = ParseLoraTargets(cmd.lora_targets);
  if (!targets.ok()) return fail(targets.status().WithContext("--lora-targets"));
  job.lora.targets = *targets;
  RunControl control;
  if (!cmd.resume.empty()) {
    Result<JobSpec> resumed = ResumedJob(cmd);
    if (!resumed.ok()) return fail(resumed.status().WithContext("--resume"));
    job = *resumed;
    control.resume = true;
  }
  Result<ModelConfig> model = ResolveModel(job);
  if (!model.ok()) return fail(model.status());
  if (Status s = ValidateJobSpec(job, *model); !s.ok()) return fail(s);
  if (cmd.force && control.resume)
    return fail(
        Status::InvalidArgument("--force cannot be "
                                "combined with --resume"));
  const RunFolderMode mode = control.resume ? RunFolderMode::kResume
                             : cmd.force    ? RunFolderMode::kForce
                                            : RunFolderMode::kNew;
  Result<RunFolderLock> lock = ClaimRunFolder(job, JobSpecToJson(job, *model), mode);
  if (!lock.ok()) return fail(lock.status());
  // A resumed run's job.json is rewritten once its checkpoint is chosen and accepted.
  if (!control.resume) {
    if (Status s = WriteJobJson(job, *model); !s.ok()) return fail(s);
  }
  control.on_resume = [&job, &model](int64_t checkpoint_step) {
    if (job.steps < checkpoint_step) {
      return Status::InvalidArgument("--steps " + std::to_string(job.steps) +
                                     " is below the checkpoint's step " +
                                     std::to_string(checkpoint_step) + "; give --steps " +
                                     std::to_string(checkpoint_step) + " or more");
    }
    return WriteJobJson(job, *model);
  };
  Result<StopSignals> signals = StopSignals::Install();
  if (signals.ok()) {
    control.stop_requested = [&signals] { return signals->Poll(); };
  } else {
    std::fprintf(stderr, "ferry train: warning: %s; SIGINT/SIGTERM will not save a checkpoint\n",
                 signals.status().message().c_str());
  }
  if (const char* kill_at = std::getenv("FERRY_TEST_CHECKPOINT_KILL"); kill_at != nullptr) {
    const std::string spec = kill_at;
    const size_t colon = spec.find(':');
    const int64_t step = std::atoll(spec.substr(0, colon).c_str());
    const std::string stage = colon == std::string::npos ? "" : spec.substr(colon + 1);
    control.checkpoint_fault_hook = [step, stage](int64_t at, std::string_view reached) {
      if (at == step && reached == stage) ::kill(::getpid(), SIGKILL);
      return Status::Ok();
    };
  }
  Status s = RunTraining(job, *model, control);
  if (s.code() == StatusCode::kCancelled && signals.ok() && signals->Poll() != 0) {
    std::fprintf(stderr, "ferry train: %s\n", s.message().c_str());
    return 128 + signals->Poll();
  }
  if (s.code() == StatusCode::kUnavailable) {
    std::fprintf(stderr, "ferry train: %s (the resolved job is in %s/job.json)\n",
                 s.message().c_str(), job.out.c_str());
    return 2;
  }
  if (!s.ok()) return fail(s);
  return 0;
}

}  // namespace ferry
