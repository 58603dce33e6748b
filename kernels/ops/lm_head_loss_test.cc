// The fused LM head + loss through its dispatcher on a CpuDevice, including the proof that the
// (N, V) logits are never materialized: the device's whole arena is smaller than them.
#include "kernels/ops/lm_head_loss.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/lm_head_loss.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::DeviceTensor;
using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;

TEST(LmHeadLossOp, RunsInAnArenaSmallerThanTheLogits) {
  const int64_t N = 512, V = 1024, C = 32, chunk = 16;
  const int threads = 2;
  const size_t logits_bytes = size_t(N * V) * 4;  // 2 MiB
  CpuDeviceOptions o;
  o.memory_bytes = size_t(1) << 20;  // 1 MiB: the whole device holds half of the logits
  o.compute_threads = threads;
  ASSERT_LT(o.memory_bytes, logits_bytes);
  auto dev_or = CpuDevice::Create(o);
  ASSERT_TRUE(dev_or.ok()) << dev_or.status().ToString();
  CpuDevice& dev = **dev_or;

  const size_t scratch_bytes =
      LmHeadLossScratchBytes(dev, chunk, V, C, DType::kBF16, DType::kF32, true);
  EXPECT_LE(scratch_bytes, logits_bytes / 16) << "scratch should be O(chunk * V)";

  const std::vector<float> h = testing::Rounded(RandomVector(size_t(N * C), 1), DType::kBF16);
  const std::vector<float> w = testing::Rounded(RandomVector(size_t(V * C), 2), DType::kBF16);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    targets[size_t(i)] = i % 7 == 3 ? kIgnoreIndex : int32_t(i * 37 % V);
  const std::vector<float> dw0 = RandomVector(size_t(V * C), 3, -0.1f, 0.1f);

  DeviceTensor th(dev, DType::kBF16, Shape{N, C}, "h"), tw(dev, DType::kBF16, Shape{V, C}, "w");
  DeviceTensor tt(dev, DType::kF32, Shape{N}, "targets");  // int32 bytes in an f32-sized buffer
  DeviceTensor tdh(dev, DType::kBF16, Shape{N, C}, "dh"), tdw(dev, DType::kF32, Shape{V, C}, "dw");
  DeviceTensor tloss(dev, DType::kF32, Shape{N}, "token_loss"),
      tsum(dev, DType::kF32, Shape{1}, "loss");
  DeviceTensor scratch(dev, DType::kF32, Shape{int64_t(scratch_bytes / 4)}, "lm_head scratch");
  ASSERT_TRUE(th.ok() && tw.ok() && tt.ok() && tdh.ok() && tdw.ok() && tloss.ok() && tsum.ok() &&
              scratch.ok());
  th.Upload(h);
  tw.Upload(w);
  tt.UploadBytes(targets.data(), targets.size() * 4);
  tdw.Upload(dw0);

  LmHeadLossArgs a;
  a.h = th.tensor();
  a.w = tw.tensor();
  a.targets = tt.tensor().data.As<const int32_t>();
  a.normalizer = 1000;
  a.chunk_tokens = chunk;
  a.token_loss = tloss.tensor();
  a.loss_sum = tsum.tensor();
  a.dh = tdh.tensor();
  a.dw = tdw.tensor();
  a.scratch = scratch.tensor();
  ASSERT_TRUE(LmHeadLossForwardBackward(dev, a).ok());
  const std::vector<float> got_loss = tloss.Download(), got_sum = tsum.Download();
  const std::vector<float> got_dh = tdh.Download(), got_dw = tdw.Download();
  EXPECT_LT(dev.arena_stats().peak, logits_bytes);

  // The same kernel on host memory with a pool of the device's size: identical bits (the
  // kernel's numerics against the reference are tested in kernels/cpu/lm_head_loss_test.cc).
  HostTensor hh(DType::kBF16, Shape{N, C}, h), hw(DType::kBF16, Shape{V, C}, w);
  HostTensor hdh(DType::kBF16, Shape{N, C}), hdw(DType::kF32, Shape{V, C}, dw0);
  HostTensor hloss(DType::kF32, Shape{N}), hsum(DType::kF32, Shape{1});
  HostTensor hscratch(DType::kF32, Shape{int64_t(scratch_bytes / 4)});
  LmHeadLossArgs b = a;
  b.h = hh.tensor();
  b.w = hw.tensor();
  b.targets = BackendAccess::Wrap(static_cast<const int32_t*>(targets.data()));
  b.token_loss = hloss.tensor();
  b.loss_sum = hsum.tensor();
  b.dh = hdh.tensor();
  b.dw = hdw.tensor();
  b.scratch = hscratch.tensor();
  ThreadPool pool(threads);
  ASSERT_TRUE(cpu::LmHeadLossForwardBackward(pool, b).ok());
  ExpectClose(got_loss, hloss.Get(), 0, 0, "token_loss");
  ExpectClose(got_sum, hsum.Get(), 0, 0, "loss_sum");
  ExpectClose(got_dh, hdh.Get(), 0, 0, "dh");
  ExpectClose(got_dw, hdw.Get(), 0, 0, "dW");
  EXPECT_GT(got_sum[0], 0.0f);

  // Forward only (evaluation) through the dispatcher, with its smaller scratch.
  LmHeadLossArgs f = a;
  f.dh = {};
  f.dw = {};
  f.scratch = scratch.tensor().Rows(
      0, int64_t(LmHeadLossScratchBytes(dev, chunk, V, C, DType::kBF16, DType::kF32, false) / 4));
  ASSERT_TRUE(LmHeadLossForward(dev, f).ok());
  ExpectClose(tsum.Download(), got_sum, 0, 0, "forward-only loss_sum");

  // No weight gradient (a frozen head: LoRA) through the dispatcher: the same loss, token losses
  // and dh bit for bit (same chunking), in no more scratch than with a dW.
  const size_t no_dw_bytes =
      LmHeadLossScratchBytes(dev, chunk, V, C, DType::kBF16, std::nullopt, true);
  EXPECT_LE(no_dw_bytes, scratch_bytes);
  DeviceTensor ndh(dev, DType::kBF16, Shape{N, C}, "dh (no dW)");
  DeviceTensor nloss(dev, DType::kF32, Shape{N}, "token_loss (no dW)");
  ASSERT_TRUE(ndh.ok() && nloss.ok());
  LmHeadLossArgs g = a;
  g.token_loss = nloss.tensor();
  g.dh = ndh.tensor();
  g.dw = {};
  g.scratch = scratch.tensor().Rows(0, int64_t(no_dw_bytes / 4));
  const Status ng = LmHeadLossForwardBackward(dev, g);
  ASSERT_TRUE(ng.ok()) << ng.ToString();
  ExpectClose(nloss.Download(), got_loss, 0, 0, "no-dW token_loss");
  ExpectClose(tsum.Download(), got_sum, 0, 0, "no-dW loss_sum");
  ExpectClose(ndh.Download(), got_dh, 0, 0, "no-dW dh");
}

