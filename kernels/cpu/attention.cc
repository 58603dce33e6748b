#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/backend_access.h"
#include "kernels/cpu/attention_tile_gemm.h"

namespace ferry::cpu {
namespace {

constexpr int64_t kBQ = kAttentionQueryTile, kBK = kAttentionKeyTile;
// Rows of head_dim are zero-padded to a multiple of kLanes: the tile products
// (attention_tile_gemm.h) work on 8-column blocks.
constexpr int64_t kLanes = 8;
constexpr size_t kAlign = 64;

int64_t PaddedDim(int64_t d) { return (d + kLanes - 1) / kLanes * kLanes; }
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Where the scratch tensor's regions start (bytes).
struct ScratchLayout {
  size_t delta = 0;    // f32 (N, Hq): Delta_i = rowsum(dO_i * o_i), backward only
  size_t workers = 0;  // per-worker tiles, worker_bytes each
  size_t worker_bytes = 0;
  size_t total = 0;
  // (The mask lower bound, i32 (N), starts at offset 0.)
};

int64_t WorkerFloats(int64_t dp) { return 3 * kBQ * dp + 5 * kBK * dp + 2 * kBQ * kBK + 4 * kBQ; }

ScratchLayout Layout(int threads, const AttentionShape& s) {
  ScratchLayout l;
  const size_t n = size_t(s.tokens());
  l.delta = AlignUp(n * sizeof(int32_t));
  l.workers = l.delta + AlignUp(n * size_t(s.q_heads) * sizeof(float));
  l.worker_bytes = AlignUp(size_t(WorkerFloats(PaddedDim(s.head_dim))) * sizeof(float));
  l.total = l.workers + size_t(threads) * l.worker_bytes;
  return l;
}

// One worker's tiles, carved from its scratch block.
struct Tiles {
  float* q;      // (kBQ, Dp) queries, pre-multiplied by scale
  float* dout;   // (kBQ, Dp) dO rows
  float* acc;    // (kBQ, Dp) forward: unnormalized output; backward: dq accumulator
  float* kt;     // (Dp, kBK) keys, transposed
  float* vt;     // (Dp, kBK) values, transposed (backward)
  float* kv;     // (kBK, Dp) values (forward) or keys (dq pass), row-major
  float* dk;     // (kBK, Dp) dk accumulator (dk/dv pass)
  float* dv;     // (kBK, Dp) dv accumulator (dk/dv pass)
  float* s;      // (kBQ, kBK) scores, then probabilities
  float* dp;     // (kBQ, kBK) dO . v
  float* m;      // (kBQ) running max
  float* l;      // (kBQ) running sum
  float* lse;    // (kBQ)
  float* delta;  // (kBQ)
};

Tiles Carve(float* f, int64_t dp) {
  Tiles t;
  float** rows_by_dp[] = {&t.q, &t.dout, &t.acc};
  for (float** p : rows_by_dp) {
    *p = f;
    f += kBQ * dp;
  }
  float** key_tiles[] = {&t.kt, &t.vt, &t.kv, &t.dk, &t.dv};
  for (float** p : key_tiles) {
    *p = f;
    f += kBK * dp;
  }
  t.s = f;
  f += kBQ * kBK;
  t.dp = f;
  f += kBQ * kBK;
  float** rows[] = {&t.m, &t.l, &t.lse, &t.delta};
  for (float** p : rows) {
    *p = f;
    f += kBQ;
  }
  return t;
}

// dst (rows_padded, dp) = scale * src rows (stride `stride`, d valid columns); padding zero.
template <typename T>
void LoadRows(const T* src, int64_t stride, int64_t rows, int64_t rows_padded, int64_t d,
              int64_t dp, float scale, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) dst[r * dp + c] = scale * ToFloat(src[r * stride + c]);
    std::fill(dst + r * dp + d, dst + (r + 1) * dp, 0.0f);
  }
  std::fill(dst + rows * dp, dst + rows_padded * dp, 0.0f);
}

