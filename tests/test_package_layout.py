"""fastloader/ by role: the library at the top level, the tools in fastloader/tools/.

Read from the source (AST), counting imports inside functions too: a lazy
import is still a dependency.

1. No library module imports fastloader.tools, except fastloader/__init__.py
   (public names that live in tools/, imported on first use) and
   fastloader/__main__.py (it only calls tools/cli.py).
2. No private name crosses modules of the package: what two modules share is
   public in one of them.  Private *modules* (``_worker``, ``_procworkers``)
   may be imported; the names taken from them must be public.  The extension
   ``_C`` is exempt: its underscore names (``_C._error``, the test-only
   bindings) are the C binding's, named in csrc/.
"""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "fastloader")
TOOLS = "fastloader.tools"
MAY_IMPORT_TOOLS = {"fastloader", "fastloader.__main__"}


def _modules():
    """{dotted name: path} of every .py file of the package."""
    out = {}
    for folder, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_module(dotted):
    return dotted in MODULES or dotted == "fastloader._C"


def _base(mod, path, node):
    """The absolute module an ImportFrom names (``from ..x import y`` -> fastloader.x)."""
    if not node.level:
        return node.module or ""
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    parts = pkg.split(".")
    parts = parts[:len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(mod, path):
    """[(line, imported module or name, dotted), ...] of the package, and
    {local name: dotted module} for the names bound to modules of the package."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _base(mod, path, node)
            if base != "fastloader" and not base.startswith("fastloader."):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                found.append((node.lineno, base, a.name, full))
                if _is_module(full):
                    bound[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "fastloader" or a.name.startswith("fastloader."):
                    found.append((node.lineno, a.name, None, a.name))
                    if a.asname:
                        bound[a.asname] = a.name
                    else:
                        bound["fastloader"] = "fastloader"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in ("import_module", "__import__") and node.args[0].value.startswith("fastloader"):
                found.append((node.lineno, node.args[0].value, None, node.args[0].value))
    return tree, found, bound


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def test_the_parser_sees_the_imports():
    assert "fastloader.loader" in MODULES and "fastloader.tools.tuning" in MODULES
    fulls = {f for _, _, _, f in _imports("fastloader.__main__", MODULES["fastloader.__main__"])[1]}
    assert "fastloader.tools.cli.main" in fulls, fulls
    fulls = {f for _, _, _, f in _imports("fastloader.tools.doctor", MODULES["fastloader.tools.doctor"])[1]}
    assert "fastloader.sysinfo.cpu_quota" in fulls and "fastloader.tools.tuning.memory.predict_peak_mib" in fulls


def test_the_library_never_imports_tools():
    bad = []
    for mod, path in MODULES.items():
        if mod == TOOLS or mod.startswith(TOOLS + ".") or mod in MAY_IMPORT_TOOLS:
            continue
        for line, base, name, full in _imports(mod, path)[1]:
            if full == TOOLS or full.startswith(TOOLS + ".") or base.startswith(TOOLS):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line}: imports {full}")
    assert not bad, "the library imports tools/:\n" + "\n".join(bad)


def test_fastloader_imports_tools_only_on_first_use():
    """`import fastloader` loads nothing of tools/; fastloader.tune is then tools' tune."""
    code = ("import sys, fastloader\n"
            "assert not [m for m in sys.modules if m.startswith('fastloader.tools')], sorted(sys.modules)\n"
            "import fastloader.tools.tuning as T\n"
            "assert fastloader.tune is T.tune and 'tune' in dir(fastloader)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_no_private_name_crosses_modules():
    bad = []
    for mod, path in MODULES.items():
        tree, found, bound = _imports(mod, path)
        rel = os.path.relpath(path, ROOT)
        for line, base, name, full in found:
            if name is None or base == "fastloader._C" or not _is_private(name) or _is_module(full):
                continue
            bad.append(f"{rel}:{line}: from {base} import {name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if not (isinstance(v, ast.Name) and v.id in bound):
                continue
            owner = ".".join([bound[v.id]] + chain[::-1])
            if owner == "fastloader._C" or owner == mod or not _is_module(owner) \
                    or _is_module(f"{owner}.{node.attr}"):
                continue
            bad.append(f"{rel}:{node.lineno}: {owner}.{node.attr}")
    assert not bad, "private names used from another module (make them public where defined):\n" + "\n".join(bad)


def test_every_module_states_its_responsibility():
    missing = [os.path.relpath(p, ROOT) for p in MODULES.values()
               if not ast.get_docstring(ast.parse(open(p, encoding="utf-8").read()))]
    assert not missing, f"modules without a docstring: {missing}"
