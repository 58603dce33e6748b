#include "engine/model/converted_base.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "engine/model/master_weights.h"
#include "engine/model/model_folder.h"
#include "engine/plan/memory_model.h"
#include "engine/plan/planner.h"
#include "engine/testing/tiny_models.h"
#include "offload/offload_test_util.h"

namespace ferry {
namespace {

using testing::kTinyModels;
using testing::TempDir;
using testing::TinyModel;

// The owners of the frozen weights the blocks and the head read (a tied head's included), found
// here independently of MoveBaseToNvme.
std::set<std::string> StreamedOwners(const std::vector<LayerSpec>& layers) {
  std::set<std::string> out;
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kEmbedding) continue;
    for (const ParamSpec& p : l.params) {
      if (!p.trainable) out.insert(p.storage_name());
    }
  }
  return out;
}

size_t Entries(const std::string& dir) {
  return size_t(std::distance(std::filesystem::directory_iterator(dir),
                              std::filesystem::directory_iterator()));
}

ModelConfig Config(const TinyModel& tm) {
  Result<ModelConfig> c = ParseHfConfig(tm.config_json);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

// Every frozen weight a stage reads moves to the file, in bf16 (a tied table held in fp32: f32),
// each value what ConvertFromFloat makes of it; the rest (adapters, norms that train, an untied
// embedding) stays as it was, and the folder lists nothing. Its sources: fp32 tensors (a seeded
// base), an f32 model folder served from its files (GPT-2's transposed Conv1D weights and tied head
// included), and a bf16 one, whose weights stay served from their file unless transposed.
TEST(ConvertedBaseTest, MovesTheFrozenBaseTheStagesReadInTheUploadDtype) {
  for (const TinyModel& tm : kTinyModels) {
    for (const DType folder_dtype : {DType::kI32, DType::kF32, DType::kBF16}) {
      const bool from_files = folder_dtype != DType::kI32;  // kI32: no folder, a seeded base
      const std::string what =
          std::string(tm.name) +
          (from_files ? ", from a " + std::string(DTypeName(folder_dtype)) + " folder" : "");
      const ModelConfig c = Config(tm);
      const std::vector<LayerSpec> layers = BuildLayerSpecs(c, testing::TinyLora());
      const HostTensors original = testing::TinyWeights(layers, 7);
      HostTensors w = original;
      TempDir folder, nvme;
      if (from_files) {
        ModelFolderWriteOptions as;
        as.dtype = folder_dtype;
        ASSERT_TRUE(WriteModelFolder(folder.path(), c, layers, original, as).ok()) << what;
        Result<FolderWeights> f = FolderWeights::Open(folder.path());
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        w = {};
        ASSERT_TRUE(LoadBaseWeights(*f, c, layers, w).ok()) << what;
        for (const auto& [name, t] : original.tensors) {
          if (!w.tensors.contains(name) && !w.files.contains(name)) w.tensors[name] = t;
        }
      }
      std::set<std::string> owners = StreamedOwners(layers);
      // Served from the folder: in bf16, or tied (the embedding gathers from it too), unless
      // transposed.
      std::set<std::string> tied;
      for (const LayerSpec& l : layers) {
        for (const ParamSpec& p : l.params) {
          if (!p.tied_to.empty()) tied.insert(p.tied_to);
        }
      }
      std::map<std::string, const std::byte*> stays;
      for (const auto& [name, f] : w.files) {
        if (owners.contains(name) && !f.transposed &&
            (f.dtype == DType::kBF16 || tied.contains(name))) {
          stays[name] = f.bytes.data();
          owners.erase(name);
        }
      }
      EXPECT_EQ(stays.size() > tied.size(), folder_dtype == DType::kBF16) << what;
      Result<ConvertedBase> r = MoveBaseToNvme(
          layers, DType::kBF16, from_files ? folder_dtype : DType::kF32, nvme.path(), w);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(Entries(nvme.path()), 0u) << what;
      EXPECT_EQ(r->weights, int64_t(owners.size())) << what;
      for (const auto& [name, at] : stays) {
        EXPECT_EQ(w.files.at(name).bytes.data(), at) << name << ", " << what;
      }
      uint64_t values = 0;
      for (const auto& [name, t] : original.tensors) {
        if (stays.contains(name)) continue;
        if (!owners.contains(name)) {
          const bool kept = w.tensors.contains(name) ? w.tensors.at(name) == t
                                                     : w.files.contains(name) && from_files;
          EXPECT_TRUE(kept) << name << ", " << what;
          continue;
        }
        EXPECT_FALSE(w.tensors.contains(name)) << name << ", " << what;
        ASSERT_TRUE(w.files.contains(name)) << name << ", " << what;
        const FileTensor& f = w.files.at(name);
        // A tied table (held in fp32 here) stays fp32: the embedding gathers from it too.
        const DType dtype = tied.contains(name) ? DType::kF32 : DType::kBF16;
        EXPECT_EQ(f.dtype, dtype) << name << ", " << what;
        EXPECT_FALSE(f.transposed);
        ASSERT_EQ(f.numel(), int64_t(t.size())) << name;
        ASSERT_EQ(f.bytes.size(), t.size() * DTypeSize(dtype)) << name;
        std::vector<std::byte> want(f.bytes.size());
        ConvertFromFloat(t.data(), dtype, want.data(), t.size());
        EXPECT_EQ(std::memcmp(want.data(), f.bytes.data(), want.size()), 0) << name << ", " << what;
        values += f.bytes.size();
      }
      if (owners.empty()) continue;  // nothing written
      EXPECT_GE(r->bytes, values) << what;
      EXPECT_LE(r->bytes, values + (kConvertedBaseAlign - 1) * owners.size()) << what;
      // Each weight starts on a block of the drive (a step reads only its blocks).
      for (const auto& [name, f] : w.files) {
        if (f.fd >= 0) {
          EXPECT_EQ(f.offset % 4096, 0) << name << ", " << what;
        }
      }
    }
  }
}

// QLoRA: each NF4 weight moves as a device holds it (its tensors, in the device's order and
// sizes, for an image to copy), and what its source makes is the weight it replaced, field for
// field (double-quantized or not).
TEST(ConvertedBaseTest, AnNf4BaseMovesAsItsCodesAndQuantState) {
  const ModelConfig c = Config(kTinyModels[0]);
  for (const bool nested : {true, false}) {
    LoraConfig lora = testing::TinyLora();
    lora.quantize = BaseQuant::kNf4;
    lora.double_quant = nested;
    const std::vector<LayerSpec> layers = BuildLayerSpecs(c, lora);
    HostTensors w = testing::TinyWeights(layers, 9);
    ASSERT_TRUE(QuantizeFrozenBase(layers, w).ok());
    const HostTensors original = w;
    ASSERT_FALSE(original.nf4.empty());
    TempDir nvme;
    Result<ConvertedBase> r = MoveBaseToNvme(layers, DType::kBF16, DType::kF32, nvme.path(), w);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(w.nf4.empty());
    // As a device holds each (ParamSpec::bytes(), what the memory model counts), padded; the
    // dense frozen weights (norms, head) as bf16.
    uint64_t want = 0;
    for (const LayerSpec& l : layers) {
      if (l.kind == LayerKind::kEmbedding) continue;
      for (const ParamSpec& p : l.params) {
        if (p.trainable) continue;
        const uint64_t b = p.nf4 ? p.bytes() : uint64_t(p.numel()) * 2;
        want += (b + kConvertedBaseAlign - 1) / kConvertedBaseAlign * kConvertedBaseAlign;
      }
    }
    EXPECT_EQ(r->bytes, want);
    for (const auto& [name, q] : original.nf4) {
      ASSERT_TRUE(w.nf4_served.contains(name)) << name;
      EXPECT_EQ(w.nf4_served.at(name).shape, q.shape);
      // Stored as a device holds it: the packing copies these straight into an image.
      const Nf4Source& src = w.nf4_served.at(name);
      EXPECT_EQ(src.parts_file.offset % 4096, 0) << name;  // on a block of its own
      const std::vector<size_t> sizes = Nf4DeviceTensorBytes(q.numel(), nested);
      ASSERT_EQ(src.device_parts.size(), sizes.size()) << name;
      EXPECT_EQ(src.nested, nested);
      for (size_t k = 0; k < sizes.size(); ++k) {
        EXPECT_EQ(src.device_parts[k].size(), sizes[k]) << name << " part " << k;
      }
      auto same = [&](size_t k, const auto& v) {
        return v.size() * sizeof(v[0]) == src.device_parts[k].size() &&
               std::memcmp(src.device_parts[k].data(), v.data(), src.device_parts[k].size()) == 0;
      };
      EXPECT_TRUE(same(Nf4Slot::kPacked, q.packed)) << name;
      EXPECT_TRUE(same(Nf4Slot::kCode, q.code)) << name;
      if (nested) {
        EXPECT_TRUE(same(Nf4Slot::kAbsmax, q.absmax_q)) << name;
        EXPECT_TRUE(same(Nf4Slot::kNestedAbsmax, q.nested_absmax)) << name;
        EXPECT_TRUE(same(Nf4Slot::kNestedCode, q.nested_code)) << name;
        EXPECT_TRUE(same(Nf4Slot::kNestedOffset, std::vector<float>{q.nested_offset})) << name;
      } else {
        EXPECT_TRUE(same(Nf4Slot::kAbsmax, q.absmax)) << name;
      }
      Nf4Host made;
      Result<const Nf4Host*> got = w.FindNf4(name, made);
      ASSERT_TRUE(got.ok() && *got != nullptr) << name;
      const Nf4Host& g = **got;
      EXPECT_EQ(g.shape, q.shape) << name;
      EXPECT_EQ(g.block, q.block) << name;
      EXPECT_EQ(g.code, q.code) << name;
      EXPECT_EQ(g.packed, q.packed) << name;
      EXPECT_EQ(g.absmax, q.absmax) << name;
      EXPECT_EQ(g.absmax_q, q.absmax_q) << name;
      EXPECT_EQ(g.nested_absmax, q.nested_absmax) << name;
      EXPECT_EQ(g.nested_code, q.nested_code) << name;
      EXPECT_EQ(g.nested_block, q.nested_block) << name;
      EXPECT_EQ(g.nested_offset, q.nested_offset) << name;
      EXPECT_EQ(g.nested(), nested) << name;
    }
    // The parts keep their mapping by themselves, with the weights (and `make`, whose closure
    // holds it too) gone.
    const auto& [name, q] = *original.nf4.begin();
    const Nf4Source alone{.shape = {},
                          .make = {},
                          .device_parts = w.nf4_served.at(name).device_parts,
                          .parts_owner = w.nf4_served.at(name).parts_owner};
    w = HostTensors{};
    ASSERT_FALSE(alone.device_parts.empty());
    EXPECT_EQ(
        std::memcmp(alone.device_parts[Nf4Slot::kPacked].data(), q.packed.data(), q.packed.size()),
        0);
  }
}

// A folder that is not there fails naming it, and a base that lacks a weight names the weight;
// the weights are left as they were either way.
TEST(ConvertedBaseTest, FailuresNameTheFolderOrTheWeightAndChangeNothing) {
  const ModelConfig c = Config(kTinyModels[0]);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, testing::TinyLora());
  HostTensors w = testing::TinyWeights(layers, 3);
  const HostTensors original = w;
  TempDir nvme;
  Result<ConvertedBase> r =
      MoveBaseToNvme(layers, DType::kBF16, DType::kF32, nvme.path() + "/absent", w);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().message().find(nvme.path() + "/absent"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(w.tensors, original.tensors);
  EXPECT_TRUE(w.files.empty());
  const std::string lost = *StreamedOwners(layers).begin();
  w.tensors.erase(lost);
  r = MoveBaseToNvme(layers, DType::kBF16, DType::kF32, nvme.path(), w);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("'" + lost + "'"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(w.tensors.size(), original.tensors.size() - 1);
  EXPECT_TRUE(w.files.empty());
  EXPECT_EQ(Entries(nvme.path()), 0u);
  // With nothing to convert (every frozen weight served by bf16 files), the folder is not
  // touched: a missing one is no error.
  TempDir folder;
  ModelFolderWriteOptions as;
  as.dtype = DType::kBF16;
  ASSERT_TRUE(WriteModelFolder(folder.path(), c, layers, original, as).ok());
  Result<FolderWeights> f = FolderWeights::Open(folder.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  HostTensors served;
  ASSERT_TRUE(LoadBaseWeights(*f, c, layers, served).ok());
  r = MoveBaseToNvme(layers, DType::kBF16, DType::kBF16, nvme.path() + "/absent", served);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->weights, 0);
  EXPECT_EQ(r->bytes, 0u);
}

// The blocks a streamed weight takes where it is read: in the copy from a block of its own; in
// the model's file from its extent there (its bytes as stored: an f32 tensor in a bf16 folder
// takes its own), else the most its bytes can take.
TEST(ConvertedBaseTest, DriveBytesAreTheBlocksWhereTheWeightLies) {
  ParamSpec p;
  p.name = "w";
  p.shape = {1000};
  p.trainable = false;
  StreamedBaseSource s{.from_files = true, .files = DType::kBF16, .upload = DType::kBF16};
  EXPECT_TRUE(s.FromFiles(p));
  EXPECT_EQ(s.StoredBytes(p), 2000u);
  EXPECT_EQ(s.DriveBytes(p), 2 * 4096u);  // not known: it may straddle two blocks
  auto layout = std::make_shared<TensorFileLayout>();
  (*layout)["w"] = {.offset = 100, .bytes = 2000};
  s.file_layout = layout;
  EXPECT_EQ(s.DriveBytes(p), 4096u);
  (*layout)["w"] = {.offset = 3000, .bytes = 4000};  // stored as f32: bytes 3000 .. 6999
  EXPECT_EQ(s.DriveBytes(p), 2 * 4096u);
  s.from_files = false;  // the copy, in bf16 from a block
  EXPECT_FALSE(s.FromFiles(p));
  EXPECT_EQ(s.DriveBytes(p), 4096u);
}

// What the memory model reserves on NVMe for the copy (weights.frozen) is what MoveBaseToNvme
// writes, rounded to the drive's 4096-byte blocks, for every tiny architecture (tied heads,
// biases, GPT-2's transposed weights) from a seeded base, an f32 folder and a bf16 one into bf16
// uploads, and for an NF4 base (nested or not).
TEST(ConvertedBaseTest, TheMemoryModelReservesWhatIsWritten) {
  struct Source {
    std::optional<DType> folder;
    bool nf4 = false, nested = true;
  };
  for (const TinyModel& tm : kTinyModels) {
    for (const Source& src :
         {Source{}, Source{DType::kF32}, Source{DType::kBF16}, Source{{}, true, true},
          Source{{}, true, false}, Source{DType::kBF16, true, true}}) {
      if (src.nf4 && std::string(tm.name) == "gpt2") continue;  // no NF4 over Conv1D
      const std::string what = std::string(tm.name) +
                               (src.folder ? " " + std::string(DTypeName(*src.folder)) : "") +
                               (src.nf4 ? (src.nested ? " nf4 nested" : " nf4") : "");
      ModelConfig c = Config(tm);
      LoraConfig lora = testing::TinyLora();
      if (src.nf4) {
        lora.quantize = BaseQuant::kNf4;
        lora.double_quant = src.nested;
      }
      const std::vector<LayerSpec> layers = BuildLayerSpecs(c, lora);
      const std::vector<LayerSpec> plain = BuildLayerSpecs(c, testing::TinyLora());
      HostTensors w = testing::TinyWeights(plain, 11);
      TempDir folder, nvme;
      if (src.folder) {
        ModelFolderWriteOptions as;
        as.dtype = *src.folder;
        ASSERT_TRUE(WriteModelFolder(folder.path(), c, plain, w, as).ok()) << what;
        Result<FolderWeights> f = FolderWeights::Open(folder.path());
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        HostTensors served;
        ASSERT_TRUE(LoadBaseWeights(*f, c, layers, served).ok()) << what;
        for (const auto& [name, t] : w.tensors) {
          if (!served.tensors.contains(name) && !served.files.contains(name) &&
              !served.nf4_served.contains(name)) {
            served.tensors[name] = t;
          }
        }
        w = std::move(served);
        c.weights_dtype = *src.folder;  // as config.json's torch_dtype says
      } else {
        ASSERT_TRUE(QuantizeFrozenBase(layers, w).ok()) << what;
      }
      Result<ConvertedBase> r =
          MoveBaseToNvme(layers, DType::kBF16, c.weights_dtype, nvme.path(), w);
      ASSERT_TRUE(r.ok()) << r.status().ToString() << " " << what;
      plan::MemoryPlanInput in;
      in.model = c;
      in.lora = lora;
      in.micro_batch = {1, 4};
      in.micro_batches = 1;
      in.gpus = 1;
      in.compute_dtype = DType::kBF16;
      in.stages = {{1, int(c.num_layers) + 1}};
      in.recompute.assign(size_t(c.num_layers) + 2, false);
      in.frozen_weights_on_nvme = true;
      in.frozen_base_from_files = src.folder.has_value();
      uint64_t planned = 0;
      for (const plan::Allocation& a : plan::ComputeMemory(in).nvme.allocations) {
        if (a.name == "weights.frozen") planned += a.bytes;
      }
      EXPECT_EQ(planned, (r->bytes + 4095) / 4096 * 4096) << what;
      // And the planner's reads of the whole base are the blocks the packing reads: where the
      // folder's files hold a tensor (their layout, as `ferry train` plans with it) and where the
      // copy put it.
      std::shared_ptr<const TensorFileLayout> offsets;
      if (src.folder) {
        Result<std::shared_ptr<const TensorFileLayout>> o = FolderTensorLayout(folder.path(), c);
        ASSERT_TRUE(o.ok() && *o != nullptr) << o.status().ToString();
        offsets = *o;
      }
      double read = 0;
      const StreamedBaseSource source{.from_files = src.folder.has_value(),
                                      .files = c.weights_dtype,
                                      .upload = DType::kBF16,
                                      .file_layout = offsets};
      for (const LayerSpec& l : layers) read += plan::LayerBaseBytes(l, source);
      uint64_t blocks = 0;
      auto add = [&blocks](const FileTensor& t) {
        ASSERT_GE(t.offset, 0) << t.path;
        const uint64_t begin = uint64_t(t.offset) / 4096 * 4096;
        blocks += (uint64_t(t.offset) + t.bytes.size() + 4095) / 4096 * 4096 - begin;
      };
      for (const LayerSpec& l : layers) {
        if (l.kind == LayerKind::kEmbedding) continue;
        for (const ParamSpec& p : l.params) {
          if (p.trainable) continue;
          if (auto f = w.files.find(p.storage_name()); f != w.files.end()) {
            ASSERT_NO_FATAL_FAILURE(add(f->second)) << p.name;
          } else if (p.nf4) {
            ASSERT_NO_FATAL_FAILURE(add(w.nf4_served.at(p.name).parts_file)) << p.name;
          }
        }
      }
      EXPECT_EQ(read, double(blocks)) << what;
    }
  }
}

}  // namespace
}  // namespace ferry
