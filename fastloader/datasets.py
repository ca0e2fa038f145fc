"""Native image datasets: ImageFolder and ImageList.

With `fastloader.DataLoader` and the default collate_fn, worker threads
read, decode (libjpeg-turbo), transform and write each sample straight into
its slot of the batch (csrc/native/native.c), without Python.  A batch is
`(images, labels)`: images [B, C, H, W] (or [B, H, W, C]) in the transform's
dtype, labels int64 [B] -- what torchvision's ImageFolder + the same
transforms + default_collate give.

What does need Python -- the part of a transform that does not compile to C,
target_transform, Pillow for files that are not JPEG -- never runs on the
training loop's thread: that thread only takes the finished batch and files
the records (`_take`).  Where it runs is the loader's choice
(worker_mode.choose_native_mode):
  - worker processes (the default for a transform tail): each process builds
    whole batches, the C work on its one thread, then the tail, whose outputs
    are stacked straight into the batch's shared-memory slot
    (`_process_batch`); batches run in parallel, and the tail's draws from
    torch's generator follow torch's per-worker seeds;
  - C worker threads: the thread that built the batch runs it right after
    the C work (`_post`); a transform tail or target_transform runs for one
    batch at a time, in batch order (csrc/native/native_engine.h), so draws
    from torch's generator come out as with num_workers=0.

Indexing one sample (`ds[i]`) also works, so the datasets can be used with
torch's own DataLoader too (then each sample goes through Python).
"""
from __future__ import annotations

import collections.abc
import os
import sys
import threading
import time
import warnings

import numpy as np

from . import _C
from ._worker import annotate
from .transforms import compile_transform

try:
    import torch
    from torch.utils.data import Dataset as _Dataset
except ImportError:  # pragma: no cover
    torch = None
    _Dataset = object

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def to_output(buf):
    return torch.from_dlpack(buf) if torch is not None else np.from_dlpack(buf)


def _files_source(paths):
    """A file source (pickled by reference: _C's functions are not)."""
    return _C.file_source(paths)


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def user_stacklevel():
    """warnings.warn's stacklevel, called from the function that warns, for
    the first frame outside this package (the user's loop or call)."""
    f, level = sys._getframe(2), 2
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PKG_DIR:
        f, level = f.f_back, level + 1
    return level


class LazySamples(collections.abc.Sequence):
    """`samples` of a source with many rows: (name, label) pairs made on
    demand, so a dataset of millions of rows holds no million tuples.  A
    subclass keeps `_targets` and says what sample i is called (`_pair`)."""

    __slots__ = ()
    _noun = "sample"   # what the out-of-range message calls an index

    def __len__(self):
        return len(self._targets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self._targets)
        if not -n <= i < n:
            raise IndexError(f"{self._noun} {i} out of range for {n} {self._noun}s")
        return self._pair(i + n if i < 0 else i)

    def _pair(self, i):  # pragma: no cover - every subclass says
        raise NotImplementedError


class _Finished:
    """A batch finished by NativeImageDataset._post (on a worker thread, or
    on the calling thread with num_workers=0): the batch, what the consumer
    still files at the batch's turn (skipped / replaced records, the Pillow
    warning), and what the Python part cost."""

    __slots__ = ("batch", "notes", "samples", "native_s", "tail_s", "where", "workers")

    def __init__(self, batch, notes, samples, native_s, tail_s, where="thread", workers=0):
        self.batch = batch
        self.notes = notes        # [(kind, index, entry)]: "skipped", "replaced", or ("pillow", index, path)
        self.samples = samples
        self.native_s = native_s  # wall time of the batch's C work
        self.tail_s = tail_s      # (per-sample calls, stacking) seconds of the Python tail (None: no tail)
        self.where = where        # where the Python ran: "thread" (a C worker), "process", "inline"
        self.workers = workers    # worker processes sharing the load ("process")


