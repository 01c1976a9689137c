#!/usr/bin/env python3
"""Whole-program wall time under glibc, glibc with heaptrack (Debian's
`heaptrack`, which records every allocation), hakmem, and hakmem with its
heap profiler at the default rate (HAKMEM_PROFILE=1, docs/PROFILE.md).

usage: bench/profile_vs_heaptrack.py [--repeats N] [--write]
Runs each program of PROGRAMS in the four ways, interleaved, N times (3),
and prints a table of the medians; --write also puts it into
docs/PROFILE.md and docs/BENCHMARKS.md (between their "profiler vs
heaptrack" markers), naming the command, date and commit.
"""
import argparse, os, shutil, statistics, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from docs_results import run_label, splice  # noqa: E402

B = os.path.join(REPO, "build", "bench")
PROGRAMS = [
    ("random_mixed 4000000 2000 42", [f"{B}/random_mixed", "4000000", "2000", "42"], {}),
    ("tiny_hot 200000", [f"{B}/tiny_hot", "200000"], {}),
    ("larson 2 3000 2000 2000 1", [f"{B}/larson", "2", "3000", "2000", "2000", "1"], {}),
    ("mid_large_mt 2 1000000 256", [f"{B}/mid_large_mt", "2", "1000000", "256"], {}),
    ("fixed 65536 300000", [f"{B}/fixed", "65536", "300000"], {}),
    ("python3 bench/compile_stdlib.py (PYTHONMALLOC=malloc)",
     ["/usr/bin/python3", os.path.join(REPO, "bench", "compile_stdlib.py")], {"PYTHONMALLOC": "malloc"}),
]


def wall(cmd, env):
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if not shutil.which("heaptrack"):
        sys.exit("profile_vs_heaptrack.py: heaptrack is missing (Debian: heaptrack)")
    lib = os.environ.get("HAKMEM_LIB", os.path.join(REPO, "build", "libhakmem.so"))
    tmp = tempfile.mkdtemp()
    rows = []
    for label, cmd, extra in PROGRAMS:
        base = dict(os.environ, **extra)
        ways = {
            "glibc": (cmd, base),
            "heaptrack": (["heaptrack", "-o", os.path.join(tmp, "trace")] + cmd, base),
            "hakmem": (cmd, dict(base, LD_PRELOAD=lib)),
            "profiling": (cmd, dict(base, LD_PRELOAD=lib, HAKMEM_PROFILE="1",
                                    HAKMEM_PROFILE_FILE=os.path.join(tmp, "p.%p"))),
        }
        times = {k: [] for k in ways}
        for _ in range(a.repeats):
            for k, (c, e) in ways.items():
                times[k].append(wall(c, e))
                for f in os.listdir(tmp):
                    os.remove(os.path.join(tmp, f))
        m = {k: statistics.median(v) for k, v in times.items()}
        rows.append(f"| `{label}` | {m['glibc']:.3f} s | {m['heaptrack']:.3f} s ({m['heaptrack'] / m['glibc']:.1f}x) | "
                    f"{m['hakmem']:.3f} s | {m['profiling']:.3f} s ({m['profiling'] / m['hakmem']:.2f}x) |")
        print(rows[-1], flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    body = "\n".join([
        f"`bench/profile_vs_heaptrack.py --repeats {a.repeats}`: whole-process wall time, medians of "
        f"{a.repeats} interleaved runs; {run_label()}. heaptrack against glibc, the profiler "
        "against hakmem without it.",
        "",
        "| program | glibc | heaptrack | hakmem | hakmem profiling |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
    print(body)
    if a.write:
        for doc in ("PROFILE.md", "BENCHMARKS.md"):
            path = os.path.join(REPO, "docs", doc)
            text = splice(open(path).read(), "profiler vs heaptrack", body, "bench/profile_vs_heaptrack.py")
            open(path, "w").write(text)
            print("profile_vs_heaptrack.py: wrote", path)


if __name__ == "__main__":
    main()
