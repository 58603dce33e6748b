// RunTraining: runs a resolved, validated job to the end, writing its run folder (final weights
// as .safetensors, metrics.jsonl, job.json is already there).
//
// REQUIRES: ValidateJobSpec(job, model) is ok and PrepareRunFolder(job.out) succeeded.
#pragma once

#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"
#include "kernels/status.h"

namespace ferry {

// Not wired yet: returns Unavailable until the model layers and the trainer land (issue 3).
Status RunTraining(const JobSpec& job, const ModelConfig& model);

}  // namespace ferry
