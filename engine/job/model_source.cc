#include "engine/job/model_source.h"

#include <filesystem>

#include "engine/json.h"
#include "engine/model/master_weights.h"
#include "engine/text/byte_tokenizer.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

bool IsFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool IsDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool HasWeights(const std::string& dir) {
  return IsFile(dir + "/model.safetensors") || IsFile(dir + "/model.safetensors.index.json");
}

// The base model folder of a LoRA run folder `run` that holds no base weights: its job.json's
// "model" (relative to the current folder) or "model_path" (absolute, written since).
Result<std::string> RunBase(const std::string& run) {
  const std::string path = run + "/job.json";
  Result<std::string> text = ReadWholeFile(path);
  const std::string give = "; give the base model as --model BASE --adapter " + run;
  if (text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("--model " + run +
                            " holds a LoRA adapter but no base weights and no job.json" + give);
  }
  if (!text.ok()) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  std::string model, model_path;
  if (j.is_object() && j.contains("model") && j["model"].is_string()) model = j["model"];
  if (j.is_object() && j.contains("model_path") && j["model_path"].is_string()) {
    model_path = j["model_path"];
  }
  for (const std::string& candidate : {model, model_path}) {
    if (!candidate.empty() && candidate != "tiny" && HasWeights(candidate)) return candidate;
  }
  return Status::NotFound("--model " + run + " is a LoRA run whose base model '" + model + "' (" +
                          path + ") is not found from here" + give);
}

// A run folder's base storage into `s`: its job.json's "quantize" ("nf4" for a QLoRA run) and
// "double_quant" (true when absent, the default it was trained with). A missing or unreadable
// job.json, or another value, is kNone (RunBase reports a missing job.json).
void ReadRunQuantize(const std::string& run, ModelSource& s) {
  Result<std::string> text = ReadWholeFile(run + "/job.json");
  if (!text.ok()) return;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantize") || !j["quantize"].is_string()) return;
  Result<BaseQuant> q = ParseBaseQuant(j["quantize"].get<std::string>());
  s.run_quantize = q.ok() ? *q : BaseQuant::kNone;
  if (j.contains("double_quant") && j["double_quant"].is_boolean()) {
    s.run_double_quant = j["double_quant"].get<bool>();
  }
}

Status CheckTokenizer(const Tokenizer& tok, const ModelSource& s) {
  if (tok.vocab_size() <= s.config.vocab_size) return Status::Ok();
  return Status::InvalidArgument(
      "the tokenizer (" + (s.tokenizer_dir.empty() ? "byte-level" : s.tokenizer_dir) + ") has " +
      std::to_string(tok.vocab_size()) + " tokens but the model (" + s.config_path +
      ") a vocabulary of " + std::to_string(s.config.vocab_size) +
      "; they belong to different models: put the model's own tokenizer.json beside it");
}

}  // namespace

