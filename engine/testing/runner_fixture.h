// Test helper: the reference runner on a CpuDevice (f32 compute) fed with a PyTorch
// golden (engine/testing/golden_model.h): its initial weights as HostTensors,
// zeroed gradient buffers for the trainable parameters, the micro-batch, and
// the golden gradients in master layout.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/master_weights.h"
#include "engine/model/model_runner.h"
#include "engine/model/weights_io.h"
#include "engine/testing/golden_model.h"
#include "engine/testing/reference_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry::testing {

inline LoraConfig GoldenLora(const GoldenModel& g) {
  LoraConfig lora;
  if (g.info.contains("lora")) {
    lora.rank = g.info["lora"]["r"];
    lora.alpha = g.info["lora"]["alpha"];
    lora.targets = kLoraAll;
    if (g.info["lora"].value("quantize", "none") == "nf4") {
      lora.quantize = BaseQuant::kNf4;
      lora.double_quant = g.info["lora"].value("double_quant", false);
    }
  }
  return lora;
}

// The rounding of the bitsandbytes that made a QLoRA golden: its CPU quantize_4bit takes the
// nearest code.
inline constexpr Nf4Rounding kNf4GoldenRounding = Nf4Rounding::kNearest;

struct RunnerFixture {
  GoldenModel golden;
  LoraConfig lora;
  std::vector<LayerSpec> layers;
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<ModelRunner> runner;
  HostTensors weights;
  std::vector<int32_t> tokens, targets;
  double normalizer = 1;

  // Loads the golden, creates the device and runner, uploads the initial
  // weights.
  static Result<std::unique_ptr<RunnerFixture>> Create(std::string_view name,
                                                       ReferenceRunnerOptions options = {}) {
    auto f = std::make_unique<RunnerFixture>();
    FERRY_ASSIGN_OR_RETURN(f->golden, GoldenModel::Load(name));
    f->lora = GoldenLora(f->golden);
    f->layers = BuildLayerSpecs(f->golden.config, f->lora);
    for (const LayerSpec& l : f->layers) {
      for (const ParamSpec& p : l.params) {
        if (!p.tied_to.empty()) continue;
        std::vector<float>& w = f->weights.tensors[p.name];
        w.resize(size_t(p.numel()));
        FERRY_RETURN_IF_ERROR(LoadParameter(p.lora ? f->golden.adapter : f->golden.weights, p, w));
      }
    }
    FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(f->layers, f->weights, kNf4GoldenRounding));
    FERRY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, f->golden.io.ReadInts("input_ids"));
    FERRY_ASSIGN_OR_RETURN(std::vector<int64_t> tg, f->golden.io.ReadInts("targets"));
    f->tokens.assign(ids.begin(), ids.end());
    f->targets.assign(tg.begin(), tg.end());
    f->normalizer = f->golden.info["valid_targets"].get<double>();
    if (options.shape.tokens() == 1) {
      options.shape = {f->golden.info["batch"].get<int64_t>(),
                       f->golden.info["seq_len"].get<int64_t>()};
    }
    CpuDeviceOptions dev;
    dev.memory_bytes = size_t(64) << 20;
    dev.compute_threads = 2;
    FERRY_ASSIGN_OR_RETURN(f->device, CpuDevice::Create(dev));
    FERRY_ASSIGN_OR_RETURN(f->runner,
                           CreateReferenceRunner(*f->device, f->golden.config, f->lora, options));
    FERRY_RETURN_IF_ERROR(f->runner->UploadWeights(f->weights));
    return f;
  }

  // Zero gradient buffers for every trainable storage-owning parameter.
  HostTensors ZeroGrads() const {
    HostTensors g;
    for (const LayerSpec& l : layers) {
      for (const ParamSpec& p : l.params) {
        if (p.trainable && p.tied_to.empty()) g.tensors[p.name].assign(size_t(p.numel()), 0.0f);
      }
    }
    return g;
  }

  // One step on the golden's micro-batch: its loss within `loss_rtol` of the golden's, and every
  // trainable parameter's gradient handed to `expect_close(got, want, name)` (which must check
  // each one); every golden gradient is checked.
  void ExpectStepMatchesGolden(
      double loss_rtol,
      const std::function<void(const std::vector<float>&, const std::vector<float>&,
                               const std::string&)>& expect_close) {
    HostTensors grads = ZeroGrads();
    Result<double> loss = runner->AccumulateGradients({tokens, targets, normalizer}, grads);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    const double want = golden.info["loss"].get<double>();
    EXPECT_NEAR(*loss, want, loss_rtol * want);
    int checked = 0;
    for (const LayerSpec& l : layers) {
      for (const ParamSpec& p : l.params) {
        if (!p.trainable || !p.tied_to.empty()) continue;
        Result<std::vector<float>> g = GoldenGrad(p);
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        expect_close(grads.tensors.at(p.name), *g, p.name);
        ++checked;
      }
    }
    EXPECT_EQ(checked, int(golden.grads.tensors().size()));
  }

  // The golden gradient of `p` in master layout.
  Result<std::vector<float>> GoldenGrad(const ParamSpec& p) const {
    std::vector<float> g(size_t(p.numel()));
    FERRY_RETURN_IF_ERROR(LoadParameter(golden.grads, p, g));
    return g;
  }
};

}  // namespace ferry::testing
