// Plan output (planner.h): JSON for machines, a summary and a per-device memory
// table for people.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/json.h"
#include "engine/plan/byte_size.h"
#include "engine/plan/planner.h"

namespace ferry::plan {
namespace {

nlohmann::json TierToJson(const TierMemory& t) {
  nlohmann::json j;
  j["total_bytes"] = t.total();
  nlohmann::json list = nlohmann::json::array();
  for (const Allocation& a : t.allocations) list.push_back({{"name", a.name}, {"bytes", a.bytes}});
  j["allocations"] = list;
  return j;
}

std::string Format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

std::string Gib(uint64_t b) { return Format("%.2f GiB", double(b) / double(1ull << 30)); }

void TableRows(std::string& out, const char* tier, const TierMemory& t, uint64_t budget) {
  out += std::string("  ") + tier + ": " + Gib(t.total());
  if (budget > 0) out += " of " + Gib(budget);
  out += "\n";
  for (const Allocation& a : t.allocations) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "    %-22s %16llu B  %10s\n", a.name.c_str(),
                  static_cast<unsigned long long>(a.bytes), Gib(a.bytes).c_str());
    out += buf;
  }
}

// "recompute (28 recomputed) on host": the policy, the blocks it recomputes, the tier the saved
// activations go to.
std::string ActivationsOf(const PlanCandidate& k) {
  return k.policy + " (" + std::to_string(k.recomputed) + " recomputed) on " +
         std::string(TierName(k.activations));
}

// What `r` lost to `chosen` on (Preferred's order).
std::string LostOn(const PlanCandidate& r, const PlanCandidate& chosen) {
  if (r.step_s > chosen.step_s) {
    const double percent = 100.0 * (r.step_s / chosen.step_s - 1);
    return percent >= 0.01 ? Format("%+.2f%% step", percent) : std::string("+<0.01% step");
  }
  if (r.frozen == Tier::kNvme && chosen.frozen != Tier::kNvme) {
    return "equal speed, base streamed from NVMe";
  }
  if (r.nvme_bytes > chosen.nvme_bytes) {
    return "equal speed, " + FormatByteSize(r.nvme_bytes - chosen.nvme_bytes) + " more NVMe space";
  }
  if (r.nvme_read_bytes > chosen.nvme_read_bytes) {
    return "equal speed, " + FormatByteSize(uint64_t(r.nvme_read_bytes - chosen.nvme_read_bytes)) +
           " more NVMe reads per step";
  }
  if (r.host_bytes > chosen.host_bytes) {
    return "equal speed, " + FormatByteSize(r.host_bytes - chosen.host_bytes) + " more host memory";
  }
  if (r.gpu_bytes > chosen.gpu_bytes) {
    return "equal speed, " + FormatByteSize(r.gpu_bytes - chosen.gpu_bytes) +
           " more GPU memory per GPU";
  }
  return "equal on every count (the first found wins)";
}

}  // namespace

nlohmann::json CandidatesToJson(const std::vector<PlanCandidate>& candidates) {
  nlohmann::json list = nlohmann::json::array();
  for (const PlanCandidate& k : candidates) {
    nlohmann::json j = {{"micro_batches", k.micro_batches},
                        {"stages", k.stages},
                        {"tail_parts", k.tail_parts},
                        {"grad_accumulators", k.grad_accumulators},
                        {"activation_policy", k.policy},
                        {"recomputed_blocks", k.recomputed},
                        {"activations", TierName(k.activations)},
                        {"optimizer_state", TierName(k.optimizer)},
                        {"frozen_weights", TierName(k.frozen)},
                        {"fits", k.fits},
                        {"need_ratio", k.need_ratio},
                        {"tightest", k.tightest},
                        {"gpu_bytes", k.gpu_bytes},
                        {"host_bytes", k.host_bytes},
                        {"nvme_bytes", k.nvme_bytes}};
    if (k.step_s > 0) {  // simulated (when it does not fit: what it would take)
      j["step_s"] = k.step_s;
      j["bubble_fraction"] = k.bubble_fraction;
      j["nvme_read_bytes"] = k.nvme_read_bytes;
    }
    list.push_back(std::move(j));
  }
  return list;
}

