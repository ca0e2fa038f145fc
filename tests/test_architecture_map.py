"""The plan of the house, kept true: docs/architecture.md names every source
file of csrc/ and fastloader/, csrc/ is laid out by layer with its include
rules kept, and the package has no import cycle."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# csrc/ folder -> the folders its files may include (besides system headers).
# An arrow only points down: binding over native over image and sources
# (siblings) over cuda over core; core includes nothing of the project.
LAYERS = {
    "core": {"core"},
    "cuda": {"cuda", "core"},
    "image": {"image", "core"},
    "sources": {"sources", "core"},
    "native": {"native", "image", "sources", "core"},
    "binding": {"binding", "native", "image", "sources", "cuda", "core"},
}


def _walk(folder, exts):
    top = os.path.join(ROOT, folder)
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            if name.endswith(exts):
                yield os.path.relpath(os.path.join(d, name), ROOT).replace(os.sep, "/")


def _sources():
    yield from _walk("csrc", (".c", ".h"))
    yield from _walk("fastloader", (".py", ".pyi", ".typed"))


def test_every_source_file_is_in_the_module_map():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    table = text[text.index("## Module map"):]
    named = set(re.findall(r"`((?:csrc|fastloader)/[^`]+)`", table))
    missing = [p for p in _sources() if p not in named]
    assert not missing, f"add these to docs/architecture.md's module map: {missing}"
    gone = [p for p in named if not os.path.exists(os.path.join(ROOT, p))]
    assert not gone, f"the module map names files that do not exist: {gone}"


# ---- csrc/ by layer -------------------------------------------------------------

_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def include_violations(files):
    """The broken layer rules among `files` ({path under csrc/: source text}):
    a list of one line each, empty when the layout holds.  Project headers are
    named by their layer path ("core/err.h"), so a rule is a prefix check."""
    bad = []
    for path, src in sorted(files.items()):
        parts = path.split("/")
        if len(parts) != 2 or parts[0] not in LAYERS:
            bad.append(f"{path}: not in a layer folder ({', '.join(sorted(LAYERS))})")
            continue
        layer = parts[0]
        for kind, name in _INCLUDE.findall(src):
            if kind == "<":
                if name == "Python.h" and layer != "binding":
                    bad.append(f"{path}: includes Python.h outside binding/")
                continue
            target = name.split("/")[0] if "/" in name else None
            if target is None:
                bad.append(f'{path}: includes "{name}" without its layer folder')
            elif target not in LAYERS:
                bad.append(f'{path}: includes "{name}", not a layer')
            elif target not in LAYERS[layer]:
                bad.append(f'{path}: {layer}/ includes {name} ({layer}/ may include only '
                           f'{", ".join(sorted(LAYERS[layer]))})')
    return bad


def _csrc_files():
    return {p[len("csrc/"):]: open(os.path.join(ROOT, p), encoding="utf-8").read()
            for p in _walk("csrc", (".c", ".h"))}


def test_csrc_keeps_its_layer_rules():
    bad = include_violations(_csrc_files())
    assert not bad, "\n".join(bad)


def test_every_include_names_a_file_that_exists():
    files = _csrc_files()
    for path, src in files.items():
        for kind, name in _INCLUDE.findall(src):
            if kind == '"':
                assert name in files, f"{path} includes {name}, which is not in csrc/"


@pytest.mark.parametrize("path, src, why", [
    ("core/pool.c", '#include "cuda/cuda.h"\n', "core/ includes cuda/cuda.h"),
    ("sources/shards.c", '#include "native/native.h"\n', "sources/ includes native/native.h"),
    ("sources/tar.h", '#include "image/jpeg.h"\n', "sources/ includes image/jpeg.h"),
    ("image/jpeg.c", '#include "sources/source.h"\n', "image/ includes sources/source.h"),
    ("native/native.c", '#include "binding/binding.h"\n', "native/ includes binding/binding.h"),
    ("image/plan.c", "#include <Python.h>\n", "Python.h outside binding/"),
    ("core/rng.h", '#include "err.h"\n', "without its layer folder"),
    ("engine.c", "", "not in a layer folder"),
])
def test_the_layer_check_catches_each_kind_of_break(path, src, why):
    bad = include_violations({path: src})
    assert len(bad) == 1 and path in bad[0] and why in bad[0], bad


def test_the_layer_check_accepts_what_each_layer_may_include():
    ok = {"binding/py_x.c": '#include <Python.h>\n#include "native/native.h"\n#include "cuda/cuda.h"\n',
          "native/native.c": '#include "image/jpeg.h"\n#include "sources/source.h"\n#include "core/err.h"\n',
          "cuda/cuda.h": '#include "core/pin.h"\n#include <stddef.h>\n',
          "core/pool.c": '#include "core/pin.h"\n#include <pthread.h>\n'}
    assert include_violations(ok) == []


def test_core_errors_have_one_shape():
    """Every failing core function fills an fl_err (core/err.h): no message
    buffer with a length beside it, the shape the CUDA layer used to have."""
    for path, src in _csrc_files().items():
        if path.startswith("binding/"):
            continue
        assert not re.search(r"char\s*\*\s*(err|msg)\s*,\s*size_t", src), path


def test_only_the_translator_makes_exceptions_from_core_errors():
    """binding/py_errors.c is the one translator: no other binding file turns
    an errno or a core record's message into an exception itself (so each
    FL_ERR_IO gets its subclass and each code its type)."""
    for path, src in _csrc_files().items():
        if path.startswith("binding/") and path != "binding/py_errors.c":
            assert "PyErr_SetFromErrno" not in src, path
            assert not re.search(r"PyErr_\w+\([^;]*(\.|->)msg\b", src), path


# ---- the package ------------------------------------------------------------------

def _modules():
    """{dotted name inside the package ("loader", "tools.cli", "tools.tuning"
    for a package's __init__): path}."""
    pkg = os.path.join(ROOT, "fastloader")
    mods = {}
    for p in _walk("fastloader", (".py",)):
        rel = p[len("fastloader/"):-3].split("/")
        if rel[-1] == "__init__":
            rel = rel[:-1]
        if rel:
            mods[".".join(rel)] = os.path.join(ROOT, p)
    assert "loader" in mods, pkg
    return mods


def package_imports():
    """{module: {modules of the package it imports}}, counting imports inside
    functions too (a lazy import is still a dependency).  A package's
    __init__ is not counted as a dependency of its own submodules."""
    mods = _modules()

    def resolve(parts):
        for n in range(len(parts), 0, -1):
            name = ".".join(parts[:n])
            if name in mods:
                return name
        return None

    graph = {}
    for m, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        here = m.split(".") if is_pkg else m.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                    mod = base + (node.module.split(".") if node.module else [])
                elif node.module and node.module.startswith("fastloader."):
                    mod = node.module.split(".")[1:]
                elif node.module == "fastloader":
                    mod = []
                else:
                    continue
                targets += [mod + [a.name] for a in node.names] + ([mod] if mod else [])
            elif isinstance(node, ast.Import):
                targets += [a.name.split(".")[1:] for a in node.names if a.name.startswith("fastloader.")]
            for t in targets:
                d = resolve(t)
                if d and d != m and not m.startswith(d + "."):
                    deps.add(d)
        graph[m] = deps
    return graph


def test_no_import_cycles_in_the_package():
    graph = package_imports()
    assert graph["loader"] >= {"backends", "collate"}, graph["loader"]  # the parser sees imports
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
