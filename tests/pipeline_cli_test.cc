// `ferry train --devices N` as a user runs it: the job planned for N CPU devices and trained
// through the pipeline executor gives the losses of the one-device run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class PipelineCliTest : public ferry::testing::CliTest {};

std::vector<double> Losses(const std::string& run) {
  std::ifstream metrics(run + "/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (!j.is_discarded()) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// Tolerance as the executor's trainer test (engine/exec/pipeline_executor_test.cc): the first
// loss comes from identical weights (the per-micro-batch sums are the same: 1e-12 relative);
// later ones follow updates whose gradients differ by reassociation only: 1e-5 relative.
TEST_F(PipelineCliTest, TwoDevicesGiveTheOneDeviceLosses) {
  const std::string job =
      "train --steps 3 --batch-size 4 --micro-batches 2 --seq-len 32 "
      "--threads 2 --out ";
  CommandResult one = Ferry(job + dir_ + "/one --devices 1");
  ASSERT_EQ(one.code, 0) << one.output;
  CommandResult two = Ferry(job + dir_ + "/two --devices 2");
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_NE(two.output.find("ferry train: 2 CPU devices, "), std::string::npos) << two.output;
  const std::vector<double> want = Losses(dir_ + "/one"), got = Losses(dir_ + "/two");
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(got[s], want[s], (s == 0 ? 1e-12 : 1e-5) * std::abs(want[s])) << "step " << s;
  }
  EXPECT_LT(want[2], want[0]);  // it learns: the comparison is not moot
}

TEST_F(PipelineCliTest, BadDeviceOptionsAreOneLine) {
  for (const std::string args : {"train --devices 0", "train --devices 65"}) {
    CommandResult r = Ferry(args + " --out " + dir_ + "/run");
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("--devices"), std::string::npos) << args << ": " << r.output;
  }
}

}  // namespace
