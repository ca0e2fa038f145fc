"""fastloader: a drop-in replacement for torch.utils.data.DataLoader.

    from fastloader import DataLoader

Workers are C threads in this process; image datasets (ImageFolder,
ImageList, LMDBDataset) decode and transform JPEGs in C with no Python per
sample, and ArrayDataset gathers rows of memory-mapped .npy files in C.
"""
from __future__ import annotations

from . import _C
from ._C import DecodeError
from .collate import DictCollate
from .loader import DataLoader, PerformanceWarning, WorkerInfo, get_worker_info, sample_rng
from .accelerate_hook import install as _install_accelerate_hook

# accelerator.prepare keeps fastloader loaders; imports nothing (accelerate_hook.py)
_install_accelerate_hook()

__version__ = "0.1.0"

decode_jpeg = _C.decode_jpeg
decode_image = _C.decode_image
read_image_header = _C.read_image_header

# Public names imported on first use, so that `import fastloader` costs a
# script that only swaps the DataLoader no more than the loader itself: the
# datasets and transforms are ~0.5 MiB of code objects that a Python dataset
# never runs.  tools/ stays out of the library altogether (tools/__init__.py).
# loader.py asks for a native dataset without importing datasets.py
# (loader._native_dataset): no instance exists before its module is imported.
_LAZY = {
    "transforms": ("fastloader.transforms", None),
    "NativeTransform": ("fastloader.transforms", "NativeTransform"),
    "ArrayDataset": ("fastloader.arrays", "ArrayDataset"),
    "ImageFolder": ("fastloader.datasets", "ImageFolder"),
    "ImageList": ("fastloader.datasets", "ImageList"),
    "LMDBDataset": ("fastloader.lmdb_dataset", "LMDBDataset"),
    "HFImageDataset": ("fastloader.hf_datasets", "HFImageDataset"),
    "WebDataset": ("fastloader.webdataset", "WebDataset"),
    "resume_state": ("fastloader.elastic", "resume_state"),
    "tune": ("fastloader.tools.tuning", "tune"),
}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    mod = importlib.import_module(where[0])
    value = mod if where[1] is None else getattr(mod, where[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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
    "DictCollate",
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
