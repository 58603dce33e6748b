// RoPE and attention through their dispatchers on a CpuDevice: device memory, the compute stream,
// argument validation at enqueue time, and the O(T) memory claim (a T = 4096 attention forward and
// backward inside an arena smaller than one T x T fp32 matrix).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/rope.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/rope.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::DeviceTensor;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;

std::unique_ptr<CpuDevice> MakeDevice(size_t bytes, int threads) {
  CpuDeviceOptions o;
  o.memory_bytes = bytes;
  o.compute_threads = threads;
  auto d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

// A device tensor holding `v` (rounded to dtype t).
DeviceTensor Uploaded(Device& d, DType t, Shape shape, const std::vector<float>& v,
                      const char* name) {
  DeviceTensor dt(d, t, shape, name);
  dt.Upload(v);
  return dt;
}

// RoPE on q and k, attention forward and backward, RoPE backward on dq and dk: on the device
// through the dispatchers, and on the host through the CPU kernels directly. Every output element
// is computed by one work item in a fixed order, so the two must agree bit for bit.
TEST(AttentionDispatchTest, RopeThenAttentionMatchesDirectKernels) {
  const int threads = 3;
  const AttentionShape s{2, 33, 6, 2, 64};
  const int64_t n = s.tokens(), qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const DType t = DType::kBF16;
  const float scale = 1.0f / 8.0f;
  const int64_t window = 9;
  std::vector<float> pos(static_cast<size_t>(n)), docs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    pos[size_t(i)] = float((i * 37) % 1000);
    docs[size_t(i)] = float((i % s.seq_len) / 10);
  }
  const std::vector<float> q = Rounded(RandomVector(size_t(n * qw), 1, -3, 3), t);
  const std::vector<float> k = Rounded(RandomVector(size_t(n * kw), 2), t);
  const std::vector<float> v = Rounded(RandomVector(size_t(n * kw), 3), t);
  const std::vector<float> d_o = Rounded(RandomVector(size_t(n * qw), 4), t);

  // Host, direct kernels.
  ThreadPool pool(threads);
  HostTensor hq(t, {n, qw}, q), hk(t, {n, kw}, k), hv(t, {n, kw}, v), hdo(t, {n, qw}, d_o);
  HostTensor hpos(DType::kI32, {n}, pos), hdocs(DType::kI32, {n}, docs);
  HostTensor ho(t, {n, qw}), hlse(DType::kF32, {n, s.q_heads});
  HostTensor hdq(t, {n, qw}), hdk(t, {n, kw}), hdv(t, {n, kw});
  HostTensor hscratch(DType::kF32, {int64_t(cpu::AttentionScratchBytes(threads, s) / 4)});
  const RopeArgs rq{hq.tensor(), hq.tensor(), hpos.tensor(), {}, s.q_heads, s.head_dim, 0, 1e4f};
  const RopeArgs rk{hk.tensor(), hk.tensor(), hpos.tensor(), {}, s.kv_heads, s.head_dim, 0, 1e4f};
  ASSERT_TRUE(cpu::RopeForward(pool, rq).ok());
  ASSERT_TRUE(cpu::RopeForward(pool, rk).ok());
  ASSERT_TRUE(
      cpu::AttentionForward(pool, {s, hq.tensor(), hk.tensor(), hv.tensor(), hdocs.tensor(),
                                   ho.tensor(), hlse.tensor(), hscratch.tensor(), scale, window})
          .ok());
  ASSERT_TRUE(
      cpu::AttentionBackward(pool, {s, hq.tensor(), hk.tensor(), hv.tensor(), hdocs.tensor(),
                                    ho.tensor(), hlse.tensor(), hdo.tensor(), hdq.tensor(),
                                    hdk.tensor(), hdv.tensor(), hscratch.tensor(), scale, window})
          .ok());
  ASSERT_TRUE(
      cpu::RopeBackward(
          pool, {hdq.tensor(), hdq.tensor(), hpos.tensor(), {}, s.q_heads, s.head_dim, 0, 1e4f})
          .ok());
  ASSERT_TRUE(
      cpu::RopeBackward(
          pool, {hdk.tensor(), hdk.tensor(), hpos.tensor(), {}, s.kv_heads, s.head_dim, 0, 1e4f})
          .ok());

  // Device, dispatchers.
  auto dev = MakeDevice(size_t(8) << 20, threads);
  ASSERT_NE(dev, nullptr);
  Device& d = *dev;
  DeviceTensor dq_in = Uploaded(d, t, {n, qw}, q, "q"), dk_in = Uploaded(d, t, {n, kw}, k, "k");
  DeviceTensor dv_in = Uploaded(d, t, {n, kw}, v, "v");
  DeviceTensor ddo = Uploaded(d, t, {n, qw}, d_o, "d_o");
  DeviceTensor dpos = Uploaded(d, DType::kI32, {n}, pos, "positions");
  DeviceTensor ddocs = Uploaded(d, DType::kI32, {n}, docs, "doc_ids");
  DeviceTensor o(d, t, {n, qw}, "o"), lse(d, DType::kF32, {n, s.q_heads}, "lse");
  DeviceTensor dq(d, t, {n, qw}, "dq"), dk(d, t, {n, kw}, "dk"), dv(d, t, {n, kw}, "dv");
  DeviceTensor scratch(d, DType::kF32, {int64_t(AttentionScratchBytes(d, s) / 4)}, "scratch");
  const Tensor dpos_t = dpos.tensor();
  ASSERT_TRUE(
      RopeForward(d, {dq_in.tensor(), dq_in.tensor(), dpos_t, {}, s.q_heads, s.head_dim, 0, 1e4f})
          .ok());
  ASSERT_TRUE(
      RopeForward(d, {dk_in.tensor(), dk_in.tensor(), dpos_t, {}, s.kv_heads, s.head_dim, 0, 1e4f})
          .ok());
  ASSERT_TRUE(
      AttentionForward(d, {s, dq_in.tensor(), dk_in.tensor(), dv_in.tensor(), ddocs.tensor(),
                           o.tensor(), lse.tensor(), scratch.tensor(), scale, window})
          .ok());
  ASSERT_TRUE(
      AttentionBackward(d, {s, dq_in.tensor(), dk_in.tensor(), dv_in.tensor(), ddocs.tensor(),
                            o.tensor(), lse.tensor(), ddo.tensor(), dq.tensor(), dk.tensor(),
                            dv.tensor(), scratch.tensor(), scale, window})
          .ok());
  ASSERT_TRUE(
      RopeBackward(d, {dq.tensor(), dq.tensor(), dpos_t, {}, s.q_heads, s.head_dim, 0, 1e4f}).ok());
  ASSERT_TRUE(
      RopeBackward(d, {dk.tensor(), dk.tensor(), dpos_t, {}, s.kv_heads, s.head_dim, 0, 1e4f})
          .ok());

  // Identical code on identical inputs: exact equality (tolerance 0).
  testing::ExpectClose(dq_in.Download(), hq.Get(), 0, 0, "rope(q)");
  testing::ExpectClose(dk_in.Download(), hk.Get(), 0, 0, "rope(k)");
  testing::ExpectClose(o.Download(), ho.Get(), 0, 0, "o");
  testing::ExpectClose(lse.Download(), hlse.Get(), 0, 0, "lse");
  testing::ExpectClose(dq.Download(), hdq.Get(), 0, 0, "dq");
  testing::ExpectClose(dk.Download(), hdk.Get(), 0, 0, "dk");
  testing::ExpectClose(dv.Download(), hdv.Get(), 0, 0, "dv");
}

