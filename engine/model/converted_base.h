// A LoRA job's frozen base converted once into the form its uploads take and kept on NVMe, so a
// plan that streams the base every step (frozen weights on NVMe) runs whatever the model's files
// hold: a seeded model's base, files in another dtype than the upload's, or QLoRA's NF4 base
// (quantized once here rather than at every packing). A base the model's files serve in the
// upload dtype needs none of this: the executor streams it from them.
//
// Stateless; thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/base_reader.h"
#include "engine/model/host_tensors.h"
#include "engine/model/param_spec.h"
#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry {

// Whether a LoRA base streamed from NVMe reads frozen weight `p` (as a stage reads it: a tied
// head's alias) from the model's own file, stored there as `stored`, rather than from a copy
// converted to the upload dtype `upload`: a dense weight (not NF4) in the master layout (not
// transposed), no wider than `upload` (a copy would be no smaller, and widening it as it is packed
// is cheap), or of any width when tied (the embedding gathers from the same entry on the host,
// which must keep the file's values: GPT-2 adds its positions to them before rounding). The
// memory model and the planner count the copy and the reads by this rule; MoveBaseToNvme follows
// it.
bool FileServesStreamedWeight(const ParamSpec& p, DType stored, DType upload);

// The dtype a dense frozen weight `p` (as a stage reads it) takes in the copy: the upload dtype,
// or f32 for a tied head's table (held in fp32 by a seeded base: the embedding gathers from the
// same entry, and GPT-2 adds its positions to the f32 values before rounding).
DType ConvertedDType(const ParamSpec& p, DType upload);

// Each weight of the copy starts on a block of the drive (its bytes padded to it), so a step reads
// exactly the blocks its bytes take: what the memory model counts per weight.
inline constexpr uint64_t kConvertedBaseAlign = kBaseReadBlockBytes;

// Where a streamed base's weights are read from, as stored: the model's files where they serve a
// weight (FileServesStreamedWeight), else the copy converted to the upload dtype (NF4 weights as a
// device holds them). The memory model and the planner count the copy and the reads by it;
// MoveBaseToNvme writes the copy and BaseFileReader reads both.
struct StreamedBaseSource {
  bool from_files = false;      // the model's files hold the base (PlanJob::frozen_base_from_files)
  DType files = DType::kF32;    // their dtype (ModelConfig::weights_dtype)
  DType upload = DType::kBF16;  // the compute dtype
  // Where each tensor lies in the files (its bytes as stored there, whatever `files` says);
  // nullptr where not known (a plan made from a config).
  std::shared_ptr<const TensorFileLayout> file_layout = nullptr;

  // Whether the model's files serve frozen weight `p` (else the copy holds it).
  bool FromFiles(const ParamSpec& p) const;
  // The bytes `p` is stored as where it is read from.
  uint64_t StoredBytes(const ParamSpec& p) const;
  // The bytes of the drive's blocks a step reads for `p` (BaseFileReader::disk_bytes): from its
  // block in the copy; in a file, its extent there (file_layout, by the name it is stored under),
  // else the most its StoredBytes can take (BaseReadMostDiskBytes).
  uint64_t DriveBytes(const ParamSpec& p) const;
};

struct ConvertedBase {
  uint64_t bytes = 0;  // written to NVMe: the plan's weights.frozen there
  int64_t weights = 0;
};

// Moves every frozen weight the blocks and the head of `layers` read (a tied head's owner
// included; an untied embedding is gathered on the host and stays) into a file with no name in
// `dir` (offload/file_io.h: WriteUnnamedAndMap; nothing is left there however the run ends),
// except a weight served from the model's files (weights.files) that FileServesStreamedWeight
// says they serve, taking them to store `files_dtype` (ModelConfig::weights_dtype, as the plan
// does, whatever a tensor's own dtype): dense weights as `dtype` (f32, bf16 or f16) in the master
// layout (ConvertedDType: a tied head's table as f32), NF4 weights as a device holds them (codes,
// quant state and maps: ParamSpec::bytes()), each padded to kConvertedBaseAlign. Each one's entry
// in weights.tensors, nf4, files or nf4_served is replaced by one over the file's read-only mapping
// (files: a FileTensor in `dtype`; nf4_served: an Nf4Source that copies it out), with its place in
// the file and the file's descriptor, through which a streamed base reads it from the drive
// (FileTensor::offset, fd; Nf4Source::parts_file), so the executor
// packs them as it packs a base the model's files serve, with the same bits as from the entry they
// replace; the RAM they held is freed. Weights are converted one at a time (a dense one in pieces
// of at most 4 MiB). With nothing to move, `dir` is not touched. Errors: a weight `weights` lacks
// (NotFound, naming it), one of another size than `layers` says, or an NF4 one invalid or in other
// blocks than ferry's (InvalidArgument); the folder's, naming it (IOError when it is missing or
// read-only, NoSpace when it fills up); then `weights` is as it was.
Result<ConvertedBase> MoveBaseToNvme(const std::vector<LayerSpec>& layers, DType dtype,
                                     DType files_dtype, const std::string& dir,
                                     HostTensors& weights);

}  // namespace ferry
