#!/usr/bin/env python3
"""Heaps against freeing block by block (docs/HEAPS.md): bench/arena builds a
tree as a parser would, reads it and throws it away, again and again; with
`free` it frees every block, with `heap` it makes a heap per tree and
destroys it (hakmem's hak_heap_*, mimalloc's mi_heap_*, a jemalloc arena).

usage: bench/arena.py [--repeats N] [--write]
Runs every shape below under each allocator and mode, interleaved, N times
(5), and prints a table of the medians: nodes per second (millions), the
share of the time spent throwing trees away, peak RSS; --write puts it into
docs/HEAPS.md between its "arena" markers, naming the command, date and
commit.
"""
import argparse, os, re, statistics, subprocess, sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from docs_results import run_label, splice  # noqa: E402

# (label, ROUNDS NODES THREADS)
SHAPES = [("trees of 200k nodes, 1 thread", ["20", "200000", "1"]),
          ("trees of 200k nodes, 2 threads (a heap each)", ["10", "200000", "2"]),
          ("trees of 2M nodes, 1 thread", ["3", "2000000", "1"]),
          ("trees of 2k nodes, 1 thread", ["2000", "2000", "1"])]
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def run(prog, mode, args, preload):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    r = subprocess.run([prog, mode, *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"arena.py: {mode} {' '.join(args)} under {preload or 'glibc'} failed: {r.stderr[-300:]}")
    kv = dict(re.findall(r"(\w+)=(\S+)", r.stdout))
    return float(kv["ops_per_sec"]) / 1e6, float(kv["drop_s"]) / max(float(kv["build_s"]) + float(kv["drop_s"]), 1e-9), \
        int(kv["peak_rss_kb"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    prog = os.path.join(REPO, "build", "bench", "arena")
    lib = os.environ.get("HAKMEM_LIB", os.path.join(REPO, "build", "libhakmem.so"))
    peers = [("mimalloc", f"{LIBDIR}/libmimalloc.so.2"), ("jemalloc", f"{LIBDIR}/libjemalloc.so.2"),
             ("tcmalloc", f"{LIBDIR}/libtcmalloc_minimal.so.4")]
    allocs = [("hakmem", lib), ("glibc", "")] + [(n, p) for n, p in peers if os.path.exists(p)]
    # tcmalloc and glibc have no heaps
    ways = [(n, p, m) for n, p in allocs for m in ("free", "heap") if m == "free" or n in ("hakmem", "mimalloc", "jemalloc")]
    res = {(n, m, i): [] for n, _, m in ways for i in range(len(SHAPES))}
    for i, (label, args) in enumerate(SHAPES):
        for r in range(a.repeats):
            for n, p, m in (ways if r % 2 == 0 else ways[::-1]):
                res[(n, m, i)].append(run(prog, m, args, p))
        print("arena.py:", label, "done", flush=True)
    rows = []
    for n, _, m in ways:
        cells = []
        for i in range(len(SHAPES)):
            v = res[(n, m, i)]
            ops = statistics.median(x[0] for x in v)
            drop = statistics.median(x[1] for x in v)
            rss = statistics.median(x[2] for x in v)
            cells.append(f"{ops:.2f} M/s, {100 * drop:.0f} %, {rss / 1024:.0f} MiB")
        rows.append(f"| {n} {m} | " + " | ".join(cells) + " |")
    body = "\n".join([
        f"`bench/arena.py --repeats {a.repeats}` (`bench/arena MODE ROUNDS NODES THREADS`): nodes made per second "
        f"(millions), the share of the time spent throwing the trees away, and peak RSS; medians of {a.repeats} "
        f"interleaved runs; {run_label()}. `free`: every block freed; `heap`: a heap per tree, destroyed.",
        "",
        "| allocator | " + " | ".join(label for label, _ in SHAPES) + " |",
        "|---|" + "---:|" * len(SHAPES),
        *rows,
    ])
    print(body)
    if a.write:
        path = os.path.join(REPO, "docs", "HEAPS.md")
        text = splice(open(path).read(), "arena", body, "bench/arena.py")
        open(path, "w").write(text)
        print("arena.py: wrote", path)


if __name__ == "__main__":
    main()
