// Attention on CUDA through cuDNN's fused SDPA: the graphs, their cache and the calls
// (kernels/cuda/attention_cudnn.h says what maps to what). The only translation unit that includes
// the cuDNN frontend (CUDNN_FRONTEND_SKIP_JSON_LIB: its bundled JSON library is not needed).
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kernels/backend_access.h"
#include "kernels/cuda/attention_layout.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"

namespace ferry {
namespace {

namespace fe = cudnn_frontend;

// The ragged layout on sm_8x/sm_12x is correct from this cuDNN on (cuDNN's release notes; the
// frontend's own checks start there too).
constexpr size_t kRaggedAmpereMinVersion = 91801;
// Older cuDNN refuses grouped KV heads with ragged offsets.
constexpr size_t kMinVersion = 90600;

// Tensor ids in the graphs' variant packs.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKv,
  kOffQ,
  kOffK,
  kOffV,
  kOffO,
  kOffDO,
  kOffDQ,
  kOffDK,
  kOffDV,
};

struct CudnnDeleter {
  void operator()(cudnnHandle_t h) const { cudnnDestroy(h); }
};
using UniqueCudnn = std::unique_ptr<cudnnContext, CudnnDeleter>;

Status CudnnStatus(cudnnStatus_t s, std::string_view what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudnnGetErrorString(s));
}

Status FrontendStatus(fe::error_t e, std::string_view what) {
  if (e.is_good()) return Status::Ok();
  return Status::Internal("attention (cuDNN " + std::string(what) + "): " + e.get_message());
}

// What a graph depends on: everything else is a device pointer in the variant pack.
struct GraphKey {
  bool backward = false;
  int64_t documents = 0, seq_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0, tokens = 0;
  DType dtype = DType::kBF16;
  int64_t window = 0;
  uint32_t scale_bits = 0;

  auto Tie() const {
    return std::tie(backward, documents, seq_len, q_heads, kv_heads, head_dim, tokens, dtype,
                    window, scale_bits);
  }
  bool operator<(const GraphKey& o) const { return Tie() < o.Tie(); }
  float scale() const {
    float s;
    std::memcpy(&s, &scale_bits, sizeof(s));
    return s;
  }
};

// What both directions' SDPA attributes share: the scale; the causal mask, with the sliding window
// as the diagonal band's left bound (key s kept iff s > t - W); each document a sequence of its
// own length (the padding mask) in the ragged layout of `tokens` packed rows.
template <typename Attributes>
void SetMask(Attributes& a, const GraphKey& k,
             const std::shared_ptr<fe::graph::Tensor_attributes>& seq_q,
             const std::shared_ptr<fe::graph::Tensor_attributes>& seq_kv) {
  a.set_attn_scale(k.scale())
      .set_causal_mask(true)
      .set_padding_mask(true)
      .set_seq_len_q(seq_q)
      .set_seq_len_kv(seq_kv)
      .set_max_total_seq_len_q(k.tokens)
      .set_max_total_seq_len_kv(k.tokens);
  if (k.window > 0) a.set_diagonal_band_left_bound(int(k.window));
}

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

}  // namespace

struct CudnnAttention::Impl {
  UniqueCudnn handle;                     // created on first use
  std::map<GraphKey, BuiltGraph> graphs;  // built once per key
  int64_t built = 0;

