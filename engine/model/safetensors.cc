#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "engine/json.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

using nlohmann::json;

// The Python library refuses headers above 100 MB; so do we (a corrupt length is caught here).

struct DTypeRow {
  SafetensorsDType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {SafetensorsDType::kF64, "F64", 8}, {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF16, "F16", 2}, {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI64, "I64", 8}, {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kI16, "I16", 2}, {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kU8, "U8", 1},   {SafetensorsDType::kBool, "BOOL", 1},
};

Status Bad(std::string_view what, std::string_view tensor, std::string_view problem) {
  std::string msg = "safetensors file " + std::string(what);
  if (!tensor.empty()) msg += ", tensor '" + std::string(tensor) + "'";
  msg += ": " + std::string(problem) + " (the file is damaged or not a safetensors file)";
  return Status::Corruption(std::move(msg));
}

// A non-negative integer that fits in int64/size_t, or an error.
bool AsCount(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return *out <= uint64_t(std::numeric_limits<int64_t>::max());
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = uint64_t(i);
    return true;
  }
  return false;
}

Result<SafetensorsTensorInfo> ParseEntry(const std::string& name, const json& v, size_t data_begin,
                                         size_t data_bytes, std::string_view what) {
  if (name.empty()) return Bad(what, name, "empty tensor name");
  if (!v.is_object()) return Bad(what, name, "entry is not a JSON object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto of = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return Bad(what, name, "missing or non-string 'dtype'");
  if (sh == v.end() || !sh->is_array()) return Bad(what, name, "missing or non-array 'shape'");
  if (of == v.end() || !of->is_array() || of->size() != 2) {
    return Bad(what, name, "'data_offsets' must be an array [begin, end]");
  }
  SafetensorsTensorInfo info;
  info.name = name;
  Result<SafetensorsDType> type = ParseSafetensorsDType(dt->get_ref<const std::string&>());
  if (!type.ok()) {
    return Status::InvalidArgument("safetensors file " + std::string(what) + ", tensor '" + name +
                                   "': " + type.status().message());
  }
  info.dtype = *type;
  // The byte size of the non-zero dimensions must fit int64 even when another dimension is 0, so
  // that every partial product (numel(), a caller's loop over the shape) stays in range.
  uint64_t bytes = SafetensorsDTypeSize(info.dtype);
  bool empty = false;
  for (const json& d : *sh) {
    uint64_t n;
    if (!AsCount(d, &n)) return Bad(what, name, "shape entries must be non-negative integers");
    info.shape.push_back(int64_t(n));
    if (n == 0) {
      empty = true;
    } else if (bytes > uint64_t(std::numeric_limits<int64_t>::max()) / n) {
      return Bad(what, name, "shape " + ShapeToString(info.shape) + "... overflows");
    } else {
      bytes *= n;
    }
  }
  if (empty) bytes = 0;
  uint64_t begin, end;
  if (!AsCount((*of)[0], &begin) || !AsCount((*of)[1], &end) || begin > end) {
    return Bad(what, name, "data_offsets must be non-negative integers with begin <= end");
  }
  if (end > data_bytes) {
    return Bad(what, name,
               "data ends at byte " + std::to_string(end) + " of a data section of " +
                   std::to_string(data_bytes) + " bytes");
  }
  if (end - begin != bytes) {
    return Bad(what, name,
               "data_offsets span " + std::to_string(end - begin) + " bytes but dtype " +
                   std::string(SafetensorsDTypeName(info.dtype)) + " and shape " +
                   ShapeToString(info.shape) + " need " + std::to_string(bytes));
  }
  info.offset = data_begin + size_t(begin);
  info.bytes = size_t(bytes);
  return info;
}

}  // namespace

std::string_view SafetensorsDTypeName(SafetensorsDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.type == t) return r.name;
  return "?";
}

size_t SafetensorsDTypeSize(SafetensorsDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.type == t) return r.size;
  return 0;
}

Result<SafetensorsDType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (r.name == name) return r.type;
  return Status::InvalidArgument(
      "unsupported dtype '" + std::string(name) +
      "' (ferry reads F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
}

