#!/usr/bin/env python3
"""hakmem report: run a program under hakmem's heap profiler and timeline,
and write one self-contained HTML page (docs/REPORT.md).

usage: hakmem_report.py --hakmem LIB [-o report.html] [--rate BYTES] [--interval MS]
                 [--keep DIR] -- PROGRAM [ARGS...]
       hakmem_report.py --from PROFILE.json [--timeline FILE] [-o report.html]

The program runs with libhakmem.so preloaded, HAKMEM_PROFILE=1 (a sample
every --rate bytes, 524288 by default), HAKMEM_TIMELINE_FILE (RSS, live and
mapped bytes every --interval ms, and a profile at each new peak of the
live bytes) and HAKMEM_STATS=json, each process
writing files of its own (%p: its pid), so a program that forks or execs
gets one section per process. The stacks are symbolised with addr2line
(binutils). The page embeds its data and its script: it opens offline.
Exit status: the program's.
"""
import argparse, glob, json, os, re, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))


def load_timeline(path):
    """The timeline file: a JSON header, then lines of numbers."""
    head, rows = {}, []
    try:
        with open(path) as f:
            first = f.readline()
            head = json.loads(first) if first.startswith("{") else {}
            for line in f:
                parts = line.split()
                if len(parts) == 4 and all(p.isdigit() for p in parts):
                    rows.append([int(p) for p in parts])
    except (OSError, ValueError):
        pass
    return head, rows


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def elf_is_exec(path, cache={}):
    """True for a non-PIE executable (ET_EXEC): addr2line wants the address, not the offset."""
    if path not in cache:
        try:
            with open(path, "rb") as f:
                h = f.read(18)
            cache[path] = h[:4] == b"\x7fELF" and h[16] == 2
        except OSError:
            cache[path] = False
    return cache[path]


def symbolise(frames, cwd):
    """{(object, offset): (function, file:line)} by addr2line, one run per object."""
    by_obj = {}
    for fr in frames:
        obj, off = fr.get("object"), fr.get("offset")
        if obj is None or off is None:
            continue
        by_obj.setdefault(obj, set()).add((off, int(fr["pc"], 16)))
    names = {}
    have = shutil.which("addr2line") is not None
    for obj, offs in by_obj.items():
        path = obj if os.path.isabs(obj) else os.path.join(cwd, obj)
        offs = sorted(offs)
        if have and os.path.exists(path):
            # (a return address: the call is the byte before it)
            addrs = ["%x" % ((pc if elf_is_exec(path) else off) - 1) for off, pc in offs]
            try:
                out = subprocess.run(["addr2line", "-f", "-C", "-e", path] + addrs, capture_output=True,
                                     text=True, timeout=120).stdout.splitlines()
            except (OSError, subprocess.SubprocessError):
                out = []
            if len(out) == 2 * len(offs):
                for i, (off, _) in enumerate(offs):
                    fn, loc = out[2 * i], out[2 * i + 1]
                    names[(obj, off)] = (None if fn == "??" else fn, None if loc.startswith("??") else loc)
    return names


def frame_name(fr, names):
    fn, loc = names.get((fr.get("object"), fr.get("offset")), (None, None))
    fn = fn or fr.get("function")
    obj = os.path.basename(fr.get("object") or "?")
    if fn is None:
        fn = "%s+0x%x" % (obj, fr["offset"]) if fr.get("offset") is not None else fr["pc"]
    if loc is not None:
        loc = re.sub(r" \(discriminator \d+\)$", "", loc)
        loc = "%s:%s" % (os.path.basename(loc.rsplit(":", 1)[0]), loc.rsplit(":", 1)[1]) if ":" in loc else loc
    return fn, loc, obj


def build_process(profile, timeline, stats, cwd, peak=None):
    """One process's data for the page: frames are interned, and the stacks
    of the profile at the peak (if any) merged into the exit profile's."""
    proc = {"pid": None, "program": "?", "timeline": None, "profile": None, "stats": stats}
    if timeline is not None:
        head, rows = timeline
        proc["pid"] = head.get("pid")
        proc["program"] = head.get("program", "?")
        proc["timeline"] = {"interval_ms": head.get("interval_ms"), "rows": rows}
    if stats is not None:
        proc["pid"] = proc["pid"] or stats.get("pid")
        proc["program"] = stats.get("program", proc["program"])
    if profile is None:
        profile, peak = peak, None
    if profile is not None:
        proc["pid"] = profile.get("pid", proc["pid"])
        proc["program"] = profile.get("program", proc["program"])
        raw = profile.get("stacks", []) + (peak.get("stacks", []) if peak else [])
        names = symbolise([fr for st in raw for fr in st.get("frames", [])], cwd)
        table, index, stacks, by_frames = [], {}, [], {}

        def intern(st):
            ids = []
            for fr in st.get("frames", []):
                key = frame_name(fr, names)
                if key not in index:
                    index[key] = len(table)
                    table.append({"fn": key[0], "loc": key[1], "obj": key[2]})
                ids.append(index[key])
            return ids

        for st in profile.get("stacks", []):
            ids = intern(st)
            stack = {"frames": ids, "live_bytes": st.get("live_bytes", 0), "live_count": st.get("live_count", 0),
                     "alloc_bytes": st.get("alloc_bytes", 0), "alloc_count": st.get("alloc_count", 0),
                     "samples": st.get("samples", 0), "samples_live": st.get("samples_live", 0),
                     "freed": st.get("samples_freed", [0, 0, 0]), "freed_remote": st.get("samples_freed_remote", 0),
                     "peak_bytes": 0, "peak_count": 0}
            stacks.append(stack)
            by_frames[tuple(ids)] = stack
        for st in (peak or {}).get("stacks", []):
            ids = tuple(intern(st))
            stack = by_frames.get(ids)
            if stack is None:  # (a stack whose samples the exit profile no longer has: none, normally)
                stack = {"frames": list(ids), "live_bytes": 0, "live_count": 0, "alloc_bytes": 0, "alloc_count": 0,
                         "samples": 0, "samples_live": 0, "freed": [0, 0, 0], "freed_remote": 0,
                         "peak_bytes": 0, "peak_count": 0}
                stacks.append(stack)
                by_frames[ids] = stack
            stack["peak_bytes"] += st.get("live_bytes", 0)
            stack["peak_count"] += st.get("live_count", 0)
        proc["profile"] = {k: profile.get(k) for k in ("rate", "uptime_ms", "live_bytes", "live_count", "alloc_bytes",
                                                       "alloc_count", "lifetime_ms", "sizes")}
        if peak:
            proc["profile"]["peak"] = {"uptime_ms": peak.get("uptime_ms"), "live_bytes": peak.get("live_bytes", 0)}
        proc["profile"]["frames"] = table
        proc["profile"]["stacks"] = stacks
    return proc