  Status Init(const CudaContext& ctx) {
    if (handle != nullptr) return Status::Ok();
    const size_t version = cudnnGetVersion();
    const int major = ctx.compute_capability / 10;
    if (version < kMinVersion ||
        ((major == 8 || major == 12) && version < kRaggedAmpereMinVersion)) {
      return Status::Unavailable(
          "attention: cuDNN " + std::to_string(version) +
          " found at run time; packed attention on "
          "sm_" +
          std::to_string(ctx.compute_capability) + " needs cuDNN >= " +
          std::to_string(major == 8 || major == 12 ? kRaggedAmpereMinVersion : kMinVersion) +
          " (9.18.1 on sm_8x/sm_12x): put a newer libcudnn first on the library path");
    }
    cudnnHandle_t h = nullptr;
    FERRY_RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&h), "cudnnCreate"));
    handle.reset(h);
    return Status::Ok();
  }

  Result<const BuiltGraph*> Get(const GraphKey& key) {
    auto it = graphs.find(key);
    if (it != graphs.end()) return &it->second;
    FERRY_ASSIGN_OR_RETURN(BuiltGraph g, Build(key));
    ++built;
    return &graphs.emplace(key, std::move(g)).first->second;
  }

  Result<BuiltGraph> Build(const GraphKey& k) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(k.dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t G = k.documents, T = k.seq_len, D = k.head_dim;
    auto index = [&](const char* name, int64_t uid, int64_t n) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({n, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
    };
    // (G, H, T, D) over ferry's (N, H*D) rows: token-major, each sequence at its ragged offset.
    auto rows_dim = [&](int64_t heads) { return std::vector<int64_t>{G, heads, T, D}; };
    auto rows_stride = [&](int64_t heads) {
      return std::vector<int64_t>{T * heads * D, D, heads * D, 1};
    };
    auto rows = [&](const char* name, int64_t uid, int64_t heads, int64_t offset_uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim(rows_dim(heads))
                           .set_stride(rows_stride(heads))
                           .set_ragged_offset(index(name, offset_uid, G + 1)));
    };
    auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, const char* name,
                      int64_t uid, int64_t heads, int64_t offset_uid) {
      t->set_output(true)
          .set_uid(uid)
          .set_dim(rows_dim(heads))
          .set_stride(rows_stride(heads))
          .set_ragged_offset(index(name, offset_uid, G + 1));
    };
    const std::vector<int64_t> stats_dim{G, k.q_heads, T, 1}, stats_stride{k.q_heads * T, T, 1, 1};
    auto q = rows("q", kQ, k.q_heads, kOffQ);
    auto kk = rows("k", kK, k.kv_heads, kOffK);
    auto v = rows("v", kV, k.kv_heads, kOffV);
    auto seq_q = index("seq_len_q", kSeqQ, G);
    auto seq_kv = index("seq_len_kv", kSeqKv, G);

    if (!k.backward) {
      fe::graph::SDPA_attributes opts;
      opts.set_name("ferry_attention").set_generate_stats(true);
      SetMask(opts, k, seq_q, seq_kv);
      auto [o, stats] = g->sdpa(q, kk, v, opts);
      output(o, "o", kO, k.q_heads, kOffO);
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim)
          .set_stride(stats_stride);
    } else {
      auto o = rows("o", kO, k.q_heads, kOffO);
      auto d_o = rows("d_o", kDO, k.q_heads, kOffDO);
      auto stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("stats")
                                 .set_uid(kStats)
                                 .set_dim(stats_dim)
                                 .set_stride(stats_stride)
                                 .set_data_type(fe::DataType_t::FLOAT));
      fe::graph::SDPA_backward_attributes opts;
      opts.set_name("ferry_attention_backward");
      SetMask(opts, k, seq_q, seq_kv);
      auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, d_o, stats, opts);
      output(dq, "dq", kDQ, k.q_heads, kOffDQ);
      output(dk, "dk", kDK, k.kv_heads, kOffDK);
      output(dv, "dv", kDV, k.kv_heads, kOffDV);
    }
    FERRY_RETURN_IF_ERROR(FrontendStatus(g->build(handle.get(), {fe::HeurMode_t::A}),
                                         k.backward ? "backward graph" : "forward graph"));
    BuiltGraph built_graph{g, 0};
    FERRY_RETURN_IF_ERROR(
        FrontendStatus(g->get_workspace_size(built_graph.workspace), "workspace size"));
    return built_graph;
  }
};

CudnnAttention::CudnnAttention() : impl_(std::make_unique<Impl>()) {}
CudnnAttention::~CudnnAttention() = default;
int64_t CudnnAttention::graphs_built() const { return impl_->built; }
int64_t CudnnAttention::largest_workspace() const {
  int64_t most = 0;
  for (const auto& [key, g] : impl_->graphs) most = std::max(most, g.workspace);
  return most;
}

