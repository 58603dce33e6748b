// AdamW on fp32 master weights, as torch.optim.AdamW computes it (decoupled weight decay, bias
// correction; the single-tensor path, torch's default on the CPU).
//
// For each element, with every scalar computed in double and rounded to fp32 once, as torch does
// when it applies a Python float to a float tensor:
//   g  = g * grad_scale                       (clipping coefficient and/or 1 / loss scale)
//   p  = p * (1 - lr * weight_decay)          (skipped when weight_decay == 0, as in torch)
//   m  = fma(1 - beta1, g - m, m)             (exp_avg.lerp_(g, 1 - beta1); torch's vector lerp)
//   v  = v * beta2 + ((1 - beta2) * g) * g    (exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2))
//   d  = sqrt(v) / sqrt(1 - beta2^t) + eps    ((exp_avg_sq.sqrt() / bc2_sqrt).add_(eps))
//   p  = p + ((-lr / (1 - beta1^t)) * m) / d  (param.addcdiv_(exp_avg, d, value=-step_size))
// Every operation is a correctly rounded IEEE one in that order, so the fast kernels reproduce the
// fp32 reference bit for bit (kernels/ref/adamw.h holds the element formula).
//
// The trainer's CPU optimizer calls the host-memory kernel (kernels/cpu/adamw.h) directly; the
// dispatcher below runs the same kernel on a device's compute stream over device tensors.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct AdamWHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p -= lr * weight_decay * p
  int64_t step = 1;           // 1 for the first update (torch's state['step'] after += 1)
  double grad_scale = 1.0;    // multiplies the gradient before use (clip coefficient, 1/loss scale)
};

// InvalidArgument naming the field when a hyperparameter is out of range: lr, weight_decay and
// grad_scale must be finite and >= 0, betas in [0, 1), eps > 0, step >= 1.
Status ValidateAdamWHyperparameters(const AdamWHyperparameters& h);

struct AdamWArgs {
  Tensor p;       // (n) f32 master weights, updated in place
  Tensor g;       // (n) f32 | bf16 gradient, read only (any shape with n elements)
  Tensor m;       // (n) f32 first moment, updated in place
  Tensor v;       // (n) f32 second moment, updated in place
  Tensor p_bf16;  // (n) bf16, optional (null data: none): the updated p rounded to nearest even
  AdamWHyperparameters hyper;
};

// Shapes, dtypes and hyperparameters. Tensors are compared by element count.
Status ValidateAdamW(const AdamWArgs& a);

// AdamW needs no scratch; here for the planner's uniform interface.
inline size_t AdamWScratchBytes(const Device&, int64_t /*n*/) { return 0; }

// One update, enqueued on the device's compute stream. CPU: the vectorized kernel of
// kernels/cpu/adamw.h with the best instruction set of this CPU, over the device's pool.
Status AdamWStep(Device& d, const AdamWArgs& a);

}  // namespace ferry
