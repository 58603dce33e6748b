#include "engine/job/lr_decay.h"

#include <string>

namespace ferry {

namespace {
constexpr std::pair<LrDecay, std::string_view> kLrDecayNames[] = {
    {LrDecay::kCosine, "cosine"}, {LrDecay::kLinear, "linear"}, {LrDecay::kConstant, "constant"}};
}  // namespace

std::string_view LrDecayName(LrDecay d) {
  for (auto [decay, name] : kLrDecayNames) {
    if (decay == d) return name;
  }
  return "cosine";
}

Result<LrDecay> ParseLrDecay(std::string_view name) {
  for (auto [decay, known] : kLrDecayNames) {
    if (known == name) return decay;
  }
  return Status::InvalidArgument("--lr-schedule '" + std::string(name) +
                                 "' is not one of cosine, linear, constant");
}

}  // namespace ferry
