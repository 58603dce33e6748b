#include "engine/train/progress_bar.h"

#include <algorithm>
#include <cmath>

namespace ferry {

std::string FormatDuration(double seconds) {
  // Past 9999 hours (over a year) a clock reading says nothing more; it also keeps the rounding
  // below int64's range for any --steps (an ETA of 2^63 steps is about 10^19 s).
  constexpr double kLongest = 9999.0 * 3600;
  if (!(seconds < kLongest)) return seconds != seconds ? "?" : ">9999:00:00";
  const int64_t s = int64_t(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600),
                  (long long)(s / 60 % 60), (long long)(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  }
  return buf;
}

std::string FormatProgress(const ProgressReport& r, bool with_bar) {
  std::string line;
  if (with_bar) {
    constexpr int kWidth = 24;
    // In double: kWidth * step overflows int64 for --steps near 2^63.
    const int filled =
        r.total > 0 ? std::clamp(int(kWidth * (double(r.step) / double(r.total))), 0, kWidth) : 0;
    line =
        "[" + std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.') + "] ";
  }
  const double eta = r.step > 0 ? r.elapsed_s / double(r.step) * double(r.total - r.step) : 0;
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | %.0f tok/s | %s elapsed | ETA %s",
                (long long)r.step, (long long)r.total, r.loss, r.tokens_per_s,
                FormatDuration(r.elapsed_s).c_str(), FormatDuration(eta).c_str());
  return line + buf;
}

ProgressBar::ProgressBar(FILE* out, bool terminal, int64_t every)
    : out_(out), terminal_(terminal), every_(std::max<int64_t>(1, every)) {}

void ProgressBar::Report(const ProgressReport& r) {
  if (terminal_) {
    const std::string line = FormatProgress(r, /*with_bar=*/true);
    // Pad over the remains of a longer previous line.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
    last_width_ = line.size();
  } else if (r.step == 1 || r.step % every_ == 0 || r.step == r.total) {
    std::fprintf(out_, "%s\n", FormatProgress(r, /*with_bar=*/false).c_str());
  }
  std::fflush(out_);
}

void ProgressBar::Finish() {
  if (terminal_ && last_width_ > 0) std::fprintf(out_, "\n");
  last_width_ = 0;
  std::fflush(out_);
}

}  // namespace ferry
