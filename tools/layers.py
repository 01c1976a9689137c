#!/usr/bin/env python3
"""Count the calls between src/ files that run against the layering.

Each file of src/ has a layer (LAYERS below: lower layers never call higher
ones). The tool reads the symbols each object file defines and uses (nm), so
it sees exactly what the linker sees, and counts, for every use of a symbol
defined in a file of a higher layer, the places in the using file's source
that name it. It also prints the cycles of the file graph (its strongly
connected components of more than one file).

usage: tools/layers.py [BUILD_DIR]   (default build; run `make build` first)
Exit status 1 if any call runs upward, the files form a cycle, or no object
file is found; 2 on a file with no layer.
"""
import os, re, subprocess, sys
from collections import defaultdict

# Lowest first. Files of one layer may call each other but form no cycle.
LAYERS = [
    ["os.c"],                                                      # every system call
    ["error.c"],
    ["options.c", "keys.c"],                                       # settings; the secret and derived keys
    ["stats.c", "purger.c", "limits.c"],                           # counters; the purger thread; memory limits
    ["sizeclass.c", "arena.c"],                                    # geometry, address space
    ["region.c"],                                                  # slab spans
    ["page.c", "secure.c"],                                        # one page's blocks
    ["spares.c", "lend.c", "abandoned.c"],                         # a heap's pages, off the queues
    ["queue.c"],                                                   # a heap's queues, the page search
    ["remote.c"],                                                  # frees of other heaps' blocks
    ["heap.c", "large.c", "profile.c"],                                         # heaps' life cycle, the large tier
    ["pressure.c"],                                                # giving memory back
    ["init.c"],                                                    # initialisation, fork
    ["thread.c"],                                                  # a thread's heap, malloc's slow path
    ["alloc.c", "free.c", "inspect.c", "validate.c", "user_heap.c"], # the front; what a program reads; its heaps
    ["override.c", "new_delete.c", "new_handler.cpp"],             # the exported names
]
RANK = {f: i for i, layer in enumerate(LAYERS) for f in layer}

def objects(build):
    d = os.path.join(build, "CMakeFiles", "hakmem_static.dir", "src")
    return {f[:-2]: os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".o")}

def nm(path):
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRVW" and not parts[2].startswith("."):
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used

def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    objs = objects(build) if os.path.isdir(os.path.join(build, "CMakeFiles", "hakmem_static.dir", "src")) else {}
    if not objs:
        sys.exit(f"layers.py: no object files of hakmem_static in {build} (build it first)")
    owner, uses = {}, {}
    for f, path in objs.items():
        defined, used = nm(path)
        for s in defined:
            owner[s] = f
        uses[f] = used
    missing = [f for f in objs if f not in RANK]
    if missing:
        print("no layer for:", ", ".join(missing))
        return 2
    edges = defaultdict(set)
    upward = []
    for f, used in uses.items():
        src = open(os.path.join(root, "src", f), encoding="utf-8").read()
        for s in sorted(used):
            g = owner.get(s)
            if g is None or g == f:
                continue
            edges[f].add(g)
            if RANK[g] > RANK[f]:
                sites = len(re.findall(r"\b%s\b" % re.escape(s), src))
                upward.append((f, g, s, sites))
    # strongly connected components (Tarjan)
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            c = []
            while True:
                w = stack.pop(); on.discard(w); c.append(w)
                if w == v: break
            comps.append(c)
    for v in sorted(objs):
        if v not in index:
            visit(v)
    cycles = [sorted(c) for c in comps if len(c) > 1]
    for f, g, s, sites in upward:
        print(f"upward: {f} -> {g}: {s} ({sites} place{'s' if sites != 1 else ''})")
    print(f"files: {len(objs)}; upward uses: {len(upward)} symbols, "
          f"{sum(u[3] for u in upward)} places in the source")
    for c in cycles:
        print(f"cycle of {len(c)} files: {' '.join(c)}")
    if not cycles:
        print("no cycles")
    return 1 if upward or cycles else 0

if __name__ == "__main__":
    sys.exit(main())
