// TrainingDevicesBytes (what `ferry train` and `ferry eval` check against physical memory) is
// what CreateTrainingRunner then creates, for one device and for several, training and forward
// only.
#include "engine/train/run_training.h"

#include <gtest/gtest.h>

#include <utility>

#include "engine/job/job_spec.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

constexpr int kThreads = 4;

TEST(TrainingDevicesBytes, IsWhatCreateTrainingRunnerCreates) {
  for (const char* dtype : {"f32", "bf16"}) {
    for (const auto& [devices, forward_only] :
         {std::pair<int64_t, bool>{1, false}, {2, false}, {3, false}, {1, true}, {2, true}}) {
      SCOPED_TRACE(std::string("--dtype ") + dtype + " --devices " + std::to_string(devices) +
                   (forward_only ? ", forward only" : ""));
      JobSpec job;
      job.batch_size = 4;
      job.micro_batches = 2;
      job.seq_len = 32;
      job.devices = devices;
      job.dtype = dtype;
      Result<ModelConfig> model = ResolveModel(job);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      Result<TrainingRunner> t =
          CreateTrainingRunner(job, *model, kThreads, /*trace=*/false, forward_only);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(int64_t(t->devices.size()), devices);
      // Each device's capacity is the bytes asked, rounded down to its arena alignment.
      uint64_t created = 0;
      for (const auto& d : t->devices) created += d->capacity();
      const uint64_t bytes = TrainingDevicesBytes(job, *model, kThreads, forward_only);
      EXPECT_GE(bytes, created);
      EXPECT_LT(bytes - created, uint64_t(devices) * CpuDeviceOptions{}.alignment);
      // A forward-only plan leaves out the gradients and the backward's buffers.
      if (forward_only) {
        EXPECT_LT(bytes, TrainingDevicesBytes(job, *model, kThreads));
      }
    }
  }
}

}  // namespace
}  // namespace ferry
