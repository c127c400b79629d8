# krab — top-level entry points. `make demo` and `make test` do all the set-up themselves.
BUILD ?= build
JOBS  ?= $(shell nproc)
BUILD_TYPE ?= Release

.PHONY: all setup build demo test clean asan tsan sanitize

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

# Sanitizer builds of the unit and multi-rank tests (the e2e tests run the release binary):
# ASan + UBSan over every layer (secure aggregation's parsing and crypto included), TSan over comm,
# parallel, compress and the parameter-server shard.
SANITIZE_TARGETS = core_config_test data_test models_test comm_gloo_test parallel_test train_test compress_test sync_shard_test sync_rpc_test secagg_test fl_test
asan: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKRAB_SANITIZE=address
	cmake --build build-asan -j $(JOBS) --target $(SANITIZE_TARGETS)
	cd build-asan && ctest --output-on-failure --timeout 900 -L sanitize

tsan: setup
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKRAB_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target comm_gloo_test parallel_test compress_test sync_shard_test
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure --timeout 900 -L tsan

sanitize: asan tsan

clean:
	rm -rf $(BUILD) build-asan build-tsan
