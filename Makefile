# krab — top-level entry points. `make demo` and `make test` do all the set-up themselves.
BUILD ?= build
JOBS  ?= $(shell nproc)
BUILD_TYPE ?= Release

.PHONY: all setup build demo test clean asan

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/krab train examples/fashion_cnn.yaml --report $(BUILD)/demo-report.json

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 1

asan: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKRAB_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure --timeout 900 -L sanitize

clean:
	rm -rf $(BUILD) build-asan
