// The NF4 codec (kernels/nf4.h) against bitsandbytes itself (tests/goldens/nf4/, written by
// scripts/make_nf4_goldens.py from bitsandbytes' CPU quantize_4bit / dequantize_4bit):
//   - kNearest reproduces bitsandbytes' CPU packed codes and absmax exactly, nested parts too
//     (given bitsandbytes' own offset: torch's fp32 mean can sit an ulp from ferry's);
//   - kThresholdTree (the CUDA kernel's rounding) differs from it only for values between a tree
//     threshold and the fp32 midpoint of the same two codes, and in all-zero blocks;
//   - dequantization is bit for bit bitsandbytes' to f32 and bf16;
// then round trips with error bounds derived from the code tables, and bad inputs.
#include "kernels/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

// ---- the goldens: a safetensors file read just far enough for these tests -----------------

std::string GoldenDir() {
  const char* env = std::getenv("FERRY_SOURCE_DIR");
  std::string root = env != nullptr && *env != '\0' ? env : "";
#ifdef FERRY_SOURCE_DIR_DEFAULT
  if (root.empty()) root = FERRY_SOURCE_DIR_DEFAULT;
#endif
  return (root.empty() ? std::string(".") : root) + "/tests/goldens/nf4/";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct GoldenTensor {
  std::string dtype;  // "F32", "BF16", "U8"
  std::vector<int64_t> shape;
  std::string bytes;
};

// Every tensor of a safetensors file: an 8-byte little-endian header length, a JSON header of
// {"name":{"dtype":..,"shape":[..],"data_offsets":[begin,end]},...} as the safetensors library
// writes it (no spaces; kernels/ tests use no JSON library), then the data. Empty when the file
// is missing, or when an entry is not in that form (every "dtype" must be matched).
std::map<std::string, GoldenTensor> ReadSafetensors(const std::string& path) {
  std::map<std::string, GoldenTensor> out;
  const std::string file = ReadFile(path);
  if (file.size() < 8) return out;
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(uint8_t(file[size_t(i)])) << (8 * i);
  if (8 + len > file.size()) return out;
  const std::string header = file.substr(8, len);
  size_t dtypes = 0;
  for (size_t at = header.find("\"dtype\""); at != std::string::npos;
       at = header.find("\"dtype\"", at + 1)) {
    ++dtypes;
  }
  // Each entry: "NAME":{"dtype":"D","shape":[a,b],"data_offsets":[begin,end]} (names hold no
  // quote). A part out of that order leaves the entry unread, and the count check below fails.
  const std::string open = "\":{\"dtype\":\"", shape = "\",\"shape\":[",
                    offsets = "],\"data_offsets\":[";
  for (size_t at = header.find(open); at != std::string::npos; at = header.find(open, at + 1)) {
    const size_t name_begin = header.rfind('"', at - 1) + 1;
    const size_t dtype_begin = at + open.size();
    const size_t dtype_end = header.find('"', dtype_begin);
    if (dtype_end == std::string::npos || header.compare(dtype_end, shape.size(), shape) != 0) {
      continue;
    }
    const size_t dims_begin = dtype_end + shape.size();
    const size_t dims_end = header.find(']', dims_begin);
    if (dims_end == std::string::npos || header.compare(dims_end, offsets.size(), offsets) != 0) {
      continue;
    }
    const size_t offs_begin = dims_end + offsets.size();
    const size_t offs_end = header.find(']', offs_begin);
    if (offs_end == std::string::npos) continue;
    GoldenTensor t{header.substr(dtype_begin, dtype_end - dtype_begin), {}, {}};
    std::stringstream dims(header.substr(dims_begin, dims_end - dims_begin));
    for (std::string d; std::getline(dims, d, ',');) t.shape.push_back(std::stoll(d));
    const std::string offs = header.substr(offs_begin, offs_end - offs_begin);
    const size_t comma = offs.find(',');
    if (comma == std::string::npos) continue;
    const size_t begin = std::stoull(offs.substr(0, comma)),
                 end = std::stoull(offs.substr(comma + 1));
    if (8 + len + end > file.size() || begin > end) return {};
    t.bytes = file.substr(8 + len + begin, end - begin);
    out[header.substr(name_begin, at - name_begin)] = std::move(t);
  }
  if (out.size() != dtypes) return {};
  return out;
}

// One golden case, found from its tensors' names (scripts/make_nf4_goldens.py): CASE.packed, and
// CASE.absmax_q when nested; its input is CASE.input, or its plain twin's for CASE_nested.
struct GoldenCase {
  std::string name;
  std::string input;
  std::vector<int64_t> shape;
  bool nested = false;
  bool dequant_f32 = false, dequant_bf16 = false;
};

class Nf4Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = ReadSafetensors(GoldenDir() + "nf4.safetensors");
    ASSERT_FALSE(tensors_.empty()) << "cannot read " << GoldenDir() << "nf4.safetensors";
    const std::string suffix = ".packed";
    for (const auto& [key, t] : tensors_) {
      if (key.size() <= suffix.size() || !key.ends_with(suffix)) continue;
      GoldenCase c;
      c.name = key.substr(0, key.size() - suffix.size());
      c.nested = tensors_.contains(c.name + ".absmax_q");
      c.input = c.name + ".input";
      if (!tensors_.contains(c.input) && c.name.ends_with("_nested")) {
        c.input = c.name.substr(0, c.name.size() - 7) + ".input";
      }
      ASSERT_TRUE(tensors_.contains(c.input)) << "no input for " << c.name;
      c.shape = tensors_[c.input].shape;
      c.dequant_f32 = tensors_.contains(c.name + ".dequant_f32");
      c.dequant_bf16 = tensors_.contains(c.name + ".dequant_bf16");
      cases_.push_back(c);
    }
    ASSERT_EQ(cases_.size(), 21u) << "the goldens hold 21 cases (scripts/make_nf4_goldens.py)";
  }

  const GoldenTensor& Get(const std::string& name) {
    const auto it = tensors_.find(name);
    EXPECT_NE(it, tensors_.end()) << "no tensor " << name << " in the goldens";
    static const GoldenTensor kNone;
    return it == tensors_.end() ? kNone : it->second;
  }
  // F32 or BF16 values, widened exactly to fp32.
  std::vector<float> Floats(const std::string& name) {
    const GoldenTensor& t = Get(name);
    const size_t width = t.dtype == "F32" ? 4 : 2;
    EXPECT_TRUE(t.dtype == "F32" || t.dtype == "BF16") << name << " is " << t.dtype;
    std::vector<float> v(t.bytes.size() / width);
    ConvertToFloat(width == 4 ? DType::kF32 : DType::kBF16, t.bytes.data(), v.data(), v.size());
    return v;
  }
  std::vector<uint8_t> Bytes(const std::string& name) {
    const GoldenTensor& t = Get(name);
    EXPECT_EQ(t.dtype, "U8") << name;
    return std::vector<uint8_t>(t.bytes.begin(), t.bytes.end());
  }

  // The golden weight of a case as bitsandbytes stored it.
  Nf4Host Stored(const GoldenCase& c) {
    Nf4Host w;
    w.shape = c.shape;
    w.code = Floats("code");
    w.packed = Bytes(c.name + ".packed");
    if (c.nested) {
      w.absmax_q = Bytes(c.name + ".absmax_q");
      w.nested_absmax = Floats(c.name + ".nested_absmax");
      w.nested_code = Floats("nested_code");
      w.nested_offset = Floats(c.name + ".nested_offset").at(0);
    } else {
      w.absmax = Floats(c.name + ".absmax");
    }
    return w;
  }

  std::map<std::string, GoldenTensor> tensors_;
  std::vector<GoldenCase> cases_;
};

