#include "engine/model/weights_io.h"

#include <cassert>
#include <cmath>
#include <numbers>

#include "engine/model/counter_rng.h"

namespace ferry {
namespace {

bool IsNormWeight(const ParamSpec& p) { return p.shape.size() == 1 && !p.name.ends_with(".bias"); }

// out (cols, rows) = in (rows, cols) transposed.
void Transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

}  // namespace

std::vector<int64_t> MasterShape(const ParamSpec& p) {
  if (p.transposed) return {p.shape[1], p.shape[0]};
  return p.shape;
}

Status LoadParameter(const SafetensorsFile& file, const ParamSpec& p, std::span<float> out) {
  assert(out.size() == size_t(p.numel()) && p.tied_to.empty());
  FERRY_ASSIGN_OR_RETURN(std::vector<float> stored, file.ReadFloats(p.name, &p.shape));
  if (p.transposed) {
    Transpose(stored.data(), p.shape[0], p.shape[1], out.data());
  } else {
    std::copy(stored.begin(), stored.end(), out.begin());
  }
  return Status::Ok();
}

void AddParameter(SafetensorsWriter& writer, const ParamSpec& p, std::span<const float> values,
                  DType dtype) {
  assert(values.size() == size_t(p.numel()));
  if (!p.transposed) {
    writer.Add(p.name, p.shape, values, dtype);
    return;
  }
  std::vector<float> stored(values.size());
  const std::vector<int64_t> master = MasterShape(p);
  Transpose(values.data(), master[0], master[1], stored.data());
  writer.Add(p.name, p.shape, stored, dtype);
}

void InitParameter(const ParamSpec& p, uint64_t seed, std::span<float> out, double std) {
  assert(out.size() == size_t(p.numel()));
  const uint64_t key = Mix64(seed ^ Mix64(HashString(p.name)));
  if (p.lora && p.name.find(".lora_B.") != std::string::npos) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  if (p.lora) {  // A (r, in)
    const double bound = 1.0 / std::sqrt(double(p.shape[1]));
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = float((2.0 * UniformOpen01(Mix64(key ^ uint64_t(i))) - 1.0) * bound);
    }
    return;
  }
  if (p.shape.size() == 1) {
    std::fill(out.begin(), out.end(), IsNormWeight(p) ? 1.0f : 0.0f);
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) {  // Box-Muller, one normal per element
    const double u1 = UniformOpen01(Mix64(key ^ (2 * uint64_t(i))));
    const double u2 = UniformOpen01(Mix64(key ^ (2 * uint64_t(i) + 1)));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    out[i] = float(z * std);
  }
}

}  // namespace ferry
