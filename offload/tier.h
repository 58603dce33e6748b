// Tier: where a group of tensors lives between its uses — host RAM (offload/host_pool.h) or the
// NVMe store (offload/nvme_store.h). The planner chooses one per tensor group (saved activations,
// optimizer state, frozen weights); the plan names it.
#pragma once

#include <string_view>

namespace ferry {

enum class Tier { kHost, kNvme };

// "host", "nvme" (the names plans print and write).
constexpr std::string_view TierName(Tier t) { return t == Tier::kHost ? "host" : "nvme"; }

}  // namespace ferry
