#include "kernels/cpu/onednn.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/load_once.h"

#ifndef FERRY_ONEDNN_PATH
#define FERRY_ONEDNN_PATH "libdnnl.so.2"
#endif

#if defined(__SANITIZE_THREAD__)
// oneDNN is not built with TSan: its primitive cache synchronizes through code TSan cannot see,
// and the intercepted calls inside it (memcmp of a cache key another worker allocated) then read
// as races. Reports with a oneDNN frame are the library's, not ferry's; every ferry access stays
// checked. (TSan reads this hook at start-up; the runtime's weak default returns "".)
extern "C" const char* __tsan_default_suppressions() { return "race:libdnnl.so\n"; }
#endif

namespace ferry::cpu {

// The oneDNN C API calls ferry makes, resolved with dlsym (the library is not linked).
struct OneDnnApi {
  decltype(&dnnl_engine_create) engine_create;
  decltype(&dnnl_engine_destroy) engine_destroy;
  decltype(&dnnl_stream_create) stream_create;
  decltype(&dnnl_stream_destroy) stream_destroy;
  decltype(&dnnl_memory_desc_init_by_strides) md_init;
  decltype(&dnnl_matmul_desc_init) matmul_desc_init;
  decltype(&dnnl_primitive_attr_create) attr_create;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy;
  decltype(&dnnl_primitive_attr_set_output_scales) attr_set_output_scales;
  decltype(&dnnl_primitive_attr_set_post_ops) attr_set_post_ops;
  decltype(&dnnl_primitive_attr_set_scratchpad_mode) attr_set_scratchpad_mode;
  decltype(&dnnl_primitive_desc_query_md) pd_query_md;
  decltype(&dnnl_memory_desc_get_size) md_get_size;
  decltype(&dnnl_post_ops_create) post_ops_create;
  decltype(&dnnl_post_ops_destroy) post_ops_destroy;
  decltype(&dnnl_post_ops_append_sum) post_ops_append_sum;
  decltype(&dnnl_primitive_desc_create) pd_create;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy;
  decltype(&dnnl_primitive_desc_query) pd_query;
  decltype(&dnnl_primitive_create) primitive_create;
  decltype(&dnnl_primitive_destroy) primitive_destroy;
  decltype(&dnnl_primitive_execute) primitive_execute;
  decltype(&dnnl_memory_create) memory_create;
  decltype(&dnnl_memory_destroy) memory_destroy;
  decltype(&dnnl_stream_wait) stream_wait;
  decltype(&dnnl_version) version;
  decltype(&dnnl_get_effective_cpu_isa) effective_isa;
  void (*omp_set_num_threads)(int);
};

namespace {

const char* IsaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    default:
      return "below avx2";
  }
}

dnnl_data_type_t DnnlType(DType t) { return t == DType::kBF16 ? dnnl_bf16 : dnnl_f32; }

// Owns the oneDNN objects of one call; each destroy function takes null.
struct CallObjects {
  const OneDnnApi* api;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t primitive = nullptr;
  dnnl_stream_t stream = nullptr;
  dnnl_memory_t mem[5] = {};  // A, B, C, bias, scratchpad
  ~CallObjects() {
    for (dnnl_memory_t m : mem) api->memory_destroy(m);
    api->stream_destroy(stream);
    api->primitive_destroy(primitive);
    api->pd_destroy(pd);
    api->post_ops_destroy(post_ops);
    api->attr_destroy(attr);
  }
};

Status Check(dnnl_status_t s, const char* call) {
  if (s == dnnl_success) return Status::Ok();
  return Status::Internal(std::string("oneDNN ") + call + " failed with status " +
                          std::to_string(int(s)));
}

