#include "offload/transfer_scheduler.h"

namespace ferry {

std::string_view TransferPriorityName(TransferPriority p) {
  switch (p) {
    case TransferPriority::kActivationNow: return "activation-now";
    case TransferPriority::kNextWeights: return "next-weights";
    case TransferPriority::kGradientOut: return "gradient-out";
    case TransferPriority::kSpill: return "spill";
  }
  return "unknown";
}

}  // namespace ferry
