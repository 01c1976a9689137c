"""The workload sweep's results: for each configuration, hakmem's time and
peak RSS as ratios to the best peer's, the 20 worst of each, heat maps
(size range against live set, one panel per thread setting) of both
ratios, and the markdown, JSON and CSV files. Used by run.py --sweep.

time ratio   = hakmem's time / the fastest peer's time
             = the fastest peer's ops/s / hakmem's ops/s (above 1: hakmem is slower)
memory ratio = hakmem's peak RSS / the smallest peak RSS of the peers (above 1: hakmem uses more)
"""
import csv
import json
import math
import os

import report
import sweep_configs
from runner import log

WORST = 20


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def analyse(benches, configs, allocs, runs):
    """One row per configuration: its parameters, every allocator's median
    ops/s and peak RSS, the best peers and the two ratios (None when hakmem
    or every peer failed)."""
    summary = report.summarize(benches, allocs, runs)
    rows = []
    for b in benches:
        s = summary[b.name]
        row = {"id": b.name, **configs[b.name].params(), "argv": b.full}
        for a in allocs:
            row[f"{a}_ops_per_sec"] = s[a]["ops_per_sec"]
            row[f"{a}_peak_rss_kb"] = s[a]["peak_rss_kb"]
            row[f"{a}_status"] = s[a]["status"]
        h = s.get("hakmem")
        peers = {a: v for a, v in s.items() if a != "hakmem" and v["status"] == "ok"}
        row.update(best_time_peer=None, time_ratio=None, best_memory_peer=None, memory_ratio=None)
        if h and h["status"] == "ok" and peers:
            bt = max(peers, key=lambda a: peers[a]["ops_per_sec"] or 0)
            bm = min(peers, key=lambda a: peers[a]["peak_rss_kb"] or float("inf"))
            row.update(best_time_peer=bt, best_memory_peer=bm,
                       time_ratio=report.ratio(peers[bt]["ops_per_sec"], h["ops_per_sec"]),
                       memory_ratio=report.ratio(h["peak_rss_kb"], peers[bm]["peak_rss_kb"]))
        rows.append(row)
    return summary, rows


def worst(rows, key, n=WORST):
    return sorted((r for r in rows if r[key] is not None), key=lambda r: -r[key])[:n]


def grid(rows, key, panel, agg):
    """{(live bucket, size range): agg(ratios)} of one panel"""
    cells = {}
    for r in rows:
        if r["panel"] == panel and r[key] is not None:
            cells.setdefault((r["live_bucket"], r["range"]), []).append(r[key])
    return {k: (agg(v), len(v)) for k, v in cells.items()}


def describe(r):
    """the configuration's parameters in words, for the tables"""
    p = [f"{r['dist']} {sweep_configs.fmt_size(r['lo'])}" +
         ("" if r["lo"] == r["hi"] else f"-{sweep_configs.fmt_size(r['hi'])}"),
         f"live {r['live']}", r["order"], f"touch {r['touch']}"]
    if r["realloc"]:
        p.append("realloc " + r["realloc"])
    if r["rebuild"]:
        p.append(f"{r['rebuild']} rebuilds")
    if r["pipe"]:
        p.append(f"{r['threads'] // 2} pipeline" + ("s" if r["threads"] > 2 else ""))
    elif r["lifetime"] == "short":
        p.append(f"short-lived threads, {r['threads']} at a time, {r['life']} steps each")
    elif r["threads"] > 1:
        p.append(f"{r['threads']} threads")
    if r["remote"] and not r["pipe"]:
        p.append(f"{r['remote']} % remote")
    return ", ".join(p)


def x(v):
    return f"{v:.2f}x" if v is not None else "-"


