// The training progress display on stderr: step/total, loss, tokens/s and ETA. On a terminal one
// line rewritten in place (\r); otherwise (a log file, a pipe) a plain line every `every` steps and
// at the last step, so logs stay readable.
//
// Not thread-safe: one training loop reports to it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ferry {

struct ProgressReport {
  int64_t step = 0;  // updates done so far (1-based: after the first update, 1)
  int64_t total = 0;
  double loss = 0;
  double tokens_per_s = 0;  // over the run so far
  double elapsed_s = 0;
};

// "step 12/300 | loss 3.1416 | 4,210 tok/s | 0:07 elapsed | ETA 1:42" with a bar on terminals.
std::string FormatProgress(const ProgressReport& r, bool with_bar);
// "1:05", "1:02:03"; ">9999:00:00" past 9999 hours (and "?" for NaN).
std::string FormatDuration(double seconds);

class ProgressBar {
 public:
  // `out` is borrowed. `every`: steps between plain lines when not a terminal (>= 1).
  ProgressBar(FILE* out, bool terminal, int64_t every);
  void Report(const ProgressReport& r);
  // Ends the in-place line on a terminal.
  void Finish();

 private:
  FILE* out_;
  bool terminal_;
  int64_t every_;
  size_t last_width_ = 0;  // characters of the line now on screen (terminal)
};

}  // namespace ferry