uint32_t Bits(float v) { return std::bit_cast<uint32_t>(v); }

// Two half-bins of bitsandbytes' CPU lookup table for 8-bit codes (65536 bins over [-1, 1]), and
// an fp32 ulp of slack: how much farther its code may be from a value than the nearest code.
constexpr float kLutBin = 2.0f / 65535.0f + 1.2e-7f;

// Element-by-element bitwise equality, reporting the first few differences.
template <typename T>
int ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    bool same;
    if constexpr (std::is_same_v<T, float>) {
      same = Bits(got[i]) == Bits(want[i]);
    } else {
      same = got[i] == want[i];
    }
    if (!same && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << +got[i] << " want " << +want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " differ";
  return bad;
}

uint8_t CodeAt(const std::vector<uint8_t>& packed, int64_t i) {
  return Nf4Nibble(packed.data(), i);
}

TEST_F(Nf4Golden, CodeTablesAreBitsandbytes) {
  ExpectSameBits(std::vector<float>(std::begin(kNf4Code), std::end(kNf4Code)), Floats("code"),
                 "kNf4Code");
  const std::vector<float> map = DynamicMap8();
  ExpectSameBits(map, Floats("nested_code"), "DynamicMap8");
  EXPECT_TRUE(std::is_sorted(map.begin(), map.end()));
  EXPECT_EQ(std::count(map.begin(), map.end(), 0.0f), 1);
  EXPECT_GT(map.front(), -1.0f);  // the negative side stops at -(the mean of 0.99..., 1)
  EXPECT_EQ(map.back(), 1.0f);
}