def _short_repr(t) -> str:
    r = repr(t).replace("\n", " ")
    return r if len(r) <= 100 else r[:97] + "..."


class NativeImageDataset(_Dataset):
    """Base of ImageFolder and ImageList: files + labels + a compiled transform.

    Args:
        transform: fastloader.transforms or torchvision transforms (a Compose
            of the supported ones runs natively; an unsupported tail runs in
            Python on each output tensor, by default in worker processes in
            parallel (worker_mode.choose_native_mode), and a warning says
            what it costs once that is measured).  It must give a fixed
            output size (RandomResizedCrop, Resize((h, w)) or Resize +
            CenterCrop) for batching.
        target_transform: called on each int label, in the workers, where
            the tail runs; the batch's labels are then collated.
        layout: "CHW" (default, as torchvision) or "HWC".
        on_error: "raise" (default), "skip" (drop bad samples: that batch is
            smaller) or "replace" (substitute another sample chosen
            deterministically: batches stay full and len(loader) exact).
        dct_scaling: decode at a reduced libjpeg scale (M/8) when the crop is
            larger than the output.  Faster; pixels then differ slightly from
            torchvision's (see benchmarks/RESULTS.md for the PSNR).
        max_pixels: refuse images with more pixels (default: 2x Pillow's
            MAX_IMAGE_PIXELS), before allocating anything.
    """

    # its own code is fastloader's (worker_mode.threads_suit); where its
    # native batches run is worker_mode.choose_native_mode's choice
    _fl_thread_safe = True

    def __init__(self, samples, transform=None, target_transform=None, *, layout="CHW", on_error="raise",
                 dct_scaling=False, max_pixels=0, source=None, targets=None, labels_in_source=False):
        # samples: (name, label) pairs; the name is a file path, or for
        # another source (LMDB, shards) what messages call the sample.  A
        # sequence is kept as given (an array source names its rows on
        # demand), anything else is listed.
        # source: where the bytes live (a _C.Source); default: the files.
        # targets: the labels as a list, when the caller has them already.
        # labels_in_source: the source's samples carry their labels (a
        # stream): no label table (targets None; -1 where a sample has none).
        self.samples = samples if isinstance(samples, collections.abc.Sequence) else list(samples)
        if labels_in_source:
            self.targets = None
        else:
            self.targets = targets if targets is not None else [s[1] for s in self.samples]
        self.transform = transform
        self.target_transform = target_transform
        self.on_error = on_error
        self.dct_scaling = dct_scaling
        self._max_pixels = max_pixels
        spec, rest, description = compile_transform(transform, layout=layout)
        if not spec.get("out_h") and rest is not None:
            first = rest.transforms[0]
            raise ValueError(
                f"fastloader cannot run {_short_repr(first)} natively, and the part of the transform before it "
                f"({'nothing' if spec['geom'] == 'none' else 'a resize without a crop'}) gives samples no fixed "
                "size, which a native batch needs. docs/recipes.md lists what runs natively; or put a "
                "RandomResizedCrop, Resize((h, w)) or Resize + CenterCrop before it")
        self._spec = spec
        self._rest = rest
        self.pipeline_description = description
        # every batch goes through _post on its worker (in batch order), not
        # only those with non-JPEG files
        self._post_always = rest is not None or target_transform is not None
        self._source = source if source is not None else _C.file_source([s[0] for s in self.samples])
        if len(self._source) != len(self.samples):
            raise ValueError(f"the source holds {len(self._source)} samples, the dataset lists {len(self.samples)}")
        self._native = self._make_native(spec)
        self._fl_pid = os.getpid()   # the process _native belongs to (_own_process)
        # Each bad file once (the first reason seen), however many epochs
        # meet it, so a long run does not grow them without bound:
        self.skipped = []    # (path, reason) of samples left out by on_error="skip"
        self.replaced = []   # (path, replacement path, reason) for on_error="replace"
        self._bad_seen = set()   # ("skipped" | "replaced", index) already listed
        # guards the records above and the warnings' state: batches are
        # filed by each loader's consumer, and __getitem__ under a Python
        # loader runs on several worker threads at once
        self._lock = threading.Lock()
        self._pil_warned = False
        self._tail_seen = [0, 0, 0.0, 0.0, 0.0]  # batches, samples, calls_s, native_s, stack_s (2nd batch on)
        self._tail_warned = False

    def __len__(self):
        return len(self.samples)

    def _wire_variant(self):
        """(dataset, convert): this dataset producing uint8, and the float
        conversion to finish on the device; (None, None) when the output is
        uint8 already or a Python tail follows the native part."""
        spec = self._spec
        if spec.get("dtype", "uint8") == "uint8" or self._rest is not None or "erase" in spec:
            # an erase writes values in the finished (normalised) units
            return None, None
        from .cuda_delivery import DeviceConvert

        wire = {k: v for k, v in spec.items() if k not in ("mean", "std")}
        wire.update(dtype="uint8", normalize=False, scale_to_unit=0)
        v = object.__new__(type(self))
        v.__dict__.update(self.__dict__)  # shares samples and the skipped/replaced lists
        v._spec = wire
        v._native = self._make_native(wire)
        return v, DeviceConvert(spec)

    def _make_native(self, spec):
        return _C.NativeDataset(self._source, self.targets, spec, on_error=self.on_error,
                                dct_scaling=bool(self.dct_scaling), max_pixels=int(self._max_pixels))

    # -- in a worker process ------------------------------------------------------
    def __copy__(self):
        # shallow, sharing this process's native objects (what copy.copy gave
        # before __getstate__ existed: a worker thread's copy)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __getstate__(self):
        """Pickled for a spawned or forkserver worker process: everything but
        this process's native objects, and how to open the source again."""
        state = dict(self.__dict__)
        for k in ("_native", "_source", "_lock", "_fl_inherited"):
            state.pop(k, None)
        state["_fl_source_recipe"] = self._source_recipe()
        return state

    def __setstate__(self, state):
        make, args = state.pop("_fl_source_recipe")
        self.__dict__.update(state)
        self._source = make(*args)
        self._native = self._make_native(self._spec)
        self._lock = threading.Lock()
        self._fl_pid = os.getpid()

    def _source_recipe(self):
        """(callable, args) that open this dataset's source again in another
        process; a subclass with another kind of source gives its own."""
        if self._source.kind == "files":
            return _files_source, ([s[0] for s in self.samples],)
        raise TypeError(f"{type(self).__name__} reads a {self._source.kind!r} source, which cannot be sent to a "
                        "spawned or forkserver worker process: use multiprocessing_context='fork' or "
                        "worker_mode='thread'")

    def _reopen_source(self):
        """The source a forked worker process reads: the inherited one, unless
        its handle must not cross a fork (a subclass says so: LMDB)."""
        return self._source

    def _own_process(self):
        """In a worker process forked from the loader's: native objects of
        this process's own.  The inherited NativeDataset's pool may hold
        page-locked CUDA memory, and locks another thread held at the fork,
        so it is kept (never freed here) and not used."""
        pid = os.getpid()
        if self._fl_pid == pid:
            return
        self._fl_inherited = (self._native, self._source)
        self._source = self._reopen_source()
        self._native = self._make_native(self._spec)
        self._lock = threading.Lock()
        self._fl_pid = pid

    def _process_batch(self, indices, ring):
        """The batch hook of a loader's worker process
        (backends.NativeProcessBackend; _procworkers' fetch calls it): the C
        work on this thread with the GIL released, then the Python part, the
        tail's outputs stacked into the shared-memory slot `ring` is filling
        (None: a fresh tensor).  Epoch and seed are the loader's
        (worker_info.epoch_context), so the native draws are the threads'.
        Returns (_Finished, ()) for the loader's _take; raises what the
        loader raises at this batch."""
        from .worker_info import epoch_context, get_worker_info

        ctx, info = epoch_context(), get_worker_info()
        if ctx is None or info is None:  # pragma: no cover - only _procworkers calls it
            raise RuntimeError("fastloader: _process_batch runs only in a loader's worker process (this is a bug)")
        _, epoch, seed = ctx
        self._own_process()
        t0 = time.perf_counter()
        raw = self._native.load_batch(list(indices), int(epoch), int(seed))
        fin = self._build(raw, epoch, seed, None, info.id, time.perf_counter() - t0, ring=ring)
        fin.where, fin.workers = "process", info.num_workers
        return fin, ()

    # -- one sample (for torch's DataLoader or for inspection) ------------------
    def __getitem__(self, index):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
        if index < 0:
            index += n
        epoch, seed = self._item_seed()
        images, labels = self._load([index], epoch, seed, None, collate_targets=False)
        if len(labels) == 0:
            raise IndexError(f"sample {index} was skipped (on_error='skip')")
        # target_transform ran already (on the raw int label)
        return images[0], labels[0] if self.target_transform is not None else int(labels[0])

    @staticmethod
    def _item_seed():
        """(epoch, seed) for one sample fetched through __getitem__: inside
        a fastloader worker, the loader's epoch and seed (the sample gets the
        same crop and flip as on the native path); elsewhere a fresh draw
        from torch's default generator (NumPy's without torch), so every
        call is random as with torchvision, and torch.manual_seed -- or
        torch's per-worker seeding -- makes it reproducible."""
        from .worker_info import epoch_context

        ctx = epoch_context()
        if ctx is not None:
            return ctx[1], ctx[2]
        if torch is not None:
            return 0, int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
        return 0, int(np.random.randint(0, 2**62, dtype=np.int64))

    def load_batch(self, indices, epoch, seed, *, seq=None):
        """Load a batch on the calling thread (the GIL is released while the
        C part runs; the Python part, if any, runs here too)."""
        return self._load(indices, epoch, seed, seq)

    def _load(self, indices, epoch, seed, seq, collate_targets=True):
        self._own_process()   # ds[i] in a forked worker (torch's, or a subclass's in ours)
        t0 = time.perf_counter()
        raw = self._native.load_batch(list(indices), int(epoch), int(seed))
        native_s = time.perf_counter() - t0
        fin = self._build(raw, epoch, seed, seq, -1, native_s, collate_targets)
        fin.where = "inline"
        return self._take(fin)

    def plan(self, index, width, height, epoch=0, seed=0):
        """The random decisions for one sample: crop box, resized size, window,
        filter (interp: 0 bilinear, 1 bicubic), flip, vflip, policy ops (a RandomRotation first),
        AugMix's weights and chain lengths (mix: None, or {w0, w, len}; the chains' ops are the
        last entries of aug), gray (RandomGrayscale), erase box."""
        return self._native.plan(int(index), int(width), int(height), int(epoch), int(seed))

    # -- batch post-processing ---------------------------------------------------
    # _post runs on the worker thread that built the batch (csrc/native/native_engine.h
    # says when), or on the calling thread with num_workers=0; _take runs on
    # the consumer at the batch's turn.  A batch that needed no Python reaches
    # the consumer raw and goes through both there (_finish).
    def _error(self, code, errnum, msg, index, where):
        """The exception for a core error record of sample `index` (the one
        translator, _C._error: OSError subclasses for I/O, MemoryError,
        IndexError, DecodeError for bytes that are not a valid image)."""
        path = self.samples[index][0] if 0 <= index < len(self.samples) else None
        text = msg if path is None else f"{path}: {msg}"
        return _C._error(code, errnum, text, path, f" [sample index {index}{where}]")

    def _finish(self, result, epoch, seed, seq):
        """A raw batch (images, labels, events, failed) that needed no Python
        on its worker, on the consumer: its events, then _take."""
        return self._take(self._build(result, epoch, seed, seq, -1, 0.0))

    def _post(self, result, epoch, seed, seq, worker, native_s):
        """The engine's post hook (csrc/native/native_engine.h): runs on worker
        `worker`, GIL held, right after the batch's C work (native_s
        seconds).  Returns a _Finished for the consumer's _take; what it
        raises, the consumer raises at this batch's turn."""
        return self._build(result, epoch, seed, seq, worker, native_s)

    def _build(self, result, epoch, seed, seq, worker, native_s, collate_targets=True, ring=None):
        """Turn a raw batch into (images, labels): events into an exception
        or notes, Pillow for non-JPEG files, the transform's Python tail and
        target_transform.  ring: a worker process's shared-memory ring, which
        the tail's outputs are stacked into.  Returns a _Finished; raises
        what the consumer must raise at this batch's turn."""
        images_buf, labels_buf, events, failed = result
        where = f" (batch {seq})" if seq is not None else ""
        if failed:
            if not events:  # pragma: no cover - the core always records why
                raise RuntimeError(f"fastloader: a batch failed with no error recorded{where} (this is a bug)")
            kind, index, _, msg, code, errnum = events[-1]
            raise self._error(code, errnum, msg, index, where)
        images = to_output(images_buf)
        labels = to_output(labels_buf)
        notes = []
        keep = None
        for kind, index, by, msg, _code, _errnum in events:
            if kind == "skipped":
                path = self.samples[index][0]
                notes.append(("skipped", index, (path, f"{path}: {msg}")))
            elif kind == "replaced":
                path = self.samples[index][0]
                notes.append(("replaced", index, (path, self.samples[by][0], f"{path}: {msg}")))
            elif kind == "fixup":
                if not self._fixup(images, labels, by, index, epoch, seed, where, notes):
                    keep = keep if keep is not None else np.ones(len(labels), dtype=bool)
                    keep[by] = False
        if keep is not None:
            idx = np.flatnonzero(keep).tolist()
            images, labels = images[idx], labels[idx]
        n = len(labels)
        tail_s = None
        if self._rest is not None:
            t0 = time.perf_counter()
            try:
                outs = [self._rest(img) for img in images]
            except Exception as e:
                raise annotate(e, f"{self._batch_name(seq, worker)} in the transform's Python part "
                                   f"({self._rest!r})")
            t1 = time.perf_counter()
            buf = _C.stack(outs, pool=ring) if ring is not None else None   # None: not stackable there
            if buf is not None:
                images = to_output(buf)
            else:
                images = torch.stack(outs) if torch is not None else np.stack(outs)
            tail_s = (t1 - t0, time.perf_counter() - t1)   # the per-sample calls, stacking their outputs
        if self.target_transform is not None:
            try:
                labels = [self.target_transform(int(t)) for t in labels]
            except Exception as e:
                raise annotate(e, f"{self._batch_name(seq, worker)} in target_transform")
            if torch is not None and collate_targets:
                from .collate import fast_default_collate

                labels = fast_default_collate(labels)
        return _Finished((images, labels), notes, n, native_s, tail_s)

    @staticmethod
    def _batch_name(seq, worker):
        batch = f"batch {seq}" if seq is not None else "a batch"
        return f"{batch} on worker {worker}" if worker >= 0 else f"{batch} on the calling thread"

    def _take(self, fin):
        """File a finished batch's notes (consumer thread, at its turn) and
        return the batch."""
        pillow = None
        with self._lock:
            for kind, index, entry in fin.notes:
                if kind == "pillow":
                    if not self._pil_warned:
                        self._pil_warned = True
                        pillow = entry
                elif (kind, index) not in self._bad_seen:
                    self._bad_seen.add((kind, index))
                    (self.skipped if kind == "skipped" else self.replaced).append(entry)
            tail = self._tail_measure(fin)
        if pillow is not None:
            warnings.warn(f"fastloader: {pillow} is not a JPEG, PNG or still WebP; decoding it (and any other such files) "
                          "through Pillow, which is slower than the native path", UserWarning,
                          stacklevel=user_stacklevel())
        if tail is not None:
            warnings.warn(tail, UserWarning, stacklevel=user_stacklevel())
        return fin.batch

    def _tail_measure(self, fin):
        """The one warning about a Python tail, with what it costs: None until
        two batches after the first (which pays one-time costs) are measured.
        Caller holds self._lock."""
        if self._tail_warned or fin.tail_s is None or not fin.samples:
            return None
        seen = self._tail_seen
        seen[0] += 1
        if seen[0] == 1:
            return None
        seen[1] += fin.samples
        seen[2] += fin.tail_s[0]
        seen[4] += fin.tail_s[1]
        seen[3] += fin.native_s
        if seen[0] < 3:
            return None
        self._tail_warned = True
        py_ms, c_ms, st_ms = (1e3 * seen[k] / seen[1] for k in (2, 3, 4))
        return (f"fastloader: part of the transform runs in Python, per sample: {self._rest!r}. Measured per "
                f"sample: {py_ms:.3f} ms in its calls and {st_ms:.3f} ms stacking their outputs into the batch, "
                f"against {c_ms:.3f} ms for the native part"
                f"{f' ({py_ms / c_ms:.2g}x)' if c_ms > 0 else ''}. {self._tail_cost(fin, py_ms + st_ms, c_ms)} "
                f"[{self.pipeline_description}]")

    def _tail_cost(self, fin, per, c_ms):
        """What the tail costs where it ran (fin.where), and the one remedy
        for this loader: never the one already in use."""
        def rate(n, ms):
            return f"about {n * 1e3 / ms:,.0f} samples/s" if ms > 0 else "its speed"

        compile_it = "Remedy: a transform that compiles to C in its place; docs/recipes.md lists them."
        stream = getattr(self, "_fl_stream", False)
        if fin.where == "process":
            n = max(1, fin.workers)
            share = f", {100 * per / (per + c_ms):.0f}% of it in Python" if per + c_ms > 0 else ""
            where = (f"in each of the {n} worker processes after the native part, whole batches in parallel"
                     if n > 1 else "in the worker process after the native part")
            return (f"It runs {where}, so a sample takes a worker {per + c_ms:.3f} ms{share}: "
                    f"{rate(n, per + c_ms)} with {n} process{'es' if n > 1 else ''} on as many free cores, against "
                    f"{rate(n, c_ms)} for the native part alone. {compile_it}")
        if fin.where == "inline":
            more = ("which runs it on worker threads" if stream else
                    "which by default (worker_mode='auto') runs it in worker processes, batches in parallel")
            return (f"With num_workers=0 it runs on the training loop's thread after the native part, "
                    f"{per + c_ms:.3f} ms per sample, {rate(1, per + c_ms)}, while the loop waits. Remedy: "
                    f"num_workers > 0, {more}.")
        cap = f"so it caps loading at {rate(1, per)} whatever num_workers is"
        if stream:
            return (f"It runs on the C worker threads after the native part, one batch at a time in batch order "
                    f"and with the GIL (the shard stream is read in this process, so worker processes cannot take "
                    f"it), {cap}. {compile_it}")
        return (f"With worker_mode='thread' it runs on the C worker threads after the native part, one batch at a "
                f"time in batch order and with the GIL, {cap}. Remedy: worker_mode='process' (or the default, "
                "'auto'), which runs it in worker processes, batches in parallel.")

    def _fixup(self, images, labels, slot, index, epoch, seed, where, notes):
        """Decode a non-JPEG file with Pillow into batch slot `slot`.  Returns
        False when the sample must be dropped (on_error='skip')."""
        path = self.samples[index][0]
        try:
            from PIL import Image
        except ImportError:
            err = _C.DecodeError(f"{path}: not a JPEG file, and Pillow is not installed to decode it"
                                 f" [sample index {index}{where}]")
            return self._fixup_failed(err, images, labels, slot, index, epoch, seed, notes)
        notes.append(("pillow", index, path))
        try:
            with Image.open(self._open_for_pillow(index)) as im:
                arr = np.asarray(im.convert("L" if self._spec.get("out_channels", 3) == 1 else "RGB"))
        except Exception as e:
            err = _C.DecodeError(f"{path}: {e} [sample index {index}{where}]")
            return self._fixup_failed(err, images, labels, slot, index, epoch, seed, notes)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        sample = to_output(self._native.render_array(np.ascontiguousarray(arr), index, int(epoch), int(seed)))
        images[slot] = sample
        return True

    def _open_for_pillow(self, index):
        """What Image.open reads sample `index` from: its path for files, its
        bytes otherwise (an LMDB value, a tar member)."""
        if self._source.kind == "files":
            return self.samples[index][0]
        import io

        return io.BytesIO(self._source.read(index))

    def _fixup_failed(self, err, images, labels, slot, index, epoch, seed, notes):
        if self.on_error == "raise":
            raise err
        path = self.samples[index][0]
        if self.on_error == "skip":
            notes.append(("skipped", index, (path, str(err))))
            return False
        # replace: the same substitutes, in the same order, as the native path
        for alt in self._native.replacement_candidates(index, int(epoch), int(seed)):
            res = self._native.load_batch([alt], int(epoch), int(seed))
            if not res[3] and not res[2]:
                images[slot] = to_output(res[0])[0]
                labels[slot] = self.targets[alt]  # the replacement's label, as the native path does
                notes.append(("replaced", index, (path, self.samples[alt][0], str(err))))
                return True
        raise err