SafetensorsDType ToSafetensorsDType(DType t) {
  switch (t) {
    case DType::kF32:
      return SafetensorsDType::kF32;
    case DType::kBF16:
      return SafetensorsDType::kBF16;
    case DType::kF16:
      return SafetensorsDType::kF16;
    case DType::kI32:
      return SafetensorsDType::kI32;
    case DType::kU8:
      return SafetensorsDType::kU8;
  }
  return SafetensorsDType::kF32;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                 std::string_view what) {
  return ParseSafetensorsHeader(file, file.size(), what);
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> head, size_t file_size,
                                                 std::string_view what) {
  if (file_size < 8 || head.size() < 8) {
    return Bad(what, "", "shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint64_t(head[size_t(i)]);  // little-endian
  if (n > kSafetensorsMaxHeaderBytes)
    return Bad(what, "", "header length " + std::to_string(n) + " too large");
  if (n > file_size - 8) {
    return Bad(what, "",
               "header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes)");
  }
  if (n > head.size() - 8) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(head.size()) +
                                   " bytes given for a header of " + std::to_string(n));
  }
  const char* text = reinterpret_cast<const char*>(head.data() + 8);
  json root = json::parse(text, text + n, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad(what, "", "header is not well-formed JSON");
  if (!root.is_object()) return Bad(what, "", "header is not a JSON object");

  SafetensorsHeader header;
  header.data_begin = 8 + size_t(n);
  const size_t data_bytes = file_size - header.data_begin;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Bad(what, "", "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Bad(what, "", "__metadata__ value '" + m.key() + "' is not a string");
        header.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(SafetensorsTensorInfo info,
                           ParseEntry(it.key(), *it, header.data_begin, data_bytes, what));
    header.tensors.push_back(std::move(info));
  }
  // No two ranges may overlap (empty tensors occupy nothing).
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : header.tensors)
    if (t.bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes) {
      return Bad(what, by_offset[i]->name, "data overlaps tensor '" + by_offset[i - 1]->name + "'");
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return header;
}

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() { Release(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      identity_(o.identity_),
      map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      header_(std::move(o.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    identity_ = o.identity_;
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    header_ = std::move(o.header_);
  }
  return *this;
}

void SafetensorsFile::Release() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);
  map_ = nullptr;
  size_ = 0;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "stat " + path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + " is not a regular file");
  }
  SafetensorsFile f;
  f.path_ = path;
  f.identity_ = IdentityOf(st);
  f.size_ = size_t(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      Status s = Status::FromErrno(errno, "mmap " + path);
      ::close(fd);
      f.size_ = 0;
      return s;
    }
    f.map_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  FERRY_ASSIGN_OR_RETURN(f.header_, ParseSafetensorsHeader({f.map_, f.size_}, path));
  return f;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                             [](const auto& t, std::string_view n) { return t.name < n; });
  return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
}

Result<const SafetensorsTensorInfo*> SafetensorsFile::Get(std::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return Status::NotFound("tensor '" + std::string(name) + "' is not in " + path_);
  }
  return info;
}

std::span<const std::byte> SafetensorsFile::Data(const SafetensorsTensorInfo& info) const {
  return {map_ + info.offset, info.bytes};
}

Result<const SafetensorsTensorInfo*> SafetensorsFile::GetShaped(
    std::string_view name, const std::vector<int64_t>& shape) const {
  FERRY_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Get(name));
  if (shape != info->shape) {
    return Status::InvalidArgument("tensor '" + info->name + "' in " + path_ + " has shape " +
                                   ShapeToString(info->shape) + ", expected " +
                                   ShapeToString(shape));
  }
  return info;
}

Result<std::vector<float>> SafetensorsFile::ReadFloats(
    std::string_view name, const std::vector<int64_t>* expected_shape) const {
  FERRY_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info,
                         expected_shape != nullptr ? GetShaped(name, *expected_shape) : Get(name));
  std::span<const std::byte> src = Data(*info);
  std::vector<float> out(size_t(info->numel()));
  switch (info->dtype) {
    case SafetensorsDType::kF32:
      if (!out.empty()) std::memcpy(out.data(), src.data(), src.size());
      break;
    case SafetensorsDType::kBF16:
    case SafetensorsDType::kF16:  // the file's bytes may sit at any byte: ConvertToFloat allows it
      ConvertToFloat(info->dtype == SafetensorsDType::kBF16 ? DType::kBF16 : DType::kF16,
                     src.data(), out.data(), out.size());
      break;
    case SafetensorsDType::kF64:
      for (size_t i = 0; i < out.size(); ++i) {
        double d;
        std::memcpy(&d, src.data() + 8 * i, 8);
        out[i] = float(d);
      }
      break;
    default:
      return Status::InvalidArgument("tensor '" + info->name + "' in " + path_ + " is " +
                                     std::string(SafetensorsDTypeName(info->dtype)) +
                                     ", not a floating-point dtype");
  }
  return out;
}

