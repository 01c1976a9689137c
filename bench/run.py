#!/usr/bin/env python3
"""Benchmark runner: hakmem against glibc, mimalloc, jemalloc and tcmalloc.

Runs every benchmark program (bench/*.c, built into build/bench/) under each
allocator (chosen with LD_PRELOAD; glibc = no preload), interleaved
(A B C A B C ...) for several repeats, takes medians, prints a markdown
table and writes JSON, CSV and a chart under bench/results/.

  python3 bench/run.py                 # full suite, 5 repeats (make bench)
  python3 bench/run.py --quick         # subset, 2 repeats (make bench-quick)
  python3 bench/run.py --callgrind     # instructions per malloc+free pair (make bench-callgrind)
  python3 bench/run.py --only larson,tiny_hot --with mine=/path/libmine.so --repeats 3

See docs/BENCHMARKS.md.
"""
import argparse
import csv
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class Bench:
    def __init__(self, name, full, quick=None, extras=(), what="", memory_only=False):
        self.name = name      # benchmark name as in the RESULT line
        self.full = full      # argv (program first) for the full suite
        self.quick = quick    # argv for --quick, None = not in the quick subset
        self.extras = extras  # (key, label, unit divisor) of extra metrics to tabulate
        self.what = what
        self.memory_only = memory_only  # no throughput row: it times nothing worth comparing


BENCHMARKS = [
    Bench("random_mixed", ["random_mixed", "40000000", "2000", "42"],
          ["random_mixed", "4000000", "2000", "42"],
          what="random alloc/free of 16-1040 B in a 2000-slot working set"),
    Bench("random_mixed_4096", ["random_mixed", "40000000", "4096", "42"],
          what="the same with a 4096-slot working set"),
    Bench("random_mixed_8192", ["random_mixed", "40000000", "8192", "42"],
          what="the same with an 8192-slot working set"),
    Bench("tiny_hot", ["tiny_hot", "1000000"], ["tiny_hot", "100000"],
          what="LIFO batches of 64 blocks, 16-128 B"),
    Bench("mid_large_mt", ["mid_large_mt", "2", "6000000", "256"], ["mid_large_mt", "2", "1000000", "256"],
          what="random_mixed per thread with 8-32 KiB blocks, 2 threads"),
    Bench("mid_large_mt_64", ["mid_large_mt", "2", "6000000", "64"],
          what="the same with 64 slots a thread: about two blocks live per size class"),
    Bench("mid_large_mt_1024", ["mid_large_mt", "2", "3000000", "1024"],
          what="the same with 1024 slots a thread"),
    Bench("big_mixed", ["mid_large_mt", "2", "200000", "64", "65536", "1048576"],
          what="the same with 64 slots of 64 KiB-1 MiB blocks a thread (pages of one or two blocks)"),
    Bench("larson", ["larson", "2", "3000", "2000", "2000", "1"],
          ["larson", "2", "300", "2000", "2000", "1"],
          what="server simulation, arrays handed between 2 threads (remote frees)"),
    Bench("larson_1", ["larson", "1", "6000", "2000", "2000", "1"],
          what="the same with 1 worker: it replaces blocks the main thread allocated and then waits for"),
    Bench("larson_4", ["larson", "4", "1500", "2000", "2000", "1"],
          what="the same with 4 threads on the machine's cores"),
    Bench("larson_16", ["larson", "16", "400", "2000", "2000", "1"],
          what="the same with 16 threads"),
    Bench("mem_16b", ["mem_16b", "1000000"], ["mem_16b", "1000000"],
          extras=(("overhead_bytes_per_alloc", "overhead B/alloc", 1),),
          what="1M x 16 B, overhead bytes per allocation"),
    Bench("mem_random", ["mem_random", "1000000"],
          extras=(("overhead_bytes_per_alloc", "overhead B/alloc", 1),),
          what="1M x 16-128 B, overhead bytes per allocation"),
    Bench("fixed_64k", ["fixed", "65536", "3000000"], what="64 KiB blocks, working set 4"),
    Bench("fixed_256k", ["fixed", "262144", "1000000"], what="256 KiB blocks, working set 4"),
    Bench("fixed_2m", ["fixed", "2097152", "80000"], ["fixed", "2097152", "10000"],
          what="2 MiB blocks, working set 4"),
    Bench("large_varied", ["large_varied", "2", "1", "16", "all", "1", "1s", "42"],
          ["large_varied", "2", "1", "16", "all", "1", "0.3s", "42"],
          what="2 live blocks of 1-16 MiB, one replaced at random, every 4 KiB page written"),
    Bench("large_varied_16", ["large_varied", "16", "1", "16", "all", "1", "1s", "42"],
          what="the same with 16 live blocks"),
    Bench("large_varied_2t", ["large_varied", "2", "1", "16", "all", "2", "1s", "42"],
          what="blocks of 1-16 MiB passed from one thread to another through a ring of 2"),
    Bench("remote_trickle", ["remote_trickle", "20000000", "5"], ["remote_trickle", "2000000", "5"],
          what="random_mixed in one thread, 0.5 % of its frees of blocks a busy second thread allocated"),
    Bench("prodcons", ["prodcons", "2", "6000000"], ["prodcons", "2", "1000000"],
          what="2 producer->consumer pairs through lock-free rings (remote frees)"),
    Bench("realloc_growth", ["realloc_growth", "120"], ["realloc_growth", "20"],
          what="8 buffers grown by realloc (+10 % or x2) to 1 MiB, then halved"),
    Bench("fragmentation", ["fragmentation", "200", "5"], ["fragmentation", "100", "5"],
          extras=(("frag_ratio", "peak RSS / peak live", 1),
                  ("rss_after_free_kb", "RSS 1 s after freeing all (MiB)", 1024)),
          what="200 MB of 16 B-64 KiB, free 90 %, refill with 64-256 KiB, free all"),
    Bench("false_sharing", ["false_sharing", "2", "50000", "10000"],
          what="2 threads write to their own freshly allocated 16 B blocks"),
    Bench("thread_churn", ["thread_churn", "20000"], ["thread_churn", "2000"],
          what="20000 short-lived threads, 8 at a time, each leaving blocks for the main thread to free"),
    Bench("thread_scaling_1", ["thread_scaling", "1", "10000000"], what="small churn, 1 thread"),
    Bench("thread_scaling_2", ["thread_scaling", "2", "10000000"],
          ["thread_scaling", "2", "2000000"], what="small churn, 2 threads"),
    Bench("thread_scaling_4", ["thread_scaling", "4", "10000000"], what="small churn, 4 threads"),
    Bench("thread_scaling_8", ["thread_scaling", "8", "10000000"], what="small churn, 8 threads"),
    Bench("one_block", ["one_block"], ["one_block"], memory_only=True,
          extras=(("peak_rss_kb", "peak RSS (KiB)", 1),),
          what="a program that allocates one 16 B block: peak RSS"),
]


