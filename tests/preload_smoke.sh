#!/usr/bin/env bash
# preload_smoke: real programs must behave identically with hakmem preloaded.
#
# usage: preload_smoke.sh /path/to/libhakmem.so
#
# For each of python3, perl, git, gcc, sqlite3, clang (C and C++) and
# cppcheck (a large C++ program) a deterministic job runs twice, without and with LD_PRELOAD=libhakmem.so; stdout and the exit status
# must be identical. A missing tool is skipped with a note. Also checks that
# the library really is loaded in the preloaded run, and that HAKMEM_STATS=1
# makes it print its report (mentioning "hakmem") to stderr at exit.
set -u

LIB=${1:-}
if [ -z "$LIB" ] || [ ! -f "$LIB" ]; then
  echo "usage: $0 /path/to/libhakmem.so (got '${LIB}')" >&2
  exit 2
fi
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
REPO=$(cd "$(dirname "$0")/.." && pwd)   # real sources for the compilers to chew on

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-preload.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export HOME="$TMP/home"   # no user config (git, sqlite3, python)
mkdir -p "$HOME"
export LC_ALL=C
export GIT_CONFIG_NOSYSTEM=1
unset LD_PRELOAD HAKMEM_STATS

failures=0
ran=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# ---- jobs: each runs in the current directory (a fresh one per run) ----

job_python3() {
  python3 - <<'EOF'
import json, random, hashlib
random.seed(12345)
d = {"k%d" % i: [i, str(i * 7919 % 100003), i * 0.5] for i in range(200000)}
s = json.dumps(d, sort_keys=True)
d2 = json.loads(s)
assert d2 == d
keys = sorted(d2)
nums = [random.random() for _ in range(100000)]
nums.sort()
words = " ".join(str(x) for x in range(100000)).split()
cnt = {}
for w in words:
    cnt[w[-1]] = cnt.get(w[-1], 0) + 1
big = bytearray(b"x" * (8 << 20))
big[12345] = 7
print(len(d2), hashlib.sha256(s.encode()).hexdigest(), keys[:2], keys[-2:])
print("%.6f" % sum(nums), sorted(cnt.items())[:3], sum(big) % 1000003)
EOF
}

job_perl() {
  perl -e '
    my %h;
    for my $i (0 .. 199999) { $h{"key$i"} = ($i * 7919) % 100003; }
    my $cnt = 0;
    for my $k (keys %h) { $cnt++ if $k =~ /^key(\d)\d*7$/ && $1 % 2; }
    my $s = join(",", map { "$_=$h{$_}" } sort keys %h);
    (my $t = $s) =~ s/(\d+)/$1 * 2/ge;
    my @w = split /,/, $t;
    my %len;
    $len{length $_}++ for @w;
    print "$cnt ", length($s), " ", unpack("%32C*", $s), " ", unpack("%32C*", $t), "\n";
    print join(" ", map { "$_:$len{$_}" } sort { $a <=> $b } keys %len), "\n";
  '
}

job_git() {
  export GIT_AUTHOR_NAME="Hakmem Test" GIT_AUTHOR_EMAIL="test@hakmem.invalid"
  export GIT_COMMITTER_NAME="Hakmem Test" GIT_COMMITTER_EMAIL="test@hakmem.invalid"
  export GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z"
  git -c init.defaultBranch=main init -q repo || return 1
  cd repo || return 1
  for i in $(seq 1 50); do
    seq 1 $((i * 40)) | sed "s/^/file $i line /" > "file$i.txt"
  done
  git add . && git commit -q -m "add 50 files" || return 1
  for c in 1 2 3 4 5; do
    for i in $(seq $c 5 50); do echo "change $c" >> "file$i.txt"; done
    git rm -q "file$((c * 9)).txt"
    git add -A && git commit -q -m "change $c" || return 1
  done
  git log --stat
  git rev-list --count HEAD
  git gc -q
  git fsck --no-progress --full
  git cat-file -p HEAD^{tree} | head -5
}

