// SuggestChanges (planner.h): when a job fits nowhere, the smallest changes
// that fit, each proved by a full re-plan.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_stack.h"
#include "engine/plan/byte_size.h"
#include "engine/plan/planner.h"

namespace ferry::plan {
namespace {

// The re-planned job when it fits (without suggestions of its own).
std::optional<Plan> Fits(const std::string& model_name, const ModelConfig& model,
                         const PlanJob& job, const HardwareProfile& hw) {
  Result<PlanOutcome> r = MakePlan(model_name, model, job, hw, /*suggest=*/false);
  if (!r.ok() || !r.value().feasible) return std::nullopt;
  return std::move(r.value().plan);
}

}  // namespace

std::vector<PlanSuggestion> SuggestChanges(const std::string& model_name, const ModelConfig& model,
                                           const PlanJob& job, const HardwareProfile& hw) {
  std::vector<PlanSuggestion> out;
  // The longest shorter sequence that fits (binary search; memory grows with
  // the length).
  {
    int64_t lo = 0, hi = job.seq_len;  // lo fits (0: nothing known), hi does not
    std::optional<Plan> found;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      PlanJob j = job;
      j.seq_len = mid;
      if (std::optional<Plan> p = Fits(model_name, model, j, hw)) {
        lo = mid;
        found = std::move(p);
      } else {
        hi = mid;
      }
    }
    if (found) out.push_back({"--seq-len " + std::to_string(lo), std::move(*found)});
  }
  // Fewer tokens per micro-batch: one sequence each.
  if (job.micro_batches != job.global_batch) {
    PlanJob j = job;
    j.micro_batches = job.global_batch;
    if (std::optional<Plan> p = Fits(model_name, model, j, hw)) {
      out.push_back({"--micro-batches " + std::to_string(j.micro_batches), std::move(*p)});
    }
  }
  // LoRA instead of full fine-tuning; when that is not enough, over an NF4 base (QLoRA; the
  // Llama family's projections), and QLoRA for a LoRA job over a plain base.
  const bool nf4_able = CheckBaseQuant(model, BaseQuant::kNf4).ok();
  if (!job.lora.enabled()) {
    PlanJob j = job;
    j.lora.rank = 16;
    j.lora.alpha = 32;
    j.lora.targets = kLoraAll;
    if (std::optional<Plan> p = Fits(model_name, model, j, hw)) {
      out.push_back({"--lora-rank 16", std::move(*p)});
    } else if (nf4_able) {
      j.lora.quantize = BaseQuant::kNf4;
      if (std::optional<Plan> q = Fits(model_name, model, j, hw)) {
        out.push_back({"--lora-rank 16 --quantize nf4", std::move(*q)});
      }
    }
  } else if (job.lora.quantize == BaseQuant::kNone && nf4_able) {
    PlanJob j = job;
    j.lora.quantize = BaseQuant::kNf4;
    if (std::optional<Plan> p = Fits(model_name, model, j, hw)) {
      out.push_back({"--quantize nf4", std::move(*p)});
    }
  }
  // More host RAM: the least (to a MiB) that fits, searched up to 64 TiB.
  {
    const uint64_t mib = 1ull << 20;
    uint64_t lo = hw.host.ram_usable_bytes / mib, hi = 64ull << 20;  // in MiB
    HardwareProfile h = hw;
    h.host.ram_usable_bytes = h.host.ram_bytes = hi * mib;
    std::optional<Plan> found = Fits(model_name, model, job, h);
    if (found) {
      while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        h.host.ram_usable_bytes = h.host.ram_bytes = mid * mib;
        if (std::optional<Plan> p = Fits(model_name, model, job, h)) {
          hi = mid;
          found = std::move(p);
        } else {
          lo = mid;
        }
      }
      out.push_back(
          {"--host-memory " + FormatByteSize(hi * mib) + " (more RAM)", std::move(*found)});
    }
  }
  // An NVMe directory: the space the plan puts there plus kNvmeSpaceMarginPercent, in whole GiB,
  // proved by a re-plan with exactly that space. The profile's drive (or 4 TB) only bounds the
  // search: advice is what the plan needs, not the size of a drive.
  if (!hw.HasNvme()) {
    HardwareProfile h = hw;
    h.nvme.dir = "NVME_DIR";
    if (h.nvme.space_bytes == 0) h.nvme.space_bytes = 4'000'000'000'000ull;
    if (h.nvme.read_rate <= 0) h.nvme.read_rate = 7e9;
    if (h.nvme.write_rate <= 0) h.nvme.write_rate = 6.6e9;
    if (h.nvme.sustained_write_rate <= 0) h.nvme.sustained_write_rate = 3.4e9;
    if (std::optional<Plan> p = Fits(model_name, model, job, h)) {
      const uint64_t gib = uint64_t(1) << 30, need = p->memory.nvme.total();
      const uint64_t ask = (need + need * kNvmeSpaceMarginPercent / 100 + gib - 1) / gib * gib;
      HardwareProfile tight = h;
      tight.nvme.space_bytes = std::min(std::max(ask, gib), h.nvme.space_bytes);
      std::optional<Plan> proved = Fits(model_name, model, job, tight);
      if (!proved) tight = h;  // cannot happen (the same plan fits); the bound is then the advice
      const std::string space = tight.nvme.space_bytes % gib == 0
                                    ? std::to_string(tight.nvme.space_bytes / gib) + "GiB"
                                    : std::to_string(tight.nvme.space_bytes) + "B";
      Plan& plan = proved ? *proved : *p;
      // A base streamed from the model's files reads that drive, and takes no space.
      const std::string why =
          need == 0 && plan.frozen_weights == Tier::kNvme
              ? "the frozen base streams from the model's files each step; give the drive that "
                "holds them, the plan puts nothing there"
              : "the plan puts " + FormatByteSize(need) + " there; " +
                    std::to_string(kNvmeSpaceMarginPercent) + "% more for margin";
      out.push_back({"--nvme-dir DIR --nvme-space " + space + " (" + why + ")", std::move(plan)});
    }
  }
  return out;
}

}  // namespace ferry::plan
