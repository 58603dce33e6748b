// HostTensors: a model's fp32 host tensors (master weights, gradients, optimizer moments) in
// ferry's master layout (engine/model/weights_io.h: MasterShape), keyed by the Hugging Face name
// of each storage-owning parameter (tied aliases have no entry). A base weight nothing trains (a
// LoRA job's frozen base; every base weight of an inference load) may instead be held in NF4 or
// served from its model file (FileTensor, Nf4Source), never copied into RAM.
//
// Plain value type (copies share the files' mappings); thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/nf4.h"
#include "kernels/status.h"
#include "offload/file_io.h"

namespace ferry {

// A parameter nothing trains served from the model's own safetensors file (a LoRA job's frozen
// base; an inference load's whole base): a view of
// the tensor's bytes in the file's read-only memory mapping, which `owner` keeps alive. The host
// packs it into each upload mirror straight from the file (a copy when the file's dtype is the
// upload dtype, else converted on the fly: engine/model/weights_io.h), so the base never exists
// in fp32 in RAM as a whole (a transposed tensor is read whole into fp32 while it is packed).
// Packed from the mapping, the pages read stay the kernel's page cache, which it may reclaim; a
// base streamed every step is read from the drive instead (engine/model/base_reader.h).
struct FileTensor {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;  // as stored: row-major `shape`, `dtype`; alignment not given
  DType dtype = DType::kF32;         // kF32, kBF16 or kF16 (kU8: Nf4Source::parts_file's bytes)
  std::vector<int64_t> shape;        // as stored (ParamSpec::shape)
  bool transposed = false;           // stored (in, out), the master layout (out, in) (GPT-2 Conv1D)
  std::string path;                  // the file, for messages
  // Where `bytes` start in the file, which a streamed base reads directly
  // (engine/model/base_reader.h), and which file that was when mapped (its name may later be
  // another's); -1: only the mapping reaches it.
  int64_t offset = -1;
  FileIdentity identity = {};
  // A file with no name (a converted copy: offload/file_io.h, WriteUnnamedAndMap): its descriptor,
  // open while `owner` lives, read through /proc/self/fd; -1: read `path`.
  int fd = -1;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A frozen NF4 weight (QLoRA's base) made each time it is packed into an upload mirror, from the
// model's file: quantized from its stored values, or read as a pre-quantized folder stores it. The
// mirrors are then the only copy of the NF4 base in RAM (none beside them, as with FileTensor).
// `make` returns the same bits at every call (quantization is deterministic).
struct Nf4Source {
  std::vector<int64_t> shape;  // the logical (dequantized) shape, (out, in)
  std::function<Result<Nf4Host>()> make;
  // Set when the weight is stored as a device holds it (a copy converted on NVMe,
  // engine/model/converted_base.h): its tensors' bytes in Nf4Slot order (param_spec.h), which an
  // upload image copies straight from the mapping, making no Nf4Host; `nested` as made.
  std::vector<std::span<const std::byte>> device_parts = {};
  std::shared_ptr<const void> parts_owner = {};  // keeps the mapping device_parts point into
  // The same parts as one run of bytes in their file (kU8, offset and descriptor set), which a
  // streamed base reads from the drive (engine/model/base_reader.h); offset -1 when not given.
  FileTensor parts_file = {};
  bool nested = false;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct HostTensors {
  std::map<std::string, std::vector<float>> tensors;
  // Frozen base weights stored in NF4 (ParamSpec::nf4), by Hugging Face name; such a weight has
  // no entry in `tensors`.
  std::map<std::string, Nf4Host> nf4;
  // Base weights nothing trains, served from the model's files; such a weight has no entry in
  // `tensors`.
  std::map<std::string, FileTensor> files;
  // Frozen NF4 weights made from the model's files when packed (Nf4Source); such a weight has no
  // entry in `tensors` or `nf4`.
  std::map<std::string, Nf4Source> nf4_served;
  std::span<float> at(const std::string& name) { return tensors.at(name); }
  // The number of values `name` holds in whichever form; -1 when it has none.
  int64_t numel(const std::string& name) const {
    if (auto it = tensors.find(name); it != tensors.end()) return int64_t(it->second.size());
    if (auto it = nf4.find(name); it != nf4.end()) return it->second.numel();
    if (auto it = files.find(name); it != files.end()) return it->second.numel();
    if (auto it = nf4_served.find(name); it != nf4_served.end()) return it->second.numel();
    return -1;
  }
  // The NF4 weight `name`: the one held (nf4), or one made now from its source (nf4_served) into
  // `made`; null when it has neither. Errors: the source's.
  Result<const Nf4Host*> FindNf4(const std::string& name, Nf4Host& made) const {
    if (auto it = nf4.find(name); it != nf4.end()) return &it->second;
    auto s = nf4_served.find(name);
    if (s == nf4_served.end()) return static_cast<const Nf4Host*>(nullptr);
    Result<Nf4Host> m = s->second.make();
    if (!m.ok()) return m.status().WithContext(name);
    made = std::move(*m);
    return &made;
  }
};

}  // namespace ferry
