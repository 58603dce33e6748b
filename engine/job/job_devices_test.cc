// --devices (engine/job/job_devices.h): its forms, and the choice of devices against censuses of
// machines with no GPU, one and two, so every rule is tested on a machine without one.
#include "engine/job/job_devices.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry {
namespace {

GpuCensus NoGpu() { return {.gpus = {}, .none_reason = "no CUDA-capable device is detected"}; }

GpuCensus Gpus(int n) {
  GpuCensus c;
  for (int i = 0; i < n; ++i) {
    c.gpus.push_back({.ordinal = i,
                      .name = "NVIDIA GeForce RTX 4090",
                      .total_bytes = uint64_t(24) << 30,
                      .free_bytes = (uint64_t(20) << 30) + uint64_t(i) * (uint64_t(1) << 30),
                      .compute_capability = 89});
  }
  return c;
}

JobSpec Parsed(const std::string& text) {
  JobSpec job;
  const Status s = ParseDevicesOption(text, job);
  EXPECT_TRUE(s.ok()) << text << ": " << s.ToString();
  return job;
}

void ExpectRefused(const std::string& text, const std::string& words) {
  JobSpec job;
  const Status s = ParseDevicesOption(text, job);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_NE(s.message().find(words), std::string::npos) << text << ": " << s.message();
  EXPECT_NE(s.message().find("--devices"), std::string::npos) << text << ": " << s.message();
}

TEST(DevicesOption, ParsesEachFormAndWritesItBack) {
  struct Case {
    std::string text, kind;
    int64_t devices;
    std::vector<int64_t> gpus;
    std::string back;
  };
  for (const Case& c : std::vector<Case>{{"1", "auto", 1, {}, "1"},
                                         {"3", "auto", 3, {}, "3"},
                                         {"cpu", "cpu", 1, {}, "cpu"},
                                         {"cpu,cpu", "cpu", 2, {}, "cpu,cpu"},
                                         {"cuda", "cuda", 1, {0}, "cuda:0"},
                                         {"cuda:1,cuda:0", "cuda", 2, {1, 0}, "cuda:1,cuda:0"},
                                         {"cuda:0,cuda:0", "cuda", 2, {0, 0}, "cuda:0,cuda:0"}}) {
    const JobSpec job = Parsed(c.text);
    EXPECT_EQ(job.device_kind, c.kind) << c.text;
    EXPECT_EQ(job.devices, c.devices) << c.text;
    EXPECT_EQ(job.gpus, c.gpus) << c.text;
    EXPECT_EQ(DevicesOptionText(job), c.back) << c.text;
    EXPECT_EQ(Parsed(c.back), job) << c.back;
  }
}

TEST(DevicesOption, RefusesMalformedValuesNamingTheItem) {
  ExpectRefused("0", "1 to 64");
  ExpectRefused("65", "1 to 64");
  ExpectRefused("", "is not a device");
  ExpectRefused("gpu", "'gpu' is not a device");
  ExpectRefused("cpu,,cpu", "'' is not a device");
  ExpectRefused("cuda:", "'cuda:' names no GPU");
  ExpectRefused("cuda:-1", "'cuda:-1' names no GPU");
  ExpectRefused("cuda:1x", "'cuda:1x' names no GPU");
  ExpectRefused("cpu,cuda:0", "mixes CPU and CUDA");
  ExpectRefused("cuda:0,cpu", "mixes CPU and CUDA");
  // A refused value leaves the job as it was.
  JobSpec job = Parsed("cuda:0,cuda:1");
  const JobSpec before = job;
  EXPECT_FALSE(ParseDevicesOption("cpu,cuda:0", job).ok());
  EXPECT_EQ(job, before);
}

TEST(JobDevices, ValidationKeepsTheThreeFieldsConsistent) {
  JobSpec job;
  EXPECT_TRUE(ValidateJobDevices(job).ok());
  job.device_kind = "cuda";  // no GPU named
  EXPECT_FALSE(ValidateJobDevices(job).ok());
  job.gpus = {0};
  EXPECT_TRUE(ValidateJobDevices(job).ok());
  job.device_kind = "cpu";  // GPUs named for CPU devices
  EXPECT_FALSE(ValidateJobDevices(job).ok());
  job.gpus.clear();
  job.device_kind = "tpu";
  EXPECT_FALSE(ValidateJobDevices(job).ok());
  job.device_kind = "cpu";
  job.dtype = "fp8";
  const Status s = ValidateJobDevices(job);
  EXPECT_NE(s.message().find("--dtype 'fp8'"), std::string::npos) << s.ToString();
}

// `ferry plan` spells f16 and f32 "fp16" and "fp32": train and eval take those names too, and the
// job keeps the canonical one.
TEST(JobDevices, PlanSpellingsOfDtypesAreTheCanonicalOnes) {
  for (const auto& [given, kept] : {std::pair{"fp16", "f16"}, {"fp32", "f32"}, {"bf16", "bf16"}}) {
    JobSpec job = Parsed("cpu");
    job.dtype = given;
    ASSERT_TRUE(ValidateJobDevices(job).ok()) << given;
    ASSERT_TRUE(ResolveJobDevices(job, NoGpu()).ok()) << given;
    EXPECT_EQ(job.dtype, kept);
    EXPECT_EQ(CanonicalDtypeName(given), kept);
  }
}

TEST(JobDevices, AutoIsCpuDevicesWithoutAGpuAndSaysWhy) {
  JobSpec job = Parsed("2");
  Result<std::string> line = ResolveJobDevices(job, NoGpu());
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(*line, "2 CPU devices (no GPU: no CUDA-capable device is detected)");
  EXPECT_EQ(job.device_kind, "cpu");
  EXPECT_EQ(job.dtype, "f32");
  EXPECT_EQ(JobDeviceNames(job), (std::vector<std::string>{"cpu0", "cpu1"}));
  // Settled once, settled for good: a second resolution changes nothing.
  const JobSpec settled = job;
  ASSERT_TRUE(ResolveJobDevices(job, Gpus(2)).ok());
  EXPECT_EQ(job, settled);
}

TEST(JobDevices, AutoTakesTheFirstGpusInBf16) {
  JobSpec job = Parsed("2");
  Result<std::string> line = ResolveJobDevices(job, Gpus(3));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(job.device_kind, "cuda");
  EXPECT_EQ(job.gpus, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(job.dtype, "bf16");
  EXPECT_EQ(JobDeviceNames(job), (std::vector<std::string>{"cuda0", "cuda1"}));
  EXPECT_EQ(*line,
            "2 CUDA devices on cuda:0 (NVIDIA GeForce RTX 4090, 20.0 GiB free, sm_89), cuda:1 "
            "(NVIDIA GeForce RTX 4090, 21.0 GiB free, sm_89)");
  // An explicit dtype is kept.
  JobSpec f16 = Parsed("1");
  f16.dtype = "f16";
  ASSERT_TRUE(ResolveJobDevices(f16, Gpus(1)).ok());
  EXPECT_EQ(f16.dtype, "f16");
}

TEST(JobDevices, CpuDevicesStayCpuDevicesBesideGpus) {
  JobSpec job = Parsed("cpu,cpu,cpu");
  Result<std::string> line = ResolveJobDevices(job, Gpus(2));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(*line, "3 CPU devices (--devices cpu,cpu,cpu)");
  EXPECT_EQ(job.dtype, "f32");
}

TEST(JobDevices, RefusalsSayWhatToGiveInstead) {
  auto refused = [](const std::string& text, const GpuCensus& census, const std::string& words,
                    const std::string& dtype = "auto") {
    JobSpec job = Parsed(text);
    job.dtype = dtype;
    Result<std::string> r = ResolveJobDevices(job, census);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(words), std::string::npos)
        << text << ": " << r.status().message();
  };
  refused("3", Gpus(2), "this machine has 2 GPUs; list the GPUs to share them");
  refused("2", Gpus(1), "--devices cuda:0,cuda:0");
  refused("cuda:2", Gpus(2), "there is no GPU 2 (this machine has cuda:0 to cuda:1)");
  refused("cuda:0", NoGpu(), "no GPU (no CUDA-capable device is detected)");
  refused("cuda:0,cuda:0", NoGpu(), "run on CPU devices with --devices 2");
  refused("cuda:0", Gpus(1), "--dtype f32 runs on CPU devices only", "f32");
  refused("1", NoGpu(), "--dtype fp16acc (GEMMs accumulating in fp16) runs on GPUs only",
          "fp16acc");
  refused("cpu", Gpus(1), "give --dtype f16 for the same storage", "fp16acc");
  // On a GPU it is f16 storage.
  JobSpec job = Parsed("cuda:0");
  job.dtype = "fp16acc";
  ASSERT_TRUE(ResolveJobDevices(job, Gpus(1)).ok());
  EXPECT_EQ(job.dtype, "fp16acc");
  EXPECT_TRUE(F16Storage(job));
}

TEST(JobDevices, DevicesSharingAGpuSplitItsFreeMemory) {
  JobSpec job = Parsed("cuda:1,cuda:0,cuda:1");
  Result<std::string> line = ResolveJobDevices(job, Gpus(2));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_NE(line->find("cuda:1 (NVIDIA GeForce RTX 4090, 21.0 GiB free, sm_89, shared by 2 "
                       "devices)"),
            std::string::npos)
      << *line;
  EXPECT_EQ(JobDeviceNames(job), (std::vector<std::string>{"cuda1.0", "cuda0", "cuda1.1"}));
  // GPU 0 gives its one device 20 GiB x 0.9; GPU 1 gives each of two 21 GiB x 0.9 / 2: the least.
  const uint64_t gib = uint64_t(1) << 30;
  EXPECT_EQ(GpuDeviceBytes(job, Gpus(2)), uint64_t(double(21 * gib) * 0.9 / 2));
  EXPECT_EQ(GpuDeviceBytes(Parsed("cuda:0"), Gpus(2)), uint64_t(double(20 * gib) * 0.9));
  EXPECT_EQ(GpuDeviceBytes(Parsed("cuda:5"), Gpus(2)), 0u);
}

}  // namespace
}  // namespace ferry
