#!/usr/bin/env bash
# Builds HERE, for the GPU machine (one H200, sm_90; no network, none of Debian's -dev libraries),
# the bundle that scripts/gpu_check.sh runs there without configuring or building anything:
#   gpu-bundle/ferry-gpu-bundle.tar.xz  ferry, kernels_tests (the CUDA ops' tests),
#                                       engine_tests (CudaMachineProbe) and any GPU benchmark,
#                                       stripped, with lib/ beside them
#   gpu-bundle/MANIFEST.txt             what is inside, the versions it was compiled against
# The binaries carry an `$ORIGIN/lib` run path, written as DT_RPATH (--disable-new-dtags) rather
# than DT_RUNPATH: a DT_RUNPATH serves only the binary's own direct dependencies, while the
# executable's DT_RPATH also serves its libraries' dependencies (libicuuc -> libicudata) and
# dlopen (kernels/cpu/blas.cc falls back to "libopenblas.so.0" when Debian's path is absent).
# lib/ holds every shared library the binaries need except
#   - CUDA's (libcudart, libcublas, libcublasLt, libcudnn, libnvrtc, libnvJitLink, libcuda): the
#     device has them (its toolkit, PyTorch's nvidia/*/lib) and cuBLAS alone is 600 MB;
#   - glibc's and the compiler runtime's (libc, libm, libdl, libpthread, librt, ld-linux,
#     libstdc++, libgcc_s). Assumption: the device's base system (Ubuntu 24.04-era, Python 3.12,
#     glibc 2.39, GCC 13/14 runtime) is newer than Debian 12's here (glibc 2.36, GCC 12), so the
#     versions these binaries ask for are there. gpu_check.sh prints ldd first, so a "not found"
#     or "version ... not found" shows in the first call.
# plus OpenBLAS's pthread build as lib/libopenblas.so.0 (36 MB, 4 MB in xz), which is dlopened,
# not linked: the CUDA tests compare against the CPU backend, whose GEMM is OpenBLAS. oneDNN
# (40 MB, dlopened for bf16 CPU GEMMs on AMX/AVX512-BF16 hosts) is left out: without it the CPU
# backend runs bf16 operands through OpenBLAS on converted panels, which the tests accept. ICU's
# data (31 MB, 7.5 MB in xz) stays: ferry links the tokenizers.
# The bundle must be at most 50 MiB as carried (the device takes 64 MiB with the tracked tree);
# the script fails over that, listing the largest files.
# Usage: scripts/gpu_bundle.sh   (from anywhere; builds in build-gpu-bundle/: a fresh build took
#        408 s for ferry and kernels_tests, then 158 s for engine_tests, at -j1 on this workplace's
#        2 shared cores; a rebuild after a commit only relinks)
# Then call scripts/gpu_check.sh through the device tool as its header says.
# Environment: FERRY_BUNDLE_JOBS (default 1: the build shares its cores), FERRY_CUDA_ARCHS
#              (default 90), FERRY_BUNDLE_BUILD_DIR (default build-gpu-bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
archs=${FERRY_CUDA_ARCHS:-90}
build_dir=${FERRY_BUNDLE_BUILD_DIR:-build-gpu-bundle}
jobs=${FERRY_BUNDLE_JOBS:-1}
out_dir=gpu-bundle
name=ferry-gpu-bundle
limit=$((50 * 1024 * 1024))
started=$SECONDS
fail() { echo "gpu_bundle: FAILED: $*" >&2; exit 1; }
phase() { echo; echo "== $* ($((SECONDS - started)) s) =="; }

phase "configure ($build_dir, Release, CUDA archs $archs)"
mkdir -p "$build_dir"
# The cuDNN frontend's headers (attention): pip, into the build dir, reused when present.
scripts/fetch_cudnn_frontend.sh "$build_dir/_deps" || fail "fetching the cuDNN frontend headers"
# Release: no debug info (the bundle strips anyway). FERRY_WERROR off: warnings are CI's business,
# this build only has to produce binaries. Only $ORIGIN/lib in the run path, given to the linker:
# CMake's own build run path would add this machine's /usr/local/cuda/lib.
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
cmake -S . -B "$build_dir" -G Ninja -DFERRY_CUDA=ON -DFERRY_CUDA_ARCHS="$archs" \
  -DCMAKE_BUILD_TYPE=Release -DFERRY_WERROR=OFF -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON \
  -DCMAKE_SKIP_BUILD_RPATH=ON -DCMAKE_BUILD_RPATH= \
  -DCMAKE_EXE_LINKER_FLAGS='-Wl,--disable-new-dtags,-rpath,\$ORIGIN/lib' >"$build_dir/configure.log" 2>&1 ||
  { tail -30 "$build_dir/configure.log"; fail "configure (see $build_dir/configure.log)"; }
