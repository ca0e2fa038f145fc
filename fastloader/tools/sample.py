"""Generate an ImageNet-like folder of real JPEG photographs for tests and benchmarks.

The images are derived from the photographs that scikit-image ships in its
``data`` folder (plus matplotlib's sample images when matplotlib is installed):
each output file is a random crop of a random source photo, randomly flipped,
lightly colour/brightness jittered and resized so that the size distribution
resembles ImageNet's (mean about 470 x 390, aspect ratios 3:4 to 16:9, widths
about 250-800), then saved as JPEG with quality 75-95 and 4:2:0 chroma
subsampling.  A few percent of the files are progressive and a few percent
grayscale.  Output is fully deterministic for a given ``seed``.

Layout::

    root/<class_name>/<class_name>_<index>.JPEG
    root/.fastloader-sample.json      (written last; marks a complete folder)

This module deliberately has no dependency on the compiled extension, so it
can be loaded even when ``fastloader._C`` has not been built.
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import sys
import time

from .progress import Progress

__all__ = ["make_sample", "ensure_sample", "default_sample_dir", "MARKER"]

MARKER = ".fastloader-sample.json"
_PARTIAL = ".fastloader-sample.partial"
_FORMAT_VERSION = 1

# Source photographs (file name in skimage/data, weight).  Colour photographs
# get most of the weight; grayscale sources are used for the grayscale share.
_COLOR_SOURCES = [
    ("astronaut.png", 3),
    ("chelsea.png", 3),
    ("coffee.png", 3),
    ("rocket.jpg", 3),
    ("motorcycle_left.png", 2),
    ("motorcycle_right.png", 1),
    ("hubble_deep_field.jpg", 2),
    ("retina.jpg", 1),
    ("ihc.png", 1),
]
_GRAY_SOURCES = [
    ("camera.png", 2),
    ("moon.png", 1),
    ("coins.png", 1),
    ("brick.png", 1),
    ("grass.png", 1),
    ("gravel.png", 1),
]
# matplotlib sample photographs, used only when present (relative to
# matplotlib/mpl-data/sample_data).
_MPL_SOURCES = [("grace_hopper.jpg", 2)]

_GRAY_FRACTION = 0.04
_PROGRESSIVE_FRACTION = 0.04

# Aspect ratio (width / height) mixture, roughly like ImageNet: mostly 4:3
# landscape, some portrait, some square, 3:2 and 16:9.
_ASPECTS = [(4 / 3, 0.48), (3 / 4, 0.16), (1.0, 0.10), (3 / 2, 0.14), (16 / 9, 0.07), (5 / 4, 0.05)]


def default_sample_dir(n: int = 5000, seed: int = 0) -> str:
    """Where :func:`ensure_sample` keeps its folder by default.

    ``$FASTLOADER_CACHE`` overrides the base directory (default
    ``~/.cache/fastloader``).
    """
    base = os.environ.get("FASTLOADER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fastloader")
    name = f"sample-{n}" if seed == 0 else f"sample-{n}-seed{seed}"
    return os.path.join(base, name)


def _skimage_data_dir() -> str:
    # a folder holding copies of the source photographs (for machines that
    # cannot install scikit-image, such as an offline GPU box)
    override = os.environ.get("FASTLOADER_SAMPLE_SOURCES")
    if override:
        if not os.path.isdir(override):
            raise RuntimeError(f"FASTLOADER_SAMPLE_SOURCES={override!r} is not a folder")
        return override
    try:
        import skimage  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "fastloader.tools.sample needs scikit-image for its source photographs; "
            "install it with: pip install scikit-image") from e
    d = os.path.join(os.path.dirname(skimage.__file__), "data")
    if not os.path.isdir(d):  # pragma: no cover
        raise RuntimeError(f"scikit-image data folder not found at {d}; reinstall with: pip install scikit-image")
    return d


def _source_list():
    """Return ([(path, weight, is_gray)], ...) of the source photographs found."""
    d = _skimage_data_dir()
    color, gray = [], []
    for name, w in _COLOR_SOURCES:
        p = os.path.join(d, name)
        if os.path.exists(p):
            color.append((p, w))
    for name, w in _GRAY_SOURCES:
        p = os.path.join(d, name)
        if os.path.exists(p):
            gray.append((p, w))
    try:  # optional extra photographs
        import matplotlib

        md = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data")
        for name, w in _MPL_SOURCES:
            p = os.path.join(md, name)
            if os.path.exists(p):
                color.append((p, w))
    except Exception:
        pass
    if not color:
        raise RuntimeError(f"no source photographs found in {d}; reinstall with: pip install scikit-image")
    return color, gray


def _class_names(classes: int, seed: int):
    rng = random.Random(f"fastloader-classes-{seed}")
    names = set()
    while len(names) < classes:
        names.add("n%08d" % rng.randrange(1_000_000, 16_000_000))
    return sorted(names)


# ----------------------------------------------------------------------------
# per-process state (sources are decoded once per worker process)
_SRC = None


def _load_sources(color, gray):
    from PIL import Image

    out = {"color": [], "gray": []}
    for kind, lst in (("color", color), ("gray", gray)):
        for path, w in lst:
            im = Image.open(path)
            im = im.convert("L" if kind == "gray" else "RGB")
            im.load()
            out[kind].append((im, w))
    return out


def _init_worker(color, gray):
    global _SRC
    _SRC = _load_sources(color, gray)


def _pick(rng, items):
    total = sum(w for _, w in items)
    r = rng.random() * total
    for it, w in items:
        r -= w
        if r < 0:
            return it
    return items[-1][0]


def _target_size(rng):
    """Sample an ImageNet-like (width, height)."""
    total = sum(p for _, p in _ASPECTS)
    r = rng.random() * total
    ar = _ASPECTS[-1][0]
    for a, p in _ASPECTS:
        r -= p
        if r < 0:
            ar = a
            break
    ar *= rng.uniform(0.96, 1.04)  # not every image is exactly 4:3
    # sqrt(area): log-normal around ~415 so the means land near 470 x 390.
    s = rng.lognormvariate(6.03, 0.16)
    s = min(max(s, 230.0), 700.0)
    w = int(round(s * ar ** 0.5))
    h = int(round(s / ar ** 0.5))
    w = min(max(w, 250), 800)
    h = min(max(h, 180), 800)
    return w, h


def _make_one(args):
    """Create image ``index``; return (relpath, width, height, bytes, progressive, gray)."""
    import numpy as np
    from PIL import Image, ImageEnhance

    root, index, cls_name, seed = args
    rng = random.Random(f"fastloader-sample-{seed}-{index}")
    gray = bool(_SRC["gray"]) and rng.random() < _GRAY_FRACTION
    src = _pick(rng, _SRC["gray"] if gray else _SRC["color"])
    tw, th = _target_size(rng)
    # random crop with random scale and roughly the target aspect ratio
    sw, sh = src.size
    crop_ar = (tw / th) * rng.uniform(0.9, 1.1)
    scale = rng.uniform(0.25, 1.0)
    area = scale * sw * sh
    cw = min(sw, max(16, int(round((area * crop_ar) ** 0.5))))
    ch = min(sh, max(16, int(round((area / crop_ar) ** 0.5))))
    x0 = rng.randint(0, sw - cw)
    y0 = rng.randint(0, sh - ch)
    im = src.crop((x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    im = im.resize((tw, th), Image.Resampling.BILINEAR if (tw * th) < (cw * ch) else Image.Resampling.BICUBIC,
                   reducing_gap=None)
    # mild photometric jitter
    im = ImageEnhance.Brightness(im).enhance(rng.uniform(0.8, 1.2))
    im = ImageEnhance.Contrast(im).enhance(rng.uniform(0.85, 1.15))
    if not gray:
        im = ImageEnhance.Color(im).enhance(rng.uniform(0.8, 1.2))
    # Crops of the (small) sources are often upscaled, which leaves them much
    # smoother than real camera photos.  Restore some detail and sensor grain so
    # that bytes per pixel, and hence entropy-decoding cost, are closer to ImageNet.
    im = ImageEnhance.Sharpness(im).enhance(rng.uniform(1.0, 2.0))
    sigma = rng.uniform(3.0, 8.0)
    noise = np.random.default_rng([seed, index]).standard_normal((th, tw, 1 if gray else 3), dtype=np.float32)
    noise *= sigma
    noise += np.asarray(im, dtype=np.float32).reshape(th, tw, -1)
    noise += 0.5
    arr = np.clip(noise, 0, 255, out=noise).astype(np.uint8)
    im = Image.fromarray(arr[:, :, 0] if gray else arr, "L" if gray else "RGB")
    quality = rng.randint(75, 95)
    progressive = rng.random() < _PROGRESSIVE_FRACTION
    buf = io.BytesIO()
    kw = dict(format="JPEG", quality=quality, optimize=False, progressive=progressive)
    if not gray:
        kw["subsampling"] = 2  # 4:2:0
    im.save(buf, **kw)
    data = buf.getvalue()
    rel = os.path.join(cls_name, f"{cls_name}_{index}.JPEG")
    with open(os.path.join(root, rel), "wb") as f:
        f.write(data)
    return rel, tw, th, len(data), progressive, gray


def _looks_like_ours(root: str) -> bool:
    return os.path.exists(os.path.join(root, MARKER)) or os.path.exists(os.path.join(root, _PARTIAL))


def _params(n, seed, classes):
    return {"format": _FORMAT_VERSION, "n": int(n), "seed": int(seed), "classes": int(classes)}


def make_sample(root, n: int = 5000, *, seed: int = 0, classes: int = 10, progress: bool | str = True,
                processes: int | None = None) -> dict:
    """Write ``n`` JPEG files into ``root/<class>/`` and return statistics.

    ``root`` must be missing, empty, or a folder previously written by this
    function (which is then replaced).  ``processes`` defaults to the number
    of CPUs (at most 8); 1 disables multiprocessing.  ``progress``: a
    progress line on stderr when it is a terminal ("always": even when it is
    not; fastloader.tools.progress) and a summary line at the end.  Raises
    RuntimeError if scikit-image is not installed.
    """
    if n < 1 or classes < 1:
        raise ValueError("n and classes must be positive")
    root = os.path.abspath(os.fspath(root))
    color, gray = _source_list()
    if os.path.isdir(root) and os.listdir(root):
        if not _looks_like_ours(root):
            raise FileExistsError(f"{root} exists and is not a fastloader sample folder; refusing to overwrite it")
        shutil.rmtree(root)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, _PARTIAL), "w") as f:
        json.dump(_params(n, seed, classes), f)
    names = _class_names(classes, seed)
    for c in names:
        os.makedirs(os.path.join(root, c), exist_ok=True)
    # class assignment: balanced, then shuffled deterministically
    labels = [names[i % classes] for i in range(n)]
    random.Random(f"fastloader-labels-{seed}").shuffle(labels)
    jobs = [(root, i, labels[i], seed) for i in range(n)]

    if processes is None:
        processes = min(os.cpu_count() or 1, 8)
    processes = max(1, min(processes, (n + 99) // 100))
    t0 = time.perf_counter()
    results = []
    bar = Progress(n, f"fastloader.sample -> {root}", unit="images", show=progress)

    def report(r):
        results.append(r)
        bar.update(1, nbytes=r[3])

    if processes == 1:
        _init_worker(color, gray)
        for j in jobs:
            report(_make_one(j))
    else:
        import multiprocessing as mp

        # fork where available: the children only run PIL, and fork does not need
        # this module to be importable by name (it may have been loaded from a
        # file path while the compiled extension is not built yet).
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else "spawn")
        with ctx.Pool(processes, initializer=_init_worker, initargs=(color, gray)) as pool:
            for r in pool.imap(_make_one, jobs, chunksize=32):
                report(r)
    bar.close()
    elapsed = time.perf_counter() - t0

    ws = [r[1] for r in results]
    hs = [r[2] for r in results]
    bs = [r[3] for r in results]
    stats = dict(
        _params(n, seed, classes),
        root=root,
        class_names=names,
        mean_width=sum(ws) / n,
        mean_height=sum(hs) / n,
        min_width=min(ws), max_width=max(ws),
        min_height=min(hs), max_height=max(hs),
        mean_bytes=sum(bs) / n,
        total_bytes=sum(bs),
        progressive=sum(1 for r in results if r[4]),
        grayscale=sum(1 for r in results if r[5]),
        sources=[os.path.basename(p) for p, _ in color + gray],
        seconds=round(elapsed, 3),
        processes=processes,
    )
    with open(os.path.join(root, MARKER), "w") as f:
        json.dump(stats, f, indent=1)
    os.remove(os.path.join(root, _PARTIAL))
    if progress:
        print(f"fastloader.sample: {n} images, mean {stats['mean_width']:.0f} x {stats['mean_height']:.0f}, "
              f"mean {stats['mean_bytes'] / 1024:.1f} KiB, {stats['progressive']} progressive, "
              f"{stats['grayscale']} grayscale, {elapsed:.1f} s", file=sys.stderr)
    return stats


def read_stats(root) -> dict | None:
    """Return the statistics stored in a complete sample folder, or None."""
    try:
        with open(os.path.join(os.fspath(root), MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure_sample(n: int = 5000, root=None, *, seed: int = 0, classes: int = 10, progress: bool = True) -> str:
    """Return the path of a complete sample folder, creating it if needed.

    An existing folder is reused when its marker file records the same
    parameters; otherwise it is regenerated.
    """
    root = os.path.abspath(os.fspath(root)) if root is not None else default_sample_dir(n, seed)
    st = read_stats(root)
    want = _params(n, seed, classes)
    if st is not None and all(st.get(k) == v for k, v in want.items()) and not os.path.exists(
            os.path.join(root, _PARTIAL)):
        return root
    make_sample(root, n, seed=seed, classes=classes, progress=progress)
    return root


def _main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastloader.tools.sample", description=__doc__.split("\n\n")[0])
    p.add_argument("root", nargs="?", help="output folder (default: %(default)s -> default_sample_dir())")
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--processes", type=int, default=None)
    a = p.parse_args(argv)
    root = a.root or default_sample_dir(a.n, a.seed)
    st = make_sample(root, a.n, seed=a.seed, classes=a.classes, processes=a.processes)
    st.pop("class_names")
    print(json.dumps(st, indent=1))


if __name__ == "__main__":
    _main()
