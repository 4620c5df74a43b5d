#!/usr/bin/env bash
# `make demo`: the seed question's job, for real. Starts trainerd on a free loopback port with a
# temporary data folder, uploads the seed's 800 rows with trainctl, trains linear:1 (sgd, lr 0.1,
# mse, batch 16, 100 epochs) while watching it, prints what was learned, and stops the daemon.
#
# Environment: BUILD_DIR (default build/release), PYTHON (a python3 with numpy; the Makefile passes
# the torch venv's), TRAINERD_DEVICE (default auto: the GPU when there is one).
set -euo pipefail

BUILD_DIR="${BUILD_DIR:-build/release}"
PYTHON="${PYTHON:-python3}"
DEVICE="${TRAINERD_DEVICE:-auto}"
TRAINERD="$BUILD_DIR/server/trainerd"
TRAINCTL="$BUILD_DIR/client/trainctl"

work="$(mktemp -d -t trainerd-demo.XXXXXX)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -KILL "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "starting trainerd (device $DEVICE, data in a temporary folder)"
"$TRAINERD" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_dir="$work/data" --device="$DEVICE" \
  >"$work/trainerd.out" 2>"$work/trainerd.log" &
daemon_pid=$!
# trainerd prints "trainerd listening on HOST:PORT (device ...)" once it serves.
for _ in $(seq 1 300); do
  grep -q 'listening on' "$work/trainerd.out" 2>/dev/null && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/trainerd.log" >&2; exit 1; }
  sleep 0.1
done
addr="$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$work/trainerd.out")"
[ -n "$addr" ] || { echo "trainerd did not start" >&2; cat "$work/trainerd.log" >&2; exit 1; }
cat "$work/trainerd.out"
export TRAINERD_ADDR="$addr"
"$TRAINCTL" health

step "writing the seed's data: 800 rows of y = 1 + 2x + 0.1 * noise"
"$PYTHON" bench/seed_data.py "$work/seed.csv"
head -3 "$work/seed.csv"

step "uploading it (it stays resident on the daemon's device)"
"$TRAINCTL" dataset upload seed "$work/seed.csv"

step "training linear:1 with sgd (lr 0.1), mse, batch 16, 100 epochs"
"$TRAINCTL" submit --dataset seed --model linear:1 --loss mse --optimizer sgd --lr 0.1 \
  --batch-size 16 --epochs 100 --seed 42 --watch | tee "$work/watch.txt"
job_id="$(head -1 "$work/watch.txt")"

step "result"
"$TRAINCTL" -o json job get "$job_id" >"$work/job.json"
"$PYTHON" - "$work/job.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
params = {p["name"]: p["values"] for p in job["parameters"]}
epochs = len(job["epochs"])
print(f"learned  y = {params['0.bias'][0]:.4f} + {params['0.weight'][0]:.4f} x   (true: y = 1 + 2 x)")
print(f"final loss {job['final_loss']:.6f} after {epochs} epochs on {job['device']}")
print(f"{int(job['steps'])} steps in {job['wall_seconds']:.2f} s ({job['samples_per_second']:.0f} samples/s), "
      f"{int(job['host_syncs'])} host syncs ({epochs} epochs + 1 parameter read-back)")
PY

step "why it ran at that speed (the job's device report)"
"$TRAINCTL" job get "$job_id" | sed -n '/^report:/,$p'

step "the daemon's devices, measured at start (trainctl diagnose)"
"$TRAINCTL" diagnose

metrics="$(sed -n 's/.*metrics on \(http[^ ]*\).*/\1/p' "$work/trainerd.out")"
step "Prometheus metrics at $metrics (a few of them)"
"$PYTHON" - "$metrics" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith(("trainerd_jobs_finished_total", "trainerd_epochs_total",
                        "trainerd_host_syncs_total", "trainerd_steps_total")):
        print(line)
PY

step "stopping trainerd"
kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=""
echo "trainerd stopped cleanly"
