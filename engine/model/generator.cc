// The sampling loop over any Generator (engine/model/generator.h has the contract).
#include "engine/model/generator.h"

#include <algorithm>
#include <string>

namespace ferry {

Result<std::vector<int32_t>> Generate(Generator& g, std::span<const int32_t> prompt,
                                      const GenerateOptions& o,
                                      const std::function<Status(int32_t)>& on_token) {
  FERRY_RETURN_IF_ERROR(ValidateSamplingOptions(o.sampling));
  if (prompt.empty()) return Status::InvalidArgument("generate: the prompt has no tokens");
  if (o.max_new_tokens < 0) return Status::InvalidArgument("generate: max_new_tokens < 0");
  const int64_t need = int64_t(prompt.size()) + std::max<int64_t>(o.max_new_tokens - 1, 0);
  if (need > g.capacity()) {
    return Status::InvalidArgument(
        "generate: " + std::to_string(prompt.size()) + " prompt tokens and " +
        std::to_string(o.max_new_tokens) + " new ones need " + std::to_string(need) +
        " positions; the generator holds " + std::to_string(g.capacity()));
  }
  g.Reset();
  std::vector<int32_t> out;
  if (o.max_new_tokens == 0) return out;
  FERRY_ASSIGN_OR_RETURN(std::vector<float> logits, g.Forward(prompt, /*last_only=*/true));
  const size_t vocab = logits.size();
  std::span<const float> last(logits.data(), vocab);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int32_t token = SampleToken(last, o.sampling, uint64_t(i));
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) break;
    out.push_back(token);
    FERRY_RETURN_IF_ERROR(on_token(token));
    if (i + 1 == o.max_new_tokens) break;
    FERRY_ASSIGN_OR_RETURN(logits, g.Forward(std::span<const int32_t>(&token, 1), true));
    last = std::span<const float>(logits.data(), vocab);
  }
  return out;
}

}  // namespace ferry
