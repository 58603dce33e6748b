#include "engine/model/device_params.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "engine/model/tensor_carver.h"
#include "engine/model/weights_io.h"

namespace ferry {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Shape ShapeOf(const std::vector<int64_t>& dims) {
  Shape s;
  if (dims.size() == 1) s = Shape{dims[0]};
  if (dims.size() == 2) s = Shape{dims[0], dims[1]};
  return s;
}

// The device name of the fused tensor part 0 `s` opens: the fused module and s's own kind
// ("…mlp.gate_up_proj.weight", "….bias").
std::string FusedName(const ParamSpec& s) {
  return s.fused_module + s.name.substr(s.name.rfind('.'));
}

struct PlannedParam {
  const ParamSpec* spec = nullptr;
  // Part 0 of a fused projection: part 1 (ParamSpec::fused_part), its rows after this one's.
  const ParamSpec* up = nullptr;
};

Status CheckHost(const HostTensors& t, const std::string& name, int64_t numel, const char* what) {
  auto it = t.tensors.find(name);
  if (it == t.tensors.end()) {
    return Status::NotFound(std::string(what) + " has no tensor '" + name +
                            "'; give one for every storage-owning parameter");
  }
  if (int64_t(it->second.size()) != numel) {
    return Status::InvalidArgument(std::string(what) + " tensor '" + name + "' has " +
                                   std::to_string(it->second.size()) + " elements, expected " +
                                   std::to_string(numel));
  }
  return Status::Ok();
}

}  // namespace

std::string LoraGroupOf(const ParamSpec& adapter) {
  if (!adapter.fused_module.empty()) return adapter.fused_module;
  const std::string_view name = adapter.name;
  const size_t end = name.size() - std::string_view(".lora_A.weight").size();
  return std::string(name.substr(kPeftPrefix.size(), end - kPeftPrefix.size()));
}

Result<DeviceParams::Bytes> DeviceParams::Measure(const ModelConfig& c, const LoraConfig& lora,
                                                  const std::vector<LayerSpec>& layers,
                                                  DType dtype) {
  FERRY_ASSIGN_OR_RETURN(const DeviceParams p,
                         Lay(nullptr, c, lora, layers, nullptr, ParamGrads::kAllocate, dtype));
  size_t trainable = 0;
  for (const auto& [begin, end] : p.trainable_extents_) trainable += end - begin;
  return Bytes{p.weights_bytes_, p.grads_bytes_, trainable};
}

