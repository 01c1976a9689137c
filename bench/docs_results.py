#!/usr/bin/env python3
"""Writes the generated parts of docs/BENCHMARKS.md and docs/SAFETY.md from a run's results.

    python3 bench/docs_results.py [--suite bench/results/bench-full.json]
                                  [--sweep bench/results/sweep-full.json]
                                  [--hardened DIR/bench-full.json]
                                  [--profiler DIR/bench-full.json]
                                  [--scaling DIR/bench-scaling.json]

Each part lies between two marker comments in docs/BENCHMARKS.md and is
replaced whole; the text around them is left alone. The suite's part
("## Results" down to the targets) comes from `make bench`, the sweep's
("### The workload sweep" under Results) from `make bench-sweep`; the charts
are copied to docs/. A part whose results file is missing is left as it is.
The hardened mode's cost table in docs/SAFETY.md comes from a run of the
default build against a hardened one (its command is in that table):

    python3 bench/run.py --with hakmem-secure=BUILD/libhakmem.so \
        --allocators hakmem,hakmem-secure --repeats 3 --out DIR

The thread-scaling section comes from a run on a many-core machine
(`python3 bench/run.py --scaling`, its command in the section), and the heap
profiler's cost in docs/PROFILE.md from a run of the library with
and without it:

    python3 bench/run.py --with hakmem-prof=build/libhakmem.so,HAKMEM_PROFILE=1,HAKMEM_PROFILE_FILE=DIR/h.%p \
        --allocators hakmem,hakmem-prof --repeats 5 --out DIR

to which the peers' samplers may be added (PROFILER_PEERS: a column each):

        --with jemalloc-prof=LIBDIR/libjemalloc.so.2,MALLOC_CONF=prof:true \
        --with tcmalloc-full=LIBDIR/libtcmalloc.so.4 \
        --with tcmalloc-sample=LIBDIR/libtcmalloc.so.4,TCMALLOC_SAMPLE_PARAMETER=524288 \
        --allocators hakmem,hakmem-prof,jemalloc,jemalloc-prof,tcmalloc-full,tcmalloc-sample
"""
import argparse
import json
import math
import os
import re
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "BENCHMARKS.md")
SAFETY = os.path.join(REPO, "docs", "SAFETY.md")
PEERS = ("glibc", "mimalloc", "jemalloc", "tcmalloc")
LARGE = ("large_varied", "large_varied_16", "large_varied_2t")


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def versions_line(meta):
    v = meta.get("versions", {})
    return ", ".join(f"{a} {v.get(a, '')}".strip() for a in PEERS)


def run_label():
    """'DATE UTC, commit C[+dirty], N CPUs': what a table measured now names."""
    import subprocess, time
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet"]).returncode != 0
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}{'+dirty' if dirty else ''}, "
            f"{os.cpu_count()} CPUs")


def splice(text, name, body, by="bench/docs_results.py"):
    begin = f"<!-- generated: {name} ({by}) -->"
    end = f"<!-- end generated: {name} -->"
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pat.search(text):
        sys.exit(f"docs_results.py: markers for '{name}' not found")
    return pat.sub(lambda _: begin + "\n" + body.rstrip() + "\n" + end, text)


def ok(s, a, key):
    v = s.get(a, {})
    return v.get(key) if v.get("status") == "ok" else None


