#!/bin/bash
# The statistics' formats, checked by other programs' parsers:
#   hak_stats_json's text and HAKMEM_STATS=json's report against
#   docs/stats.schema.json (python3-jsonschema), with their sums;
#   the per-thread list sorted, and within the process's live bytes when
#   exact (HAKMEM_THREAD_STATS=1);
#   malloc_info's XML (python3's xml.etree) in glibc's elements;
#   HAKMEM_STATS_FILE: one report per process, a forked or executed
#   process's under NAME.PID, %p replaced by the pid; the text report names
#   the process.
# Usage: stats_check.sh LIBHAKMEM_SO TEST_STATS SCHEMA
set -eu
lib=$1 prog=$2 schema=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

python3 -c 'import jsonschema' 2>/dev/null || { echo "FAIL: python3's jsonschema module is missing (Debian: python3-jsonschema)"; exit 1; }

validate() { # FILE... : each one JSON object of the schema, its sums right
  python3 - "$schema" "$@" <<'PY'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
for path in sys.argv[2:]:
    text = open(path).read()
    doc = json.loads(text)
    jsonschema.validate(doc, schema)
    assert doc["live_bytes"] == doc["small_live_bytes"] + doc["large_live_bytes"], path
    assert doc["live_blocks"] == doc["small_live_blocks"] + doc["large_live_blocks"], path
    k = doc["classes"]
    assert sum(c["live_blocks"] for c in k) == doc["small_live_blocks"], path
    assert sum(c["live_bytes"] for c in k) == doc["small_live_bytes"], path
    assert all(c["live_bytes"] == c["live_blocks"] * c["block_size"] for c in k), path
    assert [c["block_size"] for c in k] == sorted(set(c["block_size"] for c in k)), path
    assert doc["mapped_bytes"] == doc["region_bytes"] + doc["large_mapped_bytes"], path
    t = doc["thread_live"]
    assert [x["live_bytes"] for x in t] == sorted((x["live_bytes"] for x in t), reverse=True), path
    assert all(x["large_live_bytes"] <= x["live_bytes"] and x["large_live_blocks"] <= x["live_blocks"] for x in t), path
    if doc["thread_stats_exact"]: # (the threads' blocks are among the process's)
        assert sum(x["live_bytes"] for x in t) <= doc["live_bytes"], path
    print("ok %s: pid %d (%s), %d live bytes, %d classes" % (path, doc["pid"], doc["program"], doc["live_bytes"], len(k)))
PY
}

# 1. the program's own calls
"$prog" "$dir/api.json" "$dir/info.xml"
validate "$dir/api.json"
python3 - "$dir/info.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "malloc" and root.get("version") == "1"
heaps = root.findall("heap")
assert len(heaps) == 1 and heaps[0].get("nr") == "0"
sizes = heaps[0].find("sizes").findall("size")
assert sizes, "no <size> element"
for s in sizes:
    lo, hi, total, count = (int(s.get(a)) for a in ("from", "to", "total", "count"))
    assert 1 <= lo <= hi and count > 0 and total == count * hi, s.attrib
types = [t.get("type") for t in root.findall("total")]
assert types == ["fast", "rest", "mmap"], types
for e in root.iter():
    if e.tag in ("total", "system", "aspace"):
        int(e.get("size"))
print("ok %s: %d size classes with free blocks" % (sys.argv[1], len(sizes)))
PY

# 2. at exit, to stderr
HAKMEM_STATS=json LD_PRELOAD=$lib "$prog" >/dev/null 2>"$dir/stderr.json"
validate "$dir/stderr.json"
HAKMEM_STATS=json HAKMEM_THREAD_STATS=1 LD_PRELOAD=$lib "$prog" >/dev/null 2>"$dir/threads.json"
validate "$dir/threads.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["thread_stats_exact"] and d["thread_live"], d["thread_live"]' "$dir/threads.json"

# 3. to a file: bash (its report under the name), a program it executes, a
# subshell it forks and the program that one executes (NAME.PID each)
mkdir "$dir/f"
HAKMEM_STATS=json HAKMEM_STATS_FILE="$dir/f/s.json" LD_PRELOAD=$lib bash -c '/bin/true; ( /bin/true; exit 0 ); exit 0'
files=("$dir"/f/*)
[ ${#files[@]} -eq 4 ] || { echo "FAIL: ${#files[@]} reports, want 4: ${files[*]}"; exit 1; }
validate "${files[@]}"
python3 - "$dir/f" <<'PY'
import json, os, sys
d = sys.argv[1]
docs = {n: json.load(open(os.path.join(d, n))) for n in os.listdir(d)}
assert docs["s.json"]["program"] == "bash", docs["s.json"]["program"]
others = [n for n in docs if n != "s.json"]
for n in others:
    assert n == "s.json.%d" % docs[n]["pid"], (n, docs[n]["pid"])
assert sorted(docs[n]["program"] for n in others) == ["bash", "true", "true"], [docs[n]["program"] for n in others]
assert len({doc["pid"] for doc in docs.values()}) == 4
print("ok: one report per process, the first under the name")
PY

# 4. text, %p in the name
HAKMEM_STATS=1 HAKMEM_STATS_FILE="$dir/t.%p.txt" LD_PRELOAD=$lib "$prog" >/dev/null
set -- "$dir"/t.*.txt
[ $# -eq 1 ] || { echo "FAIL: $# text reports"; exit 1; }
pid=${1#"$dir/t."}; pid=${pid%.txt}
head -1 "$1" | grep -q "^hakmem: statistics (hakmem [0-9.]*) of process $pid (${prog##*/})$" ||
  { echo "FAIL: the text report's first line: $(head -1 "$1")"; exit 1; }
grep -q "^hakmem:   live bytes" "$1" || { echo "FAIL: no live bytes in the text report"; exit 1; }
grep -q "^hakmem:   thread $pid: [0-9]* B live in" "$1" || { echo "FAIL: no live bytes of the main thread in the text report"; exit 1; }
grep -q "^  HAKMEM_STATS_FILE=$dir/t.%p.txt$" "$1" || { echo "FAIL: the text report does not list HAKMEM_STATS_FILE"; exit 1; }
echo "ok: text report names process $pid"
echo "stats_check: OK"