def collect(d, cwd):
    """Every process's files in d, by pid."""
    pids = set()
    for pattern, rx in (("timeline.*", r"timeline\.(\d+)$"), ("profile.*.heap.json", r"profile\.(\d+)\.heap\.json$"),
                        ("stats.*.json", r"stats\.(\d+)\.json$")):
        for p in glob.glob(os.path.join(d, pattern)):
            m = re.search(rx, p)
            if m:
                pids.add(int(m.group(1)))
    procs = []
    for pid in sorted(pids):
        tl = os.path.join(d, "timeline.%d" % pid)
        procs.append(build_process(load_json(os.path.join(d, "profile.%d.heap.json" % pid)),
                                   load_timeline(tl) if os.path.exists(tl) else None,
                                   load_json(os.path.join(d, "stats.%d.json" % pid)), cwd,
                                   load_json(os.path.join(d, "profile.%d.heap.peak.json" % pid))))
    return procs


def write_page(out, meta, procs):
    with open(os.path.join(HERE, "hakmem_report.html")) as f:
        page = f.read()
    data = json.dumps({"meta": meta, "processes": procs}, separators=(",", ":"))
    data = data.replace("</", "<\\/")  # (no "</script>" inside the script)
    page = page.replace("/*HAKMEM_REPORT_DATA*/null", data, 1)
    with open(out, "w") as f:
        f.write(page)


def main():
    ap = argparse.ArgumentParser(prog="hakmem report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hakmem", help="libhakmem.so to preload")
    ap.add_argument("-o", "--output", default="hakmem-report.html")
    ap.add_argument("--rate", type=int, default=None, help="bytes per heap-profile sample (HAKMEM_PROFILE_RATE)")
    ap.add_argument("--interval", type=int, default=10, help="milliseconds between timeline points")
    ap.add_argument("--keep", help="keep the raw files in this directory")
    ap.add_argument("--from", dest="from_", metavar="PROFILE.json", help="a profile written by a running program")
    ap.add_argument("--timeline", help="with --from: its HAKMEM_TIMELINE_FILE")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    meta = {"generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host_cpus": os.cpu_count()}

    if a.from_:
        profile = load_json(a.from_)
        if profile is None:
            sys.exit("hakmem report: %s: not a hakmem profile (JSON)" % a.from_)
        tl = load_timeline(a.timeline) if a.timeline else None
        meta["command"] = "--from " + a.from_
        peak = load_json(re.sub(r"\.json$", ".peak.json", a.from_)) if a.from_.endswith(".json") else None
        procs = [build_process(profile, tl, None, os.getcwd(), peak)]
        write_page(a.output, meta, procs)
        print("hakmem report: wrote %s" % a.output, file=sys.stderr)
        return 0

    if not cmd:
        ap.error("no program given (hakmem report [-o FILE] -- PROGRAM ARGS)")
    if not a.hakmem or not os.path.exists(a.hakmem):
        sys.exit("hakmem report: cannot find libhakmem.so (--hakmem)")
    d = a.keep or tempfile.mkdtemp(prefix="hakmem-report.")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ)
    old = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = a.hakmem + (":" + old if old else "")
    env["HAKMEM_PROFILE"] = "1"
    env["HAKMEM_PROFILE_FILE"] = os.path.join(d, "profile.%p.heap")
    env["HAKMEM_TIMELINE_FILE"] = os.path.join(d, "timeline.%p")
    env["HAKMEM_TIMELINE_MS"] = str(a.interval)
    env["HAKMEM_STATS"] = "json"
    env["HAKMEM_STATS_FILE"] = os.path.join(d, "stats.%p.json")
    if a.rate:
        env["HAKMEM_PROFILE_RATE"] = str(a.rate)
    meta["command"] = " ".join(cmd)
    t0 = time.time()
    try:
        rc = subprocess.call(cmd, env=env)
    except OSError as e:
        print("hakmem report: cannot run '%s': %s" % (cmd[0], e.strerror), file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    meta["wall_s"] = round(time.time() - t0, 3)
    meta["exit_status"] = rc
    procs = collect(d, os.getcwd())
    if not procs:
        print("hakmem report: the program wrote no profile (is it linked statically, or setuid?)", file=sys.stderr)
    write_page(a.output, meta, procs)
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)
    print("hakmem report: wrote %s (%d process%s)" % (a.output, len(procs), "" if len(procs) == 1 else "es"),
          file=sys.stderr)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
