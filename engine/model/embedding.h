// The embedding layer's forward gather and backward scatter-add, which run on the host: only
// hidden states travel to the devices (DESIGN.md, "Model").
//
// Forward writes its output (=); backward accumulates into the parameter gradients (+=), across
// micro-batches, and with tied embeddings the head's gradient is added to the same buffer by the
// caller before the update.
//
// Stateless; thread-safe for distinct output buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry {

struct EmbeddingShape {
  int64_t vocab = 0;      // V, rows of the token table
  int64_t positions = 0;  // P, rows of the learned position table (GPT-2); 0 when there is none
  int64_t hidden = 0;     // C
};

// A table the gather reads: fp32 values, or bf16/f16 as a model file stores them (a frozen table
// served from its file: engine/model/host_tensors.h, FileTensor), converted row by row. The
// bytes need no alignment.
struct EmbeddingTable {
  const std::byte* data = nullptr;
  DType dtype = DType::kF32;
  size_t size = 0;  // values
  EmbeddingTable() = default;
  EmbeddingTable(std::span<const float> values)  // NOLINT: an fp32 table converts implicitly
      : data(reinterpret_cast<const std::byte*>(values.data())), size(values.size()) {}
  EmbeddingTable(const std::vector<float>& values)  // NOLINT: as the span
      : EmbeddingTable(std::span<const float>(values)) {}
  EmbeddingTable(std::span<const std::byte> bytes, DType t)
      : data(bytes.data()), dtype(t), size(bytes.size() / DTypeSize(t)) {}
};

// out[n, :] = wte[tokens[n], :] (+ wpe[positions[n], :] when the shape has positions), in fp32.
//   wte (V, C), wpe (P, C) or empty, tokens (N), positions (N) or empty, out (N, C).
// A token id outside [0, V) or a position outside [0, P) is an InvalidArgument naming the index
// and the value (bad data, not a bug). REQUIRES: tables and spans sized as above.
Status EmbeddingForward(const EmbeddingShape& s, const EmbeddingTable& wte,
                        const EmbeddingTable& wpe, std::span<const int32_t> tokens,
                        std::span<const int32_t> positions, std::span<float> out);

// All of `t` in fp32 (any alignment). REQUIRES: out.size() == t.size.
void ReadEmbeddingTable(const EmbeddingTable& t, std::span<float> out);

// dwte[tokens[n], :] += dout[n, :]; dwpe[positions[n], :] += dout[n, :] when present.
// REQUIRES: ids validated by EmbeddingForward on the same tokens and positions.
void EmbeddingBackward(const EmbeddingShape& s, std::span<const float> dout,
                       std::span<const int32_t> tokens, std::span<const int32_t> positions,
                       std::span<float> dwte, std::span<float> dwpe);

}  // namespace ferry
