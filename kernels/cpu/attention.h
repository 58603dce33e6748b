// Fast CPU attention kernels over AttentionForwardArgs / AttentionBackwardArgs (semantics in
// kernels/ops/attention.h): flash-attention style, storage f32 or bf16, math in fp32.
//
//  - Forward: work items (sequence, query head, query tile of kQueryTile rows), heaviest first,
//    spread over the pool. Each walks only the key tiles its mask reaches (from the first
//    query's lower bound to the tile's last query) with an online softmax; fully masked tiles
//    are never visited, so cost follows the mask (causal, window, documents). Saves lse.
//  - Backward: Delta = rowsum(dO*o) for all (token, head) first; then a dq pass over the same
//    items as the forward, and a dk/dv pass over (sequence, KV head, key tile) items that walk
//    the query tiles (of every query head in the group) that can see the key tile. Two passes
//    recompute the probabilities twice but need no atomics and are deterministic.
// The tile products run on register-blocked kernels (kernels/cpu/attention_tile_gemm.h). Each
// output element is computed by one work item in a fixed order: results do not depend on the
// number of threads or on scheduling.
// dq, dk, dv are activation gradients: written (=).
//
// Scratch (the args' scratch tensor, carved; nothing allocated): the per-token mask lower bound
// (N i32), Delta (N*Hq f32) and per-worker tiles (O((kQueryTile + kKeyTile) * D) floats).
// REQUIRES: the args validate (the dispatcher checks); the tensors are host-addressable.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/attention.h"
#include "kernels/status.h"

namespace ferry::cpu {

inline constexpr int64_t kAttentionQueryTile = 64;
inline constexpr int64_t kAttentionKeyTile = 64;

// Scratch bytes the kernels need on a pool of `threads` workers.
size_t AttentionScratchBytes(int threads, const AttentionShape& shape);

// Errors: InvalidArgument when the scratch tensor is smaller than AttentionScratchBytes.
Status AttentionForward(ThreadPool& pool, const AttentionForwardArgs& a);
Status AttentionBackward(ThreadPool& pool, const AttentionBackwardArgs& a);

}  // namespace ferry::cpu
