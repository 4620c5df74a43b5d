#!/usr/bin/env bash
# Builds the Dockerfile's image for real and runs what it holds (make test-image; .ci/run).
#
# No container engine can start containers on these machines, and no registry serves base
# images, so:
#   1. the base is made with debootstrap (a minimal bookworm) and imported under the exact names
#      the Dockerfile's FROM lines use (debian:bookworm, debian:bookworm-slim);
#   2. `podman build --isolation=chroot --format docker` builds the image (the Docker format keeps
#      the HEALTHCHECK, which OCI images drop; chroot builds work where containers
#      cannot start). By default (IMAGE_BINARIES=prebuilt, as CI runs it) the binaries are the
#      ones BUILD_DIR holds, which `make test` has just built and tested: deploy/image-out.sh
#      lays them out with LibTorch's libraries in build/image-out/, exactly as the Dockerfile's
#      build stage lays out its own, and the build takes them (--target runtime-prebuilt)
#      instead of compiling trainerd and downloading torch a second time. Before it,
#      tests/image/stage_graph.sh checks in seconds that the build with no arguments and no
#      target, as documented, takes the build stage. IMAGE_BINARIES=build builds the
#      Dockerfile's default image from the sources, as `docker build .` does: the
#      machine reaches PyPI through a CA of its own, which a debootstrapped base lacks, so the
#      host's bundle is mounted read-only into the build and named by the PIP_CERT build
#      argument, as builds behind a corporate proxy do;
#   3. the image is mounted (`podman image mount`) and checked: no compiler, no Python, LibTorch's
#      CUDA library present, a non-root user, the ports, the volume and the health check;
#   4. the image's own trainerd is started under chroot as the image's user with the image's
#      environment, and the image's own trainctl runs health, an upload and a small job.
# Needs root, podman and debootstrap (deploy/install-deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK="${TRAINERD_IMAGE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/trainerd/image}"
IMAGE="localhost/trainerd:test"
BINARIES="${IMAGE_BINARIES:-prebuilt}"
BUILD_DIR="${BUILD_DIR:-build/release}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
start=$SECONDS
log() { printf 'test-image: [%4d s] %s\n' "$((SECONDS - start))" "$*"; }
fail() { log "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, podman image mount)"
mkdir -p "$WORK"

# --- 1. the base images ---------------------------------------------------------------------------
if ! podman image exists docker.io/library/debian:bookworm; then
  if [ ! -s "$WORK/bookworm-minbase.tar" ]; then
    log "debootstrap: a minimal bookworm from $MIRROR"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
      { tail -20 "$WORK/debootstrap.log"; fail "debootstrap"; }
    rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
    tar -C "$WORK/rootfs" -cf "$WORK/bookworm-minbase.tar" .
    rm -rf "$WORK/rootfs"
  fi
  podman import -q "$WORK/bookworm-minbase.tar" docker.io/library/debian:bookworm >/dev/null
fi
podman tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim
log "base images ready"
# The stage graph as `podman build .` with no arguments walks it (seconds, no compile).
tests/image/stage_graph.sh Dockerfile || fail "the Dockerfile's stages (tests/image/stage_graph.sh)"
log "stage graph: the default image builds its binaries, --target runtime-prebuilt takes them"

# --- 2. the build -----------------------------------------------------------------------------------
case "$BINARIES" in
  prebuilt)
    [ -x "$BUILD_DIR/server/trainerd" ] || fail "no $BUILD_DIR/server/trainerd: run make build first"
    [ -f build/deps.env ] || fail "no build/deps.env: run make deps first"
    torch_lib="$(. build/deps.env && echo "$TRAINERD_TORCH_LIB")"
    deploy/image-out.sh "$BUILD_DIR" "$torch_lib" build/image-out
    trap 'rm -rf build/image-out' EXIT
    log "podman build --isolation=chroot --target runtime-prebuilt, with the binaries of $BUILD_DIR"
    target=(--target runtime-prebuilt)
    ;;
  build)
    log "podman build --isolation=chroot (the build stage runs install-deps and a Release build)"
    target=()
    ;;
  *) fail "IMAGE_BINARIES must be prebuilt or build, not '$BINARIES'" ;;
