"""The workload sweep's configurations: a fixed list, generated
deterministically (seed SEED) from a grid over the corners of the
parameter space plus seeded random points, each a set of arguments of
bench/sweep.c with a stable short id that names its parameters. Used by
run.py --sweep (docs/BENCHMARKS.md, "The workload sweep").

    python3 bench/sweep_configs.py [--quick]   # prints the list: id and arguments

The operation counts come from a rough cost model (est_seconds) so that a
run takes about TARGET_S seconds under a fast allocator.
"""
import math
import random
import sys
import zlib

import catalog

SEED = 20261201
TARGET_S = 0.12   # modelled seconds per run
MAX_LIVE_BYTES = 256 << 20  # the live set stays under this (mean size x live)
K, M = 1 << 10, 1 << 20

# size ranges: (label, lo, hi, the fixed distribution's size); the labels are
# the heat maps' columns. They sit below a page, around the small/medium
# boundary (8 KiB), around a slab (64 KiB), around the medium/large boundary
# (1 MiB), above it and far above.
SIZE_RANGES = [
    ("8-64", 8, 64, 16),
    ("16-1k", 16, 1 * K, 256),
    ("1k-8k", 1 * K, 8 * K, 4 * K),
    ("4k-32k", 4 * K, 32 * K, 9 * K),
    ("32k-256k", 32 * K, 256 * K, 64 * K),
    ("256k-2m", 256 * K, 2 * M, 1 * M),
    ("1m-16m", 1 * M, 16 * M, 4 * M),
    ("16m-64m", 16 * M, 64 * M, 32 * M),
]
RANGE = {r[0]: r for r in SIZE_RANGES}
LIVES = [1, 16, 256, 4096, 65536, 1 << 20]
# the heat maps' rows: live set buckets (upper bounds)
LIVE_BUCKETS = [(8, "1-8"), (256, "9-256"), (8192, "257-8k"), (131072, "8k-128k"), (1 << 20, "128k-1M")]
DISTS = ["fixed", "uniform", "loguniform", "bimodal"]
ORDERS = ["lifo", "fifo", "random"]
TOUCHES = ["none", "first", "page", "all"]
REMOTES = [0, 5, 50, 100]
REALLOCS = [f"{k}:{s}" for k in ("grow", "shrink", "mix") for s in ("small", "large")]
# the heat maps' panels
PANELS = ["1 thread", "2 threads", "4 threads", "8-16 threads", "short-lived threads", "pipelines"]