job_gcc() {
  cat > prog.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node { struct node *next; int v; char pad[40]; };
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(void) {
  struct node *head = NULL;
  for (int i = 0; i < 200000; i++) {
    struct node *n = malloc(sizeof *n + (size_t)(i % 100));
    if (!n) return 1;
    n->v = (i * 7919) % 100003; n->next = head; head = n;
  }
  int *a = malloc(200000 * sizeof *a), k = 0;
  long sum = 0;
  while (head) { struct node *n = head; head = n->next; a[k++] = n->v; sum += n->v; free(n); }
  qsort(a, (size_t)k, sizeof *a, cmp);
  char *s = NULL; size_t len = 0;
  for (int i = 0; i < 1000; i++) {
    char buf[32]; int m = snprintf(buf, sizeof buf, "%d,", a[i * 200]);
    s = realloc(s, len + (size_t)m + 1); memcpy(s + len, buf, (size_t)m + 1); len += (size_t)m;
  }
  printf("%d %ld %d %d %zu %.20s\n", k, sum, a[0], a[k - 1], strlen(s), s);
  free(s); free(a);
  return 0;
}
EOF
  gcc -O2 -Wall -o prog prog.c || return 1
  ./prog || return 1
  # the compiler's output must not depend on the allocator
  cksum < prog
}

job_sqlite3() {
  sqlite3 -batch test.db <<'EOF'
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, val TEXT, blob BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
INSERT INTO t SELECT x, x % 97, printf('v%08d', (x * 7919) % 100003), zeroblob(x % 300) FROM c;
CREATE INDEX t_grp ON t(grp, val);
SELECT count(*), sum(id), min(val), max(val), sum(length(blob)) FROM t;
SELECT grp, count(*), sum(length(val)), min(val) FROM t GROUP BY grp ORDER BY grp LIMIT 5;
SELECT count(DISTINCT val) FROM t;
SELECT substr(group_concat(val, ','), 1, 60) FROM (SELECT val FROM t WHERE grp = 13 ORDER BY val);
UPDATE t SET val = upper(val) || val WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(length(val)) FROM t;
PRAGMA integrity_check;
EOF
}

