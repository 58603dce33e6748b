#include "engine/train/dataset.h"

#include "engine/model/counter_rng.h"
#include "engine/text/byte_tokenizer.h"
#include "engine/train/builtin_text.h"

namespace ferry {
namespace {

bool IsBlank(std::string_view line) {
  for (char ch : line) {
    if (ch != ' ' && ch != '\t' && ch != '\r') return false;
  }
  return true;
}

}  // namespace

std::vector<std::string_view> SplitDocuments(std::string_view text) {
  std::vector<std::string_view> docs;
  std::string_view doc_begin = text;  // text of the document being collected
  size_t doc_len = 0;
  auto flush = [&]() {
    std::string_view doc = doc_begin.substr(0, doc_len);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.remove_suffix(1);
    if (!doc.empty()) docs.push_back(doc);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(pos, end - pos);
    if (IsBlank(line.substr(0, line.size() - (nl == std::string_view::npos ? 0 : 1)))) {
      flush();
      doc_begin = text.substr(end);
      doc_len = 0;
    } else {
      doc_len += line.size();
    }
    pos = end;
  }
  flush();
  return docs;
}

TokenStream TokenStream::FromText(std::string_view text) {
  TokenStream s;
  for (std::string_view doc : SplitDocuments(text)) {
    s.tokens_.push_back(ByteTokenizer::kBos);
    std::vector<int32_t> ids = ByteTokenizer::Encode(doc);
    s.tokens_.insert(s.tokens_.end(), ids.begin(), ids.end());
    s.tokens_.push_back(ByteTokenizer::kEos);
    ++s.documents_;
  }
  return s;
}

TokenStream TokenStream::Builtin() { return FromText(BuiltinText()); }

Result<Batcher> Batcher::Create(const TokenStream* stream, int64_t micro_batch, int64_t seq_len,
                                uint64_t seed) {
  if (micro_batch <= 0 || seq_len <= 0) {
    return Status::InvalidArgument("micro-batch rows and sequence length must be positive");
  }
  const int64_t n = int64_t(stream->tokens().size());
  if (n < seq_len + 1) {
    return Status::InvalidArgument("the dataset has " + std::to_string(n) +
                                   " tokens, fewer than one window of --seq-len + 1 = " +
                                   std::to_string(seq_len + 1) + "; lower --seq-len");
  }
  return Batcher(stream, micro_batch, seq_len, seed);
}

MicroBatch Batcher::MakeMicroBatch(int64_t step, int64_t micro) const {
  const std::vector<int32_t>& all = stream_->tokens();
  const uint64_t starts = uint64_t(all.size()) - uint64_t(seq_len_);  // windows of T + 1 tokens
  MicroBatch mb;
  mb.batch = micro_batch_;
  mb.seq_len = seq_len_;
  mb.tokens.resize(size_t(micro_batch_ * seq_len_));
  mb.targets.resize(mb.tokens.size());
  for (int64_t row = 0; row < micro_batch_; ++row) {
    uint64_t h = Mix64(seed_);
    h = Mix64(h ^ uint64_t(step));
    h = Mix64(h ^ uint64_t(micro));
    h = Mix64(h ^ uint64_t(row));
    const size_t start = size_t(h % starts);
    for (int64_t t = 0; t < seq_len_; ++t) {
      const size_t i = size_t(row * seq_len_ + t);
      mb.tokens[i] = all[start + size_t(t)];
      const int32_t target = all[start + size_t(t) + 1];
      mb.targets[i] = target == ByteTokenizer::kBos ? kIgnoreTarget : target;
      mb.valid_targets += mb.targets[i] != kIgnoreTarget;
    }
  }
  return mb;
}

}  // namespace ferry
