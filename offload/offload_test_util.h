// Helpers for the offload tests (header-only, test binaries only): temporary directories, data
// patterns, a fault-injecting IoEnv, and running a check in a forked child (for process-wide
// limits: RLIMIT_FSIZE, RLIMIT_MEMLOCK, capabilities, mount namespaces).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "offload/io_env.h"
#include "offload/nvme_store.h"

namespace ferry::testing {

// A fresh directory under $FERRY_TEST_DIR, else /var/tmp (disk-backed), removed at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("FERRY_TEST_DIR");
    std::string tmpl = std::string(base != nullptr ? base : "/var/tmp") + "/ferry-offload-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(rng() >> 56);
  return v;
}

// Delays every completion by a random 0 to max_us microseconds (seeded), so the store's callers
// see transfers finish later and in other orders than the disk would have them.
class DelayingEnv : public IoEnv {
 public:
  DelayingEnv(uint32_t max_us, uint64_t seed) : max_us_(max_us), rng_(seed) {}
  int FilterCompletion(const IoRequest& request, int res) override {
    uint32_t us = 0;
    {
      std::lock_guard lock(mu_);
      us = uint32_t(rng_() % (uint64_t(max_us_) + 1));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return res;
  }

 private:
  const uint32_t max_us_;
  std::mutex mu_;
  std::mt19937_64 rng_;  // guarded by mu_
};

// Rewrites completions: each rule applies to the completions of one kind, skipping `skip`
// matching ones and then rewriting the next `count`.
class FaultyEnv : public IoEnv {
 public:
  enum class Action { kError, kShort };
  struct Rule {
    IoKind kind;
    Action action;
    int error = 0;  // for kError: the errno returned (negated)
    int skip = 0;
    int count = 1;
  };
  void AddRule(Rule r) {
    std::lock_guard lock(mu_);
    rules_.push_back(r);
  }
  int FilterCompletion(const IoRequest& request, int res) override {
    std::lock_guard lock(mu_);
    for (Rule& r : rules_) {
      if (r.kind != request.kind || r.count == 0) continue;
      if (r.skip > 0) {
        --r.skip;
        continue;
      }
      --r.count;
      ++faults_;
      if (r.action == Action::kError) return -r.error;
      // A short count, unaligned on purpose when there is room (half plus 100 bytes).
      if (res > 8192) return res / 2 + 100;
      return res > 1 ? res / 2 : res;
    }
    return res;
  }
  int RingInit(unsigned entries, io_uring* ring, unsigned flags) override {
    if (ring_error != 0) return -ring_error;
    if (refuse_ring_flags && flags != 0) return -EINVAL;  // as kernels before 6.1 do
    return IoEnv::RingInit(entries, ring, flags);
  }
  int RegisterBuffers(io_uring* ring, const iovec* iov, unsigned n) override {
    size_t total = 0;
    for (unsigned i = 0; i < n; ++i) total += iov[i].iov_len;
    if (total > register_limit) return -ENOMEM;
    return IoEnv::RegisterBuffers(ring, iov, n);
  }
  int Open(const std::string& path, int flags, mode_t mode) override {
    if (refuse_direct && (flags & O_DIRECT) != 0) return -EINVAL;
    return IoEnv::Open(path, flags, mode);
  }
  int faults() const {
    std::lock_guard lock(mu_);
    return faults_;
  }

  // Set before the store is opened.
  int ring_error = 0;
  bool refuse_ring_flags = false;  // RingInit refuses any IORING_SETUP_* flags with EINVAL
  size_t register_limit = SIZE_MAX;
  bool refuse_direct = false;