std::string ExplainCandidates(const PlanOutcome& o, size_t most) {
  std::vector<const PlanCandidate*> fitting, short_of;
  std::map<std::string, int> tight;
  for (const PlanCandidate& k : o.candidates) {
    if (k.fits) {
      fitting.push_back(&k);
    } else {
      short_of.push_back(&k);
      ++tight[k.tightest];
    }
  }
  std::string out = "Candidates weighed: " + std::to_string(o.candidates.size()) + ", " +
                    std::to_string(fitting.size()) + " fit";
  for (auto it = tight.begin(); it != tight.end(); ++it) {
    out += (it == tight.begin() ? "; short of " : ", ") + it->first + ": " +
           std::to_string(it->second);
  }
  out += "\n";
  const bool lora = o.plan.job.lora.enabled();  // MakePlan sets the job when nothing fits too
  if (!fitting.empty()) {
    std::stable_sort(
        fitting.begin(), fitting.end(),
        [](const PlanCandidate* a, const PlanCandidate* b) { return Preferred(*a, *b); });
    const PlanCandidate& best = *fitting.front();
    out +=
        "The chosen plan and the fastest runners-up (at equal speed: the frozen base in RAM, "
        "then less NVMe space, fewer NVMe reads, less host memory, less GPU memory; acc: gradient "
        "accumulators per GPU):\n";
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "  %3s %9s %7s %6s %6s %4s %3s  %-34s %-9s %-9s %10s %10s %10s  %s\n", "#",
                  "s/step", "bubble", "micro", "stages", "tail", "acc", "activations", "optimizer",
                  lora ? "frozen" : "", "GPU", "host", "NVMe", "not chosen because");
    out += buf;
    for (size_t i = 0; i < fitting.size() && i <= most; ++i) {
      const PlanCandidate& k = *fitting[i];
      std::snprintf(
          buf, sizeof buf,
          "  %3zu %9.3f %6.1f%% %6d %6d %4d %3d  %-34s %-9s %-9s %10s %10s %10s  %s\n", i + 1,
          k.step_s, 100.0 * k.bubble_fraction, k.micro_batches, k.stages, k.tail_parts,
          k.grad_accumulators, ActivationsOf(k).c_str(), std::string(TierName(k.optimizer)).c_str(),
          lora ? std::string(TierName(k.frozen)).c_str() : "", FormatByteSize(k.gpu_bytes).c_str(),
          FormatByteSize(k.host_bytes).c_str(), FormatByteSize(k.nvme_bytes).c_str(),
          i == 0 ? "(chosen)" : LostOn(k, best).c_str());
      out += buf;
    }
  }
  // A candidate that does not fit: its choices, its step if it fit (against the chosen plan's),
  // and what it is short of.
  const PlanCandidate* chosen = fitting.empty() ? nullptr : fitting.front();
  auto misfit = [&](const PlanCandidate& k) {
    const uint64_t need = k.tightest_bytes;
    std::string step = "not simulated";
    if (k.step_s > 0) {
      step = Format("%.3f s/step", k.step_s);
      const double percent = chosen != nullptr ? 100.0 * (k.step_s / chosen->step_s - 1) : 0.0;
      if (chosen != nullptr) {
        step += std::abs(percent) >= 0.05 ? Format(" (%+.1f%%)", percent) : " (about the same)";
      }
    }
    return "  " + std::to_string(k.micro_batches) +
           (k.micro_batches == 1 ? " micro-batch, " : " micro-batches, ") +
           std::to_string(k.stages) + (k.stages == 1 ? " stage" : " stages") +
           (k.tail_parts > 1 ? ", the tail in " + std::to_string(k.tail_parts) + " parts" : "") +
           (k.grad_accumulators > 1 ? ", two gradient accumulators" : "") + ", activations " +
           ActivationsOf(k) + ", optimizer on " + std::string(TierName(k.optimizer)) +
           (lora ? ", frozen base on " + std::string(TierName(k.frozen)) : std::string()) + ": " +
           step + "; " + k.tightest + " " + FormatByteSize(need) +
           Format(", %.2fx what is usable\n", k.need_ratio);
  };
  // The first three of `list`, a candidate left out when one listed differs from it only in its
  // gradient accumulators (twins that need about the same and run about as fast).
  auto first_three = [&](const std::vector<const PlanCandidate*>& list) {
    std::vector<const PlanCandidate*> shown;
    for (const PlanCandidate* k : list) {
      if (shown.size() == 3) break;
      auto twin = [&](const PlanCandidate* s) {
        return std::tie(s->micro_batches, s->stages, s->tail_parts, s->policy, s->recomputed,
                        s->activations, s->optimizer, s->frozen) ==
               std::tie(k->micro_batches, k->stages, k->tail_parts, k->policy, k->recomputed,
                        k->activations, k->optimizer, k->frozen);
      };
      if (std::none_of(shown.begin(), shown.end(), twin)) shown.push_back(k);
    }
    std::string text;
    for (const PlanCandidate* k : shown) text += misfit(*k);
    return text;
  };
  if (!short_of.empty()) {
    // What more memory would buy: the fastest that do not fit, when faster than the chosen plan.
    std::vector<const PlanCandidate*> faster;
    for (const PlanCandidate* k : short_of) {
      if (k->step_s > 0 && (chosen == nullptr || k->step_s < chosen->step_s)) faster.push_back(k);
    }
    std::stable_sort(
        faster.begin(), faster.end(),
        [](const PlanCandidate* a, const PlanCandidate* b) { return a->step_s < b->step_s; });
    if (!faster.empty()) {
      out += chosen != nullptr ? "Faster if they fit (what more memory would buy):\n"
                               : "Fastest if they fit:\n";
    }
    out += first_three(faster);
    std::stable_sort(short_of.begin(), short_of.end(),
                     [](const PlanCandidate* a, const PlanCandidate* b) {
                       return a->need_ratio < b->need_ratio;
                     });
    out += "Closest to fitting:\n";
    out += first_three(short_of);
  }
  return out;
}

