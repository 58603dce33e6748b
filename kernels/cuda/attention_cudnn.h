// Causal attention forward and backward on CUDA through cuDNN's fused SDPA (flash attention),
// built with the cuDNN frontend's graph API. The frontend is seen by attention_cudnn.cc alone.
//
// Semantics are kernels/ops/attention.h's exactly: causal, grouped KV heads, sliding window W
// (cuDNN's diagonal band left bound W: key s is kept iff s > t - W), packed documents, scale, lse
// saved as (N, Hq) fp32 natural-log log-sum-exp. How they map onto cuDNN:
//  - Layout: ferry's (N, H*D) rows are cuDNN's token-major ragged layout: G = shape.documents()
//    cuDNN sequences of up to T tokens, one per document, each at its start row (a ragged
//    offset), with its length (the padding mask); padding sequences are empty. Without doc_ids,
//    each sequence is one document. Nothing is gathered or copied; the lengths and offsets are
//    computed on the device from doc_ids (kernels/cuda/attention_layout.h says why).
//  - Stats: cuDNN's log-sum-exp lives in scratch in its packed (G, Hq, T) layout and is copied to
//    the args' lse (forward) and back (backward).
//  - Graphs: one per (direction, G, T, Hq, Hkv, D, dtype, window, scale), built on first use
//    (cuDNN compiles its engine at run time: seconds) and cached in the device's CudnnAttention,
//    reused by every later call of that shape: never one per micro-batch.
// Limits (InvalidArgument naming them): bf16 or f16 storage only (cuDNN's SDPA has no f32: cast
// to bf16 or f16); head_dim a multiple of 8, at most 256; N * Hq * D < 2^31. On sm_8x and sm_12x
// the ragged layout needs cuDNN >= 9.18.1 at run time (Unavailable below, naming the version),
// and cuDNN's backward there takes head_dim <= 128 (its support matrix): a larger one fails the
// graph's build with cuDNN's own message.
// The backward is NOT deterministic: cuDNN accumulates dq with atomics in an unspecified order
// and has no deterministic mode for this layout on every GPU, so two runs may differ in the last
// bits of dq (within the dtype's tolerance).
// Scratch: CudaAttentionLayout (kernels/ops/attention.h), the workspace part bounded there; a
// graph whose workspace exceeds the bound fails with an error naming both sizes.
//
// Thread-safety: CudnnAttention is owned by one CudaDevice and used only inside its
// EnqueueCompute launches, which hold the compute stream's lock: that lock guards the handle and
// the graph cache.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/status.h"

namespace ferry {

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Graphs built so far (tests bound how many they build), and the most workspace any of them
  // asked for (tests print it next to ferry's bound).
  int64_t graphs_built() const;
  int64_t largest_workspace() const;

  // The handle and the graph cache (defined in attention_cudnn.cc, the frontend's one user).
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