Result<DeviceParams> DeviceParams::Create(Device& d, const ModelConfig& c, const LoraConfig& lora,
                                          const std::vector<LayerSpec>& layers, CarveSource* source,
                                          ParamGrads grad_buffers, DType dtype,
                                          std::shared_ptr<HostMirrors> mirrors) {
  FERRY_ASSIGN_OR_RETURN(DeviceParams p, Lay(&d, c, lora, layers, source, grad_buffers, dtype));
  p.mirrors_ = mirrors != nullptr ? std::move(mirrors) : std::make_shared<HostMirrors>();
  // A caller's mirror span is borrowed when it holds what these layers need; otherwise a mirror
  // of their size is mapped (and counted in `mapped`).
  auto mirror = [&](HostSpan& span, HostAllocation& owned, size_t bytes,
                    const char* name) -> Status {
    if (span.data() != nullptr && span.size() >= bytes) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(owned, HostAllocation::Map(std::max<size_t>(bytes, 1), name));
    span = owned.Whole();
    ++p.mirrors_->mapped;
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(mirror(p.mirrors_->weights, p.mirrors_->owned_weights, p.weights_bytes_,
                               "params.weights mirror"));
  if (grad_buffers == ParamGrads::kNone)
    return p;  // grads_bytes_ == 0: the gradient calls do nothing
  FERRY_RETURN_IF_ERROR(
      mirror(p.mirrors_->grads, p.mirrors_->owned_grads, p.grads_bytes_, "params.grads mirror"));
  return p;
}

Result<DeviceParams> DeviceParams::Lay(Device* d, const ModelConfig& c, const LoraConfig& lora,
                                       const std::vector<LayerSpec>& layers, CarveSource* source,
                                       ParamGrads grad_buffers, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return Status::InvalidArgument("device weights are stored in f32, bf16 or f16, not " +
                                   std::string(DTypeName(dtype)));
  }
  DeviceParams p;
  p.dtype_ = dtype;
  for (const LayerSpec& l : layers) {
    if (l.kind != LayerKind::kEmbedding) p.layers_.push_back(l);
  }
  std::map<std::string, const ParamSpec*> by_name;
  std::vector<PlannedParam> plan;
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kEmbedding) continue;  // host-side gather
    for (const ParamSpec& s : l.params) by_name[s.name] = &s;
  }
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kEmbedding) continue;
    for (const ParamSpec& s : l.params) {
      if (s.lora) {
        if (!EndsWith(s.name, ".lora_A.weight")) continue;
        const std::string module = s.name.substr(
            kPeftPrefix.size(), s.name.size() - kPeftPrefix.size() - strlen(".lora_A.weight"));
        LoraPack& pack = p.lora_[LoraGroupOf(s)];
        // Output rows of the base weight (GPT-2's Conv1D stores it (in, out)); a fused
        // projection's parts stack theirs in part order.
        const ParamSpec* base = by_name.at(module + ".weight");
        const int64_t rows = base->transposed ? base->shape[1] : base->shape[0];
        std::string b_name = s.name;
        b_name.replace(b_name.size() - strlen("lora_A.weight"), 6, "lora_B");
        pack.adapters.push_back({s.name, b_name, s.fused_part * rows, rows, /*col=*/0});
        pack.out = s.fused_parts * rows;
        pack.in = s.shape[1];
        pack.rank = lora.rank;
        pack.scaling = float(lora.scaling());
        continue;
      }
      if (s.fused_part > 0) continue;  // laid out with part 0
      PlannedParam pp{&s, nullptr};
      if (s.fused_parts > 1) {
        // Part 1: the parameter of the same kind (weight or bias) in the same fused projection.
        const std::string_view kind = std::string_view(s.name).substr(s.name.rfind('.'));
        for (const ParamSpec& q : l.params) {
          if (q.fused_module == s.fused_module && q.fused_part == 1 && !q.lora &&
              std::string_view(q.name).ends_with(kind)) {
            pp.up = &q;
          }
        }
        if (pp.up == nullptr || s.fused_parts > 2) {
          return Status::Internal("'" + s.name + "' is part of '" + s.fused_module + "' of " +
                                  std::to_string(s.fused_parts) +
                                  " parts: a fused projection has two, both present");
        }
      }
      plan.push_back(pp);
    }
  }
  for (auto& [group, pack] : p.lora_) {
    std::sort(pack.adapters.begin(), pack.adapters.end(),
              [](const auto& x, const auto& y) { return x.row < y.row; });
    for (size_t i = 0; i < pack.adapters.size(); ++i) pack.adapters[i].col = int64_t(i) * pack.rank;
  }

  // Weights and gradients share one layout function, so their tensors line up.
  auto layout = [&](TensorCarver& cv, bool grads) {
    for (const PlannedParam& pp : plan) {
      const ParamSpec& s = *pp.spec;
      if (grads && !s.trainable) continue;
      std::vector<int64_t> dims = MasterShape(s);
      if (pp.up != nullptr) dims[0] *= 2;
      if (s.nf4) {  // frozen: never in the gradients' layout
        auto take = [&](const ParamSpec& q) {
          DeviceParam::Nf4Part part;
          const std::vector<size_t> b = Nf4DeviceTensorBytes(q.numel(), q.nf4_nested);
          for (size_t k = 0; k < b.size(); ++k) {
            const bool bytes = k == Nf4Slot::kPacked || (k == Nf4Slot::kAbsmax && q.nf4_nested);
            part.t[k] = bytes ? cv.Take(DType::kU8, Shape{int64_t(b[k])}, &part.offset[k])
                              : cv.Take(DType::kF32, Shape{int64_t(b[k] / 4)}, &part.offset[k]);
          }
          part.rows = MasterShape(q)[0];
          DeviceParam& dp = p.params_[q.name];
          dp.w = Tensor{{}, dtype, ShapeOf(MasterShape(q))};
          dp.nf4 = {part};
          dp.host_name = q.name;
          return part;
        };
        const DeviceParam::Nf4Part gate = take(s);
        if (pp.up != nullptr) {
          const DeviceParam::Nf4Part up = take(*pp.up);
          DeviceParam& fused = p.params_[FusedName(s)];
          fused.w = Tensor{{}, dtype, ShapeOf(dims)};
          fused.nf4 = {gate, up};
          fused.host_name = s.name;
          fused.fused = true;
        }
        continue;
      }
      size_t offset = 0;
      const Tensor t = cv.Take(grads ? DType::kF32 : dtype, ShapeOf(dims), &offset);
      auto assign = [&](const std::string& name, const Tensor& view, size_t off) {
        DeviceParam& dp = p.params_[name];
        (grads ? dp.grad : dp.w) = view;
        (grads ? dp.g_offset : dp.w_offset) = off;
        const ParamSpec* spec = by_name.count(name) ? by_name.at(name) : &s;
        dp.host_name = spec->tied_to.empty() ? name : spec->tied_to;
        dp.trainable = spec->trainable;
      };
      if (pp.up == nullptr) {
        assign(s.name, t, offset);
        continue;
      }
      const int64_t half = dims[0] / 2;
      const size_t half_bytes = size_t(t.numel() / 2) * DTypeSize(t.dtype);
      assign(FusedName(s), t, offset);
      p.params_[FusedName(s)].fused = true;
      assign(s.name, t.Rows(0, half), offset);
      assign(pp.up->name, t.Rows(half, 2 * half), offset + half_bytes);
    }
    for (auto& [group, pack] : p.lora_) {
      const Shape a{pack.total_rank(), pack.in}, b{pack.out, pack.total_rank()};
      if (grads) {
        pack.da = cv.Take(DType::kF32, a, &pack.da_offset);
        pack.db = cv.Take(DType::kF32, b, &pack.db_offset);
      } else {
        pack.a = cv.Take(dtype, a, &pack.a_offset);
        pack.b = cv.Take(dtype, b, &pack.b_offset);
      }
    }
  };
  // The bytes and start of each, whether an arena block or a source's region.
  auto place = [&](bool grads, DeviceBuffer& buffer, DevicePtr<std::byte>& data,
                   size_t& bytes) -> Status {
    TensorCarver count;
    layout(count, grads);
    bytes = count.bytes();
    if (d == nullptr) return Status::Ok();  // Measure: the sizes only
    const char* name = grads ? "params.grads" : "params.weights";
    FERRY_ASSIGN_OR_RETURN(
        buffer, AllocateCarved(*d, source, name, [&](TensorCarver& cv) { layout(cv, grads); }));
    if (buffer.valid()) data = buffer.data();
    if (source != nullptr) {
      FERRY_ASSIGN_OR_RETURN(data, source->Region(name, bytes));
    }
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(place(false, p.weights_, p.weights_data_, p.weights_bytes_));
  // What an update changes: the trainable weights and every LoRA factor, merged.
  std::vector<std::pair<size_t, size_t>> extents;
  for (const auto& [name, dp] : p.params_) {
    if (dp.trainable && dp.nf4.empty()) {
      extents.emplace_back(dp.w_offset, dp.w_offset + size_t(dp.w.bytes()));
    }
  }
  for (const auto& [group, pack] : p.lora_) {
    extents.emplace_back(pack.a_offset, pack.a_offset + size_t(pack.a.bytes()));
    extents.emplace_back(pack.b_offset, pack.b_offset + size_t(pack.b.bytes()));
  }
  std::sort(extents.begin(), extents.end());
  for (const auto& e : extents) {
    if (!p.trainable_extents_.empty() && e.first <= p.trainable_extents_.back().second) {
      p.trainable_extents_.back().second = std::max(p.trainable_extents_.back().second, e.second);
    } else {
      p.trainable_extents_.push_back(e);
    }
  }
  if (grad_buffers == ParamGrads::kAllocate) {
    FERRY_RETURN_IF_ERROR(place(true, p.grads_, p.grads_data_, p.grads_bytes_));
  }
  return p;
}

