// Writers for a simulated schedule: an SVG Gantt chart for people and a Chrome-trace JSON for
// Perfetto (ui.perfetto.dev) or chrome://tracing.
//
// SVG: one row per lane that ran something (every GPU's compute lane always), grouped by GPU, then
// the host lanes; bars coloured by task kind (odd stages a shade darker, so neighbouring stages
// stand apart) on a grey lane background, so idle time shows as grey; task names inside bars wide
// enough to hold them, every bar has a tooltip; a time axis with units; a legend of the kinds
// present; a summary line with makespan and per-GPU bubble fraction.
//
// Chrome trace: {"traceEvents": [...]} with complete events (ph "X", ts/dur in microseconds),
// pid = GPU index (the host is pid = gpus), tid = lane kind; metadata events name both. The
// measured trace of `ferry train --trace` is written by the same function, so both open alike.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "engine/plan/simulator.h"
#include "kernels/status.h"

namespace ferry::plan {

struct SvgOptions {
  std::string title;  // defaults to the schedule's name
  int width_px = 1400;
};

// REQUIRES: result came from Simulate(schedule, ...).
std::string TimelineSvg(const Schedule& schedule, const SimResult& result,
                        const SvgOptions& options = {});
// `task_steps`, when not empty: per task (parallel to schedule.tasks), the training step it ran
// in, written as args.step (a measured trace of several steps, engine/exec/trace_recorder.h).
std::string ChromeTraceJson(const Schedule& schedule, const SimResult& result,
                            std::span<const int64_t> task_steps = {});

}  // namespace ferry::plan
