#include "kernels/ops/dispatch.h"

#include <string>

namespace ferry {

Status NotOnDevice(const Device& d, std::string_view op) {
  return Status::Unavailable("op '" + std::string(op) + "' has no implementation on device '" +
                             d.name() + "' yet");
}

}  // namespace ferry
