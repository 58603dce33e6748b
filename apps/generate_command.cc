#include "apps/generate_command.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <thread>

#include "apps/job_file.h"
#include "apps/job_options.h"
#include "engine/job/chat_format.h"
#include "engine/job/job_spec.h"
#include "engine/job/model_source.h"
#include "engine/job/run_limits.h"
#include "engine/model/generator.h"
#include "engine/train/training_data.h"
#include "engine/train/training_runner.h"

namespace ferry {
namespace {

// True when `s` ends inside a UTF-8 sequence (or with the replacement character a decoder writes
// for one): the next token may complete it, so it is held back.
bool EndsIncomplete(const std::string& s) {
  if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back;
  }
  return false;
}

Status Run(const GenerateCommand& cmd) {
  const SamplingOptions sampling{cmd.temperature, cmd.top_p, cmd.top_k, cmd.seed};
  FERRY_RETURN_IF_ERROR(ValidateSamplingOptions(sampling));
  if (cmd.max_tokens < 1) return Status::InvalidArgument("--max-tokens must be at least 1");
  if (!cmd.chat && cmd.app != nullptr &&
      (cmd.app->count("--system") > 0 || cmd.app->count("--chat-template") > 0 ||
       cmd.no_thinking)) {
    return Status::InvalidArgument(
        "--system, --chat-template and --no-thinking are for a chat's prompt: give --chat too");
  }
  if (cmd.chat && cmd.chat_template != "auto") {  // a bad name before the model loads
    FERRY_RETURN_IF_ERROR(ChatPromptTemplate(cmd.chat_template, "", !cmd.no_thinking).status());
  }
  if (cmd.devices.device_kind == "cuda") {
    return Status::InvalidArgument(
        "--devices names GPUs: generation runs on CPU devices for now (its KV cache is f32, and "
        "GPUs compute in bf16 or f16); use --devices cpu");
  }
  // The options against the model's config and this machine before anything is loaded (the
  // prompt has a token at least); with the prompt's tokens again below, before the device.
  {
    FERRY_ASSIGN_OR_RETURN(ModelSource source,
                           ResolveModelSource(cmd.model, cmd.adapter, ModelUse::kInference));
    RunLimits run;
    run.threads = cmd.threads;
    run.positions = cmd.max_tokens < INT64_MAX ? cmd.max_tokens + 1 : cmd.max_tokens;
    run.positions_from = "--max-tokens " + std::to_string(cmd.max_tokens) + " (+ the prompt)";
    FERRY_RETURN_IF_ERROR(ValidateRunLimits(run, source.config));
  }
  std::string prompt = cmd.prompt;
  if (cmd.app == nullptr || cmd.app->count("--prompt") == 0) {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (cmd.chat) prompt = ChatTurnFromInput(std::move(prompt));
  }
  FERRY_ASSIGN_OR_RETURN(InferenceModel loaded, LoadInferenceModel(cmd.model, cmd.adapter, cmd.seed,
                                                                   cmd.quantize, cmd.double_quant));
  LoadedModel& m = loaded.model;
  std::vector<int32_t> ids;
  GenerateOptions o;
  if (std::optional<int32_t> eos = loaded.tokenizer->special_ids().eos) o.stop_ids.push_back(*eos);
  if (cmd.chat) {
    // The prompt as the user's turn, the answer ending where the assistant's turn ends.
    FERRY_ASSIGN_OR_RETURN(
        ChatTemplate chat,
        ChatPromptTemplate(cmd.chat_template, loaded.template_source, !cmd.no_thinking));
    Result<ChatPrompt> p = EncodeChatPrompt(*loaded.tokenizer, chat, cmd.system, prompt);
    if (!p.ok()) return p.status().WithContext("--chat");
    if (!p->end_of_turn) {
      return Status::InvalidArgument(
          "--chat: the model's tokenizer has no token for the chat template's end of turn " +
          std::string(EndOfTurn(chat.format)) +
          ", so the answer could not stop there; give the model's own template "
          "(--chat-template) or leave out --chat");
    }
    o.stop_ids.push_back(*p->end_of_turn);
    ids = std::move(p->ids);
  } else {
    ids = loaded.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  }
  if (ids.empty()) return Status::InvalidArgument("the prompt is empty: give --prompt TEXT");

  const int threads =
      cmd.threads > 0 ? int(cmd.threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t positions = int64_t(ids.size()) + cmd.max_tokens;
  // The job: one sequence, its longest step the prompt, on --devices (CPU devices unless asked:
  // the KV cache is f32), a generation plan of the model and its adapter.
  JobSpec job;
  job.model = cmd.model;
  job.batch_size = 1;
  job.micro_batches = 1;
  job.seq_len = int64_t(ids.size());
  job.devices = cmd.devices.devices;
  job.device_kind = cmd.devices.device_kind == "auto" ? "cpu" : cmd.devices.device_kind;
  job.gpus = cmd.devices.gpus;
  job.dtype = "f32";
  job.lora = m.lora;
  const std::string shape = "the prompt's " + std::to_string(ids.size()) +
                            " tokens + --max-tokens " + std::to_string(cmd.max_tokens);
  RunLimits run;
  run.threads = cmd.threads;
  run.positions = positions;
  run.positions_from = run.device_from = shape;
  run.device_bytes = [&] {
    return TrainingDevicesBytes(job, m.config, threads, /*forward_only=*/true, positions);
  };
  FERRY_RETURN_IF_ERROR(ValidateRunLimits(run, m.config));
  FERRY_ASSIGN_OR_RETURN(GenerationRunner runner,
                         CreateGenerationRunner(job, m.config, m.weights, threads, positions));
  std::fprintf(stderr, "ferry generate: %s\n", runner.summary.c_str());
  Generator* gen = runner.generator.get();

  o.sampling = sampling;
  o.max_new_tokens = cmd.max_tokens;
  std::vector<int32_t> out;
  size_t printed = 0;
  const auto start = std::chrono::steady_clock::now();
  auto stream = [&](int32_t token) {
    out.push_back(token);
    const std::string text = loaded.tokenizer->Decode(out, /*skip_special_tokens=*/true);
    if (!EndsIncomplete(text) && text.size() > printed) {
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      // Output that cannot be written (a full disk) stops the generation, naming the reason.
      if (std::fflush(stdout) != 0) return Status::FromErrno(errno, "write the output (stdout)");
      printed = text.size();
    }
    return Status::Ok();
  };
  FERRY_ASSIGN_OR_RETURN(std::vector<int32_t> done, Generate(*gen, ids, o, stream));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = loaded.tokenizer->Decode(out, true);
  if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "ferry generate: %zu prompt + %zu new tokens in %.2f s (%.1f tokens/s)\n",
               ids.size(), done.size(), s, s > 0 ? double(done.size()) / s : 0.0);
  return Status::Ok();
}

}  // namespace