Result<std::vector<int64_t>> SafetensorsFile::ReadInts(std::string_view name) const {
  FERRY_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Get(name));
  std::span<const std::byte> src = Data(*info);
  std::vector<int64_t> out(size_t(info->numel()));
  auto load = [&](auto zero) {
    using T = decltype(zero);
    for (size_t i = 0; i < out.size(); ++i) {
      T v;
      std::memcpy(&v, src.data() + sizeof(T) * i, sizeof(T));
      out[i] = int64_t(v);
    }
  };
  switch (info->dtype) {
    case SafetensorsDType::kI64:
      load(int64_t{});
      break;
    case SafetensorsDType::kI32:
      load(int32_t{});
      break;
    case SafetensorsDType::kI16:
      load(int16_t{});
      break;
    case SafetensorsDType::kI8:
      load(int8_t{});
      break;
    case SafetensorsDType::kU8:
      load(uint8_t{});
      break;
    default:
      return Status::InvalidArgument("tensor '" + info->name + "' in " + path_ + " is " +
                                     std::string(SafetensorsDTypeName(info->dtype)) +
                                     ", not an integer dtype");
  }
  return out;
}

// ---- writing --------------------------------------------------------------------------------

size_t SafetensorsDataBytes(const SafetensorsWriteTensor& t) {
  size_t bytes = SafetensorsDTypeSize(t.file_dtype.value_or(ToSafetensorsDType(t.dtype)));
  for (int64_t d : t.shape) bytes *= size_t(d);
  return bytes;
}

Result<std::string> SafetensorsHeaderBytes(std::span<const SafetensorsWriteTensor> tensors,
                                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  size_t offset = 0;
  for (const SafetensorsWriteTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return Status::InvalidArgument("cannot write tensor named '" + t.name +
                                     "': names must be unique, non-empty and not __metadata__");
    }
    const size_t bytes = SafetensorsDataBytes(t);
    header[t.name] = {
        {"dtype", SafetensorsDTypeName(t.file_dtype.value_or(ToSafetensorsDType(t.dtype)))},
        {"shape", t.shape},
        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(uint64_t(text.size()) >> (8 * i)));
  return out + text;
}

Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                        const std::map<std::string, std::string>& metadata) {
  for (const SafetensorsWriteTensor& t : tensors) {
    const size_t bytes = SafetensorsDataBytes(t);
    if (bytes != t.data.size()) {
      return Status::InvalidArgument("tensor '" + t.name + "' has " +
                                     std::to_string(t.data.size()) + " bytes, shape " +
                                     ShapeToString(t.shape) + " needs " + std::to_string(bytes));
    }
  }
  return WriteSafetensors(
      path, tensors,
      [&](size_t i) -> Result<std::span<const std::byte>> { return tensors[i].data; }, metadata);
}

Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                        const PieceSource& bytes_of,
                        const std::map<std::string, std::string>& metadata) {
  Result<std::string> header = SafetensorsHeaderBytes(tensors, metadata);
  if (!header.ok()) return header.status().WithContext(path);
  // The header, then each tensor's bytes.
  return WriteProducedAtomically(
      path, tensors.size() + 1, [&](size_t i) -> Result<std::span<const std::byte>> {
        if (i == 0) return AsBytes(*header);
        const SafetensorsWriteTensor& t = tensors[i - 1];
        FERRY_ASSIGN_OR_RETURN(const std::span<const std::byte> bytes, bytes_of(i - 1));
        if (bytes.size() != SafetensorsDataBytes(t)) {
          return Status::Internal("tensor '" + t.name + "' gave " + std::to_string(bytes.size()) +
                                  " bytes, shape " + ShapeToString(t.shape) + " needs " +
                                  std::to_string(SafetensorsDataBytes(t)));
        }
        return bytes;
      });
}

void SafetensorsWriter::Add(std::string name, std::vector<int64_t> shape,
                            std::span<const float> values, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  assert(size_t(n) == values.size() && dtype != DType::kI32 && dtype != DType::kU8);
  (void)n;
  Entry e{std::move(name), dtype, std::move(shape), {}};
  e.bytes.resize(values.size() * DTypeSize(dtype));
  if (!values.empty()) ConvertFromFloat(values.data(), dtype, e.bytes.data(), values.size());
  entries_.push_back(std::move(e));
}

Status SafetensorsWriter::Write(const std::string& path) const {
  std::vector<SafetensorsWriteTensor> ts;
  ts.reserve(entries_.size());
  for (const Entry& e : entries_) ts.push_back({e.name, e.dtype, e.shape, e.bytes});
  return WriteSafetensors(path, ts, metadata_);
}

}  // namespace ferry
