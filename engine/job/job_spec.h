// JobSpec: one training job, resolved — the model, the data, the training hyperparameters and the
// output folder — as `ferry train` flags and job files (CLI11 config files: every key is also a
// flag) set it. ValidateJobSpec checks it against the model; errors are one line that names the
// option and says what to change.
//
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/job/lr_decay.h"
#include "engine/json_fwd.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "kernels/status.h"

namespace ferry {

struct JobSpec {
  // Model: "tiny" (the built-in preset, random init) or a Hugging Face model folder (--model DIR:
  // config.json + safetensors weights, engine/model/model_folder.h).
  std::string model = "tiny";
  // Data: "builtin" (the built-in dataset) or a dataset file (engine/train/examples.h: .jsonl,
  // .json, .txt, .bin/.tok), packed into rows (engine/train/packed_dataset.h).
  std::string data = "builtin";
  std::string val_data;                // validation file; empty: --val-fraction of --data
  double val_fraction = 0;             // share of --data's examples held out for validation
  int64_t eval_every = 0;              // validation loss every N updates (and at the end); 0: off
  int64_t eval_batches = 0;            // micro-batches per validation; 0: the whole set
  std::string chat_template = "auto";  // chatml|qwen3|llama3|mistral|none, or auto (from the model)
  std::string long_examples = "split";  // split|truncate examples longer than --seq-len
  bool skip_bad_lines = false;          // skip (and count) malformed .jsonl lines, .json elements
  bool train_on_prompt = false;         // the loss on prompts and user turns too (examples.h)

  int64_t steps = 300;  // optimizer updates
  // > 0: passes over the training rows of a --data file; the run sets `steps` from it once the
  // data is packed (StepsForEpochs: ceil(epochs x rows / batch_size)). 0: `steps` decides.
  double epochs = 0;
  int64_t batch_size = 16;    // sequences per optimizer update (the global batch)
  int64_t micro_batches = 1;  // the global batch is split into this many micro-batches
  int64_t seq_len = 128;      // tokens per sequence
  double lr = 3e-3;           // peak learning rate
  int64_t warmup_steps = 20;
  double min_lr_ratio = 0.1;               // the decay ends at min_lr_ratio * lr
  LrDecay lr_schedule = LrDecay::kCosine;  // the decay after the warm-up
  double weight_decay = 0.1;               // decoupled; never on norms and biases
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clipping threshold; 0 disables
  // One-step-stale updates (opt-in, changes the numerics): each step
  // runs on the weights one update older, so the optimizer overlaps the next step.
  bool stale_updates = false;
  uint64_t seed = 1234;
  LoraConfig lora;      // rank 0: full fine-tuning
  int64_t threads = 0;  // CPU device threads; 0: all cores
  // The logical devices the planned pipeline runs over (engine/train/training_runner.h) and what
  // they are (--devices, engine/job/job_devices.h): device_kind "auto" (GPUs when this build and
  // machine have them, else CPU devices; ResolveJobDevices settles it before a run), "cpu" or
  // "cuda". With "cuda", `gpus` holds each device's GPU (its CUDA ordinal); a repeated ordinal
  // makes logical devices that share one GPU.
  int64_t devices = 1;
  std::string device_kind = "auto";
  std::vector<int64_t> gpus;
  // Compute (storage) dtype on the devices: "f32", the exact reference (CPU devices only), "bf16"
  // (bf16 weights and activations, bf16 GEMMs with fp32 accumulation), "f16" (f16 weights and
  // activations, with dynamic loss scaling) or "fp16acc" (f16 whose all-f16 GEMMs accumulate in
  // fp16: GPUs only, kernels/cuda/gemm.cu); "auto" is f32 on CPU devices and bf16 on GPUs
  // (ResolveJobDevices). Master weights, gradients and optimizer state stay fp32.
  std::string dtype = "auto";
  // f16's dynamic loss scaling (engine/train/loss_scaler.h, torch GradScaler's defaults): the
  // initial scale (a power of two) and the finite steps after which it doubles. Unused (and the
  // scale stays 1) with f32 and bf16.
  double loss_scale = 65536;
  int64_t loss_scale_growth_interval = 2000;
  // Budgets the job's plan obeys (engine/train/training_runner.h): the host RAM it may
  // use ("2GiB"; empty: physical RAM) and a folder on an NVMe drive for what it puts there
  // (empty: no NVMe tier). Today only optimizer state runs from NVMe.
  std::string host_memory;
  std::string nvme_dir;
  // The most device memory each CUDA device may use ("4GiB"; empty: its share of
  // kGpuMemoryFraction of its GPU's free memory, engine/job/job_devices.h). A cap below what the
  // model needs makes the plan stream weights through the device.
  std::string gpu_memory;
  std::string out = "ferry-run";  // run folder (created)
  // Checkpoints (engine/train/checkpoint.h): every `save_every` updates (0: only at the end and
  // on SIGINT/SIGTERM), the newest `keep_checkpoints` kept, tensor files zstd-compressed when
  // `checkpoint_compress`.
  int64_t save_every = 100;
  int64_t keep_checkpoints = 3;
  bool checkpoint_compress = false;

  int64_t micro_batch_size() const { return batch_size / micro_batches; }
  friend bool operator==(const JobSpec&, const JobSpec&) = default;
};

// The model the job names: the preset, or the folder's config.json (errors name the folder).
Result<ModelConfig> ResolveModel(const JobSpec& job);

// A --model folder pre-quantized by bitsandbytes (4-bit NF4) trains as QLoRA: the job's base
// storage becomes the folder's (--quantize nf4, its double quantization), whatever was given.
// Errors: such a folder without --lora-rank (its base can only stay frozen), or one that does
// not resolve.
Status AdoptPreQuantizedBase(JobSpec& job);

// Checks sizes and hyperparameters against each other and the model.
Status ValidateJobSpec(const JobSpec& job, const ModelConfig& model);

// --threads: 0 (all cores) up to kThreadsPerCore x this machine's hardware threads; the error
// names the option, the bound and the machine's count.
inline constexpr int64_t kThreadsPerCore = 4;
Status ValidateThreads(int64_t threads);
// The same against a machine of `hardware_threads`.
Status ValidateThreads(int64_t threads, int64_t hardware_threads);

// The sizes every command that runs a job checks (train, plan, probe --model): --steps,
// --batch-size, --micro-batches (0 is auto where `micro_batches_auto`), --seq-len against the
// model's positions, --threads, the LoRA options. ValidateJobSpec checks them too.
Status ValidateJobShape(const JobSpec& job, const ModelConfig& model,
                        bool micro_batches_auto = false);

// Creates the run folder (and its parents) and proves it writable by creating and removing a
// file in it. Errors name the folder and say to choose another --out.
Status PrepareRunFolder(const std::string& dir);

// The resolved job (and the model it trains) as JSON, written to <out>/job.json.
nlohmann::json JobSpecToJson(const JobSpec& job, const ModelConfig& model);
Status WriteJobJson(const JobSpec& job, const ModelConfig& model);

// The job JobSpecToJson wrote (keys it lacks keep their defaults). `what` names the source in
// errors (InvalidArgument naming the key). JobSpecToJson and JobSpecFromJson walk one list of
// options, so each key written is read back. Keys that are neither an option nor one that
// JobSpecToJson adds for the reader (model_path, micro_batch_size, schedule, model_config) are
// ignored, and listed in `*unknown_keys` when it is given.
Result<JobSpec> JobSpecFromJson(const nlohmann::json& j, const std::string& what,
                                std::vector<std::string>* unknown_keys = nullptr);

}  // namespace ferry
