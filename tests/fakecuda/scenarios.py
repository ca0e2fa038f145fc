"""Scenarios for fastloader's device copier against the fake CUDA runtime.

Run by tests/test_devcopy.py in a child process whose FASTLOADER_CUDART
points at libfakecudart.so (the CUDA library is loaded once per process, so
this cannot share the test process).  Each scenario raises on failure; the
runner prints one JSON object {name: "ok" or the traceback}.

The consumer side is written the way a DLPack consumer in C would do it:
take the capsule, rename it "used_dltensor", read the memory with a
device-to-host copy on the consumer's own stream, and call the deleter when
done.  In the fake runtime device memory is host memory and every stream is
a thread, so ordering mistakes show up as wrong bytes.
"""
import ctypes
import json
import os
import random
import sys
import traceback

import numpy as np

from fastloader import _C

lib = ctypes.CDLL(os.environ["FASTLOADER_CUDART"])
lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
lib.fakecuda_sleep_on.argtypes = [ctypes.c_void_p, ctypes.c_long]
lib.fakecuda_set_copy_delay_us.argtypes = [ctypes.c_long]
lib.fakecuda_set_fail_malloc_after.argtypes = [ctypes.c_long]
lib.cudaSetDevice.argtypes = [ctypes.c_int]
lib.fakecuda_contexts.restype = ctypes.c_uint
lib.fakecuda_counter.restype = ctypes.c_long
lib.fakecuda_device_bytes.restype = ctypes.c_long
lib.fakecuda_device_bytes.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
lib.fakecuda_live_streams.restype = ctypes.c_long
lib.fakecuda_watch_free_host.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long]

STREAM_SYNCS, EVENT_SYNCS, MALLOCS, FREES, HOST_ALLOCS, HOST_FREES, WAITS, COPIES, HOST_FREES_STALLED = range(9)

capi = ctypes.pythonapi
capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_GetName.restype = ctypes.c_char_p
capi.PyCapsule_GetName.argtypes = [ctypes.py_object]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


def new_stream():
    s = ctypes.c_void_p()
    assert lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    return s.value


class Imported:
    """What a C consumer holds after importing a capsule."""

    def __init__(self, dev, stream, versioned=False):
        kw = {"stream": stream}
        if versioned:
            kw["max_version"] = (1, 0)
        cap = dev.__dlpack__(**kw)
        name = capi.PyCapsule_GetName(cap)
        self.ptr = capi.PyCapsule_GetPointer(cap, name)
        assert capi.PyCapsule_SetName(cap, b"used_" + name) == 0
        cls = DLManagedTensorVersioned if versioned else DLManagedTensor
        self.m = cls.from_address(self.ptr)
        self.name = name
        t = self.m.dl_tensor
        self.data = t.data
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.device = (t.device.device_type, t.device.device_id)
        self.dtype = (t.dtype.code, t.dtype.bits, t.dtype.lanes)
        self.nbytes = int(np.prod(self.shape)) * t.dtype.bits // 8
        self.released = False

    def read_async(self, stream, out):
        """Queue a device-to-host copy of the whole tensor on `stream`."""
        assert lib.cudaMemcpyAsync(out.ctypes.data, self.data, self.nbytes, 2, stream) == 0

    def read(self, stream):
        out = np.empty(self.nbytes, np.uint8)
        self.read_async(stream, out)
        lib.cudaStreamSynchronize(stream)
        return out

    def release(self):
        assert not self.released
        self.released = True
        self.m.deleter(self.ptr)


def device_allocs():
    b = ctypes.c_size_t()
    n = lib.fakecuda_device_bytes(ctypes.byref(b))
    return n, b.value


def batch(seed, shape=(4, 3, 32, 32)):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


# ---- scenarios ------------------------------------------------------------------

def roundtrip():
    """Bytes on the device equal the host batch; DLPack metadata is right."""
    lib.fakecuda_set_copy_delay_us(20000)
    c = _C.DeviceCopier(0)
    s = new_stream()
    for dtype in (np.uint8, np.float32, np.int64):
        host = (batch(1) if dtype == np.uint8 else batch(2).astype(dtype))
        d = c.copy(host)
        assert d.__dlpack_device__() == (2, 0)
        assert d.shape == host.shape and d.nbytes == host.nbytes and d.device == 0
        imp = Imported(d, s)
        assert imp.device == (2, 0) and imp.shape == host.shape
        assert imp.dtype == {np.uint8: (1, 8, 1), np.float32: (2, 32, 1), np.int64: (0, 64, 1)}[dtype]
        assert imp.read(s).tobytes() == host.tobytes(), dtype
        imp.release()
    c.close()


def missing_wait_is_caught():
    """Negative control: with stream=-1 (no synchronisation) a read queued at
    once on another stream sees the buffer before the copy lands, so the
    fake runtime really does catch a missing wait."""
    lib.fakecuda_set_copy_delay_us(100000)
    c = _C.DeviceCopier(0)
    s = new_stream()
    host = batch(3)
    d = c.copy(host)
    imp = Imported(d, -1)
    assert imp.read(s).tobytes() != host.tobytes()
    d.wait()
    assert imp.read(s).tobytes() == host.tobytes()
    imp.release()


