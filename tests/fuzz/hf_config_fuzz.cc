// Fuzzes ParseHfConfig with config.json text. An accepted config must validate, and what ferry
// writes for it (ToHfConfigJson) must read back to the same config.json.
#include "engine/json.h"
#include "engine/model/model_config.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  ferry::Result<ferry::ModelConfig> c = ferry::ParseHfConfig(text);
  if (!c.ok()) return;
  FERRY_FUZZ_CHECK(ferry::ValidateModelConfig(*c).ok());
  const nlohmann::json written = ferry::ToHfConfigJson(*c);
  ferry::Result<ferry::ModelConfig> again = ferry::ParseHfConfig(written.dump());
  FERRY_FUZZ_CHECK(again.ok());
  FERRY_FUZZ_CHECK(ferry::ToHfConfigJson(*again) == written);
}
