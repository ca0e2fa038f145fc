"""Checkpoint and resume: DataLoader.state_dict() / load_state_dict(), with
the meaning torchdata's StatefulDataLoader gives them.

The state is the loader's position after the last batch the training loop
received (batches prefetched but not received are not consumed), as plain
Python types (it survives torch.save and JSON):

    epoch, num_yielded, finished   the loader's epoch count (the native
                                   pipeline's key), batches received in it,
                                   whether its StopIteration was raised
    base_seed, seed                the epoch's base seed (workers' seeds,
                                   sample_rng, and the native seed unless
                                   seed= was given) and the loader's seed=
    sampler                        how the sampler gets back to its place:
        rngs, global    the state of every generator the loader and sampler
                        draw from at the epoch's start (loader.generator,
                        the sampler's .generator; torch's global RNG for a
                        RandomSampler without one, taken just before its
                        first draw) -- restored, then the sampler is run
                        again for num_yielded batches without loading any
                        data, so it draws exactly what it drew
        state, target   a Stateful sampler (state_dict/load_state_dict, the
                        protocol torchdata uses) or its iterator: its state
                        after the num_yielded-th batch was drawn, loaded
                        instead of running it again
        dist_epoch      DistributedSampler's set_epoch value
        seedable        accelerate's SeedableRandomSampler: [epoch,
                        initial_seed] at the epoch's start (its order is a
                        function of their sum: its generator's state is
                        not kept), put back before the epoch is drawn again
        accel_skip      the batches accelerate's SkipBatchSampler
                        (skip_first_batches) dropped at the epoch's start:
                        a loader with another skip, or none, draws to the
                        same place
    drew_seed                      whether the epoch's set-up drew its base
                                   seed (every epoch, or a persistent
                                   iterator's first): drawn again from the
                                   restored generator, so it stays in step
    workers, dataset               Python datasets: a Stateful iterable's
                                   iterator state per worker (else the
                                   batches each worker delivered, skipped on
                                   resume by drawing their samples again),
                                   and a Stateful dataset's state
    stream                         fastloader.WebDataset: the epoch its shard
                                   order follows; the positions already
                                   received (num_yielded x batch_size) are
                                   read again but dropped, not decoded

A state saved after its epoch's StopIteration resumes at the next epoch,
after the restored generators have made the saved epoch's draws again (its
indices only), so the next epoch's shuffle and base seed are an
uninterrupted run's.

Native datasets' output is a function of (seed, epoch, index) (or stream
position), so with the sampler back in place a resumed epoch is bit-identical
to an uninterrupted one, for any num_workers.  What is and is not exact is
listed in docs/resume.md.

The loader calls in here from a few places (loader.py _Iter): `begin` when
an epoch is set up (before its sampler iterator is made and its base seed
drawn: a loaded state puts the generators back first, so both draw what
they drew), `attach` once its _Epoch exists (the sampler put back in place),
`yielded` / `again` / `finished_epoch` as batches are handed out; the
backends read `_Epoch.stream_start` and `_Epoch.resume`, and the worker side
of Python datasets calls `_Epoch.snapshot` after each batch and
`_Epoch.resume.restore_iter` when it makes its iterator.

Worker processes (worker_mode="process", _procworkers.py) run the same
worker side in their own process: `snapshot` and `resume` are pickled into
each worker's epoch, a worker's place after a batch travels back with the
batch, and since each process reads its own copy of the dataset, a Stateful
dataset's state is kept per worker ("dataset_workers") and given back to the
same worker on resume, the loader's own copy left as it was (torchdata's
StatefulDataLoader does the same).
"""
from __future__ import annotations

import base64
import itertools
import sys
import threading
import warnings

import numpy as np

from . import sampling

try:
    import torch
    from torch.utils.data import BatchSampler as _BatchSampler
    from torch.utils.data import DistributedSampler as _DistSampler
    from torch.utils.data import SequentialSampler as _SeqSampler
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None
    from ._nptorch import BatchSampler as _BatchSampler
    from ._nptorch import SequentialSampler as _SeqSampler

    _DistSampler = ()

FORMAT = "fastloader.DataLoader"
VERSION = 1
_END = object()


