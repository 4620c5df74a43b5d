# trainerd: the two commands that matter are `make demo` and `make test` (see README.md).
# Each installs what is missing (deploy/install-deps.sh), configures and builds, then does its job.

BUILD_TYPE ?= Release
BUILD_DIR  ?= build/$(shell echo $(BUILD_TYPE) | tr A-Z a-z)
DEPS_ENV   := build/deps.env
JOBS       ?= 2
# More cmake arguments for the main build, e.g. -DTRAINERD_BUILD_TESTS=OFF (the Dockerfile's).
CMAKE_ARGS ?=
# The sanitizer and fuzzing builds live beside the main one and are incremental too.
ASAN_BUILD_DIR ?= build/asan
FUZZ_BUILD_DIR ?= build/fuzz
FUZZ_SECONDS   ?= 30

# cmake's arguments for LibTorch and the CUDA toolkit, from deps.env (sourced in the same shell).
TORCH_CMAKE_ARGS = -DCMAKE_PREFIX_PATH="$$TRAINERD_TORCH_PREFIX" \
	    -DCUDAToolkit_ROOT="$$TRAINERD_CUDA_ROOT" -DCUDA_TOOLKIT_ROOT_DIR="$$TRAINERD_CUDA_ROOT" \
	    -DCMAKE_CUDA_COMPILER="$$TRAINERD_CUDA_ROOT/bin/nvcc" -DTORCH_CUDA_ARCH_LIST="9.0" \
	    -DTRAINERD_CCACHE_DIR="$$TRAINERD_CCACHE_DIR"

# What the sanitizer build runs: the unit and service (integration) tests, and what they start.
ASAN_TARGETS = common_test client_test monitor_test http_test engine_test metrics_test \
	service_test store_test job_records_test trainerd_module_check trainerd_worker pickle_check_test \
	sandbox_test
FUZZ_TARGETS = csv_reader_fuzz npy_reader_fuzz model_spec_fuzz dataset_header_fuzz \
	module_check_fuzz pickle_check_fuzz safetensors_fuzz exported_program_fuzz

.PHONY: all deps configure build test test-gpu test-asan fuzz demo bench deploy-check test-image python docs clean help

all: build

help:
	@echo "make demo     run the seed scenario on a real daemon and client"
	@echo "make test     build and run every test (ctest)"
	@echo "make test-asan  the unit and service tests under AddressSanitizer and UBSan"
	@echo "make fuzz     build the libFuzzer targets and run each for FUZZ_SECONDS (30)"
	@echo "make bench    trainerd vs the seed's PyTorch loops (bench/README.md)"
	@echo "make deploy-check  lint the Dockerfile, Kubernetes, Compose, systemd and YAML files"
	@echo "make test-image    build the image with podman and run its trainerd and trainctl (root)"
	@echo "make python   the Python client (python/) as a wheel in build/python/"
	@echo "make docs     write docs/CONFIGURATION.md's flags and docs/CLI.md's command help from the binaries"
	@echo "make build    configure and build ($(BUILD_TYPE)) into $(BUILD_DIR)"
	@echo "make clean    remove $(BUILD_DIR)"

deps:
	@deploy/install-deps.sh $(DEPS_ENV)

# CMake re-runs itself from ninja when a CMakeLists.txt changes; it is configured explicitly only
# the first time or when the cache is missing.
configure: deps
	@. ./$(DEPS_ENV) && \
	if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(TORCH_CMAKE_ARGS) $(CMAKE_ARGS) \
	    -DTRAINERD_PYTHON="$$TRAINERD_TORCH_VENV/bin/python" >/dev/null; \
	fi

build: configure
	@ninja -C $(BUILD_DIR) -j $(JOBS)

test: build
	@. ./$(DEPS_ENV) && cd $(BUILD_DIR) && TRAINERD_PYTHON="$$TRAINERD_TORCH_VENV/bin/python" \
	  ctest --output-on-failure -j $(JOBS) --timeout 300

# The references' generated parts from this build's binaries: docs/CONFIGURATION.md's flags and
# docs/CLI.md's command help (docs/generate.py; the docs_generated test checks them).
docs: build
	@python3 docs/generate.py --trainerd $(BUILD_DIR)/server/trainerd \
	  --trainctl $(BUILD_DIR)/client/trainctl

# The deployment files, checked without a container engine (deploy/check.sh).
deploy-check: build
	@deploy/check.sh $(BUILD_DIR)/server/trainerd

# The Dockerfile's image built for real (podman, chroot isolation) and its binaries run
# (tests/image/build_and_run.sh). Needs root. By default the image takes the binaries this build
# made (IMAGE_BINARIES=prebuilt: no second compile); IMAGE_BINARIES=build compiles them in the
# Dockerfile's build stage, as `docker build` does.
IMAGE_BINARIES ?= prebuilt
test-image: $(if $(filter prebuilt,$(IMAGE_BINARIES)),build,deps)
	@IMAGE_BINARIES=$(IMAGE_BINARIES) BUILD_DIR=$(BUILD_DIR) tests/image/build_and_run.sh

# The unit and service tests built with AddressSanitizer and UndefinedBehaviorSanitizer (-O1, so
# that the build stays quick; the tests' own files -O0: tests/CMakeLists.txt). Leak checking is off: LibTorch and gRPC keep process-lifetime
# allocations that LeakSanitizer would report on every test.
test-asan: deps
	@. ./$(DEPS_ENV) && \
	if [ ! -f $(ASAN_BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTRAINERD_SANITIZE=ON \
	    -DTRAINERD_TEST_OPTIMIZATION=-O0 \
	    $(TORCH_CMAKE_ARGS) >/dev/null; \
	fi && \
	ninja -C $(ASAN_BUILD_DIR) -j $(JOBS) $(ASAN_TARGETS) && \
	cd $(ASAN_BUILD_DIR) && \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 600 -L 'unit|integration'

# The libFuzzer targets (clang), each run for FUZZ_SECONDS from its seed corpus in tests/fuzz/.
fuzz: deps
	@. ./$(DEPS_ENV) && \
	if [ ! -f $(FUZZ_BUILD_DIR)/build.ninja ]; then \
	  CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DTRAINERD_FUZZ=ON -DTRAINERD_BUILD_TESTS=OFF -DTRAINERD_WARNINGS_AS_ERRORS=OFF \
	    $(TORCH_CMAKE_ARGS) >/dev/null; \
	fi && \
	ninja -C $(FUZZ_BUILD_DIR) -j $(JOBS) $(FUZZ_TARGETS) && \
	tests/fuzz/run.sh $(FUZZ_BUILD_DIR)/tests/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The Python client (python/README.md) as a wheel: pip install build/python/trainerd-*.whl
# (its gRPC modules are generated from proto/ by grpcio-tools while the wheel is built).
python: deps
	@. ./$(DEPS_ENV) && "$$TRAINERD_TORCH_VENV/bin/python" -m pip wheel -q --no-deps \
	  --disable-pip-version-check -w build/python ./python && ls build/python/trainerd-*.whl

# Only the GPU-labelled tests (they skip themselves without a CUDA device).
test-gpu: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L gpu

demo: build
	@. ./$(DEPS_ENV) && BUILD_DIR=$(BUILD_DIR) PYTHON="$$TRAINERD_TORCH_VENV/bin/python" deploy/demo.sh

bench: build
	@. ./$(DEPS_ENV) && BUILD_DIR=$(BUILD_DIR) PYTHON="$$TRAINERD_TORCH_VENV/bin/python" bench/run.sh

clean:
	rm -rf $(BUILD_DIR)
