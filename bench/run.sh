#!/usr/bin/env bash
# `make bench`: trainerd against the seed's PyTorch loops on this machine's CPU (and GPU when
# BENCH_DEVICES includes cuda), then the Python client against trainctl (BENCH_PYTHON_CLIENT=0
# skips it), then users' own models as exported programs and TorchScript (BENCH_USER_MODELS=0
# skips it), then c10d's all-reduce on loopback (BENCH_COLLECTIVES=0 skips it), then a
# hyperparameter search on digits (BENCH_SEARCH=0 skips it), the web console (BENCH_CONSOLE=0
# skips it), then the load test's latencies (32
# concurrent clients for BENCH_LOAD_SECONDS, default 60; 0 skips it), with a packed sweep member's
# numerics on the way (BENCH_PACKED=0 skips them). Results: tables on stdout, bench.json,
# python_client.json, search.json, packed_numerics.json and load.txt in $RESULTS_DIR (default
# build/bench). See bench/README.md.
set -euo pipefail
BUILD_DIR="${BUILD_DIR:-build/release}"
PYTHON="${PYTHON:-python3}"
RESULTS_DIR="${RESULTS_DIR:-build/bench}"
"$PYTHON" bench/bench.py --build-dir "$BUILD_DIR" --results-dir "$RESULTS_DIR" \
  --devices "${BENCH_DEVICES:-cpu}" "$@"
# The Python client against trainctl (upload throughput, submit-and-wait overhead), with the
# client's own environment (python/venv.sh installs the package there when its sources changed);
# BENCH_PYTHON_CLIENT=0 skips it.
if [ "${BENCH_PYTHON_CLIENT:-1}" != 0 ]; then
  pyclient_python="$(python/venv.sh "$PYTHON")"
  "$pyclient_python" bench/python_client.py --build-dir "$BUILD_DIR" --results-dir "$RESULTS_DIR"
fi
# Users' own models (a digits CNN and a small Transformer encoder) as exported programs and as
# TorchScript through the daemon, against a plain PyTorch loop; BENCH_USER_MODELS=0 skips it.
if [ "${BENCH_USER_MODELS:-1}" != 0 ]; then
  "$(python/venv.sh "$PYTHON")" bench/user_models.py --build-dir "$BUILD_DIR" \
    --results-dir "$RESULTS_DIR"
fi
# c10d's all-reduce (Gloo) on loopback: latency and bus bandwidth for 2 and 4 ranks;
# BENCH_COLLECTIVES=0 skips it.
if [ "${BENCH_COLLECTIVES:-1}" != 0 ]; then
  mkdir -p "$RESULTS_DIR"
  "$BUILD_DIR/tests/engine/collectives_bench" --json "$RESULTS_DIR/collectives.json"
  # A data-parallel MLP as 1, 2 and 4 ranks (engine-internal ranks).
  "$BUILD_DIR/tests/engine/data_parallel_bench" --json "$RESULTS_DIR/data_parallel.json"
  # The same kind of job through the daemons: one rank, 2 ranks in one daemon, 2 on two daemons.
  "$(python/venv.sh "$PYTHON")" bench/data_parallel_daemons.py --build-dir "$BUILD_DIR" \
    --results-dir "$RESULTS_DIR"
  # A sweep spread over a peer (its share packed there) against the same sweep on one daemon.
  "$(python/venv.sh "$PYTHON")" bench/spread_sweep.py --build-dir "$BUILD_DIR" \
    --results-dir "$RESULTS_DIR"
fi
# The web console: its jobs page with 10,000 jobs in headless Chromium, and what 50 open consoles
# cost the daemon (console.json); BENCH_CONSOLE=0 skips it.
if [ "${BENCH_CONSOLE:-1}" != 0 ]; then
  "$PYTHON" bench/console.py --build-dir "$BUILD_DIR" --results-dir "$RESULTS_DIR"
fi
# A hyperparameter search on digits: 64 trials, the full search against the daemon's halving
# against Optuna's pruner over plain PyTorch loops (search.json); BENCH_SEARCH=0 skips it.
if [ "${BENCH_SEARCH:-1}" != 0 ]; then
  "$(python/venv.sh "$PYTHON")" bench/search.py --build-dir "$BUILD_DIR" --results-dir "$RESULTS_DIR"
fi
# A packed sweep member's values against the same job alone, beside the job alone's own drift
# under two threads or the fused path, and the CPU's packs in turn against stacked;
# BENCH_PACKED=0 skips it.
if [ "${BENCH_PACKED:-1}" != 0 ]; then
  mkdir -p "$RESULTS_DIR"
  "$BUILD_DIR/tests/engine/packed_numerics_bench" --json "$RESULTS_DIR/packed_numerics.json"
fi
if [ "${BENCH_LOAD_SECONDS:-60}" != 0 ]; then
  mkdir -p "$RESULTS_DIR"
  TRAINERD_LOAD_SECONDS="${BENCH_LOAD_SECONDS:-60}" TRAINERD_LOAD_REPORT="$RESULTS_DIR/load.txt" \
    TRAINERD_LOAD_WARMUP_SECONDS="${BENCH_LOAD_WARMUP_SECONDS:-30}" \
    TRAINERD_LOAD_NEIGHBOURS_REPORT="$RESULTS_DIR/load_neighbours.txt" \
    "$BUILD_DIR/tests/e2e/load_test" --gtest_brief=1
  echo "bench: load figures in $RESULTS_DIR/load.txt and, beside hostile neighbours, $RESULTS_DIR/load_neighbours.txt"
fi
