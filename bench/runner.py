"""Running the benchmarks: finding the allocators and preloading each
(LD_PRELOAD; glibc = none), running every benchmark under every allocator
interleaved (A B C A B C ...) for the repeats, with the time and the
RESULT line of each run (throughput, peak RSS and the program's own
metrics), the --callgrind measurement of instructions per malloc+free
pair, and the description of the machine that goes with the results.
Used by run.py.
"""
import datetime
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

import catalog

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, cwd=None):
    """Output of a command, or "" if it fails."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------- allocators

# (name, soname, Debian package)
PEERS = [
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0"),
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2"),
    ("tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
]


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
        name, sep, rest = spec.partition("=")
        path, *settings = rest.split(",")
        if not sep or not name or not path or any("=" not in s for s in settings):
            sys.exit(f"run.py: --with wants NAME=PATH[,VAR=VALUE...], got '{spec}'")
        if not os.path.exists(path):
            sys.exit(f"run.py: --with {name}: no such file: {path}")
        allocs[name] = Lib(os.path.abspath(path), dict(s.split("=", 1) for s in settings))
    if args.allocators:
        keep = [a for s in args.allocators for a in s.split(",") if a]
        unknown = [a for a in keep if a not in allocs]
        if unknown:
            sys.exit(f"run.py: unknown allocator(s) {', '.join(unknown)}; have: {', '.join(allocs)}")
        allocs = {a: allocs[a] for a in allocs if a in keep}
    return allocs, versions


class Lib(str):
    """A library's path, with the environment variables its runs get
    (--with NAME=PATH,VAR=VALUE: the same library under options)."""
    def __new__(cls, path, env):
        s = super().__new__(cls, path)
        s.env = env
        return s


def child_env(lib):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HAKMEM_") or k == "LD_PRELOAD":
            del env[k]  # HAKMEM_* options would change what is measured
    if lib:
        env["LD_PRELOAD"] = lib
        env.update(getattr(lib, "env", {}))
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
        argv = catalog.argv_of(b, args.quick)
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
    """Instructions per malloc+free pair of each allocator in catalog.CALLGRIND's
    runs, each run with N and with 2N iterations: the difference over the
    pairs, so that start-up cancels. Returns one result per benchmark and
    allocator."""
    if not shutil.which("valgrind"):
        sys.exit("run.py: valgrind not found; install it with: sudo apt-get install valgrind")
    cases = [c for c in catalog.CALLGRIND if not args.only or c[0] in args.only_names]
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
    return results


# ---------------------------------------------------------------- the machine

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
