#!/bin/sh
# setuid_env.sh PROGRAM: PROGRAM (test_secure_env), made set-user-ID root
# and run by another user with HAKMEM_SECURE=1 and HAKMEM_STATS=1, must
# ignore both (hakmem reads no HAKMEM_* variable when AT_SECURE is set).
# Skipped (77) where it cannot be arranged: not root, no setpriv, or a
# file system mounted nosuid.
prog=$1
[ "$(id -u)" = 0 ] || { echo "skipped: making a set-user-ID copy needs root"; exit 77; }
command -v setpriv >/dev/null 2>&1 || { echo "skipped: no setpriv (util-linux)"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/hk_setuid.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
cp "$prog" "$dir/prog" && chmod 755 "$dir" && chmod 4755 "$dir/prog" || exit 1
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups env HAKMEM_SECURE=1 HAKMEM_STATS=1 "$dir/prog" 0 2>&1)
rc=$?
echo "$out"
case "$out" in
*"AT_SECURE=0"*) echo "skipped: the set-user-ID bit took no effect (nosuid mount?)"; exit 77 ;;
esac
[ $rc = 0 ] || exit $rc
# HAKMEM_STATS=1 read would print the counters at exit
case "$out" in
*"hakmem"*) echo "setuid_env: FAIL: hakmem printed something: it read the environment"; exit 1 ;;
esac
echo "setuid_env: a set-user-ID program ignored HAKMEM_SECURE and HAKMEM_STATS"