TEST_F(Nf4Golden, NearestRoundingReproducesBitsandbytesCpuExactly) {
  int offsets_apart = 0;
  for (const GoldenCase& c : cases_) {
    const std::string& name = c.name;
    SCOPED_TRACE(name);
    const std::vector<float> x = Floats(c.input);
    const Nf4Host want = Stored(c);
    Result<Nf4Host> got = QuantizeNf4(x, want.shape, c.nested, Nf4Rounding::kNearest);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(ValidateNf4(*got, name).ok());
    ExpectSameBits(got->packed, want.packed, "packed");
    if (!c.nested) {
      ExpectSameBits(got->absmax, want.absmax, "absmax");
      continue;
    }
    // ferry's offset is the mean rounded once; torch sums in fp32 in an order of its own.
    const float tol = 4 * std::fabs(want.nested_offset) * DTypeEpsilon(DType::kF32);
    EXPECT_NEAR(got->nested_offset, want.nested_offset, tol);
    if (got->nested_offset != want.nested_offset) {
      ++offsets_apart;
    } else {
      ExpectSameBits(got->absmax_q, want.absmax_q, "absmax_q");
      ExpectSameBits(got->nested_absmax, want.nested_absmax, "nested_absmax");
    }
    // With bitsandbytes' own offset, the nested parts are bitsandbytes' exactly.
    Result<Nf4Host> plain = QuantizeNf4(x, want.shape, false, Nf4Rounding::kNearest);
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE(NestNf4Absmax(&*plain, want.nested_offset, Nf4Rounding::kNearest).ok());
    ExpectSameBits(plain->absmax_q, want.absmax_q, "absmax_q (bitsandbytes' offset)");
    ExpectSameBits(plain->nested_absmax, want.nested_absmax, "nested_absmax (its offset)");
    ExpectSameBits(plain->nested_code, want.nested_code, "nested_code");
    EXPECT_TRUE(plain->absmax.empty());
  }
  // Not a failure: the golden machine's torch summed one case's absmax in another order.
  std::printf("nested cases whose offset is an ulp from torch's fp32 mean: %d\n", offsets_apart);
}

TEST_F(Nf4Golden, DequantizeIsBitsandbytesBitForBit) {
  for (const GoldenCase& c : cases_) {
    const std::string& name = c.name;
    SCOPED_TRACE(name);
    const Nf4Host w = Stored(c);
    ASSERT_TRUE(ValidateNf4(w, name).ok()) << ValidateNf4(w, name).ToString();
    const size_t n = size_t(w.numel());
    if (c.dequant_f32) {
      std::vector<float> got(n);
      DequantizeNf4(w, DType::kF32, got.data());
      ExpectSameBits(got, Floats(name + ".dequant_f32"), "f32");
    }
    if (c.dequant_bf16) {
      std::vector<bf16> raw(n);
      DequantizeNf4(w, DType::kBF16, raw.data());
      std::vector<float> got(n);
      ConvertToFloat(DType::kBF16, raw.data(), got.data(), n);
      ExpectSameBits(got, Floats(name + ".dequant_bf16"), "bf16");
    }
  }
}

