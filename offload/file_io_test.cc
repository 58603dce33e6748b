#include "offload/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

// Each test's scratch folder, removed when the test ends.
class FileIo : public ::testing::Test {
 protected:
  std::string ScratchDir() const { return dir_.path(); }

 private:
  testing::TempDir dir_;
};

TEST_F(FileIo, WriteTextFileReportsTheFailingPath) {
  Status s = WriteTextFile("/nonexistent-dir/ferry/x.svg", "x");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("/nonexistent-dir/ferry/x.svg"), std::string::npos);
}

TEST_F(FileIo, ReadsBackEveryByte) {
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
TEST_F(FileIo, ReadErrorsNameThePathAndTheReason) {
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
TEST_F(FileIo, ReadsFilesWithoutASize) {
  Result<std::string> status = ReadWholeFile("/proc/self/status");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("Name:"), std::string::npos);
}

// Pieces made one at a time into one reused buffer are written in order; a piece that fails
// midway leaves the old file as it was and no temporary file.
TEST_F(FileIo, ProducedPiecesAreWrittenInOrderOrNotAtAll) {
  const std::string dir = ScratchDir(), path = dir + "/w.bin";
  std::string buffer;
  std::vector<size_t> asked;
  auto piece = [&](size_t i) -> Result<std::span<const std::byte>> {
    asked.push_back(i);
    if (i == 2 && buffer == "fail") return Status::NotFound("no piece 2");
    buffer.assign(i + 1, char('a' + i));
    return AsBytes(buffer);
  };
  ASSERT_TRUE(WriteProducedAtomically(path, 3, piece).ok());
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(*ReadWholeFile(path), "abbccc");
  buffer = "fail";
  auto failing = [&](size_t i) -> Result<std::span<const std::byte>> {
    if (i == 1) return Status::NotFound("no piece 1");
    return AsBytes(buffer);
  };
  const Status s = WriteProducedAtomically(path, 3, failing);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_EQ(*ReadWholeFile(path), "abbccc");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// The file size limit (as a full disk would) stops a write midway: an appended record is cut back
// off, a rewritten file keeps its old contents, and nothing partial is left.
TEST_F(FileIo, FailedWritesLeaveNoPartialFile) {
  const std::string dir = ScratchDir();
  Result<AppendFile> log = AppendFile::Open(dir + "/metrics.jsonl", /*truncate=*/true);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_TRUE(log->Append("one\n").ok());
  ASSERT_TRUE(WriteTextFile(dir + "/plan.svg", "old").ok());
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 6;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status append = log->Append("two two\n");  // 2 bytes fit, then EFBIG
  const Status rewrite = WriteTextFile(dir + "/plan.svg", "new and longer");
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(append.code(), StatusCode::kNoSpace);
  EXPECT_NE(append.message().find(dir + "/metrics.jsonl: File too large"), std::string::npos)
      << append.ToString();
  EXPECT_EQ(*ReadWholeFile(dir + "/metrics.jsonl"), "one\n");
  ASSERT_TRUE(log->Append("three\n").ok());
  EXPECT_EQ(*ReadWholeFile(dir + "/metrics.jsonl"), "one\nthree\n");
  EXPECT_EQ(rewrite.code(), StatusCode::kNoSpace);
  EXPECT_EQ(*ReadWholeFile(dir + "/plan.svg"), "old");
  EXPECT_FALSE(std::filesystem::exists(dir + "/plan.svg.tmp"));
}

// A device is written in place (never replaced by a file), and ENOSPC says the disk is full.
TEST_F(FileIo, FullDeviceSaysTheDiskIsFull) {
  const Status s = WriteTextFile("/dev/full", "x");
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_NE(s.message().find("/dev/full: No space left on device (the disk is full)"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/full"));
  Result<uint64_t> free = FreeSpace(ScratchDir());
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  EXPECT_EQ(FreeSpace("/nonexistent-dir/ferry").status().code(), StatusCode::kNotFound);
}

// A file with no name: the pieces read back through the mapping, byte for byte, and nothing is
// ever listed in the folder (before, during or after); a full disk (RLIMIT_FSIZE's EFBIG) and a
// missing folder fail naming the folder; a piece's error comes back as it is.
TEST_F(FileIo, AnUnnamedFileIsMappedAndLeavesNothing) {
  const std::string dir = ScratchDir() + "/unnamed";
  std::filesystem::create_directories(dir);
  auto entries = [&dir] {
    return std::distance(std::filesystem::directory_iterator(dir),
                         std::filesystem::directory_iterator());
  };
  std::string want;
  std::string piece;
  Result<UnnamedMapping> m = WriteUnnamedAndMap(dir, 3, [&](size_t i) {
    EXPECT_EQ(entries(), 0) << "piece " << i;
    piece = std::string(100000 * (i + 1), char('a' + i));
    want += piece;
    return Result<std::span<const std::byte>>(AsBytes(piece));
  });
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(entries(), 0);
  ASSERT_EQ(m->bytes.size(), want.size());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(m->bytes.data()), m->bytes.size()),
            want);
  UnnamedMapping copy = *m;  // copies share the mapping
  *m = {};
  EXPECT_EQ(char(copy.bytes[want.size() - 1]), 'c');
  // Its descriptor, open while the mapping lives, reads the same bytes again (as a streamed base
  // does, through /proc/self/fd).
  const int again =
      ::open(("/proc/self/fd/" + std::to_string(copy.fd)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(again, 0) << std::strerror(errno);
  char last = 0;
  EXPECT_EQ(::pread(again, &last, 1, off_t(want.size() - 1)), 1);
  EXPECT_EQ(last, 'c');
  ::close(again);

  Result<UnnamedMapping> missing = WriteUnnamedAndMap(dir + "/absent", 1, [&](size_t) {
    return Result<std::span<const std::byte>>(AsBytes(want));
  });
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
  EXPECT_NE(missing.status().message().find(dir + "/absent"), std::string::npos)
      << missing.status().ToString();
  Result<UnnamedMapping> failed =
      WriteUnnamedAndMap(dir, 2, [&](size_t i) -> Result<std::span<const std::byte>> {
        if (i == 1) return Status::NotFound("no such weight");
        return AsBytes(want);
      });
  EXPECT_EQ(failed.status().code(), StatusCode::kNotFound);

  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Result<UnnamedMapping> full = WriteUnnamedAndMap(
      dir, 1, [&](size_t) { return Result<std::span<const std::byte>>(AsBytes(want)); });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(full.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(full.status().message().find(dir), std::string::npos) << full.status().ToString();
  EXPECT_EQ(entries(), 0);
}

}  // namespace
}  // namespace ferry