def default_streams():
    """stream=None and 1 (legacy default) and 2 (per-thread default) work."""
    lib.fakecuda_set_copy_delay_us(20000)
    c = _C.DeviceCopier(0)
    host = batch(4)
    for stream in (None, 1, 2):
        d = c.copy(host)
        imp = Imported(d, stream)
        assert imp.read(stream or 1).tobytes() == host.tobytes(), stream
        imp.release()


def host_kept_until_copy_done():
    """The host batch stays referenced until its copy has finished."""
    lib.fakecuda_set_copy_delay_us(100000)
    c = _C.DeviceCopier(0)
    host = batch(5)
    before = sys.getrefcount(host)
    d = c.copy(host)
    assert d.holds_host and sys.getrefcount(host) > before
    assert d.copy_done() is False and d.copy_ms() is None
    d.wait()
    assert not d.holds_host and sys.getrefcount(host) == before
    assert d.copy_done() is True and d.copy_ms() >= 50.0  # the fake's 100 ms delay
    # a tensor dropped while its copy runs waits for the copy, then lets go
    d2 = c.copy(host)
    assert sys.getrefcount(host) > before
    del d2
    assert sys.getrefcount(host) == before


def release_ordered_after_consumer():
    """A released buffer is rewritten only after the consumer's stream has
    passed the release point: with one buffer, batch B's copy must wait
    for a slow read of batch A queued before A was released."""
    lib.fakecuda_set_copy_delay_us(0)
    c = _C.DeviceCopier(0, max_buffers=1)
    s = new_stream()
    a, b = batch(6), batch(7)
    da = c.copy(a)
    ia = Imported(da, s)
    ptr = ia.data
    out = np.empty(ia.nbytes, np.uint8)
    lib.fakecuda_sleep_on(s, 150000)  # a 150 ms "kernel" before the read
    ia.read_async(s, out)
    del da
    ia.release()  # consumer lets go while its stream still has work queued
    db = c.copy(b)
    ib = Imported(db, s)
    assert ib.data == ptr, "the single buffer must be reused"
    st = c.stats()
    assert st["reused_waiting"] == 1 and st["allocations"] == 1, st
    lib.cudaStreamSynchronize(s)
    assert out.tobytes() == a.tobytes(), "batch A was overwritten before the consumer read it"
    assert ib.read(s).tobytes() == b.tobytes()
    ib.release()


def ready_buffer_preferred():
    """Under the cap, a buffer whose consumer is still busy is not taken:
    a new one is allocated instead, so the copy need not wait."""
    lib.fakecuda_set_copy_delay_us(0)
    c = _C.DeviceCopier(0, max_buffers=2)
    s = new_stream()
    i1 = Imported(c.copy(batch(8)), s)
    lib.fakecuda_sleep_on(s, 200000)
    i1.release()
    d2 = c.copy(batch(9))
    i2 = Imported(d2, s)
    st = c.stats()
    assert i2.data != i1.data and st["allocations"] == 2 and st["reused_waiting"] == 0, st
    i2.release()
    lib.cudaStreamSynchronize(s)
    i3 = Imported(c.copy(batch(10)), s)  # both idle and passed now: reuse
    assert c.stats()["reused_ready"] == 1 and c.stats()["allocations"] == 2
    i3.release()


def pool_flat_any_order():
    """20 epochs of images + labels, released in random order: the device
    allocations stop growing after the first epoch, every buffer comes back,
    and the steady state never blocks the host on the device."""
    lib.fakecuda_set_copy_delay_us(0)
    rng = random.Random(0)
    c = _C.DeviceCopier(0, max_buffers=8)
    s = new_stream()
    base = device_allocs()
    counts = []
    syncs_before = None
    inflight = []
    for epoch in range(20):
        held = []
        for i in range(10):
            n = 4 if i < 9 else 3  # a short last batch, as with drop_last=False
            img = batch(100 * epoch + i, (n, 3, 16, 16))
            lab = np.arange(n, dtype=np.int64) + i
            dimg, dlab = c.copy(img), c.copy(lab)
            held += [Imported(dimg, s), Imported(dlab, s)]
            # as the loader does: keep each DeviceTensor (and so its host
            # batch) until its copy is seen finished, never blocking on it
            inflight += [dimg, dlab]
            inflight = [d for d in inflight if not d.copy_done()]
            del dimg, dlab
            if len(held) > 6:  # the loop keeps a few batches, drops them in any order
                rng.shuffle(held)
                while len(held) > 2:
                    held.pop().release()
        rng.shuffle(held)
        for h in held:
            h.release()
        while inflight:
            inflight = [d for d in inflight if not d.copy_done()]
        st = c.stats()
        assert st["idle"] == st["buffers"], st  # everything came back
        counts.append(device_allocs())
        if epoch == 1:
            syncs_before = (lib.fakecuda_counter(STREAM_SYNCS), lib.fakecuda_counter(EVENT_SYNCS))
    # bounded, not growing with epochs: two size classes (images, labels),
    # at most max_buffers each; how soon the cap is reached depends on how
    # far the consumer's stream lags, so only the bound is deterministic
    assert max(n for n, _ in counts) <= 2 * 8, counts
    # buffers allocated past the cap while the consumer held many are freed
    # when they come back
    st = c.stats()
    assert st["buffers"] <= 2 * 8 and st["allocations"] - st["freed"] == st["buffers"], st
    syncs_after = (lib.fakecuda_counter(STREAM_SYNCS), lib.fakecuda_counter(EVENT_SYNCS))
    assert syncs_after == syncs_before, (syncs_before, syncs_after, c.stats())
    c.close()
    assert device_allocs() == base