grep -q "CUDA backend ON" "$build_dir/configure.log" || fail "configured without CUDA"

# GPU benchmarks: bench/*gpu*.cc and bench/*cuda*.cc (none yet).
benches=()
for src in bench/*gpu*.cc bench/*cuda*.cc; do
  [[ -e $src ]] && benches+=("$(basename "$src" .cc)")
done
tests=(kernels_tests engine_tests)  # the test binaries that hold CUDA tests
targets=(ferry "${tests[@]}" "${benches[@]}")

phase "build -j$jobs: ${targets[*]}"
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"
build_s=$((SECONDS - started))

phase "stage"
stage=$build_dir/$name
rm -rf "$stage"
mkdir -p "$stage/lib"
for t in "${targets[@]}"; do
  built=$(find "$build_dir" -maxdepth 2 -type f -name "$t" | head -1)
  [[ -n $built ]] || fail "built $t, but cannot find it under $build_dir"
  strip -s -o "$stage/$t" "$built"
done
for b in "$stage"/*; do
  [[ -f $b ]] || continue
  # shellcheck disable=SC2016
  readelf -d "$b" | grep -q 'Library rpath: \[\$ORIGIN/lib\]' ||
    fail "$b has no DT_RPATH of exactly \$ORIGIN/lib: $(readelf -d "$b" | grep -i path)"
done

# Shared libraries the device may lack: ldd's resolved paths, minus CUDA's and the base system's.
provided_by_device='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnvrtc|libnvJitLink)\.so'
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
[[ -e $openblas ]] || fail "no $openblas: run scripts/setup.sh"
cp -L "$openblas" "$stage/lib/libopenblas.so.0"
bundle_libs() {  # <elf files...>: copy what they need, recursively through ldd
  local soname path
  while read -r soname path; do
    [[ $soname =~ $provided_by_device ]] && continue
    [[ $path == "not" ]] && fail "ldd: $soname not found"
    [[ -e $stage/lib/$soname ]] && continue
    cp -L "$path" "$stage/lib/$soname"
    echo "  lib/$soname <- $path"
  done < <(ldd "$@" | awk '$2 == "=>" && $3 != "" { print $1, $3 }' | sort -u)
}
bundle_libs "${targets[@]/#/$stage/}" "$stage/lib/libopenblas.so.0"
bundle_libs "$stage"/lib/*.so*  # the libraries' own needs (ldd is recursive; this is a check)
chmod -R u+w,a+r "$stage"

# What the check prints as "compiled against".
cuda_include=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
cublas_version=$(awk '/#define CUBLAS_VER_(MAJOR|MINOR|PATCH)/ { v = v (v ? "." : "") $3 } END { print v }' \
  "$cuda_include/cublas_api.h" 2>/dev/null || true)
cudnn_version=$(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / { v = v (v ? "." : "") $3 } END { print v }' \
  "$cuda_include/cudnn_version.h" 2>/dev/null || true)
frontend_version=$(grep -o 'FERRY_CUDNN_FRONTEND_VERSION [0-9.]*' CMakeLists.txt | awk '{ print $2 }')
{
  echo "ferry GPU bundle, built $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo '+dirty')"
  echo "CUDA archs: $archs"
  echo "nvcc: $(nvcc --version | grep -o 'release [0-9.]*, V[0-9.]*')"
  echo "cuBLAS headers: ${cublas_version:-unknown}"
  echo "cuDNN: headers ${cudnn_version:-unknown}, frontend ${frontend_version:-unknown} (libcudnn.so.9 from the device)"
  echo "cudart: $(grep -q 'libcudart.so' <(ldd "$stage/ferry") && echo shared || echo static)"
  echo "glibc here: $(ldd --version | head -1)"
  echo "files:"
  (cd "$stage" && find . -type f -printf '  %p %s\n' | sort)
} >"$stage/MANIFEST.txt"

phase "pack"
rm -rf "$out_dir"
mkdir -p "$out_dir"
cp "$stage/MANIFEST.txt" "$out_dir/"
tar -C "$build_dir" -cf - "$name" | xz -T1 -6 >"$out_dir/$name.tar.xz"
size=$(du -cb "$out_dir" | tail -1 | cut -f1)
echo "$out_dir: $size bytes ($((size / 1024 / 1024)) MiB; limit $((limit / 1024 / 1024)) MiB)," \
  "unpacked $(du -sb "$stage" | cut -f1) bytes"
cat "$out_dir/MANIFEST.txt"
if ((size > limit)); then
  echo "largest files (unpacked):" >&2
  find "$stage" -type f -printf '%s %p\n' | sort -rn | head -10 >&2
  fail "the bundle is $size bytes, over $limit"
fi
echo "gpu_bundle: OK in $((SECONDS - started)) s (build $build_s s); carry [\"$out_dir\"]"
