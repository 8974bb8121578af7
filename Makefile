# wick's front door. `make run` and `make test` work on a fresh machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
WICK := $(BUILD)/bin/wick

.PHONY: all setup configure build test run bench bench-cpu format clean

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

test: build model
	cd $(BUILD) && ctest -j $(JOBS) --output-on-failure

run: build model
	$(WICK) run smollm2 "What is the capital of France?" --temperature 0

bench: build model
	$(WICK) bench $$(./scripts/fetch_model) -p 128 -n 64 -r 2
	$(BUILD)/bin/wick_bench --benchmark_min_time=0.2

# wick against llama.cpp on this CPU, side by side (builds and caches the peer once)
bench-cpu: build model
	./scripts/bench_vs_llamacpp $${THREADS:-2}

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.inc')

clean:
	rm -rf $(BUILD)
