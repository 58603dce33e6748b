#include "apps/eval_command.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/model/byte_tokenizer.h"
#include "engine/model/model_runner.h"
#include "engine/model/safetensors.h"
#include "engine/train/master_weights.h"
#include "engine/train/run_training.h"
#include "engine/train/training_data.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

struct EvalModel {
  ModelConfig config;
  LoraConfig lora;
  HostTensors weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string template_source;  // what ResolveChatTemplate reads: "tiny" or the folder
};

// THE place where --model is turned into weights. "tiny": the preset at its seeded
// initialization; a folder: a `ferry train` run folder (config.json + model.safetensors).
// Hugging Face model folders (sharded safetensors, tokenizer.json) plug in here: replace the
// folder branch with the model-folder loader (LoadModelFolder(dir, adapter_dir)) when it lands.
Result<EvalModel> LoadEvalModel(const std::string& model, uint64_t seed) {
  EvalModel m;
  if (model == "tiny") {
    m.config = TinyLlamaPreset();
    m.weights = InitMasterWeights(BuildLayerSpecs(m.config, m.lora), seed);
    m.tokenizer = MakeByteTokenizer();
    m.template_source = "tiny";
    return m;
  }
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(model) / "adapter_model.safetensors")) {
    return Status::Unavailable("--model " + model +
                               " is a LoRA run folder; ferry eval reads full fine-tuning runs "
                               "only for now");
  }
  FERRY_ASSIGN_OR_RETURN(m.config, LoadHfConfig(model + "/config.json"));
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  m.weights = InitMasterWeights(layers, seed);
  FERRY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(model + "/model.safetensors"));
  FERRY_RETURN_IF_ERROR(LoadMasterWeights(file, layers, ParamSelection::kAll, m.weights));
  if (!fs::exists(fs::path(model) / "tokenizer.json") &&
      m.config.vocab_size == ByteTokenizer::kVocabSize) {
    m.tokenizer = MakeByteTokenizer();  // a run of the tiny preset
    m.template_source = "tiny";
  } else {
    FERRY_ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizer(model));
    m.template_source = model;
  }
  return m;
}

Status Run(const EvalCommand& cmd) {
  if (cmd.data.empty()) return Status::InvalidArgument("--data FILE is required");
  if (cmd.seq_len < 2 || cmd.batch_size < 1 || cmd.max_batches < 0) {
    return Status::InvalidArgument(
        "--seq-len must be at least 2, --batch-size at least 1, --max-batches 0 or more");
  }
  FERRY_ASSIGN_OR_RETURN(EvalModel m, LoadEvalModel(cmd.model, cmd.seed));
  if (cmd.seq_len > m.config.max_position_embeddings) {
    return Status::InvalidArgument(
        "--seq-len " + std::to_string(cmd.seq_len) + " exceeds the model's " +
        std::to_string(m.config.max_position_embeddings) + " positions; lower --seq-len");
  }
  FERRY_ASSIGN_OR_RETURN(ChatTemplate chat,
                         ResolveChatTemplate(cmd.chat_template, m.template_source));
  FERRY_ASSIGN_OR_RETURN(LongExamples mode, ParseLongExamples(cmd.long_examples));
  std::string log;
  FERRY_ASSIGN_OR_RETURN(
      std::vector<Example> examples,
      LoadDataset(cmd.data, *m.tokenizer, chat, m.config, cmd.skip_bad_lines, &log));
  const PackedRows rows = PackedRows::Pack(examples, cmd.seq_len, mode, PadId(*m.tokenizer));
  if (rows.rows() == 0) {
    return Status::InvalidArgument(cmd.data + " has no target to score (" + log + ")");
  }
  if (!cmd.json)
    std::fprintf(stderr, "ferry eval: %s; %s\n", log.c_str(), DescribeRows(rows).c_str());

  const int threads =
      cmd.threads > 0 ? int(cmd.threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  ModelRunnerOptions ro;
  ro.shape = {cmd.batch_size, cmd.seq_len};
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> device,
                         CpuDevice::Create({.name = "cpu0",
                                            .memory_bytes = EstimateDeviceBytes(
                                                m.config, m.lora, ro.shape, ro.loss_chunk_tokens),
                                            .compute_threads = threads}));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                         ModelRunner::Create(*device, m.config, m.lora, ro));
  FERRY_RETURN_IF_ERROR(runner->UploadWeights(m.weights));
  FERRY_ASSIGN_OR_RETURN(EvalResult r,
                         EvaluateRows(*runner, rows, cmd.batch_size, cmd.max_batches));
  if (cmd.json) {
    const nlohmann::json j = {{"model", cmd.model},    {"data", cmd.data},
                              {"loss", r.mean_loss()}, {"perplexity", r.perplexity()},
                              {"targets", r.targets},  {"micro_batches", r.micro_batches},
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
  e->add_option("--model", cmd->model, "Model: 'tiny' or a `ferry train` run folder")
      ->capture_default_str();
  e->add_option("--data", cmd->data, "Dataset file: .jsonl, .txt, .bin/.tok (as ferry train)")
      ->required();
  e->add_option("--seq-len", cmd->seq_len, "Tokens per packed row")->capture_default_str();
  e->add_option("--batch-size", cmd->batch_size, "Rows per forward pass")->capture_default_str();
  e->add_option("--max-batches", cmd->max_batches, "Stop after this many batches (0: all)")
      ->capture_default_str();
  e->add_option("--chat-template", cmd->chat_template,
                "Chat template for 'messages': chatml, llama3, mistral, none, or auto")
      ->capture_default_str();
  e->add_option("--long-examples", cmd->long_examples,
                "Examples longer than --seq-len: split or truncate")
      ->capture_default_str();
  e->add_flag("--skip-bad-lines", cmd->skip_bad_lines, "Skip malformed .jsonl lines");
  e->add_option("--seed", cmd->seed, "Initialization seed of --model tiny")->capture_default_str();
  e->add_option("--threads", cmd->threads, "CPU threads (0: all cores)")->capture_default_str();
  e->add_flag("--json", cmd->json, "Print one JSON object instead of text");
}

int RunEvalCommand(EvalCommand& cmd) {
  const Status s = Run(cmd);
  if (s.ok()) return 0;
  std::fprintf(stderr, "ferry eval: %s\n", s.message().c_str());
  return s.code() == StatusCode::kUnavailable ? 2 : 1;
}

}  // namespace ferry
