// AdamW through its dispatcher on a CpuDevice: two steps on device tensors against the fp32
// reference, bit for bit (the kernel's rounding order is the reference's;
// kernels/cpu/adamw_test.cc).
#include "kernels/ops/adamw.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/ref/adamw.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::DeviceTensor;
using testing::ExpectClose;
using testing::RandomVector;

TEST(AdamWOp, TwoStepsOnACpuDeviceMatchReference) {
  CpuDeviceOptions o;
  o.compute_threads = 2;
  auto dev_or = CpuDevice::Create(o);
  ASSERT_TRUE(dev_or.ok()) << dev_or.status().ToString();
  CpuDevice& dev = **dev_or;
  const int64_t n = 70001;  // several pool chunks and a vector tail
  std::vector<float> p = RandomVector(size_t(n), 1), m(static_cast<size_t>(n)),
                     v(static_cast<size_t>(n));
  DeviceTensor tp(dev, DType::kF32, Shape{n}, "p"), tg(dev, DType::kBF16, Shape{n}, "g");
  DeviceTensor tm(dev, DType::kF32, Shape{n}, "m"), tv(dev, DType::kF32, Shape{n}, "v");
  DeviceTensor tpb(dev, DType::kBF16, Shape{n}, "p_bf16");
  tp.Upload(p);
  tm.Upload(m);
  tv.Upload(v);
  for (int t = 1; t <= 2; ++t) {
    const std::vector<float> g = testing::Rounded(RandomVector(size_t(n), 10 + t), DType::kBF16);
    tg.Upload(g);
    AdamWHyperparameters h;
    h.lr = 0.01;
    h.weight_decay = 0.1;
    h.grad_scale = 0.5;
    h.step = t;
    const Status s =
        AdamWStep(dev, {tp.tensor(), tg.tensor(), tm.tensor(), tv.tensor(), tpb.tensor(), h});
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(dev.Synchronize().ok());
    ref::AdamWStep<float>(h, p.data(), g.data(), m.data(), v.data(), n);
  }
  ExpectClose(tp.Download(), p, 0, 0, "p");
  ExpectClose(tm.Download(), m, 0, 0, "m");
  ExpectClose(tv.Download(), v, 0, 0, "v");
  ExpectClose(tpb.Download(), testing::Rounded(p, DType::kBF16), 0, 0, "p_bf16");
}

TEST(AdamWOp, DispatcherValidatesAtEnqueue) {
  auto dev_or = CpuDevice::Create(CpuDeviceOptions{});
  ASSERT_TRUE(dev_or.ok());
  CpuDevice& dev = **dev_or;
  DeviceTensor tp(dev, DType::kF32, Shape{8}, "p"), tg(dev, DType::kF32, Shape{8}, "g");
  DeviceTensor tm(dev, DType::kF32, Shape{8}, "m");
  AdamWHyperparameters h;
  h.step = 0;
  EXPECT_EQ(AdamWStep(dev, {tp.tensor(), tg.tensor(), tm.tensor(), tm.tensor(), {}, h}).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