// The two roundings on bitsandbytes' inputs. The tree's thresholds are the fp32 midpoints
// bucketize uses except four, an ulp apart; so the 4-bit codes can differ only for a scaled value
// between such a threshold and its midpoint, where the scaled values differ (the short last
// block: a product by 1 / absmax against a division), and in all-zero blocks (the tree sees NaN
// and picks code 0). The nested 8-bit codes (CUDA's exact search against the CPU's 65536-bin
// table) may differ by one code for values near a midpoint.
TEST_F(Nf4Golden, ThresholdTreeDiffersOnlyNearThresholdsAndInZeroBlocks) {
  for (int q = 0; q < 15; ++q) {
    const float mid = (kNf4Code[q] + kNf4Code[q + 1]) / 2.0f;
    const bool apart = q == 0 || q == 8 || q == 12 || q == 14;
    EXPECT_EQ(std::abs(int64_t(Bits(kNf4Thresholds[q])) - int64_t(Bits(mid))), apart ? 1 : 0) << q;
  }
  for (const GoldenCase& c : cases_) {
    const std::string& name = c.name;
    SCOPED_TRACE(name);
    const std::vector<float> x = Floats(c.input);
    const Nf4Host want = Stored(c);
    const bool nested = c.nested;
    Result<Nf4Host> tree = QuantizeNf4(x, want.shape, nested, Nf4Rounding::kThresholdTree);
    ASSERT_TRUE(tree.ok());
    const int64_t n = int64_t(x.size()), full = n / kNf4Block;
    const std::vector<float> tree_absmax = Nf4Absmax(*tree);
    int at_thresholds = 0, in_short = 0, in_zero = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t t = CodeAt(tree->packed, i), b = CodeAt(want.packed, i);
      if (t == b) continue;
      const int64_t blk = i / kNf4Block;
      float amax = 0;
      for (int64_t k = blk * kNf4Block; k < std::min(n, (blk + 1) * kNf4Block); ++k) {
        amax = std::max(amax, std::fabs(x[size_t(k)]));
      }
      if (amax == 0.0f) {
        EXPECT_EQ(t, 0) << "element " << i;  // NaN through the tree
        ++in_zero;
        continue;
      }
      // Neighbours q, q + 1, split by the tree at its threshold and by bucketize at the midpoint,
      // each on its own scaled value.
      ASSERT_EQ(std::abs(int(t) - int(b)), 1) << "element " << i;
      const int q = std::min(t, b);
      const float mid = (kNf4Code[q] + kNf4Code[q + 1]) / 2.0f;
      const float prod = x[size_t(i)] * (1.0f / amax);
      const float scaled = blk == full ? x[size_t(i)] / amax : prod;
      EXPECT_EQ(t, prod > kNf4Thresholds[q] ? q + 1 : q) << "element " << i;
      EXPECT_EQ(b, scaled > mid ? q + 1 : q) << "element " << i;
      ++(blk == full ? in_short : at_thresholds);
    }
    int nested_apart = 0;
    if (nested) {
      // Nested codes on bitsandbytes' offset, so only the 8-bit rounding differs: the CPU's code
      // is the one nearest its lookup bin's centre, within a bin of the value (NestedCodes test).
      Result<Nf4Host> plain = QuantizeNf4(x, want.shape, false, Nf4Rounding::kThresholdTree);
      ASSERT_TRUE(plain.ok());
      const std::vector<float> exact = plain->absmax;
      ASSERT_TRUE(NestNf4Absmax(&*plain, want.nested_offset, Nf4Rounding::kThresholdTree).ok());
      ExpectSameBits(plain->nested_absmax, want.nested_absmax, "nested_absmax");
      const std::vector<float> cuda = Nf4Absmax(*plain), cpu = Nf4Absmax(want);
      for (size_t b = 0; b < want.absmax_q.size(); ++b) {
        if (plain->absmax_q[b] == want.absmax_q[b]) continue;
        ++nested_apart;
        const float bin = kLutBin * want.nested_absmax[b / 256];
        EXPECT_LE(std::fabs(cpu[b] - exact[b]), std::fabs(cuda[b] - exact[b]) + bin) << b;
      }
    }
    if (at_thresholds + in_short + in_zero + nested_apart > 0) {
      std::printf(
          "%s: tree vs nearest: %d codes at thresholds, %d in the short last block, %d in "
          "all-zero blocks, %d nested codes apart\n",
          name.c_str(), at_thresholds, in_short, in_zero, nested_apart);
    }
    if (name == "zeros" || name == "zeros_nested") {
      EXPECT_EQ(in_zero, kNf4Block + 2);  // the zero block and the zero 2-element tail
    }
    if (name == "thresholds") {
      // On the four thresholds an ulp above their midpoints (0|1, 12|13, 14|15: the midpoint,
      // which the tree sends up; 8|9: the threshold, which bucketize sends up), and nowhere else.
      EXPECT_EQ(at_thresholds, 4);
      EXPECT_EQ(in_short + in_zero, 0);
    }
  }
}