def suite_part(path):
    data = json.load(open(path))
    meta, summ = data["meta"], data["summary"]
    benches = data["benchmarks"]
    md = open(path[:-5] + ".md").read()
    tables = md.split("\n\n", 1)[1].strip()  # after the header lines
    timed = [b["name"] for b in benches if not b["memory_only"]]
    allb = [b["name"] for b in benches]

    def ratios(names, key, peer, invert):
        out = []
        for n in names:
            h, p = ok(summ[n], "hakmem", key), ok(summ[n], peer, key)
            if h and p:
                out.append(p / h if invert else h / p)
        return out

    rows = []
    for peer in PEERS:
        t = geomean(ratios(timed, "ops_per_sec", peer, False))
        t2 = geomean(ratios([n for n in timed if n not in LARGE], "ops_per_sec", peer, False))
        m = geomean(ratios(allb, "peak_rss_kb", peer, False))
        m2 = geomean(ratios([n for n in allb if n not in LARGE], "peak_rss_kb", peer, False))
        rows.append(f"| {peer} | {t:.2f}x ({t2:.2f}x) | {m:.2f}x ({m2:.2f}x) |")
    best, best_nl, slow, fat = [], [], [], []
    for n in timed:
        h = ok(summ[n], "hakmem", "ops_per_sec")
        peers = {a: ok(summ[n], a, "ops_per_sec") for a in PEERS[1:]}
        peers = {a: v for a, v in peers.items() if v}
        if not h or not peers:
            continue
        bp = max(peers, key=peers.get)
        r = h / peers[bp]
        best.append(r)
        if n not in LARGE:
            best_nl.append(r)
        if r < 0.95:
            slow.append(f"{n} {r:.2f}x ({bp})")
    for n in allb:
        h = ok(summ[n], "hakmem", "peak_rss_kb")
        peers = {a: ok(summ[n], a, "peak_rss_kb") for a in PEERS}
        peers = {a: v for a, v in peers.items() if v}
        if not h or not peers:
            continue
        lp = min(peers, key=peers.get)
        if h - peers[lp] > 1024:
            fat.append(f"{n} {h / 1024:.1f} MiB against {lp}'s {peers[lp] / 1024:.1f} ({h / peers[lp]:.2f}x)")
    gm_best, gm_best_nl = geomean(best), geomean(best_nl)
    mi_t = geomean(ratios(timed, "ops_per_sec", "mimalloc", False))
    mi_m = geomean(ratios(allb, "peak_rss_kb", "mimalloc", False))
    out = f"""Generated by `make bench` (`python3 bench/run.py`: {meta['repeats']} repeats, interleaved,
medians): {meta['date']}, commit `{meta['commit']}`, {meta['nproc']} CPUs
({meta['cpu']}), kernel {meta['kernel']}: {versions_line(meta)}. Load average
{meta['loadavg_at_start']} at the start, {meta['loadavg_at_end']} at the end. The tables below are
`bench/results/bench-full.md` of that run. The machine is shared and noisy:
single ratios carry ±10-20 % of noise, and the geometric means move by
several per cent between runs; single-threaded fast-path work is measured by
the instruction counts below, which repeat exactly.

![hakmem throughput and peak RSS relative to glibc, mimalloc, jemalloc and tcmalloc](bench-chart.svg)

{tables}

Summary (geometric means computed from `bench/results/bench-full.json`:
throughput over the {len(timed)} timed benchmarks, peak RSS over all
{len(allb)}; in brackets without the three large_varied rows):

| hakmem against | throughput | peak RSS |
|---|---:|---:|
{chr(10).join(rows)}
| the best peer of each benchmark (mimalloc, jemalloc, tcmalloc) | {gm_best:.3f}x ({gm_best_nl:.3f}x) | |

Below 0.95x of the best peer: {', '.join(slow) if slow else 'none'}.
Peak RSS above the lowest peer's by more than 1 MiB: {'; '.join(fat) if fat else 'none'}.

### Against the issues' targets

From the Results tables above (the run at `{meta['commit']}`; issue 4, speed;
issue 5, memory):
- Throughput geometric mean {mi_t:.2f}x mimalloc (target 1.10x) and
  {gm_best:.3f}x the best peer of each benchmark; peak RSS geometric mean
  {mi_m:.2f}x mimalloc (target 0.9x).
- Rows below 0.95x of the best peer (target: none): {', '.join(slow) if slow else 'none'}.
- mem_16b's and mem_random's overhead, fragmentation's peak RSS / peak live
  and RSS after freeing everything, and one_block's peak RSS: the memory
  metrics table above.
- Not judged from this run: the instruction count per pair and the scaling
  on 16 cores, which have runs of their own (the two sections below).
"""
    chart = path[:-5] + "-chart.svg"
    if os.path.exists(chart):
        shutil.copy(chart, os.path.join(REPO, "docs", "bench-chart.svg"))
    return out


