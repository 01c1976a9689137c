#!/usr/bin/env python3
"""Transparent huge pages (HAKMEM_THP, docs/OPTIONS.md) on programs with a
large heap: wall time and peak RSS under hakmem with HAKMEM_THP=never, auto
and always, glibc, and mimalloc without and with its huge pages
(MIMALLOC_LARGE_OS_PAGES=1, which asks for transparent huge pages).

usage: bench/thp.py [--repeats N] [--write]
Runs the workloads below interleaved, N times (3), and prints a table of
the medians; --write puts it into docs/BENCHMARKS.md between its "huge
pages" markers, naming the command, date, commit and the kernel's THP mode.
"""
import argparse, os, statistics, subprocess, sys, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from docs_results import run_label, splice  # noqa: E402

# A dict of 6 million entries and their strings (about 1.3 GB with every
# object from malloc), then 6 million lookups in random order.
DICT = """
import random, time
d = {i * 7919: "x" * (i % 40) for i in range(6_000_000)}
keys = list(d)
random.seed(1)
s = sum(len(d[k]) for k in random.choices(keys, k=6_000_000))
"""
# sqlite3 in memory: a table of 2 million rows with an index, random lookups
SQLITE = """
import random, sqlite3
db = sqlite3.connect(":memory:")
db.execute("pragma cache_size=-2000000")
db.execute("create table t(k integer primary key, v text)")
db.executemany("insert into t values(?, ?)", ((i * 7919, "y" * (i % 100)) for i in range(2_000_000)))
db.execute("create index tv on t(v, k)")
random.seed(2)
s = sum(len(db.execute("select v from t where k = ?", (random.randrange(2_000_000) * 7919,)).fetchone()[0])
        for _ in range(300_000))
"""
WORKLOADS = [("python3: dict of 6M entries, 6M random lookups", DICT),
             ("python3 + sqlite3: 2M rows indexed, 300k random lookups", SQLITE)]


def run(code, env):
    """Wall time and peak RSS (KiB) of one run (in a child: its own rusage)."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "%M", "/usr/bin/python3", "-c", code], env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit("thp.py: a run failed: " + r.stderr[-500:])
    return wall, int(r.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    lib = os.environ.get("HAKMEM_LIB", os.path.join(REPO, "build", "libhakmem.so"))
    mi = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
    base = dict(os.environ, PYTHONMALLOC="malloc")
    ways = [("glibc", base)]
    if os.path.exists(mi):
        ways += [("mimalloc", dict(base, LD_PRELOAD=mi)),
                 ("mimalloc huge", dict(base, LD_PRELOAD=mi, MIMALLOC_LARGE_OS_PAGES="1"))]
    ways += [(f"hakmem {m}", dict(base, LD_PRELOAD=lib, HAKMEM_THP=m)) for m in ("never", "auto", "always")]
    rows = []
    for label, code in WORKLOADS:
        res = {w: [] for w, _ in ways}
        for _ in range(a.repeats):
            for w, env in ways:
                res[w].append(run(code, env))
        cells = []
        for w, _ in ways:
            t = statistics.median(x[0] for x in res[w])
            m = statistics.median(x[1] for x in res[w])
            cells.append(f"{t:.2f} s, {m / 1024:.0f} MiB")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip() \
        if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled") else "absent"
    body = "\n".join([
        f"`bench/thp.py --repeats {a.repeats}`: wall time and peak RSS, medians of {a.repeats} interleaved runs, "
        f"every object through malloc (`PYTHONMALLOC=malloc`); {run_label()}, kernel THP mode `{thp}`.",
        "",
        "| workload | " + " | ".join(w for w, _ in ways) + " |",
        "|---|" + "---:|" * len(ways),
        *rows,
    ])
    print(body)
    if a.write:
        path = os.path.join(REPO, "docs", "BENCHMARKS.md")
        text = splice(open(path).read(), "huge pages", body, "bench/thp.py")
        open(path, "w").write(text)
        print("thp.py: wrote", path)


if __name__ == "__main__":
    main()