// The matmul's primitive descriptor (and its attributes, owned by `o`) for `c`: in user
// scratchpad mode (the caller's scratch), or with oneDNN's own scratchpad.
Status CreateDescriptor(const OneDnnApi& api, dnnl_engine_t engine, const Bf16GemmCall& c,
                        bool user_scratchpad, CallObjects& o, dnnl_memory_desc_t md[4]) {
  // Logical A (m, k) and B (k, n); a transposed operand is the same matrix with swapped strides.
  const dnnl_dims_t a_dims = {c.m, c.k}, b_dims = {c.k, c.n}, c_dims = {c.m, c.n};
  const dnnl_dims_t bias_dims = {1, c.n};
  const dnnl_dims_t a_strides = {c.trans_a ? 1 : c.lda, c.trans_a ? c.lda : 1};
  const dnnl_dims_t b_strides = {c.trans_b ? 1 : c.ldb, c.trans_b ? c.ldb : 1};
  const dnnl_dims_t c_strides = {c.ldc, 1}, bias_strides = {c.n, 1};
  FERRY_RETURN_IF_ERROR(Check(api.md_init(&md[0], 2, a_dims, dnnl_bf16, a_strides), "md(A)"));
  FERRY_RETURN_IF_ERROR(Check(api.md_init(&md[1], 2, b_dims, dnnl_bf16, b_strides), "md(B)"));
  FERRY_RETURN_IF_ERROR(
      Check(api.md_init(&md[2], 2, c_dims, DnnlType(c.c_dtype), c_strides), "md(C)"));
  if (c.bias != nullptr) {
    FERRY_RETURN_IF_ERROR(
        Check(api.md_init(&md[3], 2, bias_dims, DnnlType(c.bias_dtype), bias_strides), "md(bias)"));
  }
  dnnl_matmul_desc_t desc;
  FERRY_RETURN_IF_ERROR(Check(
      api.matmul_desc_init(&desc, &md[0], &md[1], c.bias != nullptr ? &md[3] : nullptr, &md[2]),
      "matmul_desc_init"));
  FERRY_RETURN_IF_ERROR(Check(api.attr_create(&o.attr), "primitive_attr_create"));
  if (user_scratchpad) {
    FERRY_RETURN_IF_ERROR(Check(api.attr_set_scratchpad_mode(o.attr, dnnl_scratchpad_mode_user),
                                "set_scratchpad_mode"));
  }
  if (c.alpha != 1.0f) {
    FERRY_RETURN_IF_ERROR(
        Check(api.attr_set_output_scales(o.attr, 1, 0, &c.alpha), "set_output_scales"));
  }
  if (c.beta != 0.0f) {
    FERRY_RETURN_IF_ERROR(Check(api.post_ops_create(&o.post_ops), "post_ops_create"));
    FERRY_RETURN_IF_ERROR(Check(api.post_ops_append_sum(o.post_ops, c.beta), "append_sum"));
    FERRY_RETURN_IF_ERROR(Check(api.attr_set_post_ops(o.attr, o.post_ops), "set_post_ops"));
  }
  return Check(api.pd_create(&o.pd, &desc, o.attr, engine, nullptr), "primitive_desc_create");
}

}  // namespace

