"""Batches to the GPU: pinned host buffers, asynchronous copies on the
loader's own CUDA stream, CUDA tensors handed out through DLPack.

Data flow for `DataLoader(..., device="cuda")`:

    worker threads -> batch in page-locked host memory (native datasets decode
                      straight into it; Python datasets' default collation
                      stacks into it, and the worker pins what else is left)
    consumer       -> _C.DeviceCopier.copy: cudaMemcpyAsync into a pooled
                      device buffer on the loader's non-blocking stream, then
                      an event (csrc/cuda/devpool.c); the host does not wait
                   -> torch.from_dlpack(DeviceTensor): torch passes its current
                      stream to __dlpack__(stream=...), and that stream waits
                      on the copy's event on the GPU (no device-wide sync)
                   -> the host batch is kept until the copy has finished
                      (DeviceTensor.copy_done, polled, never a blocking wait),
                      so a host slot is reused only after its copy
    tensor dies    -> the DLPack deleter records an event on the consumer's
                      stream and the device buffer goes back to the pool; a
                      later copy rewrites it only after that event.

Device memory is fastloader's own pool (not torch's caching allocator), so
torch.cuda.memory_allocated does not count it; DataLoader.stats() reports it
as device_pool_bytes.  CUDA itself is only touched when a device is asked
for; without one the constructor raises an error that says which part is
missing (see fastloader._C.cuda_require).
"""
from __future__ import annotations

import collections

from . import _C

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def parse_device(device):
    """'cuda', 'cuda:1', torch.device or None -> torch.device or None.

    Raises ValueError for non-CUDA devices and RuntimeError (naming the missing
    library, driver or device) when CUDA cannot be used.
    """
    if device is None or device == "":
        return None
    if torch is None:
        raise RuntimeError("device= needs torch (to hand out CUDA tensors); torch is not installed")
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"fastloader delivers batches to CUDA devices only, got device={device!r}")
    index = dev.index if dev.index is not None else 0
    if not torch.cuda.is_available():
        # say which part is missing: library, driver or device
        _C.cuda_require(index)
        raise RuntimeError(f"device={device!r}: CUDA works but this torch build has no CUDA support "
                           f"(torch {torch.__version__})")
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"CUDA device {index} requested but only {torch.cuda.device_count()} present")
    return torch.device("cuda", index)


def cuda_available():
    """True when torch can use a CUDA device (pin_memory has an effect)."""
    return torch is not None and torch.cuda.is_available()