def outlives_copier():
    """Device tensors keep their buffer after the copier is closed and
    dropped; the last release frees everything."""
    lib.fakecuda_set_copy_delay_us(0)
    base = device_allocs()
    c = _C.DeviceCopier(0)
    s = new_stream()
    host = batch(11)
    d = c.copy(host)
    imp = Imported(d, s)
    c.close()
    del c, d
    assert device_allocs()[0] == base[0] + 1
    assert imp.read(s).tobytes() == host.tobytes()
    imp.release()
    assert device_allocs() == base


def versioned_capsule():
    lib.fakecuda_set_copy_delay_us(10000)
    c = _C.DeviceCopier(0)
    s = new_stream()
    host = batch(12)
    imp = Imported(c.copy(host), s, versioned=True)
    assert imp.name == b"dltensor_versioned" and (imp.m.major, imp.m.minor) == (1, 0)
    assert imp.read(s).tobytes() == host.tobytes()
    imp.release()


def unconsumed_capsule_released():
    """A capsule nobody imports gives its reference back when it dies."""
    c = _C.DeviceCopier(0, max_buffers=1)
    d = c.copy(batch(13))
    cap = d.__dlpack__(stream=1)
    del cap, d
    c.synchronize()
    st = c.stats()
    assert st["idle"] == st["buffers"] == 1, st


def errors():
    c = _C.DeviceCopier(0)
    host = batch(14)
    d = c.copy(host)
    for bad, exc, text in [
        (dict(stream=0), ValueError, "stream=0 is ambiguous"),
        (dict(stream="x"), TypeError, "stream must be None or an int"),
        (dict(stream=-5), ValueError, "invalid CUDA stream"),
        (dict(stream=1, dl_device=(1, 0)), BufferError, "cannot export to device (1, 0)"),
        (dict(stream=1, dl_device=(2, 1)), BufferError, "cannot export to device (2, 1)"),
        (dict(stream=1, copy=True), BufferError, "without copying"),
    ]:
        try:
            d.__dlpack__(**bad)
        except exc as e:
            assert text in str(e), (bad, e)
        else:
            raise AssertionError(f"no error for {bad}")
    try:
        c.copy(np.zeros((4, 6), np.uint8)[:, ::2])
    except (ValueError, BufferError, TypeError) as e:
        assert "contiguous" in str(e) or "strides" in str(e) or "DLPack" in str(e), e
    else:
        raise AssertionError("non-contiguous host accepted")
    try:
        c.copy(object())
    except (AttributeError, TypeError):
        pass
    else:
        raise AssertionError("object without __dlpack__ accepted")
    # nine different streams: the ninth is refused with a clear error
    imps = [Imported(d, new_stream()) for _ in range(8)]
    try:
        d.__dlpack__(stream=new_stream())
    except BufferError as e:
        assert "at most 8 different streams" in str(e)
    else:
        raise AssertionError("ninth stream accepted")
    for i in imps:
        i.release()
    # out of device memory: the CUDA error, named, and the host batch let go
    lib.fakecuda_set_fail_malloc_after(0)
    before = sys.getrefcount(host)
    try:
        c.copy(batch(15, (64, 3, 64, 64)))
    except RuntimeError as e:
        assert "cudaMalloc(" in str(e) and "(cudaErrorMemoryAllocation: out of memory)" in str(e), e
    else:
        raise AssertionError("failed cudaMalloc not reported")
    try:
        c.copy(host)
    except RuntimeError:
        pass
    assert sys.getrefcount(host) == before
    lib.fakecuda_set_fail_malloc_after(-1)
    assert c.stats()["buffers"] == 1  # the failed allocations are not counted
    c.close()
    try:
        c.copy(host)
    except RuntimeError as e:
        assert "closed" in str(e)
    else:
        raise AssertionError("closed copier copied")
    try:
        _C.DeviceCopier(3)
    except RuntimeError as e:
        assert "CUDA device 3 requested but only 2 present" in str(e), e
    else:
        raise AssertionError("missing device accepted")


