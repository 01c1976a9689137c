#!/usr/bin/env python3
"""Interleaved A/B of allocator builds on one benchmark program.

    bench/ab.py ROUNDS THREADS[,THREADS...] NAME=LIB[:VAR=VALUE,...] ...

Each round runs every NAME once (in the order given) for each thread count;
prints the median Mops/s, the median of the per-round ratios against the
first NAME, and the median peak RSS. LIB is a library to preload, or
"glibc" for none; VAR=VALUE pairs are set in that run's environment (every
other HAKMEM_* variable is cleared). The program and its arguments after
the thread count come from AB_BENCH (default build/bench/mid_large_mt) and
AB_ARGS (default "100000 64 65536 1048576": big_mixed's blocks).

Example: bench/ab.py 9 2 base=old/libhakmem.so new=build/libhakmem.so \\
             nopurge=build/libhakmem.so:HAKMEM_PURGE_DELAY_MS=1000000
"""
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import parse_result  # noqa: E402  (the suite's own RESULT parser)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds = int(sys.argv[1])
    threads = sys.argv[2].split(",")
    variants = []
    for spec in sys.argv[3:]:
        name, _, rest = spec.partition("=")
        lib, _, envs = rest.partition(":")
        extra = dict(e.split("=", 1) for e in envs.split(",") if e)
        variants.append((name, lib, extra))
    bench = os.environ.get("AB_BENCH", "build/bench/mid_large_mt")
    args = os.environ.get("AB_ARGS", "100000 64 65536 1048576").split()
    base = variants[0][0]
    for t in threads:
        speed = {n: [] for n, _, _ in variants}
        rss = {n: [] for n, _, _ in variants}
        for _ in range(rounds):
            for name, lib, extra in variants:
                env = {k: v for k, v in os.environ.items() if not k.startswith("HAKMEM_") and k != "LD_PRELOAD"}
                if lib != "glibc":
                    env["LD_PRELOAD"] = os.path.abspath(lib)
                env.update(extra)
                out = subprocess.run([bench, t] + args, env=env, capture_output=True, text=True).stdout
                res = parse_result(out)
                if res is None or "ops_per_sec" not in res or "peak_rss_kb" not in res:
                    sys.exit(f"ab.py: no RESULT line from {name}: {out.strip()[:200]}")
                speed[name].append(res["ops_per_sec"] / 1e6)
                rss[name].append(res["peak_rss_kb"] / 1024)
        print(f"threads {t} ({rounds} rounds; median Mops/s, median of per-round ratios against {base}, "
              f"median peak RSS MiB)")
        for name, _, _ in variants:
            ratio = statistics.median(a / b for a, b in zip(speed[name], speed[base]))
            runs = " ".join(f"{x:.1f}" for x in speed[name])
            print(f"  {name:14s} {statistics.median(speed[name]):8.2f} {ratio:6.2f}x "
                  f"{statistics.median(rss[name]):8.1f} MiB   runs {runs}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
