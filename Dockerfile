# syntax=docker/dockerfile:1
# trainerd for GPU nodes: the daemon, trainctl and the module checker, nothing else.
#
#   docker build -t trainerd .
#   docker run --gpus all -p 50051:50051 -p 9400:9400 -v trainerd-data:/var/lib/trainerd \
#     -v ./token:/run/secrets/trainerd_token:ro trainerd
#
# No CUDA base image: PyPI's CUDA build of torch brings LibTorch and CUDA's runtime libraries
# (cuBLAS, cuDNN, NCCL, ...), and the NVIDIA Container Toolkit mounts the driver (libcuda, NVML)
# into the container at run time. See docs/DEPLOY.md.

ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# Where the binaries come from: the last stage, the default image, compiles them in the build
# stage below. `--target runtime-prebuilt` takes them instead from build/image-out/ in the build
# context, laid out as the build stage lays out /out (tests/image/build_and_run.sh does this in
# CI with the binaries `make test` has just built and tested, so that CI does not compile trainerd
# twice). Docker (BuildKit) and buildah/podman build only the stages the target needs. The choice
# is a target, not a `FROM ${ARG}` stage: buildah 1.28 (Debian 12's podman) does not resolve a
# stage named by an argument's default value ("short-name did not resolve").

# --- build: the project's own recipe (deploy/install-deps.sh, then a Release build) -------------
FROM ${DEBIAN_IMAGE} AS build
# The one pinned torch (LibTorch) version; change it here and in deploy/install-deps.sh together.
ARG TORCH_VERSION=2.11.0
ARG JOBS=2
# Behind a TLS-intercepting proxy, pip needs the proxy's CA: pass the bundle's path here and mount
# it into the build (tests/image/build_and_run.sh does). Empty on an ordinary network.
ARG PIP_CERT=
ENV TRAINERD_TORCH_VERSION=${TORCH_VERSION} \
    TRAINERD_TORCH_VENV=/opt/torch \
    TRAINERD_DEPS_PROFILE=build \
    DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The dependencies first, in a layer of their own: a change to the sources does not download
# torch again.
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh build/deps.env \
    && rm -rf /var/lib/apt/lists/* /root/.cache/pip
COPY . .
# The Makefile's own build (the same cmake arguments as make test's), without the tests.
# Then the binaries, stripped, and LibTorch's and CUDA's libraries, laid out in /out
# (deploy/image-out.sh, which CI also runs on the binaries it built: BINARIES=prebuilt).
RUN make build BUILD_DIR=build/image CMAKE_ARGS=-DTRAINERD_BUILD_TESTS=OFF JOBS="$JOBS" \
    && . build/deps.env \
    && deploy/image-out.sh build/image "$TRAINERD_TORCH_LIB" /out

# --- prebuilt: the same /out, made outside the image (--target runtime-prebuilt) ---------------
FROM scratch AS prebuilt
COPY build/image-out/ /out/

# --- runtime-base: what runs, and no compiler or Python; the binaries come in the last step ------
FROM ${RUNTIME_IMAGE} AS runtime-base
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends \
         libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-core1.0 libmicrohttpd12 \
         libgnutls30 libsqlite3-0 libssl3 libyaml-cpp0.7 libseccomp2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 trainerd \
    && useradd --system --uid 10001 --gid trainerd --home-dir /var/lib/trainerd \
         --shell /usr/sbin/nologin trainerd \
    && mkdir -p /var/lib/trainerd && chown trainerd:trainerd /var/lib/trainerd
# (DL3064: these name the token's file, not a token.)
# hadolint ignore=DL3064
ENV PATH=/opt/trainerd/bin:$PATH \
    LD_LIBRARY_PATH=/opt/trainerd/lib/torch/lib:/opt/trainerd/lib/nvidia/cu13/lib \
    # docker run --gpus all: the NVIDIA Container Toolkit mounts the driver, CUDA and NVML.
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    # Settings: every flag is also TRAINERD_<FLAG> (the command line wins). In a container the
    # daemon listens on every address, so it wants a token: a secret mounted at
    # /run/secrets/trainerd_token. Without one it refuses to start; TRAINERD_AUTH_TOKEN_FILE= and
    # TRAINERD_INSECURE=true run it without authentication on purpose.
    TRAINERD_LISTEN=0.0.0.0:50051 \
    TRAINERD_METRICS_LISTEN=0.0.0.0:9400 \
    TRAINERD_DATA_DIR=/var/lib/trainerd \
    TRAINERD_AUTH_TOKEN_FILE=/run/secrets/trainerd_token
# Submitted TorchScript trains in trainerd-worker, which confines itself with Landlock and seccomp:
# the runtime's seccomp profile must allow landlock_* and seccomp(2) (Docker 23 and containerd 1.6
# defaults do; docs/DEPLOY.md, "What a container runtime must allow").
USER 10001:10001
WORKDIR /var/lib/trainerd
VOLUME ["/var/lib/trainerd"]
EXPOSE 50051 9400
# The gRPC health service answers without a token (as Kubernetes' gRPC probes need).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["trainctl", "--addr", "127.0.0.1:50051", "--timeout", "4s", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["trainerd"]

# --- runtime-prebuilt: the binaries of a build made outside (CI's image test) --------------------
FROM runtime-base AS runtime-prebuilt
COPY --from=prebuilt /out/lib /opt/trainerd/lib
COPY --from=prebuilt /out/bin /opt/trainerd/bin

# --- runtime: the default image, with the binaries of the build stage ---------------------------
FROM runtime-base AS runtime
COPY --from=build /out/lib /opt/trainerd/lib
COPY --from=build /out/bin /opt/trainerd/bin
