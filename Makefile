# wick's front door. `make run` and `make test` work on a fresh machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
WICK := $(BUILD)/bin/wick

.PHONY: all setup configure build test test-emu test-emu-race run bench bench-cpu format clean test-asan test-asan-full test-tsan fuzz

all: build

setup:
	@./scripts/setup

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: setup configure
	cmake --build $(BUILD) -j $(JOBS)

model: setup
	@./scripts/fetch_model >/dev/null

# ctest -j runs several tests at once, each with an OpenMP team of all cores:
# threads that spin at the team's barriers starve the other test's threads
# (a pair of default-model tests 8.7-48 s spinning, 4.2 s passive; the whole
# suite's ctest 8 -> 5 min on 2 cores, docs/security.md). Tests only: a lone
# wick is quicker spinning.
CTEST_ENV = OMP_WAIT_POLICY=passive

test: build model
	cd $(BUILD) && $(CTEST_ENV) ctest -j $(JOBS) --output-on-failure

# Every GPU test on the CUDA emulator (tests/cuda_emu, docs/cuda_emu.md), for a
# machine with no GPU: `make test` runs the quick ones (label emu); these are
# all of them, the products at a prefill's size included, with the kernels
# under AddressSanitizer (about 1.5 hours of one core; EMU_FILTER narrows it,
# e.g. EMU_FILTER='CudaMatmulTiled.*').
EMU_FILTER ?= *
test-emu: build model
	cmake --build $(BUILD) -j $(JOBS) --target wick_gpu_emu_asan_tests
	ASAN_OPTIONS=detect_leaks=0 WICK_TEST_MODEL=$$(./scripts/fetch_model) \
		$(BUILD)/bin/wick_gpu_emu_asan_tests --gtest_filter='$(EMU_FILTER)'

# The race check (docs/cuda_emu.md): the same tests with the kernels under
# ThreadSanitizer, each CUDA thread a TSan fiber; shared or global memory two
# threads of a CTA use, one writing, with no __syncthreads or __syncwarp
# between, is a report (and the target fails). RACE_CTAS=64 runs CTAs in
# waves of 64 and looks for races between them instead (global memory with
# no __threadfence and atomic between). One OpenMP thread: libgomp is not
# instrumented (as make test-tsan).
RACE_CTAS ?= 1
test-emu-race: build model
	cmake --build $(BUILD) -j $(JOBS) --target wick_gpu_emu_tsan_tests
	OMP_NUM_THREADS=1 WICK_THREADS=1 WICK_EMU_RACE_CTAS=$(RACE_CTAS) WICK_TEST_MODEL=$$(./scripts/fetch_model) \
		$(BUILD)/bin/wick_gpu_emu_tsan_tests --gtest_filter='$(EMU_FILTER)'

run: build model
	$(WICK) run smollm2 "What is the capital of France?" --temperature 0

bench: build model
	$(WICK) bench $$(./scripts/fetch_model) -p 128 -n 64 -r 2
	$(BUILD)/bin/wick_bench --benchmark_min_time=0.2

# wick against llama.cpp on this CPU, side by side (builds and caches the peer once)
bench-cpu: build model
	./scripts/bench_vs_llamacpp $${THREADS:-2}

# Sanitizer trees (docs/security.md): CPU only, no benchmarks, -Og (the CPU
# backend's loops -O1: src/CMakeLists.txt); -Og builds the ASan tree in 60 % of
# -O1's time (docs/security.md, "CI time", session 51).
SAN_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG" \
	-DWICK_CUDA=OFF -DWICK_BUILD_BENCH=OFF
SAN_DIR = $(CURDIR)/tests/sanitizers
# Every sanitizer report goes to a file under the tree's sanitizer-logs, so that
# one from a process no test checks (a `wick serve` the pytest fixtures stop)
# still fails the target: check_reports prints them and fails if there are any.
ASAN_LOGS = $(CURDIR)/build-asan/sanitizer-logs
TSAN_LOGS = $(CURDIR)/build-tsan/sanitizer-logs
# ASan + UBSan: every report fatal (-fno-sanitize-recover), leaks included.
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1:log_path=$(ASAN_LOGS)/asan \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(ASAN_LOGS)/ubsan \
	LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp
# TSan: one OpenMP thread (libgomp is not instrumented; its barriers would be
# reported as races), the engine's own threads as they are.
TSAN_ENV = TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SAN_DIR)/tsan.supp:log_path=$(TSAN_LOGS)/tsan \
	WICK_THREADS=1 OMP_NUM_THREADS=1
