"""The benchmark catalogue: which benchmark programs the suite runs, with
which arguments (full suite, --quick subset, --scaling series), and the
runs that --callgrind measures. Used by run.py.
"""
import sys


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
    Bench("full_pages", ["sweep", "dist=fixed", "lo=256", "hi=256", "live=1024", "ops=20000000", "order=random",
                         "touch=first", "batch=1"],
          ["sweep", "dist=fixed", "lo=256", "hi=256", "live=1024", "ops=2000000", "order=random", "touch=first",
           "batch=1"],
          what="1024 live blocks of 256 B, as many as their pages hold: one at a time, a random one freed and "
               "another allocated"),
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


# callgrind mode: benchmark, argv for N iterations, argv for 2N iterations
CALLGRIND = [
    ("tiny_hot", ["tiny_hot", "2000"], ["tiny_hot", "4000"]),
    ("random_mixed", ["random_mixed", "200000", "2000", "42"], ["random_mixed", "400000", "2000", "42"]),
]


def select(quick, scaling, threads, only_names):
    """The benchmarks a run measures: the full suite, or the --quick subset,
    or the --scaling series at the thread counts `threads` (a comma list).
    only_names (--only) keeps those named; a name NAME also takes every
    NAME_SUFFIX (fixed: fixed_64k, fixed_256k, fixed_2m). Exits with a
    message on a name that matches nothing."""
    benches = [b for b in BENCHMARKS if (b.quick if quick else b.full)]
    if scaling:
        benches = scaling_benchmarks([int(t) for t in threads.split(",") if t])
        if only_names:  # larson, mid_large_mt, big_mixed, thread_scaling, prodcons
            benches = [b for b in benches if b.name.rsplit("_", 1)[0] in only_names]
            if not benches:
                sys.exit("run.py: --scaling --only takes larson, mid_large_mt, big_mixed, thread_scaling, prodcons")
    elif only_names:
        known = {b.name for b in BENCHMARKS} | {"fixed", "thread_scaling"}
        bad = [n for n in only_names if n not in known]
        if bad:
            sys.exit(f"run.py: unknown benchmark(s) {', '.join(bad)}; have: {', '.join(b.name for b in BENCHMARKS)}")
        if quick:  # --only picks from the whole suite, at quick sizes where there are some
            benches = [b for b in BENCHMARKS]
        benches = [b for b in benches if b.name in only_names or b.name.rsplit("_", 1)[0] in only_names]
    return benches


def argv_of(b, quick):
    """The program and arguments of benchmark b in a full or a --quick run
    (a benchmark with no quick arguments runs its full ones there)."""
    return (b.quick or b.full) if quick else b.full
