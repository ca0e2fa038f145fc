"""fastloader under Hugging Face accelerate: `accelerator.prepare(loader)`
keeps a fastloader.DataLoader a fastloader.DataLoader.

accelerate offers no hook for a DataLoader class of one's own: its
`prepare_data_loader` (accelerate/data_loader.py) shards a loader by building
a new torch DataLoader from the loader's attributes inside a DataLoaderShard
(or a DataLoaderDispatcher), so a fastloader loader silently became torch's,
its native pipeline run one sample at a time through __getitem__.

The mechanism, and why this one:
- `import fastloader` calls install(): it wraps accelerate's own
  `prepare_data_loader` and `skip_first_batches` at once when accelerate is
  already imported, otherwise when `accelerate.data_loader` is first
  imported (a one-shot import hook that removes itself).  Every way of
  preparing a loader goes through that one function (Accelerator.prepare,
  Accelerator.prepare_data_loader, the free function, the DeepSpeed and
  FSDP paths), and nothing is asked of the user.  fastloader never imports
  accelerate itself.
- The wrapper runs accelerate's function unchanged, so the sharding is
  accelerate's own: BatchSamplerShard (split_batches, even_batches),
  SeedableRandomSampler, IterableDatasetShard, the synchronised generator,
  the GradientState bookkeeping that gather_for_metrics and gradient
  accumulation read.  Then it swaps the torch DataLoader inside the returned
  DataLoaderShard / DataLoaderDispatcher for a fastloader.DataLoader over
  the same dataset and sampler, with the same arguments and fastloader's
  own (seed, device, max_memory, convert_on_device, num_workers="auto").
  The torch loader it replaces never started a worker.  DataLoaderShard
  reports its inner loader's class, so isinstance(prepared,
  fastloader.DataLoader) holds.
- Device: when accelerate would move batches to a CUDA device, the
  fastloader loader gets device= instead (its own stream, page-locked
  buffers) and the DataLoaderShard's per-batch move is turned off.
- A structure the swap does not recognise (a future accelerate's, torchdata's
  StatefulDataLoader, XLA's MpDeviceLoaderWrapper) is left as accelerate
  made it, with one warning that names what happened and the fix.  What
  fastloader cannot honour (dispatch_batches=True over a WebDataset, whose
  shards are already dealt out by rank) raises ValueError before anything
  is built.
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings

from .loader import DataLoader
from .stats import PerformanceWarning

__all__ = ["install"]

_MODULE = "accelerate.data_loader"
_WRAPPED = ("prepare_data_loader", "skip_first_batches")
_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, PerformanceWarning, stacklevel=4)


def _fastloader_of(loader):
    """The fastloader.DataLoader behind `loader` (itself, or the inner
    loader of a DataLoaderShard accelerate made from one), else None."""
    inner = vars(loader).get("base_dataloader", loader) if hasattr(loader, "__dict__") else loader
    return inner if issubclass(type(inner), DataLoader) else None


def _adapter_base(prepared):
    """The torch DataLoader inside accelerate's adapter `prepared`, when it
    is exactly torch's (the one the swap replaces), else None."""
    import torch.utils.data as tud

    base = vars(prepared).get("base_dataloader") if hasattr(prepared, "__dict__") else None
    return base if type(base) is tud.DataLoader else None


def _rebuild(template, base, *, dataset=None, batch_size=None, device=None, num_workers=None):
    """A fastloader.DataLoader over `base`'s dataset and sampler with
    `base`'s arguments (accelerate's choice) and `template`'s own ones."""
    import torch.utils.data as tud

    dataset = base.dataset if dataset is None else dataset
    if num_workers is None:
        num_workers = "auto" if getattr(template, "_fl_auto", False) else template.num_workers
    kw = dict(num_workers=num_workers, collate_fn=base.collate_fn, pin_memory=base.pin_memory,
              timeout=base.timeout, worker_init_fn=base.worker_init_fn, generator=base.generator,
              prefetch_factor=base.prefetch_factor if num_workers else None,
              persistent_workers=base.persistent_workers and bool(num_workers),
              pin_memory_device=base.pin_memory_device, in_order=getattr(base, "in_order", True),
              seed=template._fl_seed, max_memory=template._fl_max_memory,
              device=device if device is not None else template._fl_device,
              convert_on_device=template._fl_convert_on_device)
    if isinstance(dataset, tud.IterableDataset):
        kw.update(batch_size=base.batch_size if batch_size is None else batch_size, drop_last=base.drop_last)
    elif base.batch_size is None and base.batch_sampler is not None:
        kw.update(batch_sampler=base.batch_sampler)      # accelerate's BatchSamplerShard
    else:
        kw.update(sampler=base.sampler, batch_size=base.batch_size, drop_last=base.drop_last)
    cls = type(template)
    if cls.__init__ is not DataLoader.__init__:
        # a subclass with its own __init__: its arguments are unknown here
        _warn_once(("subclass", cls), f"fastloader: accelerate's loader is rebuilt as fastloader.DataLoader, not "
                   f"as {cls.__qualname__}, whose __init__ takes arguments fastloader cannot know")
        cls = DataLoader
    return cls(dataset, **kw)


def _cuda_device(device, put_on_device):
    """The CUDA device fastloader should deliver to instead of accelerate's
    per-batch move, or None."""
    import torch

    if not put_on_device or device is None:
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    try:
        from .cuda_delivery import parse_device

        return parse_device(dev)
    except (RuntimeError, ValueError) as e:  # accelerate's own move still works
        _warn_once("cuda", f"fastloader: batches go to {dev} through accelerate's per-batch move, not "
                   f"fastloader's device= copy: {e}")
        return None


