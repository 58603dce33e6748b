// ReplayStep: one step of a recorded trace (engine/exec/trace_recorder.h) replayed through the
// simulator (engine/plan/simulator.h), to check the simulator's dependency and resource model
// against what the executor ran: the plan's round-robin schedule keeps its tasks, lanes,
// dependencies and lane orders, and each task takes the time the executor measured for it. The
// replayed step (the simulator's makespan) then differs from the recorded one (first span's start
// to last span's end) only by what the model gets wrong about how the tasks overlap.
//
// Mapping, by task name and lane kind (device indices are not compared: the round robin's counter
// runs on across steps, so a stage runs on another device each step):
//  - A schedule task takes the summed durations of the step's spans of its name on its lane: the
//    executor brackets a stage's work per layer (a forward stage's "F0.1" is one span per block,
//    its "O0.1" one per downloaded tensor), the schedule has one task per micro-batch.
//  - Chunked weight uploads ("WB1/3") match by stage ("WB1"): the executor sends a stage's weights
//    in its own number of chunks (one for a device's first stage of the step, one per activation
//    upload after), the schedule in job.weight_chunks; the stage's summed upload time is split
//    evenly over the schedule's chunks.
//  - Schedule tasks with no span (the CPU optimizer's "U…" when the caller runs no optimizer) take
//    no time and are listed in `missing`; spans with no schedule task are not replayed and are
//    listed in `unmatched` (both sorted, each name once). The recorded step still spans them.
//
// Pure function over values; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/plan/simulator.h"
#include "kernels/status.h"

namespace ferry::exec {

struct StepReplay {
  plan::Schedule schedule;  // the input schedule with measured durations, no bytes
  plan::SimResult sim;      // the simulator's run of it
  double recorded_step_s = 0;
  double replayed_step_s = 0;          // sim.makespan_s
  std::vector<std::string> missing;    // schedule tasks the trace lacks (replayed as 0 s)
  std::vector<std::string> unmatched;  // span names the schedule lacks (not replayed)

  double ratio() const { return recorded_step_s > 0 ? replayed_step_s / recorded_step_s : 0; }
};

// Replays step `step` of `spans` through `schedule` (plan::BuildRoundRobinSchedule of the plan
// the executor ran). Errors: InvalidArgument when the trace has no span of that step; those of
// plan::Simulate.
[[nodiscard]] Result<StepReplay> ReplayStep(const plan::Schedule& schedule,
                                            const std::vector<TraceSpan>& spans, int64_t step);

}  // namespace ferry::exec
