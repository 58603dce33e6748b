#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/attention_layout.h"
#include "kernels/cuda/cuda_status.h"

namespace ferry::cuda {
namespace {

constexpr int kScanThreads = 1024;

// One block walks the N rows in chunks of kScanThreads: a row starts a document when it starts a
// sequence or its id differs from the previous row's. An exclusive scan of those flags numbers the
// documents; the start rows are written, then the lengths and offsets from consecutive starts.
__global__ void DocumentsKernel(AttentionDocuments a) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t carried;  // documents before this chunk
  const int64_t n = a.batch * a.seq_len;
  if (threadIdx.x == 0) carried = 0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += kScanThreads) {
    const int64_t i = base + threadIdx.x;
    int32_t starts = 0;
    if (i < n) {
      starts = (i % a.seq_len == 0) || (a.doc_ids != nullptr && a.doc_ids[i] != a.doc_ids[i - 1]);
    }
    int32_t before = 0, in_chunk = 0;
    Scan(temp).ExclusiveSum(starts, before, in_chunk);
    if (i < n) {
      const int32_t doc = carried + before + starts - 1;  // this row's document
      a.token_doc[i] = doc;
      if (starts && doc < a.documents) a.doc_start[doc] = int32_t(i);
    }
    __syncthreads();  // every thread has read `carried` and the scan's storage
    if (threadIdx.x == 0) carried += in_chunk;
    __syncthreads();
  }
  // Padding sequences start at the end and hold nothing. With more documents than G, every
  // sequence is emptied so that cuDNN reads nothing out of place; the count check fails the call.
  const int32_t found = carried;
  for (int64_t g = threadIdx.x; g <= a.documents; g += kScanThreads) {
    if (g >= found || found > a.documents) a.doc_start[g] = int32_t(n);
  }
  __syncthreads();
  for (int64_t g = threadIdx.x; g <= a.documents; g += kScanThreads) {
    const int64_t start = a.doc_start[g];
    a.q_offset[g] = int32_t(start * a.q_row);
    a.kv_offset[g] = int32_t(start * a.kv_row);
    if (g < a.documents) a.seq_len_out[g] = int32_t(a.doc_start[g + 1] - start);
  }
  if (threadIdx.x == 0) *a.count = found;
}

__global__ void StatsCopyKernel(AttentionStatsCopy a) {
  const int64_t total = a.tokens * a.q_heads;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / a.q_heads, h = e % a.q_heads;
    const int64_t doc = a.token_doc[i];
    if (doc >= a.documents) continue;
    float* s = a.stats + (doc * a.q_heads + h) * a.seq_len + (i - a.doc_start[doc]);
    if (a.to_lse) {
      a.lse[e] = *s;
    } else {
      *s = a.lse[e];
    }
  }
}

}  // namespace

Status LaunchAttentionDocuments(const AttentionDocuments& a, cudaStream_t stream) {
  DocumentsKernel<<<1, kScanThreads, 0, stream>>>(a);
  return CudaStatus(cudaGetLastError(), "attention (documents)");
}

Status LaunchAttentionStatsCopy(const AttentionStatsCopy& a, cudaStream_t stream) {
  const int64_t total = a.tokens * a.q_heads;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  StatsCopyKernel<<<int(std::max<int64_t>(blocks, 1)), threads, 0, stream>>>(a);
  return CudaStatus(cudaGetLastError(), "attention (stats copy)");
}

}  // namespace ferry::cuda
