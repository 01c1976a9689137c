#!/bin/bash
# Wall time of one program under glibc, glibc with heaptrack, hakmem and
# hakmem with its heap profiler (docs/PROFILE.md), three times each.
# Usage: bench/profile_vs_heaptrack.sh PROGRAM [ARGS...]   (Debian: heaptrack)
set -u
lib=${HAKMEM_LIB:-$(dirname "$0")/../build/libhakmem.so}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t() {
  local s e
  s=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  e=$(date +%s.%N)
  python3 -c "print(round($e - $s, 3))"
}
for rep in 1 2 3; do
  g=$(t env "$@")
  h=$(t heaptrack -o "$tmp/trace" "$@")
  k=$(t env LD_PRELOAD="$lib" "$@")
  p=$(t env LD_PRELOAD="$lib" HAKMEM_PROFILE=1 HAKMEM_PROFILE_FILE="$tmp/p.%p" "$@")
  echo "$* | glibc $g s, heaptrack $h s, hakmem $k s, hakmem profiling $p s"
  rm -f "$tmp"/trace* "$tmp"/p.*
done