// The nested 8-bit codes: CUDA's binary search (kThresholdTree) finds the nearest of the 256 codes
// by their fp32 midpoints; the CPU's 65536-bin table (kNearest) the code nearest its bin's centre,
// which is within two half-bins (2 / 65535) of as near: near 0, where codes lie closer than a bin,
// several codes away. Values on every midpoint of the map and an ulp either side, through a nested
// block whose absmax is 1 (so the scale is exactly 1) around offset 0.
TEST(Nf4, NestedCodesCudaSearchIsNearestCpuTableWithinABin) {
  const std::vector<float> map = DynamicMap8();
  Nf4Host w;
  w.shape = {1};
  w.absmax = {1.0f};
  for (size_t k = 0; k + 1 < map.size(); ++k) {
    const float mid = (map[k] + map[k + 1]) / 2.0f;
    for (float v : {std::nextafter(mid, -2.0f), mid, std::nextafter(mid, 2.0f)}) {
      w.absmax.push_back(v);
    }
  }
  w.nested_block = int64_t(w.absmax.size());  // one nested block
  Nf4Host tree = w, table = w;
  ASSERT_TRUE(NestNf4Absmax(&tree, 0.0f, Nf4Rounding::kThresholdTree).ok());
  ASSERT_TRUE(NestNf4Absmax(&table, 0.0f, Nf4Rounding::kNearest).ok());
  ASSERT_EQ(tree.nested_absmax, std::vector<float>{1.0f});
  int apart = 0, far = 0;
  for (size_t b = 0; b < w.absmax.size(); ++b) {
    const float v = w.absmax[b];
    const int q = tree.absmax_q[b];
    // Between the fp32 midpoints to its neighbours (the search compares with those; on one,
    // either side may win).
    if (q > 0) {
      EXPECT_GE(v, (map[size_t(q) - 1] + map[size_t(q)]) * 0.5f) << b;
    }
    if (q < 255) {
      EXPECT_LE(v, (map[size_t(q)] + map[size_t(q) + 1]) * 0.5f) << b;
    }
    const float d = std::fabs(v - map[size_t(q)]);
    const int t = table.absmax_q[b];
    EXPECT_LE(std::fabs(v - map[size_t(t)]), d + kLutBin) << b;
    apart += t != q;
    far += std::abs(t - q) > 1;
  }
  std::printf("nested codes: CPU table vs CUDA search: %d of %zu apart, %d more than a code\n",
              apart, w.absmax.size(), far);
  EXPECT_GT(apart, 0);  // the table does round differently, on these values
}

// ---- round trips -----------------------------------------------------------------------------

// Random values, scaled per block so blocks have different absmax (some tiny, one zero).
std::vector<float> BlockScaledRandom(int64_t n, uint64_t seed) {
  std::vector<float> x = testing::RandomVector(size_t(n), seed, -1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / kNf4Block;
    x[size_t(i)] *= b == 2 ? 0.0f : std::ldexp(1.0f, int(b % 11) - 5);
  }
  return x;
}

TEST(Nf4, RoundTripPicksTheNearestCodeOfEachBlock) {
  for (int64_t n : {1, 5, 63, 64, 65, 200, 130 * 7}) {
    for (bool nested : {false, true}) {
      SCOPED_TRACE("n=" + std::to_string(n) + (nested ? " nested" : ""));
      const std::vector<float> x = BlockScaledRandom(n, uint64_t(n) * 7 + nested);
      Result<Nf4Host> w = QuantizeNf4(x, {n}, nested, Nf4Rounding::kNearest);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      ASSERT_TRUE(ValidateNf4(*w, "w").ok()) << ValidateNf4(*w, "w").ToString();
      EXPECT_EQ(w->StoredBytes(), w->packed.size() + w->absmax.size() * 4 + w->absmax_q.size() +
                                      w->nested_absmax.size() * 4 + (nested ? 4 : 0));
      EXPECT_EQ(w->StoredBytes(), Nf4StoredBytes(n, nested));
      // Without nesting absmax is max |x| of the block (the short last block's is clamped to
      // 1e-38 when zero); nested, within half the widest gap of the dynamic map near it.
      const std::vector<float> absmax = Nf4Absmax(*w);
      ASSERT_EQ(int64_t(absmax.size()), (n + kNf4Block - 1) / kNf4Block);
      const std::vector<float> map = DynamicMap8();
      float widest = 0;
      for (size_t k = 0; k + 1 < map.size(); ++k) widest = std::max(widest, map[k + 1] - map[k]);
      std::vector<float> out(static_cast<size_t>(n));
      DequantizeNf4(*w, DType::kF32, out.data());
      for (int64_t b = 0; b * kNf4Block < n; ++b) {
        const int64_t end = std::min(n, (b + 1) * kNf4Block);
        float amax = 0;
        for (int64_t i = b * kNf4Block; i < end; ++i)
          amax = std::max(amax, std::fabs(x[size_t(i)]));
        const float tol = nested ? widest / 2 * w->nested_absmax[size_t(b) / 256] +
                                       4 * DTypeEpsilon(DType::kF32) * std::fabs(amax)
                                 : 0.0f;
        const float stored = end - b * kNf4Block < kNf4Block ? std::max(amax, 1e-38f) : amax;
        EXPECT_NEAR(absmax[size_t(b)], stored, tol) << "block " << b;
        if (amax == 0.0f) continue;
        for (int64_t i = b * kNf4Block; i < end; ++i) {
          // The chosen code is at least as near x / absmax as both its neighbours.
          const int q = CodeAt(w->packed, i);
          const float s = x[size_t(i)] / amax, d = std::fabs(s - kNf4Code[q]);
          if (q > 0) {
            EXPECT_LE(d, std::fabs(s - kNf4Code[q - 1]) + 1e-6f) << i;
          }
          if (q < 15) {
            EXPECT_LE(d, std::fabs(s - kNf4Code[q + 1]) + 1e-6f) << i;
          }
          EXPECT_EQ(Bits(out[size_t(i)]), Bits(kNf4Code[q] * absmax[size_t(b)])) << i;
        }
      }
    }
  }
}

