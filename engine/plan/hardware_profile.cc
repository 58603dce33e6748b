#include "engine/plan/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/json.h"
#include "engine/plan/byte_size.h"
#include "offload/file_io.h"

namespace ferry::plan {
namespace {

using nlohmann::json;

// Reads the fields of one JSON object; every error names origin and the dotted field path.
class FieldReader {
 public:
  FieldReader(const json& object, std::string origin, std::string path)
      : object_(object), origin_(std::move(origin)), path_(std::move(path)) {}

  Status Bytes(const char* key, uint64_t* out) const {
    const json* v = nullptr;
    FERRY_RETURN_IF_ERROR(Find(key, &v));
    if (v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0)) {
      *out = v->get<uint64_t>();
      return Status::Ok();
    }
    if (v->is_number_float() && v->get<double>() >= 0 && v->get<double>() < 1.8e19 &&
        std::floor(v->get<double>()) == v->get<double>()) {
      *out = static_cast<uint64_t>(v->get<double>());
      return Status::Ok();
    }
    if (v->is_string()) {
      Result<uint64_t> r = ParseByteSize(v->get<std::string>());
      if (!r.ok()) return Error(key, r.status().message());
      *out = *r;
      return Status::Ok();
    }
    return Error(key,
                 "expected a byte count (a non-negative integer or a string like \"24GiB\"), "
                 "got " +
                     v->dump());
  }
  Status Number(const char* key, double* out) const {
    const json* v = nullptr;
    FERRY_RETURN_IF_ERROR(Find(key, &v));
    if (!v->is_number()) return Error(key, "expected a number, got " + v->dump());
    *out = v->get<double>();
    return Status::Ok();
  }
  Status Int(const char* key, int* out) const {
    const json* v = nullptr;
    FERRY_RETURN_IF_ERROR(Find(key, &v));
    if (!v->is_number_integer()) return Error(key, "expected an integer, got " + v->dump());
    // get<int> would wrap 2^32 + 2 to 2: refuse what an int cannot hold.
    if (v->is_number_unsigned() ? v->get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())
                                : (v->get<int64_t>() > std::numeric_limits<int>::max() ||
                                   v->get<int64_t>() < std::numeric_limits<int>::min())) {
      return Error(key, "integer " + v->dump() + " is out of range");
    }
    *out = v->get<int>();
    return Status::Ok();
  }
  Status Bool(const char* key, bool* out) const {
    const json* v = nullptr;
    FERRY_RETURN_IF_ERROR(Find(key, &v));
    if (!v->is_boolean()) return Error(key, "expected true or false, got " + v->dump());
    *out = v->get<bool>();
    return Status::Ok();
  }
  // Optional: a missing or null string leaves `out` unchanged.
  Status OptionalString(const char* key, std::string* out) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return Status::Ok();
    if (!it->is_string()) return Error(key, "expected a string, got " + it->dump());
    *out = it->get<std::string>();
    return Status::Ok();
  }
  // Optional number: missing or null leaves `out` unchanged.
  Status OptionalNumber(const char* key, double* out) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return Status::Ok();
    return Number(key, out);
  }
  Status OptionalBytes(const char* key, uint64_t* out) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return Status::Ok();
    return Bytes(key, out);
  }
  Result<FieldReader> Object(const char* key) const {
    const json* v = nullptr;
    FERRY_RETURN_IF_ERROR(Find(key, &v));
    if (!v->is_object()) return Error(key, "expected an object, got " + v->dump());
    return FieldReader(*v, origin_, Path(key));
  }

 private:
  std::string Path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  Status Error(const char* key, const std::string& what) const {
    return Status::InvalidArgument("hardware profile " + origin_ + ": field " + Path(key) + ": " +
                                   what);
  }
  Status Find(const char* key, const json** out) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return Error(key, "missing");
    *out = &*it;
    return Status::Ok();
  }

  const json& object_;
  std::string origin_;
  std::string path_;
};

Status Invalid(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("hardware profile field " + field + ": " + what);
}

Status RequirePositive(const char* field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return Invalid(field, "must be a positive number, got " + std::to_string(v));
  }
  return Status::Ok();
}