def fmt_size(n):
    for unit, div in (("m", M), ("k", K)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt_count(n):
    for unit, div in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


class Config:
    def __init__(self, rng_name, dist="uniform", live=1000, order="random", touch="first", realloc=None,
                 rebuild=0, batch=None, threads=1, remote=0, lifetime="long", life=None, pipe=False,
                 cliff=None):
        label, lo, hi, fixed = RANGE[rng_name]
        self.range, self.dist = rng_name, dist
        self.lo, self.hi = (fixed, fixed) if dist == "fixed" else (lo, hi)
        self.order, self.touch, self.realloc, self.rebuild, self.batch = order, touch, realloc, rebuild, batch
        self.threads, self.remote, self.lifetime, self.life, self.pipe = threads, remote, lifetime, life, pipe
        self.cliff = cliff  # a known cliff: why it is in the list
        grow = 2 if realloc and not realloc.startswith("shrink") else 1
        # the live set fits in MAX_LIVE_BYTES (and a short-lived or pipelined
        # thread's share of it is at least one block)
        self.live = max(1, min(live, MAX_LIVE_BYTES // int(self.mean_size() * grow)))
        if lifetime == "long" and not pipe:
            self.live = max(self.live, threads)  # a block a thread at least
        if lifetime == "short":
            # a short-lived thread lasts at most an eighth of the run
            self.life = max(1, min(life or 100, int(TARGET_S * 1e9 / 8 / self.step_ns())))
        self.ops = self.choose_ops()
        self.id = self.make_id()
        self.seed = zlib.crc32(self.id.encode()) & 0xFFFF

    def mean_size(self):
        lo, hi = self.lo, self.hi
        if self.dist == "fixed" or lo == hi:
            return lo
        if self.dist == "uniform":
            return (lo + hi) / 2
        if self.dist == "loguniform":
            return (hi - lo) / math.log(hi / lo)
        return 0.9 * (lo + min(hi, 2 * lo)) / 2 + 0.1 * (max(lo, hi / 2) + hi) / 2

    # ---- the cost model: seconds of one run, per replacement step and fixed
    def step_ns(self):
        m = self.mean_size()
        pages = max(1.0, m / 4096)
        ns = 60.0
        if m >= 128 * K:
            ns += 300  # a cached mapping or span taken and given back
        fault = 1000 if m >= 64 * K else 15  # a page fault and zeroing, or a write to a resident page
        ns += {"none": 0, "first": 5, "page": fault * pages, "all": 0.15 * m + fault * pages}[self.touch]
        if self.realloc:
            ns += 0.5 * (0.15 * m * (3 if self.realloc.endswith("large") else 1) + 200)
        if self.threads > 1 or self.lifetime == "short":
            ns += 2 * self.remote  # remote frees
            ns *= 1.3 if self.threads > 2 else 1.0
        if self.pipe:  # a small ring: the pair waits for each other (sched_yield)
            ns += 2500 / min(64, max(1, self.live // (self.threads // 2)))
        return ns

    def fixed_ns(self):
        per_block = self.step_ns()
        live = self.live
        return live * per_block * (2 + 2 * self.rebuild) * (1.5 if live >= 65536 else 1.0)

    def choose_ops(self):
        step = self.step_ns()
        if self.lifetime == "short":
            per_thread = 60000.0 + (self.live // self.threads or 1) * step * 2 + self.life * step
            threads = max(self.threads, int(TARGET_S * 1e9 / per_thread))
            return threads * self.life
        if self.pipe:
            return int(min(2e6, max(16, TARGET_S * 1e9 / step)))
        left = TARGET_S * 1e9 - self.fixed_ns()
        ops = int(left / step) if left > 0 else 0
        if self.rebuild == 0:
            ops = max(ops, 16)
        return min(ops, 2_000_000)

    def est_seconds(self):
        if self.lifetime == "short":
            per_thread = 60000.0 + (self.live // self.threads or 1) * self.step_ns() * 2 + self.life * self.step_ns()
            return self.ops / self.life * per_thread / 1e9
        return (self.fixed_ns() + self.ops * self.step_ns()) / 1e9

    def make_id(self):
        d = {"fixed": "f", "uniform": "u", "loguniform": "l", "bimodal": "b"}[self.dist]
        size = d + (fmt_size(self.lo) if self.dist == "fixed" else f"{fmt_size(self.lo)}-{fmt_size(self.hi)}")
        parts = [size, "L" + fmt_count(self.live), {"lifo": "lifo", "fifo": "fifo", "random": "rnd"}[self.order],
                 "t" + self.touch[0]]
        if self.realloc:
            kind, step = self.realloc.split(":")
            parts.append("r" + kind[0] + step[0])
        if self.rebuild:
            parts.append(f"rb{self.rebuild}")
        if self.batch:
            parts.append(f"b{self.batch}")
        if self.pipe:
            parts.append(f"P{self.threads}")
        elif self.lifetime == "short":
            parts.append(f"S{self.threads}x{self.life}")
        elif self.threads > 1:
            parts.append(f"T{self.threads}")
        if self.remote and not self.pipe:
            parts.append(f"r{self.remote}")
        return "_".join(parts)

    def argv(self):
        a = ["sweep", f"dist={self.dist}", f"lo={self.lo}", f"hi={self.hi}", f"live={self.live}",
             f"ops={self.ops}", f"order={self.order}", f"touch={self.touch}"]
        if self.realloc:
            a.append(f"realloc={self.realloc}")
        if self.rebuild:
            a.append(f"rebuild={self.rebuild}")
        if self.batch:
            a.append(f"batch={self.batch}")
        if self.threads > 1:
            a.append(f"threads={self.threads}")
        if self.remote and not self.pipe:
            a.append(f"remote={self.remote}")
        if self.lifetime == "short":
            a += ["lifetime=short", f"life={self.life}"]
        if self.pipe:
            a.append("pipe=1")
        a.append(f"seed={self.seed}")
        return a

    # ---- where the config goes in the heat maps
    def panel(self):
        if self.pipe:
            return "pipelines"
        if self.lifetime == "short":
            return "short-lived threads"
        return {1: "1 thread", 2: "2 threads", 4: "4 threads"}.get(self.threads, "8-16 threads")

    def live_bucket(self):
        return next(label for bound, label in LIVE_BUCKETS if self.live <= bound)

    def params(self):
        return {"range": self.range, "dist": self.dist, "lo": self.lo, "hi": self.hi, "live": self.live,
                "ops": self.ops, "order": self.order, "touch": self.touch, "realloc": self.realloc,
                "rebuild": self.rebuild, "batch": self.batch, "threads": self.threads, "remote": self.remote,
                "lifetime": self.lifetime, "life": self.life, "pipe": self.pipe, "cliff": self.cliff,
                "panel": self.panel(), "live_bucket": self.live_bucket(), "seed": self.seed}


def feasible(rng_name, live):
    """a live set that the memory cap does not cut below a tenth"""
    return live * RANGE[rng_name][1] <= 10 * MAX_LIVE_BYTES


def generate():
    """The full list, in a fixed order: the known cliffs, the grid, the
    dimension corners, the seeded random points (duplicates dropped)."""
    r = random.Random(SEED)
    out = []
    ranges = [s[0] for s in SIZE_RANGES]

    # the known cliffs
    cliff = "large blocks of varied 1-16 MiB sizes"
    out += [Config("1m-16m", "uniform", 2, "random", "page", cliff=cliff),
            Config("1m-16m", "uniform", 16, "random", "page", cliff=cliff),
            Config("1m-16m", "loguniform", 4, "fifo", "first", cliff=cliff),
            Config("1m-16m", "uniform", 4, "random", "page", threads=2, pipe=True, cliff=cliff),
            Config("1m-16m", "uniform", 8, "random", "page", threads=2, remote=50, cliff=cliff)]
    cliff = "1M x 16 B allocated, freed in scattered order and allocated again, four rounds"
    out += [Config("8-64", "fixed", 1 << 20, "random", "first", rebuild=4, cliff=cliff),
            Config("8-64", "fixed", 1 << 20, "lifo", "first", rebuild=4, cliff=cliff),
            Config("8-64", "uniform", 1 << 20, "random", "none", rebuild=4, cliff=cliff),
            Config("16-1k", "fixed", 1 << 20, "random", "first", rebuild=2, threads=2, cliff=cliff)]
    cliff = "short-lived threads handing blocks to longer-lived ones"
    out += [Config("16-1k", "uniform", 256, "random", "first", threads=4, remote=100, lifetime="short", cliff=cliff),
            Config("16-1k", "uniform", 64, "random", "first", threads=8, remote=50, lifetime="short", life=20,
                   cliff=cliff),
            Config("1k-8k", "loguniform", 1024, "fifo", "first", threads=2, remote=100, lifetime="short",
                   life=500, cliff=cliff),
            Config("32k-256k", "uniform", 64, "random", "page", threads=4, remote=50, lifetime="short", cliff=cliff)]

    # the grid: every size range x live set x thread panel, with the other
    # dimensions rotating so each of their values meets many of the others
    k = 0
    for rn in ranges:
        for live in LIVES:
            if not feasible(rn, live):
                continue
            out.append(Config(rn, DISTS[k % 4], live, ORDERS[k % 3], TOUCHES[(k // 3) % 4]))
            k += 1
    panels = [("long", [2]), ("long", [4]), ("long", [8, 16]), ("short", [2, 4, 8, 16]), ("pipe", [2, 4, 8, 16])]
    for kind, threads in panels:
        lives = LIVES[:5] if kind != "short" else LIVES[:4]
        for i, rn in enumerate(ranges):
            for j, live in enumerate(lives):
                if (i + j) % 2 or not feasible(rn, live):  # a checkerboard: half the cells
                    continue
                k += 1
                t = threads[k % len(threads)]
                remote = REMOTES[k % 4] if kind != "pipe" else 0
                if kind == "short":
                    out.append(Config(rn, DISTS[k % 4], max(live, t), ORDERS[k % 3], TOUCHES[1 + k % 3],
                                      threads=t, remote=remote, lifetime="short", life=[20, 100, 1000][k % 3]))
                else:
                    out.append(Config(rn, DISTS[k % 4], max(live, t // 2 if kind == "pipe" else t),
                                      ORDERS[k % 3], TOUCHES[k % 4], threads=t, remote=remote,
                                      pipe=kind == "pipe"))

    # the dimension corners: realloc, rebuild, touch, order with batch 1
    for rn in ("16-1k", "4k-32k", "256k-2m"):
        for ra in REALLOCS:
            out.append(Config(rn, "loguniform", 64 if rn == "256k-2m" else 1024, "random", "first", realloc=ra))
    for rn in ("16-1k", "32k-256k"):
        for order in ORDERS:
            out.append(Config(rn, "uniform", 4096 if rn == "16-1k" else 256, order, "first", rebuild=8))
    for rn in ("1k-8k", "256k-2m", "16m-64m"):
        for touch in TOUCHES:
            out.append(Config(rn, "uniform", 4 if rn == "16m-64m" else 64, "random", touch))
    for rn in ("16-1k", "32k-256k"):
        for order in ORDERS:
            out.append(Config(rn, "uniform", 4096 if rn == "16-1k" else 64, order, "first", batch=1))
    for live in (1, 16, 4096):
        out.append(Config("4k-32k", "bimodal", live, "random", "first", threads=16, remote=100))

    # seeded random points
    for _ in range(60):
        rn = r.choice(ranges)
        live = int(round(math.exp(r.uniform(0, math.log(1 << 20)))))
        kind = r.choice(["long", "long", "long", "short", "pipe"])
        threads = r.choice([1, 2, 4, 8, 16]) if kind == "long" else r.choice([2, 4, 8, 16])
        kw = dict(threads=threads)
        if kind == "long" and threads > 1:
            kw["remote"] = r.choice(REMOTES)
        if kind == "short":
            kw.update(lifetime="short", remote=r.choice(REMOTES), life=r.choice([20, 100, 1000]))
            live = min(live, 4096)
        if kind == "pipe":
            kw["pipe"] = True
            live = max(live, threads // 2)
        if kind == "long" and r.random() < 0.2:
            kw["realloc"] = r.choice(REALLOCS)
        if kind == "long" and r.random() < 0.15:
            kw["rebuild"] = r.choice([1, 4])
        out.append(Config(rn, r.choice(DISTS), max(live, threads), r.choice(ORDERS), r.choice(TOUCHES), **kw))

    seen, configs = set(), []
    for c in out:
        if c.id not in seen:
            seen.add(c.id)
            configs.append(c)
    return configs


QUICK_COUNT = 30


def quick(configs):
    """--quick: the known cliffs and an even sample of the rest, QUICK_COUNT in all."""
    cliffs = [c for c in configs if c.cliff]
    rest = [c for c in configs if not c.cliff]
    n = QUICK_COUNT - len(cliffs)
    return cliffs + [rest[(i * len(rest)) // n] for i in range(n)]


def select(is_quick, only):
    """The configurations a run measures, as catalog.Bench objects (name =
    id, argv = the program's); `only`: ids containing one of these strings."""
    configs = generate()
    if is_quick:
        configs = quick(configs)
    if only:
        configs = [c for c in configs if any(o in c.id for o in only)]
        if not configs:
            sys.exit("run.py: --sweep --only matches no configuration (python3 bench/sweep_configs.py lists them)")
    return [catalog.Bench(c.id, c.argv(), c.argv(), what=c.cliff or "") for c in configs], \
        {c.id: c for c in configs}


if __name__ == "__main__":
    cs = generate()
    if "--quick" in sys.argv:
        cs = quick(cs)
    for c in cs:
        print(f"{c.id:<40} {c.panel():<20} {c.est_seconds():6.3f}s  {' '.join(c.argv()[1:])}")
    print(f"{len(cs)} configurations, modelled {sum(c.est_seconds() for c in cs):.0f} s per allocator and repeat",
          file=sys.stderr)
