// Test helper: one PyTorch golden (tests/goldens/<name>/, see scripts/make_goldens.py) opened as
// a whole — its config, sidecar JSON and safetensors files — for the layer and trainer tests.
//
// For "llama_lora" and "llama_qlora" the base weights and config are the llama golden's, and
// `adapter` holds PEFT's adapter_model.safetensors (the initial A and B); for the others `adapter`
// is empty. llama_qlora's block projections are NF4 (GoldenLora; bitsandbytes quantized them on
// the CPU, so with the nearest code: kNf4GoldenRounding).
#pragma once

#include <string>
#include <string_view>

#include "engine/json.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/testing/golden_files.h"

namespace ferry::testing {

struct GoldenModel {
  std::string name;
  ModelConfig config;
  nlohmann::json info;            // golden.json
  SafetensorsFile weights;        // initial weights, Hugging Face names (tied copies dropped)
  SafetensorsFile adapter;        // LoRA goldens only: initial A and B (PEFT names)
  SafetensorsFile io;             // input_ids, targets (already shifted, -100 masked), logits
  SafetensorsFile grads;          // d loss / d trainable parameter at the initial weights
  SafetensorsFile final_weights;  // trainable parameters after all the AdamW steps

  static Result<GoldenModel> Load(std::string_view name) {
    GoldenModel g;
    g.name = std::string(name);
    const bool lora = name == "llama_lora" || name == "llama_qlora";
    const std::string base = lora ? "llama" : g.name;
    FERRY_ASSIGN_OR_RETURN(g.config, LoadHfConfig(GoldenPath(base, "config.json")));
    g.info = GoldenJson(name);
    if (g.info.is_discarded()) {
      return Status::NotFound("cannot read " + GoldenPath(name, "golden.json"));
    }
    FERRY_ASSIGN_OR_RETURN(g.weights, SafetensorsFile::Open(GoldenPath(base, "model.safetensors")));
    if (lora) {
      FERRY_ASSIGN_OR_RETURN(g.adapter,
                             SafetensorsFile::Open(GoldenPath(name, "adapter_model.safetensors")));
    }
    FERRY_ASSIGN_OR_RETURN(g.io, SafetensorsFile::Open(GoldenPath(name, "io.safetensors")));
    FERRY_ASSIGN_OR_RETURN(g.grads, SafetensorsFile::Open(GoldenPath(name, "grads.safetensors")));
    FERRY_ASSIGN_OR_RETURN(g.final_weights,
                           SafetensorsFile::Open(GoldenPath(name, "final.safetensors")));
    return g;
  }
};

}  // namespace ferry::testing