struct OneDnnLoader {
  static Result<const OneDnn*> LoadOnce() {
    const CpuFeatures f = DetectCpuFeatures();
    if (!f.avx512_bf16 && !f.amx_bf16) {
      return Status::Unavailable("the CPU has neither AVX512-BF16 nor AMX-BF16 (host ISA " +
                                 CpuIsaName(f) + ")");
    }
    void* handle = dlopen(FERRY_ONEDNN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) handle = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      return Status::Unavailable(std::string("cannot load oneDNN (") + FERRY_ONEDNN_PATH +
                                 "): " + (why ? why : "unknown dlopen error") +
                                 "; install Debian's libdnnl2");
    }
    auto api_owner = std::make_unique<OneDnnApi>();
    OneDnnApi* api = api_owner.get();
    bool missing = false;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      missing |= fn == nullptr;
    };
    sym(api->engine_create, "dnnl_engine_create");
    sym(api->engine_destroy, "dnnl_engine_destroy");
    sym(api->stream_create, "dnnl_stream_create");
    sym(api->stream_destroy, "dnnl_stream_destroy");
    sym(api->md_init, "dnnl_memory_desc_init_by_strides");
    sym(api->matmul_desc_init, "dnnl_matmul_desc_init");
    sym(api->attr_create, "dnnl_primitive_attr_create");
    sym(api->attr_destroy, "dnnl_primitive_attr_destroy");
    sym(api->attr_set_output_scales, "dnnl_primitive_attr_set_output_scales");
    sym(api->attr_set_post_ops, "dnnl_primitive_attr_set_post_ops");
    sym(api->attr_set_scratchpad_mode, "dnnl_primitive_attr_set_scratchpad_mode");
    sym(api->pd_query_md, "dnnl_primitive_desc_query_md");
    sym(api->md_get_size, "dnnl_memory_desc_get_size");
    sym(api->post_ops_create, "dnnl_post_ops_create");
    sym(api->post_ops_destroy, "dnnl_post_ops_destroy");
    sym(api->post_ops_append_sum, "dnnl_post_ops_append_sum");
    sym(api->pd_create, "dnnl_primitive_desc_create");
    sym(api->pd_destroy, "dnnl_primitive_desc_destroy");
    sym(api->pd_query, "dnnl_primitive_desc_query");
    sym(api->primitive_create, "dnnl_primitive_create");
    sym(api->primitive_destroy, "dnnl_primitive_destroy");
    sym(api->primitive_execute, "dnnl_primitive_execute");
    sym(api->memory_create, "dnnl_memory_create");
    sym(api->memory_destroy, "dnnl_memory_destroy");
    sym(api->stream_wait, "dnnl_stream_wait");
    sym(api->version, "dnnl_version");
    sym(api->effective_isa, "dnnl_get_effective_cpu_isa");
    sym(api->omp_set_num_threads, "omp_set_num_threads");  // libgomp, oneDNN's dependency
    if (missing) {
      return Status::Unavailable(std::string(FERRY_ONEDNN_PATH) +
                                 " lacks a oneDNN 2.x C API symbol (matmul, memory, stream, "
                                 "version) or omp_set_num_threads");
    }
    api->omp_set_num_threads(1);
    dnnl_engine_t engine = nullptr;
    if (api->engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
      return Status::Unavailable("oneDNN could not create its CPU engine");
    }
    // The engine is destroyed unless the path turns out usable (then it lives with the process).
    auto engine_destroy = api->engine_destroy;
    std::unique_ptr<dnnl_engine, decltype(engine_destroy)> engine_owner(engine, engine_destroy);
    const dnnl_version_t* v = api->version();
    const dnnl_cpu_isa_t isa = api->effective_isa();
    const std::string version = "oneDNN " + std::to_string(v->major) + "." +
                                std::to_string(v->minor) + "." + std::to_string(v->patch);
    // The implementation oneDNN picks for a bf16 product (a query, nothing is timed).
    std::vector<uint16_t> zeros(64 * 64);
    std::vector<float> out(64 * 64);
    Bf16GemmCall probe{.m = 64,
                       .n = 64,
                       .k = 64,
                       .a = zeros.data(),
                       .lda = 64,
                       .b = zeros.data(),
                       .ldb = 64,
                       .c = out.data(),
                       .ldc = 64};
    CallObjects o{api};
    dnnl_memory_desc_t md[4];
    const char* impl = nullptr;
    if (!CreateDescriptor(*api, engine, probe, /*user_scratchpad=*/false, o, md).ok() ||
        api->pd_query(o.pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        impl == nullptr) {
      return Status::Unavailable(version + " offers no bf16 matmul at max ISA " + IsaName(isa));
    }
    const std::string impl_name = impl;
    if (impl_name.rfind("ref", 0) == 0 || impl_name.find("bf16") == std::string::npos) {
      return Status::Unavailable(version + " runs bf16 matmul only as '" + impl_name +
                                 "' at max ISA " + IsaName(isa) +
                                 " (DNNL_MAX_CPU_ISA caps it below its bf16 kernels?)");
    }
    auto* dnnl = new OneDnn();         // process lifetime, as above
    dnnl->api_ = api_owner.release();  // lives as long as the process, as the library does
    dnnl->engine_ = engine_owner.release();
    dnnl->describe_ = version + ", " + impl_name + " (max ISA " + IsaName(isa) + ")";
    return static_cast<const OneDnn*>(dnnl);
  }
};

const Result<const OneDnn*>& OneDnn::Load() { return LoadOnce<OneDnn, &OneDnnLoader::LoadOnce>(); }

bool OneDnn::Takes(DType c, bool has_bias, DType bias, float alpha, int64_t k) {
  const auto f32_or_bf16 = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  return k > 0 && f32_or_bf16(c) && (!has_bias || (f32_or_bf16(bias) && alpha == 1.0f));
}

