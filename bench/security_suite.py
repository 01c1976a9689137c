#!/usr/bin/env python3
"""mimalloc-bench's security tests under hakmem's modes and the peers.

usage: bench/security_suite.py DIR [--write]

DIR holds the test programs of mimalloc-bench's bench/security (its
CMake build makes them, e.g. out/bench/security: one program per misuse,
most in three sizes, 8 B, 4 KiB and 256 KiB; build it yourself, nothing of
it is in this repository). Each program misuses one block (an overflow, an
underflow, a double or invalid free, a use after free, ...) and prints
NOT_CAUGHT when the allocator let it through. Each runs once under glibc,
hakmem (build/libhakmem.so, or HAKMEM_LIB) in its three modes, and each
peer found (mimalloc, jemalloc, tcmalloc; Scudo from LLVM's compiler-rt,
Debian's libclang-rt-dev), and is classed as mimalloc-bench's bench.sh
classes it: caught (no NOT_CAUGHT), not caught, a late crash (NOT_CAUGHT,
then a crash), or a timeout (5 s). Caught counts what the test program saw,
whatever stopped it: an allocator's report, or a fault where a write met
unmapped memory or a guard page. --write puts the table into
docs/SAFETY.md (between its "security suite" markers), naming the command,
date and commit.
"""
import argparse, glob, os, subprocess, sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from docs_results import run_label, splice  # noqa: E402
from runner import PEERS, find_shared_lib  # noqa: E402

# the kinds of misuse, by the test programs' name prefixes
KINDS = [
    ("overflows", ("one_byte_overflow", "one_byte_memcpy_overflow", "32_byte_overflow", "32_byte_memcpy_overflow",
                   "one_mbyte_overflow", "one_mbyte_memcpy_overflow")),
    ("underflows", ("one_byte_underflow", "one_byte_memcpy_underflow", "32_byte_underflow", "32_byte_memcpy_underflow",
                    "one_mbyte_underflow", "one_mbyte_memcpy_underflow")),
    ("double frees", ("double_free",)),
    ("invalid frees and deletes", ("invalid_free", "invalid_delete", "invalid_array_delete", "delete_type_size")),
    ("use after free", ("write_after_free", "zero_after_free", "read_zero_size_free", "write_zero_size_free")),
    ("reuse and zeroing", ("malloc_reuse", "realloc_reuse", "zero_on_malloc", "read_zero_size", "write_zero_size")),
    ("other", ("executable_heap", "impossibly_large_malloc")),
]


def kind_of(name):
    for kind, prefixes in KINDS:
        if name.startswith(prefixes):
            return kind
    return "other"


def allocators():
    hk = os.environ.get("HAKMEM_LIB", os.path.join(REPO, "build", "libhakmem.so"))
    if not os.path.exists(hk):
        sys.exit(f"security_suite.py: {hk} not found (make build)")
    out = [("glibc", {}), ("hakmem", {"LD_PRELOAD": hk}), ("hakmem =1", {"LD_PRELOAD": hk, "HAKMEM_SECURE": "1"}),
           ("hakmem =2", {"LD_PRELOAD": hk, "HAKMEM_SECURE": "2"})]
    for name, soname, _ in PEERS:
        path = find_shared_lib(soname)
        if path:
            out.append((name, {"LD_PRELOAD": path}))
    scudo = sorted(glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.scudo_standalone-x86_64.so"))
    if scudo:
        out.append(("Scudo", {"LD_PRELOAD": scudo[-1]}))
    return out


def run(prog, extra):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(extra)
    try:
        p = subprocess.run([prog], env=env, capture_output=True, timeout=5)
    except subprocess.TimeoutExpired as e:
        return "late timeout" if b"NOT_CAUGHT" in (e.stdout or b"") else "timeout"
    if b"NOT_CAUGHT" not in p.stdout:
        return "caught"
    return "late crash" if p.returncode != 0 else "not caught"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    progs = sorted(p for p in glob.glob(os.path.join(args.dir, "*"))
                   if os.path.isfile(p) and os.access(p, os.X_OK))
    if not progs:
        sys.exit(f"security_suite.py: no test programs in {args.dir}")
    allocs = allocators()
    result = {a: {os.path.basename(p): run(p, extra) for p in progs} for a, extra in allocs}
    names = [os.path.basename(p) for p in progs]
    kinds = [k for k, _ in KINDS if any(kind_of(n) == k for n in names)]
    head = "| tests | " + " | ".join(a for a, _ in allocs) + " |"
    lines = [head, "|---|" + "---:|" * len(allocs)]
    for k in kinds:
        ns = [n for n in names if kind_of(n) == k]
        lines.append(f"| {k} ({len(ns)}) | " +
                     " | ".join(str(sum(result[a][n] == "caught" for n in ns)) for a, _ in allocs) + " |")
    lines.append(f"| **all ({len(names)})** | " +
                 " | ".join(f"**{sum(v == 'caught' for v in result[a].values())}**" for a, _ in allocs) + " |")
    odd = [f"{a}: {n} {r}" for a, _ in allocs for n, r in result[a].items() if r not in ("caught", "not caught")]
    label = run_label()
    body = (f"`python3 bench/security_suite.py DIR --write` ({label}; mimalloc-bench's `bench/security`, "
            f"{len(names)} programs): how many of each kind each allocator caught.\n\n" + "\n".join(lines) + "\n")
    if odd:
        body += "\nNeither caught nor let through: " + "; ".join(odd) + ".\n"
    print(body)
    for a, _ in allocs:
        missed = sorted(n for n, r in result[a].items() if r != "caught")
        print(f"{a} not caught ({len(missed)}): {' '.join(missed)}\n")
    if args.write:
        path = os.path.join(REPO, "docs", "SAFETY.md")
        text = open(path).read()
        open(path, "w").write(splice(text, "security suite", body, by="bench/security_suite.py"))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
