// CPU NF4 dequantization (semantics: kernels/ops/nf4_dequantize.h), in parallel pieces, with the
// host codec's per-element arithmetic (kernels/nf4.h), so it matches DequantizeNf4 bit for bit.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/nf4_dequantize.h"
#include "kernels/status.h"

namespace ferry::cpu {

// REQUIRES: ValidateNf4Dequantize(a) is ok.
Status Nf4Dequantize(ThreadPool& pool, const Nf4DequantizeArgs& a);

}  // namespace ferry::cpu
