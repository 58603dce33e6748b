#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/backend_access.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/onednn.h"

namespace ferry::cpu {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// How C is cut into tiles and K into panels, and what each worker's scratch holds.
struct Tiling {
  int64_t mb = 0, nb = 0, kb = 0;  // tile rows, tile columns, panel depth
  int64_t tiles_m = 0, tiles_n = 0;
  bool direct_a = true, direct_b = true, direct_c = true;  // f32: used in place
  int64_t a_floats = 0, b_floats = 0, c_floats = 0;        // per-worker scratch parts
  int64_t worker_floats = 0;                               // their sum, 64-byte aligned
};

Tiling PlanTiling(int threads, int64_t m, int64_t n, int64_t k, GemmDTypes dt) {
  Tiling t;
  t.direct_a = dt.a == DType::kF32;
  t.direct_b = dt.b == DType::kF32;
  t.direct_c = dt.c == DType::kF32;
  if (t.direct_a && t.direct_b && t.direct_c) {
    // One block per worker along the larger dimension of C: the other operand is shared (each
    // sgemm call packs it), so split the dimension that keeps the shared operand the smaller.
    // Blocks are multiples of 16 rows/columns, a multiple of every sgemm micro-kernel tile.
    if (m >= n) {
      t.mb = std::max<int64_t>(1, RoundUp(CeilDiv(m, threads), 16));
      t.nb = std::max<int64_t>(1, n);
    } else {
      t.mb = std::max<int64_t>(1, m);
      t.nb = std::max<int64_t>(1, RoundUp(CeilDiv(n, threads), 16));
    }
    t.kb = std::max<int64_t>(1, k);
  } else {
    t.mb = std::clamp<int64_t>(m, 1, kGemmTileM);
    t.nb = std::clamp<int64_t>(n, 1, kGemmTileN);
    t.kb = std::clamp<int64_t>(k, 1, kGemmTileK);
    if (!t.direct_a) t.a_floats = t.mb * t.kb;
    if (!t.direct_b) t.b_floats = t.kb * t.nb;
    if (!t.direct_c) t.c_floats = t.mb * t.nb;
    t.worker_floats = RoundUp(t.a_floats + t.b_floats + t.c_floats, 16);
  }
  t.tiles_m = CeilDiv(m, t.mb);
  t.tiles_n = CeilDiv(n, t.nb);
  return t;
}

// Converts rows [r0, r0 + rows) x columns [c0, c0 + cols) of a row-major (?, ld) tensor into a
// dense fp32 block with leading dimension `cols`.
void LoadBlock(const Tensor& t, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
               float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    ConvertRowToFloat(t.dtype, ElementAddress(t, (r0 + r) * ld + c0), dst + r * cols, cols);
  }
}

// An operand panel as sgemm takes it: fp32 pointer and leading dimension.
struct Panel {
  const float* p;
  int64_t ld;
};

// The stored block of `t` (row-major, leading dimension ld) covering rows [r0, r0 + rows) and
// columns [c0, c0 + cols): in place when f32, else converted into `stage`.
Panel StoredBlock(const Tensor& t, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                  bool direct, float* stage) {
  if (direct) {
    return {reinterpret_cast<const float*>(ElementAddress(t, r0 * ld + c0)), ld};
  }
  LoadBlock(t, ld, r0, rows, c0, cols, stage);
  return {stage, cols};
}

// Adds bias[n0 .. n0 + cols) to every row of the fp32 tile c (rows x cols, leading dim ldc).
void AddBias(const Tensor& bias, int64_t n0, float* c, int64_t ldc, int64_t rows, int64_t cols) {
  float stage[kStageElems];
  for (int64_t j0 = 0; j0 < cols; j0 += kStageElems) {
    const int64_t len = std::min(kStageElems, cols - j0);
    const float* b = LoadFloats(bias, n0 + j0, len, stage);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = c + r * ldc + j0;
      for (int64_t j = 0; j < len; ++j) row[j] += b[j];
    }
  }
}

