#include "engine/model/base_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

using testing::TempDir;

// Runs `f` when it goes out of scope (an assertion's early return included).
struct Cleanup {
  std::function<void()> f;
  ~Cleanup() { f(); }
};

// A tensor of `numel` elements of `dtype` at byte `offset` of `path`, whose bytes are `file`'s.
FileTensor At(const std::string& path, const std::vector<std::byte>& file, int64_t offset,
              int64_t numel, DType dtype) {
  FileTensor t;
  t.bytes = {file.data() + offset, size_t(numel) * DTypeSize(dtype)};
  t.dtype = dtype;
  t.shape = {numel};
  t.path = path;
  t.offset = offset;
  return t;
}

// Every element reaches `use` once, in order, as the file holds it, whatever the tensor's
// alignment, its element size and the buffer's size (pieces split elements between reads); the
// drive moves the blocks from the one holding the first byte to the one holding the last.
TEST(BaseFileReader, HandsOverEveryElementInOrderAndCountsTheBlocks) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/model.safetensors";
  const std::vector<std::byte> file = testing::Pattern(5 * 4096 + 123, 7);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  }
  struct Case {
    int64_t offset, numel;
    DType dtype;
    size_t buffer;
  };
  for (const Case& c :
       {Case{0, 1, DType::kF32, 2 * 4096}, Case{4093, 3, DType::kF32, 2 * 4096},
        Case{4094, 2000, DType::kF32, 2 * 4096}, Case{1, 9000, DType::kBF16, 2 * 4096},
        Case{4095, 5000, DType::kF16, 3 * 4096},
        Case{8190, 3000, DType::kF32, BaseReadBufferBytes(12000)},
        Case{100, (5 * 4096 + 123 - 100) / 2, DType::kBF16, 2 * 4096}}) {
    const std::string what = "offset " + std::to_string(c.offset) + ", " + std::to_string(c.numel) +
                             " x " + std::string(DTypeName(c.dtype)) + ", buffer " +
                             std::to_string(c.buffer);
    Result<BaseFileReader> reader = BaseFileReader::Create(c.buffer);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const FileTensor t = At(path, file, c.offset, c.numel, c.dtype);
    std::vector<std::byte> got;
    int64_t next = 0, calls = 0;
    const Status s =
        reader->Read(t, [&](std::span<const std::byte> bytes, int64_t first, int64_t n) {
          EXPECT_EQ(first, next) << what;
          EXPECT_EQ(bytes.size(), size_t(n) * DTypeSize(c.dtype)) << what;
          got.insert(got.end(), bytes.begin(), bytes.end());
          next = first + n;
          ++calls;
          return Status::Ok();
        });
    ASSERT_TRUE(s.ok()) << s.ToString() << ", " << what;
    EXPECT_EQ(next, c.numel) << what;
    ASSERT_EQ(got.size(), t.bytes.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), t.bytes.data(), got.size()), 0) << what;
    const uint64_t begin = uint64_t(c.offset) / 4096 * 4096;
    const uint64_t end = (uint64_t(c.offset) + t.bytes.size() + 4095) / 4096 * 4096;
    ASSERT_LE(end, (file.size() + 4095) / 4096 * 4096) << what;
    EXPECT_EQ(reader->disk_bytes(), end - begin) << what;
    EXPECT_EQ(reader->disk_bytes(), BaseReadDiskBytes(uint64_t(c.offset), t.bytes.size())) << what;
    EXPECT_EQ(reader->tensor_bytes(), t.bytes.size()) << what;
    // Pieces of at most the buffer's room: as many calls as reads (or one fewer when a read
    // ended inside the first element).
    EXPECT_GE(calls, int64_t((end - begin + c.buffer - 4096 - 1) / (c.buffer - 4096)) - 1) << what;
  }
}

// A file shorter than a tensor's bytes, a missing file and the caller's own error each stop the
// read with an error naming the file (or returning the caller's).
TEST(BaseFileReader, ShortOrMissingFilesAndTheCallersErrorsStopTheRead) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/short.safetensors";
  const std::vector<std::byte> file = testing::Pattern(3 * 4096, 3);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()), 2 * 4096 + 10);  // truncated
  }
  Result<BaseFileReader> reader = BaseFileReader::Create(2 * 4096);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto ignore = [](std::span<const std::byte>, int64_t, int64_t) { return Status::Ok(); };
  Status s = reader->Read(At(path, file, 100, 2100, DType::kF32), ignore);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(" ends at byte 8202, inside the bytes [100, 8500)"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("restore the folder"), std::string::npos) << s.ToString();

  s = reader->Read(At(dir.path() + "/missing.safetensors", file, 0, 4, DType::kF32), ignore);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("missing.safetensors"), std::string::npos) << s.ToString();

  s = reader->Read(
      At(path, file, 0, 4, DType::kF32),
      [](std::span<const std::byte>, int64_t, int64_t) { return Status::Cancelled("stop"); });
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
}