void AddGenerateCommand(CLI::App& parent, GenerateCommand* cmd) {
  CLI::App* g = parent.add_subcommand(
      "generate",
      "Generate text with a KV cache from a Hugging Face model folder, a run folder of `ferry "
      "train` (full or LoRA) or the built-in 'tiny' model (untrained), optionally with a PEFT "
      "LoRA adapter. The text streams to stdout; the speed goes to stderr.");
  cmd->app = g;
  g->add_option(
       "--model", cmd->model,
       "'tiny', a Hugging Face model folder (config.json, safetensors, tokenizer.json; one "
       "pre-quantized by bitsandbytes 4-bit too) or a run folder of ferry train")
      ->capture_default_str();
  g->add_option(
      "--adapter", cmd->adapter,
      "PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), e.g. a "
      "LoRA run folder; default: the model folder's own, when it has one");
  g->add_option("--prompt", cmd->prompt, "Prompt text (default: read stdin)");
  g->add_flag("--chat", cmd->chat,
              "The prompt is the user's turn of the model's chat template (the answer starts "
              "after the assistant's header and stops at the end of its turn), as a chat "
              "fine-tune was trained");
  g->add_option("--system", cmd->system,
                "With --chat: a system message before the prompt (without one, or empty: the "
                "template's default, if it has one, as Qwen2.5's)");
  g->add_flag("--no-thinking", cmd->no_thinking,
              "With --chat on a Qwen3 model: answer without thinking (the template's "
              "enable_thinking=False: an empty <think> block ends the prompt)");
  g->add_option("--chat-template", cmd->chat_template,
                "With --chat: " + ChatFormatNames(", ", /*with_none=*/false) +
                    ", or auto (from the model folder)")
      ->capture_default_str();
  g->add_option(
       "--max-tokens", cmd->max_tokens,
       "New tokens at most (generation stops at EOS, and with --chat at the end of the turn)")
      ->capture_default_str();
  g->add_option("--temperature", cmd->temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  g->add_option("--top-p", cmd->top_p, "Nucleus sampling mass in (0, 1] (1: off)")
      ->capture_default_str();
  g->add_option("--top-k", cmd->top_k, "Sample among the k most likely tokens (0: off)")
      ->capture_default_str();
  g->add_option("--seed", cmd->seed, "Seed of the draws (the same seed gives the same text)")
      ->capture_default_str();
  g->add_option("--threads", cmd->threads, "CPU threads (0: all cores)")->capture_default_str();
  AddQuantizeOptions(*g, &cmd->quantize, &cmd->double_quant, QuantizeUse::kInference);
  AddDevicesOption(*g, cmd->devices,
                   "a generation plan runs over them, each keeping its blocks' KV cache (CPU "
                   "devices: the cache is f32; default: one)");
}

int RunGenerateCommand(GenerateCommand& cmd) {
  if (Status s = Run(cmd); !s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "ferry generate: %s\n",
                 AnnotateJobFile(cmd.job_file, s).message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace ferry
