#!/usr/bin/env bash
# Lays out what the image's runtime stage copies (Dockerfile): OUT/bin holds trainerd, trainctl,
# trainerd-module-check and trainerd-worker from BUILD_DIR, stripped; OUT/lib/torch/lib LibTorch's
# libraries from TORCH_LIB, and OUT/lib/nvidia the CUDA libraries they load, in the wheel's layout
# (libtorch_cuda finds them at $ORIGIN/../../nvidia): no headers, no static libraries, no Python
# bindings.
#
#   deploy/image-out.sh BUILD_DIR TORCH_LIB OUT
#
# The Dockerfile's build stage runs it on the binaries it compiled; tests/image/build_and_run.sh
# runs it on the binaries `make test` built (--target runtime-prebuilt), so both images hold the same
# files. Libraries are hard-linked where OUT is on the same file system as TORCH_LIB (a copy
# otherwise), so that laying out a few GB outside an image costs no copy.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 BUILD_DIR TORCH_LIB OUT" >&2; exit 2; }
build_dir="$1"
torch_lib="$2"
out="$3"
site="$(dirname "$(dirname "$torch_lib")")"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build_dir/server/trainerd" "$build_dir/client/trainctl" \
   "$build_dir/server/trainerd-module-check" "$build_dir/server/trainerd-worker" "$out/bin/"
strip "$out"/bin/*
copy_tree() {  # copy_tree FROM TO: hard links when possible, else a copy
  cp -al "$1" "$2" 2>/dev/null || { rm -rf "$2"; cp -a "$1" "$2"; }
}
mkdir -p "$out/lib/torch"
copy_tree "$torch_lib" "$out/lib/torch/lib"
rm -f "$out/lib/torch/lib/libtorch_python.so" "$out"/lib/torch/lib/*.a
copy_tree "$site/nvidia" "$out/lib/nvidia"
find "$out/lib/nvidia" \( -name include -o -name bin -o -name nvvm -o -name '__pycache__' \) \
  -prune -exec rm -rf {} +
find "$out/lib/nvidia" \( -name '*.a' -o -name '*.py' -o -name '*.h' \) -delete
