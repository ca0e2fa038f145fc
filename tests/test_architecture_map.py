"""docs/architecture.md names every source file of csrc/ and fastloader/."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources():
    for folder, exts in (("csrc", (".c", ".h")), ("fastloader", (".py", ".pyi", ".typed"))):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(exts):
                yield f"{folder}/{name}"


def test_every_source_file_is_in_the_module_map():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    table = text[text.index("## Module map"):]
    named = set(re.findall(r"`((?:csrc|fastloader)/[^`]+)`", table))
    missing = [p for p in _sources() if p not in named]
    assert not missing, f"add these to docs/architecture.md's module map: {missing}"
    gone = [p for p in named if not os.path.exists(os.path.join(ROOT, p))]
    assert not gone, f"the module map names files that do not exist: {gone}"


def test_python_h_only_in_binding_files():
    """The core files never include Python.h (binding files are module.c and py_*.c)."""
    for p in _sources():
        if not p.startswith("csrc/"):
            continue
        name = os.path.basename(p)
        if name == "module.c" or name.startswith("py") or name == "binding.h":
            continue
        src = open(os.path.join(ROOT, p), encoding="utf-8").read()
        assert not re.search(r'#include\s*[<"](Python\.h|binding\.h)', src), p


def _package_imports():
    """{module: {modules of the package it imports}}, counting imports inside
    functions too (a lazy import is still a dependency)."""
    import ast

    pkg = os.path.join(ROOT, "fastloader")
    mods = {n[:-3] for n in os.listdir(pkg) if n.endswith(".py")}
    graph = {}
    for m in mods:
        tree = ast.parse(open(os.path.join(pkg, m + ".py"), encoding="utf-8").read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps.update(a.name for a in node.names)
                elif node.module and node.module.startswith("fastloader."):
                    deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("fastloader."))
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def test_no_import_cycles_in_the_package():
    graph = _package_imports()
    assert graph["loader"] >= {"backends", "datasets"}, graph["loader"]  # the parser sees imports
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
