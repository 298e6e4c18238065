# trainstep — the two commands a new user needs are `make demo` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
# The worker is ON explicitly, so a build directory configured without it is corrected.
CMAKE_FLAGS ?= -DTRAINSTEP_BUILD_WORKER=ON

.PHONY: deps configure build test test-unit demo bench check-gpu-build clean

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test: unit, integration, conformance. Bounded per test by CTest timeouts.
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) --timeout 600

test-unit: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) -L unit

# The CUDA worker (LibTorch 2.6 + CUDA + NCCL) built and tested in a cached Debian 13 root
# (scripts/debian13-root.sh, scripts/check-gpu-build.sh); needs root or sudo, no GPU.
check-gpu-build: deps
	./scripts/check-gpu-build.sh

demo: build
	./deploy/local/demo.sh

bench: build
	./tests/bench/run.sh

clean:
	rm -rf $(BUILD_DIR) build-debian13
