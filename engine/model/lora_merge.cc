#include "engine/model/lora_merge.h"

#include <map>
#include <span>
#include <string_view>

#include "engine/model/weights_io.h"
#include "kernels/cpu/blas.h"

namespace ferry {
namespace {

// One projection's adapter: A (rank, in) and B (out, rank), fp32.
struct Adapter {
  std::span<const float> a, b;
  int64_t rank = 0;
};

}  // namespace

Result<MergeSummary> WriteMergedModelFolder(const std::string& dir, const LoadedModel& m,
                                            const ModelFolderWriteOptions& options) {
  if (!m.lora.enabled()) {
    return Status::InvalidArgument("the model has no LoRA adapter to merge");
  }
  if (options.adjust) return Status::InvalidArgument("a merge sets the write's adjust itself");
  FERRY_RETURN_IF_ERROR(cpu::CpuBlas::Load().status());
  constexpr std::string_view kA = ".lora_A.weight", kB = ".lora_B.weight";
  // The adapters by the name of the base weight they change ("model.layers.0.self_attn.q_proj
  // .weight" for "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
  std::map<std::string, Adapter, std::less<>> adapters;
  for (const LayerSpec& layer : m.layers) {
    for (const ParamSpec& p : layer.params) {
      if (!p.lora || !p.name.ends_with(kA) || !p.name.starts_with(kPeftPrefix)) continue;
      const std::string module =
          p.name.substr(kPeftPrefix.size(), p.name.size() - kPeftPrefix.size() - kA.size());
      const std::string b_name = std::string(kPeftPrefix) + module + std::string(kB);
      auto a = m.weights.tensors.find(p.name);
      auto b = m.weights.tensors.find(b_name);
      if (a == m.weights.tensors.end() || b == m.weights.tensors.end()) {
        return Status::InvalidArgument("the adapter lacks '" +
                                       (a == m.weights.tensors.end() ? p.name : b_name) + "'");
      }
      adapters[module + ".weight"] = {a->second, b->second, p.shape[0]};
    }
  }
  const float scaling = float(m.lora.scaling());
  MergeSummary summary;
  ModelFolderWriteOptions write = options;
  write.adjust = [&](const ParamSpec& p, std::span<const float> values,
                     std::vector<float>& scratch) -> Result<std::span<const float>> {
    ++summary.tensors;
    auto it = adapters.find(p.name);
    if (it == adapters.end()) return values;            // stored as loaded, with no copy
    const std::vector<int64_t> shape = MasterShape(p);  // (out, in)
    const Adapter& ad = it->second;
    if (shape.size() != 2 || ad.a.size() != size_t(ad.rank * shape[1]) ||
        ad.b.size() != size_t(shape[0] * ad.rank) || values.size() != size_t(shape[0] * shape[1])) {
      return Status::InvalidArgument("the adapter of '" + p.name + "' does not fit its weight of " +
                                     ShapeToString(shape) + " (out, in)");
    }
    // W (out, in) + scaling * B (out, r) A (r, in), in fp32.
    scratch.assign(values.begin(), values.end());
    const int out = int(shape[0]), in = int(shape[1]), r = int(ad.rank);
    cpu::Blas().Sgemm(false, false, out, in, r, scaling, ad.b.data(), r, ad.a.data(), in, 1.0f,
                      scratch.data(), in);
    ++summary.projections;
    return std::span<const float>(scratch);
  };
  FERRY_RETURN_IF_ERROR(WriteModelFolder(dir, m.config, m.layers, m.weights, write));
  if (summary.projections != int64_t(adapters.size())) {
    return Status::InvalidArgument("the adapter holds " + std::to_string(adapters.size()) +
                                   " projections, of which " + std::to_string(summary.projections) +
                                   " name a weight of the model");
  }
  return summary;
}

}  // namespace ferry
