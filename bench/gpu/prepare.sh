#!/usr/bin/env bash
# Run on the CPU machine before a GPU session: gathers what bench/gpu/run.sh needs into .gpu-deps/
# (ignored by git; pass it as `carry`): the built binaries, Debian's runtime libraries that the GPU
# host lacks (gRPC, Protobuf, Abseil, prometheus-cpp, ...), and the seed's PyTorch loops. LibTorch
# does not travel: the GPU host has torch 2.11.0 (CUDA 13.0), the version trainerd builds against.
# See ../shared/device/NOTES.md. Keeps the carried folder under the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR="${BUILD_DIR:-build/release}"
OUT=.gpu-deps
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/debs" "$OUT/root"
# trainerd-module-check and trainerd-worker go beside trainerd, where the daemon looks for them.
cp "$BUILD_DIR/server/trainerd" "$BUILD_DIR/server/trainerd-module-check" \
  "$BUILD_DIR/server/trainerd-worker" "$BUILD_DIR/client/trainctl" "$OUT/bin/"
for t in engine_gpu_test; do
  f="$(find "$BUILD_DIR/tests" -name "$t" -type f | head -1)"
  [ -n "$f" ] && cp "$f" "$OUT/bin/"
done
strip --strip-debug "$OUT"/bin/* 2>/dev/null || true
# The non-LibTorch shared libraries the binaries load, as Debian packages (runtime only).
libs=$(for b in "$OUT"/bin/*; do ldd "$b"; done | awk '/=> \/(usr\/)?lib/ {print $3}' | sort -u)
pkgs=$(for l in $libs; do dpkg -S "$(readlink -f "$l")" 2>/dev/null | cut -d: -f1; done | sort -u |
  grep -vE '^(libc6|libgcc-s1|libstdc\+\+6|libssl3|zlib1g|libsystemd0|libzstd1|liblzma5|libcrypt1)$' || true)
(cd "$OUT/debs" && apt-get download $pkgs >/dev/null)
for f in "$OUT"/debs/*.deb; do dpkg -x "$f" "$OUT/root"; done
rm -rf "$OUT/debs" "$OUT/root/usr/share"
cp ../shared/bench/seed_scenario.py "$OUT/" 2>/dev/null || echo "prepare: no ../shared/bench/seed_scenario.py; the PyTorch peer will be skipped" >&2
echo "carried packages: $pkgs"
du -sh "$OUT"