def find_classes(directory):
    """Class folder names in sorted order and their indices (as torchvision)."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(directory, class_to_idx, extensions=IMG_EXTENSIONS, is_valid_file=None, allow_empty=False):
    """(path, class_index) pairs in torchvision's order."""
    directory = os.path.expanduser(directory)
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("Both extensions and is_valid_file cannot be None or not None at the same time")
    if is_valid_file is None:
        def is_valid_file(x):
            return x.lower().endswith(tuple(extensions))
    instances = []
    available = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if is_valid_file(path):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx.keys()) - available
    if empty and not allow_empty:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
        if extensions is not None:
            msg += f"Supported extensions are: {extensions if isinstance(extensions, str) else ', '.join(extensions)}"
        raise FileNotFoundError(msg)
    return instances


class ImageFolder(NativeImageDataset):
    """torchvision.datasets.ImageFolder, decoded and transformed natively.

    Same class order, `classes`, `class_to_idx`, `samples`, `targets` and
    `imgs` as torchvision's.
    """

    def __init__(self, root, transform=None, target_transform=None, loader=None, is_valid_file=None,
                 allow_empty=False, **native_options):
        if loader is not None:
            raise ValueError("fastloader.ImageFolder decodes natively; a custom loader= is not supported "
                             "(use torchvision.datasets.ImageFolder with fastloader.DataLoader for that)")
        self.root = os.fspath(root)
        self.classes, self.class_to_idx = find_classes(self.root)
        samples = make_dataset(self.root, self.class_to_idx, None if is_valid_file else IMG_EXTENSIONS,
                               is_valid_file, allow_empty)
        super().__init__(samples, transform, target_transform, **native_options)
        self.imgs = self.samples


class ImageList(NativeImageDataset):
    """A list of image paths with optional integer labels (-1 when absent)."""

    def __init__(self, paths, labels=None, transform=None, target_transform=None, **native_options):
        paths = [os.fspath(p) for p in paths]
        if labels is None:
            labels = [-1] * len(paths)
        labels = [int(x) for x in labels]
        if len(labels) != len(paths):
            raise ValueError(f"got {len(labels)} labels for {len(paths)} paths")
        super().__init__(list(zip(paths, labels)), transform, target_transform, **native_options)
