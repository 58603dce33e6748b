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
