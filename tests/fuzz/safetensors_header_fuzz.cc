// Fuzzes ParseSafetensorsHeader with whole file images. On an accepted file, checks what the
// reader relies on afterwards: every tensor's bytes lie inside the file after the header, match
// its dtype and shape, and no two tensors overlap.
#include <algorithm>

#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  ferry::Result<ferry::SafetensorsHeader> h =
      ferry::ParseSafetensorsHeader(ferry::fuzz::Bytes(text), "fuzz.safetensors");
  if (!h.ok()) return;
  FERRY_FUZZ_CHECK(h->data_begin >= 8 && h->data_begin <= text.size());
  size_t prev_end = 0;
  std::vector<const ferry::SafetensorsTensorInfo*> by_offset;
  for (const ferry::SafetensorsTensorInfo& t : h->tensors) {
    FERRY_FUZZ_CHECK(t.offset >= h->data_begin && t.offset <= text.size());
    FERRY_FUZZ_CHECK(t.bytes <= text.size() - t.offset);
    FERRY_FUZZ_CHECK(uint64_t(t.numel()) * ferry::SafetensorsDTypeSize(t.dtype) == t.bytes);
    if (t.bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (const ferry::SafetensorsTensorInfo* t : by_offset) {
    FERRY_FUZZ_CHECK(t->offset >= prev_end);
    prev_end = t->offset + t->bytes;
  }
}
