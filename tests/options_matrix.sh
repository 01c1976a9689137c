#!/bin/sh
# The test programs again under each option's non-default values
# (docs/OPTIONS.md), so that every option keeps working: `make test-options`.
# Tests whose checks time the purger skip those checks where the options
# stop timed purges (tests/api.h, hkt_timed_purges). test_lend, test_lend_timed,
# test_growth_purge and test_region_lists need options of their own and run
# in ctest only.
# usage: tests/options_matrix.sh BUILD_DIR
set -u
dir=${1:-build}/tests
fail=0
runs=0
for opts in "HAKMEM_PURGE_THREAD=0" "HAKMEM_PURGE_DELAY_MS=0" "HAKMEM_PURGE_DELAY_MS=1000000" \
            "HAKMEM_PURGE_THREAD=0 HAKMEM_PURGE_DELAY_MS=0" "HAKMEM_REGION_RESERVE=0" \
            "HAKMEM_LARGE_CACHE_MB=0" "HAKMEM_LARGE_CACHE_MB=2" "HAKMEM_LARGE_CACHE_ENTRIES=1" "HAKMEM_REGION_LISTS=1" \
            "HAKMEM_ARENA_MB=0" "HAKMEM_SECURE=1" "HAKMEM_SECURE=2"; do
  for t in test_api_override test_api_hak test_internals_override test_internals_hak test_stress test_lifecycle test_reap test_misuse test_churn \
           test_thread_storm test_blockcheck test_fork test_fork_lazy test_large_realloc_race \
           test_large_reuse test_medium_churn test_cache_mode test_abandoned_trim test_page_commit test_oom test_cxx test_deferred_spans \
           test_surplus_pages; do
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
