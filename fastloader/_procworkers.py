"""Process workers (``worker_mode="process"``): the loader's pool of worker
processes and the loop each of them runs.

    loader process (ProcPool)                    worker process i (_worker_main)
    -------------------------------------        ------------------------------------
    ring = _C.ShmRing(slots, 1 GiB each)         ring = ShmRing.attach(fd)  (fork: inherited;
      (anonymous shared file, sparse)              spawn/forkserver: passed with SCM_RIGHTS)
                                                 seed random/torch/NumPy with base_seed + i,
                                                 get_worker_info(), worker_init_fn(i)
    submit:
      ("job", gen, seq, indices) ------------->  ring.claim(i); fetch(...): __getitem__ /
                                                   __getitems__ / next(it), collate_fn; default
                                                   collation's first row / stack takes the
                                                   lowest free slot and writes straight into it
    wait: the pipes and the processes'   <-----  the batch pickled with every array/tensor
      sentinels (a death is seen at once)          replaced by (slot, offset, dtype, shape):
    ring.adopt(slot, i); arrays -> views of        only that descriptor (and the slot) crosses
      the slot (ring.buffer)                       the pipe
    the slot is free again when the job's
      reference and every view are gone (a dead worker's slots: ring.reclaim(i))

A slot is taken when the batch's first sample is written into it (default
collation writes each sample's large arrays into their rows as the sample
comes, collate.RowWriter; otherwise at collation), not when the job is
sent, so a slot (and its pages, which stay resident once written) serves
only batches that exist or are being loaded, not the whole prefetch
window: one slot a busy worker, where torch's worker holds the batch's
samples in its heap and then a shared-memory batch beside them.

Semantics follow torch's worker processes: job k goes to worker k mod N
(the next worker whose iterable has not ended), each worker runs its jobs in
order, and each is seeded as torch's _worker_loop seeds, so the draws a
``__getitem__`` makes from ``random``, ``torch`` and NumPy match torch's
DataLoader for the same generator.  Arrays and tensors that default collation
did not stack into the slot (a custom collate_fn's) are copied into it once;
what does not fit, and everything that is not an array, is pickled.

Lifetime: stopping sends ("stop",) and waits briefly for the workers to
finish their current batch, then terminates (SIGTERM, then SIGKILL) what is
left, so closing never hangs on user code.  A worker exits on its own when
the loader's process goes away: the parent-death signal (SIGKILL) where it
can be set, otherwise within a second (it watches its parent's pid while
waiting for work, and its pipe reports EOF).  The ring's file has no name,
so no shared memory outlives the processes that map it.
"""
from __future__ import annotations

import collections
import ctypes
import io
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import replace
from multiprocessing import connection as _mpc
from multiprocessing import reduction as _reduction

import numpy as np

from . import _C
from ._worker import CANCELLED, ERR, OK, Epoch, annotate, fetch
from .state import Failed
from .worker_info import WorkerInfo, patch_torch_worker_info, set_process_info

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

# Address space reserved per slot: the file is sparse, so this costs no
# memory; a batch larger than this is pickled instead (with a warning).
SLOT_BYTES = 1 << 30
# how long close() lets busy workers finish their batch before terminating them
STOP_GRACE_S = 1.0
# longest wait without looking at the workers' health and the clock
_POLL_S = 0.5

_STOP = ("stop",)

# torch's warning when a worker Process cannot be started for a pickling error
PICKLE_HINT = ("Got pickle error when attempting to start a worker Process. This might be because the worker Process "
               "arguments are not picklable. Python 3.14+ changed the multiprocessing start method in non-Mac POSIX "
               "platforms to 'forkserver', which requires the worker Process arguments to be picklable. You can "
               "also try multiprocessing.set_start_method('fork').")


# ----------------------------------------------------------------------------
# passing the ring's descriptor to a spawned worker