def markdown(rows, allocs, meta):
    mib = 1024
    lines = []
    timed = [r["time_ratio"] for r in rows if r["time_ratio"]]
    mem = [r["memory_ratio"] for r in rows if r["memory_ratio"]]
    lines += [f"{len(rows)} configurations x {len(allocs)} allocators ({', '.join(allocs)}) x "
              f"{meta['repeats']} repeats, medians. time ratio = hakmem's time / the fastest peer's "
              "(the inverse of the throughput ratio); memory ratio = hakmem's peak RSS / the smallest "
              "peer's. Above 1: hakmem is worse.", ""]
    if timed:
        lines += [f"Geometric mean over the configurations: time ratio {geomean(timed):.2f}x, "
                  f"memory ratio {geomean(mem):.2f}x. hakmem is the fastest in "
                  f"{sum(v <= 1 for v in timed)} of {len(timed)}, within 1.5x of the fastest peer in "
                  f"{sum(v <= 1.5 for v in timed)}; uses the least memory in {sum(v <= 1 for v in mem)}, "
                  f"within 1.5x in {sum(v <= 1.5 for v in mem)}.", ""]

    lines += [f"### The {WORST} worst by time ratio", "",
              "| config | workload | hakmem Mops/s | fastest peer | its Mops/s | time ratio | memory ratio |",
              "|---|---|---:|---|---:|---:|---:|"]
    for r in worst(rows, "time_ratio"):
        bt = r["best_time_peer"]
        lines.append(f"| {r['id']} | {describe(r)} | {report.num(r['hakmem_ops_per_sec'] / 1e6)} | {bt} | "
                     f"{report.num(r[bt + '_ops_per_sec'] / 1e6)} | {x(r['time_ratio'])} | {x(r['memory_ratio'])} |")
    lines += ["", f"### The {WORST} worst by memory ratio", "",
              "| config | workload | hakmem peak MiB | smallest peer | its MiB | memory ratio | time ratio |",
              "|---|---|---:|---|---:|---:|---:|"]
    for r in worst(rows, "memory_ratio"):
        bm = r["best_memory_peer"]
        lines.append(f"| {r['id']} | {describe(r)} | {report.num(r['hakmem_peak_rss_kb'] / mib)} | {bm} | "
                     f"{report.num(r[bm + '_peak_rss_kb'] / mib)} | {x(r['memory_ratio'])} | {x(r['time_ratio'])} |")

    ranges = [s[0] for s in sweep_configs.SIZE_RANGES]
    for key, title in (("time_ratio", "time ratio"), ("memory_ratio", "memory ratio")):
        lines += ["", f"### Heat map: {title} (geometric mean per cell; configurations in the cell)", ""]
        for panel in sweep_configs.PANELS:
            g = grid(rows, key, panel, geomean)
            if not g:
                continue
            lines += [f"{panel}:", "", "| live \\ size | " + " | ".join(ranges) + " |",
                      "|---|" + "---:|" * len(ranges)]
            for _, bucket in sweep_configs.LIVE_BUCKETS:
                cells = [f"{g[(bucket, rn)][0]:.2f} ({g[(bucket, rn)][1]})" if (bucket, rn) in g else ""
                         for rn in ranges]
                lines.append(f"| {bucket} | " + " | ".join(cells) + " |")
            lines.append("")

    names = list(allocs)
    lines += ["### Every configuration", "",
              "| config | workload | " + " | ".join(f"{a} Mops/s" for a in names) + " | "
              + " | ".join(f"{a} MiB" for a in names) + " | time ratio | memory ratio |",
              "|---|---|" + "---:|" * (2 * len(names) + 2)]
    for r in rows:
        t = [report.num(r[f"{a}_ops_per_sec"] / 1e6) if r[f"{a}_status"] == "ok" else "**FAIL**" for a in names]
        m = [report.num(r[f"{a}_peak_rss_kb"] / mib) if r[f"{a}_status"] == "ok" else "**FAIL**" for a in names]
        lines.append(f"| {r['id']} | {describe(r)} | " + " | ".join(t) + " | " + " | ".join(m)
                     + f" | {x(r['time_ratio'])} | {x(r['memory_ratio'])} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- heat maps

def heatmaps_matplotlib(data, stem):
    """stem-time.{svg,png} and stem-memory.{svg,png}: a panel per thread
    setting, size range across, live set down, colour = log2 of the cell's
    geometric mean ratio (green: hakmem better, red: worse)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows, m = data["rows"], data["meta"]
    ranges = [s[0] for s in sweep_configs.SIZE_RANGES]
    buckets = [b for _, b in sweep_configs.LIVE_BUCKETS]
    out = []
    for key, name, what in (("time_ratio", "time", "time ratio hakmem / fastest peer"),
                            ("memory_ratio", "memory", "peak RSS ratio hakmem / smallest peer")):
        fig, axes = plt.subplots(2, 3, figsize=(17, 10), constrained_layout=True)
        im = None
        for ax, panel in zip(axes.flat, sweep_configs.PANELS):
            g = grid(rows, key, panel, geomean)
            gmax = grid(rows, key, panel, max)
            z = [[math.log2(g[(b, rn)][0]) if (b, rn) in g else float("nan") for rn in ranges] for b in buckets]
            im = ax.imshow(z, cmap="RdYlGn_r", vmin=-2, vmax=2, aspect="auto")
            for i, b in enumerate(buckets):
                for j, rn in enumerate(ranges):
                    if (b, rn) in g:
                        v, n = g[(b, rn)]
                        txt = f"{v:.2f}" + (f"\nmax {gmax[(b, rn)][0]:.2f}" if n > 1 else "") + f"\n({n})"
                        ax.text(j, i, txt, ha="center", va="center", fontsize=7.5)
            ax.set_xticks(range(len(ranges)))
            ax.set_xticklabels(ranges, rotation=35, ha="right", fontsize=8)
            ax.set_yticks(range(len(buckets)))
            ax.set_yticklabels(buckets, fontsize=8)
            ax.set_xlabel("block size (B)", fontsize=8)
            ax.set_ylabel("live blocks", fontsize=8)
            ax.set_title(panel, fontsize=10)
        cb = fig.colorbar(im, ax=axes, shrink=0.6, ticks=[-2, -1, 0, 1, 2])
        cb.ax.set_yticklabels(["0.25x", "0.5x", "1x", "2x", "4x"])
        cb.set_label(what + " (above 1: hakmem worse)")
        fig.suptitle(f"hakmem {m.get('commit', '')}: {what}, geometric mean per cell (max, count); "
                     f"{m['mode']} run, median of {m['repeats']} ({m['nproc']} CPUs, {m['cpu']}, {m['date']})",
                     fontsize="medium")
        for ext, kw in ((".svg", {}), (".png", {"dpi": 80})):
            fig.savefig(f"{stem}-{name}{ext}", **kw)
            out.append(f"{stem}-{name}{ext}")
        plt.close(fig)
    return out


def make_heatmaps(json_path, stem):
    """With matplotlib, else Debian's python3 (python3-matplotlib) when this
    interpreter lacks it; without either, the markdown's tables are the heat maps."""
    with open(json_path) as f:
        data = json.load(f)
    if not any(r["time_ratio"] for r in data["rows"]):
        log("note: no heat maps: they compare hakmem with at least one other allocator")
        return []
    try:
        return heatmaps_matplotlib(data, stem)
    except ImportError:
        pass
    files = report.draw_with_system_python(json_path, stem)
    if files is not None:
        return files
    log("note: no heat map images: install python3-matplotlib (sudo apt-get install python3-matplotlib); "
        "the markdown has them as tables")
    return []


# ---------------------------------------------------------------- files

CSV_KEYS = ["id", "panel", "range", "live_bucket", "dist", "lo", "hi", "live", "ops", "order", "touch", "realloc",
            "rebuild", "batch", "threads", "remote", "lifetime", "life", "pipe", "seed", "cliff",
            "time_ratio", "best_time_peer", "memory_ratio", "best_memory_peer"]


def write_sweep(out, mode, partial, benches, configs, allocs, versions, meta, runs):
    """Writes sweep-MODE[-partial].{md,json,csv}, -runs.csv and the heat maps
    under out, prints the header and the tables; returns the summary."""
    summary, rows = analyse(benches, configs, allocs, runs)
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"sweep-{mode}" + ("-partial" if partial else ""))
    data = {"kind": "sweep", "meta": meta, "allocators": allocs, "rows": rows, "summary": summary, "runs": runs}
    with open(stem + ".json", "w") as f:
        json.dump(data, f, indent=1)
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        per_alloc = [f"{a}_{k}" for a in allocs for k in ("status", "ops_per_sec", "peak_rss_kb")]
        w.writerow(CSV_KEYS + per_alloc)
        for r in rows:
            w.writerow([r.get(k) for k in CSV_KEYS + per_alloc])
    report.write_runs_csv(stem + "-runs.csv", runs)
    header = (f"{meta['date']}, commit {meta['commit']}, {meta['nproc']} CPUs ({meta['cpu']}), "
              f"kernel {meta['kernel']}, load average {meta['loadavg_at_start']} (start) / "
              f"{meta['loadavg_at_end']} (end), {meta['elapsed']}\nallocators: "
              + ", ".join(f"{a} {versions.get(a, '')}".strip() + (f" ({p})" if p else "") for a, p in allocs.items())
              + f"\ncommand: {meta['command']}\n\n")
    md = markdown(rows, allocs, meta)
    fails = [(b.name, a, e) for b in benches for a in allocs for e in summary[b.name][a]["errors"]]
    if fails:
        md += "\nFailures:\n\n" + "".join(f"- {b} under {a}: {e}\n" for b, a, e in fails)
    with open(stem + ".md", "w") as f:
        f.write(header + md)
    charts = make_heatmaps(stem + ".json", stem + "-heatmap")
    print()
    print(header + md.split("### Every configuration")[0].rstrip())  # the whole table is in the file
    log("wrote " + ", ".join([stem + ext for ext in (".md", ".json", ".csv", "-runs.csv")] + charts))
    return summary