namespace cuda {
namespace {

template <typename T>
T* At(const Tensor& scratch, size_t offset) {
  return reinterpret_cast<T*>(BackendAccess::Raw(scratch.data) + offset);
}

void* Ptr(const Tensor& t) { return BackendAccess::Raw(t.data); }

// The limits of cuDNN's SDPA and of the int32 offsets, as InvalidArgument.
Status CheckSupported(const AttentionShape& s, DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return Status::InvalidArgument(
        "attention on CUDA runs on cuDNN's fused SDPA, which takes bf16 or f16 storage only, got " +
        std::string(DTypeName(dtype)) + ": cast q, k, v (and the gradients) to bf16 or f16");
  }
  if (s.head_dim % 8 != 0 || s.head_dim > 256) {
    return Status::InvalidArgument(
        "attention on CUDA (cuDNN SDPA) needs head_dim a multiple of 8 "
        "and at most 256, got " +
        std::to_string(s.head_dim));
  }
  if (s.tokens() * s.q_heads * s.head_dim >= int64_t(INT32_MAX)) {
    return Status::InvalidArgument(
        "attention on CUDA: N * Hq * D = " + std::to_string(s.tokens() * s.q_heads * s.head_dim) +
        " elements exceed cuDNN's int32 ragged offsets; split the batch");
  }
  return Status::Ok();
}

// The documents' lengths and offsets from doc_ids, then the check that they fit G sequences.
Status Documents(CudaDevice& d, const AttentionShape& s, const Tensor& doc_ids,
                 const Tensor& scratch, const CudaAttentionLayout& L) {
  const AttentionDocuments docs{
      .doc_ids = doc_ids.data.is_null() ? nullptr : BackendAccess::Data<int32_t>(doc_ids),
      .batch = s.batch,
      .seq_len = s.seq_len,
      .documents = s.documents(),
      .q_row = s.q_heads * s.head_dim,
      .kv_row = s.kv_heads * s.head_dim,
      .seq_len_out = At<int32_t>(scratch, L.seq_len),
      .q_offset = At<int32_t>(scratch, L.q_offset),
      .kv_offset = At<int32_t>(scratch, L.kv_offset),
      .doc_start = At<int32_t>(scratch, L.doc_start),
      .token_doc = At<int32_t>(scratch, L.token_doc),
      .count = At<int32_t>(scratch, L.count)};
  FERRY_RETURN_IF_ERROR(d.EnqueueCompute("attention (documents)", [&](const CudaContext& ctx) {
    return LaunchAttentionDocuments(docs, ctx.compute);
  }));
  const int64_t g = s.documents();
  return d.EnqueueComputeCheck(
      "attention", scratch.data + std::ptrdiff_t(L.count), sizeof(int32_t),
      [g](const std::byte* host) -> Status {
        int32_t found = 0;
        std::memcpy(&found, host, sizeof(found));
        if (found <= g) return Status::Ok();
        return Status::InvalidArgument(
            "attention: the call holds " + std::to_string(found) + " documents, more than the " +
            std::to_string(g) +
            " its shape allows (AttentionShape::max_documents, 0 meaning one per sequence)");
      });
}

GraphKey KeyOf(bool backward, const AttentionShape& s, DType dtype, float scale, int64_t window) {
  GraphKey k{.backward = backward,
             .documents = s.documents(),
             .seq_len = s.seq_len,
             .q_heads = s.q_heads,
             .kv_heads = s.kv_heads,
             .head_dim = s.head_dim,
             .tokens = s.tokens(),
             .dtype = dtype,
             .window = window >= s.seq_len ? 0 : window};  // a window of >= T keys masks nothing
  std::memcpy(&k.scale_bits, &scale, sizeof(scale));
  return k;
}

// The graph of `key` (built on first use), checked against the scratch's workspace bound.
Result<const BuiltGraph*> GraphFor(const CudaContext& ctx, const GraphKey& key,
                                   const CudaAttentionLayout& L) {
  CudnnAttention::Impl& impl = ctx.attention->impl();
  FERRY_RETURN_IF_ERROR(impl.Init(ctx));
  FERRY_ASSIGN_OR_RETURN(const BuiltGraph* g, impl.Get(key));
  if (g->workspace < 0 || size_t(g->workspace) > L.workspace_bytes) {
    return Status::Internal("attention: cuDNN's " +
                            std::string(key.backward ? "backward" : "forward") + " graph needs " +
                            std::to_string(g->workspace) + " workspace bytes, more than the " +
                            std::to_string(L.workspace_bytes) +
                            " ferry's scratch bound gives it (MakeCudaAttentionLayout): raise the "
                            "bound");
  }
  return g;
}

Status Execute(const CudaContext& ctx, const BuiltGraph& g,
               std::unordered_map<int64_t, void*>& pack, void* workspace) {
  CudnnAttention::Impl& impl = ctx.attention->impl();
  FERRY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetStream(impl.handle.get(), ctx.compute), "cudnnSetStream"));
  return FrontendStatus(g.graph->execute(impl.handle.get(), pack, workspace), "execute");
}

