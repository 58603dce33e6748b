// nvme_bench: sequential write and read rate of the NVMe store at several block sizes and queue
// depths, next to fio (io_uring, O_DIRECT) on the same file, block size and queue depth, and next
// to a plain synchronous pread/pwrite loop, all in the same run.
//
// Each configuration runs twice, once per kind of memory the data comes from and goes to:
//  - "huge": transparent huge pages, as ferry's host pool maps its memory (HostPages), against
//    fio with --mem=shmhuge (hugetlb pages; needs pages reserved in /proc/sys/vm/nr_hugepages,
//    else fio's columns say n/a and a line says how many to reserve);
//  - "base": base pages (MADV_NOHUGEPAGE), against fio's default --mem=malloc.
// The kind of memory moves the rate more than anything the store does: every O_DIRECT transfer
// pins and maps its pages one by one, so a 1 MiB block costs 256 of them on 4 KiB pages and one on
// 2 MiB pages. Comparing the store on huge pages with fio on malloc'ed pages would flatter the
// store; each row compares like with like.
//
// Each configuration is measured $FERRY_BENCH_REPEAT times (default 3), store and fio taking turns
// within each repetition (store write and read, fio write and read on the store's own file, in
// that order in even repetitions and the other way round in odd ones; both after the store has
// laid the file out), so noise from other users of the machine hits both alike; the table shows the
// best rate of each and, after it, the spread (max - min) / max over the repetitions. W% and R%
// divide the best store rate by the best fio rate; mW% and mR% are the median over repetitions of
// store / fio within one repetition (the figure least moved by other users of a shared disk).
//
// Usage: nvme_bench [directory] — default $FERRY_BENCH_DIR, else a fresh directory under
// /var/tmp (usually disk-backed; /tmp may be tmpfs). $FERRY_BENCH_MIB sets the bytes per
// measurement (default 512). $FERRY_BENCH_BLOCK_KIB, $FERRY_BENCH_QD and $FERRY_BENCH_PAGES
// (huge or base), when set, keep only that block size, queue depth or kind of memory (for
// profiling one configuration). Every read is of data written first (no holes).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "kernels/host_memory.h"
#include "offload/store_rate.h"

namespace {

using ferry::HostAllocation;
using ferry::HostPages;

// Free hugetlb pages times their size, from /proc/meminfo (0 when none are reserved).
size_t FreeHugetlbBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t value = 0, free_pages = 0, page_kib = 0;
  while (f >> key >> value) {
    if (key == "HugePages_Free:") free_pages = value;
    if (key == "Hugepagesize:") page_kib = value;
    f.ignore(1 << 10, '\n');
  }
  return free_pages * page_kib * 1024;
}

// fio's bandwidth in bytes/s for one run. --refill_buffers: fresh random data for every write, as
// the store writes (fio's default reuses its few buffers, and this machine's virtual disk writes
// repeated data about 4x faster than unique data: 1.95 vs 0.50 GB/s at 1 MiB, QD 32, measured),
// which also makes fio's reads read unique data like the store's. A negative number (and the
// reason) when fio fails.
// `mem` is fio's --mem: "malloc" (base pages) or "shmhuge" (hugetlb pages).
double RunFio(const std::string& file, const char* rw, size_t bs, unsigned qd, size_t bytes,
              const char* mem, std::string* why) {
  const std::string cmd = "fio --name=x --filename=" + file + " --rw=" + rw +
                          " --bs=" + std::to_string(bs) + " --iodepth=" + std::to_string(qd) +
                          " --ioengine=io_uring --direct=1 --refill_buffers --mem=" + mem +
                          " --size=" + std::to_string(bytes) + " --output-format=json 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "popen failed";
    return -1;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) {
    *why = "fio exited with " + std::to_string(rc) + " (is fio installed?)";
    return -1;
  }
  const auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) {
    *why = "could not parse fio's JSON";
    return -1;
  }
  const auto& job = j["jobs"][0][std::string(rw) == "read" ? "read" : "write"];
  return job.value("bw_bytes", 0.0);
}