# The TSan tree builds only these suites' files (tests/CMakeLists.txt; keep the two together).
# TSan reports races between threads: Engine and ServerParse (no thread of their own, 90 % of
# this ctest's time: a qwen3 tokenizer load under TSan is 12 s) run in the other two trees only.
TSAN_TESTS = '^(EngineLoopAdapters|EngineLoopCancel|EngineLoopFaults|ModelPool|ModelStore|PoolKeepAlive|ServerAccess|ServerBody|ServerWrite|HostileFiles)\.|^PoolSizes/EvictionFreesEngines\.|^setup\.'
# The server suites run against a sanitized `wick serve`; their waits stretch (conftest.py).
SAN_PYTEST = WICK_TEST_TIME_SCALE=5 WICK_TEST_MODEL=$$(./scripts/fetch_model) \
	.venv/bin/python -m pytest -q -p no:cacheprovider tests/server/test_hardening.py tests/server/test_clients.py
# What CI's make test-asan leaves out for time: the quantize and perplexity
# suite, the whole server pytest suite, the load and soak runs (make test-asan-full).
ASAN_LONG = '^(quant|server)\.'

build-asan/build.ninja: Makefile
	cmake -S . -B build-asan -G Ninja $(SAN_FLAGS) -DWICK_SANITIZE=address

build-tsan/build.ninja: Makefile
	cmake -S . -B build-tsan -G Ninja $(SAN_FLAGS) -DWICK_SANITIZE=thread

# CI's ASan + UBSan pass: the C++ and CLI tests, then the server's hardening
# and client suites against an ASan `wick serve`.
test-asan: setup model build-asan/build.ninja
	cmake --build build-asan -j $(JOBS)
	rm -rf $(ASAN_LOGS) && mkdir -p $(ASAN_LOGS)
	cd build-asan && $(ASAN_ENV) $(CTEST_ENV) ctest -j $(JOBS) --output-on-failure -E $(ASAN_LONG) \
		|| { $(SAN_DIR)/check_reports $(ASAN_LOGS); exit 1; }
	$(ASAN_ENV) WICK_BIN=build-asan/bin/wick $(SAN_PYTEST) || { $(SAN_DIR)/check_reports $(ASAN_LOGS); exit 1; }
	$(SAN_DIR)/check_reports $(ASAN_LOGS)

# The whole suite (C++, CLI, quantize, every server pytest suite, the short load
# and soak runs) under ASan + UBSan: about an hour on two cores.
test-asan-full: setup model build-asan/build.ninja
	cmake --build build-asan -j $(JOBS)
	rm -rf $(ASAN_LOGS) && mkdir -p $(ASAN_LOGS)
	cd build-asan && $(ASAN_ENV) $(CTEST_ENV) WICK_TEST_TIME_SCALE=5 ctest -j $(JOBS) --output-on-failure $(ASAN_CTEST_ARGS) \
		|| { $(SAN_DIR)/check_reports $(ASAN_LOGS); exit 1; }
	$(SAN_DIR)/check_reports $(ASAN_LOGS)

# The engine, pool and server tests under TSan, then the server's hardening
# and client suites against a TSan `wick serve`.
test-tsan: setup model build-tsan/build.ninja
	cmake --build build-tsan -j $(JOBS) --target wick_tests wick_cli
	rm -rf $(TSAN_LOGS) && mkdir -p $(TSAN_LOGS)
	cd build-tsan && $(TSAN_ENV) ctest -j $(JOBS) --output-on-failure -R $(TSAN_TESTS) \
		|| { $(SAN_DIR)/check_reports $(TSAN_LOGS); exit 1; }
	$(TSAN_ENV) WICK_BIN=build-tsan/bin/wick $(SAN_PYTEST) || { $(SAN_DIR)/check_reports $(TSAN_LOGS); exit 1; }
	$(SAN_DIR)/check_reports $(TSAN_LOGS)

# libFuzzer targets (clang): each for FUZZ_SECONDS after replaying fuzz/regressions.
FUZZ_SECONDS ?= 60
build-fuzz/build.ninja:
	CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DWICK_FUZZ=ON -DWICK_CUDA=OFF \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo

fuzz:
	@./scripts/setup fuzz
	$(MAKE) build-fuzz/build.ninja
	cmake --build build-fuzz -j $(JOBS)
	fuzz/run_fuzz.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.inc')

clean:
	rm -rf $(BUILD)
