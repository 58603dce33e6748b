// Fuzzes ParseByteSize with the sizes people type ("24GiB", "1.5 TB"). An accepted size printed
// as plain bytes must read back as the same number.
#include <string>

#include "engine/plan/byte_size.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  ferry::Result<uint64_t> n = ferry::plan::ParseByteSize(text);
  if (!n.ok()) return;
  ferry::Result<uint64_t> again = ferry::plan::ParseByteSize(std::to_string(*n));
  FERRY_FUZZ_CHECK(again.ok() && *again == *n);
}
