#!/bin/bash
# hakmem report (docs/REPORT.md), as a user opens it: the page of a known
# workload loads in a real browser (Debian's chromium, headless) without a
# script error, its charts have data (the timeline's points, the size
# buckets, the flame graph's bars) and its table names the workload's
# allocation sites; a program that forks gets a section per process;
# --from makes the page of a profile a program wrote; a missing program
# exits 127 with hakmem's message.
# Usage: report_check.sh HAKMEM_CLI TEST_PROFILE
set -eu
cli=$1 prog=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "FAIL: chromium is missing (Debian: chromium)"; exit 1; }

# the DOM after the page's script ran
dom() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$dir/chromium" \
    --dump-dom "file://$1" 2>"$dir/browser.err" >"$2" || { cat "$dir/browser.err"; exit 1; }
}

"$cli" report -o "$dir/r.html" --rate 16384 -- "$prog" dump "$dir/p.heap" >/dev/null 2>"$dir/err" ||
  { cat "$dir/err"; echo "FAIL: hakmem report failed"; exit 1; }
grep -q "hakmem report: wrote $dir/r.html (1 process)" "$dir/err" || { cat "$dir/err"; echo "FAIL: no line naming the page"; exit 1; }
dom "$dir/r.html" "$dir/r.dom"
python3 - "$dir/r.dom" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
status = re.search(r'<body data-status="([a-z]+)"', dom)
assert status and status.group(1) == "ok", "the page's script did not finish: %s" % (
    re.search(r'id="error">([^<]*)', dom).group(1) if 'id="error">' in dom else "?")
points = {c: int(n) for c, n in re.findall(r'class="chart (\w+)" data-points="(\d+)"', dom)}
assert points.get("timeline", 0) >= 2, "the timeline has %s points" % points.get("timeline")
assert points.get("sizes", 0) >= 3, "the size chart has %s buckets" % points.get("sizes")
assert points.get("flame", 0) >= 5, "the flame graph has %s bars" % points.get("flame")
table = dom[dom.index('class="sites"'):]
for fn in ("profile_keep_small", "profile_keep_large", "profile_keep_cross", "profile_churn"):
    assert fn in table, "the sites table names no %s" % fn
print("report: timeline %d points, %d size buckets, %d flame bars; sites named" %
      (points["timeline"], points["sizes"], points["flame"]))
PY

# a program that forks and execs: a section per process
"$cli" report -o "$dir/f.html" --rate 16384 -- sh -c "\"$prog\" dump \"$dir/q.heap\" >/dev/null; \"$prog\" dump \"$dir/s.heap\" >/dev/null" \
  2>"$dir/err" || { cat "$dir/err"; exit 1; }
dom "$dir/f.html" "$dir/f.dom"
grep -q '<body data-status="ok"' "$dir/f.dom" || { echo "FAIL: the page of a forking program"; exit 1; }
n=$(grep -o '<section class="process">' "$dir/f.dom" | wc -l)
[ "$n" -ge 3 ] || { echo "FAIL: $n sections for sh and its two children"; exit 1; }
echo "report: sh and its children, $n sections"

# --from: the profile hak_profile_dump wrote above
"$cli" report --from "$dir/p.heap.json" -o "$dir/from.html" 2>/dev/null
dom "$dir/from.html" "$dir/from.dom"
grep -q '<body data-status="ok"' "$dir/from.dom" && grep -q "profile_keep_small" "$dir/from.dom" ||
  { echo "FAIL: report --from"; exit 1; }

set +e
"$cli" report -o "$dir/x.html" -- hakmem-no-such-program-xyz 2>"$dir/err"
rc=$?
set -e
[ "$rc" -eq 127 ] && grep -q "hakmem report: cannot run 'hakmem-no-such-program-xyz'" "$dir/err" ||
  { cat "$dir/err"; echo "FAIL: a missing program (status $rc)"; exit 1; }
echo "report_check: OK"