# clang/LLVM are C++ programs that rely on operator new's 16-byte alignment
# (__STDCPP_DEFAULT_NEW_ALIGNMENT__): hakmem's own sources, a C++ test, and a
# file of 300 functions (code generation's dominator trees), each object's
# checksum compared.
job_clang() {
  local f
  for f in "$REPO"/src/*.c; do
    clang -O2 -std=gnu11 -D_GNU_SOURCE -DHK_VERSION_STRING=\"0\" -I"$REPO/include" -c "$f" -o obj.o || return 1
    echo "$(basename "$f") $(cksum < obj.o)"
  done
  clang++ -O2 -std=c++17 -fsized-deallocation -I"$REPO/include" -c "$REPO/tests/test_cxx.cpp" -o obj.o || return 1
  echo "test_cxx.cpp $(cksum < obj.o)"
  {
    echo '#include <string.h>'
    echo 'struct S { int a[16]; char b[40]; double c; };'
    for i in $(seq 0 299); do
      echo "int f$i(struct S *s, int k) { int t = 0; for (int j = 0; j < k; j++) { struct S x; memcpy(&x, s + j, sizeof x); t += x.a[j & 15] * $i + (int)x.c; } return t; }"
    done
    echo 'int all(struct S *s, int k) { int t = 0;'
    for i in $(seq 0 299); do echo "  t += f$i(s, k);"; done
    echo '  return t; }'
  } > gen.c
  clang -O2 -c gen.c -o obj.o || return 1
  echo "gen.c $(cksum < obj.o)"
}

# cppcheck (C++, many small objects and containers) over hakmem's library
# sources (with the tests too it takes four times as long, in every suite
# that runs this script)
job_cppcheck() {
  cppcheck --enable=all --inconclusive --force -q -I"$REPO/include" -I"$REPO/src" "$REPO/src" 2>&1 |
    sed "s|$REPO/||g" | sort
  echo "cppcheck status ${PIPESTATUS[0]}"
}

# ---- runner ----

run_job() {   # run_job NAME TOOL
  local name=$1 tool=$2
  if ! command -v "$tool" > /dev/null 2>&1; then
    echo "SKIP: $tool not found (CI installs it)"
    return
  fi
  local plain="$TMP/$name-plain" pre="$TMP/$name-preload"
  mkdir -p "$plain" "$pre"
  (cd "$plain" && "job_$name") > "$TMP/$name.plain.out" 2> "$TMP/$name.plain.err"
  local st_plain=$?
  (cd "$pre" && export LD_PRELOAD="$LIB" && "job_$name") > "$TMP/$name.preload.out" 2> "$TMP/$name.preload.err"
  local st_pre=$?
  ran=$((ran + 1))
  if [ "$st_plain" -ne 0 ]; then
    fail "$name: the job itself failed without hakmem (status $st_plain):"
    tail -20 "$TMP/$name.plain.err" >&2
    return
  fi
  if [ "$st_pre" -ne "$st_plain" ]; then
    fail "$name: exit status $st_pre with hakmem preloaded, $st_plain without; stderr with hakmem:"
    tail -20 "$TMP/$name.preload.err" >&2
  fi
  if ! cmp -s "$TMP/$name.plain.out" "$TMP/$name.preload.out"; then
    fail "$name: stdout differs with hakmem preloaded:"
    diff "$TMP/$name.plain.out" "$TMP/$name.preload.out" | head -20 >&2
    echo "stderr with hakmem:" >&2
    tail -20 "$TMP/$name.preload.err" >&2
  fi
  if [ ! -s "$TMP/$name.plain.out" ]; then
    fail "$name: the job printed nothing"
  fi
  echo "ran $name: $(wc -l < "$TMP/$name.plain.out") lines of output, status $st_plain/$st_pre"
}

# ---- is hakmem really loaded? ----
loaded_tool=""
for t in python3 perl; do
  if command -v "$t" > /dev/null 2>&1; then loaded_tool=$t; break; fi
done
if [ -n "$loaded_tool" ]; then
  if [ "$loaded_tool" = python3 ]; then
    maps=$(LD_PRELOAD="$LIB" python3 -c 'import sys; sys.stdout.write(open("/proc/self/maps").read())')
  else
    maps=$(LD_PRELOAD="$LIB" perl -e 'open(my $f, "<", "/proc/self/maps") or die; print <$f>;')
  fi
  if ! printf '%s\n' "$maps" | grep -qF "$(basename "$LIB")"; then
    fail "$(basename "$LIB") is not mapped into a $loaded_tool process started with LD_PRELOAD"
  fi
  # HAKMEM_STATS=1: report on stderr at exit
  if [ "$loaded_tool" = python3 ]; then
    stats_err=$(HAKMEM_STATS=1 LD_PRELOAD="$LIB" python3 -c 'x = [bytes(1000) for _ in range(10000)]; print(len(x))' 2>&1 > /dev/null)
  else
    stats_err=$(HAKMEM_STATS=1 LD_PRELOAD="$LIB" perl -e 'my @x = map { "x" x 1000 } 1..10000; print scalar(@x), "\n";' 2>&1 > /dev/null)
  fi
  if ! printf '%s\n' "$stats_err" | grep -q hakmem; then
    fail "HAKMEM_STATS=1 $loaded_tool (preloaded) printed no report mentioning hakmem on stderr; got: $(printf '%s' "$stats_err" | head -5)"
  else
    echo "HAKMEM_STATS=1 report seen ($(printf '%s\n' "$stats_err" | grep -c .) lines)"
  fi
  # a misspelt option is named on stderr; HAKMEM_LIB (the hakmem program's) is not an option
  if [ "$loaded_tool" = python3 ]; then
    typo_err=$(HAKMEM_PURGE_DELAY=5 HAKMEM_LIB=/unused LD_PRELOAD="$LIB" python3 -c 'pass' 2>&1 > /dev/null)
  else
    typo_err=$(HAKMEM_PURGE_DELAY=5 HAKMEM_LIB=/unused LD_PRELOAD="$LIB" perl -e 'exit 0' 2>&1 > /dev/null)
  fi
  if ! printf '%s\n' "$typo_err" | grep -q "unknown option HAKMEM_PURGE_DELAY ignored"; then
    fail "HAKMEM_PURGE_DELAY (no such option) gave no warning; stderr: $(printf '%s' "$typo_err" | head -3)"
  elif printf '%s\n' "$typo_err" | grep -q "HAKMEM_LIB"; then
    fail "HAKMEM_LIB, which the hakmem program sets, drew a warning: $typo_err"
  else
    echo "unknown option warned about, HAKMEM_LIB left alone"
  fi
else
  echo "SKIP: neither python3 nor perl found for the loaded/stats check"
fi

run_job python3 python3
run_job perl perl
run_job git git
run_job gcc gcc
run_job sqlite3 sqlite3
run_job clang clang
run_job cppcheck cppcheck

if [ "$failures" -ne 0 ]; then
  echo "preload_smoke: $failures failure(s)" >&2
  exit 1
fi
echo "preload_smoke: all passed ($ran jobs)"
exit 0
