#include "offload/file_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <string>

namespace ferry {
namespace {

std::string ScratchDir() {
  const std::string dir = ::testing::TempDir() + "/ferry_file_io_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(FileIo, WriteTextFileReportsTheFailingPath) {
  Status s = WriteTextFile("/nonexistent-dir/ferry/x.svg", "x");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("/nonexistent-dir/ferry/x.svg"), std::string::npos);
}

TEST(FileIo, ReadsBackEveryByte) {
  const std::string path = ScratchDir() + "/bytes";
  std::string bytes = "line one\n";
  bytes += std::string("\0\xff\r\n", 4);
  bytes += std::string(200000, 'x');  // more than one read
  ASSERT_TRUE(WriteTextFile(path, bytes).ok());
  Result<std::string> back = ReadWholeFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, bytes);
  ASSERT_TRUE(WriteFileAtomically(path, std::string_view("new")).ok());
  EXPECT_EQ(*ReadWholeFile(path), "new");
  const std::span<const std::byte> pieces[] = {AsBytes("head"), AsBytes(""), AsBytes("tail")};
  ASSERT_TRUE(WritePiecesAtomically(path, pieces).ok());
  EXPECT_EQ(*ReadWholeFile(path), "headtail");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(AsBytes("ab").size(), 2u);
}

// One convention: the call, the path and the operating system's reason; NotFound only when the
// file does not exist.
TEST(FileIo, ReadErrorsNameThePathAndTheReason) {
  Result<std::string> missing = ReadWholeFile("/nonexistent-dir/ferry/config.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "open /nonexistent-dir/ferry/config.json: No such file or directory");
  Result<std::string> folder = ReadWholeFile(ScratchDir());
  EXPECT_EQ(folder.status().code(), StatusCode::kIOError);
  EXPECT_NE(folder.status().message().find("Is a directory"), std::string::npos)
      << folder.status().ToString();
}

// Files whose size says nothing (/proc, sysfs) are read to their end.
TEST(FileIo, ReadsFilesWithoutASize) {
  Result<std::string> status = ReadWholeFile("/proc/self/status");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("Name:"), std::string::npos);
}

}  // namespace
}  // namespace ferry
