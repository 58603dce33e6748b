#include "engine/model/converted_base.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "engine/model/weights_io.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

constexpr int64_t kPieceBytes = int64_t(4) << 20;  // a dense weight is written in these

// Where an NF4 weight's parts lie in the file, one after another (value counts).
struct Nf4Layout {
  Nf4Host meta;  // shape, block, nested_block; its vectors stay empty
  size_t packed = 0, code = 0, absmax = 0, absmax_q = 0, nested_absmax = 0, nested_code = 0;
};

struct Entry {
  const ParamSpec* spec = nullptr;  // the owner's
  bool nf4 = false;
  DType dtype = DType::kF32;  // a dense one's, in the copy
  int64_t pieces = 1;
  uint64_t offset = 0;  // in the file
  uint64_t bytes = 0;   // without the padding behind it
  Nf4Layout layout;
};

template <typename T>
void Append(std::vector<std::byte>& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

template <typename T>
std::vector<T> Take(std::span<const std::byte> bytes, size_t& at, size_t count) {
  std::vector<T> v(count);
  if (count > 0) std::memcpy(v.data(), bytes.data() + at, count * sizeof(T));
  at += count * sizeof(T);
  return v;
}

Nf4Host Unpack(std::span<const std::byte> bytes, const Nf4Layout& l) {
  Nf4Host q = l.meta;
  size_t at = 0;
  q.packed = Take<uint8_t>(bytes, at, l.packed);
  q.absmax = Take<float>(bytes, at, l.absmax);
  q.absmax_q = Take<uint8_t>(bytes, at, l.absmax_q);
  q.code = Take<float>(bytes, at, l.code);
  q.nested_absmax = Take<float>(bytes, at, l.nested_absmax);
  q.nested_code = Take<float>(bytes, at, l.nested_code);
  if (q.nested()) q.nested_offset = Take<float>(bytes, at, 1)[0];
  return q;
}

}  // namespace

bool FileServesStreamedWeight(const ParamSpec& p, DType stored, DType upload) {
  return !p.nf4 && !p.transposed && (!p.tied_to.empty() || DTypeSize(stored) <= DTypeSize(upload));
}

DType ConvertedDType(const ParamSpec& p, DType upload) {
  return p.tied_to.empty() ? upload : DType::kF32;
}

bool StreamedBaseSource::FromFiles(const ParamSpec& p) const {
  return from_files && FileServesStreamedWeight(p, files, upload);
}

uint64_t StreamedBaseSource::StoredBytes(const ParamSpec& p) const {
  if (p.nf4) return p.bytes();
  return uint64_t(p.numel()) * DTypeSize(FromFiles(p) ? files : ConvertedDType(p, upload));
}

uint64_t StreamedBaseSource::DriveBytes(const ParamSpec& p) const {
  const uint64_t bytes = StoredBytes(p);
  if (!FromFiles(p)) return BaseReadDiskBytes(0, bytes);
  if (file_layout != nullptr) {
    if (auto it = file_layout->find(p.storage_name()); it != file_layout->end()) {
      return BaseReadDiskBytes(it->second.offset, it->second.bytes);
    }
  }
  return BaseReadMostDiskBytes(bytes);
}

