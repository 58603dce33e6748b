#include "offload/file_io.h"

#include <gtest/gtest.h>

#include <string>

namespace ferry {
namespace {

TEST(FileIo, WriteTextFileReportsTheFailingPath) {
  Status s = WriteTextFile("/nonexistent-dir/ferry/x.svg", "x");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("/nonexistent-dir/ferry/x.svg"), std::string::npos);
}

}  // namespace
}  // namespace ferry