namespace {

// fn(begin, end) over [0, n), split over `pool` when it has more than one thread and n is large
// enough to pay for the split.
void SplitOver(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kGrain = 1 << 16;  // 256 KiB of fp32: below it a split costs more than it saves
  if (pool == nullptr || pool->size() == 1 || n < 2 * kGrain) {
    fn(0, n);
  } else {
    pool->ParallelFor(n, kGrain, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
  }
}

// ConvertFromFloat of n elements, split over `pool`.
void ConvertFromFloatOn(ThreadPool* pool, const float* src, DType dtype, std::byte* dst,
                        int64_t n) {
  const size_t size = DTypeSize(dtype);
  SplitOver(pool, n, [&](int64_t begin, int64_t end) {
    ConvertFromFloat(src + begin, dtype, dst + size_t(begin) * size, size_t(end - begin));
  });
}

// A weight served from a file (HostTensors::files: the model's, or the converted copy) into `dst`
// as `dtype`, split over `pool`: read from the drive through `reader` when given (and the weight's
// place in its file is known), else from the file's mapping, whose pages then leave the resident
// set (read once per packing).
Status PackFileTensorOn(ThreadPool* pool, BaseFileReader* reader, const FileTensor& t, DType dtype,
                        std::byte* dst) {
  const bool drive = reader != nullptr && t.offset >= 0;
  if (t.transposed) {
    std::vector<float> values(size_t(t.numel()));
    if (drive) {
      FERRY_RETURN_IF_ERROR(ReadFileTensor(t, *reader, values));
    } else {
      ReadFileTensor(t, values);
    }
    ConvertFromFloatOn(pool, values.data(), dtype, dst, t.numel());
  } else if (drive) {
    const size_t in = DTypeSize(t.dtype), out = DTypeSize(dtype);
    FERRY_RETURN_IF_ERROR(
        reader->Read(t, [&](std::span<const std::byte> bytes, int64_t first, int64_t n) {
          SplitOver(pool, n, [&](int64_t begin, int64_t end) {
            ConvertStored(t.dtype, bytes.data() + size_t(begin) * in, size_t(end - begin), dtype,
                          dst + size_t(first + begin) * out);
          });
          return Status::Ok();
        }));
  } else {
    const size_t size = DTypeSize(dtype);
    SplitOver(pool, t.numel(), [&](int64_t begin, int64_t end) {
      ConvertFileRange(t, begin, end, dtype, dst + size_t(begin) * size);
    });
  }
  if (!drive) ReleaseFilePages(t);
  return Status::Ok();
}

}  // namespace

Status DeviceParams::PackWeights(const HostTensors& weights, ThreadPool* pool, bool trainable_only,
                                 bool keep_served, BaseFileReader* reader) {
  std::byte* mirror = mirrors_->weights.data();
  for (const auto& [name, dp] : params_) {
    if (dp.fused) continue;  // filled by its parts
    if (trainable_only && !dp.trainable) continue;
    if (keep_served &&
        (weights.files.contains(dp.host_name) || weights.nf4_served.contains(dp.host_name))) {
      continue;
    }
    if (!dp.nf4.empty()) {
      const DeviceParam::Nf4Part& part = dp.nf4[0];
      // Stored as a device holds it (a converted copy): its tensors straight from the mapping.
      if (auto s = weights.nf4_served.find(dp.host_name);
          s != weights.nf4_served.end() && !s->second.device_parts.empty()) {
        const std::vector<size_t> sizes = Nf4DeviceTensorBytes(dp.w.numel(), part.nested());
        const std::vector<std::span<const std::byte>>& parts = s->second.device_parts;
        bool same = parts.size() == sizes.size() && s->second.nested == part.nested();
        for (size_t k = 0; same && k < sizes.size(); ++k) same = parts[k].size() == sizes[k];
        if (!same) {
          return Status::InvalidArgument("NF4 tensor '" + dp.host_name +
                                         "' as stored does not match the device layout of " +
                                         std::to_string(dp.w.numel()) + " elements (" +
                                         (part.nested() ? "" : "not ") + "double-quantized)");
        }
        // The parts lie one after another: read from the drive through `reader` when given, each
        // piece copied to the parts it covers; else from the mapping, the codes (most of it)
        // split over the pool, as a file's weight, and then released (read once per packing).
        const FileTensor& run = s->second.parts_file;
        if (reader != nullptr && run.offset >= 0) {
          FERRY_RETURN_IF_ERROR(
              reader
                  ->Read(run,
                         [&](std::span<const std::byte> bytes, int64_t first, int64_t) {
                           size_t at = 0;  // part k's first byte in the run
                           for (size_t k = 0; k < sizes.size(); at += sizes[k], ++k) {
                             const size_t from = std::max(at, size_t(first));
                             const size_t to =
                                 std::min(at + sizes[k], size_t(first) + bytes.size());
                             if (from >= to) continue;
                             std::memcpy(mirror + part.offset[k] + (from - at),
                                         bytes.data() + (from - size_t(first)), to - from);
                           }
                           return Status::Ok();
                         })
                  .WithContext("packing '" + dp.host_name + "'"));
          continue;
        }
        SplitOver(pool, int64_t(sizes[0]), [&](int64_t begin, int64_t end) {
          std::memcpy(mirror + part.offset[0] + begin, parts[0].data() + begin,
                      size_t(end - begin));
        });
        for (size_t k = 1; k < sizes.size(); ++k) {
          std::memcpy(mirror + part.offset[k], parts[k].data(), sizes[k]);
        }
        ReleaseMappedPages({parts.front().data(), size_t(parts.back().data() + parts.back().size() -
                                                         parts.front().data())});
        continue;
      }
      Nf4Host made;  // a served weight's, made for this packing only
      FERRY_ASSIGN_OR_RETURN(const Nf4Host* found, weights.FindNf4(dp.host_name, made));
      if (found == nullptr || found->numel() != dp.w.numel()) {
        return Status::NotFound("the weights have no NF4 tensor '" + dp.host_name + "' of " +
                                std::to_string(dp.w.numel()) +
                                " elements; a quantized base (--quantize nf4) needs one for "
                                "every block projection");
      }
      const Nf4Host& q = *found;
      FERRY_RETURN_IF_ERROR(ValidateNf4(q, dp.host_name));
      if (q.block != kNf4Block) {
        return Status::InvalidArgument("NF4 tensor '" + dp.host_name + "' has block size " +
                                       std::to_string(q.block) + "; ferry computes with " +
                                       std::to_string(kNf4Block) + " only");
      }
      if (q.nested() != part.nested() || (q.nested() && q.nested_block != kNf4NestedBlock)) {
        return Status::InvalidArgument(
            "NF4 tensor '" + dp.host_name + "' is " + (q.nested() ? "" : "not ") +
            "double-quantized" +
            (q.nested() ? " in nested blocks of " + std::to_string(q.nested_block) : "") +
            "; the device layout was made for " +
            (part.nested() ? "nested blocks of " + std::to_string(kNf4NestedBlock)
                           : "fp32 absmax") +
            " (--[no-]double-quant as the weights were quantized)");
      }
      // As the host holds it: the upload moves the stored bytes (and the two maps).
      auto copy = [&](size_t k, const auto& v) {
        std::memcpy(mirror + part.offset[k], v.data(), v.size() * sizeof(v[0]));
      };
      copy(Nf4Slot::kPacked, q.packed);
      copy(Nf4Slot::kCode, q.code);
      if (q.nested()) {
        copy(Nf4Slot::kAbsmax, q.absmax_q);
        copy(Nf4Slot::kNestedAbsmax, q.nested_absmax);
        copy(Nf4Slot::kNestedCode, q.nested_code);
        copy(Nf4Slot::kNestedOffset, std::array<float, 1>{q.nested_offset});
      } else {
        copy(Nf4Slot::kAbsmax, q.absmax);
      }
      continue;
    }
    if (auto f = weights.files.find(dp.host_name); f != weights.files.end()) {
      if (f->second.numel() != dp.w.numel()) {
        return Status::InvalidArgument("the weights' tensor '" + dp.host_name + "' in " +
                                       f->second.path + " has " +
                                       std::to_string(f->second.numel()) + " elements, expected " +
                                       std::to_string(dp.w.numel()));
      }
      FERRY_RETURN_IF_ERROR(PackFileTensorOn(pool, reader, f->second, dtype_, mirror + dp.w_offset)
                                .WithContext("packing '" + dp.host_name + "'"));
      continue;
    }
    FERRY_RETURN_IF_ERROR(CheckHost(weights, dp.host_name, dp.w.numel(), "the weights"));
    const std::vector<float>& src = weights.tensors.at(dp.host_name);
    ConvertFromFloatOn(pool, src.data(), dtype_, mirror + dp.w_offset, int64_t(src.size()));
  }
  std::vector<float> a_f32, b_f32;  // a group's packed factors in fp32, then in the mirror
  for (const auto& [group, pack] : lora_) {
    const int64_t R = pack.total_rank();
    a_f32.assign(size_t(R * pack.in), 0.0f);
    b_f32.assign(size_t(pack.out * R), 0.0f);
    float* a = a_f32.data();
    float* b = b_f32.data();
    for (const LoraPack::Adapter& ad : pack.adapters) {
      FERRY_RETURN_IF_ERROR(CheckHost(weights, ad.a_name, pack.rank * pack.in, "the weights"));
      FERRY_RETURN_IF_ERROR(CheckHost(weights, ad.b_name, ad.rows * pack.rank, "the weights"));
      const std::vector<float>& sa = weights.tensors.at(ad.a_name);
      const std::vector<float>& sb = weights.tensors.at(ad.b_name);
      std::copy(sa.begin(), sa.end(), a + ad.col * pack.in);
      for (int64_t i = 0; i < ad.rows; ++i) {
        for (int64_t j = 0; j < pack.rank; ++j) {
          b[(ad.row + i) * R + ad.col + j] = sb[size_t(i * pack.rank + j)];
        }
      }
    }
    ConvertFromFloat(a, dtype_, mirror + pack.a_offset, a_f32.size());
    ConvertFromFloat(b, dtype_, mirror + pack.b_offset, b_f32.size());
  }
  return Status::Ok();
}

Status DeviceParams::UploadWeights(Device& d, size_t offset, size_t bytes) {
  if (offset > weights_bytes_ || bytes > weights_bytes_ - offset) {
    return Status::InvalidArgument("UploadWeights: bytes [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + bytes) + ") outside the " +
                                   std::to_string(weights_bytes_) + " of the weights");
  }
  if (bytes == 0) return Status::Ok();
  return d.CopyToDevice(weights_data_ + std::ptrdiff_t(offset),
                        mirrors_->weights.Sub(offset, bytes), bytes);
}