def map_tensors(fn, batch):
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)({k: map_tensors(fn, v) for k, v in batch.items()}) if type(batch) is not dict else \
            {k: map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    return batch


def pin_batch(batch, pinned_ptrs=()):
    """Page-lock the tensors of a batch (for Python datasets; runs in workers).

    Tensors whose storage starts at one of `pinned_ptrs` (the page-locked
    pool buffers _C.stack wrote them into, kept alive by the caller) are
    already pinned and are not copied again; nor is any tensor torch knows
    to be pinned.  The rest (a collate_fn's own tensors, Python numbers
    made into tensors) get torch's pin_memory copy."""

    def pin(t):
        if pinned_ptrs and t.untyped_storage().data_ptr() in pinned_ptrs:
            return t
        return t if t.is_pinned() else t.pin_memory()

    return map_tensors(pin, batch)


class DeviceCopier:
    """Copies batches to one CUDA device on a stream of its own (C side:
    fastloader._C.DeviceCopier).

    `to_device(batch)` returns the batch with every tensor on the device,
    ordered before anything the consumer's current stream does next.  Host
    tensors stay referenced until their copy has finished (polled with
    copy_done(), never a blocking sync), which bounds host memory to the
    copies in flight.  `max_buffers` caps the device buffers of one size kept
    by the pool (see csrc/cuda/devpool.h).

    Lifetime: a DataLoader caches one copier (`loader._fl_copier`) for all
    its epochs, and each of its iterators holds it too, so an iterator that
    outlives its loader (`next(iter(DataLoader(...)))`) keeps working.
    Nothing else refers to it, so it goes by reference counting as soon as
    the loader and its last iterator are gone: its stream is destroyed and
    its idle device buffers freed, without waiting for the garbage
    collector (tests/fakecuda/scenarios.py, copier_freed_with_loader).
    Tensors handed out keep their own buffers.  There is deliberately no
    finalizer on the loader: it would close the copier under an iterator
    still delivering batches.
    """

    MAX_INFLIGHT = 8

    def __init__(self, device, max_buffers=4):
        self.device = device
        self._c = _C.DeviceCopier(device.index if device.index is not None else 0, max_buffers=max_buffers)
        # torch's view of our stream, for users who want to order work on it
        self.stream = torch.cuda.ExternalStream(self._c.stream, device=device)
        self._inflight = collections.deque()  # DeviceTensors whose copy may still read host memory
        self.bytes = 0
        self.copies = 0
        self.copy_gpu_s = 0.0  # time the copies took on the device (events)

    def _retire(self):
        """Drop the oldest in-flight copy (finished), counting its GPU time."""
        self.copy_gpu_s += self._inflight.popleft().copy_ms() / 1e3

    def _release_finished(self):
        while self._inflight and self._inflight[0].copy_done():
            self._retire()

    def _copy(self, t):
        if t.device.type == "cuda":
            return t if t.device == self.device else t.to(self.device, non_blocking=True)
        if t.device.type != "cpu":
            return t
        if t.requires_grad:
            t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        d = self._c.copy(t)
        self._inflight.append(d)
        self.bytes += d.nbytes
        self.copies += 1
        # from_dlpack passes torch's current stream for this device: that
        # stream waits on the copy's event
        return torch.from_dlpack(d)

    def to_device(self, batch):
        self._release_finished()
        # backpressure: the host never runs more than MAX_INFLIGHT copies
        # ahead of the copy engine (each holds a host batch and a buffer)
        while len(self._inflight) >= self.MAX_INFLIGHT:
            self._inflight[0].wait()
            self._retire()
        return map_tensors(self._copy, batch)

    def inflight(self):
        self._release_finished()
        return len(self._inflight)

    def pool_stats(self):
        return self._c.stats()

    def synchronize(self):
        self._c.synchronize()
        self._release_finished()

    def close(self):
        self._c.synchronize()
        self._inflight.clear()
        self._c.close()


class DeviceConvert:
    """The uint8 -> float part of a native transform, run on the device.

    With `DataLoader(..., device="cuda", convert_on_device=True)` a native
    dataset whose transform ends in ToTensor/ToDtype(float)/Normalize sends
    uint8 over PCIe (4x fewer bytes than float32) and this finishes the job
    on the GPU with the same float32 operations the C pipeline uses
    (x / 255 or x * float32(1/255), then (x - mean) / std, then the target
    dtype), so the values are bit-identical to the CPU path.  Every divisor is
    a device tensor, not a Python scalar: CUDA kernels turn division by a CPU
    scalar into multiplication by its reciprocal, which rounds differently.
    """

    _DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}

    def __init__(self, spec):
        self.dtype = getattr(torch, self._DTYPES[spec["dtype"]])
        self.scale = int(spec.get("scale_to_unit", 0))
        self.normalize = bool(spec.get("normalize", False))
        c = int(spec.get("out_channels", 3))
        self.shape = (c, 1, 1) if spec.get("layout", "CHW") == "CHW" else (c,)

        def per_channel(values):
            v = list(values) if values is not None else [0.0]
            return (v * c)[:c] if len(v) == 1 else v

        self.mean = per_channel(spec.get("mean"))
        self.std = per_channel(spec.get("std", [1.0]))
        self._consts = {}

    def _on(self, device):
        k = str(device)
        if k not in self._consts:
            f32 = torch.float32
            self._consts[k] = (
                torch.tensor(255.0, dtype=f32, device=device),
                torch.tensor(1.0 / 255, dtype=f32, device=device),
                torch.tensor(self.mean, dtype=f32, device=device).reshape(self.shape),
                torch.tensor(self.std, dtype=f32, device=device).reshape(self.shape),
            )
        return self._consts[k]

    def __call__(self, x):
        d255, inv255, mean, std = self._on(x.device)
        y = x.to(torch.float32)
        if self.scale == 1:
            y = torch.div(y, d255)
        elif self.scale == 2:
            y = torch.mul(y, inv255)
        if self.normalize:
            y = torch.div(torch.sub(y, mean), std)
        return y if self.dtype == torch.float32 else y.to(self.dtype)
