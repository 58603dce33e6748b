#include "kernels/nf4.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace ferry {
namespace {

constexpr int kDynamicCodes = 256;
constexpr int kLutBins = 65536;  // bitsandbytes' CPU lookup table for 8-bit codes (cpu_ops.cpp)
// bitsandbytes clamps absmax to this before dividing by it on the CPU (default quantize_4bit).
constexpr float kMinCpuAbsmax = 1e-38f;

int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// bitsandbytes' CUDA tree dQuantizeNF4 (csrc/kernels.cu): the same comparisons in the same order,
// t[q] = kNf4Thresholds[q] deciding between codes q and q + 1 (a value on one goes down). A NaN
// fails every comparison and lands on code 0.
uint8_t TreeNf4(float x) {
  const float* t = kNf4Thresholds;
  if (x > t[7]) {
    if (x > t[11]) {
      if (x > t[13]) return x > t[14] ? 15 : 14;
      return x > t[12] ? 13 : 12;
    }
    if (x > t[9]) return x > t[10] ? 11 : 10;
    return x > t[8] ? 9 : 8;
  }
  if (x > t[3]) {
    if (x > t[5]) return x > t[6] ? 7 : 6;
    return x > t[4] ? 5 : 4;
  }
  if (x > t[1]) return x > t[2] ? 3 : 2;
  return x > t[0] ? 1 : 0;
}

// torch.bucketize(x, mids) (right=False): the number of midpoints strictly below x, i.e. the
// nearest code with a value on a midpoint going to the lower one.
uint8_t Bucketize(std::span<const float> mids, float x) {
  return uint8_t(std::lower_bound(mids.begin(), mids.end(), x) - mids.begin());
}

// fp32 midpoints (code[i] + code[i+1]) / 2 of a sorted code table.
std::vector<float> Midpoints(std::span<const float> code) {
  std::vector<float> mids(code.size() - 1);
  for (size_t i = 0; i + 1 < code.size(); ++i) mids[i] = (code[i] + code[i + 1]) / 2.0f;
  return mids;
}

// bitsandbytes' CUDA dQuantize<0> (csrc/kernels.cu): a binary search of the 256 sorted codes
// from pivot 127, then the nearer of the last two by their fp32 midpoint.
uint8_t SearchDynamic(std::span<const float> code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) return uint8_t(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return uint8_t(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// bitsandbytes' CPU lookup table (cpu_ops.cpp, build_quantize_lut): bin i covers the value
// -1 + 2i / 65535 and holds the number of code midpoints below it.
std::vector<uint8_t> BuildLut(std::span<const float> code) {
  std::vector<float> mids(code.size() - 1);
  for (size_t i = 0; i + 1 < code.size(); ++i) mids[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<uint8_t> lut(kLutBins);
  size_t c = 0;
  for (int i = 0; i < kLutBins; ++i) {
    const float v = -1.0f + (2.0f * float(i)) / float(kLutBins - 1);
    while (c < mids.size() && mids[c] < v) ++c;
    lut[size_t(i)] = uint8_t(c);
  }
  return lut;
}

// cpu_ops.cpp's norm_to_lut_index: the bin of a value in [-1, 1], rounded half up.
size_t LutBin(float v) {
  v = std::clamp(v, -1.0f, 1.0f);
  return size_t(uint16_t((v + 1.0f) * 0.5f * float(kLutBins - 1) + 0.5f));
}

// `who` names what failed: "nf4 weight 'NAME'" for ValidateNf4, the function otherwise.
Status Bad(const std::string& who, const std::string& what) {
  return Status::InvalidArgument(who + ": " + what);
}

Status CheckFinite(const std::string& name, const char* part, std::span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return Bad(name, std::string(part) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                           " is not finite");
    }
  }
  return Status::Ok();
}

Status CheckSize(const std::string& name, const char* part, size_t got, int64_t want,
                 const std::string& why) {
  if (int64_t(got) == want) return Status::Ok();
  return Bad(name, std::string(part) + " has " + std::to_string(got) + " entries, " + why +
                       " needs " + std::to_string(want));
}

Status CheckShapeAndBlock(const std::string& name, const std::vector<int64_t>& shape,
                          int64_t block) {
  if (shape.empty()) return Bad(name, "the shape is empty (rank 0)");
  for (int64_t d : shape) {
    if (d <= 0) return Bad(name, "shape " + ShapeText(shape) + " has a dimension <= 0");
  }
  if (block <= 0 || block % 2 != 0) {
    return Bad(name, "block size " + std::to_string(block) +
                         " is not supported: it must be positive and even (two codes a byte)");
  }
  return Status::Ok();
}

}  // namespace

int64_t Nf4Host::numel() const { return ShapeNumel(shape); }

size_t Nf4Host::StoredBytes() const {
  return Nf4StoredBytes(numel(), nested(), block, nested_block);
}

size_t Nf4StoredBytes(int64_t numel, bool nested, int64_t block, int64_t nested_block) {
  assert(numel >= 0 && block > 0 && nested_block > 0);
  const int64_t blocks = CeilDiv(numel, block);
  const size_t packed = size_t((numel + 1) / 2);
  if (!nested) return packed + size_t(blocks) * sizeof(float);
  // One byte a block, an fp32 absmax a nested block, and the offset.
  return packed + size_t(blocks) + size_t(CeilDiv(blocks, nested_block)) * sizeof(float) +
         sizeof(float);
}

std::vector<float> DynamicMap8() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i = 0..6,
  // 2^i fractions: the means of neighbours of torch.linspace(0.1, 1, 2^i + 1) in fp32, scaled
  // by float(10^(i - 6)) in fp32, with both signs; then 0 and 1; sorted ascending. torch's
  // linspace computes start + step * k (k < half) or end - step * (steps - 1 - k) with an fp32
  // step and one rounding each (an fma).
  std::vector<float> data;
  data.reserve(kDynamicCodes);
  for (int i = 0; i < 7; ++i) {
    const int steps = (1 << i) + 1;
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / float(steps - 1);
    std::vector<float> bounds(static_cast<size_t>(steps));
    for (int k = 0; k < steps; ++k) {
      bounds[size_t(k)] = k < steps / 2 ? std::fma(step, float(k), start)
                                        : std::fma(-step, float(steps - 1 - k), end);
    }
    const float scale = float(std::pow(10.0, double(i - 6)));
    for (int k = 0; k + 1 < steps; ++k) {
      const float mean = (bounds[size_t(k)] + bounds[size_t(k) + 1]) / 2.0f;
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  assert(data.size() == size_t(kDynamicCodes));
  std::sort(data.begin(), data.end());
  return data;
}

Result<Nf4Host> QuantizeNf4(std::span<const float> x, std::vector<int64_t> shape, bool nested,
                            Nf4Rounding rounding, int64_t block) {
  const std::string name = "QuantizeNf4";
  FERRY_RETURN_IF_ERROR(CheckShapeAndBlock(name, shape, block));
  const int64_t n = ShapeNumel(shape);
  if (int64_t(x.size()) != n) {
    return Bad(name, std::to_string(x.size()) + " values given for shape " + ShapeText(shape) +
                         " (" + std::to_string(n) + " elements)");
  }
  FERRY_RETURN_IF_ERROR(CheckFinite(name, "x", x));

  Nf4Host w;
  w.shape = std::move(shape);
  w.block = block;
  w.code.assign(std::begin(kNf4Code), std::end(kNf4Code));
  const std::vector<float> mids = Midpoints(w.code);
  const int64_t blocks = CeilDiv(n, block);
  w.absmax.resize(size_t(blocks));
  std::vector<uint8_t> q(size_t(n + 1) / 2 * 2);  // one code an element, plus the padding one
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float absmax = 0.0f;
    for (int64_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
    // The padding element (a zero after the last one) belongs to the last block.
    const int64_t stop = b + 1 == blocks ? int64_t(q.size()) : end;
    if (rounding == Nf4Rounding::kThresholdTree) {
      const float scale = 1.0f / absmax;  // inf for a zero block: its codes become 0 (NaN)
      for (int64_t i = begin; i < stop; ++i) {
        q[size_t(i)] = TreeNf4((i < end ? x[size_t(i)] : 0.0f) * scale);
      }
      w.absmax[size_t(b)] = absmax;
      continue;
    }
    const float clamped = std::max(absmax, kMinCpuAbsmax);
    const bool short_last = end - begin < block;
    const float scale = 1.0f / clamped;
    for (int64_t i = begin; i < end; ++i) {
      const float v = short_last ? x[size_t(i)] / clamped : x[size_t(i)] * scale;
      q[size_t(i)] = Bucketize(mids, std::clamp(v, -1.0f, 1.0f));
    }
    for (int64_t i = end; i < stop; ++i) q[size_t(i)] = Bucketize(mids, 0.0f);  // padded scaled
    w.absmax[size_t(b)] = short_last ? clamped : absmax;
  }
  w.packed.resize(q.size() / 2);
  for (size_t i = 0; i < w.packed.size(); ++i) {
    w.packed[i] = uint8_t(q[2 * i] << 4 | q[2 * i + 1]);
  }
  if (nested) {
    double sum = 0;
    for (float a : w.absmax) sum += a;
    FERRY_RETURN_IF_ERROR(NestNf4Absmax(&w, float(sum / double(w.absmax.size())), rounding));
  }
  return w;
}

Status NestNf4Absmax(Nf4Host* w, float offset, Nf4Rounding rounding) {
  const std::string name = "NestNf4Absmax";
  if (w->nested()) return Bad(name, "absmax is already nested");
  if (w->nested_block <= 0) {
    return Bad(name, "nested block size " + std::to_string(w->nested_block) + " is not positive");
  }
  FERRY_RETURN_IF_ERROR(CheckFinite(name, "absmax", w->absmax));
  if (!std::isfinite(offset)) return Bad(name, "nested_offset is not finite");

  const std::vector<float> code = DynamicMap8();
  const std::vector<uint8_t> lut =
      rounding == Nf4Rounding::kNearest ? BuildLut(code) : std::vector<uint8_t>();
  const int64_t blocks = int64_t(w->absmax.size());
  const int64_t nb = w->nested_block;
  w->absmax_q.assign(size_t(blocks), 0);
  w->nested_absmax.assign(size_t(CeilDiv(blocks, nb)), 0.0f);
  for (int64_t g = 0; g * nb < blocks; ++g) {
    const int64_t begin = g * nb, end = std::min(blocks, begin + nb);
    float amax = 0.0f;
    for (int64_t b = begin; b < end; ++b) {
      amax = std::max(amax, std::fabs(w->absmax[size_t(b)] - offset));
    }
    w->nested_absmax[size_t(g)] = amax;
    // CUDA: a zero block gives NaN, which the search sends to index 0; the CPU stores 0 too.
    if (rounding == Nf4Rounding::kNearest && amax == 0.0f) continue;
    const float scale = 1.0f / amax;
    for (int64_t b = begin; b < end; ++b) {
      const float v = (w->absmax[size_t(b)] - offset) * scale;
      w->absmax_q[size_t(b)] =
          rounding == Nf4Rounding::kNearest ? lut[LutBin(v)] : SearchDynamic(code, v);
    }
  }
  w->nested_code = code;
  w->nested_offset = offset;
  w->absmax.clear();
  return Status::Ok();
}

Status ValidateNf4(const Nf4Host& w, const std::string& tensor) {
  const std::string name = "nf4 weight '" + tensor + "'";
  FERRY_RETURN_IF_ERROR(CheckShapeAndBlock(name, w.shape, w.block));
  const int64_t n = w.numel(), blocks = w.blocks();
  const std::string of_shape = "shape " + ShapeText(w.shape) + " (" + std::to_string(n) +
                               " elements) in blocks of " + std::to_string(w.block);
  FERRY_RETURN_IF_ERROR(CheckSize(name, "code", w.code.size(), 16, "the 4-bit map"));
  FERRY_RETURN_IF_ERROR(CheckFinite(name, "code", w.code));
  FERRY_RETURN_IF_ERROR(CheckSize(name, "packed", w.packed.size(), (n + 1) / 2,
                                  "shape " + ShapeText(w.shape) + " (two codes a byte)"));
  if (!w.nested()) {
    if (!w.nested_absmax.empty() || !w.nested_code.empty()) {
      return Bad(name, "nested_absmax or nested_code is given but absmax_q is empty");
    }
    FERRY_RETURN_IF_ERROR(CheckSize(name, "absmax", w.absmax.size(), blocks, of_shape));
    return CheckFinite(name, "absmax", w.absmax);
  }
  if (!w.absmax.empty()) {
    return Bad(name, "both absmax (" + std::to_string(w.absmax.size()) + ") and absmax_q (" +
                         std::to_string(w.absmax_q.size()) + ") are given; a nested weight " +
                         "keeps absmax_q only");
  }
  if (w.nested_block <= 0) {
    return Bad(name, "nested block size " + std::to_string(w.nested_block) + " is not positive");
  }
  FERRY_RETURN_IF_ERROR(CheckSize(name, "absmax_q", w.absmax_q.size(), blocks, of_shape));
  FERRY_RETURN_IF_ERROR(CheckSize(
      name, "nested_absmax", w.nested_absmax.size(), CeilDiv(blocks, w.nested_block),
      std::to_string(blocks) + " blocks in nested blocks of " + std::to_string(w.nested_block)));
  FERRY_RETURN_IF_ERROR(
      CheckSize(name, "nested_code", w.nested_code.size(), kDynamicCodes, "the 8-bit dynamic map"));
  FERRY_RETURN_IF_ERROR(CheckFinite(name, "nested_code", w.nested_code));
  FERRY_RETURN_IF_ERROR(CheckFinite(name, "nested_absmax", w.nested_absmax));
  if (!std::isfinite(w.nested_offset)) return Bad(name, "nested_offset is not finite");
  return Status::Ok();
}

std::vector<float> Nf4Absmax(const Nf4Host& w) {
  if (!w.nested()) return w.absmax;
  std::vector<float> absmax(w.absmax_q.size());
  for (size_t b = 0; b < absmax.size(); ++b) {
    absmax[b] = Nf4NestedAbsmax(w.nested_code[w.absmax_q[b]],
                                w.nested_absmax[b / size_t(w.nested_block)], w.nested_offset);
  }
  return absmax;
}

void DequantizeNf4(const Nf4Host& w, DType out_dtype, void* out) {
  assert(out_dtype == DType::kF32 || out_dtype == DType::kBF16 || out_dtype == DType::kF16);
  const std::vector<float> absmax = Nf4Absmax(w);
  const int64_t n = w.numel();
  auto fill = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
    for (int64_t i = 0; i < n; ++i) {
      const float v = Nf4Value(w.code[Nf4Nibble(w.packed.data(), i)], absmax[size_t(i / w.block)]);
      dst[i] = FromFloat<T>(v);
    }
  };
  switch (out_dtype) {
    case DType::kBF16:
      return fill(static_cast<bf16*>(out));
    case DType::kF16:
      return fill(static_cast<f16*>(out));
    default:
      return fill(static_cast<float*>(out));
  }
}

}  // namespace ferry