Result<size_t> DeviceParams::UploadTrainableWeights(Device& d, size_t offset, size_t bytes) {
  if (offset > weights_bytes_ || bytes > weights_bytes_ - offset) {
    return UploadWeights(d, offset, bytes);  // InvalidArgument naming the range
  }
  size_t copied = 0;
  for (const auto& [begin, end] : trainable_extents_) {
    const size_t lo = std::max(begin, offset), hi = std::min(end, offset + bytes);
    if (lo >= hi) continue;
    FERRY_RETURN_IF_ERROR(UploadWeights(d, lo, hi - lo));
    copied += hi - lo;
  }
  return copied;
}

Status DeviceParams::Upload(Device& d, const HostTensors& weights) {
  FERRY_RETURN_IF_ERROR(PackWeights(weights));
  // The previous step's compute may still read the weights: upload after it.
  FERRY_ASSIGN_OR_RETURN(Event compute_done, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(compute_done, StreamId::kCompute));
  FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kUpload, compute_done));
  FERRY_RETURN_IF_ERROR(UploadWeights(d, 0, weights_bytes_));
  FERRY_ASSIGN_OR_RETURN(Event uploaded, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(uploaded, StreamId::kUpload));
  FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kCompute, uploaded));
  return d.Synchronize(uploaded);  // the mirror may be rewritten once this returns
}