Status ParseInto(const json& root, const std::string& origin, HardwareProfile& p) {
  if (!root.is_object()) {
    return Status::InvalidArgument("hardware profile " + origin + ": expected a JSON object");
  }
  FieldReader top(root, origin, "");
  FERRY_RETURN_IF_ERROR(top.OptionalString("name", &p.name));
  FERRY_RETURN_IF_ERROR(top.OptionalString("description", &p.description));

  FERRY_ASSIGN_OR_RETURN(FieldReader gpu, top.Object("gpu"));
  FERRY_RETURN_IF_ERROR(gpu.OptionalString("model", &p.gpu.model));
  FERRY_RETURN_IF_ERROR(gpu.Int("count", &p.gpu.count));
  FERRY_RETURN_IF_ERROR(gpu.Bytes("memory_label_bytes", &p.gpu.memory_label_bytes));
  FERRY_RETURN_IF_ERROR(gpu.OptionalBytes("memory_reserve_bytes", &p.gpu.memory_reserve_bytes));
  p.gpu.memory_usable_bytes =
      p.gpu.memory_label_bytes - std::min(p.gpu.memory_reserve_bytes, p.gpu.memory_label_bytes);
  FERRY_RETURN_IF_ERROR(gpu.OptionalBytes("memory_usable_bytes", &p.gpu.memory_usable_bytes));
  FERRY_RETURN_IF_ERROR(gpu.Number("bf16_flops", &p.gpu.bf16_flops));
  FERRY_RETURN_IF_ERROR(gpu.OptionalNumber("fp16_fp16acc_flops", &p.gpu.fp16_fp16acc_flops));
  FERRY_RETURN_IF_ERROR(gpu.Number("matmul_efficiency", &p.gpu.matmul_efficiency));
  FERRY_RETURN_IF_ERROR(gpu.Number("memory_bandwidth", &p.gpu.memory_bandwidth));
  FERRY_RETURN_IF_ERROR(gpu.Bool("peer_access", &p.gpu.peer_access));
  FERRY_RETURN_IF_ERROR(gpu.OptionalString("source", &p.gpu.source));

  FERRY_ASSIGN_OR_RETURN(FieldReader pcie, top.Object("pcie"));
  FERRY_RETURN_IF_ERROR(pcie.Int("generation", &p.pcie.generation));
  FERRY_RETURN_IF_ERROR(pcie.Int("lanes", &p.pcie.lanes));
  FERRY_RETURN_IF_ERROR(pcie.Number("h2d_pinned", &p.pcie.h2d_pinned));
  FERRY_RETURN_IF_ERROR(pcie.Number("d2h_pinned", &p.pcie.d2h_pinned));
  FERRY_RETURN_IF_ERROR(pcie.Number("h2d_pageable", &p.pcie.h2d_pageable));
  FERRY_RETURN_IF_ERROR(pcie.Number("d2h_pageable", &p.pcie.d2h_pageable));
  FERRY_RETURN_IF_ERROR(pcie.OptionalString("source", &p.pcie.source));

  FERRY_ASSIGN_OR_RETURN(FieldReader host, top.Object("host"));
  FERRY_RETURN_IF_ERROR(host.Bytes("ram_bytes", &p.host.ram_bytes));
  p.host.ram_usable_bytes = p.host.ram_bytes;
  FERRY_RETURN_IF_ERROR(host.OptionalBytes("ram_usable_bytes", &p.host.ram_usable_bytes));
  FERRY_RETURN_IF_ERROR(host.Number("memory_bandwidth", &p.host.memory_bandwidth));
  FERRY_RETURN_IF_ERROR(host.Int("numa_nodes", &p.host.numa_nodes));
  FERRY_RETURN_IF_ERROR(host.Int("cpu_cores", &p.host.cpu_cores));
  FERRY_RETURN_IF_ERROR(host.OptionalString("source", &p.host.source));

  if (auto it = root.find("host_links"); it != root.end() && !it->is_null()) {
    FERRY_ASSIGN_OR_RETURN(FieldReader links, top.Object("host_links"));
    FERRY_RETURN_IF_ERROR(
        links.Number("shared_bandwidth_per_node", &p.host_links.shared_bandwidth_per_node));
    FERRY_RETURN_IF_ERROR(links.OptionalString("source", &p.host_links.source));
  }

  FERRY_ASSIGN_OR_RETURN(FieldReader nvme, top.Object("nvme"));
  FERRY_RETURN_IF_ERROR(nvme.OptionalString("dir", &p.nvme.dir));
  FERRY_RETURN_IF_ERROR(nvme.Bytes("space_bytes", &p.nvme.space_bytes));
  FERRY_RETURN_IF_ERROR(nvme.Number("read_rate", &p.nvme.read_rate));
  FERRY_RETURN_IF_ERROR(nvme.Number("write_rate", &p.nvme.write_rate));
  p.nvme.sustained_write_rate = p.nvme.write_rate;
  FERRY_RETURN_IF_ERROR(nvme.OptionalNumber("sustained_write_rate", &p.nvme.sustained_write_rate));
  FERRY_RETURN_IF_ERROR(
      nvme.OptionalBytes("endurance_bytes_written", &p.nvme.endurance_bytes_written));
  FERRY_RETURN_IF_ERROR(nvme.OptionalString("source", &p.nvme.source));

  FERRY_ASSIGN_OR_RETURN(FieldReader opt, top.Object("optimizer"));
  FERRY_RETURN_IF_ERROR(opt.Number("cpu_adamw_params_per_s", &p.optimizer.cpu_adamw_params_per_s));
  FERRY_RETURN_IF_ERROR(opt.OptionalString("source", &p.optimizer.source));

  if (auto it = root.find("layer_times"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) {
      return Status::InvalidArgument("hardware profile " + origin +
                                     ": field layer_times: expected an array, got " + it->dump());
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string path = "layer_times[" + std::to_string(i) + "]";
      if (!e.is_object()) {
        return Status::InvalidArgument("hardware profile " + origin + ": field " + path +
                                       ": expected an object, got " + e.dump());
      }
      const FieldReader t(e, origin, path);
      MeasuredLayerTime m;
      FERRY_RETURN_IF_ERROR(t.OptionalString("key", &m.key));
      FERRY_RETURN_IF_ERROR(t.Number("forward_s", &m.forward_s));
      FERRY_RETURN_IF_ERROR(t.Number("backward_s", &m.backward_s));
      p.layer_times.push_back(std::move(m));
    }
  }
  return ValidateHardwareProfile(p).WithContext("hardware profile " + origin);
}

}  // namespace

