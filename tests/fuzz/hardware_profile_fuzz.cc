// Fuzzes ParseHardwareProfile with profile JSON. An accepted profile must validate and survive a
// save/load round trip unchanged (HardwareProfileToJson promises ParseHardwareProfile reads it
// back equal).
#include "engine/plan/hardware_profile.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  ferry::Result<ferry::plan::HardwareProfile> p =
      ferry::plan::ParseHardwareProfile(text, "fuzz.json");
  if (!p.ok()) return;
  FERRY_FUZZ_CHECK(ferry::plan::ValidateHardwareProfile(*p).ok());
  const std::string saved = ferry::plan::HardwareProfileToJson(*p);
  ferry::Result<ferry::plan::HardwareProfile> again =
      ferry::plan::ParseHardwareProfile(saved, "saved.json");
  FERRY_FUZZ_CHECK(again.ok());
  FERRY_FUZZ_CHECK(ferry::plan::HardwareProfileToJson(*again) == saved);
}