namespace {

// The block (m0, n0, m, n) of call c's product: the same operands, offset.
Bf16GemmCall Block(const Bf16GemmCall& c, int64_t m0, int64_t n0, int64_t m, int64_t n) {
  Bf16GemmCall b = c;
  b.m = m;
  b.n = n;
  const auto at = [](const void* p, int64_t elems, DType t) {
    return static_cast<const char*>(p) + elems * int64_t(DTypeSize(t));
  };
  b.a = at(c.a, c.trans_a ? m0 : m0 * c.lda, DType::kBF16);
  b.b = at(c.b, c.trans_b ? n0 * c.ldb : n0, DType::kBF16);
  b.c = const_cast<char*>(at(c.c, m0 * c.ldc + n0, c.c_dtype));
  if (c.bias != nullptr) b.bias = at(c.bias, n0, c.bias_dtype);
  return b;
}

// The scratchpad bytes oneDNN asks of `o`'s primitive.
size_t ScratchpadBytes(const OneDnnApi& api, const CallObjects& o) {
  const dnnl_memory_desc_t* md = api.pd_query_md(o.pd, dnnl_query_scratchpad_md, 0);
  return md != nullptr ? api.md_get_size(md) : 0;
}

// Runs the product `c` whose descriptor `o` holds, with c.scratch as its scratchpad.
Status Execute(const OneDnnApi& api, dnnl_engine_t engine, const Bf16GemmCall& c, CallObjects& o,
               const dnnl_memory_desc_t md[4]) {
  // The primitive comes from oneDNN's own cache after the first call of a shape.
  FERRY_RETURN_IF_ERROR(Check(api.primitive_create(&o.primitive, o.pd), "primitive_create"));
  FERRY_RETURN_IF_ERROR(
      Check(api.stream_create(&o.stream, engine, dnnl_stream_default_flags), "stream_create"));
  const void* handles[4] = {c.a, c.b, c.c, c.bias};
  const int kArgs[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS,
                        DNNL_ARG_SCRATCHPAD};
  dnnl_exec_arg_t args[5];
  int n_args = 0;
  for (int i = 0; i < 4; ++i) {
    if (handles[i] == nullptr) continue;  // the bias, when there is none
    FERRY_RETURN_IF_ERROR(
        Check(api.memory_create(&o.mem[i], &md[i], engine, const_cast<void*>(handles[i])),
              "memory_create"));
    args[n_args++] = {kArgs[i], o.mem[i]};
  }
  const dnnl_memory_desc_t* scratch_md = api.pd_query_md(o.pd, dnnl_query_scratchpad_md, 0);
  if (scratch_md != nullptr && api.md_get_size(scratch_md) > 0) {
    FERRY_RETURN_IF_ERROR(
        Check(api.memory_create(&o.mem[4], scratch_md, engine, c.scratch), "memory_create"));
    args[n_args++] = {kArgs[4], o.mem[4]};
  }
  FERRY_RETURN_IF_ERROR(
      Check(api.primitive_execute(o.primitive, o.stream, n_args, args), "primitive_execute"));
  return Check(api.stream_wait(o.stream), "stream_wait");
}

// Runs block b: on b.scratch where oneDNN's scratchpad fits it, else on oneDNN's own.
Status RunBlock(const OneDnnApi& api, dnnl_engine_t engine, const Bf16GemmCall& b) {
  for (const bool user : {true, false}) {
    CallObjects o{&api};
    dnnl_memory_desc_t md[4];
    FERRY_RETURN_IF_ERROR(CreateDescriptor(api, engine, b, user, o, md));
    if (!user || ScratchpadBytes(api, o) <= b.scratch_bytes) return Execute(api, engine, b, o, md);
  }
  return Status::Ok();  // not reached: the library's mode always runs
}

// The next smaller block: the longer side halved to a multiple of 32 (AMX's tile height twice),
// else the shorter one; false when neither is 64 or more.
bool Shrink(int64_t& m, int64_t& n) {
  for (int64_t* side : {m >= n ? &m : &n, m >= n ? &n : &m}) {
    const int64_t half = (*side / 2) / 32 * 32;
    if (half >= 32) {
      *side = half;
      return true;
    }
  }
  return false;
}

}  // namespace

Status OneDnn::Run(const Bf16GemmCall& c) const {
  const OneDnnApi& api = *api_;
  api.omp_set_num_threads(1);  // this thread's OpenMP teams: oneDNN runs inline, here
  auto engine = static_cast<dnnl_engine_t>(engine_);
  // The largest block (the whole product, then halves) whose scratchpad fits the call's scratch.
  // Where none does, the whole product runs on oneDNN's own scratchpad (onednn.h).
  int64_t mb = c.m, nb = c.n;
  for (;;) {
    CallObjects o{api_};
    dnnl_memory_desc_t md[4];
    const Bf16GemmCall first = Block(c, 0, 0, mb, nb);
    FERRY_RETURN_IF_ERROR(CreateDescriptor(api, engine, first, /*user_scratchpad=*/true, o, md));
    if (ScratchpadBytes(api, o) <= c.scratch_bytes) {
      if (mb == c.m && nb == c.n) return Execute(api, engine, first, o, md);
      break;
    }
    if (!Shrink(mb, nb)) {
      CallObjects lib{api_};
      FERRY_RETURN_IF_ERROR(CreateDescriptor(api, engine, c, /*user_scratchpad=*/false, lib, md));
      return Execute(api, engine, c, lib, md);
    }
  }
  for (int64_t m0 = 0; m0 < c.m; m0 += mb) {
    for (int64_t n0 = 0; n0 < c.n; n0 += nb) {
      FERRY_RETURN_IF_ERROR(
          RunBlock(api, engine, Block(c, m0, n0, std::min(mb, c.m - m0), std::min(nb, c.n - n0))));
    }
  }
  return Status::Ok();
}

std::string Bf16GemmPathDescription() {
  const Result<const OneDnn*>& d = OneDnn::Load();
  if (d.ok()) return "bf16 GEMM: " + (*d)->Describe();
  return "bf16 GEMM: fp32 OpenBLAS on converted panels (oneDNN's bf16 path is off: " +
         d.status().message() + ")";
}

}  // namespace ferry::cpu