def stateful(obj):
    """True for an object with the Stateful protocol (torchdata's)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


# -- generator states, as plain types ----------------------------------------------------

def _numpy_generator(gen):
    """isinstance(gen, numpy.random.Generator), without importing
    numpy.random where nothing has (NumPy loads it on the first attribute
    access: ~0.5 MiB of extension modules, hmac and secrets, in a process
    whose loader never draws from it): no Generator exists before then."""
    npr = sys.modules.get("numpy.random")
    return npr is not None and isinstance(gen, npr.Generator)


def _rng_get(gen):
    if torch is not None and isinstance(gen, torch.Generator):
        return "torch:" + base64.b64encode(gen.get_state().numpy().tobytes()).decode("ascii")
    if _numpy_generator(gen):
        return {"numpy": gen.bit_generator.state}
    return None


def _rng_set(gen, enc):
    if isinstance(enc, str) and enc.startswith("torch:") and torch is not None and isinstance(gen, torch.Generator):
        gen.set_state(torch.frombuffer(bytearray(base64.b64decode(enc[6:])), dtype=torch.uint8))
        return
    if isinstance(enc, dict) and "numpy" in enc and _numpy_generator(gen):
        gen.bit_generator.state = enc["numpy"]
        return
    raise ValueError(f"fastloader: the state holds a generator state of another kind than {type(gen).__name__}")


def _global_get():
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def _global_set(enc):
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(enc)), dtype=torch.uint8))


def _is_generator(gen):
    return (torch is not None and isinstance(gen, torch.Generator)) or _numpy_generator(gen)


_DETERMINISTIC = (_SeqSampler, _BatchSampler, range) + ((_DistSampler,) if _DistSampler else ())


def _under(index_sampler):
    """The sampler under the loader's batch sampler: torch's BatchSampler's
    `.sampler`, or, for a batch sampler that wraps another batch sampler
    (`.batch_sampler`: accelerate's BatchSamplerShard, its SkipBatchSampler
    around that), the wrapped one's, a few levels down; None when there is
    none."""
    obj = index_sampler
    for _ in range(4):
        s = getattr(obj, "sampler", None)
        if s is not None:
            return s
        obj = getattr(obj, "batch_sampler", None)
        if obj is None:
            return None
    return None


def _rng_roles(loader, index_sampler):
    """The generators the loader's epoch draws from, by role -- ("loader",
    loader.generator), ("index", the index sampler's), ("inner", the
    sampler under the batch sampler) -- and whether torch's global RNG is one
    of them (a RandomSampler without a generator, or a sampler we know
    nothing about)."""
    roles, needs_global = [], False
    if _is_generator(getattr(loader, "generator", None)):
        roles.append(("loader", loader.generator))
    for role, obj in (("index", index_sampler), ("inner", _under(index_sampler))):
        if obj is None or stateful(obj) or sampling.seedable_order(obj):
            continue   # keeps its own place, or reseeds from its epoch (state "seedable")
        gen = getattr(obj, "generator", None)
        if _is_generator(gen):
            roles.append((role, gen))
        elif not isinstance(obj, _DETERMINISTIC):   # generator=None: torch's samplers then draw from the global RNG
            needs_global = torch is not None
    return roles, needs_global


def _capture(roles):
    """[[roles], state] for the generators `roles` names, each once."""
    seen = {}
    for role, gen in roles:
        if id(gen) in seen:
            seen[id(gen)][0].append(role)
        else:
            seen[id(gen)] = [[role], _rng_get(gen)]
    return list(seen.values())


def _role_object(loader, index_sampler, role):
    if role == "loader":
        return getattr(loader, "generator", None)
    if role == "index":
        return getattr(index_sampler, "generator", None)
    return getattr(_under(index_sampler), "generator", None)


def _dist_sampler(index_sampler):
    if not _DistSampler:
        return None
    for obj in (index_sampler, _under(index_sampler)):
        if isinstance(obj, _DistSampler):
            return obj
    return None


def _seedable_sampler(index_sampler):
    for obj in (index_sampler, _under(index_sampler)):
        if obj is not None and sampling.seedable_order(obj):
            return obj
    return None


def _put_seedable(index_sampler, saved):
    """Puts accelerate's SeedableRandomSampler back at the saved epoch's
    start (its epoch and seed, as accelerate's own save_state / load_state
    put the pickled sampler back), whatever set_epoch was called with since.
    True when it did; False when neither the loader nor the state has one;
    ValueError when only one of them has (a state from before fastloader
    kept the sampler's epoch could not put it back in place)."""
    sd = _seedable_sampler(index_sampler)
    if sd is None:
        if saved.get("seedable") is not None:
            raise ValueError("fastloader: the state holds the epoch of accelerate's SeedableRandomSampler, but this "
                             f"loader's sampler is {type(_under(index_sampler) or index_sampler).__name__}: build the "
                             "loader as the saved one was (use_seedable_sampler as it was)")
        return False
    if saved.get("seedable") is None:
        raise ValueError("fastloader: this loader's sampler is accelerate's SeedableRandomSampler, whose order "
                         "follows its epoch, and the state does not hold that epoch (saved by a loader with another "
                         "sampler, or by a fastloader that kept only the sampler's generator): it cannot be put "
                         "back in place; resume with the loader and fastloader that saved it, or from the epoch's "
                         "start")
    epoch, seed = saved["seedable"]
    sd.set_epoch(int(epoch))
    sd.initial_seed = int(seed)
    return True


# -- the sampler's iterator, counted ------------------------------------------------------

class _Pulls:
    """The index sampler's iterator for one epoch: counts the batches drawn,
    takes torch's global RNG state before the first draw (when the sampler
    draws from it) and, for a Stateful sampler, its state after each draw.
    Runs on the consumer thread only (where the loader draws indices)."""

    __slots__ = ("_it", "_tr", "_target", "n", "_back")

    def __init__(self, it, tr, target):
        self._it = it
        self._tr = tr
        self._target = target   # the Stateful object whose state follows each draw, or None
        self.n = 0              # batches drawn
        self._back = None       # one draw made ahead by a resume (under the restored global RNG)

    def __iter__(self):
        return self

    def __next__(self):
        if self._back is not None:
            v, self._back = self._back, None
            if v is _END:
                raise StopIteration
        else:
            tr = self._tr
            if tr.global_want and tr.global_rng is None and self.n == 0:
                tr.global_rng = _global_get()
            v = next(self._it)
        self.n += 1
        if self._target is not None:
            self._tr.snaps[self.n] = self._target.state_dict()
        return v


class Failed:
    """A worker-side state_dict() that raised: raised again by state_dict()."""

    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


class WorkerSnapshot:
    """_Epoch.snapshot: the worker's place right after batch `seq` (its
    iterator's state, the dataset's state) into ep.snaps; never raises.
    Runs on the worker thread, or in the worker process (process mode
    pickles it into the worker's epoch; the entry travels back with the
    batch, _procworkers.py).  Holds only a bool, so it pickles."""

    __slots__ = ("ds_stateful",)

    def __init__(self, ds_stateful):
        self.ds_stateful = ds_stateful

    def __reduce__(self):
        return (WorkerSnapshot, (self.ds_stateful,))

    def __call__(self, ep, wid, seq):
        # a state_dict() that raises is kept and raised again by the
        # loader's state_dict(), each in its own place (the iterator's or
        # the dataset's), so neither failure is lost
        st = ds_st = None
        if ep.iterable:
            itr = ep.iters.get(wid)
            if itr is not None and stateful(itr):
                try:
                    st = itr.state_dict()
                except Exception as e:
                    st = Failed(e)
        if self.ds_stateful:
            try:
                ds_st = ep.dataset.state_dict()
            except Exception as e:
                ds_st = Failed(e)
        ep.snaps[seq] = (wid, st, ds_st)


# -- what a resumed epoch hands to the workers and the backend ----------------------------

class _Resume:
    """A Python dataset's per-worker position for the resumed epoch (on _Epoch.resume)."""

    def __init__(self, iters, ended, last):
        self.iters = iters            # wid -> (batches delivered, iterator state or None)
        self.ended = ended            # workers whose iterator had ended
        self.last = last              # the worker of the last batch received (-1: none)

    def restore_iter(self, ep, wid, it):
        """The worker's iterator at its saved place: its state loaded, or its
        delivered batches' samples drawn again and dropped (worker thread)."""
        batches, st = self.iters.get(wid, (0, None))
        if st is not None:
            it.load_state_dict(st)
            return it
        if batches:
            n = batches * ep.batch_size if ep.auto_collation else batches
            try:
                for _ in range(n):
                    next(it)
            except StopIteration:
                return iter(())
        return it

    def restore_workers(self, backend):
        """PythonBackend.start_epoch: the ended workers stay idle, and the
        round robin goes on after the worker of the last batch received."""
        for w in self.ended:
            if 0 <= w < len(backend.active):
                backend.active[w] = False
        n = backend.num_workers
        if n and self.last >= 0:
            backend.cycle = itertools.islice(itertools.cycle(range(n)), (self.last + 1) % n, None)


# -- the tracker: one per loader ------------------------------------------------------------

class Tracker:
    """The loader's position, updated by its current iterator; state_dict()
    reads it from any thread while batches are in flight (a lock guards what
    a batch changes; an epoch's set-up, in iter(), is the consumer's own)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gen = 0              # the generation of the iterator that owns the position
        self.pending = None       # a loaded state, applied by the next iterator's begin
        self.started = False
        self.epoch = 0
        self.base_seed = None
        self.seed = None
        self.num_yielded = 0
        self.finished = False
        self.iterable = False
        self.num_workers = 0
        self.batch_size = None
        self.dataset_len = None
        # sampler
        self.rngs = []            # [[roles], encoded state] at the epoch's start
        self.global_want = False
        self.global_rng = None    # torch's global RNG before the sampler's first draw
        self.dist_epoch = None
        self.seedable = None      # [epoch, initial_seed] of accelerate's SeedableRandomSampler
        self.accel_skip = 0       # batches accelerate's SkipBatchSampler drops at the epoch's start
        self.target = None        # "iter" / "index_sampler" / "sampler" for a Stateful sampler
        self.snaps = {}           # batches drawn -> the Stateful sampler's state then
        self.snap_lo = 0
        self.pulls = None         # the epoch's _Pulls
        # Python datasets (worker side)
        self.worker_snaps = False
        self.workers = {}         # wid -> [batches delivered, iterator state]
        self.ended = set()
        self.last_wid = -1
        self.ds_stateful = False
        self.ds_state = None
        self.warned = False
        self._restore = None      # the loaded state of the epoch being set up (begin -> attach)
        self.drew_seed = False    # this epoch's set-up drew a base seed
        # elastic resume (elastic.py): this epoch's deal of a DistributedSampler
        # (None: another sampler), the samples of the sampler's order taken
        # before this numbering's batch 0 (a resume at another batch size),
        # and what a loaded state's set-up decided (begin -> attach)
        self.deal = None
        self.dist = None
        self.batch = None
        self.skip = 0
        self._redeal = None
        self._rebatch = None
        # streams
        self.stream_hist = []     # the epoch's earlier deals: [[world, places]] (elastic.py)
        self.stream_len = None    # this epoch's positions on this rank
        self._stream_redeal = None
        self.stream_order = None
        self._order = None        # a resumed stream's shard-order epoch

    # -- epoch set-up (consumer thread) --------------------------------------------------
    def begin(self, it, loader, first_iter):
        """The iterator `it` sets up an epoch (loader.py _Iter._reset, before
        it makes its sampler iterator and draws its base seed).  Takes the
        generators' states at the epoch's start; with a loaded state, first
        puts them back (mid-epoch) or replays the saved epoch's draws (a
        finished one).  Returns (draw, seed): draw a base seed as torch does,
        or else use `seed` (None: keep the iterator's)."""
        with self.lock:
            self.gen += 1
            it._st_gen = self.gen
            pending = self.pending
        index_sampler = it._index_sampler
        ds = loader.dataset
        stream = getattr(ds, "_fl_stream", False)
        iterable = loader._dataset_kind_iterable and not stream
        persistent = loader.persistent_workers and loader.num_workers > 0
        self.iterable = iterable
        self.ds_stateful = not stream and stateful(ds)
        self.worker_snaps = iterable or self.ds_stateful
        self._restore = None
        self._order = None
        draw, seed = first_iter, None
        if pending is not None:
            _check(pending, loader, iterable)   # a refused state stays loaded
            self.pending = None
        loaded, epochs_before = pending, loader._fl_epochs
        try:
            if pending is not None and pending.get("base_seed") is None and not pending["finished"]:
                loader._fl_epochs = pending["epoch"]   # saved before its epoch began: nothing else to put back
                pending = None
            self.ds_resume = None
            self._redeal = self._rebatch = self._stream_redeal = None
            if pending is not None:
                per_worker = pending.get("dataset_workers")
                if self.ds_stateful and not pending["finished"]:
                    _check_dataset_state(pending, loader)
                if self.ds_stateful and per_worker and _in_processes(loader):
                    # each worker process held its own copy of the dataset's
                    # state: each gets its own back (in the worker, before it
                    # loads anything), the loader's copy stays as it is, for the
                    # worker processes of later epochs (torch's semantics).  A
                    # finished epoch's states matter only to persistent workers
                    if not pending["finished"] or persistent:
                        self.ds_resume = {int(w): st for w, st in per_worker}
                elif self.ds_stateful and pending.get("dataset") is not None:
                    ds.load_state_dict(pending["dataset"])   # before any iterator is made
                if pending["finished"]:
                    # a fresh epoch, after the generators drew what the saved epoch drew
                    if not iterable:
                        self._drain(loader, index_sampler, pending)
                    loader._fl_epochs = pending["epoch"] + 1
                    draw, seed = (False, pending["base_seed"]) if persistent and pending["base_seed"] is not None \
                        else (True, None)
                else:
                    loader._fl_epochs = pending["epoch"]
                    self._restore = pending
                    self._order = (pending.get("stream") or {}).get("order")
                    if stream:   # another topology or batch size: this rank's share of what no rank received
                        from . import elastic   # resume only: a run that never loads a state never loads it

                        self._stream_redeal = elastic.stream_plan(ds, pending, loader.batch_size)
                    if not iterable:
                        s = pending["sampler"] or {}
                        if not stream:   # first: a sampler of another kind is the error to name
                            self._plan_sampler(pending, loader, index_sampler)
                        _put_seedable(index_sampler, s)   # first: a state it cannot put back is the error to name
                        self._set_rngs(loader, index_sampler, s)
                        dist = _dist_sampler(index_sampler)
                        if dist is not None and s.get("dist_epoch") is not None:
                            dist.set_epoch(s["dist_epoch"])   # the saved epoch's order, set_epoch called or not
                    # the saved set-up drew its base seed: draw it again from the
                    # restored generator (same value, same generator state after);
                    # never from torch's global RNG, which is the training loop's
                    draw = bool(pending.get("drew_seed")) and _is_generator(getattr(loader, "generator", None))
                    seed = pending["base_seed"]
        except BaseException:
            # a refused state (a plan that cannot be made) stays loaded, as _check's refusals do:
            # a later iter() refuses it again instead of starting the epoch from its first sample
            with self.lock:
                if self.pending is None:
                    self.pending = loaded
            loader._fl_epochs = epochs_before
            raise
        self.drew_seed = draw if self._restore is None else bool(self._restore.get("drew_seed"))
        self.num_yielded = 0 if self._restore is None else self._restore["num_yielded"]
        if self._redeal is not None or self._rebatch is not None or self._stream_redeal is not None:
            self.num_yielded = 0   # batches are numbered anew from the resumed place
        self.finished = False
        self.snaps = {}
        self.snap_lo = self.num_yielded
        self.workers, self.ended, self.last_wid = {}, set(), -1
        self.ds_state = self._restore.get("dataset") if self._restore is not None else None
        self.ds_workers = {int(w): st for w, st in (self._restore.get("dataset_workers") or [])} \
            if self._restore is not None else {}
        self.target, self.pulls, self.global_rng, self.dist_epoch = None, None, None, None
        self.seedable, self.accel_skip = None, 0
        self.rngs, self.global_want = [], False
        if not iterable:
            roles, self.global_want = _rng_roles(loader, index_sampler)
            if self._restore is not None:
                self.rngs = (self._restore["sampler"] or {}).get("rngs") or []   # the saved epoch's start
            else:
                self.rngs = _capture(roles)
        return draw, seed

    def _plan_sampler(self, pending, loader, index_sampler):
        """A mid-epoch state of a map-style dataset: deal the epoch's
        remaining samples again (a DistributedSampler state on another
        topology or batch size, elastic.py), cut the sampler's order into
        batches of another size from the saved sample on, or neither (the
        state's batches are drawn again as they were)."""
        from . import elastic

        self._redeal = elastic.plan(pending, loader, index_sampler)
        if self._redeal is not None:
            return
        b = sampling.batching(index_sampler)
        saved_b, skip = pending.get("batch"), int(pending.get("skip") or 0)
        if b is not None and saved_b is None and pending.get("batch_size") is not None:
            saved_b = pending["batch_size"]   # a state from before "batch" was saved
        if b is not None and saved_b == b[1] and not skip:
            return
        if b is None or saved_b is None:
            if pending.get("batch_size") != loader.batch_size:
                raise ValueError(f"fastloader: the state was saved by a loader with "
                                 f"batch_size={pending.get('batch_size')!r}, this one has "
                                 f"{loader.batch_size!r}, and its batches are not cut by torch's "
                                 "BatchSampler from a sampler's order, so they cannot be cut again at another size; "
                                 "resume with the same batch_size")
            return
        if stateful(b[0]) or stateful(index_sampler):
            raise ValueError(f"fastloader: the state was saved at batch_size={saved_b}, this loader has {b[1]}, and "
                             f"its sampler {type(b[0]).__name__} keeps its own state, counted in its batches; "
                             "resume with the same batch_size")
        skipped = int((pending.get("sampler") or {}).get("accel_skip") or 0)   # skip_first_batches' batches
        self._rebatch = skip + (int(pending["num_yielded"]) + skipped) * int(saved_b)

    def _set_rngs(self, loader, index_sampler, saved):
        for roles, enc in saved.get("rngs") or []:
            for role in roles:
                gen = _role_object(loader, index_sampler, role)
                if not _is_generator(gen):
                    raise ValueError(f"fastloader: the state holds the {role} generator's state, but this loader's "
                                     f"{role} generator is {gen!r}: build the loader as the saved one was")
                _rng_set(gen, enc)

    def _drain(self, loader, index_sampler, pending):
        """A state taken after its epoch's StopIteration: the generators make
        the saved epoch's draws again (its sampler set-up, base seed and
        every batch), so the next epoch draws what an uninterrupted run
        draws.  Nothing random (no generator) -> nothing to do; torch's
        global RNG is the training loop's to restore."""
        s = pending["sampler"] or {}
        seeded = _put_seedable(index_sampler, s)   # replayed: its epoch moves on as the saved one's did
        if not s.get("rngs") and not seeded:
            return
        self._set_rngs(loader, index_sampler, s)
        itr = sampling.batches(index_sampler)
        gen = getattr(loader, "generator", None)
        if pending.get("drew_seed") and _is_generator(gen):
            # as loader.py _Iter._reset draws it
            if torch is not None and isinstance(gen, torch.Generator):
                torch.empty((), dtype=torch.int64).random_(generator=gen)
            elif _numpy_generator(gen):
                gen.integers(0, 2**63 - 1)
        for _ in itr:
            pass

    def attach(self, it, loader, ep):
        """The epoch's _Epoch exists (its base seed is drawn, no batch is yet):
        counts the sampler's draws from here on, puts a resumed epoch's
        sampler back in place (loaded, or drawn again without loading any
        data), and hands the workers their hooks."""
        restore = self._restore
        ep.snapshot = WorkerSnapshot(self.ds_stateful) if self.worker_snaps else None
        ep.ds_resume, self.ds_resume = self.ds_resume, None
        if self.iterable:
            if restore is not None:
                self._restore_python(restore, ep)
        else:
            self._setup_sampler(it, loader, it._index_sampler)
            if restore is not None and self._stream_redeal is None:
                self._restore_sampler(it, loader, it._index_sampler, restore)
        ds = loader.dataset
        if getattr(ds, "_fl_stream", False):
            order = self._order
            if order is None:
                order = ds._set_epoch if ds._set_epoch is not None else ep.epoch
            self.stream_order = order
            redeal, self._stream_redeal = self._stream_redeal, None
            if redeal is not None:
                ids, keep, nominal, self.stream_hist = redeal
                ep.stream_start = (0, order, (ids, keep, nominal))
                self.stream_len = nominal
                self.pulls._it = iter(_BatchSampler(range(nominal), loader.batch_size, loader.drop_last))
                self.pulls.n = 0
            else:
                self.stream_hist, self.stream_len = [], len(ds)
                ep.stream_start = (self.num_yielded * loader.batch_size, order)
        else:
            self.stream_order = None
        self._restore = None
        with self.lock:
            self.started = True
            self.epoch = ep.epoch
            self.base_seed = int(ep.base_seed)
            self.seed = loader._fl_seed
            self.num_workers = loader.num_workers
            self.batch_size = loader.batch_size
            self.dataset_len = _dataset_len(loader)

    def _setup_sampler(self, it, loader, index_sampler):
        target_obj, under = None, _under(index_sampler)
        if stateful(it._sampler_iter):
            self.target, target_obj = "iter", it._sampler_iter
        elif stateful(index_sampler):
            self.target, target_obj = "index_sampler", index_sampler
        elif stateful(under):
            self.target, target_obj = "sampler", under
        if self.target is not None:
            self.global_want = False
        dist = _dist_sampler(index_sampler)
        self.dist_epoch = int(dist.epoch) if dist is not None else None
        sd = _seedable_sampler(index_sampler)
        self.seedable = [int(sd.epoch), int(sd.initial_seed)] if sd is not None else None
        self.accel_skip = sampling.accelerate_skip(index_sampler)
        self.pulls = it._sampler_iter = _Pulls(it._sampler_iter, self, target_obj)
        b = sampling.batching(index_sampler)
        inner = b[0] if b is not None else index_sampler
        self.batch = b[1] if b is not None else None
        self.dist = sampling.dist_like(inner)
        self.deal = None
        plain = sampling.plain_dist(inner)
        if plain is not None and b is not None:
            from . import elastic   # a DistributedSampler epoch: its deal, for an elastic resume

            self.deal = elastic.first_deal(plain)
        self.skip = 0

    def _restore_sampler(self, it, loader, index_sampler, restore):
        s = restore["sampler"] or {}
        k = restore["num_yielded"]
        pulls = self.pulls
        st = s.get("state")
        if self._redeal is not None:
            # this rank's share of the epoch's remaining samples (elastic.py)
            from . import elastic

            indices, self.deal = self._redeal
            self._redeal = None
            _, B, drop = sampling.batching(index_sampler)
            pulls._it = elastic.array_batches(indices, B, drop)
            pulls.n = 0
            return
        rebatch, self._rebatch = self._rebatch, None
        if self.target is not None and st is not None and k > 0:
            if self.target == "iter":
                pulls._it.load_state_dict(st)         # the epoch's fresh iterator
            else:
                (index_sampler if self.target == "index_sampler" else _under(index_sampler)).load_state_dict(st)
                pulls._it = iter(index_sampler)
            pulls.n = k
            self.snaps[k] = st
            return
        # draw the k batches again (indices only), torch's global RNG as it
        # was before the sampler's first draw, then as the training loop has it
        self.global_rng = s.get("global")
        cur = None
        if self.global_rng is not None and torch is not None:
            cur = torch.get_rng_state()
            _global_set(self.global_rng)
        try:
            if rebatch is not None:
                # the saved samples drawn again from the inner sampler, the
                # rest cut into batches of this loader's size
                from . import elastic

                inner, B, drop = sampling.batching(index_sampler)
                src = iter(inner)
                for i in range(rebatch):
                    try:
                        next(src)
                    except StopIteration:
                        raise ValueError(f"fastloader: the state is {rebatch} samples into the epoch, but this "
                                         f"loader's sampler has only {i}: the dataset or sampler differs from the "
                                         "saved one") from None
                pulls._it = elastic.Batches(src, B, drop)
                pulls.n = 0
                self.skip = rebatch
            # skip_first_batches: the saved epoch skipped `was` batches, this one skips `now`
            was, now = int(s.get("accel_skip") or 0), sampling.accelerate_skip(index_sampler)
            if rebatch is None and was + k < now:
                raise ValueError(f"fastloader: the state is {k} batches into an epoch that skipped {was} "
                                 f"(skip_first_batches), and this loader skips {now}: past the saved place; resume "
                                 f"without skip_first_batches, or skip at most {was + k}")
            for i in range(was + k - now if rebatch is None else 0):
                try:
                    next(pulls)
                except StopIteration:
                    raise ValueError(f"fastloader: the state is {k} batches into the epoch, but this loader's "
                                     f"sampler has only {i}: the dataset or sampler differs from the saved one")
            if rebatch is None:
                pulls.n = k   # counted as the saved run counted them
            if cur is not None and pulls._back is None:
                # the sampler's next draw may still read the global RNG (a
                # RandomSampler seeds itself at its first draw): make it now
                try:
                    pulls._back = next(pulls._it)
                except StopIteration:
                    pulls._back = _END
        finally:
            if cur is not None:
                torch.set_rng_state(cur)

    def _restore_python(self, restore, ep):
        w = restore.get("workers") or {}
        iters = {int(wid): (int(b), st) for wid, b, st in w.get("iters", [])}
        self.workers = {wid: [b, st] for wid, (b, st) in iters.items()}
        self.ended = set(w.get("ended", []))
        self.last_wid = int(w.get("last", -1))
        ep.resume = _Resume(iters, set(self.ended), self.last_wid)
        if any(st is None and b for b, st in iters.values()) and not self.warned:
            self.warned = True
            warnings.warn("fastloader: the iterable dataset's iterators have no state_dict/load_state_dict, so "
                          "resuming draws the samples each worker had delivered again and drops them; "
                          "implement them for a resume that costs nothing", UserWarning, stacklevel=5)


    # -- as batches are handed out (consumer thread) ----------------------------------------
    def yielded(self, it, ep, seq):
        """Batch `seq` of iterator `it` reached the training loop (or raised there)."""
        if it._st_gen != self.gen:
            return
        with self.lock:
            self.num_yielded += 1
            if self.snaps:
                for n in range(self.snap_lo, self.num_yielded):
                    self.snaps.pop(n, None)
                self.snap_lo = self.num_yielded
            if ep.snapshot is not None:
                self._take_snapshot(ep, seq)

    def again(self, it, ep, seq, wid):
        """Batch `seq` gave no batch: worker `wid`'s iterator had ended."""
        if it._st_gen != self.gen:
            return
        with self.lock:
            self.ended.add(wid)
            ep.snaps.pop(seq, None)

    def finished_epoch(self, it):
        if it._st_gen == self.gen:
            with self.lock:
                self.finished = True

    def _take_snapshot(self, ep, seq):
        entry = ep.snaps.pop(seq, None)
        if entry is None:
            return
        wid, st, ds_st, *in_process = entry
        if self.iterable:
            rec = self.workers.setdefault(wid, [0, None])
            rec[0] += 1
            rec[1] = st
            self.last_wid = wid
        if self.ds_stateful:
            self.ds_state = ds_st
            if in_process:  # the state of that worker process's copy of the dataset
                self.ds_workers[wid] = ds_st

    # -- the state ------------------------------------------------------------------------
    def state_dict(self, loader):
        if getattr(loader, "in_order", True) is False:
            raise ValueError("fastloader: state_dict() needs in_order=True: with in_order=False the batches "
                             "received are not a prefix of the epoch, so no position describes them")
        with self.lock:
            if self.pending is not None:
                return _copy(self.pending)
            if not self.started:
                return {"format": FORMAT, "version": VERSION, "epoch": int(loader._fl_epochs), "num_yielded": 0,
                        "finished": False, "base_seed": None, "seed": loader._fl_seed,
                        "batch_size": loader.batch_size, "num_workers": loader.num_workers, "dataset_len": None,
                        "drew_seed": True, "sampler": None, "workers": None, "dataset": None, "stream": None}
            k = self.num_yielded
            sampler = None
            if not self.iterable:
                st = None
                if self.target is not None:
                    if k in self.snaps:
                        st = self.snaps[k]
                    elif k > 0 and self.pulls is not None and self.pulls.n == k:
                        st = self.pulls._target.state_dict()   # nothing drawn ahead: its state now
                        self.snaps[k] = st
                sampler = {"rngs": [[list(r), e] for r, e in self.rngs], "global": self.global_rng,
                           "dist_epoch": self.dist_epoch, "seedable": self.seedable,
                           "accel_skip": self.accel_skip,
                           "target": self.target, "state": st,
                           "dist": None if self.dist is None else list(self.dist)}
            deal = None
            if self.deal is not None:
                deal = dict(self.deal, source=[list(r) for r in self.deal["source"]])
                deal["consumed"] = min(self.skip + k * (self.batch or 0), deal["share"])
            workers = None
            if self.iterable:
                iters = []
                for wid in sorted(self.workers):
                    b, st = self.workers[wid]
                    if isinstance(st, Failed):
                        raise st.exc
                    iters.append([wid, b, st])
                workers = {"iters": iters, "ended": sorted(self.ended), "last": self.last_wid}
            ds_state = self.ds_state
            if isinstance(ds_state, Failed):
                raise ds_state.exc
            ds_workers = None
            if self.ds_workers:
                ds_workers = []
                for wid in sorted(self.ds_workers):
                    st = self.ds_workers[wid]
                    if isinstance(st, Failed):
                        raise st.exc
                    ds_workers.append([wid, st])
            return {"format": FORMAT, "version": VERSION, "epoch": self.epoch, "num_yielded": k,
                    "finished": self.finished, "base_seed": self.base_seed, "seed": self.seed,
                    "batch_size": self.batch_size, "num_workers": self.num_workers,
                    "dataset_len": self.dataset_len, "drew_seed": self.drew_seed, "sampler": sampler,
                    "workers": workers, "dataset": ds_state, "dataset_workers": ds_workers,
                    "stream": None if self.stream_order is None else self._stream_state(loader, k),
                    "batch": self.batch, "skip": self.skip, "elastic": deal}

    def _stream_state(self, loader, k):
        """A WebDataset epoch's place: the shard order's epoch, the deal
        (this rank of `world`, the epoch's earlier deals) and the positions
        received, with what elastic.stream_plan checks a resume against."""
        ds = loader.dataset
        consumed = self.stream_len if self.finished else min(k * loader.batch_size, self.stream_len)
        return {"order": self.stream_order, "world": ds.world_size, "rank": ds.rank,
                "history": [[w, list(p)] for w, p in self.stream_hist], "consumed": int(consumed),
                "seed": ds.seed, "shuffle": ds.shuffle, "epoch_length": ds.epoch_length, "shards": len(ds.urls),
                "shardshuffle": ds.shardshuffle, "names": ds._names_digest(),
                "skipped": len(ds.skipped_shards) - ds._skipped_at_begin}

    def load(self, loader, state):
        if not state:
            return   # torchdata: an empty state is no state
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError("fastloader: load_state_dict() takes what fastloader.DataLoader.state_dict() "
                             f"returned; got {type(state).__name__} without format {FORMAT!r}")
        if state.get("version") != VERSION:
            raise ValueError(f"fastloader: a loader state of version {state.get('version')!r}; this fastloader "
                             f"reads version {VERSION}")
        with self.lock:
            self.pending = _copy(state)
            self.gen += 1   # the current iterator no longer moves the position


def _copy(state):
    """A copy of a state deep enough that the caller may change it."""
    import copy

    return copy.deepcopy(state)


def _check(state, loader, iterable):
    """Refuse a state that cannot mean the same position in this loader."""
    def bad(what, saved, now):
        raise ValueError(f"fastloader: the state was saved by a loader with {what}={saved!r}, this one has "
                         f"{now!r}; resume with the same settings")

    if state.get("seed") != loader._fl_seed:
        bad("seed", state.get("seed"), loader._fl_seed)
    old_stream = getattr(loader.dataset, "_fl_stream", False) and (state.get("stream") or {}).get("world") is None
    if (iterable or old_stream) and state.get("batch_size") != loader.batch_size and not state["finished"]:
        bad("batch_size", state.get("batch_size"), loader.batch_size)
    n = _dataset_len(loader)
    new_stream = getattr(loader.dataset, "_fl_stream", False) and (state.get("stream") or {}).get("world") is not None
    if state.get("dataset_len") is not None and n is not None and n != state["dataset_len"] and not new_stream:
        bad("len(dataset)", state["dataset_len"], n)
    if iterable and state.get("workers") and state["num_workers"] != loader.num_workers \
            and not state["finished"]:
        raise ValueError(f"fastloader: an iterable dataset's state holds the place of each of its "
                         f"{state['num_workers']} workers; resume it with num_workers={state['num_workers']} "
                         f"(this loader has {loader.num_workers})")


def _check_dataset_state(state, loader):
    """Refuse a dataset's own mid-epoch state that cannot go where it was:
    per-worker states (worker processes) need the same workers, and one
    shared state (threads) cannot be split among processes."""
    per_worker = state.get("dataset_workers")
    procs = _in_processes(loader)
    if per_worker and (not procs or state["num_workers"] != loader.num_workers):
        now = f"{loader.num_workers} worker {'processes' if procs else 'threads'}"
        raise ValueError(f"fastloader: the state holds the dataset's own state (state_dict) of each of its "
                         f"{state['num_workers']} worker processes, which this loader ({now}) cannot give back: "
                         f"a dataset's own state is not dealt again. Resume with num_workers={state['num_workers']} "
                         "and worker_mode='process', or keep the dataset's place in the sampler instead")
    if not per_worker and state.get("dataset") is not None and procs and loader.num_workers > 1:
        raise ValueError(f"fastloader: the state holds one state of the dataset's own (state_dict), saved where "
                         f"the workers shared one dataset object; this loader's {loader.num_workers} worker "
                         "processes each read their own copy, so it cannot be given back: resume with "
                         "worker_mode='thread' (or num_workers <= 1)")


def _in_processes(loader):
    """Does the loader run its Python dataset in worker processes?"""
    if not loader.num_workers:
        return False
    from .worker_mode import choose_worker_mode

    return choose_worker_mode(loader)[0] == "process"


def _dataset_len(loader):
    try:
        return len(loader.dataset)
    except (TypeError, NotImplementedError):
        return None


def tracker(loader):
    """The loader's Tracker (made on first use)."""
    tr = loader.__dict__.get("_fl_tracker")
    if tr is None:
        tr = loader.__dict__["_fl_tracker"] = Tracker()
    return tr
