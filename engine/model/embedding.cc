#include "engine/model/embedding.h"

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

}  // namespace

Status EmbeddingForward(const EmbeddingShape& s, std::span<const float> wte,
                        std::span<const float> wpe, std::span<const int32_t> tokens,
                        std::span<const int32_t> positions, std::span<float> out) {
  const size_t C = size_t(s.hidden);
  assert(wte.size() == size_t(s.vocab) * C && out.size() == tokens.size() * C);
  assert(s.positions == 0 ||
         (wpe.size() == size_t(s.positions) * C && positions.size() == tokens.size()));
  FERRY_RETURN_IF_ERROR(CheckIds(tokens, s.vocab, "token id"));
  if (s.positions > 0) FERRY_RETURN_IF_ERROR(CheckIds(positions, s.positions, "position"));
  for (size_t n = 0; n < tokens.size(); ++n) {
    const float* e = &wte[size_t(tokens[n]) * C];
    float* o = &out[n * C];
    if (s.positions > 0) {
      const float* p = &wpe[size_t(positions[n]) * C];
      for (size_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (size_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
  return Status::Ok();
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
