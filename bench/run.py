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
  python3 bench/run.py --sweep [--quick]  # the workload sweep, 3 repeats (make bench-sweep, bench-sweep-quick)

The benchmarks and their arguments are listed in catalog.py (the sweep's
configurations in sweep_configs.py), running them is runner.py's, the
tables and files are report.py's (sweep_report.py's); this file is the
command line. See docs/BENCHMARKS.md.
"""
import argparse
import json
import os
import sys
import time

import catalog
import report
import runner
import sweep_configs
import sweep_report

HERE = runner.HERE
REPO = runner.REPO


def main():
    ap = argparse.ArgumentParser(description="Compare hakmem with glibc, mimalloc, jemalloc, tcmalloc.",
                                 epilog="benchmarks: " + ", ".join(b.name for b in catalog.BENCHMARKS))
    ap.add_argument("--quick", action="store_true", help="a subset with smaller sizes, 2 repeats (about a minute; "
                    "with --sweep: 30 configurations)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only these benchmarks (repeatable or comma list; 'fixed' = all fixed_*; "
                    "with --sweep: the configurations whose id contains NAME)")
    ap.add_argument("--sweep", action="store_true",
                    help="the workload sweep: generated configurations (bench/sweep_configs.py), 3 repeats")
    ap.add_argument("--with", dest="with_", action="append", default=[], metavar="NAME=PATH[,VAR=VALUE...]",
                    help="also measure the allocator in PATH (a preloadable .so), its runs given the "
                    "variables that follow (e.g. hakmem-prof=build/libhakmem.so,HAKMEM_PROFILE=1)")
    ap.add_argument("--allocators", action="append", default=[], metavar="A,B",
                    help="measure only these allocators (names as in the table)")
    ap.add_argument("--repeats", type=int, help="runs per benchmark and allocator (default 5, quick 2, sweep 3)")
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

    if args.chart_from:  # internal: draw a chart from a JSON file (see report.make_chart)
        data = json.load(open(args.chart_from))
        draw = sweep_report.heatmaps_matplotlib if data.get("kind") == "sweep" else report.chart_matplotlib
        print(" ".join(draw(data, args.chart_stem)))
        return 0

    args.bin_dir = args.bin_dir or os.path.join(REPO, "build", "bench")
    if not os.path.isdir(args.bin_dir):
        sys.exit(f"run.py: benchmark programs not found in {args.bin_dir}; build them with 'make'")
    if args.out is None:
        in_source_tree = os.path.exists(os.path.join(REPO, "CMakeLists.txt")) and os.access(HERE, os.W_OK)
        args.out = os.path.join(HERE, "results") if in_source_tree else os.path.abspath("hakmem-bench-results")
    if args.repeats is None:
        args.repeats = 2 if args.quick else 3 if args.sweep else 5
    if args.repeats < 1:
        sys.exit("run.py: --repeats must be at least 1")

    args.only_names = [n for s in args.only for n in s.split(",") if n]
    if args.sweep and (args.callgrind or args.scaling):
        sys.exit("run.py: --sweep goes with neither --callgrind nor --scaling")
    if args.sweep:
        benches, configs = sweep_configs.select(args.quick, args.only_names)
    else:
        benches = catalog.select(args.quick, args.scaling, args.threads, args.only_names)

    allocs, versions = runner.discover_allocators(args)
    if args.callgrind:
        results = runner.run_callgrind(args, allocs)
        report.write_callgrind(args.out, results, runner.machine_meta(args, "callgrind"))
        return 0

    mode = "scaling" if args.scaling else "quick" if args.quick else "full"
    meta = runner.machine_meta(args, ("sweep-" if args.sweep else "") + mode)
    meta["versions"] = versions
    runner.log(f"hakmem {'workload sweep' if args.sweep else 'benchmarks'} ({mode}): {len(benches)} "
               f"{'configurations' if args.sweep else 'benchmarks'} x {len(allocs)} allocators "
               f"({', '.join(allocs)}) x {args.repeats} repeats")
    if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        runner.log(f"note: the machine is busy (load average {os.getloadavg()[0]:.2f}); timings will be noisy")
    t0 = time.monotonic()
    runs = runner.run_suite(args, benches, allocs)
    meta["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta["elapsed"] = f"{runner.fmt_time(time.monotonic() - t0)} elapsed"
    if args.sweep:
        summary = sweep_report.write_sweep(args.out, mode, bool(args.only_names or args.allocators), benches,
                                           configs, allocs, versions, meta, runs)
        return 1 if any(s["status"] != "ok" for b in summary.values() for s in b.values()) else 0
    summary = report.write_suite(args.out, mode, bool(args.only_names or args.allocators), args.quick,
                                 benches, allocs, versions, meta, runs)
    return 1 if any(s["status"] != "ok" for b in summary.values() for s in b.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