def scaling_benchmarks(threads):
    """--scaling: the multi-threaded server-like benchmarks at each thread count
    (fixed work per thread, so ideal throughput grows with the threads up to
    the number of cores)."""
    out = []
    for t in threads:
        out.append(Bench(f"larson_{t}t", ["larson", str(t), "1s", "2000", "2000", "1"],
                         what=f"larson for 1 s, {t} threads"))
    for t in threads:
        out.append(Bench(f"mid_large_mt_{t}t", ["mid_large_mt", str(t), "2000000", "256"],
                         what=f"mid_large_mt, {t} threads x 2M cycles"))
    for t in threads:
        out.append(Bench(f"big_mixed_{t}t", ["mid_large_mt", str(t), "100000", "64", "65536", "1048576"],
                         what=f"big_mixed (64 KiB-1 MiB blocks, 64 slots a thread), {t} threads x 100k cycles"))
    for t in threads:
        out.append(Bench(f"thread_scaling_{t}t", ["thread_scaling", str(t), "5000000"],
                         what=f"small churn, {t} threads x 5M operations"))
    for t in threads:
        if t >= 2:
            out.append(Bench(f"prodcons_{t}t", ["prodcons", str(t // 2), "2000000"],
                             what=f"{t // 2} producer->consumer pairs x 2M blocks (remote frees)"))
    return out


# (name, soname, Debian package)
PEERS = [
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0"),
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2"),
    ("tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
]

# callgrind mode: benchmark, argv for N iterations, argv for 2N iterations
CALLGRIND = [
    ("tiny_hot", ["tiny_hot", "2000"], ["tiny_hot", "4000"]),
    ("random_mixed", ["random_mixed", "200000", "2000", "42"], ["random_mixed", "400000", "2000", "42"]),
]


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, cwd=None):
    """Output of a command, or "" if it fails."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------- allocators

def multiarch():
    return sh(["gcc", "-print-multiarch"]) or sh(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"])


def find_shared_lib(soname):
    """Path of soname from the dynamic linker's cache, else the usual dirs."""
    ma = multiarch()
    hits = []
    for line in sh(["ldconfig", "-p"]).splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and m.group(1) == soname and os.path.exists(m.group(3)):
            hits.append(m.group(3))
    hits.sort(key=lambda p: (ma not in p) if ma else 0)  # prefer this architecture's dir
    if hits:
        return hits[0]
    for d in ([f"/usr/lib/{ma}", f"/lib/{ma}"] if ma else []) + ["/usr/lib64", "/usr/lib", "/usr/local/lib"]:
        p = os.path.join(d, soname)
        if os.path.exists(p):
            return p
    return None


def package_version(pkg):
    return sh(["dpkg-query", "-W", "-f=${Version}", pkg])


def discover_allocators(args):
    """Ordered {name: path or None (glibc)}; prints how to install missing peers."""
    hakmem = args.hakmem or os.environ.get("HAKMEM_LIB") or os.path.join(REPO, "build", "libhakmem.so")
    if not os.path.exists(hakmem):
        sys.exit(f"run.py: hakmem library not found: {hakmem}\n"
                 f"        build it with 'make' (or pass --hakmem PATH / set HAKMEM_LIB)")
    allocs = {"hakmem": os.path.abspath(hakmem), "glibc": None}
    versions = {"glibc": sh(["ldd", "--version"]).splitlines()[0:1]}
    versions["glibc"] = versions["glibc"][0].split()[-1] if versions["glibc"] else ""
    for name, soname, pkg in PEERS:
        path = find_shared_lib(soname)
        if path:
            allocs[name] = path
            versions[name] = package_version(pkg)
        else:
            log(f"note: {name} not found ({soname}); skipping it. Install it with:\n"
                f"        sudo apt-get install {pkg}")
    for spec in args.with_:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            sys.exit(f"run.py: --with wants NAME=PATH, got '{spec}'")
        if not os.path.exists(path):
            sys.exit(f"run.py: --with {name}: no such file: {path}")
        allocs[name] = os.path.abspath(path)
    if args.allocators:
        keep = [a for s in args.allocators for a in s.split(",") if a]
        unknown = [a for a in keep if a not in allocs]
        if unknown:
            sys.exit(f"run.py: unknown allocator(s) {', '.join(unknown)}; have: {', '.join(allocs)}")
        allocs = {a: allocs[a] for a in allocs if a in keep}
    return allocs, versions


def child_env(lib):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HAKMEM_") or k == "LD_PRELOAD":
            del env[k]  # HAKMEM_* options would change what is measured
    if lib:
        env["LD_PRELOAD"] = lib
    return env


# ---------------------------------------------------------------- running

def describe_exit(rc):
    if rc < 0:
        try:
            return f"killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def parse_result(stdout):
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            out = {}
            for kv in line.split()[1:]:
                k, _, v = kv.partition("=")
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
            return out
    return None


def run_one(bin_dir, argv, lib, timeout):
    prog = os.path.join(bin_dir, argv[0])
    t0 = time.monotonic()
    try:
        p = subprocess.run([prog] + argv[1:], env=child_env(lib), capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s"}, time.monotonic() - t0
    wall = time.monotonic() - t0
    res = parse_result(p.stdout)
    if p.returncode != 0 or res is None:
        err = p.stderr.strip().splitlines()[-3:]
        why = describe_exit(p.returncode) if p.returncode else "no RESULT line"
        return {"ok": False, "error": why + (": " + " | ".join(err) if err else "")}, wall
    res["ok"] = True
    return res, wall


def fmt_time(s):
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def run_suite(args, benches, allocs):
    total = len(benches) * args.repeats * len(allocs)
    runs, done, t_start = [], 0, time.monotonic()
    walls = {}  # bench -> wall times so far, for the estimate
    for b in benches:
        argv = b.quick if args.quick else b.full
        for rep in range(1, args.repeats + 1):
            for name, lib in allocs.items():
                done += 1
                # estimated time left: mean wall time per run of each benchmark
                # (of all runs so far for benchmarks not started yet)
                all_w = [w for ws in walls.values() for w in ws]
                mean_all = statistics.mean(all_w) if all_w else 1.0
                left = 0.0
                for bb in benches[benches.index(b):]:
                    n = len(allocs) * args.repeats if bb is not b else total_left_in(b, rep, name, allocs, args)
                    ws = walls.get(bb.name)
                    left += n * (statistics.mean(ws) if ws else mean_all)
                log(f"[{done:4d}/{total}] {b.name:<17} {name:<9} repeat {rep}/{args.repeats}"
                    f"   elapsed {fmt_time(time.monotonic() - t_start)}, ~{fmt_time(left)} left")
                res, wall = run_one(args.bin_dir, argv, lib, args.timeout)
                walls.setdefault(b.name, []).append(wall)
                res.update(benchmark=b.name, allocator=name, repeat=rep, wall=round(wall, 4))
                if not res["ok"]:
                    log(f"       FAILED: {b.name} under {name}: {res['error']}")
                runs.append(res)
    log(f"done in {fmt_time(time.monotonic() - t_start)}")
    return runs


def total_left_in(b, rep, name, allocs, args):
    """Runs of benchmark b still to do, this one included."""
    names = list(allocs)
    return (args.repeats - rep) * len(names) + (len(names) - names.index(name))


# ---------------------------------------------------------------- summary

def summarize(benches, allocs, runs):
    summary = {}
    for b in benches:
        summary[b.name] = {}
        for a in allocs:
            rs = [r for r in runs if r["benchmark"] == b.name and r["allocator"] == a]
            ok = [r for r in rs if r["ok"]]
            s = {"runs": len(rs), "ok_runs": len(ok),
                 "errors": sorted({r["error"] for r in rs if not r["ok"]})}
            s["status"] = "ok" if ok and len(ok) == len(rs) else "FAIL"
            keys = ["ops_per_sec", "peak_rss_kb", "seconds"] + [k for k, _, _ in b.extras]
            for k in keys:
                vals = [r[k] for r in ok if isinstance(r.get(k), float)]
                s[k] = statistics.median(vals) if vals else None
            summary[b.name][a] = s
    return summary


def num(v):
    """About three significant digits, no exponent."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def cell(s, key, div=1.0):
    if s["status"] != "ok":
        return "**FAIL**"
    v = s.get(key)
    return num(v / div) if v is not None else "-"


def markdown(benches, allocs, summary, meta):
    names = list(allocs)
    peers = [a for a in names if a != "hakmem"]
    lines = []
    hdr = "| benchmark | " + " | ".join(names) + " | " + " | ".join(f"hakmem/{p}" for p in peers) + " |"
    sep = "|---|" + "---:|" * (len(names) + len(peers))

    def rows(key, div, memory_only=True):
        for b in benches:
            if b.memory_only and not memory_only:
                continue
            s = summary[b.name]
            h = s["hakmem"] if "hakmem" in s else None
            vals = [cell(s[a], key, div) for a in names]
            rats = []
            for p in peers:
                ok = h and h["status"] == "ok" and s[p]["status"] == "ok"
                r = ratio(h.get(key), s[p].get(key)) if ok else None
                rats.append(f"{r:.2f}x" if r is not None else "-")
            lines.append(f"| {b.name} | " + " | ".join(vals) + " | " + " | ".join(rats) + " |")

    lines += [f"Throughput, million operations per second (median of {meta['repeats']}; higher is better; "
              "hakmem/peer > 1: hakmem is faster)", "", hdr, sep]
    rows("ops_per_sec", 1e6, memory_only=False)
    lines += ["", f"Peak RSS, MiB (median of {meta['repeats']}; lower is better; "
              "hakmem/peer < 1: hakmem uses less memory)", "", hdr, sep]
    rows("peak_rss_kb", 1024)
    extra = [(b, k, label, div) for b in benches for k, label, div in b.extras]
    if extra:
        lines += ["", "Memory metrics (median; lower is better)", "",
                  "| benchmark | metric | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
        for b, k, label, div in extra:
            s = summary[b.name]
            lines.append(f"| {b.name} | {label} | " + " | ".join(cell(s[a], k, div) for a in names) + " |")
    fails = [(b.name, a, e) for b in benches for a in names for e in summary[b.name][a]["errors"]]
    if fails:
        lines += ["", "Failures:", ""] + [f"- {b} under {a}: {e}" for b, a, e in fails]
    return "\n".join(lines) + "\n"


def write_csv(path, benches, allocs, summary):
    extra_keys = sorted({k for b in benches for k, _, _ in b.extras})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "allocator", "status", "runs", "ok_runs", "ops_per_sec",
                    "peak_rss_kb", "seconds"] + extra_keys + ["errors"])
        for b in benches:
            for a in allocs:
                s = summary[b.name][a]
                w.writerow([b.name, a, s["status"], s["runs"], s["ok_runs"], s["ops_per_sec"],
                            s["peak_rss_kb"], s["seconds"]] + [s.get(k) for k in extra_keys]
                           + ["; ".join(s["errors"])])


def write_runs_csv(path, runs):
    keys = ["benchmark", "allocator", "repeat", "ok", "ops", "seconds", "ops_per_sec", "peak_rss_kb", "wall"]
    extra = sorted({k for r in runs for k in r} - set(keys) - {"name", "error"})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys + extra + ["error"])
        for r in runs:
            w.writerow([r.get(k) for k in keys + extra] + [r.get("error", "")])


# ---------------------------------------------------------------- chart

def chart_data(data):
    """(benchmarks, peers, thr[peer][i], rss[peer][i]) ratios hakmem/peer, None if missing."""
    benches = [b["name"] for b in data["benchmarks"]]
    timed = {b["name"]: not b.get("memory_only") for b in data["benchmarks"]}
    peers = [a for a in data["allocators"] if a != "hakmem"]
    thr, rss = {}, {}
    for p in peers:
        thr[p], rss[p] = [], []
        for b in benches:
            h, s = data["summary"][b]["hakmem"], data["summary"][b][p]
            ok = h["status"] == "ok" and s["status"] == "ok"
            thr[p].append(ratio(h["ops_per_sec"], s["ops_per_sec"]) if ok and timed[b] else None)
            rss[p].append(ratio(h["peak_rss_kb"], s["peak_rss_kb"]) if ok else None)
    return benches, peers, thr, rss


def chart_matplotlib(data, stem):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    benches, peers, thr, rss = chart_data(data)
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.75 * len(benches) + 3), 9), sharex=True)
    width = 0.8 / max(1, len(peers))
    for ax, series, title in (
            (axes[0], thr, "Throughput ratio hakmem / peer (above 1: hakmem faster)"),
            (axes[1], rss, "Peak RSS ratio hakmem / peer (below 1: hakmem uses less memory)")):
        for i, p in enumerate(peers):
            xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(benches))]
            ys = [v if v is not None else float("nan") for v in series[p]]
            ax.bar(xs, ys, width, label=f"vs {p}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_title(title)
        ax.grid(axis="y", linestyle=":", linewidth=0.5)
        ax.legend(fontsize="small", ncol=len(peers))
    axes[1].set_xticks(range(len(benches)))
    axes[1].set_xticklabels(benches, rotation=40, ha="right")
    m = data["meta"]
    fig.suptitle(f"hakmem {m.get('commit', '')} vs peers, {m['mode']} run, median of {m['repeats']}"
                 f" ({m['nproc']} CPUs, {m['cpu']})", fontsize="medium")
    fig.tight_layout()
    out = [stem + ".svg", stem + ".png"]
    fig.savefig(out[0])
    fig.savefig(out[1], dpi=90)
    plt.close(fig)
    return out


def chart_gnuplot(data, stem):
    benches, peers, thr, rss = chart_data(data)
    dat = stem + ".dat"
    with open(dat, "w") as f:
        for series in (thr, rss):  # data block 0: throughput, 1: RSS
            for j, b in enumerate(benches):
                f.write(b + " " + " ".join(f"{series[p][j]:.4f}" if series[p][j] else "NaN" for p in peers) + "\n")
            f.write("\n\n")

    def plot(idx):
        return "plot " + ", ".join(
            f"{repr(dat) if i == 0 else repr('')} index {idx} using {i + 2}:xtic(1) title 'vs {p}'"
            for i, p in enumerate(peers))

    script = f"""set terminal svg size 1100,800 dynamic
set output '{stem}.svg'
set multiplot layout 2,1
set style data histograms
set style histogram clustered
set style fill solid
set logscale y 2
set xtics rotate by -40
set title 'Throughput ratio hakmem / peer (above 1: hakmem faster)'
{plot(0)}
set title 'Peak RSS ratio hakmem / peer (below 1: hakmem uses less memory)'
{plot(1)}
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    os.remove(dat)
    return [stem + ".svg"]


def make_chart(json_path, stem):
    """Draws the chart with matplotlib, else Debian's python3 (which has
    python3-matplotlib) when this interpreter lacks it, else gnuplot."""
    with open(json_path) as f:
        data = json.load(f)
    if "hakmem" not in data["allocators"] or len(data["allocators"]) < 2:
        log("note: no chart: it compares hakmem with at least one other allocator")
        return []
    try:
        return chart_matplotlib(data, stem)
    except ImportError:
        pass
    system_py = "/usr/bin/python3"
    if os.path.exists(system_py) and os.path.realpath(sys.executable) != os.path.realpath(system_py):
        p = subprocess.run([system_py, os.path.abspath(__file__), "--chart-from", json_path, "--chart-stem", stem],
                           capture_output=True, text=True)
        if p.returncode == 0:
            return p.stdout.split()
    if shutil.which("gnuplot"):
        try:
            return chart_gnuplot(data, stem)
        except (OSError, subprocess.SubprocessError) as e:
            log(f"note: gnuplot failed: {e}")
    log("note: no chart: install python3-matplotlib (sudo apt-get install python3-matplotlib) or gnuplot")
    return []


# ---------------------------------------------------------------- callgrind

def read_callgrind(path):
    """(total Ir, [(self Ir, function, object)]) from a callgrind output file.
    Format: "ob=" / "fn=" lines name the current object and function (names
    are compressed as "(id) name" the first time, "(id)" later); cost lines
    "position Ir" add to the current function, except the line after a
    "calls=" line, which is the inclusive cost of a call."""
    tables = {"ob": {}, "fn": {}, "fl": {}}
    kinds = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl",
             "cfi": "fl", "cfl": "fl"}
    cost, ob, fn, total, skip = {}, "???", "???", 0, False
    with open(path) as f:
        for line in f:
            key, eq, val = line.rstrip("\n").partition("=")
            if eq and key in kinds:
                m = re.match(r"\((\d+)\)(?: (.*))?$", val)
                if m:
                    table = tables[kinds[key]]
                    if m.group(2) is not None:
                        table[m.group(1)] = m.group(2)
                    val = table.get(m.group(1), "???")
                if key == "ob":
                    ob = val
                elif key == "fn":
                    fn = val
            elif key == "calls":
                skip = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    ir = int(parts[1])
                    cost[(fn, ob)] = cost.get((fn, ob), 0) + ir
                    total += ir
    return total, [(ir, fn, ob) for (fn, ob), ir in cost.items()]


def callgrind_run(args, argv, lib, out_file):
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out_file}",
           os.path.join(args.bin_dir, argv[0])] + argv[1:]
    # LD_PRELOAD is set for valgrind itself; valgrind hands it to the client
    # program (callgrind does not replace malloc, unlike memcheck).
    p = subprocess.run(cmd, env=child_env(lib), capture_output=True, text=True, timeout=args.timeout)
    res = parse_result(p.stdout)
    if p.returncode != 0 or res is None:
        raise RuntimeError(f"{' '.join(argv)}: {describe_exit(p.returncode)}: {p.stderr.strip()[-400:]}")
    total, funcs = read_callgrind(out_file)
    pairs = (res.get("mallocs", 0) + res.get("frees", 0)) / 2
    return total, pairs, funcs


