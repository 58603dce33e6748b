// ferry_interop_tool OUT_DIR: writes every tiny model of engine/testing/tiny_models.h as a
// Hugging Face model folder (OUT_DIR/<name>/model, f32, single file; OUT_DIR/<name>/model_sharded,
// the same in 4 KiB shards), a PEFT LoRA adapter for it (OUT_DIR/<name>/adapter), and ferry's
// logits on the fixed tokens, without and with the adapter (OUT_DIR/<name>/ferry_logits.json).
// scripts/interop_check.py loads these with transformers and peft and compares the logits.
#include <cstdio>
#include <filesystem>

#include "engine/json.h"
#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/testing/tiny_models.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

Status WriteCase(const std::string& out, const testing::TinyModel& m) {
  FERRY_ASSIGN_OR_RETURN(ModelConfig c, ParseHfConfig(m.config_json));
  const std::string dir = out + "/" + m.name;
  const LoraConfig lora = testing::TinyLora();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, lora);
  const HostTensors w = testing::TinyWeights(layers, 2026);
  FERRY_RETURN_IF_ERROR(WriteModelFolder(dir + "/model", c, layers, w));
  FERRY_RETURN_IF_ERROR(
      WriteModelFolder(dir + "/model_sharded", c, layers, w, {.max_shard_bytes = 4096}));
  std::filesystem::create_directories(dir + "/adapter");
  FERRY_RETURN_IF_ERROR(WriteFinalWeights(dir + "/adapter", c, lora, layers, w, false));
  FERRY_ASSIGN_OR_RETURN(std::vector<float> base,
                         testing::TinyLogits(c, LoraConfig{}, w, testing::TinyTokens()));
  FERRY_ASSIGN_OR_RETURN(std::vector<float> adapted,
                         testing::TinyLogits(c, lora, w, testing::TinyTokens()));
  nlohmann::json j = {{"tokens", testing::TinyTokens()},
                      {"vocab_size", c.vocab_size},
                      {"logits", base},
                      {"lora_logits", adapted}};
  return WriteTextFile(dir + "/ferry_logits.json", j.dump() + "\n");
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ferry_interop_tool OUT_DIR\n");
    return 2;
  }
  for (const ferry::testing::TinyModel& m : ferry::testing::kTinyModels) {
    ferry::Status s = ferry::WriteCase(argv[1], m);
    if (!s.ok()) {
      std::fprintf(stderr, "ferry_interop_tool: %s: %s\n", m.name, s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
