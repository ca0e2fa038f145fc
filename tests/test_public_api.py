"""The public names and the _C stub stay in step with what the module exports."""
import ast
import os

import fastloader
from fastloader import _C


def test_public_names():
    for name in ["DataLoader", "DecodeError", "ImageFolder", "ImageList", "NativeTransform", "PerformanceWarning",
                 "WorkerInfo", "build_info", "decode_jpeg", "get_worker_info", "sample_rng", "transforms"]:
        assert hasattr(fastloader, name), name
    assert issubclass(fastloader.DecodeError, ValueError)


def test_stub_lists_every_public_member_of_C():
    stub = os.path.join(os.path.dirname(fastloader.__file__), "_C.pyi")
    tree = ast.parse(open(stub).read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    exported = {n for n in dir(_C) if not n.startswith("__")}
    assert exported <= names, exported - names


def test_build_info_reports_versions():
    info = fastloader.build_info()
    assert info["libjpeg_turbo"].startswith("2.") or info["libjpeg_turbo"].startswith("3.")
    assert info["fastloader"] == fastloader.__version__
    assert set(info["cuda"]) >= {"found", "devices", "runtime_version", "error"}
