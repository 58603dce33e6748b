#include "engine/model/weights_io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cmath>
#include <cstring>
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

Result<FileTensor> ServeParameter(std::shared_ptr<const void> owner, const SafetensorsFile& file,
                                  const ParamSpec& p) {
  assert(p.tied_to.empty());
  FERRY_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, file.GetShaped(p.name, p.shape));
  FileTensor t;
  t.shape = p.shape;
  t.transposed = p.transposed;
  t.path = file.path();
  switch (info->dtype) {
    case SafetensorsDType::kF32:
      t.dtype = DType::kF32;
      break;
    case SafetensorsDType::kBF16:
      t.dtype = DType::kBF16;
      break;
    case SafetensorsDType::kF16:
      t.dtype = DType::kF16;
      break;
    case SafetensorsDType::kF64:
      return t;  // no bytes: read into fp32 instead
    default:
      return Status::InvalidArgument("tensor '" + info->name + "' in " + file.path() + " is " +
                                     std::string(SafetensorsDTypeName(info->dtype)) +
                                     ", not a floating-point dtype");
  }
  t.owner = std::move(owner);
  t.bytes = file.Data(*info);
  t.offset = int64_t(info->offset);
  t.identity = file.identity();
  return t;
}

void ConvertStored(DType stored, const std::byte* src, size_t n, DType dtype, std::byte* dst) {
  if (dtype == stored) {
    std::memcpy(dst, src, n * DTypeSize(stored));
    return;
  }
  if (dtype == DType::kF32) {  // the bytes may sit at any byte: ConvertToFloat allows it
    ConvertToFloat(stored, src, reinterpret_cast<float*>(dst), n);
    return;
  }
  // Through fp32 in pieces.
  const size_t in = DTypeSize(stored), out = DTypeSize(dtype);
  constexpr size_t kPiece = 2048;
  float f32[kPiece];
  for (size_t i = 0; i < n; i += kPiece) {
    const size_t k = std::min(kPiece, n - i);
    ConvertToFloat(stored, src + i * in, f32, k);
    ConvertFromFloat(f32, dtype, dst + i * out, k);
  }
}

void ConvertFileRange(const FileTensor& t, int64_t begin, int64_t end, DType dtype,
                      std::byte* dst) {
  assert(!t.transposed && 0 <= begin && begin <= end && end <= t.numel());
  ConvertStored(t.dtype, t.bytes.data() + size_t(begin) * DTypeSize(t.dtype), size_t(end - begin),
                dtype, dst);
}

void ReadFileTensor(const FileTensor& t, std::span<float> out) {
  assert(out.size() == size_t(t.numel()));
  if (!t.transposed) {
    ConvertFileRange(t, 0, t.numel(), DType::kF32, reinterpret_cast<std::byte*>(out.data()));
    return;
  }
  FileTensor plain = t;
  plain.transposed = false;
  std::vector<float> stored(out.size());
  ConvertFileRange(plain, 0, t.numel(), DType::kF32, reinterpret_cast<std::byte*>(stored.data()));
  Transpose(stored.data(), t.shape[0], t.shape[1], out.data());
}

Status ReadFileTensor(const FileTensor& t, BaseFileReader& reader, std::span<float> out) {
  assert(out.size() == size_t(t.numel()));
  std::vector<float> stored(t.transposed ? out.size() : 0);
  float* to = t.transposed ? stored.data() : out.data();
  FERRY_RETURN_IF_ERROR(
      reader.Read(t, [&](std::span<const std::byte> bytes, int64_t first, int64_t n) {
        ConvertStored(t.dtype, bytes.data(), size_t(n), DType::kF32,
                      reinterpret_cast<std::byte*>(to + first));
        return Status::Ok();
      }));
  if (t.transposed) Transpose(stored.data(), t.shape[0], t.shape[1], out.data());
  return Status::Ok();
}

void ReleaseFilePages(const FileTensor& t) { ReleaseMappedPages(t.bytes); }

void ReleaseMappedPages(std::span<const std::byte> bytes) {
  static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::span<const float> CheckpointLayout(const ParamSpec& p, std::span<const float> values,
                                        std::vector<float>& scratch) {
  assert(values.size() == size_t(p.numel()));
  if (!p.transposed) return values;
  scratch.resize(values.size());
  const std::vector<int64_t> master = MasterShape(p);
  Transpose(values.data(), master[0], master[1], scratch.data());
  return scratch;
}

void AddParameter(SafetensorsWriter& writer, const ParamSpec& p, std::span<const float> values,
                  DType dtype) {
  std::vector<float> scratch;
  writer.Add(p.name, p.shape, CheckpointLayout(p, values, scratch), dtype);
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