// A model file replaced after the run loaded it (another file under its name, as a folder copied
// or downloaded again) is refused, naming it, rather than read at the old offsets; the file it
// loaded is read.
TEST(BaseFileReader, AFileReplacedSinceItWasLoadedIsRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/model.safetensors";
  const std::vector<std::byte> file = testing::Pattern(3 * 4096, 5);
  auto write = [&](const std::string& to) {
    std::ofstream out(to, std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  };
  write(path);
  FileTensor t = At(path, file, 10, 100, DType::kF32);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Result<FileIdentity> loaded = IdentityOf(fd, path);
  ::close(fd);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  t.identity = *loaded;
  auto ignore = [](std::span<const std::byte>, int64_t, int64_t) { return Status::Ok(); };
  {
    Result<BaseFileReader> reader = BaseFileReader::Create(2 * 4096);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const Status s = reader->Read(t, ignore);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  write(path + ".new");  // the same bytes, another file
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
  Result<BaseFileReader> reader = BaseFileReader::Create(2 * 4096);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Status s = reader->Read(t, ignore);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(path + " is not the file the run loaded"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("restore the folder"), std::string::npos) << s.ToString();
}

// Read as a filesystem that refuses O_DIRECT gets it: buffered, the same elements and blocks, and
// no page of the file left in the page cache after it (no readahead past the tensor, and what it
// read dropped again). Not on tmpfs, whose pages are the file.
TEST(BaseFileReader, BufferedReadsLeaveNoPageOfTheFileCached) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  struct statfs fs {};
  if (::statfs(dir.path().c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << dir.path() << " is on tmpfs: its pages are the file";
  }
  const std::string path = dir.path() + "/model.safetensors";
  constexpr size_t kPages = 64;
  const std::vector<std::byte> file = testing::Pattern(kPages * 4096, 3);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const Cleanup close_fd{[fd] { ::close(fd); }};
  ASSERT_EQ(::write(fd, file.data(), file.size()), ssize_t(file.size()));
  ASSERT_EQ(::fsync(fd), 0);  // clean pages, which the kernel drops when asked
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  void* map = ::mmap(nullptr, file.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  const Cleanup unmap{[&] { ::munmap(map, file.size()); }};
  auto cached = [&] {
    std::vector<unsigned char> in(kPages);
    EXPECT_EQ(::mincore(map, file.size(), in.data()), 0) << std::strerror(errno);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  if (cached() != 0) GTEST_SKIP() << "the kernel kept the file's clean pages: nothing to check";
  Result<BaseFileReader> reader = BaseFileReader::Create(4 * 4096, BaseReadMode::kBuffered);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  // 20,000 bf16 elements from byte 4094: blocks 0 to 10 (11), read 3 at a time.
  const FileTensor t = At(path, file, 4094, 20000, DType::kBF16);
  std::vector<std::byte> got;
  const Status s = reader->Read(t, [&](std::span<const std::byte> bytes, int64_t, int64_t) {
    got.insert(got.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), t.bytes.size());
  EXPECT_EQ(std::memcmp(got.data(), t.bytes.data(), got.size()), 0);
  EXPECT_EQ(reader->disk_bytes(), 11 * 4096u);
  EXPECT_EQ(cached(), 0u);
}

// The blocks a tensor takes, by hand: from the block of its first byte to the block of its last;
// the most any place can make them; a tensor of no bytes reads nothing.
TEST(BaseFileReader, DiskBytesAreTheBlocksFromTheFirstByteToTheLast) {
  EXPECT_EQ(BaseReadDiskBytes(0, 0), 0u);
  EXPECT_EQ(BaseReadDiskBytes(4095, 0), 0u);
  EXPECT_EQ(BaseReadDiskBytes(0, 1), 4096u);
  EXPECT_EQ(BaseReadDiskBytes(4095, 1), 4096u);
  EXPECT_EQ(BaseReadDiskBytes(4095, 2), 2 * 4096u);
  EXPECT_EQ(BaseReadDiskBytes(0, 4096), 4096u);
  EXPECT_EQ(BaseReadDiskBytes(1, 4096), 2 * 4096u);
  EXPECT_EQ(BaseReadDiskBytes(8192, 4096), 4096u);
  EXPECT_EQ(BaseReadDiskBytes(4000, 8288), 3 * 4096u);  // 4000 .. 12287: blocks 0, 1, 2
  EXPECT_EQ(BaseReadMostDiskBytes(0), 0u);
  EXPECT_EQ(BaseReadMostDiskBytes(1), 4096u);
  EXPECT_EQ(BaseReadMostDiskBytes(2), 2 * 4096u);
  EXPECT_EQ(BaseReadMostDiskBytes(4096), 2 * 4096u);
  EXPECT_EQ(BaseReadMostDiskBytes(8192), 3 * 4096u);
  for (uint64_t offset = 0; offset < 3 * 4096; offset += 511) {
    for (uint64_t bytes : {1u, 100u, 4095u, 4096u, 4097u, 10000u}) {
      EXPECT_LE(BaseReadDiskBytes(offset, bytes), BaseReadMostDiskBytes(bytes));
    }
  }
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/model.safetensors";
  const std::vector<std::byte> file = testing::Pattern(8192, 5);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  Result<BaseFileReader> reader = BaseFileReader::Create(2 * 4096);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  int calls = 0;
  const Status s = reader->Read(At(path, file, 4093, 0, DType::kF32),
                                [&](std::span<const std::byte>, int64_t, int64_t) {
                                  ++calls;
                                  return Status::Ok();
                                });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(reader->disk_bytes(), 0u);
}

TEST(BaseFileReader, BufferTakesTheLargestTensorsBlocksAndOneMoreUpToFourMiB) {
  EXPECT_EQ(BaseFileReader::Create(4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BaseFileReader::Create(3 * 4096 + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BaseReadBufferBytes(0), 0u);
  EXPECT_EQ(BaseReadBufferBytes(1), 3 * 4096u);
  EXPECT_EQ(BaseReadBufferBytes(4096), 3 * 4096u);
  EXPECT_EQ(BaseReadBufferBytes(4097), 4 * 4096u);
  EXPECT_EQ(BaseReadBufferBytes(uint64_t(1) << 30), kBaseReadBufferMaxBytes);
}

}  // namespace
}  // namespace ferry