def threads():
    """Copies from several threads and releases from others (as torch frees
    tensors wherever the last reference goes) keep data and counts right."""
    import threading
    lib.fakecuda_set_copy_delay_us(0)
    base = device_allocs()
    c = _C.DeviceCopier(0, max_buffers=4)
    errors = []

    def work(seed):
        try:
            s = new_stream()
            for i in range(50):
                host = batch(seed * 1000 + i, (2, 3, 8, 8))
                imp = Imported(c.copy(host), s)
                if imp.read(s).tobytes() != host.tobytes():
                    errors.append((seed, i))
                threading.Thread(target=imp.release).start()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    c.close()
    import time
    deadline = time.time() + 5
    while device_allocs() != base and time.time() < deadline:
        time.sleep(0.01)
    assert device_allocs() == base


def many_sizes():
    """Batches of 24 different sizes: the pool keeps at most 16 size
    classes, evicting wholly idle ones, and every byte arrives intact."""
    lib.fakecuda_set_copy_delay_us(0)
    base = device_allocs()
    c = _C.DeviceCopier(0, max_buffers=2)
    s = new_stream()
    for k in range(24):
        host = np.full((2 * k + 1, 1 << 20), k, np.uint8)  # 1, 3, .. 47 MiB: 24 classes
        host[:, ::4097] = (np.arange(2 * k + 1) % 251).astype(np.uint8)[:, None]
        imp = Imported(c.copy(host), s)
        assert imp.read(s).tobytes() == host.tobytes(), k
        imp.release()
    st = c.stats()
    assert st["buffers"] <= 16 and st["freed"] >= 1, st
    c.close()
    assert device_allocs() == base


def python_copier():
    """fastloader.cuda_delivery.DeviceCopier (the loader's layer) with
    torch's CUDA half stubbed out: torch.from_dlpack becomes the C-style
    consumer above on a stream of its own.  Nested batches keep their
    structure, non-tensors pass through, grad and non-contiguous tensors are
    handled, the host side is held only while copies run, and the host never
    gets more than MAX_INFLIGHT copies ahead."""
    import torch
    from fastloader import cuda_delivery as cd
    lib.fakecuda_set_copy_delay_us(5000)
    s = new_stream()
    torch.cuda.ExternalStream = lambda *a, **k: None
    torch.from_dlpack = lambda d: Imported(d, s)
    cp = cd.DeviceCopier(torch.device("cuda", 0))
    outs, refs = [], []
    for i in range(12):
        x = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4) + i
        batch = {"x": x.t(), "y": [torch.tensor([i, i + 1]), "name"], "w": torch.ones(3, requires_grad=True)}
        out = cp.to_device(batch)
        assert cp.inflight() <= cp.MAX_INFLIGHT + 2  # checked per batch of three tensors
        assert out["y"][1] == "name" and isinstance(out["x"], Imported)
        outs.append(out)
        refs.append((x.t().contiguous(), torch.tensor([i, i + 1]), torch.ones(3)))
    cp.synchronize()
    assert cp.inflight() == 0 and cp.copies == 36 and cp.copy_gpu_s > 0.0
    assert cp.bytes == 12 * (96 + 16 + 12)
    for out, (x, y, w) in zip(outs, refs):
        assert out["x"].shape == (4, 6)
        assert out["x"].read(s).tobytes() == x.numpy().tobytes()
        assert out["y"][0].read(s).tobytes() == y.numpy().tobytes()
        assert out["w"].read(s).tobytes() == w.numpy().tobytes()
        for imp in (out["x"], out["y"][0], out["w"]):
            imp.release()
    st = cp.pool_stats()
    assert st["idle"] == st["buffers"], st
    cp.close()


def other_device_default_stream():
    """DataLoader(device="cuda:1") without torch.cuda.set_device(1): torch
    passes stream=1 (the default stream of cuda:1) while the thread's
    current device is 0.  The wait must land on device 1's legacy stream,
    and a release from a thread whose current device is 0 must still be
    recorded (on device 1), so the buffer is pooled, not freed."""
    lib.fakecuda_set_copy_delay_us(100000)
    lib.cudaSetDevice(0)
    c = _C.DeviceCopier(1, max_buffers=2)
    a = np.full(1 << 16, 0xAA, np.uint8)
    d = c.copy(a)
    imp = Imported(d, 1)
    out = np.zeros(a.nbytes, np.uint8)
    lib.cudaSetDevice(1)  # what torch's device guard does for a cuda:1 kernel
    imp.read_async(1, out)
    lib.cudaStreamSynchronize(1)
    assert out.tobytes() == a.tobytes(), "read on cuda:1's default stream ran before the copy"
    lib.cudaSetDevice(0)
    d.wait()
    del d
    imp.release()
    lib.fakecuda_set_copy_delay_us(0)
    for _ in range(5):
        d = c.copy(a)
        i2 = Imported(d, 1)
        d.wait()
        del d
        i2.release()
    st = c.stats()
    assert st["freed"] == 0 and st["allocations"] <= 2 and st["reused_ready"] + st["reused_waiting"] >= 4, st
    c.close()


