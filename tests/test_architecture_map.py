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
