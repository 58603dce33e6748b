#include "apps/eval_command.h"

#include <cmath>
#include <cstdio>
#include <thread>

#include "apps/job_file.h"
#include "apps/job_options.h"
#include "engine/exec/job_device_factory.h"
#include "engine/job/chat_format.h"
#include "engine/job/job_devices.h"
#include "engine/job/job_spec.h"
#include "engine/job/model_source.h"
#include "engine/job/run_limits.h"
#include "engine/json.h"
#include "engine/model/model_runner.h"
#include "engine/train/training_data.h"
#include "engine/train/training_runner.h"

namespace ferry {
namespace {

Status Run(const EvalCommand& cmd) {
  if (cmd.data.empty()) return Status::InvalidArgument("--data FILE is required");
  if (cmd.seq_len < 2 || cmd.batch_size < 1 || cmd.max_batches < 0) {
    return Status::InvalidArgument(
        "--seq-len must be at least 2, --batch-size at least 1, --max-batches 0 or more");
  }
  const int threads =
      cmd.threads > 0 ? int(cmd.threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  // The job `ferry eval` runs: one micro-batch of --batch-size x --seq-len on one CPU device, a
  // forward-only plan of the model (and its adapter) run by the pipeline executor.
  JobSpec job;
  job.model = cmd.model;
  job.batch_size = cmd.batch_size;
  job.micro_batches = 1;
  job.seq_len = cmd.seq_len;
  job.devices = cmd.devices.devices;
  job.device_kind = cmd.devices.device_kind;
  job.gpus = cmd.devices.gpus;
  job.dtype = cmd.devices.dtype;
  job.gpu_memory = cmd.devices.gpu_memory;
  // Settled (or refused) before anything is loaded; said once the run starts.
  const GpuCensus census = exec::TakeGpuCensus();
  FERRY_ASSIGN_OR_RETURN(const std::string which, ResolveJobDevices(job, census));
  FERRY_RETURN_IF_ERROR(JobGpuBudget(job, census).status());  // --gpu-memory against them
  // Everything is checked against the model's config and this machine before anything is loaded.
  {
    FERRY_ASSIGN_OR_RETURN(ModelSource source,
                           ResolveModelSource(cmd.model, cmd.adapter, ModelUse::kInference));
    // The base as it will be held (as LoadInferenceModel holds it).
    job.lora = InferenceBaseStorage(source, cmd.quantize, cmd.double_quant);
    RunLimits run;
    run.threads = cmd.threads;
    run.positions = cmd.seq_len;
    run.positions_from = "--seq-len " + std::to_string(cmd.seq_len);
    run.rows = cmd.batch_size;
    // (Before the adapter is read: the base model's bytes; an adapter adds little.)
    run.device_bytes = [&] {
      return TrainingDevicesBytes(job, source.config, threads, /*forward_only=*/true);
    };
    run.device_from = "--batch-size " + std::to_string(cmd.batch_size) + " x --seq-len " +
                      std::to_string(cmd.seq_len);
    FERRY_RETURN_IF_ERROR(ValidateRunLimits(run, source.config));
  }
  FERRY_ASSIGN_OR_RETURN(InferenceModel loaded, LoadInferenceModel(cmd.model, cmd.adapter, cmd.seed,
                                                                   cmd.quantize, cmd.double_quant));
  const LoadedModel& m = loaded.model;
  FERRY_ASSIGN_OR_RETURN(ChatTemplate chat,
                         ResolveChatTemplate(cmd.chat_template, loaded.template_source));
  FERRY_ASSIGN_OR_RETURN(LongExamples mode, ParseLongExamples(cmd.long_examples));
  std::string log;
  const ExampleOptions reading{.tokenizer = loaded.tokenizer.get(),
                               .chat_template = chat,
                               .skip_bad_lines = cmd.skip_bad_lines,
                               .train_on_prompt = cmd.train_on_prompt};
  FERRY_ASSIGN_OR_RETURN(std::vector<Example> examples,
                         LoadDataset(cmd.data, reading, m.config, &log));
  const PackedRows rows = PackedRows::Pack(examples, cmd.seq_len, mode, PadId(*loaded.tokenizer));
  std::vector<Example>().swap(examples);  // the rows hold what the evaluation reads
  if (rows.rows() == 0) {
    return Status::InvalidArgument(cmd.data + " has no target to score (" + log + ")");
  }
  if (!cmd.json) {
    std::fprintf(stderr, "ferry eval: %s; %s\n", log.c_str(), DescribeRows(rows).c_str());
    std::fprintf(stderr, "ferry eval: devices: %s\n", which.c_str());
  }

  job.lora = m.lora;
  FERRY_ASSIGN_OR_RETURN(TrainingRunner devices,
                         CreateTrainingRunner(job, m.config, threads, /*trace=*/false,
                                              /*forward_only=*/true, rows.Counts(job.batch_size)));
  FERRY_RETURN_IF_ERROR(devices.runner->UploadWeights(m.weights));
  FERRY_ASSIGN_OR_RETURN(EvalResult r,
                         EvaluateRows(*devices.runner, rows, cmd.batch_size, cmd.max_batches));
  if (cmd.json) {
    const nlohmann::json j = {{"model", cmd.model},
                              {"adapter", cmd.adapter},
                              {"data", cmd.data},
                              {"loss", r.mean_loss()},
                              {"perplexity", r.perplexity()},
                              {"targets", r.targets},
                              {"micro_batches", r.micro_batches},
                              {"rows", rows.rows()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("loss %.6f  perplexity %.4f  (%lld targets in %lld micro-batches of %lld x %lld)\n",
                r.mean_loss(), r.perplexity(), (long long)r.targets, (long long)r.micro_batches,
                (long long)cmd.batch_size, (long long)cmd.seq_len);
  }
  return Status::Ok();
}

}  // namespace

void AddEvalCommand(CLI::App& parent, EvalCommand* cmd) {
  CLI::App* e = parent.add_subcommand(
      "eval", "Mean loss and perplexity of a model on a dataset file (forward only)");
  cmd->app = e;
  e->add_option("--model", cmd->model,
                "Model: 'tiny', a Hugging Face model folder (one pre-quantized by bitsandbytes "
                "4-bit too) or a run folder of ferry train (full or LoRA)")
      ->capture_default_str();
  e->add_option("--adapter", cmd->adapter,
                "PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors); "
                "default: the model folder's own, when it has one");
  e->add_option("--data", cmd->data,
                "Dataset file: .jsonl, .json, .txt, .bin/.tok (as ferry train)")
      ->required();
  e->add_option("--seq-len", cmd->seq_len, "Tokens per packed row")->capture_default_str();
  e->add_option("--batch-size", cmd->batch_size, "Rows per forward pass")->capture_default_str();
  e->add_option("--max-batches", cmd->max_batches, "Stop after this many batches (0: all)")
      ->capture_default_str();
  e->add_option("--chat-template", cmd->chat_template,
                "Chat template for 'messages': " + ChatFormatNames() + ", or auto")
      ->capture_default_str();
  e->add_option("--long-examples", cmd->long_examples,
                "Examples longer than --seq-len: split or truncate")
      ->capture_default_str();
  e->add_flag("--train-on-prompt", cmd->train_on_prompt,
              "Score every token of a chat or prompt+completion example, as a run with "
              "--train-on-prompt trains them (default: the answers only)");
  e->add_flag("--skip-bad-lines", cmd->skip_bad_lines,
              "Skip malformed .jsonl lines (or .json array elements)");
  e->add_option("--seed", cmd->seed, "Initialization seed of --model tiny")->capture_default_str();
  e->add_option("--threads", cmd->threads, "CPU threads (0: all cores)")->capture_default_str();
  e->add_flag("--json", cmd->json, "Print one JSON object instead of text");
  AddDevicesOption(*e, cmd->devices, "a forward-only plan runs over them");
  AddGpuMemoryOption(*e, cmd->devices);
  e->add_option("--dtype", cmd->devices.dtype,
                "Compute dtype: f32 (CPU devices), bf16, f16 or auto (f32 on CPU devices, bf16 "
                "on GPUs)")
      ->transform([](std::string name) { return CanonicalDtypeName(std::move(name)); })
      ->capture_default_str();
  AddQuantizeOptions(*e, &cmd->quantize, &cmd->double_quant, QuantizeUse::kInference);
}

int RunEvalCommand(EvalCommand& cmd) {
  const Status s = Run(cmd);
  if (s.ok()) return 0;
  std::fprintf(stderr, "ferry eval: %s\n", AnnotateJobFile(cmd.job_file, s).message().c_str());
  return s.code() == StatusCode::kUnavailable ? 2 : 1;
}

}  // namespace ferry
