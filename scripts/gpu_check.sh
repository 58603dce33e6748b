#!/usr/bin/env bash
# The one prepared GPU check, for a session lent a GPU machine (one H200, sm_90; 16 cores; no
# network, none of Debian's -dev libraries, 15 minutes in all). It configures and builds NOTHING:
# it runs from the bundle that scripts/gpu_bundle.sh builds beforehand on a machine with the -dev
# libraries (gpu-bundle/, git-ignored, at most 50 MiB). In order, each step under a timeout, in at
# most about 6 minutes: the GPU (nvidia-smi; no GPU fails here, at once), the bundle unpacked, the
# libraries each binary resolves (ldd) and the cuBLAS/cuDNN/driver versions compiled against and
# found at run time, the CUDA tests with FERRY_REQUIRE_GPU=1 (they must run, not skip) and how many
# ran, `ferry probe` (GEMM TFLOP/s, PCIe GB/s), a ~1B Llama job (random weights made on the device
# by scripts/gpu_check_job.py) as probe -> plan -> train with --gpu-memory 4GiB and uncapped ->
# ferry eval -> transformers loading and scoring the trained folders, any GPU benchmark in the
# bundle, then a summary.
#
# How to call it through the device tool (after `scripts/gpu_bundle.sh` here):
#   run  carry: ["gpu-bundle"]  command: "scripts/gpu_check.sh"  timeout_s: 400
# The script's own steps end within 360 s (deadline below); 400 s leaves the 15-minute window
# room for a machine start (a minute or two) and one rerun. Logs come back in
# $OUT/gpu_check_logs (ldd.log, kernels_tests.log, engine_tests.log, probe.log, probe.json,
# job_*.log).
# Locally (no GPU) it fails within a second with "no GPU".
# Environment: FERRY_GPU_BUNDLE (default gpu-bundle/ferry-gpu-bundle.tar.xz),
# FERRY_GPU_CHECK_JOB_CONFIG (the job's Llama config; default configs/models/llama-3.2-1b.json),
# FERRY_GPU_CHECK_CAPS (the job's --gpu-memory runs; default "4GiB uncapped"),
# FERRY_GPU_CHECK_TESTS (0 skips the CUDA tests, for a second call that only profiles the job).
# Each training run writes its trace (job_trace_<cap>.json); scripts/trace_summary.py puts its
# median step's lanes in the summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
bundle=${FERRY_GPU_BUNDLE:-gpu-bundle/ferry-gpu-bundle.tar.xz}
logs=${OUT:-build-gpu-check}/gpu_check_logs  # under $OUT on a device machine, so the logs come back
mkdir -p "$logs"
started=$SECONDS
# The step timeouts up to the probe add up to this (nvidia-smi 15, unpack 20, python 15+15, ldd
# 4x5, CUDA tests 130+60, probe 85); they are ceilings, and the 1B job's steps (each cut to what
# is left: about 3 minutes when the tests and probe take their usual 2) and the GPU benchmarks
# get what is left of it.
deadline=360
summary=()
test_failures=()
fail() {
  echo "gpu_check: FAILED: $*" >&2
  # CUDA test failures are otherwise reported at the end, which a later failure never reaches.
  ((${#test_failures[@]} == 0)) || printf '  CUDA tests: %s\n' "${test_failures[@]}" >&2
  ((${#summary[@]} == 0)) || printf '  %s\n' "${summary[@]}" >&2
  exit 1
}
phase() { echo; echo "== $* ($((SECONDS - started)) s) =="; }

phase "GPU"
command -v nvidia-smi >/dev/null || fail "no GPU: nvidia-smi not found"
gpus=$(timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) ||
  fail "no GPU: nvidia-smi: $gpus"
[[ -n $gpus ]] || fail "no GPU: nvidia-smi lists none"
echo "$gpus"
summary+=("GPU: $(echo "$gpus" | head -1) ($(echo "$gpus" | wc -l) visible)")

phase "bundle ($bundle)"
[[ -f $bundle ]] || fail "no bundle at $bundle: run scripts/gpu_bundle.sh and carry gpu-bundle"
root=$(mktemp -d "${TMPDIR:-/tmp}/ferry-gpu-bundle.XXXXXX")
trap 'rm -rf "$root"' EXIT
timeout 20 tar -C "$root" -xJf "$bundle" || fail "cannot unpack $bundle"
bin=$root/ferry-gpu-bundle
sed -n 1,7p "$bin/MANIFEST.txt"

# CUDA's libraries come from the device: its toolkit, then PyTorch's nvidia/*/lib (cuDNN is only
# there). The bundle's own lib/ comes first through the binaries' DT_RPATH.
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && cuda_dirs+=("$d")
done
pip_dirs=$(timeout 15 python3 -c '
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
found = {os.path.dirname(p) for d in nvidia.__path__
         for p in glob.glob(os.path.join(d, "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(found)))' 2>/dev/null)
[[ -n $pip_dirs ]] && cuda_dirs+=("$pip_dirs")
cuda_path=$(IFS=:; echo "${cuda_dirs[*]}")
export LD_LIBRARY_PATH=$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "CUDA library dirs: ${cuda_path:-none found}"

phase "libraries (ldd)"
ldd_log=$logs/ldd.log
: >"$ldd_log"
for f in "$bin"/* "$bin"/lib/libopenblas.so.0; do
  [[ -f $f && -x $f || $f == *.so* ]] || continue
  # A library's own needs (OpenBLAS's libgfortran) are found at run time through the executable's
  # DT_RPATH; ldd of the library alone needs lib/ named.
  lib_path=$LD_LIBRARY_PATH
  [[ $f == */lib/* ]] && lib_path=$bin/lib:$LD_LIBRARY_PATH
  { echo "-- ${f#"$root"/}"; LD_LIBRARY_PATH=$lib_path timeout 5 ldd "$f" 2>&1; } >>"$ldd_log"
done
sed "s|$root/||" "$ldd_log"
if grep -q "not found" "$ldd_log"; then
  fail "libraries not found: $(grep "not found" "$ldd_log" | sort -u | tr -s ' \t' ' ' | paste -sd,)"
fi
from_bundle=$(grep -o "=> $bin/lib/[^ ]*" "$ldd_log" | sort -u | wc -l)
summary+=("libraries: all resolved ($from_bundle from the bundle's lib/)")

phase "versions"
compiled=$(grep -E "^(nvcc|cuBLAS headers|cuDNN|cudart):" "$bin/MANIFEST.txt" | paste -sd';')
echo "compiled: $compiled"
resolved() { grep -m1 -o "$1[^ ]* => [^ ]*" "$ldd_log" | awk '{ print $3 }'; }
runtime=$(timeout 15 python3 - "$(resolved libcublasLt.so)" "$(resolved libcudart.so)" \
  "$(resolved libcudnn.so)" <<'EOF' 2>&1
import ctypes, ctypes.util, sys
out = []
def load(*names):
    for n in names:
        if not n:
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    return None
rt = load(sys.argv[2], "libcudart.so.13")
if rt:
    v = ctypes.c_int()
    rt.cudaRuntimeGetVersion(ctypes.byref(v))
    out.append("cudart %d" % v.value)
else:
    out.append("cudart not loadable (or linked statically)")
lt = load(sys.argv[1], "libcublasLt.so.13", "libcublasLt.so.12")
if lt:
    lt.cublasLtGetVersion.restype = ctypes.c_size_t
    out.append("cuBLASLt %d" % lt.cublasLtGetVersion())
else:
    out.append("cuBLASLt not loadable")
# The one ferry's binaries resolve (PyTorch's nvidia/cudnn/lib on the GPU machine): attention
# refuses a ragged layout on sm_8x/sm_12x below 9.18.1 (91801), so the number matters.
dnn = load(sys.argv[3], "libcudnn.so.9", ctypes.util.find_library("cudnn"))
if dnn:
    dnn.cudnnGetVersion.restype = ctypes.c_size_t
    out.append("cuDNN %d (%s)" % (dnn.cudnnGetVersion(), sys.argv[3] or "by name"))
else:
    out.append("cuDNN not found (ferry's attention needs libcudnn.so.9)")
drv = load("libcuda.so.1")
if drv:
    v = ctypes.c_int()
    drv.cuDriverGetVersion(ctypes.byref(v))
    out.append("driver API %d" % v.value)
print("; ".join(out))
EOF
)
echo "runtime: $runtime"
summary+=("compiled: $compiled" "runtime: $runtime")

# The CUDA tests fail instead of skipping when FERRY_REQUIRE_GPU is set. Each binary that holds
# them runs to its end before any verdict, so one call shows every failure.
export FERRY_REQUIRE_GPU=1 FERRY_SOURCE_DIR=$repo
cuda_filter='Cuda*:StreamErrorBook*'
cuda_tests() {  # <binary> <timeout s>
  local name=$1 limit=$2 log=$logs/$1.log rc ran passed skipped failed
  [[ -x $bin/$name ]] || { test_failures+=("$name is not in the bundle"); return; }
  phase "CUDA tests: $name --gtest_filter='$cuda_filter' (timeout $limit s)"
  timeout "$limit" "$bin/$name" --gtest_filter="$cuda_filter" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ran=$(grep -oE '^\[==========\] [0-9]+ tests? from [0-9]+ test suites? ran' "$log" | tail -1)
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?' "$log" | grep -oE '[0-9]+' | tail -1)
  failed=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+')
  [[ -n $ran ]] && ran=${ran#* } || ran="none ran (rc $rc)"
  summary+=("$name: $ran; passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed:-0}")
  if [[ $rc == 124 ]]; then
    test_failures+=("$name timed out after $limit s (see $log)")
  elif [[ $ran != [1-9]* ]]; then
    test_failures+=("$name ran no CUDA tests (see $log)")
  elif grep -q "no GPU:" "$log"; then  # nothing further can run
    fail "no GPU is visible to the CUDA runtime: $(grep -m1 -o 'no GPU: .*' "$log")"
  elif [[ ${skipped:-0} != 0 ]]; then
    test_failures+=("$name skipped CUDA tests: $(grep -A3 '^\[  SKIPPED \]' "$log" | paste -sd' ')")
  elif [[ $rc != 0 ]]; then
    test_failures+=("$name failed (rc $rc, see $log)")
  fi
}
if [[ ${FERRY_GPU_CHECK_TESTS:-1} != 0 ]]; then
  cuda_tests kernels_tests 130  # every CUDA op against the CPU backend, the device, stream errors
  cuda_tests engine_tests 60    # CudaMachineProbe, one training step per family on the GPU
else
  summary+=("CUDA tests: not run (FERRY_GPU_CHECK_TESTS=0)")
fi
# A failed test fails the check at its end: the probe and the job still run, so one call on the
# GPU machine shows every problem.

phase "ferry probe (GPU GEMM rates, memory, PCIe)"
probe_log=$logs/probe.log
timeout 85 "$bin/ferry" probe --out "$logs/probe.json" >"$probe_log" 2>&1
probe_rc=$?
cat "$probe_log"
[[ $probe_rc == 0 ]] || fail "ferry probe (rc $probe_rc, see $probe_log)"
grep -q "not measured" "$probe_log" && fail "ferry probe did not measure the GPU (see $probe_log)"
while IFS= read -r line; do summary+=("probe $line"); done < <(grep -E "^(GPU|PCIe):" "$probe_log")

# A ~1B Llama (random weights, made here by scripts/gpu_check_job.py: there is no network) through
# probe -> plan -> train, once with --gpu-memory 4GiB (its 2.5 GB of bf16 weights, gradients and
# activations cannot all stay: the plan streams stages through the GPU) and once uncapped; then
# ferry eval and transformers score what each run wrote. Each step's timeout is cut to what is
# left of the deadline; a step that cannot start says so in the summary.
phase "1B Llama job: probe -> plan -> train (4 GiB cap, uncapped) -> eval -> transformers"
job_dir=$root/job
job_failures=()
runs=()
job_step() {  # <name> <timeout s> <log> <command...>: runs it, shows its tail, notes a failure
  local name=$1 limit=$2 log=$3 left rc
  shift 3
  left=$((deadline - (SECONDS - started)))
  ((left < limit)) && limit=$left
  if ((limit < 5)); then
    job_failures+=("$name: not run (the ${deadline}-second budget is spent)")
    return 1
  fi
  echo "-- $name (timeout $limit s)"
  timeout "$limit" "$@" >"$log" 2>&1
  rc=$?
  tail -n 12 "$log"
  ((rc == 0)) && return 0
  job_failures+=("$name failed (rc $rc$( ((rc == 124)) && echo ", timed out"), see $log)")
  return 1
}
job_opts=(--model "$job_dir/model" --dtype bf16 --batch-size 8 --micro-batches 4 --seq-len 1024
  --steps 5 --warmup-steps 1)
eval_opts=(--data "$job_dir/tokens.tok" --seq-len 256 --batch-size 8 --json)
job_config=${FERRY_GPU_CHECK_JOB_CONFIG:-$repo/configs/models/llama-3.2-1b.json}
if job_step "make the model" 60 "$logs/job_make.log" python3 "$repo/scripts/gpu_check_job.py" \
  make "$job_dir" --config "$job_config"; then
  job_step "probe the model's layers" 90 "$logs/job_probe.log" "$bin/ferry" probe --quick \
    "${job_opts[@]}" --out "$logs/job_profile.json"
  hardware=$logs/job_profile.json
  [[ -f $hardware ]] || hardware=$logs/probe.json
  for name in ${FERRY_GPU_CHECK_CAPS:-4GiB uncapped}; do
    cap=$name
    [[ $name == uncapped ]] && cap=""
    cap_opt=()
    [[ -n $cap ]] && cap_opt=(--gpu-memory "$cap")
    if job_step "plan ($name)" 30 "$logs/job_plan_$name.log" "$bin/ferry" plan \
      "${job_opts[@]}" "${cap_opt[@]}" --hardware "$hardware"; then
      summary+=("job $name plan: $(grep -m1 -E '^ *predicted:' "$logs/job_plan_$name.log" |
        sed 's/^ *//'); $(grep -m1 -E '^ *stages:' "$logs/job_plan_$name.log" | cut -c1-80 |
        sed 's/^ *//')")
    fi
    log=$logs/job_train_$name.log
    if job_step "train ($name)" 150 "$log" "$bin/ferry" train "${job_opts[@]}" "${cap_opt[@]}" \
      --save-every 0 --out "$job_dir/$name" --trace "$logs/job_trace_$name.json"; then
      tokps=$(grep -oE '\| [0-9]+ tok/s' "$log" | tail -1 | grep -oE '[0-9]+')
      params=$(grep -m1 -oE '[0-9.]+M parameters' "$log" | grep -oE '^[0-9.]+')
      bf16=$(grep -m1 -oE 'bf16 [0-9.]+' "$logs/probe.log" | grep -oE '[0-9.]+$')
      mfu=$(awk -v t="${tokps:-0}" -v p="${params:-0}" -v g="${bf16:-0}" \
        'BEGIN { if (g > 0) printf "%.1f%%", 100 * 6 * p * 1e6 * t / (g * 1e12); else print "?" }')
      summary+=("job $name train: $(grep -m1 -E '^ferry train: [0-9]+ CUDA device' "$log" |
        sed 's/^ferry train: //')")
      summary+=("job $name train: ${tokps:-?} tok/s; model FLOP/s (6 x params x tok/s) $mfu of\
 the probed bf16 GEMM rate (${bf16:-?} TFLOP/s)")
      while IFS= read -r line; do summary+=("job $name train: $(echo "$line" | tr -s ' ')"); done \
        < <(grep -E '^  (step time|cuda[0-9.]* peak|host peak)|^ +(peak RSS|planned:|\+ ) ' "$log")
      # Where a step's time went, lane by lane, from the run's own trace.
      while IFS= read -r line; do summary+=("job $name $(echo "$line" | tr -s ' ')"); done \
        < <(timeout 30 python3 "$repo/scripts/trace_summary.py" "$logs/job_trace_$name.json" 2>&1)
      if job_step "eval ($name)" 45 "$logs/job_eval_$name.json" "$bin/ferry" eval \
        --model "$job_dir/$name" "${eval_opts[@]}"; then
        runs+=("$name=$job_dir/$name:$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["loss"])' "$logs/job_eval_$name.json")")
      fi
    fi
  done
  if ((${#runs[@]} > 0)) && job_step "transformers" 120 "$logs/job_transformers.log" python3 \
    "$repo/scripts/gpu_check_job.py" compare --tokens "$job_dir/tokens.tok" --seq-len 256 \
    --init "$job_dir/model" "${runs[@]}"; then
    while IFS= read -r line; do summary+=("job $line"); done \
      < <(grep -E '^(transformers|capped|uncapped):' "$logs/job_transformers.log")
  fi
fi
summary+=("job: ${#job_failures[@]} failure(s)\
${job_failures:+: $(printf '%s; ' "${job_failures[@]}")}")

phase "GPU benchmarks"
benches=()
for b in "$bin"/*; do
  [[ -f $b && -x $b && $b != */ferry && $b != *_tests ]] && benches+=("$b")
done
if ((${#benches[@]} == 0)); then
  echo "no GPU benchmark programs (bench/*gpu*.cc, bench/*cuda*.cc) yet"
  summary+=("benchmarks: none yet")
fi
for b in "${benches[@]}"; do
  left=$((deadline - (SECONDS - started)))
  if ((left < 10)); then
    summary+=("bench $(basename "$b"): not run (the 6-minute budget is spent)")
    continue
  fi
  echo "-- $(basename "$b") (timeout $left s)"
  if timeout "$left" "$b"; then
    summary+=("bench $(basename "$b"): ok")
  else
    summary+=("bench $(basename "$b"): FAILED")
    bench_failed=1
  fi
done

echo
echo "== summary ($((SECONDS - started)) s) =="
printf '  %s\n' "${summary[@]}"
((${#test_failures[@]} == 0)) || fail "CUDA tests: $(printf '%s; ' "${test_failures[@]}")"
[[ -z "${bench_failed:-}" ]] || fail "a benchmark failed"
((${#job_failures[@]} == 0)) || fail "the 1B job: $(printf '%s; ' "${job_failures[@]}")"
echo "gpu_check: OK"
