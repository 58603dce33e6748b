#!/usr/bin/env bash
# Builds ferry's parser fuzz targets (tests/fuzz/, clang + libFuzzer + ASan/UBSan) into
# build-fuzz/ and runs each for a bounded time, starting from its committed seed corpus.
# Fails when any target finds a crash, sanitizer report, leak or timeout; the input that did it is
# saved as build-fuzz/artifacts/<target>/crash-* (or leak-*, timeout-*, oom-*). Reproduce with
#   build-fuzz/tests/fuzz/fuzz_<target> build-fuzz/artifacts/<target>/crash-...
# Usage: scripts/fuzz.sh [target...]            (default: every target)
# Environment: FERRY_FUZZ_SECONDS per target (default 30), FERRY_FUZZ_JOBS parallel runs of each
# target (default 1), FERRY_FUZZ_BUILD_DIR (default build-fuzz), CXX (default clang++).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FERRY_FUZZ_BUILD_DIR:-build-fuzz}
seconds=${FERRY_FUZZ_SECONDS:-30}
fuzz_jobs=${FERRY_FUZZ_JOBS:-1}

cmake -S . -B "$build_dir" -G Ninja -DFERRY_FUZZ=ON -DFERRY_CUDA=OFF -DFERRY_BUILD_BENCH=OFF \
  -DFERRY_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="${CXX:-clang++}" -DCMAKE_C_COMPILER="${CC:-clang}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

targets=("$@")
((${#targets[@]})) || mapfile -t targets < <(grep -v '^$' "$build_dir/fuzz_targets.txt")

failed=()
for t in "${targets[@]}"; do
  bin=$build_dir/tests/fuzz/fuzz_$t
  [[ -x $bin ]] || { echo "no fuzz target '$t' (have: $(tr '\n' ' ' <"$build_dir/fuzz_targets.txt"))"; exit 2; }
  work=$build_dir/corpus/$t        # what this run discovers (the committed seeds stay untouched)
  artifacts=$build_dir/artifacts/$t
  mkdir -p "$work" "$artifacts"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/")
  [[ -f tests/fuzz/dicts/$t.dict ]] && args+=(-dict="tests/fuzz/dicts/$t.dict")
  ((fuzz_jobs > 1)) && args+=(-fork="$fuzz_jobs" -ignore_crashes=0)
  echo "== fuzz $t (${seconds}s) =="
  if ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      "$bin" "${args[@]}" "$work" "tests/fuzz/corpus/$t" >"$build_dir/fuzz-$t.log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' \
      "$build_dir/fuzz-$t.log" | tr '\n' ' '
    echo
  else
    tail -n 60 "$build_dir/fuzz-$t.log"
    echo "FAILED: fuzz $t (log $build_dir/fuzz-$t.log, input in $artifacts/)"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzzing found problems in: ${failed[*]}"
  exit 1
fi
echo "fuzzing: ${#targets[@]} targets, ${seconds}s each, no problems found"