// What the planner counts for a frozen weight: a 4096 x 4096 projection holds 8 MiB of codes and
// 262144 fp32 absmax, or nested one byte each, 1024 fp32 nested absmax and the offset.
TEST(Nf4, StoredBytesCountPackedCodesAndQuantState) {
  const int64_t n = 4096 * 4096;
  EXPECT_EQ(Nf4StoredBytes(n, false), size_t(n / 2 + n / 64 * 4));
  EXPECT_EQ(Nf4StoredBytes(n, true), size_t(n / 2 + n / 64 + n / 64 / 256 * 4 + 4));
  EXPECT_EQ(Nf4StoredBytes(65, false), size_t(33 + 2 * 4));     // a short block, odd count
  EXPECT_EQ(Nf4StoredBytes(65, true), size_t(33 + 2 + 4 + 4));  // one nested block
  EXPECT_EQ(Nf4StoredBytes(257 * 64, true), size_t(257 * 32 + 257 + 2 * 4 + 4));  // two
  EXPECT_EQ(Nf4StoredBytes(1, false, 2, 256), size_t(1 + 4));
}

TEST(Nf4, DequantizeRoundsOnceToEachDtype) {
  const std::vector<float> x = BlockScaledRandom(300, 5);
  for (bool nested : {false, true}) {
    Result<Nf4Host> w = QuantizeNf4(x, {3, 100}, nested, Nf4Rounding::kThresholdTree);
    ASSERT_TRUE(w.ok());
    std::vector<float> f32(300);
    std::vector<bf16> b16(300);
    std::vector<f16> h16(300);
    DequantizeNf4(*w, DType::kF32, f32.data());
    DequantizeNf4(*w, DType::kBF16, b16.data());
    DequantizeNf4(*w, DType::kF16, h16.data());
    for (size_t i = 0; i < 300; ++i) {
      EXPECT_EQ(b16[i].bits, FloatToBF16(f32[i]).bits) << i;
      EXPECT_EQ(h16[i].bits, FloatToF16(f32[i]).bits) << i;
    }
  }
}

