#!/bin/bash
# docs/REPORT.md's example: hakmem report on CPython compiling its standard
# library (bench/compile_stdlib.py, every allocation through malloc:
# PYTHONMALLOC=malloc), and a screenshot of the page by headless chromium.
# CPython's function names come from Debian's python3.11-dbg (its debug
# symbols, which addr2line finds by build id).
# Usage: bench/report_demo.sh OUT_DIR   (writes OUT_DIR/report.html, report.png)
set -eu
out=${1:?usage: bench/report_demo.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
PYTHONMALLOC=malloc "$root/build/programs/hakmem" report -o "$out/report.html" -- \
  /usr/bin/python3 "$root/bench/compile_stdlib.py"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$out/chromium" \
  --window-size=1240,1700 --screenshot="$out/report.png" "file://$(cd "$out" && pwd)/report.html" 2>/dev/null
rm -rf "$out/chromium"
echo "bench/report_demo.sh: $out/report.html, $out/report.png ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo +dirty))"