nlohmann::json PlanToJson(const Plan& p) {
  nlohmann::json j;
  j["model"] = p.model_name;
  j["hardware"] = p.hardware_name;
  j["gpus"] = p.gpus;
  j["global_batch"] = p.job.global_batch;
  j["seq_len"] = p.job.seq_len;
  j["lora_rank"] = p.job.lora.rank;
  j["compute_dtype"] = ComputeModeName(p.job);
  j["micro_batches"] = p.micro_batches;
  j["micro_batch_size"] = p.micro_batch_size;
  // The most documents a micro-batch holds (packed data; 0: one per sequence).
  j["max_documents"] = MicroBatchShape(p.job, p.micro_batch_size).max_documents;
  nlohmann::json stages = nlohmann::json::array();
  for (const LayerRange& s : p.stages) stages.push_back({s.first, s.last});
  j["forward_stages"] = stages;  // layer ranges [first, last); backward runs them reversed
  j["tail"] = "head+loss (fused)";
  j["tail_parts"] = p.tail_parts;                // its micro-batches split over this many devices
  j["grad_accumulators"] = p.grad_accumulators;  // per device: one per weight slot
  nlohmann::json recompute = nlohmann::json::array();
  for (size_t i = 0; i < p.recompute.size(); ++i) {
    if (p.recompute[i]) recompute.push_back(i);
  }
  j["activation_policy"] = p.activation_policy;
  j["recomputed_layers"] = recompute;
  j["tiers"] = {{"saved_activations", TierName(p.activations)},
                {"optimizer_state", TierName(p.optimizer_state)},
                {"frozen_weights", TierName(p.frozen_weights)}};
  // The frozen base is packed from the model's files, with no fp32 copy in RAM (PlanJob).
  j["frozen_base_from_files"] = p.job.frozen_base_from_files;
  // A base streamed from the model's files whose layout the plan lacks: its reads are counted
  // at the most they can take (else they are the drive's blocks it takes).
  if (p.frozen_weights == Tier::kNvme) j["frozen_base_reads_at_most"] = p.base_reads_at_most;
  j["updates"] = "synchronous";
  j["budgets"] = {
      {"gpu_bytes", p.gpu_budget}, {"host_bytes", p.host_budget}, {"nvme_bytes", p.nvme_budget}};
  j["memory"] = {{"per_gpu", TierToJson(p.memory.gpu)},
                 {"pinned_host", TierToJson(p.memory.pinned_host)},
                 {"pageable_host", TierToJson(p.memory.pageable_host)},
                 {"nvme", TierToJson(p.memory.nvme)}};
  j["predicted"] = {{"step_s", p.step_s},
                    {"update_mode", p.job.stale_updates ? "stale" : "synchronous"},
                    {"sync_step_s", p.sync_step_s},
                    {"stale_step_s", p.stale_step_s},
                    {"tokens_per_s", p.tokens_per_s},
                    {"bubble_fraction", p.bubble_fraction},
                    {"pcie_h2d_bytes_per_step", p.pcie_h2d_bytes},
                    {"pcie_d2h_bytes_per_step", p.pcie_d2h_bytes},
                    {"nvme_read_bytes_per_step", p.nvme_read_bytes},
                    {"nvme_write_bytes_per_step", p.nvme_write_bytes},
                    {"host_thread_s_per_step",
                     {{"weight_packing", p.host_pack_s},
                      {"gradient_adding", p.host_grad_add_s},
                      {"embedding", p.host_embedding_s}}}};
  const auto measured = std::count(p.measured_times.begin(), p.measured_times.end(), true);
  j["layer_times"] = {{"source", p.LayerTimeSource()},
                      {"measured_layers", measured},
                      {"layers", p.measured_times.size()}};
  j["warnings"] = p.warnings;
  return j;
}