Result<ModelSource> ResolveModelSource(const std::string& model, const std::string& adapter,
                                       ModelUse use, const std::string& presets_dir) {
  ModelSource s;
  s.name = model;
  if (!adapter.empty() && use != ModelUse::kInference) {
    return Status::InvalidArgument("--adapter is for ferry eval and ferry generate");
  }
  if (model == "tiny") {
    if (!adapter.empty()) {
      return Status::InvalidArgument(
          "--adapter needs a --model folder, not the built-in 'tiny' (a LoRA run of tiny holds "
          "its base: give it as --model)");
    }
    s.tiny = true;
    s.config = TinyLlamaPreset();
    return s;
  }
  if (!IsDir(model)) {
    if (use == ModelUse::kConfigOnly) {
      const std::string preset = presets_dir.empty() ? "" : presets_dir + "/" + model + ".json";
      s.config_path = IsFile(model) ? model : preset;
      if (s.config_path.empty() || !IsFile(s.config_path)) {
        return Status::NotFound("--model '" + model + "': no such folder or file" +
                                (preset.empty() ? "" : " and no preset " + preset) +
                                "; give 'tiny', a model folder, a config.json or a preset name");
      }
      FERRY_ASSIGN_OR_RETURN(s.config, LoadHfConfig(s.config_path));
      return s;
    }
    return Status::InvalidArgument("--model '" + model +
                                   "' is neither 'tiny' nor a folder; give a Hugging Face model "
                                   "folder (with config.json and safetensors weights) or a run "
                                   "folder of ferry train");
  }
  s.config_path = model + "/config.json";
  const bool own_adapter = IsFile(model + "/adapter_config.json");
  if (!IsFile(s.config_path)) {
    return Status::NotFound(
        "--model '" + model + "' has no config.json; give a Hugging Face model folder" +
        (own_adapter ? " (this looks like an adapter: give it as --adapter, the base as --model)"
                     : ""));
  }
  if (use == ModelUse::kTrain && own_adapter) {
    return Status::InvalidArgument(
        "--model '" + model + "' is a LoRA run folder; continue it with ferry train --resume " +
        model + ", or train on its base model");
  }
  s.weights_dir = model;
  if (use == ModelUse::kInference) {
    s.adapter_dir = !adapter.empty() ? adapter : own_adapter ? model : "";
    if (!adapter.empty() && !IsFile(adapter + "/adapter_config.json")) {
      return Status::NotFound("--adapter " + adapter +
                              ": no adapter_config.json there (give a PEFT LoRA adapter folder)");
    }
    if (own_adapter && !HasWeights(model)) {
      FERRY_ASSIGN_OR_RETURN(s.weights_dir, RunBase(model));
      s.config_path = s.weights_dir + "/config.json";
    }
    if (own_adapter) ReadRunQuantize(model, s);
    for (const std::string& dir : {model, s.weights_dir}) {
      if (IsFile(dir + "/tokenizer.json")) {
        s.tokenizer_dir = dir;
        break;
      }
    }
  }
  FERRY_ASSIGN_OR_RETURN(s.config, LoadHfConfig(s.config_path));
  FERRY_ASSIGN_OR_RETURN(s.bnb4bit, LoadBnb4bitSettings(s.weights_dir));
  if (use == ModelUse::kConfigOnly) s.weights_dir.clear();
  return s;
}

LoraConfig InferenceBaseStorage(const ModelSource& s, BaseQuant quantize, bool double_quant) {
  LoraConfig base;
  if (s.bnb4bit.has_value()) {
    base.quantize = BaseQuant::kNf4;
    base.double_quant = s.bnb4bit->double_quant;
  } else if (s.run_quantize != BaseQuant::kNone) {  // as the adapter was trained
    base.quantize = s.run_quantize;
    base.double_quant = s.run_double_quant;
  } else {
    base.quantize = quantize;
    base.double_quant = double_quant;
  }
  return base;
}

Result<LoadedModel> LoadSourceWeights(const ModelSource& s, uint64_t seed, BaseQuant quantize,
                                      bool double_quant) {
  const LoraConfig base = InferenceBaseStorage(s, quantize, double_quant);
  if (!s.tiny)
    return LoadModelFolder(s.weights_dir, s.adapter_dir, base.quantize, base.double_quant);
  // Untrained (initialized from `seed`): a smoke test of the pipeline, not of the text.
  LoadedModel m;
  m.config = s.config;
  m.lora.quantize = base.quantize;
  m.lora.double_quant = base.double_quant;
  m.layers = BuildLayerSpecs(s.config, m.lora);
  m.weights = InitMasterWeights(m.layers, seed);
  FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(m.layers, m.weights));
  return m;
}

Result<InferenceModel> LoadInferenceModel(const std::string& model, const std::string& adapter,
                                          uint64_t seed, BaseQuant quantize, bool double_quant) {
  InferenceModel m;
  FERRY_ASSIGN_OR_RETURN(m.source, ResolveModelSource(model, adapter, ModelUse::kInference));
  const ModelSource& s = m.source;
  FERRY_ASSIGN_OR_RETURN(m.model, LoadSourceWeights(s, seed, quantize, double_quant));
  if (!s.tokenizer_dir.empty()) {
    FERRY_ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizer(s.tokenizer_dir));
    m.template_source = s.tokenizer_dir;
  } else if (s.config.vocab_size == ByteTokenizer::kVocabSize) {
    m.tokenizer = MakeByteTokenizer();
    m.template_source = "tiny";
  } else {
    return Status::NotFound("--model " + model + " has no tokenizer.json (and its vocabulary of " +
                            std::to_string(s.config.vocab_size) +
                            " is not the built-in byte-level one): add the model's tokenizer.json");
  }
  FERRY_RETURN_IF_ERROR(CheckTokenizer(*m.tokenizer, s));
  return m;
}

}  // namespace ferry
