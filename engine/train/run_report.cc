#include "engine/train/run_report.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/byte_size.h"

namespace ferry {
namespace {

// "850 us", "12.3 ms", "1.52 s".
std::string Seconds(double s) {
  char buf[32];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.0f us", s * 1e6);
  } else if (s < 1.0) {
    std::snprintf(buf, sizeof(buf), "%.3g ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g s", s);
  }
  return buf;
}

// Rows of (label, measured, predicted), each column padded to its widest entry; a row's notes
// follow it on lines of their own, under its measured column.
class Table {
 public:
  void Add(std::string label, std::string measured, std::string predicted,
           std::vector<std::string> notes = {}) {
    rows_.push_back(
        {{std::move(label), std::move(measured), std::move(predicted)}, std::move(notes)});
  }
  std::string Text() const {
    size_t w[2] = {0, 0};
    for (const Row& r : rows_) {
      for (size_t c = 0; c < 2; ++c) w[c] = std::max(w[c], r.cells[c].size());
    }
    std::string out;
    for (const Row& r : rows_) {
      out += "  " + r.cells[0] + std::string(w[0] - r.cells[0].size() + 2, ' ') + r.cells[1] +
             std::string(w[1] - r.cells[1].size() + 3, ' ') + r.cells[2] + "\n";
      for (const std::string& note : r.notes) out += std::string(w[0] + 4, ' ') + note + "\n";
    }
    return out;
  }

 private:
  struct Row {
    std::array<std::string, 3> cells;
    std::vector<std::string> notes;
  };
  std::vector<Row> rows_;
};

// The median update after the first (which also creates what later steps reuse), with the range.
std::string StepTime(const std::vector<double>& steps) {
  if (steps.empty()) return "none (no update ran)";
  const size_t skip = steps.size() > 1 ? 1 : 0;
  std::vector<double> tail(steps.begin() + long(skip), steps.end());
  std::sort(tail.begin(), tail.end());
  const size_t n = tail.size();
  const double median = n % 2 == 1 ? tail[n / 2] : (tail[n / 2 - 1] + tail[n / 2]) / 2;
  std::string s = Seconds(median);
  s += skip == 0 ? " (the only update" : " (median of " + std::to_string(n) + " after the first";
  if (n > 1) s += "; min " + Seconds(tail.front()) + ", max " + Seconds(tail.back());
  return s + ")";
}

}  // namespace

std::string MeasuredVsPredicted(const plan::Plan& plan, const MeasuredRun& run) {
  using plan::FormatByteSize;
  const size_t stages = plan.stages.size();
  const std::string head = "measured vs predicted (plan for profile " + plan.hardware_name + ", " +
                           std::to_string(plan.gpus) +
                           (plan.gpus == 1 ? " device, " : " devices, ") + std::to_string(stages) +
                           (stages == 1 ? " forward stage" : " forward stages") + "):\n";
  Table table;
  table.Add("step time", StepTime(run.step_seconds), "predicted " + Seconds(plan.step_s));
  uint64_t arenas = 0;
  for (const MeasuredRun::Device& d : run.devices) {
    table.Add(d.name + " peak", FormatByteSize(d.peak_bytes) + " (arena)",
              "planned " + FormatByteSize(plan.memory.gpu.total()));
    arenas += d.host_resident;
  }
  const uint64_t pinned = plan.memory.pinned_host.total();
  const uint64_t pageable = plan.memory.pageable_host.total();
  // With the resident set at the start known, the row compares the rest of the peak (what the
  // run's own allocations added) with the plan, and a note shows how the peak splits.
  std::string host = "unknown";
  std::vector<std::string> notes;
  if (run.host_peak_bytes > 0 && run.host_start_bytes > 0) {
    const uint64_t known =
        run.host_start_bytes + run.host_setup_bytes + arenas + run.host_file_growth_bytes;
    const std::string rest =
        FormatByteSize(run.host_peak_bytes > known ? run.host_peak_bytes - known : 0);
    host = rest + " (the rest of the process's peak RSS, below)";
    notes.push_back("peak RSS " + FormatByteSize(run.host_peak_bytes) + " = " +
                    FormatByteSize(run.host_start_bytes) + " at start + " +
                    (run.host_setup_bytes > 0
                         ? FormatByteSize(run.host_setup_bytes) + " set-up (threads, libraries) + "
                         : std::string()) +
                    FormatByteSize(arenas) + " device arenas in RAM");
    notes.push_back("  + " +
                    (run.host_file_growth_bytes > 0 ? FormatByteSize(run.host_file_growth_bytes) +
                                                          " code and files paged in + "
                                                    : std::string()) +
                    rest + " the rest");
  } else if (run.host_peak_bytes > 0) {
    host = FormatByteSize(run.host_peak_bytes) + " (process RSS; " + FormatByteSize(arenas) +
           " of it device arenas in RAM)";
  }
  notes.push_back("planned: pinned " + FormatByteSize(pinned) + " + pageable " +
                  FormatByteSize(pageable));
  table.Add("host peak", host, "planned " + FormatByteSize(pinned + pageable), std::move(notes));
  if (const uint64_t nvme = plan.memory.nvme.total(); nvme > 0 || plan.nvme_read_bytes > 0) {
    std::string parts;
    if (run.nvme_bytes > 0) parts = "optimizer state";
    if (run.nvme_activation_bytes > 0)
      parts += std::string(parts.empty() ? "" : " + ") + "activations";
    if (run.nvme_base_copy_bytes > 0)
      parts += std::string(parts.empty() ? "" : " + ") + "the frozen base's copy";
    if (nvme > 0) {  // a base streamed from the model's files takes no space
      table.Add("NVMe",
                parts.empty() ? std::string("not measured")
                              : FormatByteSize(run.nvme_bytes + run.nvme_activation_bytes +
                                               run.nvme_base_copy_bytes) +
                                    " (" + parts + ")",
                "planned " + FormatByteSize(nvme));
    }
    table.Add(
        "NVMe/step",
        FormatByteSize(uint64_t(run.nvme_read_per_step)) + " read, " +
            FormatByteSize(uint64_t(run.nvme_written_per_step)) + " written" +
            (run.base_reads_measured ? ""
                                     : " (the frozen base's reads not measured: the last step "
                                       "was the run's first or followed an evaluation)"),
        "planned " + FormatByteSize(uint64_t(plan.nvme_read_bytes)) + " read, " +
            FormatByteSize(uint64_t(plan.nvme_write_bytes)) + " written");
  }
  return head + table.Text();
}

}  // namespace ferry
