// nf4_dequantize through its dispatcher on a CpuDevice: bit for bit the host codec's
// DequantizeNf4 (kernels/nf4.h) for every sample weight and output dtype, and the validator's
// errors. (The CUDA kernel is compared with this one in kernels/cuda/nf4_dequantize_test.cc.)
#include "kernels/ops/nf4_dequantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/testing/nf4_staging.h"

namespace ferry {
namespace {

using testing::DeviceNf4;
using testing::DeviceTensor;

std::unique_ptr<CpuDevice> MakeDevice() {
  CpuDeviceOptions o;
  o.memory_bytes = size_t(16) << 20;
  o.compute_threads = 3;  // the largest sample spans several pool chunks
  auto d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

TEST(Nf4DequantizeOp, CpuKernelIsTheHostCodecBitForBit) {
  auto dev = MakeDevice();
  ASSERT_NE(dev, nullptr);
  for (const testing::Nf4Sample& s : testing::Nf4Samples()) {
    const DeviceNf4 parts(*dev, s.w);
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(s.name + " out " + std::string(DTypeName(t)));
      DeviceTensor out(*dev, t, Shape{s.w.numel()}, "out");
      const Status st = Nf4Dequantize(*dev, parts.Args(out.tensor()));
      ASSERT_TRUE(st.ok()) << st.ToString();
      const std::vector<float> got = out.Download(), want = testing::HostDequantized(s.w, t);
      ASSERT_EQ(got.size(), want.size());
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) && bad++ < 5) {
          ADD_FAILURE() << "[" << i << "]: got " << got[i] << " want " << want[i];
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Nf4DequantizeOp, ValidationSaysWhatIsWrong) {
  auto dev = MakeDevice();
  ASSERT_NE(dev, nullptr);
  const std::vector<float> x = testing::RandomVector(130, 3);
  Result<Nf4Host> plain = QuantizeNf4(x, {130}, false);
  Result<Nf4Host> nested = QuantizeNf4(x, {130}, true);
  ASSERT_TRUE(plain.ok() && nested.ok());
  const DeviceNf4 p(*dev, *plain), q(*dev, *nested);
  DeviceTensor out(*dev, DType::kBF16, Shape{10, 13}, "out");
  DeviceTensor floats(*dev, DType::kF32, Shape{65}, "f32 (65)");
  DeviceTensor bytes(*dev, DType::kU8, Shape{64}, "u8 (64)");
  DeviceTensor ints(*dev, DType::kI32, Shape{130}, "i32 out");
  ASSERT_TRUE(ValidateNf4Dequantize(p.Args(out.tensor())).ok());
  ASSERT_TRUE(ValidateNf4Dequantize(q.Args(out.tensor())).ok());

  auto expect = [&](const Nf4DequantizeArgs& a, const std::vector<std::string>& words) {
    const Status s = Nf4Dequantize(*dev, a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    for (const std::string& w : words) {
      EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in " << s.message();
    }
  };
  Nf4DequantizeArgs a = p.Args(out.tensor());
  a.packed = floats.tensor();
  expect(a, {"'packed'", "u8 with 65 elements", "f32[65]"});
  a = p.Args(out.tensor());
  a.packed = bytes.tensor();
  expect(a, {"'packed'", "65 elements", "u8[64]"});
  a = p.Args(out.tensor());
  a.packed = Tensor{};
  expect(a, {"'packed' is null"});
  a = p.Args(out.tensor());
  a.absmax = floats.tensor();
  expect(a, {"'absmax'", "f32 with 3 elements", "f32[65]"});
  a = p.Args(out.tensor());
  a.block = 63;
  expect(a, {"block size 63"});
  a = p.Args(out.tensor());
  a.block = 0;
  expect(a, {"block size 0"});
  a = p.Args(out.tensor());
  a.code = floats.tensor();
  expect(a, {"'code'", "16 elements"});
  a = p.Args(out.tensor());
  a.nested_code = q.Args(out.tensor()).nested_code;
  expect(a, {"nested_absmax/nested_code/nested_offset given"});
  a = p.Args(ints.tensor());
  expect(a, {"out", "f32, bf16 or f16"});

  a = q.Args(out.tensor());
  a.nested_code = Tensor{};
  expect(a, {"'nested_code' is null"});
  a = q.Args(out.tensor());
  a.nested_absmax = floats.tensor();
  expect(a, {"'nested_absmax'", "1 elements", "f32[65]"});
  a = q.Args(out.tensor());
  a.nested_offset = floats.tensor();
  expect(a, {"'nested_offset'", "1 elements"});
  a = p.Args(out.tensor());
  a.nested_offset = q.Args(out.tensor()).nested_offset;
  expect(a, {"nested_offset given"});
  a = q.Args(out.tensor());
  a.nested_block = 0;
  expect(a, {"nested block size 0"});
}

}  // namespace
}  // namespace ferry