Status ValidateHardwareProfile(const HardwareProfile& p) {
  if (p.gpu.count < 1)
    return Invalid("gpu.count", "must be at least 1, got " + std::to_string(p.gpu.count));
  if (p.gpu.memory_label_bytes == 0) return Invalid("gpu.memory_label_bytes", "must be > 0");
  if (p.gpu.memory_usable_bytes == 0) return Invalid("gpu.memory_usable_bytes", "must be > 0");
  if (p.gpu.memory_usable_bytes > p.gpu.memory_label_bytes) {
    return Invalid("gpu.memory_usable_bytes", FormatByteSize(p.gpu.memory_usable_bytes) +
                                                  " exceeds the label memory " +
                                                  FormatByteSize(p.gpu.memory_label_bytes));
  }
  FERRY_RETURN_IF_ERROR(RequirePositive("gpu.bf16_flops", p.gpu.bf16_flops));
  if (p.gpu.fp16_fp16acc_flops < 0) {
    return Invalid("gpu.fp16_fp16acc_flops", "must be >= 0 (0 = unknown)");
  }
  if (!(p.gpu.matmul_efficiency > 0 && p.gpu.matmul_efficiency <= 1)) {
    return Invalid("gpu.matmul_efficiency",
                   "must be in (0, 1], got " + std::to_string(p.gpu.matmul_efficiency));
  }
  FERRY_RETURN_IF_ERROR(RequirePositive("gpu.memory_bandwidth", p.gpu.memory_bandwidth));
  if (p.pcie.generation < 1) return Invalid("pcie.generation", "must be >= 1");
  if (p.pcie.lanes < 1) return Invalid("pcie.lanes", "must be >= 1");
  FERRY_RETURN_IF_ERROR(RequirePositive("pcie.h2d_pinned", p.pcie.h2d_pinned));
  FERRY_RETURN_IF_ERROR(RequirePositive("pcie.d2h_pinned", p.pcie.d2h_pinned));
  FERRY_RETURN_IF_ERROR(RequirePositive("pcie.h2d_pageable", p.pcie.h2d_pageable));
  FERRY_RETURN_IF_ERROR(RequirePositive("pcie.d2h_pageable", p.pcie.d2h_pageable));
  if (p.host.ram_bytes == 0) return Invalid("host.ram_bytes", "must be > 0");
  if (p.host.ram_usable_bytes > p.host.ram_bytes) {
    return Invalid("host.ram_usable_bytes", FormatByteSize(p.host.ram_usable_bytes) +
                                                " exceeds the installed " +
                                                FormatByteSize(p.host.ram_bytes));
  }
  FERRY_RETURN_IF_ERROR(RequirePositive("host.memory_bandwidth", p.host.memory_bandwidth));
  if (p.host.numa_nodes < 1) return Invalid("host.numa_nodes", "must be >= 1");
  if (p.host.cpu_cores < 1) return Invalid("host.cpu_cores", "must be >= 1");
  if (!(p.host_links.shared_bandwidth_per_node >= 0) ||
      !std::isfinite(p.host_links.shared_bandwidth_per_node)) {
    return Invalid("host_links.shared_bandwidth_per_node", "must be >= 0 (0 = no cap)");
  }
  FERRY_RETURN_IF_ERROR(RequirePositive("nvme.read_rate", p.nvme.read_rate));
  FERRY_RETURN_IF_ERROR(RequirePositive("nvme.write_rate", p.nvme.write_rate));
  FERRY_RETURN_IF_ERROR(RequirePositive("nvme.sustained_write_rate", p.nvme.sustained_write_rate));
  FERRY_RETURN_IF_ERROR(
      RequirePositive("optimizer.cpu_adamw_params_per_s", p.optimizer.cpu_adamw_params_per_s));
  for (size_t i = 0; i < p.layer_times.size(); ++i) {
    const MeasuredLayerTime& t = p.layer_times[i];
    const std::string path = "layer_times[" + std::to_string(i) + "]";
    if (t.key.empty()) return Invalid(path + ".key", "must name the layer (LayerTimeKey)");
    if (!(t.forward_s > 0) || !std::isfinite(t.forward_s)) {
      return Invalid(path + ".forward_s", "must be a positive number of seconds");
    }
    if (!(t.backward_s >= 0) || !std::isfinite(t.backward_s)) {
      return Invalid(path + ".backward_s", "must be 0 or a positive number of seconds");
    }
  }
  return Status::Ok();
}

