#include "engine/train/progress_bar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace ferry {
namespace {

std::string Capture(bool terminal, int64_t every, int64_t total) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&buf, &size);
  {
    ProgressBar bar(f, terminal, every);
    for (int64_t s = 1; s <= total; ++s) {
      bar.Report({.step = s,
                  .total = total,
                  .loss = 5.0 / double(s),
                  .tokens_per_s = 1000,
                  .elapsed_s = double(s)});
    }
    bar.Finish();
  }
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(ProgressBarTest, FormatsStepLossRateAndEta) {
  const std::string line = FormatProgress(
      {.step = 10, .total = 40, .loss = 2.5, .tokens_per_s = 1234.4, .elapsed_s = 20}, false);
  EXPECT_EQ(line, "step 10/40 | loss 2.5000 | 1234 tok/s | 0:20 elapsed | ETA 1:00");
  EXPECT_EQ(FormatDuration(3725), "1:02:05");
}

// --steps near 2^63: the bar and the ETA stay in range (no int64 overflow, which UBSan reports).
TEST(ProgressBarTest, HugeStepCountsStayInRange) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::string line = FormatProgress(
      {.step = kMax / 2, .total = kMax, .loss = 1, .tokens_per_s = 1, .elapsed_s = 10}, true);
  EXPECT_EQ(line.rfind("[############............] step 4611686018427387903/", 0), 0u) << line;
  EXPECT_NE(line.find("ETA 0:10"), std::string::npos) << line;
  const std::string first =
      FormatProgress({.step = 1, .total = kMax, .tokens_per_s = 1, .elapsed_s = 2}, false);
  EXPECT_NE(first.find("ETA >9999:00:00"), std::string::npos) << first;
  EXPECT_EQ(FormatDuration(9998.0 * 3600 + 59 * 60 + 59), "9998:59:59");
  EXPECT_EQ(FormatDuration(1e300), ">9999:00:00");
  EXPECT_EQ(FormatDuration(-5), "0:00");
}

TEST(ProgressBarTest, PlainLinesEveryNStepsWhenNotATerminal) {
  const std::string out = Capture(false, 4, 10);
  // Steps 1, 4, 8 and the last (10); no carriage returns.
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_NE(out.find("step 10/10"), std::string::npos);
}

TEST(ProgressBarTest, OneRewrittenLineOnATerminal) {
  const std::string out = Capture(true, 4, 10);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 10);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_NE(out.find("[########################] step 10/10"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry
