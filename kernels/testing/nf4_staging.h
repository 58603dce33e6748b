// Test helper (header-only; tests only): NF4 weights for the nf4_dequantize op tests, their parts
// staged on a device as the op reads them, and the host codec's output to compare against.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/nf4.h"
#include "kernels/ops/nf4_dequantize.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {

struct Nf4Sample {
  std::string name;
  Nf4Host w;
};

// Weights of awkward sizes, plain and nested, from both roundings: a lone element, an odd count, a
// block and a block plus one, several pool pieces, and small blocks (2) so nested blocks (256
// each) are several, the last short. Values scaled per block, one block all zeros.
inline std::vector<Nf4Sample> Nf4Samples() {
  std::vector<Nf4Sample> out;
  struct Size {
    int64_t n, block;
  };
  for (Size s : {Size{1, 64}, Size{5, 64}, Size{64, 64}, Size{65, 64}, Size{910, 64},
                 Size{38403, 64}, Size{1201, 2}}) {
    std::vector<float> x = RandomVector(size_t(s.n), uint64_t(s.n) + 11);
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t b = i / s.block;
      x[size_t(i)] *= b == 1 ? 0.0f : float(1 + b % 7) * 0.25f;
    }
    for (bool nested : {false, true}) {
      for (Nf4Rounding r : {Nf4Rounding::kThresholdTree, Nf4Rounding::kNearest}) {
        Result<Nf4Host> w = QuantizeNf4(x, {s.n}, nested, r, s.block);
        EXPECT_TRUE(w.ok()) << w.status().ToString();
        if (!w.ok()) continue;
        out.push_back({"n=" + std::to_string(s.n) + " block=" + std::to_string(s.block) +
                           (nested ? " nested" : "") +
                           (r == Nf4Rounding::kNearest ? " nearest" : " tree"),
                       std::move(w).value()});
      }
    }
  }
  return out;
}

// The host codec's output in `dtype`, widened exactly to fp32.
inline std::vector<float> HostDequantized(const Nf4Host& w, DType dtype) {
  const size_t n = size_t(w.numel());
  std::vector<std::byte> raw(n * DTypeSize(dtype));
  DequantizeNf4(w, dtype, raw.data());
  std::vector<float> out(n);
  ConvertToFloat(dtype, raw.data(), out.data(), n);
  return out;
}

// A weight's parts on a device (each an exact copy: bytes as u8, fp32 as f32).
class DeviceNf4 {
 public:
  DeviceNf4(Device& d, const Nf4Host& w)
      : w_(w),
        packed_(Bytes(d, w.packed, "nf4 packed")),
        code_(Floats(d, w.code, "nf4 code")),
        absmax_(w.nested() ? Bytes(d, w.absmax_q, "nf4 absmax_q")
                           : Floats(d, w.absmax, "nf4 absmax")) {
    if (w.nested()) {
      nested_absmax_ = Floats(d, w.nested_absmax, "nf4 nested_absmax");
      nested_code_ = Floats(d, w.nested_code, "nf4 nested_code");
      nested_offset_ = Floats(d, {w.nested_offset}, "nf4 nested_offset");
    }
  }

  Nf4DequantizeArgs Args(const Tensor& out) const {
    Nf4DequantizeArgs a;
    a.packed = packed_->tensor();
    a.code = code_->tensor();
    a.absmax = absmax_->tensor();
    if (w_.nested()) {
      a.nested_absmax = nested_absmax_->tensor();
      a.nested_code = nested_code_->tensor();
      a.nested_offset = nested_offset_->tensor();
      a.nested_block = w_.nested_block;
    }
    a.block = w_.block;
    a.out = out;
    return a;
  }

 private:
  static std::unique_ptr<DeviceTensor> Bytes(Device& d, const std::vector<uint8_t>& v,
                                             const std::string& name) {
    auto t = std::make_unique<DeviceTensor>(d, DType::kU8, Shape{int64_t(v.size())}, name);
    t->UploadBytes(v.data(), v.size());
    return t;
  }
  static std::unique_ptr<DeviceTensor> Floats(Device& d, const std::vector<float>& v,
                                              const std::string& name) {
    auto t = std::make_unique<DeviceTensor>(d, DType::kF32, Shape{int64_t(v.size())}, name);
    t->Upload(v);
    return t;
  }

  const Nf4Host& w_;
  std::unique_ptr<DeviceTensor> packed_, code_, absmax_, nested_absmax_, nested_code_,
      nested_offset_;
};

}  // namespace ferry::testing