// The variant pack's entries common to both directions.
std::unordered_map<int64_t, void*> CommonPack(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& scratch, const CudaAttentionLayout& L) {
  void* q_off = At<int32_t>(scratch, L.q_offset);
  void* kv_off = At<int32_t>(scratch, L.kv_offset);
  void* seq = At<int32_t>(scratch, L.seq_len);
  return {{kQ, Ptr(q)},    {kK, Ptr(k)},
          {kV, Ptr(v)},    {kOffQ, q_off},
          {kOffK, kv_off}, {kOffV, kv_off},
          {kOffO, q_off},  {kSeqQ, seq},
          {kSeqKv, seq},   {kStats, At<float>(scratch, L.stats)}};
}

AttentionStatsCopy StatsCopy(const AttentionShape& s, const Tensor& lse, const Tensor& scratch,
                             const CudaAttentionLayout& L, bool to_lse) {
  return {.stats = At<float>(scratch, L.stats),
          .lse = BackendAccess::Data<float>(lse),
          .token_doc = At<int32_t>(scratch, L.token_doc),
          .doc_start = At<int32_t>(scratch, L.doc_start),
          .tokens = s.tokens(),
          .q_heads = s.q_heads,
          .seq_len = s.seq_len,
          .documents = s.documents(),
          .to_lse = to_lse};
}

// What both directions do: check cuDNN's limits, find the documents (and check their count on
// the stream), then on the compute stream get the graph of this call's key (built on first use)
// and run `body` with it and the variant pack's entries for q, k, v, o, the lengths and offsets.
template <typename Args, typename Body>
Status Run(CudaDevice& d, std::string_view op, bool backward, const Args& a, Body body) {
  const AttentionShape& s = a.shape;
  FERRY_RETURN_IF_ERROR(CheckSupported(s, a.q.dtype));
  const CudaAttentionLayout L = MakeCudaAttentionLayout(s);
  FERRY_RETURN_IF_ERROR(Documents(d, s, a.doc_ids, a.scratch, L));
  const GraphKey key = KeyOf(backward, s, a.q.dtype, a.scale, a.window);
  return d.EnqueueCompute(op, [&](const CudaContext& ctx) -> Status {
    FERRY_ASSIGN_OR_RETURN(const BuiltGraph* g, GraphFor(ctx, key, L));
    std::unordered_map<int64_t, void*> pack = CommonPack(a.q, a.k, a.v, a.scratch, L);
    pack[kO] = Ptr(a.o);
    return body(ctx, *g, L, pack);
  });
}

}  // namespace

Status AttentionForward(CudaDevice& d, const AttentionForwardArgs& a) {
  return Run(d, "attention_forward", /*backward=*/false, a,
             [&](const CudaContext& ctx, const BuiltGraph& g, const CudaAttentionLayout& L,
                 std::unordered_map<int64_t, void*>& pack) -> Status {
               FERRY_RETURN_IF_ERROR(Execute(ctx, g, pack, At<std::byte>(a.scratch, L.workspace)));
               return LaunchAttentionStatsCopy(
                   StatsCopy(a.shape, a.lse, a.scratch, L, /*to_lse=*/true), ctx.compute);
             });
}

Status AttentionBackward(CudaDevice& d, const AttentionBackwardArgs& a) {
  return Run(d, "attention_backward", /*backward=*/true, a,
             [&](const CudaContext& ctx, const BuiltGraph& g, const CudaAttentionLayout& L,
                 std::unordered_map<int64_t, void*>& pack) -> Status {
               const AttentionShape& s = a.shape;
               // The stats' padding positions are never read; zeroed so that nothing stale is.
               const size_t stats_bytes =
                   size_t(s.documents() * s.q_heads * s.seq_len) * sizeof(float);
               FERRY_CUDA_RETURN_IF_ERROR(
                   cudaMemsetAsync(At<float>(a.scratch, L.stats), 0, stats_bytes, ctx.compute));
               FERRY_RETURN_IF_ERROR(LaunchAttentionStatsCopy(
                   StatsCopy(s, a.lse, a.scratch, L, /*to_lse=*/false), ctx.compute));
               void* q_off = At<int32_t>(a.scratch, L.q_offset);
               void* kv_off = At<int32_t>(a.scratch, L.kv_offset);
               pack[kDO] = Ptr(a.d_o);
               pack[kOffDO] = q_off;
               pack[kDQ] = Ptr(a.dq);
               pack[kOffDQ] = q_off;
               pack[kDK] = Ptr(a.dk);
               pack[kOffDK] = kv_off;
               pack[kDV] = Ptr(a.dv);
               pack[kOffDV] = kv_off;
               return Execute(ctx, g, pack, At<std::byte>(a.scratch, L.workspace));
             });
}

}  // namespace cuda
}  // namespace ferry
