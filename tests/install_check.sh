#!/bin/sh
# Installs the build into a temporary prefix and checks that a program can
# use hakmem through pkg-config and through CMake's find_package, and that
# both report the project's version, and that the installed `hakmem report`
# works.
#   sh tests/install_check.sh [VERSION]
# VERSION defaults to the one in CMakeLists.txt's project().
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-$(sed -n 's/^project(hakmem VERSION \([0-9][0-9.]*\).*/\1/p' "$root/CMakeLists.txt")}
[ -n "$version" ] || { echo "FAIL: no version given, none found in $root/CMakeLists.txt"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$root/build" --prefix "$tmp/prefix" >/dev/null

pcdir=$(dirname "$(find "$tmp/prefix" -name hakmem.pc | head -n 1)")
libdir=$(dirname "$pcdir")
cat > "$tmp/main.c" <<'C'
#include <hakmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  char *p = malloc(100);            /* hakmem's malloc: the library overrides it */
  char *q = hak_malloc(100);
  if (!p || !q) return 1;
  strcpy(p, "ok");
  printf("%s %s usable=%zu\n", hak_version(), p, hak_malloc_usable_size(q));
  free(p);
  hak_free(q);
  return 0;
}
C
# pkg-config
pcversion=$(PKG_CONFIG_PATH="$pcdir" pkg-config --modversion hakmem)
[ "$pcversion" = "$version" ] || { echo "FAIL: hakmem.pc has version '$pcversion', expected '$version'"; exit 1; }
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs hakmem)
cc "$tmp/main.c" -o "$tmp/via_pkgconfig" $flags
out=$(LD_LIBRARY_PATH="$libdir" "$tmp/via_pkgconfig")
echo "pkg-config: $out"
case "$out" in "$version ok usable="*) ;; *) echo "FAIL: pkg-config build printed '$out'"; exit 1;; esac
ldd "$tmp/via_pkgconfig" | grep -q "libhakmem.so" || { echo "FAIL: not linked to libhakmem.so"; exit 1; }

# find_package
mkdir -p "$tmp/proj"
cp "$tmp/main.c" "$tmp/proj/main.c"
cat > "$tmp/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(uses_hakmem C)
find_package(hakmem REQUIRED)
add_executable(via_cmake main.c)
target_link_libraries(via_cmake PRIVATE hakmem::hakmem)
CM
cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/proj/build" >/dev/null
out=$("$tmp/proj/build/via_cmake")
echo "find_package: $out"
case "$out" in "$version ok usable="*) ;; *) echo "FAIL: find_package build printed '$out'"; exit 1;; esac
# the installed `hakmem report` finds its generator, its page and the library
"$tmp/prefix/bin/hakmem" report -o "$tmp/r.html" -- true 2>"$tmp/report.err" ||
  { cat "$tmp/report.err"; echo "FAIL: the installed hakmem report"; exit 1; }
grep -q '"processes":\[{' "$tmp/r.html" || { echo "FAIL: the installed report's page has no process"; exit 1; }
echo "hakmem report: $(tail -n 1 "$tmp/report.err")"
echo "install check passed"
