"""Converters from an ImageFolder to the layouts fastloader streams from:
``python -m fastloader pack FORMAT SRC_DIR OUT ...``.

The source is read exactly as ``fastloader.ImageFolder(SRC_DIR)`` (and
torchvision's) reads it -- the same scan (datasets.find_classes and
make_dataset): class folders in sorted order, their index the class label,
the same image extensions, files in the same order.  Bytes are copied
unchanged: nothing is decoded or re-encoded, so a damaged file is packed as
it is and the loader's ``on_error`` deals with it.

shards -- tar files in the WebDataset layout (``pack_shards``)::

    OUT_DIR/shard-000000.tar, shard-000001.tar, ...   (--prefix names them)
    OUT_DIR/index.json                               (written last)

  Each sample is two tar members with the same key, in this order (the
  order webdataset's own ShardWriter writes, extensions sorted):
  ``<key>.cls``, the class index as ASCII decimal (webdataset decodes .cls
  with int()), and ``<key>.<ext>``, the image file's bytes with the file's
  extension lower-cased (jpg, jpeg, png, webp, ...).  Nothing else: class
  names are in index.json.

  Keys are the sample's index in ImageFolder order, zero-padded to at
  least 6 digits: ``ImageFolder(SRC_DIR).samples[int(key)]`` is the file a
  sample came from, so an error that names a key names the source file.
  Keys are never derived from file names: webdataset splits a member name
  at the first '.' of its base name, so a key must not contain one, and
  any rewriting of names ("a.b.jpg" -> "a_b") can make two files collide
  ("a_b.jpg", or "x.jpg" next to "x.png").

  Samples are shuffled by default (seed 0): ImageFolder order puts each
  class's files together, so unshuffled shards each hold one or two
  classes, and a streaming reader -- which shuffles only shard order and a
  buffer of a few thousand samples -- would then give batches of one or
  two classes.  Shuffling once at pack time is what WebDataset's authors
  recommend.  ``shuffle_seed=None`` (--no-shuffle) keeps ImageFolder order
  (a validation set, or a pack to compare with the folder).

  A shard is closed before adding a sample would make the file larger
  than ``shard_size`` bytes (counting tar headers, padding and the two end
  blocks; a sample larger than that on its own gets a shard of its own)
  or would make it hold more than ``max_count`` samples.

  index.json: {"format": "webdataset", "version": 1, "shards": [file
  names], "counts": [samples per shard], "classes": [class names, index =
  label], "total": samples, "shuffle_seed": seed or null}.  The counts give
  a nominal epoch length without reading the shards.

  Output is deterministic: the same folder gives byte-identical shards and
  index (tar headers in ustar format with mtime 0, uid/gid 0, empty
  user/group names, mode 0o444).  Each shard is written under
  ``<name>.tmp``, flushed to disk and then renamed, so a shard under its
  final name is always complete; if packing fails, the shards written so
  far are removed again.  An OUT_DIR that already holds .tar files or an
  index.json is refused unless ``overwrite``, which first removes
  index.json and ``<prefix>-NNNNNN.tar`` files (other files are left).

Adding a format: write ``pack_<format>()``, an ``add_arguments`` for its
own options and a ``run`` that calls it, and add one ``Format`` to
``FORMATS``; the positional SRC_DIR and OUT and the shared flags (--overwrite,
--quiet, --progress, --json) come from ``add_arguments`` below.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import stat
import sys
import tarfile
import time
from typing import Callable, NamedTuple

from .progress import Progress
from .sizes import parse_size

__all__ = ["pack_shards", "FORMATS"]

INDEX = "index.json"
_BLOCK = tarfile.BLOCKSIZE  # 512: header size and data granule


# ----------------------------------------------------------------------------
# the source folder


def _scan(src):
    """(classes, [(path, label)]) of an ImageFolder, in its order; errors name `src`."""
    from ..datasets import find_classes, make_dataset

    src = os.path.abspath(os.fspath(src))
    if not os.path.exists(src):
        raise FileNotFoundError(f"source folder {src} does not exist")
    if not os.path.isdir(src):
        raise NotADirectoryError(f"source {src} is not a folder (expected SRC_DIR/<class>/<images>)")
    classes, class_to_idx = find_classes(src)  # no class folder: FileNotFoundError naming src
    try:
        samples = make_dataset(src, class_to_idx)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{src}: {e}") from None
    return classes, samples


def _read(path) -> bytes:
    """The bytes of regular file `path`; OSError naming it otherwise (a FIFO
    or device is refused without blocking, as csrc/sources/source.c does)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise OSError(e.errno, f"cannot read {path}: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"cannot read {path}: not a regular file")
        chunks, left = [], st.st_size
        while True:  # to EOF, not st_size: a file may grow or shrink while read
            b = os.read(fd, max(left, 1 << 16))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError as e:
        if e.errno is None:
            raise
        raise OSError(e.errno, f"cannot read {path}: {e.strerror}", path) from None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------
# tar shards


def _tar_bytes(payload: int) -> int:
    """Bytes one member of `payload` bytes takes in a tar: header + padded data."""
    return _BLOCK + -(-payload // _BLOCK) * _BLOCK


def _tar_file_size(members: int) -> int:
    """Size of a finished shard whose members take `members` bytes: the two
    zero end blocks follow, and nothing else.  (tarfile would also pad the
    file to a 10 KiB record, a tape-drive convention no reader needs -- GNU
    tar, Python's tarfile and webdataset read these files -- and which
    would make shards below 10 KiB impossible.)"""
    return members + 2 * _BLOCK


def _header(name: str, size: int) -> bytes:
    """A ustar header with nothing that varies between runs or machines."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


class _ShardWriter:
    """Writes <prefix>-NNNNNN.tar files one at a time, each under a .tmp
    name until complete; remembers what it wrote (for the index, and to
    remove it again if packing fails)."""

    def __init__(self, out_dir, prefix, shard_size, max_count):
        self.out_dir, self.prefix = out_dir, prefix
        self.shard_size, self.max_count = shard_size, max_count
        self.names, self.counts, self.sizes = [], [], []
        self._file = self._tmp = None
        self._count = self._members = 0

    def add(self, key: str, fields) -> None:
        """Add one sample: `fields` is [(extension, bytes)] in member order."""
        need = sum(_tar_bytes(len(data)) for _, data in fields)
        if self._file is not None and (
                _tar_file_size(self._members + need) > self.shard_size
                or (self.max_count is not None and self._count >= self.max_count)):
            self.close_shard()
        if self._file is None:
            self._open()
        for ext, data in fields:
            self._file.write(_header(f"{key}.{ext}", len(data)))
            self._file.write(data)
            self._file.write(bytes(-len(data) % _BLOCK))
        self._members += need
        self._count += 1

    def _open(self):
        name = f"{self.prefix}-{len(self.names):06d}.tar"
        self._tmp = os.path.join(self.out_dir, name + ".tmp")
        self._file = open(self._tmp, "wb")
        self.names.append(name)
        self._count = self._members = 0

    def close_shard(self):
        """Finish the open shard: end blocks, flush to disk, rename to its final name."""
        if self._file is None:
            return
        self._file.write(bytes(2 * _BLOCK))  # end of archive
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        final = os.path.join(self.out_dir, self.names[-1])
        os.replace(self._tmp, final)
        self.counts.append(self._count)
        self.sizes.append(os.path.getsize(final))
        self._file = self._tmp = None

    def abandon(self):
        """Remove the open shard's .tmp and every shard this writer completed."""
        if self._file is not None:
            self._file.close()
        for p in ([self._tmp] if self._tmp else []) + [os.path.join(self.out_dir, n)
                                                        for n in self.names[:len(self.counts)]]:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
        self._file = self._tmp = None


def _prepare_out_dir(out_dir, prefix, overwrite):
    """Create `out_dir`, or refuse one holding shards (see the module docstring)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"output {out_dir} exists and is not a folder")
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(os.listdir(out_dir))
    found = [n for n in names if n == INDEX or n.endswith((".tar", ".tar.tmp"))]
    if not found:
        return
    if not overwrite:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise FileExistsError(f"output folder {out_dir} already holds shards ({shown}); "
                              f"pass overwrite=True (--overwrite) to replace them")
    ours = re.compile(re.escape(prefix) + r"-\d{6,}\.tar(\.tmp)?")
    for n in names:  # the index first: an interrupted overwrite leaves no index over a partial set
        if n == INDEX or ours.fullmatch(n):
            os.remove(os.path.join(out_dir, n))


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _brace_pattern(out_dir, names):
    if len(names) == 1:
        return os.path.join(out_dir, names[0])
    first, last = names[0][:-4], names[-1][:-4]  # without ".tar"
    stem = first[:-6]
    return os.path.join(out_dir, f"{stem}{{{first[-6:]}..{last[-6:]}}}.tar")


def pack_shards(src, out_dir, shard_size: int = 256 << 20, max_count: int | None = None,
                shuffle_seed: int | None = 0, progress=True, *, prefix: str = "shard",
                overwrite: bool = False) -> dict:
    """Pack ImageFolder `src` into tar shards in the WebDataset layout under
    `out_dir` (layout, keys, shuffling and guarantees: the module docstring).

    Args:
        shard_size: the most bytes a shard file may have (int, or a string
            parse_size accepts); a sample larger on its own gets its own shard.
        max_count: the most samples per shard (None: no limit).
        shuffle_seed: samples are shuffled with random.Random(seed); None
            keeps ImageFolder order.
        progress: a progress line on stderr -- True: when it is a terminal,
            "always", or False (fastloader.tools.progress.Progress).
        prefix: shard file names are ``<prefix>-NNNNNN.tar``.
        overwrite: replace the shards and index already in `out_dir`.

    Returns statistics: shards, samples, classes, bytes (the shard files'
    total), image_bytes, seconds, pattern (a brace pattern of the shard
    paths, as webdataset.WebDataset takes), index (index.json's path),
    out_dir, shuffle_seed.

    Raises FileNotFoundError / NotADirectoryError naming `src` when it is
    missing, not a folder or holds no class folder or images;
    FileExistsError when `out_dir` holds shards and not `overwrite`;
    OSError naming the file that cannot be read (nothing is left behind);
    ValueError for bad arguments.
    """
    shard_size = parse_size(shard_size)
    if max_count is not None and int(max_count) < 1:
        raise ValueError(f"max_count must be at least 1, got {max_count!r}")
    if not prefix or "/" in prefix or os.sep in prefix or prefix in (".", ".."):
        raise ValueError(f"prefix must be a plain file name part, got {prefix!r}")
    t0 = time.perf_counter()
    classes, samples = _scan(src)
    out_dir = os.path.abspath(os.fspath(out_dir))
    _prepare_out_dir(out_dir, prefix, overwrite)

    order = list(range(len(samples)))
    if shuffle_seed is not None:
        random.Random(int(shuffle_seed)).shuffle(order)
    digits = max(6, len(str(len(samples) - 1)))
    writer = _ShardWriter(out_dir, prefix, shard_size, None if max_count is None else int(max_count))
    image_bytes = 0
    try:
        with Progress(len(samples), "fastloader pack shards", unit="images", show=progress) as bar:
            for i in order:
                path, label = samples[i]
                data = _read(path)
                ext = os.path.splitext(path)[1][1:].lower()
                writer.add(f"{i:0{digits}d}", [("cls", str(label).encode("ascii")), (ext, data)])
                image_bytes += len(data)
                bar.update(1, nbytes=len(data))
            writer.close_shard()
    except BaseException:
        writer.abandon()
        raise
    index = {"format": "webdataset", "version": 1, "shards": writer.names, "counts": writer.counts,
             "classes": classes, "total": len(samples), "shuffle_seed": shuffle_seed}
    index_path = os.path.join(out_dir, INDEX)
    _write_json(index_path, index)
    return {"shards": len(writer.names), "samples": len(samples), "classes": len(classes),
            "bytes": sum(writer.sizes), "image_bytes": image_bytes,
            "seconds": round(time.perf_counter() - t0, 3), "pattern": _brace_pattern(out_dir, writer.names),
            "index": index_path, "out_dir": out_dir, "shuffle_seed": shuffle_seed}


# ----------------------------------------------------------------------------
# the command line: python -m fastloader pack FORMAT SRC_DIR OUT [options]


class Format(NamedTuple):
    help: str                                            # one line for `pack --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]  # the format's own options
    run: Callable[[argparse.Namespace], dict]            # pack, return the statistics
    summary: Callable[[dict], list]                      # lines printed without --json


def _size_arg(text):
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _shards_arguments(p):
    p.add_argument("--shard-size", type=_size_arg, default=256 << 20, metavar="SIZE",
                   help="most bytes per shard file: 256MB (10**6), 256MiB or 256M (2**20), 1GB, 500kB or bytes "
                        "(default 256MiB)")
    p.add_argument("--max-count", type=int, default=None, metavar="N",
                   help="most samples per shard (default: no limit)")
    p.add_argument("--prefix", default="shard", help="shard files are PREFIX-000000.tar, ... (default %(default)s)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--seed", type=int, default=0, help="seed of the sample shuffle (default %(default)s)")
    order.add_argument("--no-shuffle", action="store_true", help="keep ImageFolder order (class by class)")


def _shards_run(a):
    return pack_shards(a.src, a.out, a.shard_size, a.max_count, None if a.no_shuffle else a.seed,
                       progress=a.progress, prefix=a.prefix, overwrite=a.overwrite)


def _shards_summary(st):
    order = "ImageFolder order" if st["shuffle_seed"] is None else f"shuffled with seed {st['shuffle_seed']}"
    plural = "s" if st["shards"] != 1 else ""
    return [f"wrote {st['shards']} shard{plural} ({st['samples']} images, {st['classes']} classes, "
            f"{st['bytes'] / 2**20:.1f} MiB) to {st['out_dir']}",
            f"  shards  {st['pattern']}",
            f"  index   {st['index']}",
            f"  order   {order}",
            f"  time    {st['seconds']:.1f} s "
            f"({st['image_bytes'] / 1e6 / max(st['seconds'], 1e-9):.1f} MB/s of images)"]


def _lmdb_arguments(p):
    pass   # nothing beyond SRC_DIR, OUT and the shared flags


def _lmdb_run(a):
    from .pack_lmdb import pack_lmdb

    bar = None
    last = [0, 0]   # done, bytes: pack_lmdb reports running totals, the bar counts increments

    def progress(done, total, nbytes):
        nonlocal bar
        if bar is None:
            bar = Progress(total, "fastloader pack lmdb", unit="images", show=a.progress)
        bar.update(done - last[0], nbytes=nbytes - last[1])
        last[:] = [done, nbytes]

    try:
        return pack_lmdb(a.src, a.out, progress=progress, overwrite=a.overwrite)
    finally:
        if bar is not None:
            bar.close()


def _lmdb_summary(st):
    return [f"wrote {st['count']} images in {st['classes']} classes to {st['path']} "
            f"({st['file_bytes'] / 2**20:.1f} MiB file, {st['bytes'] / 2**20:.1f} MiB of images) "
            f"in {st['seconds']:.1f} s",
            f"read it with fastloader.LMDBDataset({st['path']!r}, transform=...)"]


FORMATS = {
    "shards": Format("tar shards in the WebDataset layout (the webdataset library reads them as they are)",
                     _shards_arguments, _shards_run, _shards_summary),
    "lmdb": Format("one LMDB file in fastloader's layout (fastloader.LMDBDataset; the lmdb package reads it)",
                   _lmdb_arguments, _lmdb_run, _lmdb_summary),
}

DESCRIPTION = ("Convert an ImageFolder (SRC_DIR/<class>/<images>, scanned exactly as fastloader.ImageFolder and "
               "torchvision scan it) into a layout fastloader streams from.  Image bytes are copied unchanged.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `pack` command: one sub-command per entry of FORMATS."""
    sub = p.add_subparsers(dest="format", metavar="format", required=True)
    for name, fmt in FORMATS.items():
        f = sub.add_parser(name, help=fmt.help, description=f"{DESCRIPTION}\n\n{name}: {fmt.help}.")
        f.add_argument("src", metavar="SRC_DIR", help="the ImageFolder to read")
        f.add_argument("out", metavar="OUT", help="where to write (created if missing)")
        fmt.add_arguments(f)
        f.add_argument("--overwrite", action="store_true", help="replace what an earlier pack wrote in OUT")
        f.add_argument("--json", action="store_true", help="print the statistics as JSON")
        show = f.add_mutually_exclusive_group()
        show.add_argument("--quiet", "-q", dest="progress", action="store_const", const=False, default=True,
                          help="no progress line")
        show.add_argument("--progress", dest="progress", action="store_const", const="always",
                          help="a progress line on stderr even when it is not a terminal")


def run(a) -> int:
    fmt = FORMATS[a.format]
    try:
        st = fmt.run(a)
    except (OSError, ValueError) as e:
        print(f"fastloader pack {a.format}: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(st, indent=1))
    else:
        print("\n".join(fmt.summary(st)))
    return 0