// dst (d, kBK) = transpose of src rows [0, rows), columns past `rows` zeroed.
template <typename T>
void LoadTransposed(const T* src, int64_t stride, int64_t rows, int64_t d, float* dst) {
  for (int64_t c = 0; c < rows; ++c) {
    for (int64_t k = 0; k < d; ++k) dst[k * kBK + c] = ToFloat(src[c * stride + k]);
  }
  for (int64_t k = 0; k < d; ++k) std::fill(dst + k * kBK + rows, dst + (k + 1) * kBK, 0.0f);
}

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Everything a work item needs; pointers into the caller's tensors and the scratch.
template <typename T>
struct Problem {
  int64_t batch, seq, hq, hkv, group, d, dp;
  float scale;
  TileGemmBlock gemm;
  const T* q;         // (N, Hq*D)
  const T* k;         // (N, Hkv*D)
  const T* v;         // (N, Hkv*D)
  const T* o;         // (N, Hq*D) backward input
  const T* d_o;       // (N, Hq*D)
  T* o_out;           // (N, Hq*D) forward output
  T* dq;              // (N, Hq*D)
  T* dk;              // (N, Hkv*D)
  T* dv;              // (N, Hkv*D)
  float* lse;         // (N, Hq)
  int32_t* lo;        // (N): first key position (within its sequence) a token may attend to
  float* delta;       // (N, Hq)
  std::byte* worker;  // worker w's tiles at worker + w * worker_bytes
  size_t worker_bytes;

  int64_t qstride() const { return hq * d; }
  int64_t kstride() const { return hkv * d; }
  int64_t query_tiles() const { return (seq + kBQ - 1) / kBQ; }
  Tiles tiles(int w) const {
    return Carve(reinterpret_cast<float*>(worker + size_t(w) * worker_bytes), dp);
  }
  // S (rows x cols) = Q K^T of a query tile (w.q) and a key tile (w.kt).
  void Scores(const Tiles& w, float* s, int64_t rows, int64_t cols, const float* x) const {
    std::fill(s, s + rows * kBK, 0.0f);
    TileGemm(gemm, rows, cols, x, dp, 1, w.kt, kBK, 0, d, s, kBK);
  }
};

// lo[n] for every token: the first key position its mask allows (start of its document run,
// raised to t - W + 1 under a window). Non-decreasing within a sequence, which is what lets a
// tile's key range start at its first query's bound.
void ComputeMaskBounds(const int32_t* doc_ids, int64_t batch, int64_t seq, int64_t window,
                       int32_t* lo) {
  for (int64_t b = 0; b < batch; ++b) {
    int64_t run_start = 0;
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t n = b * seq + t;
      if (doc_ids != nullptr && t > 0 && doc_ids[n] != doc_ids[n - 1]) run_start = t;
      lo[n] = int32_t(window > 0 ? std::max(run_start, t - window + 1) : run_start);
    }
  }
}

const int32_t* DocIds(const Tensor& t) {
  return t.data.is_null() ? nullptr : BackendAccess::Data<const int32_t>(t);
}

// The problem's shape, inputs shared by forward and backward, scratch carving and mask bounds.
template <typename T, typename Args>
Problem<T> MakeProblem(const Args& a, int threads) {
  const AttentionShape& s = a.shape;
  const ScratchLayout l = Layout(threads, s);
  std::byte* base = BackendAccess::Raw(a.scratch.data);
  Problem<T> p{};
  p.batch = s.batch, p.seq = s.seq_len, p.hq = s.q_heads, p.hkv = s.kv_heads;
  p.group = s.q_heads / s.kv_heads, p.d = s.head_dim, p.dp = PaddedDim(s.head_dim);
  p.scale = a.scale;
  p.gemm = SelectTileGemmBlock();
  p.q = BackendAccess::Data<const T>(a.q);
  p.k = BackendAccess::Data<const T>(a.k);
  p.v = BackendAccess::Data<const T>(a.v);
  p.lo = reinterpret_cast<int32_t*>(base);
  p.delta = reinterpret_cast<float*>(base + l.delta);
  p.worker = base + l.workers;
  p.worker_bytes = l.worker_bytes;
  ComputeMaskBounds(DocIds(a.doc_ids), p.batch, p.seq, a.window, p.lo);
  return p;
}

