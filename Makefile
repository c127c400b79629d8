# krab — top-level entry points. `make demo` and `make test` do all the set-up themselves.
BUILD ?= build
JOBS  ?= $(shell nproc)
BUILD_TYPE ?= Release

.PHONY: all setup build demo package test clean asan asan-build fuzz tsan sanitize format format-check

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs the krab binary only, not the test suite (half of a cold build on 2 cores).
demo: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target krab
	$(BUILD)/bin/krab train examples/fashion_cnn.yaml --report $(BUILD)/demo-report.json

# The Debian package (docs/cpp_api.md): $(BUILD)/package/krab_<version>_amd64.deb. Packs the
# krab executable and the libraries it is built from; the test suite need not be built.
package: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target krab
	cd $(BUILD) && cpack -G DEB -B package

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 1

# Sanitizer builds of the unit and multi-rank tests (the e2e tests run the release binary):
# ASan + UBSan over every layer (secure aggregation's parsing and crypto included), TSan over comm,
# parallel, compress and the parameter-server shard. The ASan build uses clang, which makes it the
# fuzzing build too (docs/fuzzing.md): its tests include a short run of every fuzz target
# (FUZZ_CI_SECONDS each); `make fuzz` runs them longer (FUZZ_SECONDS each).
SANITIZE_TARGETS = core_config_test core_record_test data_test data_images_test models_test comm_gloo_test parallel_test train_test compress_test sync_shard_test sync_rpc_test sync_engines_test sync_replication_test secagg_test fl_test elastic_test elastic_engine_test etcd_client_test
ASAN_CC  ?= clang-14
ASAN_CXX ?= clang++-14
FUZZ_CI_SECONDS ?= 15
FUZZ_SECONDS ?= 60
asan-build: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKRAB_SANITIZE=address \
	  -DCMAKE_C_COMPILER=$(ASAN_CC) -DCMAKE_CXX_COMPILER=$(ASAN_CXX)
	cmake --build build-asan -j $(JOBS) --target $(SANITIZE_TARGETS)
	cmake --build build-asan -j $(JOBS) --target fuzzers

asan: asan-build
	cd build-asan && KRAB_FUZZ_SECONDS=$(FUZZ_CI_SECONDS) \
	  ctest --output-on-failure --timeout 900 -L sanitize
	@grep -ahE '^(fuzz fuzz_|  crash-)' build-asan/Testing/Temporary/LastTest.log || true

fuzz: asan-build
	cd build-asan && KRAB_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	  ctest --output-on-failure --timeout $$(( $(FUZZ_SECONDS) + 300 )) -L fuzz
	@grep -ahE '^(fuzz fuzz_|  crash-)' build-asan/Testing/Temporary/LastTest.log || true

tsan: setup
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKRAB_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target comm_gloo_test parallel_test compress_test sync_shard_test
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure --timeout 900 -L tsan

sanitize: asan tsan

# clang-format 14 over every tracked .cpp/.h (format), or the check CI runs (format-check).
format: setup
	bash scripts/format.sh

format-check: setup
	bash scripts/format.sh --check

clean:
	rm -rf $(BUILD) build-asan build-tsan