 private:
  mutable std::mutex mu_;
  std::vector<Rule> rules_;  // guarded by mu_
  int faults_ = 0;           // guarded by mu_
};

// Writes the first half of the `fail_at`-th write whole and then fails it with EIO, or, with
// `kill_process`, kills this process (SIGKILL) right there: a kill -9 (or power loss) in the
// middle of a write, as the disk sees it.
class TornWriteEnv : public IoEnv {
 public:
  explicit TornWriteEnv(int fail_at, bool kill_process = false)
      : left_(fail_at), kill_(kill_process) {}
  int writes_left() const { return left_.load(); }
  ssize_t Pwrite(int fd, const void* buf, size_t len, off_t offset) override {
    if (left_.fetch_sub(1) != 1) return IoEnv::Pwrite(fd, buf, len, offset);
    const size_t half = len / 2 / 4096 * 4096;
    if (half > 0) (void)IoEnv::Pwrite(fd, buf, half, offset);
    if (kill_) ::kill(::getpid(), SIGKILL);
    return -EIO;
  }

 private:
  std::atomic<int> left_;
  bool kill_;
};

// Whether io_uring can be used here at all (a ring can be created).
inline bool UringAvailable() {
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

// Runs `fn` in a forked child and returns what it returned: "" for success, "SKIP: <why>" when
// the check cannot run here, anything else is a failure message. REQUIRES: the calling process
// has no other threads running (fork copies only the caller).
inline std::string RunInChild(const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    close(fds[0]);
    const std::string msg = fn();
    ssize_t off = 0;
    while (off < ssize_t(msg.size())) {
      const ssize_t n = write(fds[1], msg.data() + off, msg.size() - off);
      if (n <= 0) break;
      off += n;
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "child died (status " + std::to_string(status) + "): " + msg;
  }
  return msg;
}

// Drops a capability from this process's effective and permitted sets (so limits apply to
// root too). Returns false when the kernel refuses.
inline bool DropCapability(int cap) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  data[cap / 32].effective &= ~(1u << (cap % 32));
  data[cap / 32].permitted &= ~(1u << (cap % 32));
  return syscall(SYS_capset, &hdr, data) == 0;
}

// Flips the bits `mask` of the byte at `offset` of the file at `path`, on disk (fsync'd).
// Returns "" when done, else what failed.
inline std::string FlipBitsOnDisk(const std::string& path, uint64_t offset, unsigned char mask) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return "open " + path + ": " + std::strerror(errno);
  unsigned char c = 0;
  std::string error;
  if (pread(fd, &c, 1, off_t(offset)) != 1) error = "pread";
  c ^= mask;
  if (error.empty() && pwrite(fd, &c, 1, off_t(offset)) != 1) error = "pwrite";
  if (error.empty() && fsync(fd) != 0) error = "fsync";
  close(fd);
  return error.empty() ? "" : error + " " + path + ": " + std::strerror(errno);
}

// Small options for fast tests: 64 KiB blocks, 8 in flight, 4 MiB segments, quiet log.
inline NvmeStoreOptions SmallStoreOptions(const std::string& dir, StoreBackend backend,
                                          IoEnv* env = nullptr) {
  NvmeStoreOptions o;
  o.directory = dir;
  o.block_bytes = 64 << 10;
  o.queue_depth = 8;
  o.segment_bytes = 4 << 20;
  o.backend = backend;
  o.io_threads = 2;
  o.env = env;
  o.log = [](std::string_view) {};
  return o;
}

// A store (small options) on a FaultyEnv in a fresh directory, for each backend; skipped where
// io_uring is missing. B_ is its block size.
class FaultyStoreTest : public ::testing::TestWithParam<StoreBackend> {
 protected:
  void SetUp() override {
    if (dir_.path().empty()) GTEST_SKIP() << "could not create a temporary directory";
    if (GetParam() == StoreBackend::kIoUring && !UringAvailable()) {
      GTEST_SKIP() << "io_uring is not available here (the thread-pool variants still run)";
    }
    auto s = NvmeStore::Open(SmallStoreOptions(dir_.path(), GetParam(), &env_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    B_ = store_->block_bytes();
  }
  void ExpectReadsBack(const std::string& name, const std::vector<std::byte>& data) {
    std::vector<std::byte> back(data.size());
    const Status s = store_->Read(name, back);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(back == data) << "entry '" << name << "' differs";
  }
  TempDir dir_;
  FaultyEnv env_;
  std::unique_ptr<NvmeStore> store_;
  size_t B_ = 0;
};

}  // namespace ferry::testing
