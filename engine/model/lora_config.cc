#include "engine/model/lora_config.h"

#include <cmath>

namespace ferry {
namespace {

struct TargetName {
  LoraTarget bit;
  std::string_view shortname;
  std::string_view hf_name;
};
constexpr TargetName kTargets[] = {
    {kLoraQ, "q", "q_proj"},          {kLoraK, "k", "k_proj"},          {kLoraV, "v", "v_proj"},
    {kLoraO, "o", "o_proj"},          {kLoraGate, "gate", "gate_proj"}, {kLoraUp, "up", "up_proj"},
    {kLoraDown, "down", "down_proj"},
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<uint32_t> ParseLoraTargets(std::string_view list) {
  uint32_t bits = 0;
  while (true) {
    size_t comma = list.find(',');
    std::string_view item = Trim(list.substr(0, comma));
    if (item == "all") {
      bits |= kLoraAll;
    } else {
      bool found = false;
      for (const TargetName& t : kTargets) {
        if (item == t.shortname || item == t.hf_name) {
          bits |= t.bit;
          found = true;
        }
      }
      if (!found) {
        return Status::InvalidArgument("unknown LoRA target '" + std::string(item) +
                                       "'; use a comma-separated list of q,k,v,o,gate,up,down "
                                       "or all");
      }
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return bits;
}

std::string LoraTargetsToString(uint32_t targets) {
  if ((targets & kLoraAll) == kLoraAll) return "all";
  std::string s;
  for (const TargetName& t : kTargets) {
    if (targets & t.bit) {
      if (!s.empty()) s += ",";
      s += t.shortname;
    }
  }
  return s;
}

Result<BaseQuant> ParseBaseQuant(std::string_view name) {
  if (name == "none") return BaseQuant::kNone;
  if (name == "nf4") return BaseQuant::kNf4;
  if (name == "fp4") {
    return Status::InvalidArgument("--quantize fp4 is not supported yet; use nf4 (QLoRA's format)");
  }
  return Status::InvalidArgument("unknown --quantize '" + std::string(name) + "'; use none or nf4");
}

std::string_view BaseQuantName(BaseQuant q) { return q == BaseQuant::kNf4 ? "nf4" : "none"; }

Status ValidateLoraConfig(const LoraConfig& c) {
  if (c.rank < 0) return Status::InvalidArgument("--lora-rank must be 0 (off) or positive");
  if (!c.enabled()) return Status::Ok();
  if (!(c.alpha > 0) || !std::isfinite(c.alpha)) {
    return Status::InvalidArgument("--lora-alpha must be a positive number");
  }
  if ((c.targets & kLoraAll) == 0) {
    return Status::InvalidArgument("--lora-targets selects no projection; use e.g. q,v or all");
  }
  return Status::Ok();
}

Status ValidateTrainingLora(const LoraConfig& c) {
  FERRY_RETURN_IF_ERROR(ValidateLoraConfig(c));
  if (!c.enabled() && c.rslora) {
    return Status::InvalidArgument(
        "--lora-rslora scales a LoRA adapter; give --lora-rank too, or drop --lora-rslora");
  }
  if (!c.enabled() && c.quantize != BaseQuant::kNone) {
    return Status::InvalidArgument(
        "--quantize " + std::string(BaseQuantName(c.quantize)) +
        " quantizes the frozen base of a LoRA run (QLoRA); give --lora-rank too, or drop "
        "--quantize for full fine-tuning");
  }
  return Status::Ok();
}

}  // namespace ferry