def per_thread_stream_released_elsewhere():
    """An import on the per-thread default stream (stream=2) released from
    another thread: the release must still follow the importing thread's
    queued work, so batch A is not overwritten before that work reads it."""
    import threading
    lib.fakecuda_set_copy_delay_us(0)
    lib.cudaSetDevice(0)
    c = _C.DeviceCopier(0, max_buffers=1)
    a, b = np.full(1 << 16, 0xAA, np.uint8), np.full(1 << 16, 0xBB, np.uint8)
    da = c.copy(a)
    ia = Imported(da, 2)
    out = np.zeros(a.nbytes, np.uint8)
    lib.fakecuda_sleep_on(2, 200000)  # 200 ms of work on this thread's stream ...
    ia.read_async(2, out)             # ... then it reads batch A
    del da
    t = threading.Thread(target=ia.release)
    t.start()
    t.join()
    db = c.copy(b)                    # one buffer: rewrites A's
    assert c.stats()["reused_waiting"] == 1, c.stats()
    lib.cudaStreamSynchronize(2)
    assert out.tobytes() == a.tobytes(), "batch A was overwritten before the importing thread read it"
    ib = Imported(db, 2)
    assert ib.read(2).tobytes() == b.tobytes()
    ib.release()


def exception_survives_capsule_free():
    """A consumed capsule freed while an exception propagates leaves that
    exception alone."""
    c = _C.DeviceCopier(0)
    d = c.copy(np.zeros(16, np.uint8))
    d.wait()
    kept = []

    def consume(cap):  # what a consumer does: take the pointer and rename
        kept.append(capi.PyCapsule_GetPointer(cap, b"dltensor"))
        capi.PyCapsule_SetName(cap, b"used_dltensor")
        return cap

    for make in (lambda: d.__dlpack__(stream=1), lambda: _C.empty_buffer(16).__dlpack__()):
        try:
            [][consume(make())]  # TypeError raised while the capsule is dropped
        except TypeError:
            pass
        else:
            raise AssertionError("no TypeError")
    for ptr in kept:
        DLManagedTensor.from_address(ptr).deleter(ptr)


def close_while_copy_blocks():
    """close() on another thread while copy() runs without the GIL (here
    blocked evicting a size class whose consumer stream is busy): the copy
    finishes on a pool that stays alive until its buffers come back."""
    import threading
    import time
    lib.fakecuda_set_copy_delay_us(0)
    base = device_allocs()
    c = _C.DeviceCopier(0, max_buffers=1)
    s = new_stream()
    imps = []
    for k in range(16):  # fill the 16 size classes
        d = c.copy(np.zeros(600 << k, np.uint8))
        imps.append(Imported(d, s))
        d.wait()
        del d
    lib.fakecuda_sleep_on(s, 500000)  # the consumer stream is busy for 0.5 s
    for imp in imps:
        imp.release()                 # release points queued after that

    host = np.full(600 << 17, 3, np.uint8)
    syncs = lib.fakecuda_counter(EVENT_SYNCS)
    closed_during_copy = []

    def closer():  # close as soon as copy() is blocked in the eviction
        deadline = time.time() + 5
        while lib.fakecuda_counter(EVENT_SYNCS) == syncs and time.time() < deadline:
            time.sleep(0.005)
        c.close()
        closed_during_copy.append(lib.fakecuda_counter(EVENT_SYNCS) > syncs)

    t = threading.Thread(target=closer)
    t.start()
    d = c.copy(host)                  # a 17th size evicts a class: waits for s
    t.join()
    assert closed_during_copy == [True]
    imp = Imported(d, s)
    assert imp.read(s).tobytes() == host.tobytes()
    del d
    imp.release()
    assert device_allocs() == base


def stub_torch_cuda(s):
    """Stub torch's CUDA half (no driver here) so that DataLoader(device=
    "cuda") runs on the fake runtime: device batches are imported through
    DLPack on stream `s`, read back to the host and released at once."""
    import torch

    real_from_dlpack = torch.utils.dlpack.from_dlpack  # (another scenario may have stubbed torch.from_dlpack)

    def from_dlpack(d):  # for device batches: a consumer that reads them back on its stream
        if d.__dlpack_device__()[0] != 2:
            return real_from_dlpack(d)
        imp = Imported(d, s)
        host = imp.read(s)
        imp.release()
        dt = {(1, 8): torch.uint8, (2, 32): torch.float32, (0, 64): torch.int64}[imp.dtype[:2]]
        return torch.from_numpy(host).view(dt).reshape(imp.shape)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.ExternalStream = lambda *a, **k: None
    torch.from_dlpack = from_dlpack


