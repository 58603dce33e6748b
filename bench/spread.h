// A benchmark figure as this project reports it: the median of its runs, with their min and max.
#pragma once

#include <algorithm>
#include <vector>

#include "engine/probe/device_probe.h"

namespace ferry::bench {

struct Spread {
  double median = 0, min = 0, max = 0;
};

// REQUIRES: `runs` is not empty.
inline Spread SpreadOf(const std::vector<double>& runs) {
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  return {plan::MedianOf(runs), *lo, *hi};
}

}  // namespace ferry::bench
