"""The results: medians of the repeats, hakmem/peer ratios, the markdown
tables, the JSON and CSV files, the chart, and the --callgrind table.
Used by run.py.
"""
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys

import catalog
from runner import log

HERE = os.path.dirname(os.path.abspath(__file__))


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


def draw_with_system_python(json_path, stem):
    """Draws the images of json_path with Debian's python3 (which has
    python3-matplotlib) when this interpreter is another one: the files
    written, or None."""
    system_py = "/usr/bin/python3"
    if os.path.exists(system_py) and os.path.realpath(sys.executable) != os.path.realpath(system_py):
        p = subprocess.run([system_py, os.path.join(HERE, "run.py"), "--chart-from", json_path, "--chart-stem", stem],
                           capture_output=True, text=True)
        if p.returncode == 0:
            return p.stdout.split()
    return None


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
    files = draw_with_system_python(json_path, stem)
    if files is not None:
        return files
    if shutil.which("gnuplot"):
        try:
            return chart_gnuplot(data, stem)
        except (OSError, subprocess.SubprocessError) as e:
            log(f"note: gnuplot failed: {e}")
    log("note: no chart: install python3-matplotlib (sudo apt-get install python3-matplotlib) or gnuplot")
    return []


# ---------------------------------------------------------------- output files

def write_suite(out, mode, partial, quick, benches, allocs, versions, meta, runs):
    """Writes bench-MODE[-partial].{md,json,csv} and -runs.csv (and the chart)
    under out, prints the header and the tables; returns the summary."""
    summary = summarize(benches, allocs, runs)
    md = markdown(benches, allocs, summary, meta)

    os.makedirs(out, exist_ok=True)
    # a run restricted with --only/--allocators does not overwrite the whole suite's results
    stem = os.path.join(out, f"bench-{mode}" + ("-partial" if partial else ""))
    data = {"meta": meta, "allocators": allocs,
            "benchmarks": [{"name": b.name, "argv": catalog.argv_of(b, quick), "what": b.what,
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
    return summary


def write_callgrind(out, results, meta):
    """Prints the --callgrind table and writes it to callgrind.md, the
    results to callgrind.json, under out."""
    lines = ["Instructions per malloc+free pair (valgrind --tool=callgrind; runs with N and 2N "
             "iterations, difference / pairs, so start-up cancels).", "",
             "| benchmark | allocator | Ir/pair (whole loop) | Ir/pair in allocator | hottest allocator functions |",
             "|---|---|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['benchmark']} | {r['allocator']} | {r['ir_per_pair_total']:.1f} | "
                     f"{r['ir_per_pair_in_allocator']:.1f} | {', '.join(r['top_functions'])} |")
    md = "\n".join(lines) + "\n"
    print(md)
    with open(os.path.join(out, "callgrind.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "callgrind.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    log(f"wrote {os.path.join(out, 'callgrind.md')} and callgrind.json")
