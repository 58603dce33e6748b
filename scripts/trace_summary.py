#!/usr/bin/env python3
"""Where a `ferry train --trace` run's time went: per lane, busy seconds per step.

Reads the Chrome-trace JSON that `ferry train --trace FILE` writes (complete events, "ph": "X",
each with args.step) and prints, for the steps after the first (the first pays for allocation
and graph building), the median step's wall time (first event start to last event end) and each
lane's busy time in it (the union of its spans, so nested or overlapping spans count once), the
busiest lane first, then the event names that take most of that lane.

Usage: scripts/trace_summary.py TRACE.json [--top N]
"""
import argparse
import collections
import json
import statistics
import sys


def union_seconds(spans):
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1e6  # trace times are microseconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=3)
    args = ap.parse_args()
    with open(args.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    by_step = collections.defaultdict(list)
    for e in events:
        args_ = e.get("args") or {}
        if e.get("ph") == "X" and "step" in args_ and "dur" in e and "ts" in e:
            by_step[args_["step"]].append(e)
    steps = sorted(s for s in by_step if s >= 0)
    if not steps:
        sys.exit("trace_summary: no timed events with a step in " + args.trace)
    measured = steps[1:] or steps

    def lane(e):
        return "%s %s" % (processes.get(e["pid"], "pid %d" % e["pid"]),
                          threads.get((e["pid"], e["tid"]), "tid %d" % e["tid"]))

    walls = {}
    for s in measured:
        evs = by_step[s]
        walls[s] = (max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)) / 1e6
    median_step = sorted(measured, key=lambda s: walls[s])[len(measured) // 2]
    wall = walls[median_step]
    print("trace: step %d of steps %d-%d (the median wall; min %.3f s, max %.3f s): %.3f s" %
          (median_step, measured[0], measured[-1], min(walls.values()), max(walls.values()), wall))
    lanes = collections.defaultdict(list)
    for e in by_step[median_step]:
        lanes[lane(e)].append(e)
    rows = []
    for name, evs in lanes.items():
        busy = union_seconds([(e["ts"], e["ts"] + e["dur"]) for e in evs])
        per_name = collections.Counter()
        for e in evs:
            per_name[e["name"].split(".")[0]] += e["dur"] / 1e6
        rows.append((busy, name, per_name))
    for busy, name, per_name in sorted(rows, reverse=True):
        top = ", ".join("%s %.3f s" % (n, t) for n, t in per_name.most_common(args.top))
        print("  %-28s busy %.3f s (%3.0f%% of the step); most: %s" %
              (name, busy, 100.0 * busy / wall if wall > 0 else 0.0, top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
