#include "apps/job_options.h"

#include "apps/job_file.h"
#include "engine/job/chat_format.h"
#include "engine/job/job_devices.h"

namespace ferry {

CLI::Option* AddDevicesOption(CLI::App& app, JobSpec& job, const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--devices",
          [&job](const std::string& text) {
            if (Status s = ParseDevicesOption(text, job); !s.ok()) {
              throw CLI::ValidationError(s.message());
            }
          },
          "Devices: a count (GPUs when present, else CPU devices), cpu,cpu (CPU devices), "
          "cuda:0,cuda:1 (those GPUs) or cuda:0,cuda:0 (logical devices sharing a GPU); " +
              help)
      ->default_str(DevicesOptionText(job));
}

CLI::Option* AddGpuMemoryOption(CLI::App& app, JobSpec& job) {
  return app.add_option("--gpu-memory", job.gpu_memory,
                        "Device memory each CUDA device may use, e.g. 4GiB (default: 90% of its "
                        "GPU's free memory, split between devices sharing it); less than the "
                        "model needs makes the plan stream weights through the device");
}

void AddJobOptions(CLI::App& app, JobSpec& j, std::string* lora_targets) {
  app.add_option("--model", j.model,
                 "Model: 'tiny' (built-in preset) or a Hugging Face model folder")
      ->capture_default_str();
  app.add_option("--data", j.data,
                 "Dataset: 'builtin', or a file: .jsonl (text | prompt+completion | messages | "
                 "conversations | instruction+output), .json (those in a JSON array), .txt, "
                 ".bin/.tok token ids")
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
  app.add_option(
         "--chat-template", j.chat_template,
         "Chat template for 'messages': " + ChatFormatNames() + ", or auto (from the model folder)")
      ->capture_default_str();
  app.add_option("--long-examples", j.long_examples,
                 "Examples longer than --seq-len: split (into pieces, nothing lost) or truncate")
      ->capture_default_str();
  app.add_flag("--skip-bad-lines", j.skip_bad_lines,
               "Skip malformed .jsonl lines (or .json array elements) and report how many, "
               "instead of stopping");
  app.add_flag("--train-on-prompt", j.train_on_prompt,
               "The loss on every token of a chat or prompt+completion example (system and user "
               "turns, prompts, the template's tokens), not only on the answers");
  app.add_option("--steps", j.steps, "Optimizer updates")->capture_default_str();
  app.add_option("--epochs", j.epochs,
                 "Passes over --data's training rows instead of --steps: the run takes "
                 "ceil(epochs x rows / --batch-size) updates, counted once the data is packed "
                 "(0: --steps decides)")
      ->capture_default_str();
  app.add_option("--lr", j.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--batch-size", j.batch_size, "Sequences per optimizer update (global batch)")
      ->capture_default_str();
  app.add_option("--micro-batches", j.micro_batches,
                 "Micro-batches per update (gradients accumulate; must divide --batch-size)")
      ->capture_default_str();
  app.add_option("--seq-len", j.seq_len, "Tokens per sequence")->capture_default_str();
  app.add_option("--warmup-steps", j.warmup_steps, "Linear warm-up updates before the decay")
      ->capture_default_str();
  app.add_option("--min-lr-ratio", j.min_lr_ratio,
                 "The decay ends at this fraction of --lr (cosine and linear)")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--lr-schedule",
         [&j](const std::string& v) {
           Result<LrDecay> d = ParseLrDecay(v);
           if (!d.ok()) throw CLI::ValidationError("--lr-schedule", d.status().message());
           j.lr_schedule = *d;
         },
         "The decay after the warm-up: cosine (default; down to --min-lr-ratio), linear (a "
         "straight line down to it) or constant")
      ->type_name("TEXT")
      ->default_str("cosine");
  app.add_option("--weight-decay", j.weight_decay,
                 "AdamW decoupled weight decay (never on norms and biases)")
      ->capture_default_str();
  app.add_option("--beta1", j.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", j.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--adam-eps", j.adam_eps, "AdamW epsilon")->capture_default_str();
  app.add_option("--grad-clip", j.grad_clip, "Global gradient-norm clipping threshold (0: off)")
      ->capture_default_str();
  app.add_flag("--stale-updates", j.stale_updates,
               "One-step-stale updates: each step runs on the weights one update older, so the "
               "optimizer overlaps the next step (changes the numerics)");
  app.add_option("--lora-rank", j.lora.rank, "LoRA rank (0: full fine-tuning)")
      ->capture_default_str();
  app.add_option("--lora-alpha", j.lora.alpha,
                 "LoRA alpha (scaling = alpha / rank; alpha / sqrt(rank) with --lora-rslora)")
      ->capture_default_str();
  app.add_flag("--lora-rslora", j.lora.rslora,
               "rsLoRA: scaling = alpha / sqrt(rank), so higher ranks learn as fast (PEFT's "
               "use_rslora)");
  app.add_option("--lora-targets", *lora_targets,
                 "Projections that get adapters: comma-separated q,k,v,o,gate,up,down, or all")
      ->capture_default_str();
  AddQuantizeOptions(app, &j.lora.quantize, &j.lora.double_quant, QuantizeUse::kTraining);
  app.add_option("--seed", j.seed, "Seed for initialization and data order")->capture_default_str();
}

void AddQuantizeOptions(CLI::App& app, BaseQuant* quantize, bool* double_quant, QuantizeUse use) {
  const bool training = use == QuantizeUse::kTraining;
  const std::string help =
      training ? "The frozen base's storage under LoRA: none, or nf4 (QLoRA: 4-bit NormalFloat, "
                 "blocks of 64, as bitsandbytes stores it)"
               : "The base's block projections: none, or nf4 (quantized to 4-bit NormalFloat "
                 "as they are packed for the devices, as QLoRA holds them); a folder "
                 "pre-quantized by bitsandbytes is NF4 already, and a QLoRA run folder's base "
                 "is taken as it was trained";
  app.add_option_function<std::string>(
         "--quantize",
         [quantize](const std::string& v) {
           Result<BaseQuant> q = ParseBaseQuant(v);
           if (!q.ok()) throw CLI::ValidationError("--quantize", q.status().message());
           *quantize = *q;
         },
         help)
      ->default_str("none");
  app.add_flag("--double-quant,!--no-double-quant", *double_quant,
               std::string("With --quantize nf4: keep NF4's absmax 8-bit quantized in host RAM "
                           "(QLoRA's double quantization") +
                   (training ? ")" : "; it changes the values a little, so match the training)"))
      ->capture_default_str();
}

Status SettleRunLength(const CLI::App& app, const JobFileKeys* file, JobSpec& job) {
  if (app.count("--steps") == 0 || app.count("--epochs") == 0 || job.epochs == 0) {
    return Status::Ok();
  }
  const bool steps_in_file = file != nullptr && file->Sets("--steps");
  const bool epochs_in_file = file != nullptr && file->Sets("--epochs");
  if (steps_in_file == epochs_in_file) {
    return Status::InvalidArgument(std::string("--steps and --epochs both set the run's length") +
                                   (steps_in_file ? " in the job file" : "") +
                                   "; give one of them");
  }
  if (epochs_in_file) job.epochs = 0;  // --steps on the command line wins
  return Status::Ok();
}

}  // namespace ferry
