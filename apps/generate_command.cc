#include "apps/generate_command.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/model/generator.h"
#include "engine/model/safetensors.h"
#include "engine/model/tokenizer.h"
#include "engine/train/master_weights.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// What generation needs of a model: its config, adapter, host weights and tokenizer.
struct LoadedModel {
  ModelConfig config;
  LoraConfig lora;
  HostTensors weights;
  std::unique_ptr<Tokenizer> tokenizer;
};

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// PEFT's adapter_config.json as ferry writes it (PeftAdapterConfig): r, lora_alpha and
// target_modules (the last component of each adapted module's name).
Result<LoraConfig> ReadAdapterConfig(const std::string& path, const ModelConfig& model) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open the adapter config");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("r") || !j["r"].is_number_integer() ||
      !j.contains("target_modules") || !j["target_modules"].is_array()) {
    return Status::InvalidArgument(path +
                                   ": not a LoRA adapter config (need integer 'r' and a "
                                   "'target_modules' list)");
  }
  LoraConfig lora;
  lora.rank = j["r"].get<int64_t>();
  lora.alpha = j.value("lora_alpha", double(lora.rank));
  lora.targets = 0;
  const bool gpt2 = model.family == ModelFamily::kGpt2;
  for (const nlohmann::json& m : j["target_modules"]) {
    const std::string name = m.is_string() ? m.get<std::string>() : "";
    if (gpt2 && name == "c_attn") {
      lora.targets |= kLoraQ | kLoraK | kLoraV;
    } else if (gpt2 && (name == "attn.c_proj" || name == "c_fc" || name == "mlp.c_proj")) {
      lora.targets |= name == "attn.c_proj" ? kLoraO : (name == "c_fc" ? kLoraUp : kLoraDown);
    } else {
      Result<uint32_t> t = ParseLoraTargets(name);
      if (!t.ok()) return t.status().WithContext(path + ": target_modules");
      lora.targets |= *t;
    }
  }
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(lora).WithContext(path));
  return lora;
}

Status LoadWeightsFile(const std::string& path, const std::vector<LayerSpec>& layers,
                       ParamSelection which, HostTensors& weights) {
  FERRY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  return LoadMasterWeights(file, layers, which, weights);
}

// The tokenizer of a folder: its tokenizer.json, or the built-in byte-level one for a model with
// the tiny preset's vocabulary (what `ferry train` writes).
Result<std::unique_ptr<Tokenizer>> FolderTokenizer(const std::string& dir, const ModelConfig& c) {
  if (Exists(dir + "/tokenizer.json")) return LoadTokenizer(dir);
  if (c.vocab_size == kTinyVocabSize) return MakeByteTokenizer();
  return Status::NotFound(dir + " has no tokenizer.json (and its vocabulary of " +
                          std::to_string(c.vocab_size) +
                          " is not the built-in byte-level one): add the model's tokenizer.json");
}

