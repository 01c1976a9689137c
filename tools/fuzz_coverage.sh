#!/bin/sh
# How much of hakmem the fuzz corpus reaches (docs/SAFETY.md, "Fuzzing").
#
#   tools/fuzz_coverage.sh [--min PCT] [BUILD_DIR] [CORPUS ...]
#
# Builds tests/fuzz_replay with clang's source-based coverage
# (HAKMEM_SANITIZE=coverage, in BUILD_DIR, default build-cov), replays the
# corpus (default tests/fuzz_corpus) once in each mode (HAKMEM_SECURE=0, 1,
# 2, and the heap profiler on, sampling every 4 KiB), then (with no CORPUS
# given) under each option value of
# tests/options_matrix.sh, and prints llvm-cov's report for src/*.c: per
# mode, then the union of every run. The misuse operations' forked children
# write their profiles too (before they abort), so the error paths they
# reach count. A branch is one outcome of a condition (llvm-cov's
# "Branches"); a branch is covered when some input took it in some run.
# --min PCT: exit 1 if the union's branch coverage is below PCT.
set -eu

min=""
if [ "${1:-}" = "--min" ]; then
  min=$2
  shift 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-cov}
[ $# -gt 0 ] && shift
matrix=0
if [ $# -eq 0 ]; then
  set -- "$root/tests/fuzz_corpus"
  matrix=1
fi

cc=${CC:-clang}
case $cc in *clang*) ;; *) cc=clang ;; esac
cxx=$(echo "$cc" | sed 's/clang/clang++/')
# llvm-profdata and llvm-cov of clang's own version (the raw profile format changes between versions)
ver=$("$cc" -dumpversion | cut -d. -f1)
profdata=llvm-profdata-$ver
llvmcov=llvm-cov-$ver
command -v "$profdata" >/dev/null 2>&1 || profdata=llvm-profdata
command -v "$llvmcov" >/dev/null 2>&1 || llvmcov=llvm-cov

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAKMEM_SANITIZE=coverage \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_replay >/dev/null

prof=$build/profiles
rm -rf "$prof"
mkdir -p "$prof"
srcs=$(ls "$root"/src/*.c)
for mode in 0 1 2; do
  # %4m: the process and every forked child merge into a pool of 4 files
  HAKMEM_SECURE=$mode LLVM_PROFILE_FILE="$prof/mode$mode-%4m.profraw" \
    "$build/tests/fuzz_replay" "$@" >"$prof/replay$mode.log" 2>&1 ||
    { tail -5 "$prof/replay$mode.log"; echo "fuzz_coverage: replay failed (HAKMEM_SECURE=$mode)"; exit 1; }
  "$profdata" merge -o "$prof/mode$mode.profdata" "$prof"/mode$mode-*.profraw
done
# the heap profiler sampling every 4 KiB (profile.c), with the timeline
# every millisecond (its thread, the peak's tally: inspect.c, profile.c),
# huge pages always, a soft memory limit and a simulated cgroup whose
# memory.high is passed (limits.c, pressure.c: no mapping refused, which
# fuzz_api would take for a failure)
mkdir -p "$prof/cgroup"
echo $((1 << 40)) >"$prof/cgroup/memory.max"
echo 1 >"$prof/cgroup/memory.high"
echo $((100 << 20)) >"$prof/cgroup/memory.current"
HAKMEM_PROFILE=1 HAKMEM_PROFILE_RATE=4096 HAKMEM_PROFILE_FILE="$prof/heap.%p" HAKMEM_TIMELINE_FILE="$prof/timeline.%p" \
  HAKMEM_TIMELINE_MS=1 HAKMEM_THREAD_STATS=1 HAKMEM_THP=always HAKMEM_MEMORY_SOFT_LIMIT=8M HAKMEM_CGROUP_DIR="$prof/cgroup" \
  LLVM_PROFILE_FILE="$prof/mode-profile-%4m.profraw" \
  "$build/tests/fuzz_replay" "$@" >"$prof/replay-profile.log" 2>&1 ||
  { tail -5 "$prof/replay-profile.log"; echo "fuzz_coverage: replay failed (HAKMEM_PROFILE=1)"; exit 1; }
"$profdata" merge -o "$prof/mode-profile.profdata" "$prof"/mode-profile-*.profraw
rm -f "$prof"/heap.*
if [ $matrix = 1 ]; then
  # fuzz_replay with no argument replays tests/fuzz_corpus
  LLVM_PROFILE_FILE="$prof/matrix-%4m.profraw" sh "$root/tests/options_matrix.sh" "$build" >"$prof/matrix.log" 2>&1 ||
    { tail -5 "$prof/matrix.log"; echo "fuzz_coverage: the options matrix failed"; exit 1; }
  "$profdata" merge -o "$prof/matrix.profdata" "$prof"/matrix-*.profraw
fi
"$profdata" merge -o "$prof/all.profdata" "$prof"/mode*.profdata $( [ $matrix = 1 ] && echo "$prof/matrix.profdata")

# llvm-cov's TOTAL line: regions, missed, %, functions, missed, %, lines,
# missed, %, branches, missed, %
summary() {
  "$llvmcov" report "$build/tests/fuzz_replay" -instr-profile="$1" $srcs | awk '
    /^TOTAL/ { printf "branches %d of %d (%s), regions %d of %d (%s), functions %d of %d (%s)\n",
                 $11 - $12, $11, $13, $2 - $3, $2, $4, $5 - $6, $5, $7 }'
}
echo "fuzz_coverage: $(ls "$@" | wc -l) inputs; hakmem's src/*.c reached:"
for mode in 0 1 2; do
  echo "  HAKMEM_SECURE=$mode: $(summary "$prof/mode$mode.profdata")"
done
echo "  HAKMEM_PROFILE=1 (with the timeline, exact per-thread figures, THP, soft limits): $(summary "$prof/mode-profile.profdata")"
line=$(summary "$prof/all.profdata")
[ $matrix = 1 ] &&
  echo "  the options matrix ($(tail -1 "$prof/matrix.log" | sed 's/.*: \([0-9]*\) runs.*/\1/') runs): $(summary "$prof/matrix.profdata")"
echo "  every run: $line"
echo "per file (every run):"
"$llvmcov" report "$build/tests/fuzz_replay" -instr-profile="$prof/all.profdata" $srcs |
  awk 'NR > 2 && !/^-/ && !/^TOTAL/ { printf "  %-14s branches %4d of %4d (%s)\n", $1, $11 - $12, $11, $13 }'
if [ -n "$min" ]; then
  pct=$(echo "$line" | sed 's/^branches [0-9]* of [0-9]* (\([0-9.]*\)%).*/\1/')
  if awk -v p="$pct" -v m="$min" 'BEGIN { exit !(p < m) }'; then
    echo "fuzz_coverage: branch coverage $pct% is below $min%"
    exit 1
  fi
fi
