#!/usr/bin/env bash
# Sets up, builds and runs ferry's whole test suite: the normal build (CUDA code compiled when
# nvcc is found; GPU tests skip without a GPU), then the ASan+UBSan and TSan builds of the CPU code,
# then the parsers' fuzz targets for a bounded time (scripts/fuzz.sh).
# Environment: FERRY_SANITIZERS=0 skips the sanitizer builds and FERRY_FUZZ_SECONDS=0 the fuzzing
# (for a quick local loop); FERRY_FUZZ_SECONDS sets the seconds per fuzz target (default 20 here).
# A failing test suite does not stop the later builds: the script ends with one line per build
# (build time, test time, tests passed/skipped/failed) and fails if any of them failed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
started=$SECONDS

summary=()
failed=0
print_summary() {
  print_reruns
  ((${#summary[@]})) || return 0
  echo "== summary ($(((SECONDS - started) / 60)) min) =="
  printf '%s\n' "${summary[@]}"
}
trap print_summary EXIT

# Python references for tests/tokenizer_check.py and dataset_check.py (tokenizers, tiktoken,
# jinja2 for the chat templates; GPT-2's real ranks from
# the openai-whisper package, downloaded without its dependencies). Reused when present; a
# failure is recorded in SETUP_FAILED and the test reports itself skipped with that reason.
prepare_venv() {
  local venv=build/venv-tests
  # (A venv prepared before jinja2 was on the list is topped up.)
  if [[ ! -f $venv/READY ]] || ! $venv/bin/python -c 'import jinja2' 2>/dev/null; then
    rm -f $venv/SETUP_FAILED
    if python3 -m venv $venv >$venv.log 2>&1 &&
       $venv/bin/pip install -q tokenizers tiktoken jinja2 numpy safetensors >>$venv.log 2>&1 &&
       $venv/bin/pip download -q --no-deps openai-whisper -d $venv/downloads \
         >>$venv.log 2>&1; then
      touch $venv/READY
    else
      mkdir -p $venv
      echo "pip failed: $(tail -n 1 $venv.log)" >$venv/SETUP_FAILED
    fi
  fi
}

# count_results <junit file> <ctest exit status>: "N passed, N skipped, N failed".
count_results() {
  local suite
  suite=$(head -c 4096 "$1" 2>/dev/null | tr '\n\t' '  ' | grep -o '<testsuite [^>]*>') ||
    { echo "no test results (ctest exit status $2)"; return; }
  attr() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$suite"; }
  local tests failures skipped disabled
  tests=$(attr tests) failures=$(attr failures) skipped=$(attr skipped) disabled=$(attr disabled)
  echo "$((tests - failures - skipped - disabled)) passed, $((skipped + disabled)) skipped," \
    "$failures failed"
}

# build_and_test <build dir> <ctest arguments...>: builds with scripts/setup.sh (cmake arguments
# in $cmake_args), runs the tests and adds the build's line to the summary.
build_and_test() {
  local dir=$1
  shift
  echo "== build ($dir) =="
  local start=$SECONDS
  FERRY_BUILD_DIR=$dir scripts/setup.sh "${cmake_args[@]}" ||
    { summary+=("$(printf '%-14s build FAILED (see above)' "$dir")"); exit 1; }
  local built=$((SECONDS - start))
  [[ $dir == build ]] && prepare_venv
  echo "== tests ($dir) =="
  start=$SECONDS
  local rc=0
  rm -f "$dir/ctest-junit.xml"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --output-junit ctest-junit.xml "$@" ||
    rc=$?
  summary+=("$(printf '%-14s build %4d s, tests %4d s: %s' "$dir" "$built" \
    $((SECONDS - start)) "$(count_results "$dir/ctest-junit.xml" $rc)")")
  if ((rc != 0)); then
    failed=1
    # The failing tests by name, so the summary alone says where to look; and each run once more
    # on its own (the build still counts as failed), its output kept for the end of the log, where
    # a CI's tail shows it: a pass there points to an interaction or a flake, not the test alone.
    local names
    names=$(cut -d: -f2- "$dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null | head -n 10 |
      paste -sd, - | sed 's/,/, /g')
    [[ -z $names ]] || summary+=("$(printf '%-14s failed: %s' "" "$names")")
    ctest --test-dir "$dir" --rerun-failed --output-on-failure --timeout 900 \
      >"$dir/rerun-failed.log" 2>&1 || true
    reruns+=("$dir/rerun-failed.log")
  fi
}
reruns=()
print_reruns() {
  local f
  for f in "${reruns[@]}"; do
    echo "== the failed tests run again alone: $f (last 100 lines) =="
    tail -n 100 "$f"
  done
}

# The host, first in the summary: several tests depend on the CPU's flags (kernels/cpu).
host_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $host_flags " == *" $1 "* ]] && echo "$1" || true; }
summary+=("host: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'),\
 $(nproc) cores; $(echo $(has avx2) $(has avx512f) $(has avx512_bf16) $(has amx_bf16))")

cmake_args=()
build_and_test build --timeout 600

if [[ "${FERRY_SANITIZERS:-1}" != 0 ]]; then
  export FERRY_SKIP_APT=1
  for san in address thread; do
    cmake_args=(-DFERRY_SANITIZE=$san -DFERRY_CUDA=OFF -DFERRY_BUILD_BENCH=OFF
                -DCMAKE_BUILD_TYPE=RelWithDebInfo)
    # Labels: no_sanitizer (too slow under either sanitizer; none has needed it yet), no_tsan
    # (single-threaded: nothing for TSan to find).
    skip=no_sanitizer
    [[ $san == thread ]] && skip='no_sanitizer|no_tsan'
    # intercept_tls_get_addr=0: GCC 12's sanitizer runtime takes a dynamic TLS block (oneDNN and
    # libgomp, dlopened, have some) for a pre-2.25 glibc one when its address happens to fall
    # 16 bytes into a page, and LeakSanitizer's tracer then crashes at exit ("Tracer caught
    # signal 11") after a passing test: a host- and layout-dependent failure that reported no
    # leak (CpuGemm.AllTransposesAlphaBetaSmallAwkwardShapes, reproducible on one CI host).
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0" \
    UBSAN_OPTIONS="print_stacktrace=1" \
      build_and_test build-$san --timeout 900 -LE "$skip"
  done
fi

if [[ "${FERRY_FUZZ_SECONDS:-20}" != 0 ]]; then
  echo "== fuzz (build-fuzz: clang, libFuzzer, ASan+UBSan) =="
  start=$SECONDS
  rc=0
  FERRY_FUZZ_SECONDS=${FERRY_FUZZ_SECONDS:-20} scripts/fuzz.sh || rc=$?
  result="no problems found"
  ((rc == 0)) || { result="FAILED (see above)"; failed=1; }
  summary+=("$(printf '%-14s build+fuzz %4d s: %s' build-fuzz $((SECONDS - start)) "$result")")
fi
exit $failed
