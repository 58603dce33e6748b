// Reading and writing .safetensors files, Hugging Face's weight format:
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data]
//   header = {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string>", ...}}   (offsets relative to the data start)
//
// The reader memory-maps the file and validates the whole header before anything is handed out:
// well-formed JSON, every field of the right type, known dtypes, shapes whose byte size equals
// the offset range, every range inside the file, no two ranges overlapping. A bad file is an error
// naming the file and the tensor, never a crash (ParseSafetensorsHeader is the fuzzable core).
// Tensor data is returned as views into the mapping (Data) or converted to fp32 (ReadFloats).
//
// The writer lays tensors out in the order given, pads the header with spaces to a multiple of 8
// (as the Python library does, so data stays aligned), and writes to "<path>.tmp" then renames.
//
// Ownership: a SafetensorsFile owns its mapping (move-only); views and infos die with it.
// Thread-safety: a SafetensorsFile is immutable after Open and may be read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/status.h"
#include "offload/file_io.h"

namespace ferry {

// Every dtype the format names that ferry can at least carry as bytes.
enum class SafetensorsDType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool
};

std::string_view SafetensorsDTypeName(SafetensorsDType t);  // "F32", "BF16", ...
size_t SafetensorsDTypeSize(SafetensorsDType t);
Result<SafetensorsDType> ParseSafetensorsDType(std::string_view name);
SafetensorsDType ToSafetensorsDType(DType t);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;  // rank 0 (a scalar) allowed
  size_t offset = 0;           // from the start of the file
  size_t bytes = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  size_t data_begin = 0;  // 8 + header length
};

// The largest header the reader accepts.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

// Validates the header of a complete file image (`file` is the whole file). `what` names the
// file in errors. Fails with Corruption (or InvalidArgument for an unknown dtype) naming the
// tensor and the problem.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                 std::string_view what);
// The same from the start of a file of `file_size` bytes: `head` holds at least its first
// 8 + header length bytes (a file read a piece at a time).
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> head, size_t file_size,
                                                 std::string_view what);

class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Maps and validates `path`.
  static Result<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // The file mapped (its device, inode and size when opened).
  const FileIdentity& identity() const { return identity_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  // NotFound naming the tensor and the file when absent.
  Result<const SafetensorsTensorInfo*> Get(std::string_view name) const;
  // Get, and an InvalidArgument naming the tensor, the file and both shapes when its shape is not
  // `shape`.
  Result<const SafetensorsTensorInfo*> GetShaped(std::string_view name,
                                                 const std::vector<int64_t>& shape) const;
  // The tensor's bytes inside the mapping (alignment not guaranteed: copy out with memcpy).
  std::span<const std::byte> Data(const SafetensorsTensorInfo& info) const;

  // The tensor converted to fp32 (from F32, BF16, F16 or F64). When `expected_shape` is given,
  // a different shape is an InvalidArgument naming the tensor, the file and both shapes.
  Result<std::vector<float>> ReadFloats(std::string_view name,
                                        const std::vector<int64_t>* expected_shape = nullptr) const;
  // The tensor as int64 (from I64, I32, I16, I8, U8).
  Result<std::vector<int64_t>> ReadInts(std::string_view name) const;

 private:
  void Release();
  std::string path_;
  FileIdentity identity_;
  const std::byte* map_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
};

// One tensor to write; `data` holds numel * DTypeSize(dtype) bytes, row-major.
struct SafetensorsWriteTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data = {};
  // When set, the dtype the file names instead of `dtype` (any the format has: U8 quant state,
  // I64 token ids); `data` then holds numel * SafetensorsDTypeSize(*file_dtype) bytes.
  std::optional<SafetensorsDType> file_dtype = std::nullopt;
};

// The start of a safetensors file holding `tensors` in this order (their `data` is not read): the
// 8-byte header length and the JSON header, padded to 8 bytes; the tensors' bytes follow it in
// order. For a file written as its tensors are produced (a checkpoint). Errors: InvalidArgument
// for a name that is empty, "__metadata__" or repeated.
Result<std::string> SafetensorsHeaderBytes(std::span<const SafetensorsWriteTensor> tensors,
                                           const std::map<std::string, std::string>& metadata = {});
// The bytes tensor `t` takes in the file: numel x its file dtype's size.
size_t SafetensorsDataBytes(const SafetensorsWriteTensor& t);

// Writes the tensors (names unique, non-empty, not "__metadata__") to `path`.
Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                        const std::map<std::string, std::string>& metadata = {});
// WriteSafetensors of tensors whose bytes are made as the file is written, one at a time: tensor
// i's by `bytes_of(i)` (their `data` is not read), so the file's image is never whole in memory.
// A tensor given the wrong number of bytes is an Internal error naming it; no file is left.
Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                        const PieceSource& bytes_of,
                        const std::map<std::string, std::string>& metadata = {});

// Collects fp32 tensors, converts each to its chosen storage dtype (round to nearest even) and
// writes them in insertion order.
class SafetensorsWriter {
 public:
  // REQUIRES: values.size() equals the product of shape; dtype is a float dtype (write integer
  // tensors with WriteSafetensors).
  void Add(std::string name, std::vector<int64_t> shape, std::span<const float> values,
           DType dtype = DType::kF32);
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

std::string ShapeToString(std::span<const int64_t> shape);  // "[2, 3]"

}  // namespace ferry