// A half-open index range; also the union of such ranges.
struct Range {
  int64_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
  void Add(Range r) {
    if (r.empty()) return;
    if (empty()) *this = r;
    begin = std::min(begin, r.begin), end = std::max(end, r.end);
  }
};

// The columns of a key tile starting at j0 (nk keys) that query i may see.
inline Range VisibleColumns(int64_t i, int64_t lo_i, int64_t j0, int64_t nk) {
  return {std::max<int64_t>(lo_i - j0, 0), std::min<int64_t>(i - j0 + 1, nk)};
}

// Forward of one (sequence, query head, query tile): online softmax over the visible key tiles.
template <typename T>
void ForwardItem(const Problem<T>& p, int64_t b, int64_t h, int64_t qt, const Tiles& w) {
  const int64_t i0 = qt * kBQ, nq = std::min(kBQ, p.seq - i0), nq4 = RoundUp(nq, 4);
  const int64_t hk = h / p.group, row0 = b * p.seq + i0, dp = p.dp;
  const int32_t* lo = p.lo + b * p.seq;  // (T) of this sequence
  LoadRows(p.q + row0 * p.qstride() + h * p.d, p.qstride(), nq, nq4, p.d, dp, p.scale, w.q);
  std::fill(w.m, w.m + nq, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + nq, 0.0f);
  std::fill(w.acc, w.acc + nq4 * dp, 0.0f);
  const int64_t key_end = i0 + nq;
  for (int64_t j0 = lo[i0]; j0 < key_end; j0 += kBK) {
    const int64_t nk = std::min(kBK, key_end - j0), nk8 = RoundUp(nk, 8), krow = b * p.seq + j0;
    LoadTransposed(p.k + krow * p.kstride() + hk * p.d, p.kstride(), nk, p.d, w.kt);
    LoadRows(p.v + krow * p.kstride() + hk * p.d, p.kstride(), nk, nk, p.d, dp, 1.0f, w.kv);
    p.Scores(w, w.s, nq4, nk8, w.q);
    Range used;  // columns any row uses
    for (int64_t r = 0; r < nq4; ++r) {
      float* s = w.s + r * kBK;
      const Range cols = r < nq ? VisibleColumns(i0 + r, lo[i0 + r], j0, nk) : Range{};
      if (cols.empty()) {
        std::fill(s, s + nk8, 0.0f);
        continue;
      }
      float mx = s[cols.begin];
      for (int64_t c = cols.begin + 1; c < cols.end; ++c) mx = std::max(mx, s[c]);
      const float m_new = std::max(w.m[r], mx);
      const float correction = std::exp(w.m[r] - m_new);  // 0 on the first visible tile
      float sum = 0.0f;
      for (int64_t c = cols.begin; c < cols.end; ++c) {
        s[c] = std::exp(s[c] - m_new);
        sum += s[c];
      }
      std::fill(s, s + cols.begin, 0.0f);
      std::fill(s + cols.end, s + nk8, 0.0f);
      w.l[r] = w.l[r] * correction + sum;
      w.m[r] = m_new;
      if (correction != 1.0f) {
        for (int64_t k = 0; k < dp; ++k) w.acc[r * dp + k] *= correction;
      }
      used.Add(cols);
    }
    // acc += P V over the used columns (P is zero outside each row's own).
    if (!used.empty())
      TileGemm(p.gemm, nq4, dp, w.s, kBK, 1, w.kv, dp, used.begin, used.end, w.acc, dp);
  }
  for (int64_t r = 0; r < nq; ++r) {  // every query sees itself: l[r] >= 1
    const float inv = 1.0f / w.l[r];
    T* o = p.o_out + (row0 + r) * p.qstride() + h * p.d;
    for (int64_t k = 0; k < p.d; ++k) o[k] = FromFloat<T>(w.acc[r * dp + k] * inv);
    p.lse[(row0 + r) * p.hq + h] = w.m[r] + std::log(w.l[r]);
  }
}

