#!/usr/bin/env python3
"""Real programs under each allocator: wall time and peak RSS.

usage: bench/programs.py [--repeats N] [--only NAME] [--write]

Runs each program of PROGRAMS whose tools are installed with glibc's
malloc, hakmem (build/libhakmem.so, or HAKMEM_LIB) and each peer found
(mimalloc, jemalloc, tcmalloc: bench/runner.py's PEERS) preloaded, in a
shuffled order each round, N rounds (5), and prints the medians: wall
time of the whole command and the peak RSS of its largest process.
--write also puts the table into docs/BENCHMARKS.md (between its "real
programs" markers), naming the command, date and commit. The benchmark
suite measures what each of its programs isolates; these are what people
run, with their own mix of sizes, lifetimes and threads.
"""
import argparse, os, random, shutil, statistics, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from docs_results import run_label, splice  # noqa: E402
from runner import PEERS, find_shared_lib  # noqa: E402

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SOURCES = " ".join(f"src/{f}.c" for f in ("profile", "large", "region", "queue", "remote", "inspect"))
CFLAGS = "-O2 -std=c11 -D_GNU_SOURCE -DHK_VERSION_STRING='\"0\"' -Iinclude -Isrc -c -o /dev/null"
JSON = ("import json, random; random.seed(1); "
        "d = [{'k%d' % i: [random.random() for _ in range(20)], 's': str(i) * 5} for i in range(150000)]; "
        "t = json.dumps(d); e = json.loads(t); assert len(e) == len(d)")
SQL = ("create table t(a integer primary key, b text, c real); "
       "with recursive r(i) as (select 1 union all select i + 1 from r where i < 500000) "
       "insert into t select i, hex(randomblob(16)), random() from r; create index ib on t(b); "
       "select count(*) from t where b like 'A%'; select sum(length(b)) from t group by a % 100 order by 1 limit 3;")
PERL = ("my %h; for my $i (1..600000) { $h{\"key$i\" . ($i * 7 % 1000)} = [$i, 'x' x ($i % 50)] } "
        "my $n = 0; for (sort keys %h) { $n++ if /7.*3/ } print \"$n\\n\"")

# (label, shell command run in the repository, tools it needs, environment)
PROGRAMS = [
    ("gcc -O2 -c, 6 of hakmem's sources, one by one", f"for f in {SOURCES}; do gcc {CFLAGS} $f; done", ["gcc"], {}),
    ("clang -O2 -c, the same", f"for f in {SOURCES}; do clang {CFLAGS} $f; done", ["clang"], {}),
    ("python3: 150k dicts to JSON and back", f"{PY} -c \"{JSON}\"", [PY], {"PYTHONMALLOC": "malloc"}),
    ("python3: compile the standard library", f"{PY} bench/compile_stdlib.py", [PY], {"PYTHONMALLOC": "malloc"}),
    ("sqlite3: 500k rows inserted, indexed, queried", 'rm -f "$TMPDIR/t.db"; sqlite3 "$TMPDIR/t.db" "' + SQL + '"',
     ["sqlite3"], {}),
    ("git log -p of this repository's last 400 commits", "git log -p -n 400", ["git"], {}),
    ("perl: a hash of 600k keys, sorted and matched", f"perl -e '{PERL}'", ["perl"], {}),
    ("sh: 1000 processes started (/bin/true), what preloading adds to each", "for i in $(seq 1000); do /bin/true; done",
     ["seq"], {}),
]


# GNU time reports the peak RSS of the command's largest process. A
# process started from this script would carry the script's own peak (the
# kernel keeps a process's peak across exec), and so would wait4's figure.
GNU_TIME = "/usr/bin/time"


def run_once(cmd, env):
    """Wall seconds and peak RSS (MiB) of its largest process."""
    t = time.perf_counter()
    p = subprocess.run([GNU_TIME, "-f", "maxrss %M", "sh", "-c", cmd], cwd=REPO, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"programs.py: '{cmd[:60]}' failed (status {p.returncode}) with {env.get('LD_PRELOAD', 'glibc')}")
    kib = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("maxrss ")]
    return dt, kib[-1] / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="programs whose label contains this")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(GNU_TIME):
        sys.exit(f"programs.py: {GNU_TIME} is missing (Debian: time)")
    lib = os.environ.get("HAKMEM_LIB", os.path.join(REPO, "build", "libhakmem.so"))
    if not os.path.exists(lib):
        sys.exit(f"programs.py: {lib} is missing (make build)")
    allocs = {"glibc": None, "hakmem": os.path.abspath(lib)}
    for name, soname, pkg in PEERS:
        path = find_shared_lib(soname)
        if path:
            allocs[name] = path
        else:
            print(f"programs.py: {name} not found (apt-get install {pkg}): left out", file=sys.stderr)
    tmp = tempfile.mkdtemp()
    peers = [n for n in allocs if n != "hakmem"]
    rows = []
    for label, cmd, tools, extra in PROGRAMS:
        if a.only and a.only not in label:
            continue
        missing = [t for t in tools if not shutil.which(t)]
        if missing:
            print(f"programs.py: {label}: {', '.join(missing)} missing: left out", file=sys.stderr)
            continue
        res = {n: [] for n in allocs}
        for _ in range(a.repeats):
            order = list(allocs)
            random.shuffle(order)
            for n in order:
                env = dict(os.environ, TMPDIR=tmp, **extra)
                env.pop("LD_PRELOAD", None)
                if allocs[n]:
                    env["LD_PRELOAD"] = allocs[n]
                res[n].append(run_once(cmd, env))
        t = {n: statistics.median(x[0] for x in v) for n, v in res.items()}
        m = {n: statistics.median(x[1] for x in v) for n, v in res.items()}
        best = min(peers, key=lambda n: t[n])
        cells = [f"{t[n]:.2f} s, {m[n]:.0f} MiB" for n in allocs]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {t[best] / t['hakmem']:.2f}x ({best}) |")
        print(rows[-1], flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    body = "\n".join([
        f"`bench/programs.py --repeats {a.repeats}`: wall time of the whole command and the peak RSS of its "
        f"largest process, medians of {a.repeats} runs in a shuffled order (GNU time for the RSS); {run_label()}. The last column is "
        "the fastest other allocator's time over hakmem's (above 1: hakmem is faster). CPython runs with "
        "`PYTHONMALLOC=malloc`, so that its objects come from the allocator under test rather than from its "
        "own pools. Single runs of a second or two on this shared machine vary by 10-20 %.",
        "",
        "| program | " + " | ".join(allocs) + " | best other / hakmem |",
        "|---|" + "---:|" * (len(allocs) + 1),
        *rows,
    ])
    print(body)
    if a.write:
        path = os.path.join(REPO, "docs", "BENCHMARKS.md")
        text = splice(open(path).read(), "real programs", body, "bench/programs.py")
        open(path, "w").write(text)
        print("programs.py: wrote", path)


if __name__ == "__main__":
    main()
