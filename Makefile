# Short commands around the CMake build. `make` builds build/libhakmem.so
# and build/libhakmem.a; `make test` runs every test configuration.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE ?= cmake

.PHONY: all build test test-release test-clang test-asan test-tsan test-debug test-install test-options test-pages test-aarch64 test-fuzz fuzz-coverage install clean

all: build

build:
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release
	$(CMAKE) --build build -j $(JOBS)

# Every test: the release build's suite (unit, stress, fork, churn, misuse,
# C++, preload smoke tests), the same built with clang, the unit tests under
# ASan+UBSan, the stress test under TSan, and an install/pkg-config/
# find_package check.
test: test-release test-clang test-asan test-tsan test-debug test-install test-options test-pages

test-release: build
	cd build && ctest --output-on-failure -j $(JOBS)

# The code is C11 for GCC and clang: the release suite again, clang-built,
# and built to act as a kernel with 16 KiB pages would (see test-pages; the
# one build serves both), but rlimit_check, which compares with the C
# library's malloc (not simulated).
test-clang:
	$(CMAKE) -S . -B build-clang -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DHAKMEM_SIMULATED_PAGE=16384
	$(CMAKE) --build build-clang -j $(JOBS)
	cd build-clang && ctest --output-on-failure -j $(JOBS) -E '^rlimit_check.*$$'

test-asan:
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_SANITIZE=address
	$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure

test-tsan:
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_SANITIZE=thread
	$(CMAKE) --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure

# The debug build (HAKMEM_DEBUG=ON): hk_assert on the page and heap state
# transitions and a validation of the heap (and the regions) after slow-path
# operations and at thread exit, over the whole suite but rlimit_check, which
# measures how much of a limit the release build can use, and test_big_heap,
# whose 74,000 pages the validation would walk every 256 mallocs.
test-debug:
	$(CMAKE) -S . -B build-debug -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAKMEM_DEBUG=ON
	$(CMAKE) --build build-debug -j $(JOBS)
	cd build-debug && ctest --output-on-failure -j $(JOBS) -E '^(rlimit_check|test_big_heap)'

test-install: build
	sh tests/install_check.sh

# every option's non-default values over the test programs (tests/options_matrix.sh)
test-options: build
	sh tests/options_matrix.sh build

# The suite in a build that acts as a kernel with 64 KiB pages would
# (HAKMEM_SIMULATED_PAGE, src/os.c: a memory system call on a range that
# starts inside such a page aborts, a length rounds up to one); test-clang
# does the same with 16 KiB pages. All but rlimit_check, which compares
# with the C library's malloc (not simulated), preload_smoke, which the
# other builds run, and limits_check, whose huge-page check is the host's
# (a 64 KiB kernel's huge pages are 512 MiB). The tests and the programs
# they run only: no benchmarks.
test-pages:
	$(CMAKE) -S . -B build-page65536 -DCMAKE_BUILD_TYPE=Release -DHAKMEM_SIMULATED_PAGE=65536
	$(MAKE) -C build-page65536/tests -j $(JOBS)
	$(MAKE) -C build-page65536/programs -j $(JOBS)
	cd build-page65536 && ctest --output-on-failure -j $(JOBS) -E '^(rlimit_check.*|preload_smoke|limits_check)$$'

# the aarch64 build, cross-compiled without warnings, and the tests qemu's
# user mode can run (tests/aarch64_qemu.sh; Debian: gcc-aarch64-linux-gnu
# g++-aarch64-linux-gnu qemu-user). CI runs it after `make test`.
test-aarch64:
	sh tests/aarch64_qemu.sh build-aarch64

# libFuzzer on the hak_ API against a shadow model (tests/fuzz_api.c,
# docs/SAFETY.md), for FUZZ_SECONDS. Needs clang and its libFuzzer runtime
# (Debian: libclang-rt-dev). Seeds: tests/fuzz_corpus/; new corpus entries go
# to build-fuzz/corpus/, crashing inputs to build-fuzz/artifacts/ (copy a
# crash into tests/fuzz_corpus/ so it stays a regression test).
FUZZ_SECONDS ?= 60
FUZZ_FLAGS ?=
test-fuzz:
	$(CMAKE) -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAKMEM_SANITIZE=fuzzer \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
	$(CMAKE) --build build-fuzz -j $(JOBS) --target fuzz_api
	mkdir -p build-fuzz/corpus build-fuzz/artifacts
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build-fuzz/tests/fuzz_api \
	  -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 -print_final_stats=1 \
	  -artifact_prefix=build-fuzz/artifacts/ $(FUZZ_FLAGS) build-fuzz/corpus tests/fuzz_corpus

# How much of src/ the committed corpus reaches, in all three modes (the
# misuse children included); fails below FUZZ_COVERAGE_MIN % of branches.
FUZZ_COVERAGE_MIN ?= 75
fuzz-coverage:
	tools/fuzz_coverage.sh --min $(FUZZ_COVERAGE_MIN) build-cov

install: build
	$(CMAKE) --install build --prefix $(PREFIX)

# Benchmarks (docs/BENCHMARKS.md): hakmem against glibc, mimalloc, jemalloc,
# tcmalloc. Results go to bench/results/. bench: full suite, 5 repeats (under
# 15 minutes on 2 cores); bench-quick: a subset in about a minute (CI);
# bench-callgrind: instructions per malloc+free pair (needs valgrind);
# bench-sweep: the workload sweep, 241 generated configurations x 3 repeats
# (about 13 minutes on 2 cores); bench-sweep-quick: 30 of them, about a minute (CI).
.PHONY: bench bench-quick bench-callgrind bench-sweep bench-sweep-quick
bench: build
	python3 bench/run.py

bench-quick: build
	python3 bench/run.py --quick

bench-callgrind: build
	python3 bench/run.py --callgrind

bench-sweep: build
	python3 bench/run.py --sweep

bench-sweep-quick: build
	python3 bench/run.py --sweep --quick

clean:
	rm -rf build build-clang build-asan build-tsan build-debug build-aarch64 build-fuzz build-cov