// The tree's own rules, on values built to sit on its decisions: a threshold goes down, a zero
// block is NaN (code 0, dequantizing to -0.0) and the padding nibble follows the last block; and a
// short block where the tree's product and bitsandbytes' CPU quotient fall on either side of a
// midpoint, the one place the two 4-bit roundings part.
TEST(Nf4, ThresholdTreeOnItsThresholdsAndOnZeros) {
  // absmax 1: the scale is exactly 1, so each value reaches the tree unchanged. Between codes 14
  // and 15 the tree's threshold is an ulp below the fp32 midpoint: the midpoint itself goes up
  // through the tree and down through bucketize.
  const float mid1415 = (kNf4Code[14] + kNf4Code[15]) / 2.0f;
  ASSERT_EQ(std::nextafter(kNf4Thresholds[14], 1.0f), mid1415);
  const std::vector<float> top = {1.0f, kNf4Thresholds[14], mid1415};
  Result<Nf4Host> top_tree = QuantizeNf4(top, {3}, false, Nf4Rounding::kThresholdTree);
  Result<Nf4Host> top_near = QuantizeNf4(top, {3}, false, Nf4Rounding::kNearest);
  ASSERT_TRUE(top_tree.ok() && top_near.ok());
  EXPECT_EQ(CodeAt(top_tree->packed, 1), 14);
  EXPECT_EQ(CodeAt(top_near->packed, 1), 14);
  EXPECT_EQ(CodeAt(top_tree->packed, 2), 15);
  EXPECT_EQ(CodeAt(top_near->packed, 2), 14);

  const float t78 = kNf4Thresholds[7], t56 = kNf4Thresholds[5];
  std::vector<float> x = {1.0f, t78, std::nextafter(t78, 1.0f), t56, std::nextafter(t56, 1.0f)};
  for (Nf4Rounding r : {Nf4Rounding::kThresholdTree, Nf4Rounding::kNearest}) {
    Result<Nf4Host> w = QuantizeNf4(x, {5}, false, r);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(CodeAt(w->packed, 0), 15);
    EXPECT_EQ(CodeAt(w->packed, 1), 7);  // on the threshold: down
    EXPECT_EQ(CodeAt(w->packed, 2), 8);  // one ulp above: up
    EXPECT_EQ(CodeAt(w->packed, 3), 5);
    EXPECT_EQ(CodeAt(w->packed, 4), 6);
  }

  const std::vector<float> zeros(5, 0.0f);
  Result<Nf4Host> z = QuantizeNf4(zeros, {5}, false, Nf4Rounding::kThresholdTree);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->absmax, std::vector<float>{0.0f});
  EXPECT_EQ(z->packed, (std::vector<uint8_t>{0x00, 0x00, 0x00}));  // padding nibble too
  std::vector<float> out(5);
  DequantizeNf4(*z, DType::kF32, out.data());
  for (float v : out) EXPECT_EQ(Bits(v), Bits(-0.0f));
  Result<Nf4Host> zn = QuantizeNf4(zeros, {5}, false, Nf4Rounding::kNearest);
  ASSERT_TRUE(zn.ok());
  EXPECT_EQ(zn->absmax, std::vector<float>{1e-38f});  // a short block: clamped, as bitsandbytes
  EXPECT_EQ(zn->packed, (std::vector<uint8_t>{0x77, 0x77, 0x77}));
  const std::vector<float> odd = {0.5f, -1.0f, 0.25f};
  Result<Nf4Host> o = QuantizeNf4(odd, {3}, false, Nf4Rounding::kThresholdTree);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->packed.back() & 0x0f, 7);  // zero padding, scaled: code 7

  // A short block {a, v} with v * (1 / a) and v / a on either side of a midpoint: searched for
  // near the midpoint of codes 11 and 12, over absmax values whose reciprocal is inexact.
  bool found = false;
  for (float a = 3.0f; a < 3.1f && !found; a = std::nextafter(a, 4.0f)) {
    const float mid = kNf4Thresholds[11];
    float v = mid * a;
    for (int k = 0; k < 8 && !found; ++k, v = std::nextafter(v, 0.0f)) {
      if ((v * (1.0f / a) > mid) == (v / a > mid)) continue;
      found = true;
      const std::vector<float> pair = {a, v};
      Result<Nf4Host> t = QuantizeNf4(pair, {2}, false, Nf4Rounding::kThresholdTree);
      Result<Nf4Host> b = QuantizeNf4(pair, {2}, false, Nf4Rounding::kNearest);
      ASSERT_TRUE(t.ok() && b.ok());
      EXPECT_EQ(CodeAt(t->packed, 1), v * (1.0f / a) > mid ? 12 : 11);
      EXPECT_EQ(CodeAt(b->packed, 1), v / a > mid ? 12 : 11);
      EXPECT_NE(CodeAt(t->packed, 1), CodeAt(b->packed, 1));
    }
  }
  EXPECT_TRUE(found) << "no absmax in [3, 3.1) separates the product from the quotient";
}

// ---- bad input ---------------------------------------------------------------------------

void ExpectError(const Status& s, const std::vector<std::string>& words) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s.message();
  }
}

