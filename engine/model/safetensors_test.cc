#include "engine/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/testing/golden_files.h"

namespace ferry {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/ferry_st_" + std::to_string(::getpid()) + "_" + name;
}

// A file image: 8-byte little-endian length, the header text, then `data_bytes` zero bytes.
std::vector<std::byte> Image(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

Status ParseImage(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> img = Image(header, data_bytes);
  return ParseSafetensorsHeader(img, "test.safetensors").status();
}

TEST(SafetensorsTest, ReadsGoldenWrittenByPython) {
  Result<SafetensorsFile> f =
      SafetensorsFile::Open(testing::GoldenPath("llama", "model.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const SafetensorsTensorInfo* q = f->Find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, SafetensorsDType::kF32);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{32, 64}));  // 2 kv heads x head_dim 16, hidden 64
  Result<std::vector<float>> w = f->ReadFloats(q->name);
  ASSERT_TRUE(w.ok());
  // Weights were drawn as N(0, 0.08^2): the sample's spread says the bytes were read in place.
  double sq = 0;
  for (float v : *w) sq += double(v) * v;
  EXPECT_NEAR(std::sqrt(sq / double(w->size())), 0.08, 0.01);

  Result<SafetensorsFile> io =
      SafetensorsFile::Open(testing::GoldenPath("llama", "io.safetensors"));
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  Result<std::vector<int64_t>> targets = io->ReadInts("targets");
  ASSERT_TRUE(targets.ok());
  ASSERT_EQ(targets->size(), 22u);
  EXPECT_EQ((*targets)[0], -100);                  // the masked prompt of row 0
  EXPECT_FALSE(io->ReadInts("logits").ok());       // F32 is not an integer dtype
  EXPECT_FALSE(io->ReadFloats("input_ids").ok());  // I64 is not a float dtype
  EXPECT_EQ(io->ReadFloats("nope").status().code(), StatusCode::kNotFound);
  std::vector<int64_t> wrong = {2, 11};
  EXPECT_EQ(io->ReadFloats("logits", &wrong).status().code(), StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, RoundTripsEveryStorageDType) {
  const std::string path = TempPath("roundtrip.safetensors");
  std::vector<float> a = {1.0f, -2.5f, 3.14159274f, 1e-3f, 65504.0f, -0.0f};
  SafetensorsWriter w;
  w.Add("a.f32", {2, 3}, a, DType::kF32);
  w.Add("a.bf16", {6}, a, DType::kBF16);
  w.Add("a.f16", {3, 2}, a, DType::kF16);
  w.Add("scalar", {}, std::span<const float>(a.data(), 1), DType::kF32);
  w.Add("empty", {0, 4}, {}, DType::kF32);
  w.SetMetadata("format", "pt");
  ASSERT_TRUE(w.Write(path).ok());

  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  // Header padded to a multiple of 8 so the data section is aligned like Python's files.
  EXPECT_EQ(f->tensors()[0].offset % 8, 0u);
  const std::pair<const char*, DType> cases[] = {
      {"a.f32", DType::kF32}, {"a.bf16", DType::kBF16}, {"a.f16", DType::kF16}};
  for (auto [name, dtype] : cases) {
    Result<std::vector<float>> got = f->ReadFloats(name);
    ASSERT_TRUE(got.ok()) << name;
    ASSERT_EQ(got->size(), a.size());
    // Exact: the reader must return precisely the value the writer's rounding kept.
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ((*got)[i], RoundTo(dtype, a[i])) << name << i;
  }
  EXPECT_EQ(f->Find("scalar")->shape.size(), 0u);
  EXPECT_EQ(f->Find("empty")->bytes, 0u);
  ::unlink(path.c_str());
}

TEST(SafetensorsTest, WriterRefusesBadInput) {
  const std::string path = TempPath("bad.safetensors");
  std::vector<std::byte> four(4);
  SafetensorsWriteTensor dup[] = {{"x", DType::kF32, {1}, four}, {"x", DType::kF32, {1}, four}};
  EXPECT_EQ(WriteSafetensors(path, dup).code(), StatusCode::kInvalidArgument);
  SafetensorsWriteTensor short_data[] = {{"x", DType::kF32, {2}, four}};
  EXPECT_EQ(WriteSafetensors(path, short_data).code(), StatusCode::kInvalidArgument);
  SafetensorsWriteTensor ok[] = {{"x", DType::kF32, {1}, four}};
  EXPECT_FALSE(WriteSafetensors("/nonexistent-dir/x.safetensors", ok).ok());
}

TEST(SafetensorsTest, ValidatesHeader) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_TRUE(ParseImage(good, 8).ok());
  // Data section shorter than the offsets claim.
  EXPECT_EQ(ParseImage(good, 7).code(), StatusCode::kCorruption);
  // Not JSON, not an object, missing fields, wrong types.
  EXPECT_EQ(ParseImage("{\"a\":", 0).code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseImage("[1,2]", 0).code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseImage(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8).code(),
            StatusCode::kCorruption);
  // Size of dtype x shape differs from the range.
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8).code(),
            StatusCode::kCorruption);
  // Unknown dtype: an InvalidArgument that names it.
  Status s = ParseImage(R"({"a":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("F8_E9"), std::string::npos);
  // Overlapping ranges, named.
  s = ParseImage(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 8);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("overlaps"), std::string::npos);
  // A shape whose byte size overflows 64 bits.
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                       R"("data_offsets":[0,8]}})",
                       8)
                .code(),
            StatusCode::kCorruption);
  // Found while writing tests/fuzz: a 0 after dimensions whose product overflows int64 gave an
  // empty tensor whose numel() overflowed (UB) and made ReadFloats allocate ~2^62 floats.
  EXPECT_EQ(ParseImage(R"({"a":{"dtype":"U8","shape":[3,4611686018427387904,0],)"
                       R"("data_offsets":[0,0]}})",
                       0)
                .code(),
            StatusCode::kCorruption);
  EXPECT_TRUE(ParseImage(R"({"a":{"dtype":"U8","shape":[0,4611686018427387904],)"
                         R"("data_offsets":[0,0]}})",
                         0)
                  .ok());
  // Metadata values must be strings.
  EXPECT_EQ(ParseImage(R"({"__metadata__":{"k":1}})", 0).code(), StatusCode::kCorruption);
  // A header length past the end of the file, and a file too short to hold one.
  std::vector<std::byte> img = Image(good, 8);
  img[0] = std::byte(0xff);
  EXPECT_EQ(ParseSafetensorsHeader(img, "t").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseSafetensorsHeader(std::span(img.data(), 5), "t").status().code(),
            StatusCode::kCorruption);
}

TEST(SafetensorsTest, OpenReportsMissingAndTruncatedFiles) {
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/x.safetensors").status().code(),
            StatusCode::kNotFound);
  // A real golden cut short: the last tensor's range no longer fits.
  Result<SafetensorsFile> f = SafetensorsFile::Open(testing::GoldenPath("gpt2", "io.safetensors"));
  ASSERT_TRUE(f.ok());
  std::string bytes = testing::ReadTextFile(f->path());
  const std::string path = TempPath("truncated.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size() - 3));
  }
  Result<SafetensorsFile> t = SafetensorsFile::Open(path);
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find(path), std::string::npos);
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace ferry
