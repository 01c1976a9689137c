#!/bin/bash
# Memory limits (docs/OPTIONS.md): HAKMEM_MEMORY_LIMIT, HAKMEM_MEMORY_SOFT_LIMIT,
# a simulated cgroup (HAKMEM_CGROUP_DIR: files this test writes), and a
# real cgroup where this machine lets the test make one (v2, or v1's memory
# hierarchy): a program that fills memory in a cgroup limited to 128 MiB
# gets NULL from malloc instead of being killed by the OOM killer.
# And HAKMEM_THP: never gives a 64 MiB block no huge page, always some
# (where the kernel has THP on), but none to a block written at its start only;
# auto gives a big heap's regions huge pages only if it is half resident.
# Usage: limits_check.sh TEST_LIMITS
set -eu
prog=$1
dir=$(mktemp -d)
cg=""
cleanup() {
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

HAKMEM_MEMORY_LIMIT=64M "$prog" hard
HAKMEM_MEMORY_SOFT_LIMIT=16M "$prog" soft
mkdir "$dir/cg"
echo $((1 << 30)) >"$dir/cg/memory.max"
echo $((200 << 20)) >"$dir/cg/memory.high"
echo 0 >"$dir/cg/memory.current"
HAKMEM_CGROUP_DIR="$dir/cg" "$prog" cgroup
mkdir "$dir/cg1"
echo $((1 << 30)) >"$dir/cg1/memory.max"
echo $((1020 << 20)) >"$dir/cg1/memory.current"
HAKMEM_CGROUP_DIR="$dir/cg1" "$prog" small
mkdir "$dir/cg2"
echo $((1 << 30)) >"$dir/cg2/memory.max"
echo 0 >"$dir/cg2/memory.current"
HAKMEM_CGROUP_DIR="$dir/cg2" "$prog" descriptors

# huge pages
never=$(HAKMEM_THP=never "$prog" thp | sed -n 's/^AnonHugePages //p')
always=$(HAKMEM_THP=always "$prog" thp | sed -n 's/^AnonHugePages //p')
echo "limits_check: AnonHugePages of a 64 MiB block: $never KiB with HAKMEM_THP=never, $always KiB with always"
[ "$never" = 0 ] || { echo "FAIL: huge pages with HAKMEM_THP=never"; exit 1; }
if grep -q '\[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || [ ! -e /sys/kernel/mm/transparent_hugepage/enabled ]; then
  echo "limits_check: the kernel has THP off: HAKMEM_THP=always not checked"
else
  [ "$always" -gt 0 ] || { echo "FAIL: no huge page with HAKMEM_THP=always"; exit 1; }
  # a block written only at its start takes no huge page (the header's
  # 2 MiB are left out of the advice)
  first=$(HAKMEM_THP=always "$prog" thp_first | sed -n 's/^RssAdded //p')
  echo "limits_check: RSS added by a 64 MiB block written at its first byte only: $first KiB with always"
  [ "$first" -lt 1024 ] || { echo "FAIL: a block written at its start only took a huge page's RSS"; exit 1; }
  # auto: regions take huge pages once hakmem holds 1 GiB, three quarters
  # of it resident; a heap as big whose blocks are written at their start
  # only takes none (each would hold 2 MiB where the program wrote 4 KiB),
  # nor one of 64 KiB blocks, whose spans are half used (a huge page would
  # make the other half resident)
  sparse=$(HAKMEM_THP=auto "$prog" thp_sparse | sed -n 's/^AnonHugePages //p')
  dense=$(HAKMEM_THP=auto "$prog" thp_dense | sed -n 's/^AnonHugePages //p')
  half=$(HAKMEM_THP=auto "$prog" thp_half | sed -n 's/^AnonHugePages //p')
  echo "limits_check: AnonHugePages of 1.25 GiB of 512 KiB blocks with HAKMEM_THP=auto: $sparse KiB written at their start, $dense KiB written whole; of 64 KiB blocks written whole: $half KiB"
  [ "$sparse" -lt 8192 ] || { echo "FAIL: a sparse heap took huge pages"; exit 1; }
  [ "$half" -lt 8192 ] || { echo "FAIL: a heap of half-used spans took huge pages"; exit 1; }
  [ "$dense" -gt 0 ] || { echo "FAIL: a dense heap of 1.25 GiB took no huge page"; exit 1; }
fi

# a real cgroup: a child of this process's own
own2=$(sed -n 's/^0:://p' /proc/self/cgroup)
own1=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}:\(.*\)$/\3/p' /proc/self/cgroup)
limit=$((128 << 20))
if [ -n "$own2" ] && [ -w "/sys/fs/cgroup$own2" ] && grep -qw memory "/sys/fs/cgroup$own2/cgroup.controllers" 2>/dev/null &&
   mkdir "/sys/fs/cgroup$own2/hakmem-test-$$" 2>/dev/null; then
  cg="/sys/fs/cgroup$own2/hakmem-test-$$"
  echo "$limit" >"$cg/memory.max" || { echo "limits_check: cannot set $cg/memory.max: real cgroup skipped"; exit 0; }
elif [ -n "$own1" ] && mkdir "/sys/fs/cgroup/memory$own1/hakmem-test-$$" 2>/dev/null; then
  cg="/sys/fs/cgroup/memory$own1/hakmem-test-$$"
  echo "$limit" >"$cg/memory.limit_in_bytes" || { echo "limits_check: cannot set $cg's limit: real cgroup skipped"; exit 0; }
else
  echo "limits_check: no cgroup can be made here: the real cgroup's check skipped (the simulated one ran)"
  exit 0
fi
set +e
sh -c 'echo $$ >"$1/cgroup.procs" && exec "$2" fill' sh "$cg" "$prog" >"$dir/fill.out" 2>&1
rc=$?
set -e
cat "$dir/fill.out"
[ "$rc" -eq 0 ] || { echo "FAIL: the program in a cgroup of 128 MiB ended with status $rc (137: the OOM killer)"; exit 1; }
grep -q "MiB written before NULL" "$dir/fill.out" || { echo "FAIL: no NULL in the cgroup"; exit 1; }
echo "limits_check: OK (real cgroup $cg)"