TEST(LmHeadLossOp, DispatcherRejectsShortScratchAtEnqueue) {
  CpuDeviceOptions o;
  o.compute_threads = 3;
  auto dev_or = CpuDevice::Create(o);
  ASSERT_TRUE(dev_or.ok());
  CpuDevice& dev = **dev_or;
  const int64_t N = 8, V = 16, C = 4;
  DeviceTensor th(dev, DType::kF32, Shape{N, C}, "h"), tw(dev, DType::kF32, Shape{V, C}, "w");
  DeviceTensor tt(dev, DType::kF32, Shape{N}, "targets"), tsum(dev, DType::kF32, Shape{1}, "loss");
  // Enough for one thread, not for the device's three.
  const size_t one = cpu::LmHeadLossScratchBytes(1, 4, V, C, DType::kF32, DType::kF32, true);
  DeviceTensor tdh(dev, DType::kF32, Shape{N, C}, "dh"), tdw(dev, DType::kF32, Shape{V, C}, "dw");
  DeviceTensor scratch(dev, DType::kF32, Shape{int64_t(one / 4)}, "scratch");
  LmHeadLossArgs a;
  a.h = th.tensor();
  a.w = tw.tensor();
  a.targets = tt.tensor().data.As<const int32_t>();
  a.chunk_tokens = 4;
  a.loss_sum = tsum.tensor();
  a.dh = tdh.tensor();
  a.dw = tdw.tensor();
  a.scratch = scratch.tensor();
  const Status s = LmHeadLossForwardBackward(dev, a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu0"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ferry