// A plain synchronous O_DIRECT pread/pwrite loop over the file; bytes/s. Writes unique random
// data (a buffer of the whole size, filled before the timing), as the store and fio do.
double SyncLoop(const std::string& file, bool write, size_t bs, size_t bytes, HostPages pages) {
  const int fd = open(file.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) return -1;
  auto buf = HostAllocation::Map(write ? bytes : bs, "sync loop buffer", pages);
  if (!buf.ok()) return -1;
  uint64_t x = 0x2545F4914F6CDD1Dull;
  auto* words = reinterpret_cast<uint64_t*>(buf->data());
  for (size_t i = 0; i < buf->size() / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off + bs <= bytes; off += bs) {
    const ssize_t n = write ? pwrite(fd, buf->data() + off, bs, off_t(off))
                            : pread(fd, buf->data(), bs, off_t(off));
    if (n != ssize_t(bs)) {
      close(fd);
      return -1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  return double(bytes / bs * bs) / s;
}

std::string Gb(double bytes_per_s) {
  if (bytes_per_s < 0) return "   n/a";
  char b[16];
  std::snprintf(b, sizeof b, "%6.2f", bytes_per_s / 1e9);
  return b;
}
// Rates of one column over the repetitions.
struct Samples {
  std::vector<double> v;
  double best() const {
    double b = -1;
    for (double x : v) b = std::max(b, x);
    return b;
  }
  // "  1.23 ±4%": the best rate in GB/s and the spread in percent of it.
  std::string Text() const {
    const double b = best();
    if (b <= 0) return Gb(-1) + "     ";
    double lo = b;
    for (double x : v) lo = std::min(lo, x);
    char s[16];
    std::snprintf(s, sizeof s, " ±%2.0f%%", 100.0 * (b - lo) / b);
    return Gb(b) + s;
  }
};

// The median over repetitions of store[r] / fio[r]: each repetition's store and fio runs are
// back to back, so their ratio cancels most of the machine's slow drift; the median drops the
// repetitions another user of the disk disturbed. -1 when a rate is missing.
double PairedMedian(const Samples& store, const Samples& fio) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(store.v.size(), fio.v.size()); ++i) {
    if (store.v[i] <= 0 || fio.v[i] <= 0) return -1;
    r.push_back(store.v[i] / fio.v[i]);
  }
  if (r.empty()) return -1;
  std::sort(r.begin(), r.end());
  const size_t n = r.size();
  return n % 2 == 1 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]);
}

std::string Pct(double a, double b) {
  if (a < 0 || b <= 0) return "  n/a";
  char s[16];
  std::snprintf(s, sizeof s, "%4.0f%%", 100.0 * a / b);
  return s;
}