def sweep_part(path):
    data = json.load(open(path))
    meta, rows = data["meta"], data["rows"]
    md = open(path[:-5] + ".md").read()
    worst = md.split("### The 20 worst by time ratio", 1)[1].split("### Heat map", 1)[0]
    worst = "#### The 20 worst by time ratio" + worst.replace("### The 20 worst by memory ratio",
                                                               "#### The 20 worst by memory ratio")
    t = [r["time_ratio"] for r in rows if r["time_ratio"]]
    m = [r["memory_ratio"] for r in rows if r["memory_ratio"]]

    def vs(peer, key, invert):
        out = []
        for r in rows:
            h, p = r.get(f"hakmem_{key}"), r.get(f"{peer}_{key}")
            if h and p and r.get("hakmem_status") == "ok" and r.get(f"{peer}_status") == "ok":
                out.append(p / h if invert else h / p)
        return geomean(out)

    slow = sum(1 for x in t if x > 1.25)
    fat = 0
    for r in rows:
        if not r["memory_ratio"]:
            continue
        best = min(r[f"{a}_peak_rss_kb"] for a in PEERS if r.get(f"{a}_status") == "ok" and r.get(f"{a}_peak_rss_kb"))
        if r["memory_ratio"] > 1.25 and r["hakmem_peak_rss_kb"] - best > 1024:
            fat += 1
    out = f"""### The workload sweep

Generated by `make bench-sweep` (`python3 bench/run.py --sweep`: {meta['repeats']} repeats,
interleaved, medians): {meta['date']}, commit `{meta['commit']}`, {meta['elapsed']};
load average {meta['loadavg_at_start']} at the start, {meta['loadavg_at_end']} at the end. The
whole report, with every configuration and the heat maps as tables, is
`bench/results/sweep-full.md` of that run.

Over the {len(rows)} configurations, against the best peer of each: time ratio
geometric mean {geomean(t):.2f}x, {slow} configurations above 1.25x (below 0.80x of the best
peer's throughput); memory ratio geometric mean {geomean(m):.2f}x, {fat} configurations
above 1.25x and more than 1 MiB over the smallest peer's peak. Against
mimalloc alone: {vs('mimalloc', 'ops_per_sec', False):.2f}x its throughput, {vs('mimalloc', 'peak_rss_kb', False):.2f}x its peak RSS.

![sweep heat map: time ratio to the best peer](sweep-heatmap-time.svg)

![sweep heat map: memory ratio to the best peer](sweep-heatmap-memory.svg)

{worst.strip()}
"""
    for kind in ("time", "memory"):
        svg = path[:-5] + f"-heatmap-{kind}.svg"
        if os.path.exists(svg):
            shutil.copy(svg, os.path.join(REPO, "docs", f"sweep-heatmap-{kind}.svg"))
    return out