Status DeviceParams::ZeroGrads(Device& d) {
  if (grads_bytes_ == 0) return Status::Ok();
  return d.Zero(grads_data_, grads_bytes_, StreamId::kCompute);
}

namespace {

// dst[i] (+)= src[i] for i in [0, n), split over `pool` when it has more than one thread.
void StoreOrAdd(float* dst, const float* src, int64_t n, bool overwrite, ThreadPool* pool) {
  SplitOver(pool, n, [&](int64_t begin, int64_t end) {
    if (overwrite) {
      std::memcpy(dst + begin, src + begin, size_t(end - begin) * sizeof(float));
    } else {
      for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
    }
  });
}

}  // namespace

void GradOverwrite::ZeroUnwritten(HostTensors& grads) {
  for (auto& [name, g] : grads.tensors) {
    if (written.insert(name).second) std::fill(g.begin(), g.end(), 0.0f);
  }
}

Status DeviceParams::DownloadGrads(Device& d) {
  if (grads_bytes_ == 0) return Status::Ok();
  return d.CopyToHost(mirrors_->grads.Sub(0, grads_bytes_), grads_data_, grads_bytes_);
}

Status DeviceParams::DownloadAndAddGrads(Device& d, HostTensors& grads, GradOverwrite* overwrite,
                                         ThreadPool* pool) {
  FERRY_ASSIGN_OR_RETURN(Event computed, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(computed, StreamId::kCompute));
  FERRY_RETURN_IF_ERROR(d.Wait(StreamId::kDownload, computed));
  if (grads_bytes_ == 0) return Status::Ok();
  FERRY_RETURN_IF_ERROR(DownloadGrads(d));
  FERRY_ASSIGN_OR_RETURN(Event downloaded, d.CreateEvent());
  FERRY_RETURN_IF_ERROR(d.Record(downloaded, StreamId::kDownload));
  FERRY_RETURN_IF_ERROR(d.Synchronize(downloaded));
  return AddGrads(grads, overwrite, pool);
}

