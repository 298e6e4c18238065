# trainstep — the two commands a new user needs are `make demo` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
# The worker is ON explicitly, so a build directory configured without it is corrected.
CMAKE_FLAGS ?= -DTRAINSTEP_BUILD_WORKER=ON
# ccache hashes paths relative to the repository, so another clone of it (CI's) hits the cache.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1

.PHONY: deps configure build test test-unit check-format check-locks demo bench check-gpu-build clean flake-hunt goodput

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test: unit, integration, conformance. Bounded per test by CTest timeouts.
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) --timeout 600

# Every tracked C++ file as clang-format (.clang-format: Google, 100 columns) writes it.
check-format: deps check-locks
	./scripts/check-format.sh

# trainstep's own locks are absl::Mutex, which TSan understands through its annotations
# (tests/sanitizers/tsan.supp); checked with the format, so a slip fails CI in seconds.
check-locks:
	@! git grep -n -E 'std::(mutex|recursive_mutex|shared_mutex|condition_variable)|pthread_mutex_' \
	  -- '*.cc' '*.h' || { echo "check-locks: trainstep uses absl::Mutex only (tests/sanitizers/tsan.supp)" >&2; exit 1; }

# The process tests (integration, conformance, chaos) FLAKE_REPEAT times each, with every core
# kept busy, FLAKE_ROUNDS times in a row: a test that races a timer or a busy core fails here.
# FLAKE_REGEX narrows it to matching test names. About 25 min a round on 2 cores.
FLAKE_REPEAT ?= 3
FLAKE_ROUNDS ?= 1
FLAKE_REGEX ?=
flake-hunt: build
	FLAKE_ROUNDS=$(FLAKE_ROUNDS) BUILD_DIR=$(BUILD_DIR) ./scripts/flake-hunt.sh "$(FLAKE_REGEX)" $(FLAKE_REPEAT)

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

# Goodput under one worker SIGKILL a minute (RELIABILITY.md, "Goodput"): a fault-free reference
# of 180,000 updates, then the same job with workers {count 3, min 2}, each killed worker's slot
# starting a replacement. About 41 min on 2 cores; the summary is in CHAOS_OUT.
CHAOS_OUT ?= /tmp/trainstep-goodput
goodput: build
	/usr/bin/python3 tests/chaos/chaos.py --bin $(BUILD_DIR)/bin --kinds worker_kill --spares 0 \
	  --min-workers 2 --faults 19 --faults-per-job 19 --updates 180000 --checkpoint-every 4000 \
	  --gap 59.5,59.5 --seed 5 --out $(CHAOS_OUT)

clean:
	rm -rf $(BUILD_DIR) build-debian13 $(ASAN_BUILD_DIR) $(TSAN_BUILD_DIR)

# --- Sanitizers and fuzzing (README "Tests", SECURITY.md) ----------------------------------
# Clang 14 builds without LibTorch (coordinator, client, common, the worker's data readers and
# checkpoint formats), each in its own build directory. One ASan+UBSan build serves both
# check-asan and the fuzzers. -O1 with line tables: reports name file:line, builds stay cheap.
SAN_CXX ?= clang++-14
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
FUZZ_SECONDS ?= 300
FUZZ_JOBS ?= 2
FUZZ_SEED ?=
SAN_CMAKE_FLAGS = -DCMAKE_CXX_COMPILER=$(SAN_CXX) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DTRAINSTEP_BUILD_WORKER=OFF
# Any report fails the test that triggered it (sanitized child processes included).
# tests/sanitizers/lsan.supp: only allocations made inside uninstrumented c-ares.
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 \
  LSAN_OPTIONS=suppressions=$(abspath tests/sanitizers/lsan.supp):print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# tests/sanitizers/tsan.supp: interceptor calls made inside uninstrumented libraries and
# prometheus-cpp's mutex (each entry says why); with Debian's uninstrumented gRPC (check-tsan-
# core), tsan-system-grpc.supp's lines too: they name races inside gRPC's headers.
TSAN_OPTS = halt_on_error=1:second_deadlock_stack=1
TSAN_SHIM = LD_PRELOAD=$(abspath $(TSAN_BUILD_DIR))/lib/libtrainstep_tsan_absl_shim.so
TSAN_SYSTEM_GRPC_SUPP = $(abspath $(TSAN_BUILD_DIR))/tsan-system-grpc.supp
TSAN_ENV = TSAN_OPTIONS=$(TSAN_OPTS):suppressions=$(TSAN_SYSTEM_GRPC_SUPP) $(TSAN_SHIM)
TSAN_GRPC_ENV = TSAN_OPTIONS=$(TSAN_OPTS):suppressions=$(abspath tests/sanitizers/tsan.supp) $(TSAN_SHIM)
SAN_CTEST = ctest --output-on-failure -j $(JOBS) --timeout 900