TEST(Nf4, QuantizeRejectsBadShapesBlocksAndValues) {
  const std::vector<float> x(64, 0.5f);
  ExpectError(QuantizeNf4(x, {}, false).status(), {"shape is empty"});
  ExpectError(QuantizeNf4(x, {0, 64}, false).status(), {"[0, 64]", "<= 0"});
  ExpectError(QuantizeNf4(x, {65}, false).status(), {"64 values", "[65]"});
  ExpectError(QuantizeNf4(x, {64}, false, Nf4Rounding::kNearest, 0).status(), {"block size 0"});
  ExpectError(QuantizeNf4(x, {64}, false, Nf4Rounding::kNearest, 63).status(), {"block size 63"});
  ExpectError(QuantizeNf4(x, {64}, false, Nf4Rounding::kNearest, -64).status(), {"-64"});
  std::vector<float> bad = x;
  bad[17] = std::nanf("");
  ExpectError(QuantizeNf4(bad, {64}, false).status(), {"x[17]", "not finite"});
  bad[17] = INFINITY;
  ExpectError(QuantizeNf4(bad, {64}, true).status(), {"x[17]", "not finite"});
}

TEST(Nf4, ValidateNamesTheTensorAndThePartThatDisagrees) {
  const std::vector<float> x = BlockScaledRandom(600, 3);
  Result<Nf4Host> plain = QuantizeNf4(x, {20, 30}, false);
  Result<Nf4Host> nested = QuantizeNf4(x, {20, 30}, true);
  ASSERT_TRUE(plain.ok() && nested.ok());
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  ASSERT_TRUE(ValidateNf4(*plain, name).ok());
  ASSERT_TRUE(ValidateNf4(*nested, name).ok());

  auto check = [&](Nf4Host w, const std::vector<std::string>& words) {
    std::vector<std::string> all = words;
    all.push_back("'" + name + "'");
    ExpectError(ValidateNf4(w, name), all);
  };
  Nf4Host w = *plain;
  w.packed.pop_back();
  check(w, {"packed has 299", "needs 300"});
  w = *plain;
  w.absmax.push_back(1.0f);
  check(w, {"absmax has 11", "needs 10"});
  w = *plain;
  w.absmax[3] = INFINITY;
  check(w, {"absmax[3]", "not finite"});
  w = *plain;
  w.absmax[9] = std::nanf("");
  check(w, {"absmax[9]", "not finite"});
  w = *plain;
  w.code.resize(15);
  check(w, {"code has 15", "needs 16"});
  w = *plain;
  w.block = 63;
  check(w, {"block size 63"});
  w = *plain;
  w.block = 0;
  check(w, {"block size 0"});
  w = *plain;
  w.shape = {20, 0};
  check(w, {"[20, 0]"});
  w = *plain;
  w.nested_code = DynamicMap8();
  check(w, {"absmax_q is empty"});

  w = *nested;
  w.absmax_q.pop_back();
  check(w, {"absmax_q has 9", "needs 10"});
  w = *nested;
  w.nested_absmax.push_back(1.0f);
  check(w, {"nested_absmax has 2", "needs 1"});
  w = *nested;
  w.nested_absmax[0] = -INFINITY;
  check(w, {"nested_absmax[0]", "not finite"});
  w = *nested;
  w.nested_code.resize(255);
  check(w, {"nested_code has 255", "needs 256"});
  w = *nested;
  w.nested_offset = std::nanf("");
  check(w, {"nested_offset"});
  w = *nested;
  w.nested_block = 0;
  check(w, {"nested block size 0"});
  w = *nested;
  w.absmax = std::vector<float>(10, 1.0f);
  check(w, {"both absmax", "absmax_q"});

  // Several nested blocks: 600 blocks of 2 in nested blocks of 256 make 3.
  Result<Nf4Host> many =
      QuantizeNf4(BlockScaledRandom(1200, 4), {1200}, true, Nf4Rounding::kThresholdTree, 2);
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many->nested_absmax.size(), 3u);
  many->nested_absmax.pop_back();
  ExpectError(ValidateNf4(*many, name), {"nested_absmax has 2", "needs 3"});
}

TEST(Nf4, NestRejectsWhatItCannotNest) {
  Result<Nf4Host> w = QuantizeNf4(BlockScaledRandom(200, 9), {200}, true);
  ASSERT_TRUE(w.ok());
  ExpectError(NestNf4Absmax(&*w, 0.0f, Nf4Rounding::kNearest), {"already nested"});
  Result<Nf4Host> p = QuantizeNf4(BlockScaledRandom(200, 9), {200}, false);
  ASSERT_TRUE(p.ok());
  ExpectError(NestNf4Absmax(&*p, INFINITY, Nf4Rounding::kNearest), {"nested_offset"});
  p->nested_block = 0;
  ExpectError(NestNf4Absmax(&*p, 0.0f, Nf4Rounding::kNearest), {"nested block size 0"});
}

}  // namespace
}  // namespace ferry
