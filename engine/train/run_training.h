// RunTraining: runs a resolved, validated job to the end on a CPU device, writing its run folder:
//   metrics.jsonl      one JSON object per update: step (1-based), loss, lr, grad_norm,
//                      tokens_per_s, elapsed_s (seconds since the first update began), and
//                      val_loss (mean over the validation set) every --eval-every updates
//   model.safetensors  the final weights, Hugging Face names (with LoRA: the frozen base)
//   adapter_model.safetensors + adapter_config.json   with LoRA: the adapter in PEFT's format
//   config.json        the model's Hugging Face config
//   job.json           the resolved job (already written by the caller)
// Progress goes to stderr (progress_bar.h).
//
// REQUIRES: ValidateJobSpec(job, model) is ok and PrepareRunFolder(job.out) succeeded.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/job/job_spec.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "kernels/status.h"

namespace ferry {

Status RunTraining(const JobSpec& job, const ModelConfig& model);

// Device memory for one ModelRunner of `model` at micro-batch `shape`: weights, gradients, every
// layer's saved activations, the LM head's chunk and scratch, with a margin.
size_t EstimateDeviceBytes(const ModelConfig& model, const LoraConfig& lora, BatchShape shape,
                           int64_t loss_chunk_tokens);

}  // namespace ferry
