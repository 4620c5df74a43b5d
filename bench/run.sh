#!/usr/bin/env bash
# `make bench`: trainerd against the seed's PyTorch loops on this machine's CPU (and GPU when
# BENCH_DEVICES includes cuda). Results: a table on stdout, bench.json in $RESULTS_DIR (default
# build/bench). See bench/README.md.
set -euo pipefail
BUILD_DIR="${BUILD_DIR:-build/release}"
PYTHON="${PYTHON:-python3}"
RESULTS_DIR="${RESULTS_DIR:-build/bench}"
exec "$PYTHON" bench/bench.py --build-dir "$BUILD_DIR" --results-dir "$RESULTS_DIR" \
  --devices "${BENCH_DEVICES:-cpu}" "$@"