// Loads the backward's per-query rows of a tile: scaled q, dO (both zero-padded to a multiple of
// 4 rows), lse and Delta.
template <typename T>
void LoadQueryTile(const Problem<T>& p, int64_t row0, int64_t nq, int64_t h, const Tiles& w) {
  const int64_t nq4 = RoundUp(nq, 4);
  LoadRows(p.q + row0 * p.qstride() + h * p.d, p.qstride(), nq, nq4, p.d, p.dp, p.scale, w.q);
  LoadRows(p.d_o + row0 * p.qstride() + h * p.d, p.qstride(), nq, nq4, p.d, p.dp, 1.0f, w.dout);
  for (int64_t r = 0; r < nq; ++r) {
    w.lse[r] = p.lse[(row0 + r) * p.hq + h];
    w.delta[r] = p.delta[(row0 + r) * p.hq + h];
  }
}

// The columns and rows of a (query tile, key tile) pair that carry probability mass.
struct UsedSpan {
  Range cols, rows;
};

// For the query tile in w.q / w.dout (nq rows from position i0) against the key tile in
// w.kt / w.vt (nk keys from j0): P into w.s and dS = P * (dP - Delta) into w.dp, both zero
// outside each row's visible columns (and on padding rows).
template <typename T>
UsedSpan ProbabilitiesAndScoreGradients(const Problem<T>& p, const Tiles& w, const int32_t* lo,
                                        int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
  const int64_t nq4 = RoundUp(nq, 4), nk8 = RoundUp(nk, 8);
  p.Scores(w, w.s, nq4, nk8, w.q);
  std::fill(w.dp, w.dp + nq4 * kBK, 0.0f);
  TileGemm(p.gemm, nq4, nk8, w.dout, p.dp, 1, w.vt, kBK, 0, p.d, w.dp, kBK);  // dP = dO V^T
  UsedSpan used;
  for (int64_t r = 0; r < nq4; ++r) {
    float* s = w.s + r * kBK;
    float* ds = w.dp + r * kBK;
    const Range cols = r < nq ? VisibleColumns(i0 + r, lo[i0 + r], j0, nk) : Range{};
    for (int64_t c = cols.begin; c < cols.end; ++c) {
      s[c] = std::exp(s[c] - w.lse[r]);
      ds[c] = s[c] * (ds[c] - w.delta[r]);
    }
    const int64_t begin = std::max<int64_t>(cols.begin, 0), end = std::max(begin, cols.end);
    for (float* row : {s, ds}) {
      std::fill(row, row + std::min(begin, nk8), 0.0f);
      std::fill(row + std::min(end, nk8), row + nk8, 0.0f);
    }
    used.cols.Add(cols);
    used.rows.Add(cols.empty() ? Range{} : Range{r, r + 1});
  }
  return used;
}