def loader_end_to_end():
    """DataLoader(device="cuda") through the fake runtime, with torch's own
    CUDA half stubbed (no driver here): native batches are decoded into
    "pinned" pool buffers (cudaHostAlloc), copied on the loader's stream,
    imported through DLPack on a consumer stream, read back and released.
    Over three persistent epochs they equal the CPU path bit for bit, the
    device pool reuses its buffers (it stays within its cap of 4 a size
    class over the 15 batches; how many of the 4 it needs depends on when
    the fake's release events pass, so the count may differ between
    epochs), and stats() reports the copies."""
    import tempfile

    import torch

    import fastloader
    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample
    lib.fakecuda_set_copy_delay_us(2000)
    s = new_stream()
    stub_torch_cuda(s)
    root = tempfile.mkdtemp(prefix="fl-fake-")
    make_sample(root, n=40, classes=2, progress=False, processes=1)
    ds = fastloader.ImageFolder(root, transform=FT.Compose([
        FT.RandomResizedCrop(48), FT.RandomHorizontalFlip(), FT.ToTensor(), FT.Normalize([0.5] * 3, [0.25] * 3)]))
    host_allocs = lib.fakecuda_counter(HOST_ALLOCS)
    dev = fastloader.DataLoader(ds, batch_size=8, num_workers=2, device="cuda", persistent_workers=True, seed=5)
    cpu = fastloader.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True, seed=5)
    pools = []
    for epoch in range(3):
        got, ref = list(dev), list(cpu)
        assert len(got) == len(ref) == 5
        for (xd, yd), (xc, yc) in zip(got, ref):
            assert torch.equal(xd, xc) and torch.equal(yd, yc), epoch
        st = dev.stats()
        pools.append((st["device_pool_buffers"], st["device_pool_bytes"]))
        assert st["h2d_bytes"] > 0 and st["h2d_gpu_s"] > 0 and st["device"] == "cuda:0", st
    # 8 x 3 x 48 x 48 float32 -> the 256 KiB class, 8 int64 labels -> the 512-byte one; a buffer
    # kept per batch would be 15 of the first by the third epoch
    assert all(2 <= n <= 8 and b <= 4 * (262144 + 512) for n, b in pools), pools
    assert lib.fakecuda_counter(HOST_ALLOCS) > host_allocs  # the batch pool was page-locked
    del dev, cpu

    # a Python dataset: batches pinned in the workers (torch's pin_memory,
    # stubbed as a copy), nested structure kept, non-tensors passed through
    torch.Tensor.pin_memory = lambda self, *a, **k: self.clone()
    torch.Tensor.is_pinned = lambda self, *a, **k: False

    class Py(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"x": torch.full((2, 3), float(i)), "meta": (i, f"s{i}")}

    for nw in (0, 2):
        got = list(fastloader.DataLoader(Py(), batch_size=4, num_workers=nw, device="cuda:0"))
        ref = list(torch.utils.data.DataLoader(Py(), batch_size=4))
        for g, r in zip(got, ref):
            assert torch.equal(g["x"], r["x"]) and torch.equal(g["meta"][0], r["meta"][0])
            assert g["meta"][1] == r["meta"][1]


def no_error_left_behind():
    """Polling a copy that is still running, reusing a buffer whose consumer
    is busy, and a failed allocation all leave the thread's CUDA "last
    error" clear: torch checks it after every kernel launch and would raise
    "device not ready" in an unrelated op."""
    lib.fakecuda_set_copy_delay_us(100000)
    lib.cudaSetDevice(0)
    lib.cudaGetLastError()
    c = _C.DeviceCopier(0, max_buffers=1)
    s = new_stream()
    d = c.copy(batch(20))
    assert d.copy_done() is False and d.copy_ms() is None  # not ready, twice
    assert lib.cudaGetLastError() == 0
    imp = Imported(d, s)
    lib.fakecuda_sleep_on(s, 100000)
    d.wait()
    del d
    imp.release()
    lib.fakecuda_set_copy_delay_us(0)
    d2 = c.copy(batch(21))  # queries the busy consumer's release event
    assert lib.cudaGetLastError() == 0
    lib.fakecuda_set_fail_malloc_after(0)
    try:
        c.copy(batch(22, (9, 9)))
    except RuntimeError:
        pass
    lib.fakecuda_set_fail_malloc_after(-1)
    assert lib.cudaGetLastError() == 0
    d2.wait()


