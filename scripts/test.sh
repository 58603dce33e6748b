#!/usr/bin/env bash
# Sets up, builds and runs ferry's whole test suite: the normal build (CUDA code compiled when
# nvcc is found; GPU tests skip without a GPU), then the ASan+UBSan and TSan builds of the CPU code,
# then the parsers' fuzz targets for a bounded time (scripts/fuzz.sh).
# Environment: FERRY_SANITIZERS=0 skips the sanitizer builds and FERRY_FUZZ_SECONDS=0 the fuzzing
# (for a quick local loop); FERRY_FUZZ_SECONDS sets the seconds per fuzz target (default 20 here).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh

# Python references for tests/tokenizer_check.py and dataset_check.py (tokenizers, tiktoken,
# jinja2 for the chat templates; GPT-2's real ranks from
# the openai-whisper package, downloaded without its dependencies). Reused when present; a
# failure is recorded in SETUP_FAILED and the test reports itself skipped with that reason.
venv=build/venv-tests
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

echo "== tests (build) =="
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

if [[ "${FERRY_SANITIZERS:-1}" != 0 ]]; then
  for san in address thread; do
    echo "== tests (build-$san: FERRY_SANITIZE=$san) =="
    FERRY_SKIP_APT=1 FERRY_BUILD_DIR=build-$san scripts/setup.sh -DFERRY_SANITIZE=$san \
      -DFERRY_CUDA=OFF -DFERRY_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      ctest --test-dir build-$san --output-on-failure -j "$jobs" --timeout 900 -LE no_sanitizer
  done
fi

if [[ "${FERRY_FUZZ_SECONDS:-20}" != 0 ]]; then
  echo "== fuzz (build-fuzz: clang, libFuzzer, ASan+UBSan) =="
  FERRY_FUZZ_SECONDS=${FERRY_FUZZ_SECONDS:-20} scripts/fuzz.sh
fi