def _replaced(prepared, why):
    """Leave what accelerate built, saying once that fastloader is not in it."""
    fix = {
        "stateful": "drop use_stateful_dataloader=True: fastloader.DataLoader has state_dict() and "
                    "load_state_dict() itself (torchdata's meaning; docs/resume.md); checkpoint "
                    "it beside the model.",
    }.get(why, "report the accelerate version; meanwhile shard the fastloader.DataLoader yourself "
               "(a DistributedSampler) and leave it out of accelerator.prepare().")
    _warn_once(("replaced", why), (
        f"fastloader: accelerate made a {type(prepared).__name__} ({why}) whose batches come from another "
        f"DataLoader calling the dataset's __getitem__, not from fastloader's workers. Fix: {fix}"))
    return prepared


def _check_stream(ds, bound):
    """A fastloader.WebDataset deals its shards out by rank itself: refuse
    what would read it on process 0 only, or for another rank; returns the
    number of processes."""
    if bound.get("dispatch_batches"):
        raise ValueError(
            "accelerate's dispatch_batches=True reads every batch on process 0 and splits it, but a "
            "fastloader.WebDataset already gives each process its own shards (process 0 reads only its "
            "share). Use DataLoaderConfiguration(dispatch_batches=False).")
    n, i = bound.get("num_processes"), bound.get("process_index")
    if n is None or i is None:
        from accelerate.state import PartialState

        state = PartialState()
        n = state.num_processes if n is None else n
        i = state.process_index if i is None else i
    if (ds.world_size, ds.rank) != (n, i):
        raise ValueError(
            f"this fastloader.WebDataset was built for rank {ds.rank} of {ds.world_size}, but accelerate runs "
            f"process {i} of {n}: create it after Accelerator() (which starts torch.distributed), or pass "
            f"rank= and world_size=")
    bound["dispatch_batches"] = False   # each process iterates its own stream
    return n


def _wrap_prepare(original):
    sig = inspect.signature(original)

    @functools.wraps(original)
    def prepare_data_loader(dataloader, *args, **kwargs):
        template = _fastloader_of(dataloader)
        if template is None:
            return original(dataloader, *args, **kwargs)
        bound = sig.bind(dataloader, *args, **kwargs)
        bound.apply_defaults()
        params = bound.arguments
        stream = getattr(template.dataset, "_fl_stream", False)
        nproc = _check_stream(template.dataset, params) if stream else 1
        prepared = original(*bound.args, **bound.kwargs)
        if params.get("use_stateful_dataloader"):
            return _replaced(prepared, "stateful")
        base = _adapter_base(prepared)
        if base is None:
            return _replaced(prepared, f"{type(prepared).__name__} is not a structure fastloader knows")
        dispatcher = hasattr(prepared, "_fetch_batches")  # DataLoaderDispatcher
        device = None
        if not dispatcher:
            device = _cuda_device(params.get("device"), params.get("put_on_device"))
        num_workers = None
        if dispatcher and prepared.state.process_index != 0:
            num_workers = 0   # only process 0 iterates; the others only call iter()
        if stream:   # the rank's own stream, not accelerate's IterableDatasetShard of it
            bs = template.batch_size // nproc if params.get("split_batches") else template.batch_size
            new = _rebuild(template, base, dataset=template.dataset, batch_size=bs, device=device)
        else:
            new = _rebuild(template, base, device=device, num_workers=num_workers)
        prepared.base_dataloader = new
        if device is not None:
            prepared.device = None   # fastloader delivers to the device itself
        return prepared

    prepare_data_loader._fastloader_wrapped = True
    return prepare_data_loader


def _wrap_skip(original):
    @functools.wraps(original)
    def skip_first_batches(dataloader, num_batches=0):
        template = _fastloader_of(dataloader)
        out = original(dataloader, num_batches)
        if template is None:
            return out
        import torch.utils.data as tud

        if type(out) is tud.DataLoader:   # a bare loader was passed: a bare loader comes back
            return _rebuild(template, out)
        base = _adapter_base(out)
        if base is None:
            return _replaced(out, f"skip_first_batches made a {type(out).__name__}")
        out.base_dataloader = _rebuild(template, base, dataset=template.dataset if getattr(
            template.dataset, "_fl_stream", False) else None)
        return out

    skip_first_batches._fastloader_wrapped = True
    return skip_first_batches


def _patch(module):
    """Wrap accelerate.data_loader's functions, and rebind the names other
    loaded accelerate modules imported from it."""
    for name, wrap in zip(_WRAPPED, (_wrap_prepare, _wrap_skip)):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_fastloader_wrapped", False):
            continue
        wrapped = wrap(original)
        for modname, mod in list(sys.modules.items()):
            if (modname == "accelerate" or modname.startswith("accelerate.")) and \
                    getattr(mod, name, None) is original:
                setattr(mod, name, wrapped)


class _ImportHook:
    """A one-shot meta path finder: lets accelerate.data_loader load as usual
    (through the other finders), then patches it before anyone imports
    from it, and removes itself."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            try:
                exec_module(module)
            finally:
                del spec.loader.exec_module   # the loader's own method again
            self.remove()
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


_hook = _ImportHook()


def install():
    """Make accelerate keep fastloader loaders (idempotent; `import
    fastloader` calls it).  Patches now if accelerate is imported, else when
    it is."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        _hook.remove()
        _patch(module)
    elif _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
