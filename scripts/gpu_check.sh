#!/usr/bin/env bash
# The one prepared GPU check, for a session lent a GPU machine (an H200, sm_90; 16 cores): builds
# ferry with CUDA for that architecture, runs the CUDA tests (which must run, not skip), then
# `ferry probe` (its measured GPU and PCIe figures go into the summary), then the whole test suite,
# then any GPU benchmark programs, and prints a short summary. Well under ten
# minutes on 16 cores. Fails loudly when no GPU is visible.
# Usage: scripts/gpu_check.sh            (from anywhere; builds in build-gpu/)
# Logs: $OUT/gpu_check_logs when OUT is set (the device machine's returned folder), else
# <build dir>/gpu_check_logs.
# Environment: FERRY_CUDA_ARCHS (default 90), FERRY_BUILD_DIR (default build-gpu),
#              FERRY_GPU_CHECK_SKIP_SUITE=1 to run only the CUDA tests.
set -uo pipefail
cd "$(dirname "$0")/.."
archs=${FERRY_CUDA_ARCHS:-90}
build_dir=${FERRY_BUILD_DIR:-build-gpu}
jobs=$(nproc)
logs=${OUT:-$build_dir}/gpu_check_logs  # under $OUT on a device machine, so the logs come back
mkdir -p "$logs"
started=$SECONDS
summary=()
fail() {
  echo "gpu_check: FAILED: $*" >&2
  printf '  %s\n' "${summary[@]}" >&2
  exit 1
}
phase() { echo; echo "== $* ($((SECONDS - started)) s) =="; }

phase "GPU"
if command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) ||
    fail "nvidia-smi sees no GPU: $gpus"
  echo "$gpus"
  summary+=("GPU: $(echo "$gpus" | head -1) ($(echo "$gpus" | wc -l) visible)")
else
  echo "nvidia-smi not found; the CUDA tests decide whether a GPU is visible"
fi

phase "configure ($build_dir, CUDA archs $archs)"
cmake -S . -B "$build_dir" -G Ninja -DFERRY_CUDA=ON -DFERRY_CUDA_ARCHS="$archs" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; fail "configure (see $logs/configure.log)"; }

phase "build (-j$jobs)"
timeout 400 cmake --build "$build_dir" -j "$jobs" >"$logs/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$logs/build.log" | head -30; tail -5 "$logs/build.log";
    fail "build (see $logs/build.log)"; }
summary+=("build: ok in $((SECONDS - started)) s")

# The CUDA tests fail instead of skipping when FERRY_REQUIRE_GPU is set.
export FERRY_REQUIRE_GPU=1
cuda_tests='Cuda|StreamErrorBook'
phase "CUDA tests (ctest -R '$cuda_tests')"
cuda_log="$logs/cuda_tests.log"
timeout 180 ctest --test-dir "$build_dir" -R "$cuda_tests" --output-on-failure -j 4 \
  --timeout 120 2>&1 | tee "$cuda_log"
cuda_rc=${PIPESTATUS[0]}
cuda_line=$(grep -E "tests passed|tests failed" "$cuda_log" | tail -1)
summary+=("CUDA tests: ${cuda_line:-no result}")
grep -q "No tests were found" "$cuda_log" && fail "no CUDA tests were found: is CUDA built?"
if grep -q "(Skipped)" "$cuda_log"; then
  grep "(Skipped)" "$cuda_log"
  fail "CUDA tests were skipped: no GPU is visible to the CUDA runtime"
fi
if grep -q "no GPU:" "$cuda_log"; then
  fail "no GPU is visible to the CUDA runtime: $(grep -m1 -o 'no GPU: .*' "$cuda_log")"
fi
[[ $cuda_rc == 0 ]] || fail "CUDA tests (see $cuda_log)"

phase "ferry probe (GPU GEMM rates, memory, PCIe)"
probe_log="$logs/probe.log"
timeout 240 "$build_dir/ferry" probe --out "$logs/probe.json" >"$probe_log" 2>&1
probe_rc=$?
cat "$probe_log"
[[ $probe_rc == 0 ]] || fail "ferry probe (see $probe_log)"
grep -q "not measured" "$probe_log" && fail "ferry probe did not measure the GPU (see $probe_log)"
while IFS= read -r line; do summary+=("probe $line"); done < <(grep -E "^(GPU|PCIe):" "$probe_log")

if [[ "${FERRY_GPU_CHECK_SKIP_SUITE:-0}" != 1 ]]; then
  phase "whole test suite"
  suite_log="$logs/suite.log"
  timeout 300 ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 240 \
    >"$suite_log" 2>&1
  suite_rc=$?
  grep -E "Failed|\*\*\*|tests passed|tests failed" "$suite_log" | tail -25
  summary+=("suite: $(grep -E "tests passed|tests failed" "$suite_log" | tail -1)")
  [[ $suite_rc == 0 ]] || fail "test suite (see $suite_log)"
fi

phase "GPU benchmarks"
benches=()
if [[ -d "$build_dir/bench" ]]; then
  while IFS= read -r b; do benches+=("$b"); done < <(
    find "$build_dir/bench" -maxdepth 1 -type f -perm -u+x \( -iname '*gpu*' -o -iname '*cuda*' \) |
      sort)
fi
if ((${#benches[@]} == 0)); then
  echo "no GPU benchmark programs (bench/*gpu*.cc, bench/*cuda*.cc) yet"
  summary+=("benchmarks: none yet")
fi
for b in "${benches[@]}"; do
  echo "-- $b"
  if timeout 120 "$b"; then
    summary+=("bench $(basename "$b"): ok")
  else
    summary+=("bench $(basename "$b"): FAILED")
    bench_failed=1
  fi
done

echo
echo "== summary ($((SECONDS - started)) s) =="
printf '  %s\n' "${summary[@]}"
[[ -z "${bench_failed:-}" ]] || fail "a benchmark failed"
echo "gpu_check: OK"