// dq of one (sequence, query head, query tile).
template <typename T>
void QueryGradientItem(const Problem<T>& p, int64_t b, int64_t h, int64_t qt, const Tiles& w) {
  const int64_t i0 = qt * kBQ, nq = std::min(kBQ, p.seq - i0), nq4 = RoundUp(nq, 4);
  const int64_t hk = h / p.group, row0 = b * p.seq + i0, dp = p.dp;
  const int32_t* lo = p.lo + b * p.seq;
  LoadQueryTile(p, row0, nq, h, w);
  std::fill(w.acc, w.acc + nq4 * dp, 0.0f);
  const int64_t key_end = i0 + nq;
  for (int64_t j0 = lo[i0]; j0 < key_end; j0 += kBK) {
    const int64_t nk = std::min(kBK, key_end - j0), krow = b * p.seq + j0;
    const T* k = p.k + krow * p.kstride() + hk * p.d;
    LoadTransposed(k, p.kstride(), nk, p.d, w.kt);
    LoadTransposed(p.v + krow * p.kstride() + hk * p.d, p.kstride(), nk, p.d, w.vt);
    LoadRows(k, p.kstride(), nk, nk, p.d, dp, 1.0f, w.kv);
    const UsedSpan used = ProbabilitiesAndScoreGradients(p, w, lo, i0, nq, j0, nk);
    if (used.cols.empty()) continue;
    // dq += dS K over the used key columns.
    TileGemm(p.gemm, nq4, dp, w.dp, kBK, 1, w.kv, dp, used.cols.begin, used.cols.end, w.acc, dp);
  }
  for (int64_t r = 0; r < nq; ++r) {
    T* dq = p.dq + (row0 + r) * p.qstride() + h * p.d;
    for (int64_t k = 0; k < p.d; ++k) dq[k] = FromFloat<T>(p.scale * w.acc[r * dp + k]);
  }
}

// dk and dv of one (sequence, KV head, key tile), summed over the group's query heads.
template <typename T>
void KeyValueGradientItem(const Problem<T>& p, int64_t b, int64_t hk, int64_t kt, const Tiles& w) {
  const int64_t j0 = kt * kBK, nk = std::min(kBK, p.seq - j0), nk4 = RoundUp(nk, 4);
  const int64_t krow = b * p.seq + j0, dp = p.dp;
  const int32_t* lo = p.lo + b * p.seq;
  LoadTransposed(p.k + krow * p.kstride() + hk * p.d, p.kstride(), nk, p.d, w.kt);
  LoadTransposed(p.v + krow * p.kstride() + hk * p.d, p.kstride(), nk, p.d, w.vt);
  std::fill(w.dk, w.dk + nk4 * dp, 0.0f);
  std::fill(w.dv, w.dv + nk4 * dp, 0.0f);
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    // Queries before j0 see none of these keys; lo is non-decreasing, so the walk stops at the
    // first tile whose first query's bound is past the tile's last key.
    for (int64_t i0 = j0; i0 < p.seq && lo[i0] < j0 + nk; i0 += kBQ) {
      const int64_t nq = std::min(kBQ, p.seq - i0);
      LoadQueryTile(p, b * p.seq + i0, nq, h, w);
      const UsedSpan used = ProbabilitiesAndScoreGradients(p, w, lo, i0, nq, j0, nk);
      if (used.rows.empty()) continue;
      // dv += P^T dO and dk += dS^T q (q is pre-scaled: dk = scale * dS^T q), over used rows.
      const Range r = used.rows;
      TileGemm(p.gemm, nk4, dp, w.s, 1, kBK, w.dout, dp, r.begin, r.end, w.dv, dp);
      TileGemm(p.gemm, nk4, dp, w.dp, 1, kBK, w.q, dp, r.begin, r.end, w.dk, dp);
    }
  }
  for (int64_t c = 0; c < nk; ++c) {
    T* dk = p.dk + (krow + c) * p.kstride() + hk * p.d;
    T* dv = p.dv + (krow + c) * p.kstride() + hk * p.d;
    for (int64_t k = 0; k < p.d; ++k) {
      dk[k] = FromFloat<T>(w.dk[c * dp + k]);
      dv[k] = FromFloat<T>(w.dv[c * dp + k]);
    }
  }
}

Status CheckScratch(const Tensor& scratch, int threads, const AttentionShape& s) {
  const size_t need = AttentionScratchBytes(threads, s);
  if (scratch.data.is_null() || scratch.bytes() < need) {
    return Status::InvalidArgument("attention: scratch tensor holds " +
                                   std::to_string(scratch.data.is_null() ? 0 : scratch.bytes()) +
                                   " bytes, need " + std::to_string(need) + " for " +
                                   std::to_string(threads) +
                                   " workers: size it with AttentionScratchBytes");
  }
  return Status::Ok();
}