Result<HardwareProfile> ParseHardwareProfile(std::string_view json_text, std::string_view origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // nlohmann reports syntax errors by exception only
    return Status::InvalidArgument("hardware profile " + std::string(origin) +
                                   ": not valid JSON: " + e.what());
  }
  HardwareProfile p;
  FERRY_RETURN_IF_ERROR(ParseInto(root, std::string(origin), p));
  return p;
}

Result<HardwareProfile> LoadHardwareProfile(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status().WithContext("hardware profile");
  return ParseHardwareProfile(*text, path);
}

std::string HardwareProfileToJson(const HardwareProfile& p) {
  json j;
  j["name"] = p.name;
  j["description"] = p.description;
  j["gpu"] = {{"model", p.gpu.model},
              {"count", p.gpu.count},
              {"memory_label_bytes", p.gpu.memory_label_bytes},
              {"memory_reserve_bytes", p.gpu.memory_reserve_bytes},
              {"memory_usable_bytes", p.gpu.memory_usable_bytes},
              {"bf16_flops", p.gpu.bf16_flops},
              {"fp16_fp16acc_flops", p.gpu.fp16_fp16acc_flops},
              {"matmul_efficiency", p.gpu.matmul_efficiency},
              {"memory_bandwidth", p.gpu.memory_bandwidth},
              {"peer_access", p.gpu.peer_access},
              {"source", p.gpu.source}};
  j["pcie"] = {{"generation", p.pcie.generation},
               {"lanes", p.pcie.lanes},
               {"h2d_pinned", p.pcie.h2d_pinned},
               {"d2h_pinned", p.pcie.d2h_pinned},
               {"h2d_pageable", p.pcie.h2d_pageable},
               {"d2h_pageable", p.pcie.d2h_pageable},
               {"source", p.pcie.source}};
  j["host"] = {{"ram_bytes", p.host.ram_bytes},
               {"ram_usable_bytes", p.host.ram_usable_bytes},
               {"memory_bandwidth", p.host.memory_bandwidth},
               {"numa_nodes", p.host.numa_nodes},
               {"cpu_cores", p.host.cpu_cores},
               {"source", p.host.source}};
  if (p.host_links.shared_bandwidth_per_node > 0) {
    j["host_links"] = {{"shared_bandwidth_per_node", p.host_links.shared_bandwidth_per_node},
                       {"source", p.host_links.source}};
  }
  j["nvme"] = {{"dir", p.nvme.dir},
               {"space_bytes", p.nvme.space_bytes},
               {"read_rate", p.nvme.read_rate},
               {"write_rate", p.nvme.write_rate},
               {"sustained_write_rate", p.nvme.sustained_write_rate},
               {"endurance_bytes_written", p.nvme.endurance_bytes_written},
               {"source", p.nvme.source}};
  j["optimizer"] = {{"cpu_adamw_params_per_s", p.optimizer.cpu_adamw_params_per_s},
                    {"source", p.optimizer.source}};
  if (!p.layer_times.empty()) {
    j["layer_times"] = json::array();
    for (const MeasuredLayerTime& t : p.layer_times) {
      j["layer_times"].push_back(
          {{"key", t.key}, {"forward_s", t.forward_s}, {"backward_s", t.backward_s}});
    }
  }
  return j.dump(2) + "\n";
}

