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

namespace ferry {

struct HostTensors {
  std::map<std::string, std::vector<float>> tensors;
  std::span<float> at(const std::string& name) { return tensors.at(name); }
};

}  // namespace ferry
