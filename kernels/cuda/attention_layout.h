// The small kernels around cuDNN's fused attention (kernels/cuda/attention_cudnn.cc): what cuDNN
// cannot do itself, hand-written.
//
//  - Documents: cuDNN has no segment mask, so packed documents run as ragged sequences, one cuDNN
//    sequence per document. Their lengths and offsets come from doc_ids, which live on the device
//    and change every micro-batch; reading them on the host would stall the stream, so one block
//    scans them in place (documents are runs of equal ids inside a sequence, as the CPU op reads
//    them) and writes cuDNN's per-sequence lengths and ragged offsets. q, k, v, o and the
//    gradients need no gathering: a document's rows are already contiguous in ferry's (N, H*D)
//    layout, which is cuDNN's ragged (token-major) layout.
//  - Stats: cuDNN's backward on sm_8x/sm_12x reads its log-sum-exp only in the packed (G, Hq, T)
//    layout, while the op saves lse as (N, Hq); two copy kernels move it between the two.
// REQUIRES: pointers into device memory, sizes as in CudaAttentionLayout; called inside an
// EnqueueCompute launch on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/status.h"

namespace ferry::cuda {

struct AttentionDocuments {
  const int32_t* doc_ids = nullptr;  // (N) or nullptr: one document per sequence
  int64_t batch = 0, seq_len = 0;    // B, T
  int64_t documents = 0;             // G: cuDNN's batch
  int64_t q_row = 0, kv_row = 0;     // elements per row: Hq*D, Hkv*D
  int32_t* seq_len_out = nullptr;    // (G): tokens per document, 0 for padding sequences
  int32_t* q_offset = nullptr;       // (G + 1): start row * q_row; padding: N * q_row
  int32_t* kv_offset = nullptr;      // (G + 1): start row * kv_row
  int32_t* doc_start = nullptr;      // (G + 1): first row of each document; padding: N
  int32_t* token_doc = nullptr;      // (N): each row's document (may be >= G: too many)
  int32_t* count = nullptr;          // (1): documents found
};
Status LaunchAttentionDocuments(const AttentionDocuments& a, cudaStream_t stream);

// lse[i, h] = stats[token_doc[i], h, i - doc_start[token_doc[i]]] (to_lse), or the reverse.
// Rows whose document is >= G are skipped (the count check fails the call).
struct AttentionStatsCopy {
  float* stats = nullptr;  // (G, Hq, T)
  float* lse = nullptr;    // (N, Hq)
  const int32_t* token_doc = nullptr;
  const int32_t* doc_start = nullptr;
  int64_t tokens = 0, q_heads = 0, seq_len = 0, documents = 0;
  bool to_lse = true;
};
Status LaunchAttentionStatsCopy(const AttentionStatsCopy& a, cudaStream_t stream);

}  // namespace ferry::cuda
