#include "kernels/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace ferry {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  FERRY_ASSIGN_OR_RETURN(int h, Half(x));
  FERRY_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status().ok());
  Status s = Status::Corruption("block 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "Corruption: block 7");
  EXPECT_EQ(s.WithContext("read a.bin").message(), "read a.bin: block 7");
  Status copy = s;
  EXPECT_EQ(copy.ToString(), s.ToString());
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write x").code(), StatusCode::kNoSpace);
  EXPECT_EQ(Status::FromErrno(ENOENT, "open x").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FromErrno(EIO, "read x").code(), StatusCode::kIOError);
}

TEST(Status, ResultPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

}  // namespace
}  // namespace ferry