def no_stray_context():
    """A loader on cuda:1 must not create a context on GPU 0 (about half a
    GiB on a real GPU): not from native worker threads pinning their
    buffers, not from the thread that drops a batch, not from a fresh
    thread polling a copy.  A fresh thread reports device 0 and has no
    context there, so it is not switched back to 0."""
    import tempfile
    import threading

    import fastloader
    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample
    lib.fakecuda_set_copy_delay_us(0)
    lib.cudaSetDevice(1)  # as after torch.cuda.set_device(1)
    lib.fakecuda_forget_contexts()
    c = _C.DeviceCopier(1)
    s = new_stream()
    imps = []
    for k in range(4):
        d = c.copy(batch(30 + k))
        imps.append(Imported(d, s))
        t = threading.Thread(target=d.copy_done)
        t.start()
        t.join()
        del d
    for imp in imps:
        t = threading.Thread(target=imp.release)
        t.start()
        t.join()
    c.close()
    # native workers decoding into page-locked buffers for device 1
    root = tempfile.mkdtemp(prefix="fl-ctx-")
    make_sample(root, n=16, classes=2, progress=False, processes=1)
    ds = fastloader.ImageFolder(root, transform=FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.ToTensor()]))
    ds._native.set_pinned(1)
    eng = _C.NativeEngine(2, ds._native)
    for k in range(4):
        eng.submit(k, list(range(4 * k, 4 * k + 4)), 0, 0)
    for k in range(4):
        assert eng.wait(k, 10.0) is not None
    eng.close()
    ds._native.set_pinned(-1)
    assert lib.fakecuda_contexts() == 0b10, bin(lib.fakecuda_contexts())
    lib.cudaSetDevice(0)


def close_inside_dlpack():
    """A host object whose __dlpack__ closes the copier (or another thread
    doing so at that moment) gets a clear error, not a crash."""
    c = _C.DeviceCopier(0)
    arr = batch(40)

    class Closing:
        def __dlpack__(self, *a, **k):
            c.close()
            return arr.__dlpack__()

    try:
        c.copy(Closing())
    except RuntimeError as e:
        assert "closed" in str(e), e
    else:
        raise AssertionError("copy on a closed copier succeeded")


def interrupt_main_after(delay):
    """Send SIGINT to the main thread after `delay` s (to that thread only: a
    fake stream thread sleeping through a slow copy would otherwise be woken
    early).  Returns the timer and a list that gets the time of the kill."""
    import signal
    import threading
    import time
    sent = []

    def fire():
        sent.append(time.monotonic())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    t = threading.Timer(delay, fire)
    t.start()
    return t, sent


def interrupted(call, delay=0.2):
    """Run call() with a Ctrl-C arriving after `delay` s.  Returns how long
    after the signal KeyboardInterrupt came out, or None when call() gave
    none."""
    import time
    t, sent = interrupt_main_after(delay)
    try:
        try:
            call()
        finally:
            t.join()
    except KeyboardInterrupt:
        return time.monotonic() - sent[0]
    return None


def wait_interruptible():
    """Ctrl-C during DeviceTensor.wait() on a slow copy raises
    KeyboardInterrupt at once, while the copy still runs, and the tensor
    can be waited on again afterwards."""
    lib.fakecuda_set_copy_delay_us(1500000)
    c = _C.DeviceCopier(0)
    host = batch(50)
    d = c.copy(host)
    late = interrupted(d.wait)
    running = not d.copy_done()
    lib.fakecuda_set_copy_delay_us(0)
    assert late is not None and late < 0.5 and running, (
        f"KeyboardInterrupt {late} s after the signal, copy still running: {running}")
    d.wait()
    assert d.copy_done() and not d.holds_host
    c.close()


def synchronize_interruptible():
    """Ctrl-C during DeviceCopier.synchronize() on a busy copy stream raises
    KeyboardInterrupt at once; a later synchronize() still waits for all."""
    lib.fakecuda_set_copy_delay_us(0)
    c = _C.DeviceCopier(0)
    lib.fakecuda_sleep_on(c.stream, 1500000)  # 1.5 s of "kernel" on the copy stream
    d = c.copy(batch(51))                     # queued behind it
    late = interrupted(c.synchronize)
    running = not d.copy_done()
    assert late is not None and late < 0.5 and running, (
        f"KeyboardInterrupt {late} s after the signal, stream still busy: {running}")
    c.synchronize()
    assert d.copy_done()
    del d
    c.close()


def copier_freed_with_loader():
    """The loader's cached device copier goes with the loader: once the
    loader and its iterators are gone, its stream is destroyed and its
    device buffers freed by reference counting, with the garbage collector
    off.  An iterator that outlives its loader (next(iter(DataLoader(...))))
    keeps the copier working until the iterator goes."""
    import gc
    import tempfile

    import torch

    import fastloader
    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample
    lib.fakecuda_set_copy_delay_us(0)
    s = new_stream()
    stub_torch_cuda(s)
    root = tempfile.mkdtemp(prefix="fl-free-")
    make_sample(root, n=16, classes=2, progress=False, processes=1)
    ds = fastloader.ImageFolder(root, transform=FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.ToTensor()]))
    ref = list(fastloader.DataLoader(ds, batch_size=4, seed=1))
    base = (lib.fakecuda_live_streams(), device_allocs())
    gc.collect()
    gc.disable()
    try:
        for nw, persistent in ((0, False), (2, False), (2, True)):
            dev = fastloader.DataLoader(ds, batch_size=4, num_workers=nw, device="cuda", seed=1,
                                        persistent_workers=persistent)
            for _ in range(2):
                got = list(dev)
            assert all(torch.equal(g[0], r[0]) for g, r in zip(got, ref)) and len(got) == len(ref)
            assert lib.fakecuda_live_streams() == base[0] + 1 and device_allocs()[0] > base[1][0]
            del dev, got
            assert (lib.fakecuda_live_streams(), device_allocs()) == base, (nw, persistent)
        it = iter(fastloader.DataLoader(ds, batch_size=4, device="cuda", seed=1))  # the loader is gone
        got = list(it)
        assert all(torch.equal(g[0], r[0]) for g, r in zip(got, ref)) and len(got) == len(ref)
        assert lib.fakecuda_live_streams() == base[0] + 1
        del it, got
        assert (lib.fakecuda_live_streams(), device_allocs()) == base
    finally:
        gc.enable()


