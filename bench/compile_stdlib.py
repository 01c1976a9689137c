# Compile the standard library's modules, keeping their code objects.
import pathlib, sys
code = []
for p in sorted(pathlib.Path(sys.prefix, "lib", "python%d.%d" % sys.version_info[:2]).rglob("*.py")):
    if "test" in p.parts or "idlelib" in p.parts:
        continue
    try:
        code.append(compile(p.read_text(errors="replace"), str(p), "exec"))
    except (SyntaxError, ValueError):
        pass
print(len(code), "modules compiled")
