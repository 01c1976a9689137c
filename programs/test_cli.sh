#!/bin/sh
# Checks the `hakmem` command: --version, --help, run of true/echo, the
# error and exit status for a missing program, and `run --stats`.
#   sh programs/test_cli.sh [PATH/TO/hakmem [VERSION]]
# PATH defaults to build/programs/hakmem; VERSION, the version --version must
# print, to the one in CMakeLists.txt's project() (ctest passes it).
set -u
HAKMEM=${1:-$(dirname "$0")/../build/programs/hakmem}
VERSION=${2:-$(sed -n 's/^project(hakmem VERSION \([0-9][0-9.]*\).*/\1/p' "$(dirname "$0")/../CMakeLists.txt")}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok   - $1"; }
bad() { echo "FAIL - $1"; fails=$((fails + 1)); }
check() { # check NAME CONDITION...
  name=$1; shift
  if "$@"; then ok "$name"; else bad "$name"; fi
}

[ -x "$HAKMEM" ] || { echo "FAIL - $HAKMEM is not an executable (build it with 'make')"; exit 1; }
[ -n "$VERSION" ] || { echo "FAIL - no version given, none found in CMakeLists.txt"; exit 1; }

out=$("$HAKMEM" --version); rc=$?
check "--version exits 0" [ "$rc" -eq 0 ]
check "--version prints 'hakmem $VERSION'" [ "$out" = "hakmem $VERSION" ]

"$HAKMEM" --help >"$tmp/help"; rc=$?
check "--help exits 0" [ "$rc" -eq 0 ]
check "--help mentions run and bench" grep -q "hakmem run" "$tmp/help"
grep -q "hakmem bench" "$tmp/help" || bad "--help mentions bench"
grep -q "hakmem report" "$tmp/help" || bad "--help mentions report"

"$HAKMEM" run -- true; rc=$?
check "run -- true exits 0" [ "$rc" -eq 0 ]
"$HAKMEM" run -- false; rc=$?
check "run -- false passes the exit status (1)" [ "$rc" -eq 1 ]

out=$("$HAKMEM" run -- echo hello world); rc=$?
check "run -- echo exits 0" [ "$rc" -eq 0 ]
check "run -- echo prints its arguments" [ "$out" = "hello world" ]

out=$("$HAKMEM" run -- sh -c 'echo "$LD_PRELOAD"')
case "$out" in *libhakmem.so*) ok "run sets LD_PRELOAD to libhakmem.so" ;; *) bad "run sets LD_PRELOAD (got '$out')" ;; esac

"$HAKMEM" run -- hakmem-no-such-program-xyz 2>"$tmp/err"; rc=$?
check "missing program exits 127" [ "$rc" -eq 127 ]
check "missing program message" grep -q "hakmem: cannot run 'hakmem-no-such-program-xyz': No such file or directory" "$tmp/err"

HAKMEM_LIB=/nonexistent/libhakmem.so "$HAKMEM" run -- true 2>"$tmp/err"; rc=$?
check "missing library (HAKMEM_LIB) fails" [ "$rc" -ne 0 ]
check "missing library message names it" grep -q "/nonexistent/libhakmem.so" "$tmp/err"

"$HAKMEM" run --stats -- true 2>"$tmp/err"; rc=$?
check "run --stats -- true exits 0" [ "$rc" -eq 0 ]
check "run --stats prints hakmem statistics on stderr" grep -q "hakmem" "$tmp/err"
check "run --stats names the process" grep -q "^hakmem: statistics (hakmem .*) of process [0-9]* (true)$" "$tmp/err"

"$HAKMEM" run --stats=json --stats-file "$tmp/s.json" -- true 2>"$tmp/err"; rc=$?
check "run --stats=json --stats-file exits 0" [ "$rc" -eq 0 ]
check "run --stats=json --stats-file writes JSON there" grep -q '^{"hakmem":' "$tmp/s.json"

"$HAKMEM" frobnicate 2>/dev/null; rc=$?
check "unknown command exits 2" [ "$rc" -eq 2 ]

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
