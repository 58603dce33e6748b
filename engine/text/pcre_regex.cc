#include "engine/text/pcre_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ferry {

struct PcreRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

PcreRegex::PcreRegex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
PcreRegex::~PcreRegex() = default;
PcreRegex::PcreRegex(PcreRegex&&) noexcept = default;
PcreRegex& PcreRegex::operator=(PcreRegex&&) noexcept = default;

Result<PcreRegex> PcreRegex::Compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::InvalidArgument("regex '" + std::string(pattern) + "' at offset " +
                                   std::to_string(err_offset) + ": " +
                                   reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimization only: without it (not built in, or refused) matching interprets.
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  return PcreRegex(std::move(code));
}

std::vector<std::pair<size_t, size_t>> PcreRegex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) return out;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), pos, 0, md, nullptr)
                        : pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                      md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && code_->jit) {
      // The JIT's stack ran out (a very long run of one class): the interpreter keeps its
      // backtracking state on the heap.
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a matching limit: the rest stays unmatched)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e < b) break;  // \K tricks; not in tokenizer patterns
    if (e == b) {
      // An empty match: skip one UTF-8 character.
      size_t next = b + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      pos = next;
      continue;
    }
    out.emplace_back(b, e);
    pos = e;
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace ferry
