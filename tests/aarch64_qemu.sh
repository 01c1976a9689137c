#!/bin/sh
# The aarch64 build, cross-compiled, and its tests run under qemu's user
# mode: hakmem is for Linux on x86-64 and aarch64, and this is how a
# machine of one checks the other. Needs Debian's gcc-aarch64-linux-gnu,
# g++-aarch64-linux-gnu and qemu-user. Usage: tests/aarch64_qemu.sh [DIR]
# (the build folder, build-aarch64 by default).
#
# The build must be free of warnings. Left out of the run, because qemu-user
# (7.2, Debian 12) cannot run them, not because of anything of hakmem's:
# - a fork from a process with threads, which qemu aborts on
#   ("qemu_plugin_vcpu_init_hook: assertion failed"): the fork tests, the
#   misuse tests and the fuzz corpus' replay (each case in a child), reap,
#   test_heaps, test_oom;
# - RSS over thousands of threads: qemu keeps about 300 KiB of each exited
#   thread (so does a program using glibc's malloc): test_churn,
#   test_lifecycle;
# - a thread count: qemu runs a thread of its own (test_purger_start);
# - the shell-script tests, which run the test programs directly or preload
#   the library into the host's programs.
# (test_guards checks the guard pages there without a fork: qemu answers 0
# to madvise advice it does not know, MADV_GUARD_INSTALL among them, and
# installs nothing, which hakmem must notice, src/os.c.)
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build-aarch64}
root=/usr/aarch64-linux-gnu
for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" > /dev/null || { echo "aarch64_qemu: $tool not found (Debian: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user)" >&2; exit 2; }
done
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
  -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
  "-DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64;-L;$root" > "$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j "$(nproc)" > "$dir.build.log" 2>&1 || { cat "$dir.build.log"; exit 1; }
if grep -E "(warning|error):" "$dir.build.log"; then
  echo "aarch64_qemu: the aarch64 build has warnings (above)" >&2
  exit 1
fi
echo "aarch64_qemu: built without warnings"
# (the child processes the tests start run under qemu too: the library and
# the C library are aarch64's)
export QEMU_LD_PREFIX=$root
# Kernels with 16 and 64 KiB pages: qemu reports the page size it is given
# (though it maps and protects 4 KiB pages still), and hakmem, which reads
# it, lays out its regions, guards and large blocks in such pages. With
# 64 KiB pages qemu's resident memory no longer follows the program's (a
# freed large block's purged pages stay resident), so the tests that
# measure RSS run with 16 KiB pages only.
for page in 16384 65536; do
  tests="test_api_override test_guards"
  [ "$page" = 16384 ] && tests="$tests test_large_reuse test_internals_override"
  for t in $tests; do
    if ! out=$(QEMU_PAGESIZE=$page qemu-aarch64 "$dir/tests/$t" 2>&1); then
      printf '%s\n' "$out" | tail -3
      echo "aarch64_qemu: $t failed with $page-byte pages" >&2
      exit 1
    fi
  done
  echo "aarch64_qemu: with $page-byte pages:" $tests "passed"
done
cd "$dir"
ctest --output-on-failure -j "$(nproc)" --timeout 600 \
  -E '^(test_fork.*|test_misuse.*|fuzz_replay.*|test_reap|test_heaps.*|test_oom|test_churn.*|test_lifecycle|test_purger_start|setuid_env|preload_smoke|rlimit_check.*|stats_check|profile_check|limits_check|report_check|hakmem_cli)$'