def cost_part(path, other, label, setup, subject, peers=()):
    """A variant's cost (`other` against hakmem in one run): each benchmark's
    throughput in both, the slowdown, peak RSS, and geometric means; and for
    each (base, variant, label) of `peers` present in the run, the variant's
    slowdown against its base in a column of its own."""
    data = json.load(open(path))
    meta, summ = data["meta"], data["summary"]
    names = list(data["allocators"]) if isinstance(data["allocators"], (list, dict)) else []
    peers = [p for p in peers if p[0] in names and p[1] in names]
    rows, slow, rss = [], [], []
    peer_slow = {p: [] for p in peers}
    for b in data["benchmarks"]:
        s = summ.get(b["name"], {})
        d, h = ok(s, "hakmem", "ops_per_sec"), ok(s, other, "ops_per_sec")
        dr, hr = ok(s, "hakmem", "peak_rss_kb"), ok(s, other, "peak_rss_kb")
        mem = f"{hr / dr:.2f}x" if dr and hr else ""
        if dr and hr:
            rss.append(hr / dr)
        if b["memory_only"] or not d or not h:
            continue
        slow.append((d / h, b["name"]))
        cells = []
        for p in peers:
            x, y = ok(s, p[0], "ops_per_sec"), ok(s, p[1], "ops_per_sec")
            cells.append(f"{x / y:.2f}x" if x and y else "-")
            if x and y:
                peer_slow[p].append(x / y)
        rows.append(f"| {b['name']} | {d / 1e6:.3g} | {h / 1e6:.3g} | {d / h:.2f}x | "
                    + "".join(f"{c} | " for c in cells) + f"{mem} |")
    worst = max(slow)
    peer_line = "; ".join(f"{p[2]}, {geomean(peer_slow[p]):.3f}x ({len(peer_slow[p])} benchmarks)"
                          for p in peers if peer_slow[p])
    return "\n".join([
        f"`{meta['command']}`, {setup}; {meta['date']}, commit {meta['commit']}, "
        f"{meta['nproc']} CPUs ({meta['cpu']}), medians of {meta['repeats']}.",
        "",
        f"| benchmark | hakmem (Mops/s) | {label} (Mops/s) | slowdown | "
        + "".join(f"{p[2]} slowdown | " for p in peers) + f"{label} peak RSS |",
        "|---|---:|---:|---:|" + "---:|" * len(peers) + "---:|",
        *rows,
        "",
        f"Geometric mean over the {len(slow)} timed benchmarks: {subject} "
        f"**{geomean([x for x, _ in slow]):.3f}x** as slow; the most: {worst[1]}, {worst[0]:.2f}x. "
        f"Peak RSS: {geomean(rss):.3f}x the default's (geometric mean over {len(rss)} benchmarks)."
        + (f" The peers' samplers at the same rate, each against its own allocator: {peer_line}." if peer_line else ""),
    ])


def scaling_part(path):
    data = json.load(open(path))
    meta, summ = data["meta"], data["summary"]
    allocs = list(data["allocators"]) if isinstance(data["allocators"], list) else list(data["allocators"].keys())
    md = open(path[:-5] + ".md").read()
    tables = md.split("\n\n", 1)[1].strip()  # after the header lines
    families = {}
    for b in data["benchmarks"]:
        fam, t = b["name"].rsplit("_", 1)
        families.setdefault(fam, []).append((int(t.rstrip("t")), b["name"]))
    grow, vs_best = [], []
    for fam, runs in families.items():
        runs.sort()
        lo, hi = runs[0], runs[-1]
        cells = []
        for a in allocs:
            x, y = ok(summ[lo[1]], a, "ops_per_sec"), ok(summ[hi[1]], a, "ops_per_sec")
            cells.append(f"{y / x:.1f}x" if x and y else "-")
        grow.append(f"| {fam}, {lo[0]} -> {hi[0]} threads | " + " | ".join(cells) + " |")
        per_t = {}
        for t, n in runs:
            h = ok(summ[n], "hakmem", "ops_per_sec")
            peers = {a: ok(summ[n], a, "ops_per_sec") for a in allocs if a not in ("hakmem", "glibc")}
            peers = {a: v for a, v in peers.items() if v}
            if h and peers:
                bp = max(peers, key=peers.get)
                per_t[t] = f"{h / peers[bp]:.2f}x ({bp})"
        vs_best.append((fam, per_t))
    counts = sorted({t for runs in families.values() for t, _ in runs})
    vs_best = [f"| {fam} | " + " | ".join(per_t.get(t, "-") for t in counts) + " |" for fam, per_t in vs_best]
    out = f"""Generated from the bench-scaling.json of a run of
`{meta['command']}`: {meta['date']}, commit `{meta['commit']}`, {meta['nproc']} CPUs ({meta['cpu']}),
kernel {meta['kernel']}, glibc {meta.get('versions', {}).get('glibc', '')}; medians of {meta['repeats']}; load average
{meta['loadavg_at_start']} at the start, {meta['loadavg_at_end']} at the end.

![hakmem scaling relative to the peers](bench-scaling-chart.svg)

{tables}

hakmem's throughput over the best peer's (mimalloc, jemalloc, tcmalloc) at
each thread count:

| benchmark | {' | '.join(f'{t} thread' + ('s' if t > 1 else '') for t in counts)} |
|---|{'---:|' * len(counts)}
{chr(10).join(vs_best)}

How each allocator's throughput grows with the threads:

| scaling | {' | '.join(allocs)} |
|---|{'---:|' * len(allocs)}
{chr(10).join(grow)}
"""
    chart = path[:-5] + "-chart.svg"
    if os.path.exists(chart):
        shutil.copy(chart, os.path.join(REPO, "docs", "bench-scaling-chart.svg"))
    return out


