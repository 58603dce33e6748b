#!/usr/bin/env bash
# Fetches the cuDNN frontend's C++ headers (header-only; kernels/cuda/attention_cudnn.cc is their
# one user) from PyPI's nvidia-cudnn-frontend wheel, pinned, into DIR/cudnn-frontend-VERSION/include.
# Reused when present. The wheel is a zip with include/ inside; only include/ is kept.
# Usage: scripts/fetch_cudnn_frontend.sh DIR   (setup.sh passes <build dir>/_deps)
set -euo pipefail
version=1.32.0  # keep in step with FERRY_CUDNN_FRONTEND_VERSION in CMakeLists.txt
dest=${1:?usage: $0 DIR}/cudnn-frontend-$version
if [[ -f $dest/include/cudnn_frontend.h ]]; then
  echo "cuDNN frontend $version: $dest/include (cached)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" \
  "nvidia-cudnn-frontend==$version"
wheel=$(find "$tmp" -name 'nvidia_cudnn_frontend-*.whl' | head -1)
[[ -n $wheel ]] || { echo "fetch_cudnn_frontend: pip gave no wheel" >&2; exit 1; }
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
[[ -f $tmp/x/include/cudnn_frontend.h ]] || { echo "fetch_cudnn_frontend: no include/ in $wheel" >&2; exit 1; }
mkdir -p "$dest"
rm -rf "$dest/include"
mv "$tmp/x/include" "$dest/include"
echo "cuDNN frontend $version: $dest/include"