// Computes one tile of C: rows [m0, m0 + mlen), columns [n0, n0 + nlen).
void RunTile(const GemmArgs& g, const GemmDims& d, const Tiling& t, int64_t m0, int64_t mlen,
             int64_t n0, int64_t nlen, float* worker_scratch) {
  float* stage_a = worker_scratch;
  float* stage_b = stage_a + t.a_floats;
  float* stage_c = stage_b + t.b_floats;
  float* c;
  int64_t ldc;
  float beta = g.beta;
  if (t.direct_c) {
    c = reinterpret_cast<float*>(ElementAddress(g.c, m0 * d.n + n0));
    ldc = d.n;
  } else {
    c = stage_c;
    ldc = nlen;
    if (beta != 0.0f) {
      LoadBlock(g.c, d.n, m0, mlen, n0, nlen, c);
    } else {
      std::memset(c, 0, size_t(mlen * nlen) * sizeof(float));
    }
  }
  if (d.k == 0) {  // C = beta * C: sgemm's leading-dimension rules forbid k == 0 on some paths
    for (int64_t r = 0; r < mlen; ++r) {
      float* row = c + r * ldc;
      for (int64_t j = 0; j < nlen; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
  }
  for (int64_t k0 = 0; k0 < d.k; k0 += t.kb) {
    const int64_t klen = std::min(t.kb, d.k - k0);
    // A is stored (M, K), or (K, M) when transposed; B is stored (K, N), or (N, K).
    const Panel a = g.trans_a ? StoredBlock(g.a, d.m, k0, klen, m0, mlen, t.direct_a, stage_a)
                              : StoredBlock(g.a, d.k, m0, mlen, k0, klen, t.direct_a, stage_a);
    const Panel b = g.trans_b ? StoredBlock(g.b, d.k, n0, nlen, k0, klen, t.direct_b, stage_b)
                              : StoredBlock(g.b, d.n, k0, klen, n0, nlen, t.direct_b, stage_b);
    Blas().Sgemm(g.trans_a, g.trans_b, int(mlen), int(nlen), int(klen), g.alpha, a.p, int(a.ld),
                 b.p, int(b.ld), k0 == 0 ? beta : 1.0f, c, int(ldc));
  }
  if (!g.bias.data.is_null()) AddBias(g.bias, n0, c, ldc, mlen, nlen);
  if (!t.direct_c) {
    for (int64_t r = 0; r < mlen; ++r) {
      ConvertRowFromFloat(c + r * ldc, g.c.dtype, ElementAddress(g.c, (m0 + r) * d.n + n0), nlen);
    }
  }
}

// bf16 A and B on oneDNN: C split into one block per worker (multiples of 32 rows/columns, AMX's
// tile height twice), each block one oneDNN call on this thread reading and writing the tensors in
// place. oneDNN packs B (its "weights") for every call, so C is split along N where N allows a
// block per worker: each worker then packs its own columns of B, not all of it (2048^3 on one
// AMX core: 245 GFLOP/s for a 2048 x 1024 block against 190 for 1024 x 2048).
Status RunOnOneDnn(ThreadPool& pool, const GemmArgs& g, const GemmDims& d, const OneDnn& dnnl,
                   std::byte* scratch, size_t worker_bytes) {
  const bool split_m = d.n < 32 * int64_t(pool.size()) && d.m > d.n;
  const int64_t along = split_m ? d.m : d.n;
  const int64_t block = RoundUp(CeilDiv(along, pool.size()), 32);
  std::mutex mu;
  Status first_error;  // guarded by mu
  pool.ParallelFor(CeilDiv(along, block), 1, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t start = i * block, len = std::min(block, along - start);
      const int64_t m0 = split_m ? start : 0, n0 = split_m ? 0 : start;
      Bf16GemmCall call{.trans_a = g.trans_a,
                        .trans_b = g.trans_b,
                        .m = split_m ? len : d.m,
                        .n = split_m ? d.n : len,
                        .k = d.k,
                        .alpha = g.alpha,
                        .beta = g.beta,
                        // A is stored (M, K), or (K, M) when transposed; B (K, N), or (N, K).
                        .a = ElementAddress(g.a, g.trans_a ? m0 : m0 * d.k),
                        .lda = g.trans_a ? d.m : d.k,
                        .b = ElementAddress(g.b, g.trans_b ? n0 * d.k : n0),
                        .ldb = g.trans_b ? d.k : d.n,
                        .c = ElementAddress(g.c, m0 * d.n + n0),
                        .ldc = d.n,
                        .c_dtype = g.c.dtype,
                        .scratch = scratch + size_t(worker) * worker_bytes,
                        .scratch_bytes = worker_bytes};
      if (!g.bias.data.is_null()) {
        call.bias = ElementAddress(g.bias, n0);
        call.bias_dtype = g.bias.dtype;
      }
      if (Status s = dnnl.Run(call); !s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = std::move(s);
      }
    }
  });
  return first_error;
}

}  // namespace