// Runs item(b, h, qt, tiles) for every (sequence, query head, query tile), heaviest (last query
// tile) first so the pool's dynamic chunks balance.
template <typename T, typename Item>
void ForEachQueryTile(ThreadPool& pool, const Problem<T>& p, const Item& item) {
  const int64_t per_tile = p.batch * p.hq, tiles = p.query_tiles();
  pool.ParallelFor(per_tile * tiles, 1, [&](int64_t begin, int64_t end, int worker) {
    const Tiles w = p.tiles(worker);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i % per_tile;
      item(p, bh / p.hq, bh % p.hq, tiles - 1 - i / per_tile, w);
    }
  });
}

template <typename T>
Status Forward(ThreadPool& pool, const AttentionForwardArgs& a) {
  Problem<T> p = MakeProblem<T>(a, pool.size());
  p.o_out = BackendAccess::Data<T>(a.o);
  p.lse = BackendAccess::Data<float>(a.lse);
  ForEachQueryTile(pool, p, ForwardItem<T>);
  return Status::Ok();
}

template <typename T>
Status Backward(ThreadPool& pool, const AttentionBackwardArgs& a) {
  Problem<T> p = MakeProblem<T>(a, pool.size());
  p.o = BackendAccess::Data<const T>(a.o);
  p.d_o = BackendAccess::Data<const T>(a.d_o);
  p.dq = BackendAccess::Data<T>(a.dq);
  p.dk = BackendAccess::Data<T>(a.dk);
  p.dv = BackendAccess::Data<T>(a.dv);
  p.lse = const_cast<float*>(BackendAccess::Data<const float>(a.lse));  // only read
  const int64_t n = p.batch * p.seq, width = p.qstride();
  pool.ParallelFor(n, 64, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < p.hq; ++h) {
        float sum = 0.0f;
        for (int64_t k = h * p.d; k < (h + 1) * p.d; ++k) {
          sum += ToFloat(p.d_o[t * width + k]) * ToFloat(p.o[t * width + k]);
        }
        p.delta[t * p.hq + h] = sum;
      }
    }
  });
  ForEachQueryTile(pool, p, QueryGradientItem<T>);
  // Key tiles in ascending order: the first ones are seen by the most queries (heaviest first).
  const int64_t per_key_tile = p.batch * p.hkv, key_tiles = (p.seq + kBK - 1) / kBK;
  pool.ParallelFor(per_key_tile * key_tiles, 1, [&](int64_t begin, int64_t end, int worker) {
    const Tiles w = p.tiles(worker);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i % per_key_tile;
      KeyValueGradientItem(p, bh / p.hkv, bh % p.hkv, i / per_key_tile, w);
    }
  });
  return Status::Ok();
}

// fn(T{}) for the storage type T of `t` (f32, bf16 or f16).
template <typename Fn>
Status ByStorage(const Tensor& t, Fn&& fn) {
  switch (t.dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kBF16:
      return fn(bf16{});
    case DType::kF16:
      return fn(f16{});
    default:
      return Status::InvalidArgument(
          "attention: the CPU kernels take f32, bf16 or f16 storage, got " + t.ToString());
  }
}

}  // namespace

size_t AttentionScratchBytes(int threads, const AttentionShape& shape) {
  return Layout(threads, shape).total;
}

Status AttentionForward(ThreadPool& pool, const AttentionForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckScratch(a.scratch, pool.size(), a.shape));
  return ByStorage(a.q, [&](auto tag) { return Forward<decltype(tag)>(pool, a); });
}

Status AttentionBackward(ThreadPool& pool, const AttentionBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckScratch(a.scratch, pool.size(), a.shape));
  return ByStorage(a.q, [&](auto tag) { return Backward<decltype(tag)>(pool, a); });
}

}  // namespace ferry::cpu