Status DeviceParams::AddGrads(HostTensors& grads, GradOverwrite* overwrite, ThreadPool* pool) {
  if (grads_bytes_ == 0) return Status::Ok();
  const std::byte* mirror = mirrors_->grads.data();
  for (const auto& [name, dp] : params_) {
    if (dp.grad.data.is_null() || dp.fused) continue;
    FERRY_RETURN_IF_ERROR(CheckHost(grads, dp.host_name, dp.grad.numel(), "the gradients"));
    float* dst = grads.tensors.at(dp.host_name).data();
    const float* src = reinterpret_cast<const float*>(mirror + dp.g_offset);
    // A tied head shares its owner's host tensor: the first of the two stores, the other adds.
    const bool store = overwrite != nullptr && overwrite->written.insert(dp.host_name).second;
    StoreOrAdd(dst, src, dp.grad.numel(), store, pool);
  }
  // LoRA factors are scattered with +=: when overwriting, each starts from zero.
  auto first_write = [overwrite](const std::string& name, float* g, int64_t n) {
    if (overwrite != nullptr && overwrite->written.insert(name).second) std::fill(g, g + n, 0.0f);
  };
  for (const auto& [group, pack] : lora_) {
    const float* da = reinterpret_cast<const float*>(mirror + pack.da_offset);
    const float* db = reinterpret_cast<const float*>(mirror + pack.db_offset);
    const int64_t R = pack.total_rank();
    for (const LoraPack::Adapter& ad : pack.adapters) {
      FERRY_RETURN_IF_ERROR(CheckHost(grads, ad.a_name, pack.rank * pack.in, "the gradients"));
      FERRY_RETURN_IF_ERROR(CheckHost(grads, ad.b_name, ad.rows * pack.rank, "the gradients"));
      float* ga = grads.tensors.at(ad.a_name).data();
      float* gb = grads.tensors.at(ad.b_name).data();
      first_write(ad.a_name, ga, pack.rank * pack.in);
      first_write(ad.b_name, gb, ad.rows * pack.rank);
      for (int64_t i = 0; i < pack.rank * pack.in; ++i) ga[i] += da[ad.col * pack.in + i];
      for (int64_t i = 0; i < ad.rows; ++i) {
        for (int64_t j = 0; j < pack.rank; ++j) {
          gb[i * pack.rank + j] += db[(ad.row + i) * R + ad.col + j];
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace ferry
