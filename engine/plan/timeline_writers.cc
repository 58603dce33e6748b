#include "engine/plan/timeline_writers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "engine/json.h"

namespace ferry::plan {
namespace {

// One colour per TaskKind (Tableau 10 order), index = static_cast<int>(TaskKind).
constexpr std::array<unsigned, kTaskKindCount> kKindColour = {
    0x4C78A8,  // forward: blue
    0xF58518,  // backward: orange
    0xB279A2,  // tail: purple
    0x54A24B,  // weight upload: green
    0x88D27A,  // activation upload: light green
    0x72B7B2,  // activation download: teal
    0xE45756,  // gradient download: red
    0x9D755D,  // optimizer: brown
    0xBAB0AC,  // NVMe read: grey
    0x79706E,  // NVMe write: dark grey
    0xEECA3B,  // weight packing: yellow
    0xFF9DA6,  // gradient adding: pink
    0xCCCCCC,  // other
};

std::string Hex(unsigned rgb, double scale) {
  auto ch = [&](int shift) {
    return static_cast<unsigned>(std::lround(((rgb >> shift) & 0xFF) * scale));
  };
  char buf[8];
  std::snprintf(buf, sizeof(buf), "#%02X%02X%02X", ch(16), ch(8), ch(0));
  return buf;
}

std::string Escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Time unit for the axis and labels.
struct TimeUnit {
  double scale;  // multiply seconds by this
  const char* name;
};
TimeUnit PickUnit(double seconds) {
  if (seconds < 1e-3) return {1e6, "us"};
  if (seconds < 1.0) return {1e3, "ms"};
  return {1.0, "s"};
}

// A 1-2-5 tick step giving about `target` ticks over `span`.
double TickStep(double span, int target) {
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    if (f * mag >= raw) return f * mag;
  }
  return 10 * mag;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

std::string TimelineSvg(const Schedule& s, const SimResult& r, const SvgOptions& opt) {
  // Rows: per GPU compute (always), then its PCIe lanes if used; then host lanes if used.
  std::vector<LaneId> rows;
  auto lane_used = [&](LaneId lane) {
    return std::any_of(s.tasks.begin(), s.tasks.end(),
                       [&](const SimTask& t) { return t.lane == lane; });
  };
  for (int g = 0; g < s.gpus; ++g) {
    rows.push_back({LaneKind::kCompute, g});
    for (LaneKind k : {LaneKind::kHostToDevice, LaneKind::kDeviceToHost}) {
      if (lane_used({k, g})) rows.push_back({k, g});
    }
  }
  for (LaneKind k : {LaneKind::kHostMemory, LaneKind::kCpuOptimizer, LaneKind::kNvmeRead,
                     LaneKind::kNvmeWrite}) {
    if (lane_used({k, 0})) rows.push_back({k, 0});
  }

  const int width = std::max(600, opt.width_px);
  const int left = 170, right = 30, top = 64, row_h = 22, row_gap = 4, group_gap = 10;
  const int plot_w = width - left - right;
  std::vector<int> row_y;
  int y = top;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0 && (rows[i].gpu != rows[i - 1].gpu ||
                  IsPerGpuLane(rows[i].kind) != IsPerGpuLane(rows[i - 1].kind))) {
      y += group_gap;
    }
    row_y.push_back(y);
    y += row_h + row_gap;
  }
  const int axis_y = y + 4;
  const int legend_y = axis_y + 56;
  const int height = legend_y + 30;
  const double span = r.makespan_s > 0 ? r.makespan_s : 1.0;
  const TimeUnit unit = PickUnit(span);
  auto x_of = [&](double t) { return left + t / span * plot_w; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height
    << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"white\"/>\n";
  const std::string title = opt.title.empty() ? s.name : opt.title;
  o << "<text x=\"" << left << "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">" << Escape(title)
    << "</text>\n";
  std::string summary =
      "makespan " + Num(r.makespan_s * unit.scale) + " " + unit.name + "; GPU bubble fraction:";
  for (int g = 0; g < s.gpus; ++g) {
    summary += " GPU" + std::to_string(g) + " " + Num(100.0 * r.gpu_bubble_fraction[g]) + "%";
  }
  summary += " (mean " + Num(100.0 * r.mean_bubble_fraction) + "%)";
  o << "<text x=\"" << left << "\" y=\"42\" fill=\"#333\">" << Escape(summary) << "</text>\n";

  // Lane backgrounds and labels: grey = idle.
  for (size_t i = 0; i < rows.size(); ++i) {
    o << "<rect x=\"" << left << "\" y=\"" << row_y[i] << "\" width=\"" << plot_w << "\" height=\""
      << row_h << "\" fill=\"#EEEEEE\"/>\n";
    o << "<text x=\"" << left - 8 << "\" y=\"" << row_y[i] + row_h / 2 + 4
      << "\" text-anchor=\"end\">" << Escape(LaneLabel(rows[i])) << "</text>\n";
  }
  // Time axis: gridlines through the lanes, ticks and labels below.
  const double step = TickStep(span, 10);
  o << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + plot_w << "\" y2=\""
    << axis_y << "\" stroke=\"#333\"/>\n";
  for (double t = 0; t <= span * (1 + 1e-9); t += step) {
    const double x = x_of(t);
    o << "<line x1=\"" << Num(x) << "\" y1=\"" << top - 4 << "\" x2=\"" << Num(x) << "\" y2=\""
      << axis_y + 5 << "\" stroke=\"#BBBBBB\" stroke-width=\"0.5\"/>\n";
    o << "<text x=\"" << Num(x) << "\" y=\"" << axis_y + 18 << "\" text-anchor=\"middle\">"
      << Num(t * unit.scale) << "</text>\n";
  }
  o << "<text x=\"" << left + plot_w << "\" y=\"" << axis_y + 34
    << "\" text-anchor=\"end\" fill=\"#333\">time (" << unit.name << ")</text>\n";

  // Bars.
  std::set<int> kinds_present;
  for (size_t i = 0; i < s.tasks.size(); ++i) {
    const SimTask& t = s.tasks[i];
    const TaskTiming& tm = r.timing[i];
    if (tm.end_s <= tm.start_s) continue;
    size_t row = 0;
    while (row < rows.size() && !(rows[row] == t.lane)) ++row;
    if (row == rows.size()) continue;
    kinds_present.insert(static_cast<int>(t.kind));
    const double x0 = x_of(tm.start_s), w = std::max(0.5, x_of(tm.end_s) - x0);
    const double shade = t.stage >= 0 && t.stage % 2 == 1 ? 0.82 : 1.0;
    o << "<rect x=\"" << Num(x0) << "\" y=\"" << row_y[row] + 1 << "\" width=\"" << Num(w)
      << "\" height=\"" << row_h - 2 << "\" fill=\""
      << Hex(kKindColour[static_cast<int>(t.kind)], shade)
      << "\" stroke=\"white\" stroke-width=\"0.5\"><title>"
      << Escape(t.name + " (" + std::string(TaskKindName(t.kind)) + "): " +
                Num(tm.start_s * unit.scale) + " - " + Num(tm.end_s * unit.scale) + " " + unit.name)
      << "</title></rect>\n";
    if (w >= 6.5 * static_cast<double>(t.name.size()) + 4) {
      o << "<text x=\"" << Num(x0 + w / 2) << "\" y=\"" << row_y[row] + row_h / 2 + 4
        << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"white\">" << Escape(t.name)
        << "</text>\n";
    }
  }
  // Legend.
  int lx = left;
  for (int k : kinds_present) {
    const std::string name(TaskKindName(static_cast<TaskKind>(k)));
    o << "<rect x=\"" << lx << "\" y=\"" << legend_y - 11 << "\" width=\"14\" height=\"14\" fill=\""
      << Hex(kKindColour[k], 1.0) << "\"/>\n";
    o << "<text x=\"" << lx + 19 << "\" y=\"" << legend_y << "\">" << Escape(name) << "</text>\n";
    lx += 19 + 7 * static_cast<int>(name.size()) + 22;
  }
  o << "<rect x=\"" << lx << "\" y=\"" << legend_y - 11
    << "\" width=\"14\" height=\"14\" fill=\"#EEEEEE\" stroke=\"#999\" stroke-width=\"0.5\"/>\n";
  o << "<text x=\"" << lx + 19 << "\" y=\"" << legend_y << "\">idle</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string ChromeTraceJson(const Schedule& s, const SimResult& r,
                            std::span<const int64_t> task_steps) {
  using nlohmann::json;
  json events = json::array();
  const int host_pid = s.gpus;
  auto pid_of = [&](LaneId lane) { return IsPerGpuLane(lane.kind) ? lane.gpu : host_pid; };
  for (int g = 0; g <= s.gpus; ++g) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", g},
                      {"tid", 0},
                      {"args", {{"name", g < s.gpus ? "GPU " + std::to_string(g) : "host"}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", g},
                      {"tid", 0},
                      {"args", {{"sort_index", g}}}});
  }
  std::set<std::pair<int, int>> named;
  for (const SimTask& t : s.tasks) {
    const int pid = pid_of(t.lane), tid = static_cast<int>(t.lane.kind);
    if (named.insert({pid, tid}).second) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"args", {{"name", std::string(LaneKindName(t.lane.kind))}}}});
    }
  }
  for (size_t i = 0; i < s.tasks.size(); ++i) {
    const SimTask& t = s.tasks[i];
    json args = {{"stage", t.stage}, {"micro_batch", t.micro_batch}};
    if (t.bytes > 0) args["bytes"] = t.bytes;
    if (i < task_steps.size()) args["step"] = task_steps[i];
    events.push_back({{"name", t.name},
                      {"cat", std::string(TaskKindName(t.kind))},
                      {"ph", "X"},
                      {"ts", r.timing[i].start_s * 1e6},
                      {"dur", (r.timing[i].end_s - r.timing[i].start_s) * 1e6},
                      {"pid", pid_of(t.lane)},
                      {"tid", static_cast<int>(t.lane.kind)},
                      {"args", args}});
  }
  json doc = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"schedule", s.name}, {"makespan_s", r.makespan_s}}}};
  return doc.dump() + "\n";
}

}  // namespace ferry::plan
