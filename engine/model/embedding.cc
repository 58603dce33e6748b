#include "engine/model/embedding.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace ferry {
namespace {

Status CheckIds(std::span<const int32_t> ids, int64_t limit, const char* what) {
  for (size_t n = 0; n < ids.size(); ++n) {
    if (ids[n] < 0 || ids[n] >= limit) {
      return Status::InvalidArgument(std::string(what) + " " + std::to_string(ids[n]) +
                                     " at index " + std::to_string(n) + " is outside [0, " +
                                     std::to_string(limit) + ")");
    }
  }
  return Status::Ok();
}

// out[0, C) = row `r` of `t` in fp32, or out += it when `add`.
void GatherRow(const EmbeddingTable& t, size_t r, size_t C, float* out, bool add) {
  const size_t es = DTypeSize(t.dtype);
  const std::byte* row = t.data + r * C * es;  // at any byte: ConvertToFloat allows it
  if (!add) {
    ConvertToFloat(t.dtype, row, out, C);
    return;
  }
  constexpr size_t kPiece = 1024;
  float f[kPiece];
  for (size_t c0 = 0; c0 < C; c0 += kPiece) {
    const size_t n = std::min(kPiece, C - c0);
    ConvertToFloat(t.dtype, row + c0 * es, f, n);
    for (size_t c = 0; c < n; ++c) out[c0 + c] += f[c];
  }
}

}  // namespace

Status EmbeddingForward(const EmbeddingShape& s, const EmbeddingTable& wte,
                        const EmbeddingTable& wpe, std::span<const int32_t> tokens,
                        std::span<const int32_t> positions, std::span<float> out) {
  const size_t C = size_t(s.hidden);
  assert(wte.size == size_t(s.vocab) * C && out.size() == tokens.size() * C);
  assert(s.positions == 0 ||
         (wpe.size == size_t(s.positions) * C && positions.size() == tokens.size()));
  FERRY_RETURN_IF_ERROR(CheckIds(tokens, s.vocab, "token id"));
  if (s.positions > 0) FERRY_RETURN_IF_ERROR(CheckIds(positions, s.positions, "position"));
  for (size_t n = 0; n < tokens.size(); ++n) {
    GatherRow(wte, size_t(tokens[n]), C, &out[n * C], /*add=*/false);
    if (s.positions > 0) GatherRow(wpe, size_t(positions[n]), C, &out[n * C], /*add=*/true);
  }
  return Status::Ok();
}

void ReadEmbeddingTable(const EmbeddingTable& t, std::span<float> out) {
  assert(out.size() == t.size);
  GatherRow(t, 0, t.size, out.data(), /*add=*/false);
}

void EmbeddingBackward(const EmbeddingShape& s, std::span<const float> dout,
                       std::span<const int32_t> tokens, std::span<const int32_t> positions,
                       std::span<float> dwte, std::span<float> dwpe) {
  const size_t C = size_t(s.hidden);
  assert(dout.size() == tokens.size() * C && dwte.size() == size_t(s.vocab) * C);
  for (size_t n = 0; n < tokens.size(); ++n) {
    const float* d = &dout[n * C];
    float* g = &dwte[size_t(tokens[n]) * C];
    for (size_t c = 0; c < C; ++c) g[c] += d[c];
    if (s.positions > 0) {
      float* gp = &dwpe[size_t(positions[n]) * C];
      for (size_t c = 0; c < C; ++c) gp[c] += d[c];
    }
  }
}

}  // namespace ferry
