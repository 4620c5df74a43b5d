#!/usr/bin/env bash
# The one GPU-session script (see ../shared/device/NOTES.md): run on the GPU host from the project
# root, with .gpu-deps/ (bench/gpu/prepare.sh) carried along and RESULTS_DIR=$OUT. Checks first,
# times second, a short table last:
#   1. environment: nvidia-smi, torch and CUDA versions, missing libraries;
#   2. correctness: the GPU tests (seed job on cuda converges like on the CPU, host_syncs);
#   3. timings: bench/bench.py on cpu and cuda (trainerd vs the seed's PyTorch loops).
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
"$DEPS/bin/engine_gpu_test" --gtest_output="json:$RESULTS_DIR/gpu_test.json" 2>&1 |
  tee "$RESULTS_DIR/gpu_test.txt" | tail -5 || status=1

# bench.py expects the build layout (server/trainerd, client/trainctl).
mkdir -p "$DEPS/build/server" "$DEPS/build/client"
ln -sf "$DEPS/bin/trainerd" "$DEPS/build/server/trainerd"
ln -sf "$DEPS/bin/trainctl" "$DEPS/build/client/trainctl"
"$PY" bench/bench.py --build-dir "$DEPS/build" --seed-script "$DEPS/seed_scenario.py" \
  --devices cpu,cuda --results-dir "$RESULTS_DIR" 2>&1 | tee "$RESULTS_DIR/bench.txt" || status=1
exit $status
