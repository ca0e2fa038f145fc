"""Batches to the GPU: pinned host buffers and asynchronous copies on the
loader's own CUDA stream.

Data flow for `DataLoader(..., device="cuda")`:

    worker threads -> batch in page-locked host memory (native datasets decode
                      straight into it; Python datasets are pinned in the worker)
    consumer       -> copy host->device with non_blocking=True on the loader's
                      stream, record an event, make the consumer's current
                      stream wait on that event (no device-wide sync), mark the
                      device tensors as used by that stream (record_stream), and
                      keep the host batch alive until the event has completed,
                      so a host buffer is never reused while its copy runs.

This layer uses torch's CUDA streams, events and caching allocator, so device
memory comes from (and returns to) torch's pool and stays flat over epochs.
CUDA itself is only touched when a device is asked for; without one the
constructor raises an error that says which part is missing (see
fastloader._C.cuda_require).
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


def _map_tensors(fn, batch):
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)({k: _map_tensors(fn, v) for k, v in batch.items()}) if type(batch) is not dict else \
            {k: _map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(fn, v) for v in batch)
    return batch


def pin_batch(batch):
    """Page-lock the tensors of a batch (for Python datasets; runs in workers)."""
    return _map_tensors(lambda t: t if t.is_pinned() else t.pin_memory(), batch)


class DeviceCopier:
    """Copies batches to one CUDA device on a stream of its own.

    `to_device(batch)` returns the batch on the device, ordered before
    anything the consumer's current stream does next.  Host batches stay
    referenced until their copy has finished (checked with event.query(), never
    a blocking sync), which bounds host memory to the copies in flight.
    """

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._inflight = collections.deque()  # (event, host batch)
        self.copy_s = 0.0
        self.bytes = 0

    def _release_finished(self):
        while self._inflight and self._inflight[0][0].query():
            self._inflight.popleft()

    def to_device(self, batch):
        self._release_finished()
        consumer = torch.cuda.current_stream(self.device)
        nbytes = [0]

        def copy(t):
            nbytes[0] += t.element_size() * t.nelement()
            return t.to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            out = _map_tensors(copy, batch)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        consumer.wait_event(ev)
        # the device memory was allocated on our stream but is used on the
        # consumer's: tell the caching allocator not to reuse it too early
        _map_tensors(lambda t: t.record_stream(consumer), out)
        self._inflight.append((ev, batch))
        self.bytes += nbytes[0]
        return out

    def inflight(self):
        self._release_finished()
        return len(self._inflight)


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