nlohmann::json OutcomeToJson(const PlanOutcome& o) {
  nlohmann::json j;
  j["feasible"] = o.feasible;
  if (o.feasible) {
    j["plan"] = PlanToJson(o.plan);
    return j;
  }
  j["binding_constraint"] = o.binding;
  nlohmann::json list = nlohmann::json::array();
  for (const PlanSuggestion& s : o.suggestions) {
    list.push_back({{"change", s.change}, {"plan", PlanToJson(s.plan)}});
  }
  j["suggestions"] = list;
  return j;
}

namespace {

// How a LoRA plan's frozen base is held, after its tier: `converted` bytes of a copy on NVMe.
std::string FrozenBaseNote(const Plan& p, uint64_t converted) {
  if (p.frozen_weights != Tier::kNvme) {
    return p.job.frozen_base_from_files ? " (packed from the model's files, no fp32 copy)" : "";
  }
  std::string note =
      converted > 0 ? " (a copy converted at the start, " + Gib(converted) + ", streamed each step"
                    : " (streamed from the model's files each step";
  if (p.base_reads_at_most) {
    note +=
        "; their reads counted at the most they can take: plan the model's folder to count "
        "them";
  }
  return note + ")";
}

}  // namespace

std::string PlanSummary(const Plan& p) {
  std::string out = "Plan: " + p.model_name + " on " + p.hardware_name + "\n";
  out += "  job: batch " + std::to_string(p.job.global_batch) + " x " +
         std::to_string(p.job.seq_len) + " tokens, " +
         (p.job.lora.enabled() ? "LoRA rank " + std::to_string(p.job.lora.rank) +
                                     (p.job.lora.quantize == BaseQuant::kNf4
                                          ? std::string(" over an NF4 base (QLoRA)")
                                          : std::string())
                               : std::string("full fine-tuning")) +
         ", " + ComputeModeName(p.job) + "\n";
  const int64_t documents = MicroBatchShape(p.job, p.micro_batch_size).max_documents;
  out += "  micro-batches: " + std::to_string(p.micro_batches) + " of " +
         std::to_string(p.micro_batch_size) + " sequence(s)" +
         (documents > 0 ? ", up to " + std::to_string(documents) + " packed documents" : "") + "\n";
  out += "  stages: " + std::to_string(p.stages.size()) + " forward, " +
         std::to_string(p.stages.size()) + " backward (layers";
  for (const LayerRange& s : p.stages) {
    out += " " + std::to_string(s.first) + "-" + std::to_string(s.last - 1);
  }
  out += "), fused head+loss tail";
  if (p.tail_parts > 1) {
    out += " in " + std::to_string(p.tail_parts) + " parts (its micro-batches over " +
           std::to_string(p.tail_parts) + " GPUs)";
  }
  out += "; round-robin over " + std::to_string(p.gpus) + " GPU(s)";
  if (p.grad_accumulators > 1) {
    out += ", two gradient accumulators per GPU (one per weight slot)";
  }
  out += "\n";
  int recomputed = 0;
  for (bool r : p.recompute) recomputed += r ? 1 : 0;
  // A streamed base's copy on NVMe (none: the model's files serve it).
  const uint64_t converted = p.memory.nvme.bytes_of("weights.frozen");
  out +=
      "  activations: " + p.activation_policy + " (" + std::to_string(recomputed) +
      " layers recomputed), saved on " + std::string(TierName(p.activations)) +
      "; optimizer state on " + std::string(TierName(p.optimizer_state)) +
      (p.job.lora.enabled() ? "; frozen weights on " + std::string(TierName(p.frozen_weights)) +
                                  FrozenBaseNote(p, converted)
                            : std::string()) +
      (p.job.stale_updates ? "; one-step-stale updates (opted in)\n" : "; synchronous updates\n");
  out += Format("  predicted: %.3f s/step, %.0f tokens/s, bubble %.1f%%\n", p.step_s,
                p.tokens_per_s, 100.0 * p.bubble_fraction);
  const auto measured = std::count(p.measured_times.begin(), p.measured_times.end(), true);
  const std::string layers = std::to_string(p.measured_times.size());
  std::string times = "FLOP formulas; no layer measured in the hardware profile";
  if (size_t(measured) == p.measured_times.size() && measured > 0) {
    times = "all " + layers + " layers measured in the hardware profile";
  } else if (measured > 0) {
    times = std::to_string(measured) + " of " + layers +
            " layers measured in the hardware profile, the rest from FLOP formulas";
  }
  out += "  layer times: " + std::string(p.LayerTimeSource()) + " (" + times + ")\n";
  out += Format("  updates: synchronous %.3f s/step, one-step-stale %.3f s/step (%+.1f%%)\n",
                p.sync_step_s, p.stale_step_s,
                p.sync_step_s > 0 ? 100.0 * (p.stale_step_s / p.sync_step_s - 1) : 0.0);
  out += Format(
             "  traffic per step: PCIe h2d %.2f GB, d2h %.2f GB, NVMe read "
             "%.2f GB",
             p.pcie_h2d_bytes / 1e9, p.pcie_d2h_bytes / 1e9, p.nvme_read_bytes / 1e9) +
         Format(", NVMe written %.2f GB\n", p.nvme_write_bytes / 1e9);
  // In milliseconds: a LoRA job's packing (adapters only) takes a few.
  out += Format(
      "  host thread per step: weight packing %.1f ms, gradient adding %.1f ms, embedding %.1f "
      "ms\n",
      1e3 * p.host_pack_s, 1e3 * p.host_grad_add_s, 1e3 * p.host_embedding_s);
  out += "Memory (exact, alignment included):\n";
  TableRows(out, "each GPU", p.memory.gpu, p.gpu_budget);
  TableRows(out, "pinned host", p.memory.pinned_host, 0);
  TableRows(out, "pageable host", p.memory.pageable_host, 0);
  out += "  host total: " + Gib(p.memory.pinned_host.total() + p.memory.pageable_host.total()) +
         " of " + Gib(p.host_budget) + "\n";
  if (!p.memory.nvme.allocations.empty()) TableRows(out, "NVMe", p.memory.nvme, p.nvme_budget);
  for (const std::string& w : p.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string OutcomeSummary(const PlanOutcome& o) {
  if (o.feasible) return PlanSummary(o.plan);
  std::string out = "Nothing fits. " + o.binding + "\n";
  if (o.suggestions.empty()) {
    out +=
        "No single change among a shorter sequence, one sequence per "
        "micro-batch, LoRA, more "
        "RAM or an NVMe directory fits.\n";
  }
  for (const PlanSuggestion& s : o.suggestions) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "  fits with %-44s -> %.3f s/step, %.0f tokens/s\n",
                  s.change.c_str(), s.plan.step_s, s.plan.tokens_per_s);
    out += buf;
  }
  return out;
}

}  // namespace ferry::plan
