# trainerd: the two commands that matter are `make demo` and `make test` (see README.md).
# Each installs what is missing (deploy/install-deps.sh), configures and builds, then does its job.

BUILD_TYPE ?= Release
BUILD_DIR  ?= build/$(shell echo $(BUILD_TYPE) | tr A-Z a-z)
DEPS_ENV   := build/deps.env
JOBS       ?= 2

.PHONY: all deps configure build test test-gpu demo bench clean help

all: build

help:
	@echo "make demo     run the seed scenario on a real daemon and client"
	@echo "make test     build and run every test (ctest)"
	@echo "make bench    trainerd vs the seed's PyTorch loops (bench/README.md)"
	@echo "make build    configure and build ($(BUILD_TYPE)) into $(BUILD_DIR)"
	@echo "make clean    remove $(BUILD_DIR)"

deps:
	@deploy/install-deps.sh $(DEPS_ENV)

# CMake re-runs itself from ninja when a CMakeLists.txt changes; it is configured explicitly only
# the first time or when the cache is missing.
configure: deps
	@. ./$(DEPS_ENV) && \
	if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	    -DCMAKE_PREFIX_PATH="$$TRAINERD_TORCH_PREFIX" \
	    -DCUDAToolkit_ROOT="$$TRAINERD_CUDA_ROOT" -DCUDA_TOOLKIT_ROOT_DIR="$$TRAINERD_CUDA_ROOT" \
	    -DCMAKE_CUDA_COMPILER="$$TRAINERD_CUDA_ROOT/bin/nvcc" \
	    -DTORCH_CUDA_ARCH_LIST="9.0" \
	    -DTRAINERD_PYTHON="$$TRAINERD_TORCH_VENV/bin/python" >/dev/null; \
	fi

build: configure
	@ninja -C $(BUILD_DIR) -j $(JOBS)

test: build
	@. ./$(DEPS_ENV) && cd $(BUILD_DIR) && TRAINERD_PYTHON="$$TRAINERD_TORCH_VENV/bin/python" \
	  ctest --output-on-failure -j $(JOBS) --timeout 300

# Only the GPU-labelled tests (they skip themselves without a CUDA device).
test-gpu: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L gpu

demo: build
	@. ./$(DEPS_ENV) && BUILD_DIR=$(BUILD_DIR) PYTHON="$$TRAINERD_TORCH_VENV/bin/python" deploy/demo.sh

bench: build
	@. ./$(DEPS_ENV) && BUILD_DIR=$(BUILD_DIR) PYTHON="$$TRAINERD_TORCH_VENV/bin/python" bench/run.sh

clean:
	rm -rf $(BUILD_DIR)
