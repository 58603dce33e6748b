#include "engine/plan/pipeline_schedules.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

namespace ferry::plan {
namespace {

constexpr int kNone = -1;

SimTask MakeTask(std::string name, TaskKind kind, LaneId lane, int stage, int micro_batch) {
  SimTask t;
  t.name = std::move(name);
  t.kind = kind;
  t.lane = lane;
  t.stage = stage;
  t.micro_batch = micro_batch;
  return t;
}

std::string Tag(char letter, int stage, int micro_batch) {
  std::string s = letter + std::to_string(stage);
  if (micro_batch >= 0) s += "." + std::to_string(micro_batch);
  return s;
}

void AddDep(Schedule& s, int task, int dep) {
  if (task != kNone && dep != kNone) s.tasks[task].deps.push_back(dep);
}

// Adds the host-memory task of `work` for micro-batch j after `deps` (none: kNone).
int AddHostWork(Schedule& s, const HostWork& work, std::string name, TaskKind kind, int j,
                std::initializer_list<int> deps) {
  if (work.seconds <= 0 && work.bytes <= 0) return kNone;
  SimTask t = MakeTask(std::move(name), kind, {LaneKind::kHostMemory, 0}, -1, j);
  if (work.seconds > 0) {
    t.duration_s = work.seconds;
  } else {
    t.bytes = work.bytes;
  }
  for (int d : deps) {
    if (d != kNone) t.deps.push_back(d);
  }
  return s.Add(std::move(t));
}

Status CheckStages(const std::vector<StageCost>& stages, int micro_batches, const char* what) {
  if (micro_batches < 1) {
    return Status::InvalidArgument(std::string(what) + ": micro_batches must be >= 1");
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageCost& c = stages[i];
    for (double v : {c.fwd_s, c.bwd_s, c.weight_bytes, c.input_bytes, c.output_bytes, c.grad_bytes,
                     c.param_count, c.gpu_optimizer_s, c.pack.seconds, c.pack.bytes,
                     c.add_grads.seconds, c.add_grads.bytes}) {
      if (!(v >= 0)) {
        return Status::InvalidArgument(std::string(what) + ": stage " + std::to_string(i) +
                                       " has a negative or NaN cost");
      }
    }
  }
  return Status::Ok();
}

// One entry of a GPU's compute order in a pinned-stage schedule.
struct Step {
  bool backward;
  int micro_batch;
};

// Builds a schedule with stage s pinned to GPU s, running the steps in `order[s]`.
Result<Schedule> BuildPinned(const char* name, const std::vector<StageCost>& stages, int m,
                             const std::vector<std::vector<Step>>& order) {
  const int p = static_cast<int>(stages.size());
  Schedule s;
  s.name = name;
  s.gpus = p;
  using Table = std::vector<std::vector<int>>;
  Table f(p, std::vector<int>(m, kNone)), b = f, f_in = f, f_out = f, b_in = f, b_out = f;
  for (int st = 0; st < p; ++st) {
    const LaneId compute{LaneKind::kCompute, st}, h2d{LaneKind::kHostToDevice, st},
        d2h{LaneKind::kDeviceToHost, st};
    const double in_bytes = st > 0 ? stages[st - 1].output_bytes : 0;   // from stage st-1
    const double out_bytes = st < p - 1 ? stages[st].output_bytes : 0;  // to stage st+1
    // Adds a transfer of `bytes` (none when 0) and returns its index or kNone.
    auto transfer = [&](char letter, TaskKind kind, LaneId lane, double bytes, int stage, int j) {
      if (bytes <= 0) return kNone;
      SimTask t = MakeTask(Tag(letter, stage, j), kind, lane, stage, j);
      t.bytes = bytes;
      return s.Add(std::move(t));
    };
    auto run = [&](char letter, TaskKind kind, double seconds, int stage, int j) {
      SimTask t = MakeTask(Tag(letter, stage, j), kind, compute, stage, j);
      t.duration_s = seconds;
      return s.Add(std::move(t));
    };
    for (const Step& step : order[st]) {
      const int j = step.micro_batch;
      if (!step.backward) {
        // Forward: the boundary activation comes in from stage st-1 and goes out to st+1.
        f_in[st][j] = transfer('I', TaskKind::kActivationUpload, h2d, in_bytes, st, j);
        f[st][j] = run('F', TaskKind::kForward, stages[st].fwd_s, st, j);
        f_out[st][j] = transfer('O', TaskKind::kActivationDownload, d2h, out_bytes, st, j);
      } else {
        // Backward: the gradient of the output comes back from st+1; the input's goes to st-1.
        b_in[st][j] = transfer('I', TaskKind::kActivationUpload, h2d, out_bytes, st, j);
        b[st][j] = run('B', TaskKind::kBackward, stages[st].bwd_s, st, j);
        b_out[st][j] = transfer('O', TaskKind::kActivationDownload, d2h, in_bytes, st, j);
      }
    }
    if (stages[st].gpu_optimizer_s > 0) {
      SimTask t = MakeTask(Tag('U', st, -1), TaskKind::kOptimizer, compute, st, -1);
      t.duration_s = stages[st].gpu_optimizer_s;
      s.Add(std::move(t));  // after the last backward by lane order
    }
  }
  for (int st = 0; st < p; ++st) {
    for (int j = 0; j < m; ++j) {
      if (st > 0) {
        AddDep(s, f_in[st][j], f_out[st - 1][j]);
        AddDep(s, f[st][j], f_in[st][j] != kNone ? f_in[st][j] : f[st - 1][j]);
      }
      AddDep(s, f_out[st][j], f[st][j]);
      AddDep(s, b[st][j], f[st][j]);
      if (st < p - 1) {
        AddDep(s, b_in[st][j], b_out[st + 1][j]);
        AddDep(s, b[st][j], b_in[st][j] != kNone ? b_in[st][j] : b[st + 1][j]);
      }
      AddDep(s, b_out[st][j], b[st][j]);
    }
  }
  return s;
}

}  // namespace

Result<Schedule> BuildGpipeSchedule(const std::vector<StageCost>& stages, int micro_batches) {
  FERRY_RETURN_IF_ERROR(CheckStages(stages, micro_batches, "GPipe"));
  if (stages.empty()) return Status::InvalidArgument("GPipe: needs at least one stage");
  std::vector<std::vector<Step>> order(stages.size());
  for (auto& o : order) {
    for (int j = 0; j < micro_batches; ++j) o.push_back({false, j});
    for (int j = 0; j < micro_batches; ++j) o.push_back({true, j});
  }
  return BuildPinned("GPipe", stages, micro_batches, order);
}

Result<Schedule> Build1F1BSchedule(const std::vector<StageCost>& stages, int micro_batches) {
  FERRY_RETURN_IF_ERROR(CheckStages(stages, micro_batches, "1F1B"));
  if (stages.empty()) return Status::InvalidArgument("1F1B: needs at least one stage");
  const int p = static_cast<int>(stages.size());
  const int m = micro_batches;
  std::vector<std::vector<Step>> order(p);
  for (int st = 0; st < p; ++st) {
    const int warmup = std::min(p - st - 1, m);
    for (int j = 0; j < warmup; ++j) order[st].push_back({false, j});
    for (int i = 0; i < m - warmup; ++i) {
      order[st].push_back({false, warmup + i});
      order[st].push_back({true, i});
    }
    for (int j = m - warmup; j < m; ++j) order[st].push_back({true, j});
  }
  return BuildPinned("1F1B", stages, m, order);
}

char StepStageLetter(int stage, int forward_stages, int tail_parts) {
  switch (StepStageKind(stage, forward_stages, tail_parts)) {
    case TaskKind::kForward:
      return 'F';
    case TaskKind::kTail:
      return 'T';
    default:
      return 'B';
  }
}

std::string RoundRobinTaskName(char what, int stage, int forward_stages, int micro_batch,
                               int tail_parts) {
  const char letter = StepStageLetter(stage, forward_stages, tail_parts);
  std::string n(1, what);
  if (what != letter) n += letter;  // e.g. "IB2.0": input of backward stage 2
  if (letter != 'T') {
    n += std::to_string(stage < forward_stages ? stage : stage - forward_stages - tail_parts);
  } else if (tail_parts > 1 && micro_batch < 0) {  // a part's own task: "WT1", "GT0"
    n += std::to_string(stage - forward_stages);
  }
  if (micro_batch >= 0) n += "." + std::to_string(micro_batch);
  return n;
}

Result<Schedule> BuildRoundRobinSchedule(const RoundRobinJob& job) {
  if (job.gpus < 1) return Status::InvalidArgument("round-robin: gpus must be >= 1");
  const int P = job.tail_parts;
  if (P < 1 || P > std::min(job.micro_batches, job.gpus)) {
    return Status::InvalidArgument("round-robin: tail_parts must be 1 to min(micro-batches, gpus)");
  }
  std::vector<StageCost> all = job.forward;
  for (int p = 0; p < P; ++p) {  // the tail's update follows its last part
    all.push_back(job.tail);
    if (p + 1 < P) all.back().param_count = 0;
  }
  all.insert(all.end(), job.backward.begin(), job.backward.end());
  FERRY_RETURN_IF_ERROR(CheckStages(all, job.micro_batches, "round-robin"));
  for (const HostWork& w : {job.embedding_forward, job.embedding_backward}) {
    if (!(w.seconds >= 0) || !(w.bytes >= 0)) {
      return Status::InvalidArgument("round-robin: the embedding has a negative or NaN cost");
    }
  }
  if (job.weight_chunks < 0) {
    return Status::InvalidArgument("round-robin: weight_chunks must be >= 0");
  }
  if (job.grad_accumulators < 1 || job.grad_accumulators > 2) {
    return Status::InvalidArgument("round-robin: grad_accumulators must be 1 or 2");
  }
  const int K = static_cast<int>(all.size());
  const int G = job.gpus;
  const int m = job.micro_batches;
  const int nf = static_cast<int>(job.forward.size());
  const int chunks = job.weight_chunks > 0 ? job.weight_chunks : m;
  const bool first_ahead = job.first_weights_ahead && !job.streamed_base;

  auto kind_of = [&](int k) { return StepStageKind(k, nf, P); };
  auto letter_of = [&](int k) { return StepStageLetter(k, nf, P); };
  auto name_of = [&](char prefix, int k, int j) { return RoundRobinTaskName(prefix, k, nf, j, P); };
  // The micro-batches stage k runs: [lo(k), hi(k)) (a tail part its share, every other stage all).
  auto lo = [&](int k) {
    return kind_of(k) == TaskKind::kTail ? int(TailPartStart(k - nf, m, P)) : 0;
  };
  auto hi = [&](int k) {
    return kind_of(k) == TaskKind::kTail ? int(TailPartStart(k - nf + 1, m, P)) : m;
  };

  Schedule s;
  s.name = "round-robin";
  s.gpus = G;
  std::vector<std::vector<int>> compute(K, std::vector<int>(m, kNone)), in = compute, out = compute;
  std::vector<int> weights_last(K, kNone);
  std::vector<int> grads_of(K, kNone);                   // each stage's gradient download, if any
  std::vector<int> gather(m, kNone), scatter(m, kNone);  // the embedding's, per micro-batch
  for (int j = 0; j < m; ++j) {
    gather[j] = AddHostWork(s, job.embedding_forward, "E." + std::to_string(j), TaskKind::kForward,
                            j, {j > 0 ? gather[j - 1] : kNone});
  }
  // The host thread's work, one task after another (`host`: its last task so far): the gathers,
  // then the packing in enqueue order (stage k < G as it is enqueued, stage k + G while stage k
  // is), each layer range's once, by the first of its stages (forward or backward) prepared;
  // its work is the forward stage's (or the tail's) StageCost::pack.
  int host = m > 0 ? gather[m - 1] : kNone;
  // A backward stage runs a forward stage's layers when the partitions are the same; the tail's
  // parts run one range.
  const bool mirrored = job.backward.size() == job.forward.size();
  auto range_of = [&](int k) {
    return k < nf ? k : k < nf + P ? nf : mirrored ? StepStageRange(k, nf, P) : k;
  };
  std::vector<int> pack_of(K, kNone);
  std::vector<bool> prepared(K, false);
  // Each stage's weight buffer as the executor places it (StageRoundRobin, stage k on GPU k mod
  // G), and the stage before it there (kNone: none this step).
  std::vector<int> slot_before(size_t(K), kNone);
  {
    std::vector<int> ranges;
    for (int k = 0; k < K; ++k) ranges.push_back(range_of(k));
    const std::vector<StageRoundRobin::Placement> at = StageRoundRobin(G).Place(K, false, ranges);
    std::vector<int> last(size_t(2 * G), kNone);
    for (int k = 0; k < K; ++k) {
      slot_before[size_t(k)] = std::exchange(last[size_t(2 * at[k].device + at[k].slot)], k);
    }
  }
  // Stage k finds its weights in its buffer: the stage before it there was the forward stage over
  // its layers (backward stage k runs forward stage 2 nf + P - 1 - k's layers).
  auto resident = [&](int k) {
    return k >= nf + P && slot_before[size_t(k)] != kNone &&
           slot_before[size_t(k)] == StepStageRange(k, nf, P);
  };
  std::vector<int> image_first(K, kNone);  // streamed: the first task of stage k's packing
  auto add_pack = [&](int k) {
    if (job.streamed_base) {    // the stage's own image, its base read first unless held
      if (resident(k)) return;  // its slot holds all of its weights: nothing to pack
      const bool held = size_t(k) < job.base_resident.size() && job.base_resident[size_t(k)];
      int read = kNone;
      if (!held && all[k].base_read_bytes > 0) {
        SimTask t =
            MakeTask(name_of('R', k, -1), TaskKind::kNvmeRead, {LaneKind::kNvmeRead, 0}, k, -1);
        t.bytes = all[k].base_read_bytes;
        if (host != kNone) t.deps.push_back(host);
        read = host = s.Add(std::move(t));
      }
      const int t = AddHostWork(s, held ? all[k].trainable_pack : all[k].full_pack,
                                name_of('P', k, -1), TaskKind::kWeightPack, -1, {host, read});
      if (t != kNone) s.tasks[t].stage = k;
      pack_of[k] = t != kNone ? t : read;
      image_first[k] = read != kNone ? read : t;
      if (pack_of[k] != kNone) host = pack_of[k];
      return;
    }
    const int r = range_of(k);
    if (prepared[r] || (r == 0 && first_ahead)) return;
    prepared[r] = true;
    const int t =
        AddHostWork(s, all[r].pack, name_of('P', k, -1), TaskKind::kWeightPack, -1, {host});
    if (t == kNone) return;
    s.tasks[t].stage = k;
    pack_of[r] = host = t;
  };
  for (int k = 0; k < K; ++k) {
    if (k < G) add_pack(k);
    if (k + G < K) add_pack(k + G);
  }
  // The packing a stage's upload waits for: its layer range's (streamed: its own).
  auto packed = [&](int k) { return pack_of[job.streamed_base ? k : range_of(k)]; };

  // What micro-batch j of stage k waits for: the output (or compute) of the stage before it that
  // ran j (the tail's part that ran it, for the first backward stage), or the embedding's gather
  // for the first stage.
  auto before = [&](int k, int j) {
    int b = k - 1;
    while (b >= 0 && (j < lo(b) || j >= hi(b))) --b;
    if (b < 0) return gather[j];
    return out[b][j] != kNone ? out[b][j] : compute[b][j];
  };
  auto last_of = [&](int k) { return compute[k][hi(k) - 1]; };  // stage k's last computation

  auto add_weight_chunk = [&](int k, int c) {
    const int d = k % G;
    SimTask t = MakeTask(name_of('W', k, -1) + "/" + std::to_string(c), TaskKind::kWeightUpload,
                         {LaneKind::kHostToDevice, d}, k, -1);
    const bool base = size_t(k) < job.base_resident.size() && job.base_resident[size_t(k)];
    t.bytes = (base ? all[k].trainable_weight_bytes : all[k].weight_bytes) / chunks;
    if (slot_before[size_t(k)] != kNone) t.deps.push_back(last_of(slot_before[size_t(k)]));
    if (packed(k) != kNone) t.deps.push_back(packed(k));
    weights_last[k] = s.Add(std::move(t));
  };

  for (int k = 0; k < K; ++k) {
    const int d = k % G;
    const StageCost& c = all[k];
    if (k < G && c.weight_bytes > 0 && !(k == 0 && first_ahead)) {
      for (int ch = 0; ch < chunks; ++ch) add_weight_chunk(k, ch);
    }
    const int next = k + G < K ? k + G : kNone;
    int next_chunk = 0;
    const int first = lo(k), count = hi(k) - lo(k);
    for (int j = first; j < hi(k); ++j) {
      if (c.input_bytes > 0) {
        SimTask t = MakeTask(name_of('I', k, j), TaskKind::kActivationUpload,
                             {LaneKind::kHostToDevice, d}, k, j);
        t.bytes = c.input_bytes;
        if (before(k, j) != kNone) t.deps.push_back(before(k, j));
        in[k][j] = s.Add(std::move(t));
      }
      // The next stage's weight chunks queue behind this stage's activation uploads.
      while (next != kNone && all[next].weight_bytes > 0 && !resident(next) &&
             next_chunk < chunks && static_cast<long>(next_chunk) * count / chunks <= j - first) {
        add_weight_chunk(next, next_chunk++);
      }
    }
    for (int j = first; j < hi(k); ++j) {
      SimTask t = MakeTask(name_of(letter_of(k), k, j), kind_of(k), {LaneKind::kCompute, d}, k, j);
      t.duration_s = kind_of(k) == TaskKind::kForward ? c.fwd_s
                     : kind_of(k) == TaskKind::kTail  ? c.fwd_s + c.bwd_s
                                                      : c.bwd_s;
      if (in[k][j] != kNone) {
        t.deps.push_back(in[k][j]);
      } else if (before(k, j) != kNone) {
        t.deps.push_back(before(k, j));
      }
      if (weights_last[k] != kNone) t.deps.push_back(weights_last[k]);
      compute[k][j] = s.Add(std::move(t));
    }
    if (job.executor_buffers) {
      const int slots = std::max(job.input_slots, 1);
      for (int j = first + slots; j < hi(k); ++j) AddDep(s, in[k][j], compute[k][j - slots]);
      // ... or the gradients its first micro-batch zeroes (its accumulator's last user on the
      // device: the stage before it, or with two accumulators, one per weight buffer, the stage
      // before it in its buffer).
      const int prior =
          job.grad_accumulators == 1 ? (k >= G ? k - G : kNone) : slot_before[size_t(k)];
      if (prior != kNone && c.grad_bytes > 0) AddDep(s, compute[k][first], grads_of[prior]);
    }
    if (c.output_bytes > 0) {
      for (int j = first; j < hi(k); ++j) {
        SimTask t = MakeTask(name_of('O', k, j), TaskKind::kActivationDownload,
                             {LaneKind::kDeviceToHost, d}, k, j);
        t.bytes = c.output_bytes;
        t.deps.push_back(compute[k][j]);
        out[k][j] = s.Add(std::move(t));
      }
      if (job.executor_buffers) {
        for (int j = first + 2; j < hi(k); ++j) {
          // Micro-batch j's input lands in the buffer j - 2's output left (three turn over; a
          // kept forward stage's input has an entry of its own, an approximation there) ...
          AddDep(s, in[k][j], out[k][j - 2]);
          // ... and a forward stage's layers write the hidden buffers and saved slots whose
          // downloads the layers before them started: its compute runs at most about a
          // micro-batch ahead of its downloads, so a stage that downloads more than it computes
          // runs at the download's pace.
          if (kind_of(k) == TaskKind::kForward) AddDep(s, compute[k][j], out[k][j - 2]);
        }
      }
    }
    int grads = kNone;
    if (c.grad_bytes > 0) {
      SimTask t = MakeTask(name_of('G', k, -1), TaskKind::kGradientDownload,
                           {LaneKind::kDeviceToHost, d}, k, -1);
      t.bytes = c.grad_bytes;
      t.deps.push_back(last_of(k));
      grads = s.Add(std::move(t));
      grads_of[k] = grads;
    }
    const int landed = grads != kNone ? grads : last_of(k);
    const int added = AddHostWork(s, c.add_grads, name_of('A', k, -1), TaskKind::kGradientAdd, -1,
                                  {landed, host});
    if (added != kNone) {
      s.tasks[added].stage = k;
      host = added;
    }
    if (k == K - 1) {  // the last backward stage: its input gradient feeds the scatter-add
      for (int j = 0; j < m; ++j) {
        scatter[j] = AddHostWork(
            s, job.embedding_backward, "EB." + std::to_string(j), TaskKind::kBackward, j,
            {out[k][j] != kNone ? out[k][j] : compute[k][j], j > 0 ? scatter[j - 1] : host});
      }
    }
    if (c.param_count > 0) {
      SimTask t =
          MakeTask(name_of('U', k, -1), TaskKind::kOptimizer, {LaneKind::kCpuOptimizer, 0}, k, -1);
      t.bytes = c.param_count * kAdamWBytesPerParameter;
      t.deps.push_back(added != kNone ? added : landed);
      if (k == K - 1 && scatter[m - 1] != kNone) t.deps.push_back(scatter[m - 1]);
      s.Add(std::move(t));
    }
  }
  // Streamed: a stage packs the device's image its stage before last uploaded from, once that
  // upload is done (the host thread waits for it).
  for (int k = 2 * G; job.streamed_base && k < K; ++k)
    AddDep(s, image_first[k], weights_last[k - 2 * G]);
  return s;
}

std::vector<StageRoundRobin::Placement> StageRoundRobin::Place(int stages, bool resume,
                                                               std::span<const int> ranges) {
  std::vector<Placement> out;
  std::vector<int> before(size_t(gpus_), -1);  // per device: its stage before, in this step
  for (int k = 0; k < stages; ++k) {
    if (k == 0 && resume && last_) {
      counter_ = last_->device;
      runs_[size_t(last_->device)] = last_->slot;
    }
    const int d = int(counter_++ % gpus_);
    const int b = before[size_t(d)];
    before[size_t(d)] = k;
    if (b >= 0 && size_t(k) < ranges.size() && ranges[size_t(b)] == ranges[size_t(k)]) {
      out.push_back({d, out[size_t(b)].slot});  // its weights are there
      continue;
    }
    out.push_back({d, int(runs_[size_t(d)]++ % 2)});
  }
  if (!out.empty()) last_ = out.back();
  return out;
}

std::vector<int> StepStageRanges(int forward_stages, int tail_parts) {
  std::vector<int> ranges;
  for (int i = 0; i < 2 * forward_stages + tail_parts; ++i) {
    ranges.push_back(StepStageRange(i, forward_stages, tail_parts));
  }
  return ranges;
}

std::vector<bool> ResidentBases(const std::vector<int>& ranges, int gpus) {
  StageRoundRobin rr(gpus);
  std::vector<int> held(size_t(2 * gpus), -1);  // per device and slot: the range it holds
  std::vector<bool> resident(ranges.size(), false);
  // Enough steps for the placement to settle into its cycle; the last one is reported.
  const int steps = 2 * gpus + 2;
  for (int step = 0; step < steps; ++step) {
    const std::vector<StageRoundRobin::Placement> at = rr.Place(int(ranges.size()), true, ranges);
    for (size_t k = 0; k < ranges.size(); ++k) {
      int& h = held[size_t(2 * at[k].device + at[k].slot)];
      if (step + 1 == steps) resident[k] = h == ranges[k];
      h = ranges[k];
    }
  }
  return resident;
}

}  // namespace ferry::plan
