#!/usr/bin/env bash
# The Dockerfile's stage graph as a user builds it: `podman build .` with no build arguments and
# no target must give the image whose binaries come from the build stage, and
# `--target runtime-prebuilt` the one whose binaries come from build/image-out/. Checked in
# seconds on a skeleton of the Dockerfile: its FROM, ARG and COPY --from lines as they are (so the
# same names, defaults and references resolve), every other instruction dropped, and each stage
# that the runtime copies from writing a marker naming itself where its binaries would be. Debian
# 12's podman once failed the documented build at `FROM ${BINARIES}` ("short-name \"build\" did
# not resolve") while CI's build with arguments passed; this catches that kind of break without
# compiling trainerd.
#
#   tests/image/stage_graph.sh [DOCKERFILE]
#
# Needs podman and the base images the FROM lines name (build_and_run.sh imports them).
set -euo pipefail
dockerfile="${1:-Dockerfile}"
work="$(mktemp -d)"
trap 'rm -rf "$work"; podman rmi -f localhost/trainerd-stages:default localhost/trainerd-stages:prebuilt >/dev/null 2>&1 || true' EXIT
# A stage's name when its FROM line names one: "FROM x AS name".
awk '
  /^[[:space:]]*#/ { next }
  cont { cont = ($0 ~ /\\[[:space:]]*$/); next }
  toupper($1) == "FROM" {
    print
    name = (toupper($3) == "AS") ? $4 : ""
    if (name == "build" || name == "prebuilt") {
      print "COPY " name ".marker /out/bin/marker"
      print "COPY " name ".marker /out/lib/marker"
    }
    next
  }
  toupper($1) == "ARG" { print; next }
  toupper($1) == "COPY" && $2 ~ /^--from=/ { print; next }
  { cont = ($0 ~ /\\[[:space:]]*$/) }
' "$dockerfile" >"$work/Dockerfile"
echo build >"$work/build.marker"
echo prebuilt >"$work/prebuilt.marker"
marker() {  # the marker file in the image $1
  local c; c="$(podman create -q "$1" true)"
  podman cp "$c:/opt/trainerd/bin/marker" "$work/got" >/dev/null
  podman rm -f "$c" >/dev/null
  cat "$work/got"
}
podman build -q --isolation=chroot --pull=never -t localhost/trainerd-stages:default -f "$work/Dockerfile" "$work" \
  >/dev/null || { cat "$work/Dockerfile"; echo "stage_graph: podman build (no arguments) failed" >&2; exit 1; }
got="$(marker localhost/trainerd-stages:default)"
[ "$got" = build ] || { echo "stage_graph: the default image's binaries come from '$got', not the build stage" >&2; exit 1; }
podman build -q --isolation=chroot --pull=never --target runtime-prebuilt -t localhost/trainerd-stages:prebuilt \
  -f "$work/Dockerfile" "$work" >/dev/null ||
  { echo "stage_graph: podman build --target runtime-prebuilt failed" >&2; exit 1; }
got="$(marker localhost/trainerd-stages:prebuilt)"
[ "$got" = prebuilt ] || { echo "stage_graph: runtime-prebuilt's binaries come from '$got', not build/image-out" >&2; exit 1; }
echo "stage_graph: podman build with no arguments takes the build stage; --target runtime-prebuilt takes build/image-out"