// Measures and prints one row of the table; false when the store failed.
bool BenchRow(const std::string& dir, size_t bytes, int reps, size_t bs, unsigned qd,
              HostPages pages, bool* printed_backend) {
  const bool huge = pages == HostPages::kHugeWhereLarge;
  const char* pages_name = huge ? "huge" : "base";
  // fio's buffers: iodepth x bs, plus a huge page for alignment.
  const size_t fio_huge_bytes = qd * bs + (size_t{2} << 20);
  const bool fio_runs = !huge || FreeHugetlbBytes() >= fio_huge_bytes;
  const char* fio_mem = huge ? "shmhuge" : "malloc";
  ferry::NvmeStoreOptions o;
  o.directory = dir + "/store";
  o.block_bytes = bs;
  o.queue_depth = qd;
  o.max_registered_bytes = size_t{256} << 20;
  Samples st_w, st_r, fio_w, fio_r, sync_w, sync_r;
  std::string why;
  for (int r = 0; r < reps; ++r) {
    const ferry::StoreFileHook others = [&](const std::string& file, size_t n) {
      fio_w.v.push_back(fio_runs ? RunFio(file, "write", bs, qd, n, fio_mem, &why) : -1);
      fio_r.v.push_back(fio_runs ? RunFio(file, "read", bs, qd, n, fio_mem, &why) : -1);
      if (qd == 1) {
        sync_w.v.push_back(SyncLoop(file, true, bs, n, pages));
        sync_r.v.push_back(SyncLoop(file, false, bs, n, pages));
      }
    };
    // Odd repetitions run fio first, even ones the store, right after the layout write.
    auto rate = r % 2 == 0 ? ferry::MeasureStoreRate(o, bytes, others, nullptr, pages)
                           : ferry::MeasureStoreRate(o, bytes, nullptr, others, pages);
    if (!rate.ok()) {
      std::fprintf(stderr, "store measurement failed: %s\n", rate.status().ToString().c_str());
      return false;
    }
    if (!*printed_backend) {
      std::printf("# %s\n", rate->report.c_str());
      *printed_backend = true;
    }
    st_w.v.push_back(rate->write_bytes_per_s);
    st_r.v.push_back(rate->read_bytes_per_s);
  }
  if (!why.empty()) std::printf("# fio: %s\n", why.c_str());
  if (!fio_runs) {
    std::printf(
        "# fio --mem=shmhuge not run: it needs %zu MiB of free hugetlb pages, %zu MiB are "
        "free; reserve them with `echo %zu | sudo tee /proc/sys/vm/nr_hugepages`\n",
        fio_huge_bytes >> 20, FreeHugetlbBytes() >> 20, fio_huge_bytes >> 21);
  }
  std::printf("%5zu KiB %4u %5s | %s %s %s %s | %s %s %s %s | %s %s\n", bs >> 10, qd, pages_name,
              st_w.Text().c_str(), fio_w.Text().c_str(), Pct(st_w.best(), fio_w.best()).c_str(),
              Pct(PairedMedian(st_w, fio_w), 1).c_str(), st_r.Text().c_str(), fio_r.Text().c_str(),
              Pct(st_r.best(), fio_r.best()).c_str(), Pct(PairedMedian(st_r, fio_r), 1).c_str(),
              qd == 1 ? sync_w.Text().c_str() : "          -",
              qd == 1 ? sync_r.Text().c_str() : "          -");
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  bool made_dir = false;
  if (argc > 1) {
    dir = argv[1];
  } else if (const char* e = std::getenv("FERRY_BENCH_DIR")) {
    dir = e;
  } else {
    char tmpl[] = "/var/tmp/ferry-nvme-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp under /var/tmp");
      return 1;
    }
    dir = tmpl;
    made_dir = true;
  }
  const char* mib_env = std::getenv("FERRY_BENCH_MIB");
  const size_t bytes = size_t(mib_env ? std::atoi(mib_env) : 512) << 20;
  std::printf("nvme_bench: directory %s, %zu MiB per measurement, GB/s = 1e9 bytes/s\n",
              dir.c_str(), bytes >> 20);
  const char* rep_env = std::getenv("FERRY_BENCH_REPEAT");
  const int reps = std::max(1, rep_env ? std::atoi(rep_env) : 3);
  std::printf(
      "best of %d interleaved repetitions, ± spread (max - min) / max; W%%, R%%: best store / best "
      "fio; mW%%, mR%%: median over repetitions of store / fio in the same repetition\n",
      reps);
  std::printf(
      "transparent huge pages: %s (the \"huge\" rows get them only in mode always or "
      "madvise)\n",
      ferry::TransparentHugePagesMode().c_str());
  std::printf("%8s %4s %5s | %11s %11s %5s %5s | %11s %11s %5s %5s | %11s %11s\n", "block", "QD",
              "pages", "store.W", "fio.W", "W%", "mW%", "store.R", "fio.R", "R%", "mR%", "syncW",
              "syncR");
  bool printed_backend = false;
  int rc = 0;
  const char* only_bs = std::getenv("FERRY_BENCH_BLOCK_KIB");
  const char* only_qd = std::getenv("FERRY_BENCH_QD");
  const char* only_pages = std::getenv("FERRY_BENCH_PAGES");
  for (size_t bs : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    if (only_bs != nullptr && size_t(std::atoi(only_bs)) << 10 != bs) continue;
    for (unsigned qd : {1u, 8u, 32u}) {
      if (only_qd != nullptr && unsigned(std::atoi(only_qd)) != qd) continue;
      for (const HostPages pages : {HostPages::kHugeWhereLarge, HostPages::kBase}) {
        const char* pages_name = pages == HostPages::kBase ? "base" : "huge";
        if (only_pages != nullptr && std::string(only_pages) != pages_name) continue;
        if (!BenchRow(dir, bytes, reps, bs, qd, pages, &printed_backend)) {
          rc = 1;
          break;
        }
      }
      if (rc != 0) break;
    }
    if (rc != 0) break;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir + "/store", ec);
  if (made_dir) std::filesystem::remove(dir, ec);
  return rc;
}