Result<LoadedModel> LoadModel(const GenerateCommand& cmd) {
  LoadedModel m;
  if (cmd.model == "tiny") {
    if (!cmd.adapter.empty()) {
      return Status::InvalidArgument("--adapter needs a --model folder, not the built-in 'tiny'");
    }
    // Untrained (initialized from --seed): a smoke test of the pipeline, not of the text.
    m.config = TinyLlamaPreset();
    m.weights = InitMasterWeights(BuildLayerSpecs(m.config, m.lora), cmd.seed);
    m.tokenizer = MakeByteTokenizer();
    return m;
  }
  const std::string dir = cmd.model;
  if (!fs::is_directory(dir)) {
    return Status::NotFound("--model " + dir +
                            ": not a folder (give 'tiny', a run folder or a model folder)");
  }
  // >>> Hugging Face model folders (sharded safetensors, PEFT adapters from elsewhere) plug in
  // here: LoadModelFolder(dir, adapter_dir) will return config, adapter, weights and tokenizer.
  // Until then, the run folders `ferry train` writes: config.json + model.safetensors, and
  // adapter_model.safetensors + adapter_config.json when it trained LoRA.
  FERRY_ASSIGN_OR_RETURN(m.config, LoadHfConfig(dir + "/config.json"));
  const std::string adapter_dir = cmd.adapter.empty() ? dir : cmd.adapter;
  if (Exists(adapter_dir + "/adapter_config.json")) {
    FERRY_ASSIGN_OR_RETURN(m.lora,
                           ReadAdapterConfig(adapter_dir + "/adapter_config.json", m.config));
  } else if (!cmd.adapter.empty()) {
    return Status::NotFound("--adapter " + cmd.adapter + ": no adapter_config.json there");
  }
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m.config, m.lora);
  m.weights = InitMasterWeights(layers, 0);  // every buffer sized; all overwritten below
  FERRY_RETURN_IF_ERROR(
      LoadWeightsFile(dir + "/model.safetensors", layers, ParamSelection::kBase, m.weights));
  if (m.lora.enabled()) {
    FERRY_RETURN_IF_ERROR(LoadWeightsFile(adapter_dir + "/adapter_model.safetensors", layers,
                                          ParamSelection::kLora, m.weights));
  }
  FERRY_ASSIGN_OR_RETURN(m.tokenizer, FolderTokenizer(dir, m.config));
  return m;
}

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
  std::string prompt = cmd.prompt;
  if (cmd.app == nullptr || cmd.app->count("--prompt") == 0) {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  FERRY_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(cmd));
  const std::vector<int32_t> ids = m.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  if (ids.empty()) return Status::InvalidArgument("the prompt is empty: give --prompt TEXT");

  CpuDeviceOptions dev;
  dev.name = "cpu";
  dev.compute_threads =
      cmd.threads > 0 ? cmd.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  size_t weight_bytes = 0;
  for (const auto& [name, t] : m.weights.tensors) weight_bytes += t.size() * 4;
  const int64_t positions = int64_t(ids.size()) + cmd.max_tokens;
  const size_t cache_bytes = size_t(2 * m.config.num_layers * positions * m.config.kv_dim()) * 4;
  // Weights (and the gradient buffers DeviceParams plans), the cache, and the activations of the
  // prefill (a few (n, C|I|V) tensors per step; 64 MiB covers the built-in sizes with margin).
  const size_t act_bytes =
      size_t(positions) *
      size_t(8 * m.config.hidden_size + 4 * m.config.intermediate_size + m.config.vocab_size) * 4;
  dev.memory_bytes = 2 * weight_bytes + cache_bytes + act_bytes + (size_t(64) << 20);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> device, CpuDevice::Create(dev));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Generator> gen,
                         Generator::Create(*device, m.config, m.lora, m.weights, positions));

  GenerateOptions o;
  o.sampling = sampling;
  o.max_new_tokens = cmd.max_tokens;
  o.eos = m.tokenizer->special_ids().eos;
  std::vector<int32_t> out;
  size_t printed = 0;
  const auto start = std::chrono::steady_clock::now();
  auto stream = [&](int32_t token) {
    out.push_back(token);
    const std::string text = m.tokenizer->Decode(out, /*skip_special_tokens=*/true);
    if (!EndsIncomplete(text) && text.size() > printed) {
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::fflush(stdout);
      printed = text.size();
    }
    return Status::Ok();
  };
  FERRY_ASSIGN_OR_RETURN(std::vector<int32_t> done, Generate(*gen, ids, o, stream));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = m.tokenizer->Decode(out, true);
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
      "Generate text with a KV cache from the built-in 'tiny' model (untrained) or a run folder "
      "of `ferry train`. The text streams to stdout; the speed goes to stderr.");
  cmd->app = g;
  g->add_option("--model", cmd->model, "'tiny' or a run folder (config.json + model.safetensors)")
      ->capture_default_str();
  g->add_option("--adapter", cmd->adapter,
                "LoRA adapter folder (adapter_config.json + adapter_model.safetensors); default: "
                "the model folder's own, when it has one");
  g->add_option("--prompt", cmd->prompt, "Prompt text (default: read stdin)");
  g->add_option("--max-tokens", cmd->max_tokens, "New tokens at most (generation stops at EOS)")
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
}

int RunGenerateCommand(GenerateCommand& cmd) {
  if (Status s = Run(cmd); !s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "ferry generate: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace ferry
