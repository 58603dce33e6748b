// Fast CPU decode attention over DecodeAttentionArgs (semantics in kernels/ops/decode_attention.h).
//
// Copies the new keys and values into the cache, then runs one work item per (new token, query
// head), spread over the pool: a single pass over the keys its mask reaches with an online
// softmax (the running output is rescaled only when the running maximum grows), accumulating
// straight into the output row, so no scratch is needed. Each output element is computed by one
// work item in a fixed order: results do not depend on the number of threads.
// Work is parallel over tokens x heads only (no split of long key ranges across workers).
// REQUIRES: the args validate (the dispatcher checks); the tensors are host-addressable.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/decode_attention.h"

namespace ferry::cpu {

void DecodeAttention(ThreadPool& pool, const DecodeAttentionArgs& a);

}  // namespace ferry::cpu
