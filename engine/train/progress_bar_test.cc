#include "engine/train/progress_bar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