MALLOC_API = {"malloc", "free", "calloc", "realloc", "cfree", "operator new(unsigned long)",
              "operator delete(void*)", "operator delete(void*, unsigned long)"}


def in_allocator(fn, obj, lib):
    """Is this function's cost the allocator's? Its object is the allocator's
    library (libc for glibc), or valgrind could not name the object (tcmalloc
    keeps malloc/free in a section of its own) and it is a malloc API name."""
    if obj == "???":
        return fn in MALLOC_API
    if lib is None:
        return os.path.basename(obj).startswith(("libc.so", "libc-"))
    return os.path.realpath(obj) == os.path.realpath(lib)


def run_callgrind(args, allocs):
    if not shutil.which("valgrind"):
        sys.exit("run.py: valgrind not found; install it with: sudo apt-get install valgrind")
    cases = [c for c in CALLGRIND if not args.only or c[0] in args.only_names]
    if not cases:
        sys.exit("run.py: --callgrind measures tiny_hot and random_mixed; --only excludes both")
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, "callgrind-tmp")
    os.makedirs(tmp, exist_ok=True)
    results = []
    total = len(cases) * len(allocs) * 2
    k = 0
    for bench, argv1, argv2 in cases:
        for name, lib in allocs.items():
            meas = []
            for tag, argv in (("N", argv1), ("2N", argv2)):
                k += 1
                log(f"[{k:3d}/{total}] callgrind {bench:<13} {name:<9} {' '.join(argv)}")
                meas.append(callgrind_run(args, argv, lib, os.path.join(tmp, f"{bench}-{name}-{tag}.out")))
            (t1, p1, f1), (t2, p2, f2) = meas
            dp = p2 - p1
            a1 = sum(ir for ir, fn, obj in f1 if in_allocator(fn, obj, lib))
            a2 = sum(ir for ir, fn, obj in f2 if in_allocator(fn, obj, lib))
            # hottest allocator functions in the loop: largest cost growth from N to 2N
            grow = {(fn, obj): ir for ir, fn, obj in f2 if in_allocator(fn, obj, lib)}
            for ir, fn, obj in f1:
                if (fn, obj) in grow:
                    grow[(fn, obj)] -= ir
            top = sorted(((ir, fn, obj) for (fn, obj), ir in grow.items() if ir > 0), reverse=True)[:4]
            r = {"benchmark": bench, "allocator": name, "lib": lib, "pairs": dp,
                 "ir_per_pair_total": (t2 - t1) / dp, "ir_per_pair_in_allocator": (a2 - a1) / dp,
                 "top_functions": [f"{fn} ({os.path.basename(obj)})" for ir, fn, obj in top]}
            if a2 == 0:
                log(f"WARNING: no instructions counted in {lib or 'libc'} for {name}: the preload was not measured")
            results.append(r)
    shutil.rmtree(tmp, ignore_errors=True)
    lines = ["Instructions per malloc+free pair (valgrind --tool=callgrind; runs with N and 2N "
             "iterations, difference / pairs, so start-up cancels).", "",
             "| benchmark | allocator | Ir/pair (whole loop) | Ir/pair in allocator | hottest allocator functions |",
             "|---|---|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['benchmark']} | {r['allocator']} | {r['ir_per_pair_total']:.1f} | "
                     f"{r['ir_per_pair_in_allocator']:.1f} | {', '.join(r['top_functions'])} |")
    md = "\n".join(lines) + "\n"
    print(md)
    with open(os.path.join(args.out, "callgrind.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "callgrind.json"), "w") as f:
        json.dump({"meta": machine_meta(args, "callgrind"), "results": results}, f, indent=1)
    log(f"wrote {os.path.join(args.out, 'callgrind.md')} and callgrind.json")


# ---------------------------------------------------------------- main

def machine_meta(args, mode):
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO)
    if commit and sh(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO):
        commit += "+dirty"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "nproc": os.cpu_count(), "cpu": cpu, "kernel": os.uname().release,
            "commit": commit, "mode": mode, "repeats": args.repeats,
            "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "command": " ".join(shlex.quote(a) for a in sys.argv)}


def main():
    ap = argparse.ArgumentParser(description="Compare hakmem with glibc, mimalloc, jemalloc, tcmalloc.",
                                 epilog="benchmarks: " + ", ".join(b.name for b in BENCHMARKS))
    ap.add_argument("--quick", action="store_true", help="a subset with smaller sizes, 2 repeats (about a minute)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only these benchmarks (repeatable or comma list; 'fixed' = all fixed_*)")
    ap.add_argument("--with", dest="with_", action="append", default=[], metavar="NAME=PATH",
                    help="also measure the allocator in PATH (a preloadable .so)")
    ap.add_argument("--allocators", action="append", default=[], metavar="A,B",
                    help="measure only these allocators (names as in the table)")
    ap.add_argument("--repeats", type=int, help="runs per benchmark and allocator (default 5, quick 2)")
    ap.add_argument("--out", help="output directory (default bench/results in the source tree, "
                    "else ./hakmem-bench-results)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per malloc+free pair with callgrind")
    ap.add_argument("--scaling", action="store_true",
                    help="thread scaling: larson and mid_large_mt at each of --threads (for many-core machines)")
    ap.add_argument("--threads", default="1,2,4,8,16", help="thread counts for --scaling (default 1,2,4,8,16)")
    ap.add_argument("--hakmem", help="libhakmem.so to test (default build/libhakmem.so or $HAKMEM_LIB)")
    ap.add_argument("--bin-dir", help="directory of the benchmark programs (default build/bench)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds before a run is killed (default 300)")
    ap.add_argument("--chart-from", help=argparse.SUPPRESS)
    ap.add_argument("--chart-stem", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.chart_from:  # internal: draw a chart from a JSON file (see make_chart)
        print(" ".join(chart_matplotlib(json.load(open(args.chart_from)), args.chart_stem)))
        return 0

    args.bin_dir = args.bin_dir or os.path.join(REPO, "build", "bench")
    if not os.path.isdir(args.bin_dir):
        sys.exit(f"run.py: benchmark programs not found in {args.bin_dir}; build them with 'make'")
    if args.out is None:
        in_source_tree = os.path.exists(os.path.join(REPO, "CMakeLists.txt")) and os.access(HERE, os.W_OK)
        args.out = os.path.join(HERE, "results") if in_source_tree else os.path.abspath("hakmem-bench-results")
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.repeats < 1:
        sys.exit("run.py: --repeats must be at least 1")

    args.only_names = [n for s in args.only for n in s.split(",") if n]
    benches = [b for b in BENCHMARKS if (b.quick if args.quick else b.full)]
    if args.scaling:
        benches = scaling_benchmarks([int(t) for t in args.threads.split(",") if t])
        if args.only_names:  # larson, mid_large_mt, big_mixed, thread_scaling, prodcons
            benches = [b for b in benches if b.name.rsplit("_", 1)[0] in args.only_names]
            if not benches:
                sys.exit("run.py: --scaling --only takes larson, mid_large_mt, big_mixed, thread_scaling, prodcons")
    elif args.only_names:
        known = {b.name for b in BENCHMARKS} | {"fixed", "thread_scaling"}
        bad = [n for n in args.only_names if n not in known]
        if bad:
            sys.exit(f"run.py: unknown benchmark(s) {', '.join(bad)}; have: {', '.join(b.name for b in BENCHMARKS)}")
        if args.quick:  # --only picks from the whole suite, at quick sizes where there are some
            benches = [b for b in BENCHMARKS]
        benches = [b for b in benches if b.name in args.only_names or b.name.rsplit("_", 1)[0] in args.only_names]

    allocs, versions = discover_allocators(args)
    if args.callgrind:
        return run_callgrind(args, allocs) or 0
    if args.quick:
        for b in benches:
            b.quick = b.quick or b.full

    mode = "scaling" if args.scaling else "quick" if args.quick else "full"
    meta = machine_meta(args, mode)
    meta["versions"] = versions
    log(f"hakmem benchmarks ({mode}): {len(benches)} benchmarks x {len(allocs)} allocators "
        f"({', '.join(allocs)}) x {args.repeats} repeats")
    if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        log(f"note: the machine is busy (load average {os.getloadavg()[0]:.2f}); timings will be noisy")
    runs = run_suite(args, benches, allocs)
    meta["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    summary = summarize(benches, allocs, runs)
    md = markdown(benches, allocs, summary, meta)

    os.makedirs(args.out, exist_ok=True)
    # a run restricted with --only/--allocators does not overwrite the whole suite's results
    stem = os.path.join(args.out, f"bench-{mode}" + ("-partial" if args.only_names or args.allocators else ""))
    data = {"meta": meta, "allocators": allocs,
            "benchmarks": [{"name": b.name, "argv": b.quick if args.quick else b.full, "what": b.what,
                            "memory_only": b.memory_only} for b in benches],
            "summary": summary, "runs": runs}
    with open(stem + ".json", "w") as f:
        json.dump(data, f, indent=1)
    write_csv(stem + ".csv", benches, allocs, summary)
    write_runs_csv(stem + "-runs.csv", runs)
    header = (f"{meta['date']}, commit {meta['commit']}, {meta['nproc']} CPUs ({meta['cpu']}), "
              f"kernel {meta['kernel']}, load average {meta['loadavg_at_start']} (start) / "
              f"{meta['loadavg_at_end']} (end)\nallocators: "
              + ", ".join(f"{a} {versions.get(a, '')}".strip() + (f" ({p})" if p else "") for a, p in allocs.items())
              + f"\ncommand: {meta['command']}\n\n")
    with open(stem + ".md", "w") as f:
        f.write(header + md)
    charts = make_chart(stem + ".json", stem + "-chart")
    print()
    print(header + md)
    log("wrote " + ", ".join([stem + ext for ext in (".md", ".json", ".csv", "-runs.csv")] + charts))
    return 1 if any(s["status"] != "ok" for b in summary.values() for s in b.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
