#!/usr/bin/env bash
# rlimit_check: under RLIMIT_AS or RLIMIT_DATA set while the program runs,
# hakmem serves about as much memory as the C library's malloc, returns NULL
# with ENOMEM when the room is used up, serves again after frees, and more
# once the limit is raised (tests/rlimit_fill.c checks the behaviour; this
# script compares the amounts: the lesser of each one's two fills).
#
# usage: rlimit_check.sh RLIMIT_FILL LIBHAKMEM [MIN_RATIO]
#   MIN_RATIO: the least hakmem may serve as a fraction of glibc's (0.85;
#   hardened mode, whose guard pages and canaries take room, passes less)
set -u
FILL=$1
LIB=$2
MIN=${3:-0.85}
unset LD_PRELOAD
failures=0
printf '%-24s %14s %14s %7s\n' "limit, size, threads" "glibc bytes" "hakmem bytes" "ratio"
while read -r res mib size threads cold; do
  [ -z "$res" ] && continue
  g=$("$FILL" "$res" "$mib" "$size" "$threads" $cold) || { echo "FAIL: $res $mib $size $threads: the job fails without hakmem" >&2; failures=$((failures + 1)); continue; }
  h=$(LD_PRELOAD="$LIB" "$FILL" "$res" "$mib" "$size" "$threads" $cold) || { echo "FAIL: $res $mib MiB, size $size, $threads threads: failed with hakmem" >&2; failures=$((failures + 1)); continue; }
  # the lesser of the two fills, each's (before the limit hakmem may hold
  # memory that counts already, which its first fill reuses)
  g=$(echo "$g" | awk '{ print ($1 < $2 ? $1 : $2) }')
  h=$(echo "$h" | awk '{ print ($1 < $2 ? $1 : $2) }')
  ratio=$(awk -v a="$h" -v b="$g" 'BEGIN { printf "%.3f", a / b }')
  printf '%-24s %14s %14s %7s\n' "$res $mib MiB, $size, $threads $cold" "$g" "$h" "$ratio"
  if awk -v r="$ratio" -v m="$MIN" 'BEGIN { exit !(r < m) }'; then
    echo "FAIL: $res $mib MiB, size $size, $threads threads: hakmem served $ratio of glibc's bytes (least: $MIN)" >&2
    failures=$((failures + 1))
  fi
done <<'CONFIGS'
as 512 256 1 cold
as 512 70000 2 cold
as 2048 mixed 2 cold
data 512 3000 2 cold
as 512 256 1
as 512 3000 1
as 512 70000 1
as 512 1048576 1
as 512 4194304 1
as 512 mixed 1
as 512 3000 2
as 512 70000 2
as 512 mixed 2
as 1024 3000 1
as 1024 mixed 2
data 512 256 1
data 512 70000 1
data 512 mixed 2
CONFIGS
if [ "$failures" -ne 0 ]; then
  echo "rlimit_check: $failures failure(s)" >&2
  exit 1
fi
echo "rlimit_check: all passed"
