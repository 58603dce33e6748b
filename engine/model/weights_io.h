// Moving one parameter between a Hugging Face checkpoint and ferry's fp32 master layout, and
// initializing it — storage-agnostic: each function reads or writes a caller-owned span, so
// whatever holds the master copy (host pool, NVMe staging) can use them.
//
// Layouts: ferry computes with linear weights as (out, in) row-major. Checkpoint layout equals
// that except for GPT-2's Conv1D weights (ParamSpec::transposed), which are stored (in, out);
// loading transposes them into the master layout and saving transposes them back.
//
// Stateless; thread-safe (distinct spans may be filled from distinct threads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/base_reader.h"
#include "engine/model/host_tensors.h"
#include "engine/model/param_spec.h"
#include "engine/model/safetensors.h"
#include "kernels/status.h"

namespace ferry {

// The parameter's shape in ferry's master layout ((out, in) for every linear weight).
std::vector<int64_t> MasterShape(const ParamSpec& p);

// Reads `p` from `file` (F32, BF16, F16 or F64) into `out` in the master layout. Errors name the
// tensor and the file: NotFound when absent, InvalidArgument when the stored shape differs.
// REQUIRES: out.size() == p.numel(); p.tied_to is empty (an alias has no storage of its own).
Status LoadParameter(const SafetensorsFile& file, const ParamSpec& p, std::span<float> out);

// `p` as `file` stores it, to be served from the file (HostTensors::files) rather than read into
// RAM: a view of its bytes kept alive by `owner` (which must own `file`'s mapping). Errors as
// LoadParameter's. A dtype ferry does not compute from as it is (F64) gives an empty `bytes`: the
// caller loads it with LoadParameter instead.
Result<FileTensor> ServeParameter(std::shared_ptr<const void> owner, const SafetensorsFile& file,
                                  const ParamSpec& p);

// `n` values stored as `stored` at `src` (which may sit at any byte) into `dst` as `dtype` (f32,
// bf16 or f16): a copy when the dtypes agree, else converted through fp32, rounding to nearest
// even. REQUIRES: dst holds n values of `dtype`, aligned for it.
void ConvertStored(DType stored, const std::byte* src, size_t n, DType dtype, std::byte* dst);

// The values [begin, end) of `t` in the master layout, stored into `dst` as `dtype` (f32, bf16 or
// f16: a copy when it is t's dtype, else converted through fp32, rounding to nearest even).
// REQUIRES: !t.transposed (a transposed tensor is read whole: ReadFileTensor); 0 <= begin <= end
// <= t.numel(); dst holds (end - begin) values of `dtype`, aligned for it.
void ConvertFileRange(const FileTensor& t, int64_t begin, int64_t end, DType dtype, std::byte* dst);

// All of `t` in fp32, in the master layout. REQUIRES: out.size() == t.numel().
void ReadFileTensor(const FileTensor& t, std::span<float> out);

// The same, read from the drive through `reader` (engine/model/base_reader.h). Errors: the
// reader's. REQUIRES: out.size() == t.numel(); t.offset >= 0.
Status ReadFileTensor(const FileTensor& t, BaseFileReader& reader, std::span<float> out);

// Tells the kernel this process will not read `t`'s pages again soon (MADV_DONTNEED on the whole
// pages inside it): they leave the process's resident set and stay in the page cache, read back
// from there (or the drive) when touched again. A hint: nothing fails.
void ReleaseFilePages(const FileTensor& t);
// The same for any bytes of a memory-mapped file.
void ReleaseMappedPages(std::span<const std::byte> bytes);

// `p`'s values (in the master layout) in the checkpoint layout: `values` themselves, or their
// transpose made in `scratch`. REQUIRES: values.size() == p.numel().
std::span<const float> CheckpointLayout(const ParamSpec& p, std::span<const float> values,
                                        std::vector<float>& scratch);

// Adds `p` (values in the master layout) to `writer` in the checkpoint layout, stored as `dtype`.
// REQUIRES: values.size() == p.numel().
void AddParameter(SafetensorsWriter& writer, const ParamSpec& p, std::span<const float> values,
                  DType dtype = DType::kF32);

// Fresh values for a model trained from scratch, in the master layout, a pure function of
// (seed, p.name, element index) — independent of the order parameters are visited in:
//   norm weights 1, biases 0, matrices and embeddings N(0, std^2) (std = 0.02, as transformers'
//   initializer_range), LoRA A uniform in +-1/sqrt(in) (PEFT's kaiming-uniform bound), LoRA B 0.
// REQUIRES: out.size() == p.numel().
void InitParameter(const ParamSpec& p, uint64_t seed, std::span<float> out, double std = 0.02);

}  // namespace ferry