class _Fd:
    """A file descriptor in a Process's arguments: inherited as is by a
    forked child; for spawn and forkserver pickled as multiprocessing's
    DupFd, which hands it over (spawn: kept open across exec; forkserver:
    sent with SCM_RIGHTS)."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _Fd._rebuild, (_reduction.DupFd(self.fd),)

    @staticmethod
    def _rebuild(dup):
        return _Fd(dup.detach())


# ----------------------------------------------------------------------------
# the descriptor: a batch pickled with its arrays left in the slot


def _torch_ok(t):
    return (t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad
            and not t.is_quantized and not getattr(t, "is_nested", False) and not t.is_conj() and not t.is_neg())


class _SlotPickler(pickle.Pickler):
    """Pickles a batch with every plain array/tensor placed in the slot (in
    place when collation stacked it there, else copied once) and replaced by
    ("t" | "n", slot, offset, nbytes, dtype, shape)."""

    def __init__(self, file, ring):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.ring = ring   # its batch begun with ring.claim(): the slot is the one collation took, if any
        self.slot = -1
        self.pickled_bytes = 0  # array bytes that did not fit (or found no free slot) and were pickled

    def _place(self, ptr, nbytes, contiguous):
        """Offset of the array's bytes in the slot, or None when they are
        elsewhere (then: the offset of fresh room for them, and True; the
        first such allocation takes a slot when collation took none)."""
        slot = self.ring.slot
        if slot >= 0 and contiguous:
            lo = self.ring.slot_address(slot)
            if lo <= ptr and ptr + nbytes <= lo + self.ring.slot_bytes:
                self.slot = slot
                return ptr - lo, False
        off = self.ring.alloc(nbytes)
        self.slot = self.ring.slot
        if off < 0:
            self.pickled_bytes += nbytes
            return None, False
        return off, True

    def persistent_id(self, obj):
        tp = type(obj)
        if torch is not None and tp is torch.Tensor:
            if not _torch_ok(obj):
                return None
            n = obj.numel() * obj.element_size()
            if n == 0:
                return None
            off, copy = self._place(obj.data_ptr(), n, obj.is_contiguous())
            if off is None:
                return None
            if copy:
                dst = torch.from_dlpack(self.ring.buffer(self.slot, off, n)).view(obj.dtype).view(obj.shape)
                dst.copy_(obj)
            return ("t", self.slot, off, n, str(obj.dtype)[6:], tuple(obj.shape))
        if tp is np.ndarray:
            if obj.dtype.hasobject or obj.dtype.kind in "OSUVMm" or obj.nbytes == 0:
                return None
            n = obj.nbytes
            off, copy = self._place(obj.__array_interface__["data"][0], n, obj.flags.c_contiguous)
            if off is None:
                return None
            if copy:
                dst = np.from_dlpack(self.ring.buffer(self.slot, off, n)).view(obj.dtype).reshape(obj.shape)
                dst[...] = obj
            return ("n", self.slot, off, n, obj.dtype.str, obj.shape)
        return None


class _SlotUnpickler(pickle.Unpickler):
    """The loader's side: ("t"/"n", slot, offset, ...) -> a tensor / array
    viewing the ring (each view holds the slot until it dies)."""

    def __init__(self, file, ring):
        super().__init__(file)
        self.ring = ring
        self.pinned = set()  # addresses of the views in page-locked slot memory

    def persistent_load(self, pid):
        kind, slot, off, n, dtype, shape = pid
        buf = self.ring.buffer(slot, off, n)
        if buf.pinned:
            self.pinned.add(buf.ptr)
        if kind == "t":
            return torch.from_dlpack(buf).view(getattr(torch, dtype)).view(shape)
        return np.from_dlpack(buf).view(np.dtype(dtype)).reshape(shape)


def _dump_batch(batch, ring):
    """(body bytes, array bytes pickled because the slot was full or no
    slot was free) for the batch begun with ring.claim()."""
    f = io.BytesIO()
    p = _SlotPickler(f, ring)
    p.dump(batch)
    return f.getvalue(), p.pickled_bytes


def _portable_exception(e, wid):
    """`e` with a note naming this worker process and its traceback, made
    picklable (an exception whose class cannot be rebuilt from its args
    becomes the same type with the message, or a RuntimeError naming it)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    note = f"fastloader: in worker process {wid} (pid {os.getpid()}); its traceback:\n{tb}"
    if hasattr(e, "add_note"):
        e.add_note(note)
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        pass
    notes = list(getattr(e, "__notes__", ()))
    for make in (lambda: type(e)(str(e)), lambda: RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {e}")):
        try:
            sub = make()
            for n in notes:
                sub.add_note(n) if hasattr(sub, "add_note") else None
            pickle.loads(pickle.dumps(sub))
            return sub
        except Exception:
            continue
    return RuntimeError(f"{type(e).__qualname__}: {e}\n{note}")  # pragma: no cover


# ----------------------------------------------------------------------------
# the worker process


def _set_parent_death_signal():
    """Linux: SIGKILL this process when its parent dies (the thread that
    started it, strictly: set only for loaders started from the main thread).
    Best effort."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _raise_mmap_threshold(nbytes=16 << 20):
    """glibc: malloc and free one block of `nbytes` (<= 32 MiB), which raises
    malloc's mmap threshold to it (and its trim threshold to twice that).

    A worker process's batches go to shared memory, so unlike a worker
    thread (whose collation frees a large malloc'ed batch now and then) it
    never frees a large block, and the threshold stays at 128 KiB: every
    large temporary of a NumPy __getitem__ is then mmapped and faulted in
    afresh (~550 page faults a sample in benchmarks/bench_python.py's numpy
    dataset, 2x its time).  The cost: up to 2 x nbytes of freed heap kept
    per worker.  Elsewhere (another libc) nothing happens."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        p = libc.malloc(nbytes)
        if p:
            libc.free(p)
    except Exception:  # pragma: no cover - no C library to ask
        pass


def _seed_like_torch(base_seed, wid):
    """What torch's _worker_loop does: random and torch get base_seed + id,
    NumPy's global generator a state derived from both."""
    seed = base_seed + wid
    random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)
        from torch.utils.data._utils.worker import _generate_state

        np.random.seed(_generate_state(base_seed, wid))
    else:
        np.random.seed(np.random.SeedSequence([base_seed, wid]).generate_state(4))
    return seed


def _make_epoch(spec):
    ep = Epoch(dataset=spec["dataset"], iterable=spec["iterable"], auto_collation=spec["auto_collation"],
                batch_size=spec["batch_size"], drop_last=spec["drop_last"], collate_fn=spec["collate_fn"],
                base_seed=spec["base_seed"], epoch=spec["epoch"], num_workers=spec["num_workers"])
    ep.native_seed = spec["native_seed"]
    # resume (state.py): the place after each batch travels back with it;
    # a resumed epoch's iterators are put back where they were
    ep.snapshot = spec.get("snapshot")
    ep.resume = spec.get("resume")
    ep.ds_resume = spec.get("ds_resume")
    hook = ep.batch_hook
    if spec.get("batch_hook") is not None:  # a native dataset's batches (NativeProcessBackend): into the slot
        ep.batch_hook = spec["batch_hook"]
    elif hook is not None:  # a batch hook gathers into the loader's BatchPool: here into fresh buffers
        ep.batch_hook = lambda indices, pool, _h=hook: _h(indices, None)
    return ep


class _ParentWatch:
    """Is the loader's process still there?  Fork and spawn: our parent's
    pid; forkserver: the fork server (our parent), which exits with it."""

    def __init__(self, parent_pid):
        self.ppid = parent_pid if parent_pid is not None else os.getppid()

    def alive(self):
        return os.getppid() == self.ppid


def _next_message(conn, pending, watch):
    """The next message (queued ones first), or None when the loader is
    gone (EOF, or our parent changed)."""
    if pending:
        return pending.popleft()
    while True:
        try:
            if conn.poll(_POLL_S):
                return conn.recv()
        except (EOFError, OSError):
            return None
        if not watch.alive():
            return None


def _superseded(conn, pending, gen):
    """Queue what has arrived; True when a stop or a newer epoch is among it
    (the job of generation `gen` in hand is then dropped)."""
    try:
        while conn.poll(0):
            pending.append(conn.recv())
    except (EOFError, OSError):
        return True
    return any(m[0] == "stop" or (m[0] in ("gen", "epoch") and m[1] != gen) for m in pending)


def _worker_main(wid, num_workers, conn, ring_fd, nslots, slot_bytes, spec, parent_pid, inherited, deathsig):
    """The loop of worker process `wid` (see the module docstring)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    except ValueError:  # pragma: no cover - not the main thread
        pass
    for c in inherited:  # fork: the loader's ends of the pipes, so EOF means it is gone
        try:
            c.close()
        except OSError:
            pass
    if deathsig:
        _set_parent_death_signal()
    watch = _ParentWatch(parent_pid)
    if not watch.alive():
        return
    ring = _C.ShmRing.attach(ring_fd.fd, nslots, slot_bytes)  # maps its own duplicate
    if not inherited:  # spawn / forkserver: a copy passed for this (forked: the parent's, left alone)
        os.close(ring_fd.fd)
    if torch is not None:
        torch.set_num_threads(1)
    _raise_mmap_threshold()
    seed = _seed_like_torch(spec["base_seed"], wid)
    # torch's WorkerInfo for a worker process, seen from any of its threads
    # (torch's get_worker_info() included) as torch's process global is
    info = WorkerInfo(id=wid, num_workers=num_workers, seed=seed, dataset=spec["dataset"],
                      worker_method="multiprocessing", epoch=spec["epoch"], base_seed=spec["base_seed"])
    set_process_info(info)
    patch_torch_worker_info()
    init_error = None
    if spec["worker_init_fn"] is not None:
        try:
            spec["worker_init_fn"](wid)
        except Exception as e:
            init_error = annotate(e, f"worker_init_fn({wid}) in worker process {wid}")
    ep = _make_epoch(spec)
    resume_error = _load_dataset_state(ep, wid)  # this epoch's jobs only
    gen = spec["gen"]
    pending = collections.deque()
    while True:
        msg = _next_message(conn, pending, watch)
        if msg is None or msg[0] == "stop":
            return
        if msg[0] == "gen":  # the loader dropped what it had asked for (Ctrl-C, an abandoned epoch)
            gen = msg[1]
            continue
        if msg[0] == "epoch":  # persistent workers: a new epoch (torch's _ResumeIteration)
            _, gen, epoch, base_seed, native_seed, snapshot, resume, ds_resume = msg
            spec.update(epoch=epoch, base_seed=base_seed, native_seed=native_seed, snapshot=snapshot,
                        resume=resume, ds_resume=ds_resume)
            info = replace(info, epoch=epoch, base_seed=base_seed)  # frozen, as torch's
            set_process_info(info)
            ep = _make_epoch(spec)
            resume_error = _load_dataset_state(ep, wid)
            continue
        _, g, seq, indices = msg
        if g != gen or _superseded(conn, pending, g):
            _send(conn, ("skip", g, seq, wid, 0.0, None, CANCELLED, 0, b"", None, 0))
            continue
        t0 = time.perf_counter()
        st = ep.stage_s[wid]
        st0 = list(st)
        ring.claim(wid)  # the first array laid out takes a free slot
        ep.pool = ring
        if init_error is not None or resume_error is not None:
            status, value = ERR, init_error or resume_error
        else:
            status, value = fetch(ep, wid, seq, indices)
        body, pickled = b"", 0
        if status == OK:
            try:
                body, pickled = _dump_batch(value, ring)
            except Exception as e:
                status, value = ERR, annotate(e, f"batch {seq} while sending it from worker process {wid}")
        value = None if status == OK else value
        if status == ERR:
            value = _portable_exception(value, wid)
        slot = ring.slot  # taken, if at all, by this batch (on an error too: the loader frees it)
        used = ring.used if slot >= 0 else 0
        busy = time.perf_counter() - t0
        stage = [a - b for a, b in zip(st, st0)]
        snap = _portable_snapshot(ep.snaps.pop(seq, None), wid)
        if not _send(conn, ("res", g, seq, wid, busy, stage, status, used, body, value, pickled, snap, slot)):
            return


def _load_dataset_state(ep, wid):
    """A resumed epoch: this worker's copy of the dataset gets the state it
    had (state.Tracker, "dataset_workers").  Returns None, or the exception
    load_state_dict raised (annotated), which every job then reports."""
    states = ep.ds_resume
    if not states or wid not in states:
        return None
    try:
        ep.dataset.load_state_dict(states[wid])
    except Exception as e:
        return annotate(e, f"dataset.load_state_dict() in worker process {wid}, resuming")
    return None


def _portable_snapshot(snap, wid):
    """A worker's place after a batch (state.WorkerSnapshot's entry), with
    any state_dict() failure in it made picklable."""
    if snap is None:
        return None
    return tuple(Failed(_portable_exception(x.exc, wid)) if isinstance(x, Failed) else x for x in snap)


def _send(conn, msg):
    try:
        conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        return True
    except (OSError, EOFError):  # the loader is gone
        return False


# ----------------------------------------------------------------------------
# the loader's side


def _describe_exit(code):
    if code is None:
        return "exited unexpectedly"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"was killed by {name}"
        if -code == signal.SIGKILL:
            how += (" (the kernel's out-of-memory killer sends it: check `dmesg`; lower num_workers, "
                    "batch_size or prefetch_factor if so)")
        elif -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
            how += " (a crash in native code the dataset called)"
        return "exited unexpectedly: it " + how
    return f"exited unexpectedly with exit code {code} (its traceback, if any, is above on stderr)"


class ProcPool:
    """N worker processes, their pipes and the shared-memory ring, seen by
    the iterator (loader.py) as an engine: wait / reset / close / closed /
    worker_stats / set_active / outstanding.  Used from the consumer thread
    only (as torch's iterator is)."""

    def __init__(self, num_workers, mp_context, spec, nslots, pin_device=-1):
        import multiprocessing

        ctx = mp_context if mp_context is not None else multiprocessing.get_context()
        if isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self.num_workers = num_workers
        self.start_method = ctx.get_start_method()
        self._pid = os.getpid()
        self.closed = False
        self.gen = spec["gen"] = 0
        self.ring = _C.ShmRing(nslots, SLOT_BYTES)
        self.pin_device = pin_device
        self.pin_error = None
        self.jobs = {}          # (gen, seq) -> (worker, slot, indices): sent, no result yet
        self.ready = {}         # seq -> (worker, (status, value)): results of this generation
        self.pinned_ptrs = {}   # seq -> addresses of its tensors in page-locked slots (pin_memory)
        self.snaps = {}         # seq -> the worker's place after it (resume; state.WorkerSnapshot)
        self.busy_s = [0.0] * num_workers
        self.jobs_done = [0] * num_workers
        self.stage_s = None     # the epoch's stage_s (dataset/collate/pin seconds per worker)
        self.active_n = num_workers
        self.error = None       # message of a dead worker: every later wait raises it
        self.pickled_warned = False
        self.unslotted = 0      # batches pickled whole: no slot was free (the loop keeps many alive)
        self.slots_written = 0  # 1 + the highest slot a batch came in: the slots whose pages are resident
        self.conns, self.procs = [], []
        method = self.start_method
        parent_pid = os.getpid() if method in ("fork", "spawn") else None
        deathsig = method == "forkserver" or threading.current_thread() is threading.main_thread()
        try:
            for wid in range(num_workers):
                mine, theirs = ctx.Pipe(duplex=True)
                inherited = self.conns + [mine] if method == "fork" else []
                p = ctx.Process(target=_worker_main, name=f"fastloader-worker-{wid}", daemon=True,
                                args=(wid, num_workers, theirs, _Fd(self.ring.fd), nslots, self.ring.slot_bytes,
                                      spec, parent_pid, inherited, deathsig))
                self.conns.append(mine)
                try:
                    p.start()
                except (TypeError, AttributeError, pickle.PicklingError):
                    # spawn / forkserver pickle the dataset, collate_fn and
                    # worker_init_fn: torch's hint, and its exception as it was
                    warnings.warn(PICKLE_HINT, UserWarning, stacklevel=2)
                    raise
                finally:
                    theirs.close()
                self.procs.append(p)
        except BaseException:
            self.close(0.0)
            raise
        self.by_conn = {c: i for i, c in enumerate(self.conns)}
        self.by_sentinel = {p.sentinel: i for i, p in enumerate(self.procs)}
        self.dead = set()

    # -- jobs ------------------------------------------------------------------
    def submit(self, seq, indices, worker):
        self.jobs[(self.gen, seq)] = (worker, -1, indices)  # the worker takes a slot when it collates
        if worker in self.dead:
            return
        try:
            self.conns[worker].send(("job", self.gen, seq, indices))
        except (OSError, EOFError):
            self._reap(worker)

    def _tell_all(self, msg):
        for wid, c in enumerate(self.conns):
            if wid in self.dead:
                continue
            try:
                c.send(msg)
            except (OSError, EOFError):
                self._reap(wid)

    def begin_epoch(self, spec):
        """Persistent workers: a new epoch in a new generation (their
        iterable datasets start over, as with torch's _ResumeIteration)."""
        self.reset()
        self._tell_all(("epoch", self.gen, spec["epoch"], spec["base_seed"], spec["native_seed"],
                        spec.get("snapshot"), spec.get("resume"), spec.get("ds_resume")))

    def reset(self):
        """A new generation: results of the current one are dropped when
        they arrive (their slots freed then); the workers skip the jobs of
        the old one still queued."""
        self.gen += 1
        self.ready.clear()
        self.pinned_ptrs.clear()
        self.snaps.clear()
        if not self.closed:
            self._tell_all(("gen", self.gen))
        return self.gen

    def outstanding(self):
        return sum(1 for (g, _s) in self.jobs if g == self.gen) + len(self.ready)

    def wait(self, seq, timeout=None):
        """(seq, worker, (status, value)) for job `seq` of this generation
        (-1: the lowest finished one), or None after `timeout` seconds.
        RuntimeError when a worker died; LookupError when no such job."""
        if self.closed:
            raise RuntimeError("the DataLoader's worker processes were shut down")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.error is not None:
                raise RuntimeError(self.error)
            if seq >= 0 and seq in self.ready:
                wid, res = self.ready.pop(seq)
                return seq, wid, res
            if seq < 0 and self.ready:
                k = min(self.ready)
                wid, res = self.ready.pop(k)
                return k, wid, res
            if (seq >= 0 and (self.gen, seq) not in self.jobs) or (seq < 0 and not self.outstanding()):
                raise LookupError(f"no batch {seq} is queued or running")
            slice_s = _POLL_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                slice_s = min(slice_s, left)
            live = [i for i in range(self.num_workers) if i not in self.dead]
            ready = _mpc.wait([self.conns[i] for i in live] + [self.procs[i].sentinel for i in live], slice_s)
            for obj in ready:  # results first: a worker may have answered and then died
                if not isinstance(obj, int):
                    self._drain(self.by_conn[obj])
            for obj in ready:
                if isinstance(obj, int):
                    self._reap(self.by_sentinel[obj])

    def _drain(self, wid):
        conn = self.conns[wid]
        try:
            while conn.poll(0):
                self._take(conn.recv_bytes())
        except (EOFError, OSError):
            self._reap(wid)

    def _take(self, data):
        kind, g, seq, wid, busy, stage, status, used, body, value, *rest = pickle.loads(data)
        self.jobs.pop((g, seq), None)
        slot = rest[2] if len(rest) > 2 else -1
        if slot >= 0 and not self.ring.adopt(slot, wid):
            # the claim table disagrees with the worker: never read such a slot
            status, value = ERR, RuntimeError(
                f"fastloader: worker process {wid} named shared-memory slot {slot} for batch {seq}, "
                f"which it does not hold (claim {self.ring.claim_of(slot)})")
            slot = -1
        if slot >= self.slots_written:  # workers take the lowest free slot: the written ones are 0..this
            self.slots_written = slot + 1
        try:
            if kind == "res":
                self.busy_s[wid] += busy
                self.jobs_done[wid] += 1
            if g != self.gen:
                return  # an abandoned generation: dropped (its slot freed below)
            if stage is not None and self.stage_s is not None:
                row = self.stage_s[wid]
                for i, v in enumerate(stage):
                    row[i] += v
            if status == OK:
                if slot < 0 and rest and rest[0]:  # arrays pickled: no slot was free
                    self.unslotted += 1
                if slot >= 0 and used and self.pin_device >= 0 and self.pin_error is None:
                    self._pin(slot, used)
                try:
                    up = _SlotUnpickler(io.BytesIO(body), self.ring)
                    value = up.load()
                    if up.pinned:
                        self.pinned_ptrs[seq] = frozenset(up.pinned)
                except Exception as e:
                    status, value = ERR, annotate(e, f"batch {seq} from worker process {wid}, unpickling it")
                if slot >= 0 and rest and rest[0] and not self.pickled_warned:
                    self.pickled_warned = True
                    warnings.warn(f"fastloader: a batch of {used + rest[0]} bytes does not fit in a shared-memory "
                                  f"slot ({self.ring.slot_bytes >> 20} MiB); what did not fit is pickled",
                                  RuntimeWarning, stacklevel=2)
            if len(rest) > 1 and rest[1] is not None:
                self.snaps[seq] = rest[1]
            self.ready[seq] = (wid, (status, value))
        finally:
            if slot >= 0:
                self.ring.release(slot)  # the job's reference; the batch's views hold their own

    def _pin(self, slot, used):
        """pin_memory: page-lock every slot once, sized from the first batch
        (a quarter more, for batches of varying size)."""
        size = used + used // 4
        try:
            for s in range(self.ring.nslots):
                self.ring.pin(s, size, self.pin_device)
        except RuntimeError as e:
            self.pin_error = str(e)

    def _reap(self, wid):
        """Worker `wid`'s process ended (or its pipe broke): keep what it
        sent, then make every later wait raise, naming it and its batch."""
        if wid in self.dead:
            return
        self.dead.add(wid)
        try:
            while self.conns[wid].poll(0):
                self._take(self.conns[wid].recv_bytes())
        except (EOFError, OSError):
            pass
        self.ring.reclaim(wid)  # what it took for a batch it never handed over
        p = self.procs[wid]
        p.join(0.2)
        if self.closed:
            return
        mine = sorted((s, idx) for (g, s), (w, _slot, idx) in self.jobs.items() if w == wid and g == self.gen)
        what = ""
        if mine:
            s, idx = mine[0]
            short = list(idx) if idx is not None and len(idx) <= 8 else (f"{list(idx)[:8]}..." if idx else idx)
            what = f" while loading batch {s} (indices {short})"
        code = p.exitcode
        torch_says = ""   # torch's own first sentence for a worker a signal killed, which scripts match
        if code is not None and code < 0:
            torch_says = f"DataLoader worker (pid {p.pid}) is killed by signal: {signal.strsignal(-code)}. "
        self.error = (f"{torch_says}DataLoader worker process {wid} (pid {p.pid}) {_describe_exit(code)}{what}. "
                      f"The loader cannot go on without it; create a new iterator to start over.")

    # -- the engine's other faces ------------------------------------------------
    def worker_stats(self):
        return [{"busy_s": self.busy_s[i], "jobs": self.jobs_done[i], "pid": self.procs[i].pid}
                for i in range(self.num_workers)]

    def set_active(self, n):
        self.active_n = max(1, min(int(n), self.num_workers))
        return self.active_n

    def pids(self):
        return [p.pid for p in self.procs]

    def close(self, timeout=None):
        """Stop the workers: ask, give busy ones up to STOP_GRACE_S (or
        `timeout`, if shorter) to finish their batch, then SIGTERM and
        SIGKILL.  True when every process was reaped.  In a forked child the
        processes are the parent's: nothing is touched."""
        if self.closed:
            return True
        self.closed = True
        if os.getpid() != self._pid:
            return False
        for c in self.conns:
            try:
                c.send(_STOP)
            except (OSError, EOFError):
                pass
        grace = STOP_GRACE_S if timeout is None else max(0.0, min(timeout, STOP_GRACE_S))
        deadline = time.monotonic() + grace
        procs = [p for p in self.procs if p.pid is not None]
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + 0.5
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join(1.0)
        for c in self.conns:
            c.close()
        self.jobs.clear()
        self.ready.clear()
        return all(p.exitcode is not None for p in procs)

    def __del__(self):
        try:
            if not self.closed and os.getpid() == self._pid:
                self.close(0.0)
        except Exception:  # pragma: no cover - interpreter teardown
            pass
