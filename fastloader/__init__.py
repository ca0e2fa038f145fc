"""fastloader: a drop-in replacement for torch.utils.data.DataLoader.

    from fastloader import DataLoader

Workers are C threads in this process; image datasets (ImageFolder,
ImageList, LMDBDataset) decode and transform JPEGs in C with no Python per
sample, and ArrayDataset gathers rows of memory-mapped .npy files in C.
"""
from __future__ import annotations

from . import _C
from ._C import DecodeError
from . import transforms
from .transforms import NativeTransform
from .arrays import ArrayDataset
from .datasets import ImageFolder, ImageList
from .lmdb_dataset import LMDBDataset
from .hf_datasets import HFImageDataset
from .webdataset import WebDataset
from .loader import DataLoader, PerformanceWarning, WorkerInfo, get_worker_info, sample_rng
from .accelerate_hook import install as _install_accelerate_hook
from .elastic import resume_state

# accelerator.prepare keeps fastloader loaders; imports nothing (accelerate_hook.py)
_install_accelerate_hook()

__version__ = "0.1.0"

decode_jpeg = _C.decode_jpeg
decode_image = _C.decode_image
read_image_header = _C.read_image_header

# public names that live in tools/: imported on first use, so the library
# never imports tools/ (tools/__init__.py) and `import fastloader` stays lean
_TOOL_NAMES = {"tune": "fastloader.tools.tuning"}


def __getattr__(name):
    mod = _TOOL_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_TOOL_NAMES))


def build_info() -> dict:
    """Versions and features of this build: fastloader, libjpeg-turbo, libspng, libdeflate, libwebp, CUDA."""
    return {
        "fastloader": __version__,
        "libjpeg_turbo": _C.libjpeg_turbo_version,
        "jpeg_lib_version": _C.jpeg_lib_version,
        "libspng": _C.libspng_version,
        "libdeflate": _C.libdeflate_version,
        "libwebp": _C.libwebp_version,
        "cuda": _C.cuda_info(),  # CUDA is loaded at run time (dlopen), never linked
    }


__all__ = [
    "ArrayDataset",
    "DataLoader",
    "DecodeError",
    "HFImageDataset",
    "ImageFolder",
    "ImageList",
    "LMDBDataset",
    "NativeTransform",
    "PerformanceWarning",
    "WorkerInfo",
    "build_info",
    "decode_image",
    "decode_jpeg",
    "get_worker_info",
    "read_image_header",
    "sample_rng",
    "transforms",
    "tune",
    "WebDataset",
]
