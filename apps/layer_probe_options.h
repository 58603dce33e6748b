// `ferry probe --model M [job options]`: the layer probe's options (engine/probe/layer_probe.h) and
// the step that measures the job's layers and merges their times into the profile being written,
// so `ferry plan --hardware FILE --model M [same job options] --dtype f32` uses measured times.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/plan/hardware_profile.h"
#include "kernels/status.h"

namespace ferry {

struct LayerProbeCommand {
  CLI::App* app = nullptr;
  JobSpec job;  // --model, --batch-size, --micro-batches, --seq-len, --lora-*
  std::string lora_targets = "all";
  std::string dtype = "f32";
  int repeats = 3;
  bool layers_only = false;  // --layers-only: keep --base's machine figures, measure layers only

  // True when `ferry probe` was given --model.
  bool wanted() const { return app != nullptr && app->count("--model") > 0; }
};

// Adds the job options of `ferry plan` and the layer probe's own to `probe`; `cmd` must outlive
// parsing.
void AddLayerProbeOptions(CLI::App& probe, LayerProbeCommand* cmd);

// Measures the layers of cmd's job on a CPU device with `threads` threads (0: all cores) and
// merges their times into `profile` (its GPU count decides the micro-batch sizes tried). Prints
// one line per layer. Errors name the option or the layer that does not fit.
[[nodiscard]] Status RunLayerProbe(const LayerProbeCommand& cmd, int threads,
                                   plan::HardwareProfile& profile);

}  // namespace ferry