const OneDnn* Bf16GemmLibrary() {
  // By reference: a GEMM call copies no Result (nor its error text).
  const Result<const OneDnn*>& d = OneDnn::Load();
  return d.ok() ? *d : nullptr;
}

size_t GemmScratchBytes(int threads, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes) {
  const Tiling t = PlanTiling(threads, m, n, k, dtypes);
  return size_t(std::max(1, threads)) * size_t(t.worker_floats) * sizeof(float);
}

Status Gemm(ThreadPool& pool, const GemmArgs& g) { return GemmWith(pool, g, Bf16GemmLibrary()); }

Status GemmWith(ThreadPool& pool, const GemmArgs& g, const OneDnn* bf16) {
  const GemmDims d = GemmDimsOf(g);
  if (d.m == 0 || d.n == 0) return Status::Ok();
  const GemmDTypes dt{g.a.dtype, g.b.dtype, g.c.dtype};
  // The scratch is checked on every path, so a plan sized on this host fits on any other.
  const size_t need = GemmScratchBytes(pool.size(), d.m, d.n, d.k, dt);
  const size_t have = g.scratch.data.is_null() ? 0 : g.scratch.bytes();
  if (have < need) {
    return Status::InvalidArgument("gemm: scratch holds " + std::to_string(have) +
                                   " bytes, this product needs " + std::to_string(need) +
                                   " (size it with GemmScratchBytes)");
  }
  const Tiling t = PlanTiling(pool.size(), d.m, d.n, d.k, dt);
  float* scratch =
      need == 0 ? nullptr : reinterpret_cast<float*>(BackendAccess::Raw(g.scratch.data));
  if (bf16 != nullptr && dt.a == DType::kBF16 && dt.b == DType::kBF16 &&
      OneDnn::Takes(dt.c, !g.bias.data.is_null(), g.bias.dtype, g.alpha, d.k)) {
    return RunOnOneDnn(pool, g, d, *bf16, reinterpret_cast<std::byte*>(scratch),
                       size_t(t.worker_floats) * sizeof(float));
  }
  pool.ParallelFor(t.tiles_m * t.tiles_n, 1, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t m0 = (tile / t.tiles_n) * t.mb;
      const int64_t n0 = (tile % t.tiles_n) * t.nb;
      RunTile(g, d, t, m0, std::min(t.mb, d.m - m0), n0, std::min(t.nb, d.n - n0),
              scratch == nullptr ? nullptr : scratch + int64_t(worker) * t.worker_floats);
    }
  });
  return Status::Ok();
}

Status BiasGrad(ThreadPool& pool, const BiasGradArgs& a) {
  const int64_t rows = a.dy.dim(0);
  const int64_t cols = a.dy.dim(1);
  // Column blocks in parallel; each sums its columns over all rows in row order.
  pool.ParallelFor(cols, 64, [&](int64_t begin, int64_t end, int) {
    float stage[kStageElems];
    float sum[kStageElems];
    for (int64_t j0 = begin; j0 < end; j0 += kStageElems) {
      const int64_t len = std::min(kStageElems, end - j0);
      std::fill(sum, sum + len, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* dy = LoadFloats(a.dy, r * cols + j0, len, stage);
        for (int64_t j = 0; j < len; ++j) sum[j] += dy[j];
      }
      AccumulateFloats(sum, a.db, j0, len);
    }
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