Result<ConvertedBase> MoveBaseToNvme(const std::vector<LayerSpec>& layers, DType dtype,
                                     DType files_dtype, const std::string& dir,
                                     HostTensors& weights) {
  std::map<std::string, const ParamSpec*> owners;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty()) owners[p.name] = &p;
    }
  }
  std::vector<Entry> entries;
  std::set<std::string> seen;
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kEmbedding) continue;  // gathered on the host
    for (const ParamSpec& p : l.params) {
      const std::string& name = p.storage_name();
      auto o = owners.find(name);
      if (p.trainable || o == owners.end() || o->second->trainable) continue;
      if (!seen.insert(name).second) continue;
      if (weights.files.contains(name) && FileServesStreamedWeight(p, files_dtype, dtype)) {
        continue;  // the model's file serves it
      }
      Entry e;
      e.spec = o->second;
      e.nf4 = o->second->nf4;
      e.dtype = ConvertedDType(p, dtype);
      const bool held = e.nf4 ? weights.nf4.contains(name) || weights.nf4_served.contains(name)
                              : weights.tensors.contains(name) || weights.files.contains(name);
      if (!held) {
        return Status::NotFound("the frozen base has no " + std::string(e.nf4 ? "NF4 " : "") +
                                "weight '" + name + "' to convert");
      }
      const int64_t size = int64_t(DTypeSize(e.dtype));
      if (!e.nf4)
        e.pieces = std::max<int64_t>(1, (p.numel() * size + kPieceBytes - 1) / kPieceBytes);
      entries.push_back(std::move(e));
    }
  }
  if (entries.empty()) return ConvertedBase{};     // nothing is written, nor `dir` touched
  std::vector<std::pair<size_t, int64_t>> pieces;  // (entry, its piece)
  for (size_t i = 0; i < entries.size(); ++i) {
    for (int64_t j = 0; j < entries[i].pieces; ++j) pieces.emplace_back(i, j);
  }
  std::vector<std::byte> buf;
  std::vector<float> whole;  // a transposed file tensor, read whole into fp32
  uint64_t offset = 0;
  auto piece = [&](size_t k) -> Result<std::span<const std::byte>> {
    const auto [i, j] = pieces[k];
    Entry& e = entries[i];
    const std::string& name = e.spec->name;
    buf.clear();
    if (j == 0) e.offset = offset;
    if (e.nf4) {
      Nf4Host made;
      FERRY_ASSIGN_OR_RETURN(const Nf4Host* q, weights.FindNf4(name, made));
      // Stored as a device holds it: only the layout ferry computes with.
      FERRY_RETURN_IF_ERROR(ValidateNf4(*q, name));
      if (q->block != kNf4Block || (q->nested() && q->nested_block != kNf4NestedBlock)) {
        return Status::InvalidArgument(
            "NF4 tensor '" + name + "' is quantized in blocks of " + std::to_string(q->block) +
            (q->nested() ? " nested in blocks of " + std::to_string(q->nested_block) : "") +
            "; ferry computes with blocks of " + std::to_string(kNf4Block) + " nested in " +
            std::to_string(kNf4NestedBlock) + " only");
      }
      Nf4Layout& l = e.layout;
      l.meta.shape = q->shape;
      l.meta.block = q->block;
      l.meta.nested_block = q->nested_block;
      l.packed = q->packed.size();
      l.code = q->code.size();
      l.absmax = q->absmax.size();
      l.absmax_q = q->absmax_q.size();
      l.nested_absmax = q->nested_absmax.size();
      l.nested_code = q->nested_code.size();
      // In Nf4Slot order, as a device holds it (absmax: the 8-bit one when nested).
      Append(buf, q->packed);
      Append(buf, q->absmax);
      Append(buf, q->absmax_q);
      Append(buf, q->code);
      Append(buf, q->nested_absmax);
      Append(buf, q->nested_code);
      if (q->nested()) Append(buf, std::vector<float>{q->nested_offset});  // as a device holds it
      e.bytes = buf.size();
    } else {
      const int64_t size = int64_t(DTypeSize(e.dtype));
      const int64_t numel = e.spec->numel(), per = kPieceBytes / size;
      const int64_t begin = j * per, end = std::min(numel, begin + per);
      buf.resize(size_t((end - begin) * size));
      if (auto t = weights.tensors.find(name); t != weights.tensors.end()) {
        ConvertFromFloat(t->second.data() + begin, e.dtype, buf.data(), size_t(end - begin));
      } else {
        const FileTensor& f = weights.files.at(name);
        if (f.numel() != numel) {
          return Status::InvalidArgument("the weights' tensor '" + name + "' in " + f.path +
                                         " has " + std::to_string(f.numel()) +
                                         " elements, expected " + std::to_string(numel));
        }
        if (!f.transposed) {
          ConvertFileRange(f, begin, end, e.dtype, buf.data());
        } else {
          if (j == 0) {
            whole.resize(size_t(numel));
            ReadFileTensor(f, whole);
          }
          ConvertFromFloat(whole.data() + begin, e.dtype, buf.data(), size_t(end - begin));
        }
        if (end == numel) {
          ReleaseFilePages(f);
          whole = {};
        }
      }
      e.bytes = uint64_t(numel * size);
    }
    if (j + 1 == e.pieces)
      buf.resize((buf.size() + kConvertedBaseAlign - 1) / kConvertedBaseAlign *
                 kConvertedBaseAlign);
    offset += buf.size();
    return std::span<const std::byte>(buf);
  };
  Result<UnnamedMapping> file = WriteUnnamedAndMap(dir, pieces.size(), piece);
  if (!file.ok()) {
    return file.status().WithContext("the frozen base converted to " +
                                     std::string(DTypeName(dtype)) + " for NVMe");
  }
  const std::string where = dir + " (the frozen base in " + std::string(DTypeName(dtype)) + ")";
  // Each weight is read again from the drive through the file's descriptor (FileTensor::fd).
  FileIdentity identity;
  if (file->fd >= 0) {
    FERRY_ASSIGN_OR_RETURN(identity, IdentityOf(file->fd, where));
  }
  auto in_file = [&](const Entry& e, std::span<const std::byte> bytes, DType as,
                     std::vector<int64_t> shape) {
    return FileTensor{.owner = file->owner,
                      .bytes = bytes,
                      .dtype = as,
                      .shape = std::move(shape),
                      .transposed = false,
                      .path = where,
                      .offset = int64_t(e.offset),
                      .identity = identity,
                      .fd = file->fd};
  };
  ConvertedBase out{.bytes = file->bytes.size(), .weights = int64_t(entries.size())};
  for (const Entry& e : entries) {
    const std::string& name = e.spec->name;
    const std::span<const std::byte> bytes = file->bytes.subspan(e.offset, e.bytes);
    if (e.nf4) {
      weights.nf4.erase(name);
      const Nf4Layout& l = e.layout;
      std::vector<std::span<const std::byte>> parts;
      size_t at = 0;
      for (const size_t n :
           {l.packed, l.absmax * sizeof(float) + l.absmax_q, l.code * sizeof(float),
            l.nested_absmax * sizeof(float), l.nested_code * sizeof(float),
            l.absmax_q > 0 ? sizeof(float) : size_t(0)}) {
        if (n == 0 && parts.size() >= 3) break;  // not nested: three tensors
        parts.push_back(bytes.subspan(at, n));
        at += n;
      }
      weights.nf4_served[name] =
          Nf4Source{.shape = e.layout.meta.shape,
                    .make = [owner = file->owner, bytes, layout = e.layout]() -> Result<Nf4Host> {
                      Nf4Host q = Unpack(bytes, layout);
                      ReleaseMappedPages(bytes);  // read once per packing, as a model file's
                      return q;
                    },
                    .device_parts = std::move(parts),
                    .parts_owner = file->owner,
                    .parts_file = in_file(e, bytes.first(at), DType::kU8, {int64_t(at)}),
                    .nested = l.absmax_q > 0};
    } else {
      weights.tensors.erase(name);
      weights.files[name] = in_file(e, bytes, e.dtype, MasterShape(*e.spec));
    }
  }
  return out;
}

}  // namespace ferry