def pinned_free_without_gil():
    """Pinned batch buffers beyond the pool's idle ones are freed with
    cudaFreeHost, which synchronises the device and can take long: it must
    run without the GIL, so other Python threads keep going.  The fake's
    cudaFreeHost here returns only once a counting Python thread has moved
    on (or stalls for 0.5 s)."""
    import tempfile
    import threading

    import fastloader
    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample
    root = tempfile.mkdtemp(prefix="fl-pin-")
    make_sample(root, n=4, classes=2, progress=False, processes=1)
    ds = fastloader.ImageFolder(root, transform=FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.ToTensor()]))
    nat = ds._native
    nat.set_pinned(0)
    held = [nat.load_batch([k % 4], 0, 0)[0] for k in range(10)]  # ten pinned buffers out
    nat.set_pinned(-1)  # the dataset lets go of the pool: the last buffer back frees it
    count = ctypes.c_long(0)
    stop = []

    def spin():
        while not stop:
            count.value += 1

    frees, stalls = lib.fakecuda_counter(HOST_FREES), lib.fakecuda_counter(HOST_FREES_STALLED)
    t = threading.Thread(target=spin)
    t.start()
    lib.fakecuda_watch_free_host(ctypes.addressof(count), 50, 500000)
    try:
        # eight go back to the pool; the ninth is freed (the pool is full),
        # the tenth is freed with the pool and its eight idle buffers
        del held[:]
    finally:
        lib.fakecuda_watch_free_host(None, 0, 0)
        stop.append(1)
        t.join()
    frees, stalls = lib.fakecuda_counter(HOST_FREES) - frees, lib.fakecuda_counter(HOST_FREES_STALLED) - stalls
    assert frees == 10 and stalls == 0, f"{stalls} of {frees} cudaFreeHost calls ran holding the GIL"


def webdataset_on_device():
    """fastloader.WebDataset with device="cuda" (uint8 over the wire, the
    float conversion on the device) equals the CPU path over two epochs."""
    import tempfile

    import torch

    import fastloader
    from fastloader import transforms as FT
    from fastloader.tools.pack import pack_shards
    from fastloader.tools.sample import make_sample
    s = new_stream()
    stub_torch_cuda(s)
    root = tempfile.mkdtemp(prefix="fl-fake-wds-")
    make_sample(root + "/img", n=24, classes=3, progress=False, processes=1)
    pack_shards(root + "/img", root + "/sh", shard_size=100000, progress=False)
    urls = sorted(f"{root}/sh/{f}" for f in __import__("os").listdir(root + "/sh") if f.endswith(".tar"))
    tf = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor(),
                     FT.Normalize([0.5] * 3, [0.25] * 3)])
    ds = fastloader.WebDataset(urls, transform=tf, shuffle=8)
    dev = fastloader.DataLoader(ds, batch_size=5, num_workers=2, device="cuda", seed=3)
    cpu = fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=3)
    for epoch in range(2):
        got, ref = list(dev), list(cpu)
        assert len(got) == len(ref) == 5
        for (xd, yd), (xc, yc) in zip(got, ref):
            assert torch.allclose(xd, xc, atol=1e-6) and torch.equal(yd, yc), epoch
        assert dev.stats()["h2d_bytes"] > 0
    del dev, cpu


SCENARIOS = [roundtrip, missing_wait_is_caught, default_streams, host_kept_until_copy_done,
             release_ordered_after_consumer, ready_buffer_preferred, pool_flat_any_order,
             outlives_copier, versioned_capsule, unconsumed_capsule_released, errors, threads, many_sizes,
             python_copier, other_device_default_stream, per_thread_stream_released_elsewhere,
             exception_survives_capsule_free, close_while_copy_blocks,
             loader_end_to_end, no_error_left_behind, no_stray_context, close_inside_dlpack,
             wait_interruptible, synchronize_interruptible, copier_freed_with_loader, pinned_free_without_gil,
             webdataset_on_device]


def main(names):
    out = {}
    for fn in SCENARIOS:
        if names and fn.__name__ not in names:
            continue
        try:
            fn()
            out[fn.__name__] = "ok"
        except BaseException:  # a stray KeyboardInterrupt fails its scenario, not the run
            out[fn.__name__] = traceback.format_exc()
    print("FAKECUDA-RESULTS " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