// T = 4096 with small heads, forward and backward through the dispatchers on a device whose
// arena (4 MiB) is a sixteenth of one T x T fp32 matrix (64 MiB): everything the op touches,
// scratch included, must be O(T). Results are checked on sampled rows against direct double
// evaluations that cost O(T*D) each (the full reference would be O(T^2)).
TEST(AttentionDispatchTest, LongSequenceRunsInArenaSmallerThanTxT) {
  const AttentionShape s{1, 4096, 2, 1, 8};
  const int64_t n = s.tokens(), qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const int64_t d_head = s.head_dim, t_len = s.seq_len;
  const size_t arena = size_t(4) << 20;
  ASSERT_LT(arena, size_t(t_len) * size_t(t_len) * 4);
  auto dev = MakeDevice(arena, 2);
  ASSERT_NE(dev, nullptr);
  Device& d = *dev;
  const float scale = 1.0f / std::sqrt(float(d_head));
  const std::vector<float> q = RandomVector(size_t(n * qw), 21, -3, 3);
  const std::vector<float> k = RandomVector(size_t(n * kw), 22),
                           v = RandomVector(size_t(n * kw), 23);
  const std::vector<float> d_o = RandomVector(size_t(n * qw), 24);
  const DType f32 = DType::kF32;
  DeviceTensor tq = Uploaded(d, f32, {n, qw}, q, "q"), tk = Uploaded(d, f32, {n, kw}, k, "k");
  DeviceTensor tv = Uploaded(d, f32, {n, kw}, v, "v"), tdo = Uploaded(d, f32, {n, qw}, d_o, "d_o");
  DeviceTensor o_buf(d, f32, {n, qw}, "o"), lse_buf(d, f32, {n, s.q_heads}, "lse");
  DeviceTensor dq_buf(d, f32, {n, qw}, "dq"), dk_buf(d, f32, {n, kw}, "dk");
  DeviceTensor dv_buf(d, f32, {n, kw}, "dv");
  DeviceTensor scratch_buf(d, f32, {int64_t(AttentionScratchBytes(d, s) / 4)}, "scratch");
  const Tensor o = o_buf.tensor(), lse = lse_buf.tensor(), dq = dq_buf.tensor();
  const Tensor dk = dk_buf.tensor(), dv = dv_buf.tensor(), scratch = scratch_buf.tensor();
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(
      AttentionForward(d, {s, tq.tensor(), tk.tensor(), tv.tensor(), {}, o, lse, scratch, scale, 0})
          .ok());
  ASSERT_TRUE(AttentionBackward(d, {s,
                                    tq.tensor(),
                                    tk.tensor(),
                                    tv.tensor(),
                                    {},
                                    o,
                                    lse,
                                    tdo.tensor(),
                                    dq,
                                    dk,
                                    dv,
                                    scratch,
                                    scale,
                                    0})
                  .ok());
  const std::vector<float> go = o_buf.Download(), glse = lse_buf.Download();
  const std::vector<float> gdq = dq_buf.Download(), gdk = dk_buf.Download();
  const std::vector<float> gdv = dv_buf.Download();
  EXPECT_LT(d.arena_stats().peak, arena);

  auto dot = [&](const std::vector<float>& a, int64_t ai, const std::vector<float>& b, int64_t bi) {
    double acc = 0;
    for (int64_t x = 0; x < d_head; ++x)
      acc += double(a[size_t(ai + x)]) * double(b[size_t(bi + x)]);
    return acc;
  };
  const float eps = DTypeEpsilon(f32);
  // Forward bound as in kernels/cpu/attention_test.cc: 3*D^1.5 (scores) + T (sums) units.
  const double fwd_tol = (3 * d_head * std::sqrt(double(d_head)) + double(t_len) + 16) * eps;
  for (int64_t h = 0; h < s.q_heads; ++h) {
    for (int64_t i : {0, 1, 63, 64, 2047, 4095}) {
      // Query row i: softmax over keys 0..i, then o_i, lse_i, Delta_i and dq_i.
      std::vector<double> p(size_t(i + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j)
        mx = std::max(mx, p[size_t(j)] = scale * dot(q, i * qw + h * d_head, k, j * kw));
      for (int64_t j = 0; j <= i; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      EXPECT_NEAR(glse[size_t(i * s.q_heads + h)], mx + std::log(sum), fwd_tol) << "lse " << i;
      double delta = 0;
      std::vector<double> oi(size_t(d_head), 0.0), dqi(size_t(d_head), 0.0), dp(size_t(i + 1));
      for (int64_t j = 0; j <= i; ++j) {
        p[size_t(j)] /= sum;
        dp[size_t(j)] = dot(d_o, i * qw + h * d_head, v, j * kw);
        delta += p[size_t(j)] * dp[size_t(j)];
        for (int64_t x = 0; x < d_head; ++x) oi[size_t(x)] += p[size_t(j)] * v[size_t(j * kw + x)];
      }
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t x = 0; x < d_head; ++x) {
          dqi[size_t(x)] += scale * p[size_t(j)] * (dp[size_t(j)] - delta) * k[size_t(j * kw + x)];
        }
      }
      for (int64_t x = 0; x < d_head; ++x) {
        EXPECT_NEAR(go[size_t(i * qw + h * d_head + x)], oi[size_t(x)], fwd_tol) << "o " << i;
        // dq sums T terms of scale * p * (dP - Delta) * k with |dP - Delta| <= 2 sqrt(D)-ish
        // magnitudes: a few times the forward's bound.
        EXPECT_NEAR(gdq[size_t(i * qw + h * d_head + x)], dqi[size_t(x)], 8 * fwd_tol)
            << "dq " << i;
      }
    }
  }
  // Key rows j: dv_j = sum_{i >= j, h} P_ij dO_i and dk_j = scale sum P_ij (dP_ij - Delta_i) q_i,
  // with P_ij = exp(scale q_i.k_j - lse_i) from the kernel's lse (checked above) and Delta_i =
  // dO_i . o_i from its o. The kernel accumulates up to T*Hq terms in fp32 per element, each term
  // carrying P's relative error (2 * fwd_tol): the bound is relative to the sum of |terms|.
  for (int64_t j : {0, 5, 64, 4000, 4095}) {
    std::vector<double> dvj(size_t(d_head), 0.0), dkj(size_t(d_head), 0.0),
        mag(size_t(d_head), 0.0);
    for (int64_t h = 0; h < s.q_heads; ++h) {
      for (int64_t i = j; i < t_len; ++i) {
        const int64_t qi = i * qw + h * d_head;
        const double pij =
            std::exp(scale * dot(q, qi, k, j * kw) - glse[size_t(i * s.q_heads + h)]);
        const double ds = pij * (dot(d_o, qi, v, j * kw) - dot(d_o, qi, go, qi));
        for (int64_t x = 0; x < d_head; ++x) {
          dvj[size_t(x)] += pij * d_o[size_t(qi + x)];
          dkj[size_t(x)] += scale * ds * q[size_t(qi + x)];
          mag[size_t(x)] +=
              pij * (std::fabs(d_o[size_t(qi + x)]) + std::fabs(scale * ds * q[size_t(qi + x)]));
        }
      }
    }
    const double rel = (2 * fwd_tol / eps + double(t_len * s.q_heads) + 64) * eps;
    for (int64_t x = 0; x < d_head; ++x) {
      EXPECT_NEAR(gdv[size_t(j * kw + x)], dvj[size_t(x)], rel * mag[size_t(x)]) << "dv " << j;
      EXPECT_NEAR(gdk[size_t(j * kw + x)], dkj[size_t(x)], rel * mag[size_t(x)]) << "dk " << j;
    }
  }
}

