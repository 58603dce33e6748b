#include "kernels/cpu/blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/load_once.h"

#ifndef FERRY_OPENBLAS_PATH
#define FERRY_OPENBLAS_PATH "libopenblas.so.0"
#endif

namespace ferry::cpu {

std::string OpenBlasCoreFor(const CpuFeatures& f) {
  if (f.avx512_core() && f.avx512_bf16) return "Cooperlake";
  if (f.avx512_core()) return "SkylakeX";
  if (f.avx2 && f.fma) return f.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  if (f.avx) return "Sandybridge";
  if (f.sse42) return "Nehalem";
  if (f.ssse3) return "Core2";
  return "Prescott";
}

namespace {

// Sets an environment variable for the library's load and puts the old value back afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

struct CpuBlasLoader {
  static Result<const CpuBlas*> LoadOnce() {
    auto* blas = new CpuBlas();  // lives as long as the process, as the library does
    const CpuFeatures f = DetectCpuFeatures();
    blas->host_isa_ = CpuIsaName(f);
    void* handle = nullptr;
    {
      std::optional<ScopedEnv> core;
      if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user != nullptr && *user) {
        blas->source_ = std::string("OPENBLAS_CORETYPE=") + user + " from the environment";
      } else {
        core.emplace("OPENBLAS_CORETYPE", OpenBlasCoreFor(f));
        blas->source_ = "chosen from CPU flags: " + blas->host_isa_;
      }
      ScopedEnv threads("OPENBLAS_NUM_THREADS", "1");
      for (const char* path : {FERRY_OPENBLAS_PATH, "libopenblas.so.0"}) {
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle != nullptr) {
          blas->path_ = path;
          break;
        }
      }
    }
    if (handle == nullptr) {
      const char* why = dlerror();
      delete blas;
      return Status::Unavailable(std::string("cannot load OpenBLAS (") + FERRY_OPENBLAS_PATH +
                                 "): " + (why ? why : "unknown dlopen error") +
                                 "; install Debian's libopenblas0-pthread");
    }
    auto sym = [&](const char* name) { return dlsym(handle, name); };
    blas->sgemm_ = reinterpret_cast<CpuBlas::SgemmFn>(sym("cblas_sgemm"));
    auto set_threads = reinterpret_cast<void (*)(int)>(sym("openblas_set_num_threads"));
    auto corename = reinterpret_cast<char* (*)()>(sym("openblas_get_corename"));
    auto config = reinterpret_cast<char* (*)()>(sym("openblas_get_config"));
    if (blas->sgemm_ == nullptr || set_threads == nullptr || corename == nullptr ||
        config == nullptr) {
      const std::string path = blas->path_;
      delete blas;
      return Status::Unavailable(path +
                                 " lacks cblas_sgemm, openblas_set_num_threads, "
                                 "openblas_get_corename or openblas_get_config: not OpenBLAS?");
    }
    set_threads(1);
    blas->core_ = corename();
    blas->config_ = config();
    return static_cast<const CpuBlas*>(blas);
  }
};

const Result<const CpuBlas*>& CpuBlas::Load() {
  return cpu::LoadOnce<CpuBlas, &CpuBlasLoader::LoadOnce>();
}

const CpuBlas& Blas() {
  const Result<const CpuBlas*>& b = CpuBlas::Load();
  if (!b.ok()) {
    std::fprintf(stderr, "ferry: %s\n", b.status().message().c_str());
    std::abort();
  }
  return **b;
}

std::string CpuBlas::Describe() const {
  // openblas_get_config() opens with "OpenBLAS <version>".
  std::string version = config_.substr(0, config_.find(' ', config_.find(' ') + 1));
  return version + ", core " + core_ + " (" + source_ + "); host ISA " + host_isa_;
}

}  // namespace ferry::cpu