.PHONY: configure-asan check-asan fuzz configure-tsan tsan-build check-tsan check-tsan-core

configure-asan: deps
	cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja $(SAN_CMAKE_FLAGS) \
	  -DTRAINSTEP_SANITIZE=address,undefined -DTRAINSTEP_FUZZ=ON

# Every test of that build under ASan + UBSan, the fuzz corpora replayed once included.
check-asan: configure-asan
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	$(ASAN_ENV) $(SAN_CTEST) --test-dir $(ASAN_BUILD_DIR)

# Every fuzz target for FUZZ_SECONDS (default 300), FUZZ_JOBS at a time; CI runs 60 s with
# FUZZ_SEED=1 (reproducible); without FUZZ_SEED each run explores anew.
fuzz: configure-asan
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	FUZZ_SEED=$(FUZZ_SEED) ./tests/fuzz/run.sh $(ASAN_BUILD_DIR) $(FUZZ_SECONDS) $(FUZZ_JOBS)

# TSAN_GRPC: a folder of gRPC's libraries built with TSan (check-tsan sets it; empty: the
# system's uninstrumented ones, as check-tsan-core uses them).
TSAN_GRPC ?=
configure-tsan: deps
	cmake -S . -B $(TSAN_BUILD_DIR) -G Ninja $(SAN_CMAKE_FLAGS) -DTRAINSTEP_SANITIZE=thread \
	  -DTRAINSTEP_TSAN_GRPC=$(TSAN_GRPC)

tsan-build: configure-tsan check-locks
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS)
	cat tests/sanitizers/tsan.supp tests/sanitizers/tsan-system-grpc.supp >$(TSAN_SYSTEM_GRPC_SUPP)

# Every test of that build under TSan, with gRPC itself built with TSan from the Debian source
# package the system's came from (scripts/tsan-grpc.sh: cached in /var/cache/trainstep, ~9 min
# cold on 2 cores), so that TSan sees both halves of gRPC's callback code: the half its headers
# inline into our binaries and the half inside libgrpc that orders it; so no suppression of
# tests/sanitizers/tsan-system-grpc.supp applies.
check-tsan: deps
	grpc=$$(./scripts/tsan-grpc.sh ensure) || exit 1; \
	  $(MAKE) --no-print-directory tsan-build TSAN_GRPC=$$grpc || exit 1; \
	  ldd $(TSAN_BUILD_DIR)/bin/trainstep-coordinator | grep -q "libgrpc\.so\.[0-9]* => $$grpc/" || \
	  { echo "check-tsan: the TSan build does not load libgrpc from $$grpc" >&2; exit 1; }
	$(TSAN_GRPC_ENV) $(SAN_CTEST) --test-dir $(TSAN_BUILD_DIR)

# The tests that start a gRPC server, a /metrics endpoint or processes: with Debian's
# uninstrumented libgrpc, TSan reports races inside gRPC's header-inlined callback code whose
# ordering happens inside libgrpc (SECURITY.md, "ThreadSanitizer status"). check-tsan-core runs
# every other test under TSan: the journal's and the coordinator's own threads, the step
# machine, the registry, the readers. check-tsan runs all, with gRPC built with TSan; CI runs
# that, and this only when its budget has no room for gRPC's build.
TSAN_SERVER_TESTS = ^(CliE2eTest|CliTest|SecurityProcessTest|LoopbackTest|LimitsProcessTest|CoordinatorProcessTest|StructuredLogTest|MetricsHttpTest|MetricsExpositionTest|MetricsEndpointTest|PrometheusServerTest|GrafanaDashboardTest|JobPlotCommandTest)[.]|^python_
check-tsan-core: tsan-build
	$(TSAN_ENV) $(SAN_CTEST) --test-dir $(TSAN_BUILD_DIR) -E '$(TSAN_SERVER_TESTS)'