esac
podman build --isolation=chroot --pull=never --layers --format docker -t "$IMAGE" \
  --volume "$HOST_CA:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt \
  "${target[@]}" --build-arg JOBS="${JOBS:-2}" -f Dockerfile . \
  >"$WORK/build.log" 2>&1 ||
  { tail -40 "$WORK/build.log"; fail "podman build (log: $WORK/build.log)"; }
rm -rf build/image-out
trap - EXIT
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
log "built $IMAGE: $((size / 1000000)) MB"

# --- 3. what the image holds --------------------------------------------------------------------------
inspect() { podman image inspect --format "$1" "$IMAGE"; }
[ "$(inspect '{{.Config.User}}')" = "10001:10001" ] || fail "the image's user is '$(inspect '{{.Config.User}}')'"
inspect '{{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}' | grep -q '50051/tcp' || fail "50051 not exposed"
inspect '{{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}' | grep -q '9400/tcp' || fail "9400 not exposed"
inspect '{{range $v, $_ := .Config.Volumes}}{{$v}} {{end}}' | grep -q '/var/lib/trainerd' || fail "no data volume"
inspect '{{json .Config.Healthcheck}}' | grep -q 'health' || fail "no health check"
mapfile -t image_env < <(inspect '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
printf '%s\n' "${image_env[@]}" | grep -q '^NVIDIA_DRIVER_CAPABILITIES=compute,utility$' ||
  fail "NVIDIA_DRIVER_CAPABILITIES is not compute,utility"

MNT=$(podman image mount "$IMAGE")  # read-only
ROOT="$WORK/root"                   # the image with a scratch layer on top, as a container has
cleanup() {
  set +e
  [ -n "${daemon_pid:-}" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  umount "$ROOT/proc" "$ROOT/dev" "$ROOT" 2>/dev/null
  rm -rf "$WORK/upper" "$WORK/overlay-work"
  podman image unmount "$IMAGE" >/dev/null 2>&1
}
trap cleanup EXIT
for tool in gcc g++ cc c++ clang ld as make cmake python3 python pip; do
  for dir in usr/bin usr/local/bin bin; do
    [ -e "$MNT/$dir/$tool" ] && fail "the image holds /$dir/$tool"
  done
done
ls "$MNT"/usr/lib/x86_64-linux-gnu/libpython3* >/dev/null 2>&1 && fail "the image holds libpython"
[ -f "$MNT/opt/trainerd/lib/torch/lib/libtorch_cuda.so" ] || fail "no libtorch_cuda.so"
[ -f "$MNT/opt/trainerd/lib/nvidia/cu13/lib/libcudart.so.13" ] || fail "no CUDA runtime"
for bin in trainerd trainctl trainerd-module-check trainerd-worker; do
  [ -x "$MNT/opt/trainerd/bin/$bin" ] || fail "no /opt/trainerd/bin/$bin"
done
log "the image holds the binaries and LibTorch's CUDA libraries, no compiler and no Python; user 10001"

# --- 4. the image's trainerd and trainctl, under chroot, as the image's user ---------------------------
# (A run that was killed may have left its mounts: take them down first.)
umount "$ROOT/proc" "$ROOT/dev" "$ROOT" 2>/dev/null || true
rm -rf "$WORK/upper" "$WORK/overlay-work"
mkdir -p "$WORK/upper" "$WORK/overlay-work" "$ROOT"
mount -t overlay overlay \
  -o "lowerdir=$MNT,upperdir=$WORK/upper,workdir=$WORK/overlay-work" "$ROOT"
mount -t proc proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"
mkdir -p "$ROOT/run/secrets" "$ROOT/tmp/trainerd-test"
token="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf 'ci:%s\n' "$token" >"$ROOT/run/secrets/trainerd_token"
chown 10001:10001 "$ROOT/run/secrets/trainerd_token" "$ROOT/tmp/trainerd-test"
chmod 0400 "$ROOT/run/secrets/trainerd_token"
in_image() {  # runs a command inside the image as its user, with the image's environment
  chroot --userspec=10001:10001 "$ROOT" /usr/bin/env -i "${image_env[@]}" HOME=/var/lib/trainerd "$@"
}
# The image's settings, except a free loopback port for this test and no start-up measurement.
# (exec: the background job's PID is trainerd's own, so that SIGTERM reaches the daemon.)
(exec chroot --userspec=10001:10001 "$ROOT" /usr/bin/env -i "${image_env[@]}" \
  HOME=/var/lib/trainerd /opt/trainerd/bin/trainerd --device=cpu --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 --diagnose_at_start=false) >"$WORK/daemon.out" 2>"$WORK/daemon.err" &
daemon_pid=$!
for _ in $(seq 1 100); do
  grep -q 'listening on' "$WORK/daemon.out" 2>/dev/null && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$WORK/daemon.err"; fail "trainerd exited"; }
  sleep 0.2
done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$WORK/daemon.out" | head -1)
[ -n "$addr" ] || { cat "$WORK/daemon.err"; fail "trainerd did not say where it listens"; }
log "the image's trainerd listens on $addr as uid 10001 with the image's environment"
ctl() { in_image /opt/trainerd/bin/trainctl --addr "$addr" --token-file /run/secrets/trainerd_token "$@"; }
# The first call may meet a loaded machine (CI builds beside this test): health is asked again for
# up to ten seconds, as the image's HEALTHCHECK retries, and every refusal is shown.
healthy=""
for attempt in $(seq 1 20); do
  if answer=$(ctl health 2>&1) && echo "$answer" | grep -q SERVING; then healthy=1; break; fi
  echo "test-image: health, try $attempt: $answer" >&2
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$WORK/daemon.err"; fail "trainerd exited"; }
  sleep 0.5
done
[ -n "$healthy" ] || { cat "$WORK/daemon.err"; fail "health"; }
# Without the token the daemon refuses: the secret is what lets callers in.
if in_image /opt/trainerd/bin/trainctl --addr "$addr" dataset list >/dev/null 2>&1; then
  fail "a call without the token was answered"
fi
python_free_csv="$ROOT/tmp/trainerd-test/seed.csv"
awk 'BEGIN { print "x,y"; for (i = 0; i < 400; i++) { x = i / 400; printf "%.6f,%.6f\n", x, 1 + 2 * x } }' \
  >"$python_free_csv"
chown 10001:10001 "$python_free_csv"
ctl dataset upload seed /tmp/trainerd-test/seed.csv >/dev/null || fail "upload"
out=$(ctl submit --dataset seed --model linear:1 --lr 0.5 --epochs 30 --batch-size 32 --watch) ||
  { echo "$out"; fail "the job did not succeed"; }
echo "$out" | grep -q SUCCEEDED || { echo "$out"; fail "the job did not succeed"; }
# The sandbox of submitted code as the image runs it (uid 10001, measured at the daemon's start):
# every required part holds (a chroot allows no user namespace, so no network namespace here).
diag=""
for _ in $(seq 1 100); do
  diag=$(ctl diagnose 2>/dev/null) && echo "$diag" | grep -q 'trainerd-module-check:' && break
  sleep 0.3
done
echo "$diag" | grep -q 'trainerd-module-check: complete' ||
  { echo "$diag"; fail "the sandbox of submitted code is not complete in the image"; }
kill -TERM "$daemon_pid"; wait "$daemon_pid" || fail "trainerd did not exit 0 at SIGTERM"
daemon_pid=
log "ok: health, an upload, a job and the sandbox through the image's trainctl; clean stop at SIGTERM"