def hardened_part(path):
    return cost_part(path, "hakmem-secure", "hardened",
                     "where the second library is the same commit built with `-DHAKMEM_SECURE_DEFAULT=ON`",
                     "hardened mode is")


# The peers' samplers, run at the same mean rate as hakmem's default (a
# sample every 512 KiB allocated): jemalloc's `prof:true` (its
# lg_prof_sample defaults to 19), and gperftools' tcmalloc (the full
# library; the suite's is tcmalloc_minimal, which has no sampler) with
# TCMALLOC_SAMPLE_PARAMETER=524288 against the same library without it.
PROFILER_PEERS = (("jemalloc", "jemalloc-prof", "jemalloc `prof:true`"),
                  ("tcmalloc-full", "tcmalloc-sample", "tcmalloc sampling"))


def profiler_part(path):
    return cost_part(path, "hakmem-prof", "profiling",
                     "the second allocator the same library run with `HAKMEM_PROFILE=1`",
                     "with the heap profiler on, hakmem is", PROFILER_PEERS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=os.path.join(REPO, "bench", "results", "bench-full.json"))
    ap.add_argument("--sweep", default=os.path.join(REPO, "bench", "results", "sweep-full.json"))
    ap.add_argument("--hardened", help="a run of hakmem against hakmem-secure (see above)")
    ap.add_argument("--profiler", help="a run of hakmem against hakmem-prof (see above)")
    ap.add_argument("--scaling", help="a run of bench/run.py --scaling (see above)")
    args = ap.parse_args()
    if args.scaling:
        text = splice(open(DOC).read(), "scaling results", scaling_part(args.scaling))
        open(DOC, "w").write(text)
        print("docs_results.py: wrote", DOC, "from", args.scaling)
        return
    if args.profiler:
        table = profiler_part(args.profiler)
        doc = os.path.join(REPO, "docs", "PROFILE.md")
        text = splice(open(doc).read(), "profiler cost", table)
        open(doc, "w").write(text)
        # BENCHMARKS.md: the run and its geometric means
        lines = table.splitlines()
        text = splice(open(DOC).read(), "profiler cost summary", lines[0] + "\n\n" + lines[-1])
        open(DOC, "w").write(text)
        print("docs_results.py: wrote", doc, "and", DOC, "from", args.profiler)
        return
    if args.hardened:
        safety = splice(open(SAFETY).read(), "hardened cost", hardened_part(args.hardened))
        open(SAFETY, "w").write(safety)
        print("docs_results.py: wrote", SAFETY, "from", args.hardened)
        return
    text = open(DOC).read()
    done = []
    if os.path.exists(args.suite):
        text = splice(text, "suite results", suite_part(args.suite))
        done.append(args.suite)
    if os.path.exists(args.sweep):
        text = splice(text, "sweep results", sweep_part(args.sweep))
        done.append(args.sweep)
    open(DOC, "w").write(text)
    print("docs_results.py: wrote", DOC, "from", ", ".join(done) if done else "nothing")


if __name__ == "__main__":
    main()
