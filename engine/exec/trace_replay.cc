#include "engine/exec/trace_replay.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

namespace ferry::exec {
namespace {

// A task's group: its name up to a chunk suffix ("WB1/3" -> "WB1"), and its lane's kind.
using GroupKey = std::pair<std::string, plan::LaneKind>;

GroupKey GroupOf(const std::string& name, plan::LaneKind lane) {
  return {name.substr(0, name.find('/')), lane};
}

}  // namespace

Result<StepReplay> ReplayStep(const plan::Schedule& schedule, const std::vector<TraceSpan>& spans,
                              int64_t step) {
  std::map<GroupKey, double> measured;  // summed span seconds per group
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const TraceSpan& s : spans) {
    if (s.step != step) continue;
    measured[GroupOf(s.name, s.lane.kind)] += s.end_s - s.start_s;
    first = std::min(first, s.start_s);
    last = std::max(last, s.end_s);
  }
  if (measured.empty()) {
    return Status::InvalidArgument("the trace has no span of step " + std::to_string(step));
  }

  StepReplay r;
  r.schedule = schedule;
  r.schedule.name = schedule.name + " (replayed)";
  r.recorded_step_s = last - first;
  std::map<GroupKey, int> tasks_in_group;
  for (const plan::SimTask& t : r.schedule.tasks) ++tasks_in_group[GroupOf(t.name, t.lane.kind)];
  std::set<std::string> missing;
  for (plan::SimTask& t : r.schedule.tasks) {
    const GroupKey g = GroupOf(t.name, t.lane.kind);
    auto m = measured.find(g);
    t.bytes = 0;  // measured durations replace the lanes' rates
    if (m == measured.end()) {
      t.duration_s = 0;
      missing.insert(g.first);
    } else {
      t.duration_s = m->second / tasks_in_group.at(g);
    }
  }
  std::set<std::string> unmatched;
  for (const auto& [g, seconds] : measured) {
    if (!tasks_in_group.count(g)) unmatched.insert(g.first);
  }
  r.missing.assign(missing.begin(), missing.end());
  r.unmatched.assign(unmatched.begin(), unmatched.end());
  // Every task is a duration now: the rates only matter for byte tasks.
  FERRY_ASSIGN_OR_RETURN(r.sim, plan::Simulate(r.schedule, plan::LaneRates{}));
  r.replayed_step_s = r.sim.makespan_s;
  return r;
}

}  // namespace ferry::exec