// Bad arguments fail at enqueue time with InvalidArgument naming the tensor.
TEST(AttentionDispatchTest, ValidationNamesTheProblem) {
  auto dev = MakeDevice(size_t(1) << 20, 1);
  ASSERT_NE(dev, nullptr);
  Device& d = *dev;
  const AttentionShape s{1, 4, 2, 1, 8};
  std::vector<DeviceTensor> keep;
  auto alloc = [&](DType dt, Shape sh) { return keep.emplace_back(d, dt, sh, "t").tensor(); };
  const Tensor q = alloc(DType::kF32, {4, 16}), k = alloc(DType::kF32, {4, 8});
  const Tensor bad_v = alloc(DType::kF32, {4, 16}), o = alloc(DType::kF32, {4, 16});
  const Tensor lse = alloc(DType::kF32, {4, 2});
  const Tensor scratch = alloc(DType::kF32, {int64_t(AttentionScratchBytes(d, s) / 4)});
  Status st = AttentionForward(d, {s, q, k, bad_v, {}, o, lse, scratch, 0.35f, 0});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'v'"), std::string::npos) << st.ToString();
  st = AttentionForward(d, {s, q, k, k, {}, o, lse, scratch.Rows(0, 1), 0.35f, 0});
  EXPECT_NE(st.message().find("scratch"), std::string::npos) << st.ToString();
  st = AttentionForward(d, {{1, 4, 3, 2, 8}, q, k, k, {}, o, lse, scratch, 0.35f, 0});
  EXPECT_NE(st.message().find("multiple of kv_heads"), std::string::npos) << st.ToString();
  const Tensor f32_positions = alloc(DType::kF32, {4});
  st = RopeForward(d, {q, q, f32_positions, {}, 2, 8, 0, 1e4f});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'positions'"), std::string::npos) << st.ToString();
  EXPECT_TRUE(d.Synchronize().ok());  // nothing bad was enqueued
}

}  // namespace
}  // namespace ferry
