// HostTensors: a model's fp32 host tensors (master weights, gradients, optimizer moments) in
// ferry's master layout (engine/model/weights_io.h: MasterShape), keyed by the Hugging Face name
// of each storage-owning parameter (tied aliases have no entry).
//
// Plain value type; thread-compatible.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "kernels/nf4.h"

namespace ferry {

struct HostTensors {
  std::map<std::string, std::vector<float>> tensors;
  // Frozen base weights stored in NF4 (ParamSpec::nf4), by Hugging Face name; such a weight has
  // no entry in `tensors`.
  std::map<std::string, Nf4Host> nf4;
  std::span<float> at(const std::string& name) { return tensors.at(name); }
};

}  // namespace ferry