Status SaveHardwareProfile(const HardwareProfile& profile, const std::string& path) {
  return WriteTextFile(path, HardwareProfileToJson(profile)).WithContext("hardware profile");
}

Result<BudgetOverrides> ParseBudgetOverrides(std::string_view gpu_memory,
                                             std::string_view host_memory,
                                             std::string_view nvme_dir,
                                             std::string_view nvme_space) {
  BudgetOverrides o;
  if (!gpu_memory.empty()) {
    Result<uint64_t> r = ParseByteSize(gpu_memory);
    if (!r.ok()) return r.status().WithContext("--gpu-memory");
    o.gpu_memory = *r;
  }
  if (!host_memory.empty()) {
    Result<uint64_t> r = ParseByteSize(host_memory);
    if (!r.ok()) return r.status().WithContext("--host-memory");
    o.host_memory = *r;
  }
  if (!nvme_dir.empty()) o.nvme_dir = std::string(nvme_dir);
  if (!nvme_space.empty()) {
    Result<uint64_t> r = ParseByteSize(nvme_space);
    if (!r.ok()) return r.status().WithContext("--nvme-space");
    o.nvme_space = *r;
  }
  return o;
}

Status ApplyBudgetOverrides(const BudgetOverrides& o, HardwareProfile& p) {
  if (o.gpu_memory) {
    if (*o.gpu_memory == 0) return Status::InvalidArgument("--gpu-memory must be > 0");
    if (*o.gpu_memory > p.gpu.memory_label_bytes) {
      return Status::InvalidArgument(
          "--gpu-memory " + FormatByteSize(*o.gpu_memory) + " exceeds the " + p.gpu.model + "'s " +
          FormatByteSize(p.gpu.memory_label_bytes) +
          "; a budget can only lower what the device has (use a profile for another GPU)");
    }
    p.gpu.memory_usable_bytes = *o.gpu_memory;
  }
  if (o.host_memory) {
    if (*o.host_memory == 0) return Status::InvalidArgument("--host-memory must be > 0");
    if (*o.host_memory > p.host.ram_bytes) {
      return Status::InvalidArgument("--host-memory " + FormatByteSize(*o.host_memory) +
                                     " exceeds the installed " + FormatByteSize(p.host.ram_bytes) +
                                     "; fix host.ram_bytes in the profile or run `ferry probe`");
    }
    p.host.ram_usable_bytes = *o.host_memory;
  }
  if (o.nvme_dir) p.nvme.dir = *o.nvme_dir;
  if (o.nvme_space) {
    if (p.nvme.dir.empty()) {
      return Status::InvalidArgument(
          "--nvme-space given without --nvme-dir: name the directory ferry may write to");
    }
    p.nvme.space_bytes = *o.nvme_space;
  }
  return ValidateHardwareProfile(p);
}

}  // namespace ferry::plan
