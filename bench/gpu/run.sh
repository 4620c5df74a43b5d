#!/usr/bin/env bash
# The one GPU-session script (see ../shared/device/NOTES.md): run on the GPU host from the project
# root, with .gpu-deps/ (bench/gpu/prepare.sh) carried along and RESULTS_DIR=$OUT. Checks first,
# times second, a short table last:
#   1. environment: nvidia-smi, torch and CUDA versions, missing libraries;
#   2. correctness: the GPU tests (seed job on cuda converges like on the CPU, host_syncs);
#   3. observability: Diagnose, devices, the seed job's report and /metrics (NVML's GPU series);
#   4. timings: bench/bench.py on cpu and cuda (trainerd vs the seed's PyTorch loops).
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS_DIR="${RESULTS_DIR:-/tmp/trainerd-gpu-results}"
mkdir -p "$RESULTS_DIR"
DEPS="$PWD/.gpu-deps"
PY="${PYTHON:-python3}"
TORCH_LIB="$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$DEPS/root/usr/lib/x86_64-linux-gnu:$DEPS/root/lib/x86_64-linux-gnu:$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
} 2>&1 | tee "$RESULTS_DIR/env.txt"
missing=$(ldd "$DEPS/bin/trainerd" "$DEPS/bin/trainctl" | grep 'not found' || true)
if [ -n "$missing" ]; then echo "missing libraries: $missing" | tee -a "$RESULTS_DIR/env.txt"; exit 1; fi

status=0
# A GPU test that finds no device fails here instead of skipping.
export REQUIRE_CUDA=1
"$DEPS/bin/engine_gpu_test" --gtest_output="json:$RESULTS_DIR/gpu_test.json" 2>&1 |
  tee "$RESULTS_DIR/gpu_test.txt" | tail -5 || status=1

# bench.py expects the build layout (server/trainerd, client/trainctl).
# On real hardware: NVML through dlopen, Diagnose on cuda:0, /metrics with GPU series.
obs="$RESULTS_DIR/observability"
mkdir -p "$obs"
"$DEPS/bin/trainerd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --device=cuda \
  --data_dir="$(mktemp -d)" >"$obs/trainerd.out" 2>"$obs/trainerd.log" &
obs_pid=$!
for _ in $(seq 100); do grep -q 'metrics on' "$obs/trainerd.out" 2>/dev/null && break; sleep 0.1; done
obs_addr="$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$obs/trainerd.out")"
obs_metrics="$(sed -n 's/.*metrics on \(http[^ ]*\).*/\1/p' "$obs/trainerd.out")"
if [ -n "$obs_addr" ]; then
  ctl() { "$DEPS/bin/trainctl" --addr "$obs_addr" "$@"; }
  ctl diagnose 2>&1 | tee "$obs/diagnose.txt"
  ctl devices 2>&1 | tee "$obs/devices.txt"
  "$PY" bench/seed_data.py "$obs/seed.csv" >/dev/null && ctl dataset upload seed "$obs/seed.csv" >/dev/null
  ctl submit --dataset seed --model linear:1 --lr 0.1 --batch-size 16 --epochs 100 --seed 42 \
    --watch >"$obs/watch.txt" 2>&1
  ctl job get "$(head -1 "$obs/watch.txt")" 2>&1 | tee "$obs/job.txt" | sed -n '/^report:/,$p'
  "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "$obs_metrics" >"$obs/metrics.txt" 2>&1 || status=1
  if ! grep -E '^trainerd_gpu_' "$obs/metrics.txt"; then
    echo "no trainerd_gpu_ series: NVML gave nothing (see $obs/trainerd.log)"; status=1
  fi
else
  echo "observability: trainerd did not start" | tee -a "$obs/trainerd.log"; status=1
fi
kill -TERM "$obs_pid" 2>/dev/null; wait "$obs_pid" 2>/dev/null

mkdir -p "$DEPS/build/server" "$DEPS/build/client"
ln -sf "$DEPS/bin/trainerd" "$DEPS/build/server/trainerd"
ln -sf "$DEPS/bin/trainctl" "$DEPS/build/client/trainctl"
"$PY" bench/bench.py --build-dir "$DEPS/build" --seed-script "$DEPS/seed_scenario.py" \
  --devices cpu,cuda --repeats 3 --workloads seed,sweep,mlp3,mlp \
  --results-dir "$RESULTS_DIR" 2>&1 | tee "$RESULTS_DIR/bench.txt" || status=1
exit $status
