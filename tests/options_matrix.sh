#!/bin/sh
# The test programs again under each option's non-default values
# (docs/OPTIONS.md), so that every option keeps working: `make test-options`.
# The programs are those tests/CMakeLists.txt registers with OPTIONS_MATRIX,
# listed by CMake in BUILD_DIR/tests/options_matrix.txt; each runs with no
# arguments and with none of its ctest environment. Tests whose checks time
# the purger skip those checks where the options stop timed purges
# (tests/api.h, hkt_timed_purges). Tests that need options of their own
# (test_lend, test_lend_timed, test_growth_purge, test_region_lists) run in
# ctest only.
# usage: tests/options_matrix.sh BUILD_DIR
set -u
dir=${1:-build}/tests
list=$dir/options_matrix.txt
if [ ! -r "$list" ]; then
  echo "options_matrix.sh: no $list; configure the build with cmake first" >&2
  exit 2
fi
programs=$(cat "$list")
fail=0
runs=0
for opts in "HAKMEM_PURGE_THREAD=0" "HAKMEM_PURGE_DELAY_MS=0" "HAKMEM_PURGE_DELAY_MS=1000000" \
            "HAKMEM_PURGE_THREAD=0 HAKMEM_PURGE_DELAY_MS=0" "HAKMEM_REGION_RESERVE=0" \
            "HAKMEM_LARGE_CACHE_MB=0" "HAKMEM_LARGE_CACHE_MB=2" "HAKMEM_LARGE_CACHE_ENTRIES=1" "HAKMEM_REGION_LISTS=1" \
            "HAKMEM_ARENA_MB=0" "HAKMEM_SECURE=1" "HAKMEM_SECURE=2" "HAKMEM_THREAD_STATS=1"; do
  for t in $programs; do
    [ -x "$dir/$t" ] || continue
    runs=$((runs + 1))
    if ! out=$(env $opts timeout 300 "$dir/$t" 2>&1); then
      fail=$((fail + 1))
      echo "FAILED: $opts $t"
      echo "$out" | tail -5
    fi
  done
done
echo "options matrix: $runs runs, $fail failed"
[ "$fail" -eq 0 ]
