"""Declarative image transforms, compiled to fastloader's native pipeline.

The classes are named and parametrised like ``torchvision.transforms.v2``::

    from fastloader import transforms as T
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                    T.ToTensor(), T.Normalize(mean, std)])

A native dataset hands such a pipeline (or a torchvision v1/v2 one) to
:func:`compile_transform`, which maps the longest supported prefix to one
spec dict for the C workers (crop, antialiased resize, flip, dtype,
normalisation and layout fused in one pass, bit-exact with torchvision on PIL
images at full decode scale) and returns whatever follows as a Python callable
run per sample on the native output.

Supported prefix, in this order (each part optional)::

    [Grayscale(1)]
    [RandomResizedCrop | Resize [CenterCrop] | CenterCrop]
    [RandomHorizontalFlip] [RandomVerticalFlip]   (either order: flips commute)
    [RandomRotation]                               (torchvision's; fixed size)
    [TrivialAugmentWide | RandAugment | AutoAugment | timm's]   (fixed size)
    [GaussianBlur] [RandomGrayscale] [GaussianBlur]   (torchvision's, maybe in RandomApply; once;
                                                   checked against this torch first)
    [ToTensor | (PILToTensor | ToImage) [ToDtype(float*, scale) | ConvertImageDtype(float*)]]
    [Normalize]                    (float output only)

Interpolation must be bilinear (torchvision's default) or bicubic (Pillow's
filters, bit-exact), or timm's ``"random"`` (one of the two per sample);
``antialias`` is always on, as torchvision does for PIL images.  Random decisions come from
fastloader's counter-based RNG keyed by (seed, epoch, index), so they follow
torchvision's algorithms and distributions but not torch's global RNG stream.

Calling one of these transforms directly (``tf(pil_image)``) runs the
equivalent torchvision transform, for debugging.

:class:`NativeTransform` wraps a pipeline for a custom dataset's own
``__getitem__``: one call reads, decodes and transforms an image in C with
the GIL released, as ImageFolder's workers do (csrc/binding/py_native_call.c).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .worker_info import tls

__all__ = [
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "Grayscale",
    "NativeTransform",
    "Normalize",
    "PILToTensor",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "Resize",
    "ToDtype",
    "ToImage",
    "ToTensor",
    "Transform",
    "compile_transform",
]

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_SCALE_NONE, _SCALE_DIV, _SCALE_MUL = 0, 1, 2   # csrc/image/imgops.h FL_SCALE_*
_INTERP_BILINEAR, _INTERP_BICUBIC, _INTERP_RANDOM = 0, 1, 2   # csrc/image/imgops.h FL_INTERP_*


def _pair(size: Any, name: str) -> tuple[int, int]:
    """torchvision's size convention: int -> (s, s); [s] -> (s, s); (h, w)."""
    if isinstance(size, int):
        return (size, size)
    size = tuple(int(s) for s in size)
    if len(size) == 1:
        return (size[0], size[0])
    if len(size) != 2:
        raise ValueError(f"{name}: size must be an int or (h, w), got {size!r}")
    return size


def _tv_interp(interp: Any) -> Any:
    """torchvision's InterpolationMode for a mode name ("bicubic") or PIL's
    code of a mode the native resample has (Image.BICUBIC == 3); other
    values (an InterpolationMode) as given."""
    from torchvision.transforms import InterpolationMode
    if isinstance(interp, str):
        return InterpolationMode(interp.lower())
    code = _interp_code(interp)
    if code is not None and not isinstance(interp, InterpolationMode):
        return (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)[code]
    return interp


def _interp_arg(interp: Any) -> str:
    """", interpolation=..." for a repr, empty for the default (bilinear)."""
    return "" if _interp_code(interp) == _INTERP_BILINEAR else f", interpolation={getattr(interp, 'value', interp)!r}"


def _dtype_name(dtype: Any) -> str:
    """'float32' for torch.float32, 'torch.float32', 'float32', numpy dtypes, ..."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    return {"float": "float32", "half": "float16", "double": "float64"}.get(name, name)


class Transform:
    """Base class: a declarative transform.  ``__call__`` runs torchvision's
    equivalent (imported lazily) so a pipeline can be checked on one image."""

    def _torchvision(self) -> Callable:
        raise NotImplementedError

    def __call__(self, x: Any) -> Any:
        return self._torchvision()(x)

    def _args(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._args()})"


class RandomResizedCrop(Transform):
    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), interpolation: Any = "bilinear",
                 antialias: bool | None = True) -> None:
        self.size = _pair(size, "RandomResizedCrop")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation
        self.antialias = antialias

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.RandomResizedCrop(self.size, self.scale, self.ratio, interpolation=_tv_interp(self.interpolation),
                                    antialias=True)

    def _args(self):
        return (f"size={self.size}, scale={self.scale}, ratio=({self.ratio[0]:.4g}, {self.ratio[1]:.4g})"
                + _interp_arg(self.interpolation))


class Resize(Transform):
    def __init__(self, size: int | Sequence[int] | None, interpolation: Any = "bilinear",
                 max_size: int | None = None, antialias: bool | None = True) -> None:
        if size is not None and not isinstance(size, int):
            size = [int(s) for s in size]
            if len(size) not in (1, 2):
                raise ValueError(f"Resize: size must be an int, [s] or (h, w), got {size!r}")
        if size is None and max_size is None:
            raise ValueError("Resize: give size or max_size")
        self.size = size
        self.max_size = max_size
        self.interpolation = interpolation
        self.antialias = antialias

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.Resize(self.size, interpolation=_tv_interp(self.interpolation), max_size=self.max_size,
                         antialias=True)

    def _args(self):
        return (f"size={self.size}" + (f", max_size={self.max_size}" if self.max_size else "")
                + _interp_arg(self.interpolation))


class CenterCrop(Transform):
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size, "CenterCrop")

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.CenterCrop(self.size)

    def _args(self):
        return f"size={self.size}"


class _WithProbability(Transform):
    """A transform applied with probability p: the torchvision v2 class of
    the same name, which takes p alone."""
    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{type(self).__name__}: p must be in [0, 1], got {p}")
        self.p = float(p)

    def _torchvision(self):
        from torchvision.transforms import v2
        return getattr(v2, type(self).__name__)(self.p)

    def _args(self):
        return f"p={self.p}"


class RandomHorizontalFlip(_WithProbability):
    pass


class RandomVerticalFlip(_WithProbability):
    pass


class RandomGrayscale(_WithProbability):
    def __init__(self, p: float = 0.1) -> None:   # torchvision's default
        super().__init__(p)


class ColorJitter(Transform):
    """torchvision's ColorJitter (brightness, contrast, saturation: a factor
    range ``[max(0, 1 - x), 1 + x]`` for a number x, or ``(lo, hi)``; hue:
    ``[-x, x]`` or ``(lo, hi)`` within [-0.5, 0.5]; 0 leaves that adjustment
    out), applied on the uint8 image in a random order per sample."""

    def __init__(self, brightness: Any = 0, contrast: Any = 0, saturation: Any = 0, hue: Any = 0) -> None:
        self.brightness = self._range(brightness, "brightness", 1.0, (0.0, float("inf")), True)
        self.contrast = self._range(contrast, "contrast", 1.0, (0.0, float("inf")), True)
        self.saturation = self._range(saturation, "saturation", 1.0, (0.0, float("inf")), True)
        self.hue = self._range(hue, "hue", 0.0, (-0.5, 0.5), False)

    @staticmethod
    def _range(value: Any, name: str, center: float, bound: tuple, clip: bool) -> tuple[float, float] | None:
        """torchvision's _check_input: a number x -> [center - x, center + x]
        (clipped at 0 for the factors), a pair as given; None when it is
        [center, center]."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"ColorJitter: if {name} is a single number, it must be non negative")
            lo, hi = center - float(value), center + float(value)
            if clip:
                lo = max(lo, 0.0)
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            lo, hi = float(value[0]), float(value[1])
        else:
            raise TypeError(f"ColorJitter: {name} should be a single number or a pair, got {value!r}")
        if not bound[0] <= lo <= hi <= bound[1]:
            raise ValueError(f"ColorJitter: {name} values should be between {bound} and increasing, "
                             f"got {(lo, hi)}")
        return None if lo == hi == center else (lo, hi)

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.ColorJitter(self.brightness, self.contrast, self.saturation, self.hue)

    def _args(self):
        return ", ".join(f"{k}={getattr(self, k)}" for k in ("brightness", "contrast", "saturation", "hue")
                         if getattr(self, k) is not None)


class Grayscale(Transform):
    def __init__(self, num_output_channels: int = 1) -> None:
        if num_output_channels not in (1, 3):
            raise ValueError("Grayscale: num_output_channels must be 1 or 3")
        self.num_output_channels = num_output_channels

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.Grayscale(self.num_output_channels)

    def _args(self):
        return f"num_output_channels={self.num_output_channels}"


class Normalize(Transform):
    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        if any(s == 0 for s in self.std):
            raise ValueError("Normalize: std evaluated to zero, leading to division by zero.")
        self.inplace = inplace

    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.Normalize(self.mean, self.std)

    def _args(self):
        return f"mean={self.mean}, std={self.std}"


class ToDtype(Transform):
    def __init__(self, dtype: Any, scale: bool = False) -> None:
        self.dtype = dtype
        self.scale = bool(scale)

    def _torchvision(self):
        import torch
        from torchvision.transforms import v2
        dtype = self.dtype if isinstance(self.dtype, torch.dtype) else getattr(torch, _dtype_name(self.dtype))
        return v2.ToDtype(dtype, scale=self.scale)

    def _args(self):
        return f"{_dtype_name(self.dtype)}, scale={self.scale}"


class ToTensor(Transform):
    """PIL / ndarray -> float32 CHW in [0, 1] (x / 255), as torchvision's ToTensor."""

    def _torchvision(self):
        from torchvision import transforms
        return transforms.ToTensor()


class PILToTensor(Transform):
    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.PILToTensor()


class ToImage(Transform):
    def _torchvision(self):
        from torchvision.transforms import v2
        return v2.ToImage()


class Compose(Transform):
    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{inner}\n])"


# --------------------------------------------------------------------------
# compilation

def _is_torchvision(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision.transforms")


def _is_compose(t: Any) -> bool:
    return isinstance(t, Compose) or (_is_torchvision(t) and type(t).__name__ == "Compose")


def _holder_of_compose(t: Any) -> bool:
    """A user object whose whole state is one Compose in ``.transforms``
    (torchvision's reference ``ClassificationPresetTrain`` / ``...Eval``,
    whose ``__call__`` returns ``self.transforms(img)``): it is run as that
    Compose."""
    if isinstance(t, (Transform, list, tuple)) or _is_torchvision(t) or not callable(t):
        return False
    state = getattr(t, "__dict__", None)
    return (isinstance(state, dict) and set(state) == {"transforms"} and _is_compose(state["transforms"]))


def _flatten(transform: Any) -> list:
    """A Compose (ours or torchvision's) becomes its list; anything else a
    one-element list.  Nested Composes are flattened, and so is an object
    that only holds one (``_holder_of_compose``)."""
    if _holder_of_compose(transform):
        return _flatten(transform.transforms)
    if _is_compose(transform):
        out = []
        for t in transform.transforms:
            out.extend(_flatten(t))
        return out
    if isinstance(transform, (list, tuple)):
        out = []
        for t in transform:
            out.extend(_flatten(t))
        return out
    return [transform]


def _interp_code(interp: Any) -> int | None:
    """The spec's interp (imgops.h FL_INTERP_*) for a resize's interpolation:
    0 bilinear (InterpolationMode.BILINEAR, PIL's Image.BILINEAR == 2,
    "bilinear"), 1 bicubic (InterpolationMode.BICUBIC, Image.BICUBIC == 3,
    "bicubic"); None for any other mode, which the native resample lacks."""
    value = getattr(interp, "value", interp)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    if isinstance(value, str):
        value = value.lower()
    return {"bilinear": _INTERP_BILINEAR, 2: _INTERP_BILINEAR, "bicubic": _INTERP_BICUBIC, 3: _INTERP_BICUBIC}.get(value)


def _timm_interp_code(interp: Any) -> int | None:
    """_interp_code for timm's RandomResizedCropAndInterpolation, whose
    interpolation may also be a tuple of modes drawn with random.choice per
    sample ("random" stores (BILINEAR, BICUBIC)): one mode is that mode's
    code, bilinear and bicubic once each is 2 (random); None otherwise."""
    if not isinstance(interp, (list, tuple)):
        return _interp_code(interp)
    codes = [_interp_code(m) for m in interp]
    if len(codes) == 1:
        return codes[0]
    if sorted(codes, key=str) == [_INTERP_BILINEAR, _INTERP_BICUBIC]:
        return _INTERP_RANDOM
    return None


def _is_timm(t: Any) -> bool:
    return type(t).__module__.startswith("timm.data")


def _describe(t: Any) -> tuple[str, dict] | None:
    """Map one transform (ours, torchvision v1/v2, or the timm ones that
    mean the same) to (kind, params), or None when the native pipeline
    cannot run it exactly."""
    ours = isinstance(t, Transform)
    name = type(t).__name__
    if _is_timm(t):
        if name == "MaybeToTensor":        # F.to_tensor on the PIL image it gets here
            return ("to_tensor", {})
        if name == "RandomErasing":      # timm.data.random_erasing, per sample (a 3-d tensor)
            return ("erase", dict(obj=t, v2=False, timm=True))
        if name in ("RandAugment", "AutoAugment", "AugMixAugment"):   # timm.data.auto_augment's, of AugmentOps
            return ("policy", dict(obj=t, v2=False, timm=name))
        if name == "RandomResizedCropAndInterpolation":   # torchvision's get_params, then resized_crop
            interp = _timm_interp_code(t.interpolation)
            if interp is None:
                return None
            return ("rrc", dict(size=_pair(t.size, name), scale=tuple(map(float, t.scale)),
                                ratio=tuple(map(float, t.ratio)), interp=interp))
        return None
    if type(t).__module__.startswith("torch.nn") and name == "Identity":
        return ("identity", {})
    if not ours and not _is_torchvision(t):
        return None
    v2 = ".v2." in type(t).__module__
    if name in ("ToPureTensor", "Identity"):
        return ("identity", {})
    if name in ("TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix") and not ours:
        return ("policy", dict(obj=t, v2=v2))
    if name == "RandomErasing" and not ours:
        return ("erase", dict(obj=t, v2=v2))
    if name == "Grayscale":
        return ("gray", {}) if t.num_output_channels == 1 else None
    if name == "RandomResizedCrop":
        interp = _interp_code(t.interpolation)
        if interp is None:
            return None
        h, w = _pair(t.size, name)
        return ("rrc", dict(size=(h, w), scale=tuple(map(float, t.scale)), ratio=tuple(map(float, t.ratio)),
                            interp=interp))
    if name == "Resize":
        interp = _interp_code(t.interpolation)
        if interp is None:
            return None
        size, max_size = t.size, t.max_size
        if size is None:
            return ("resize", dict(short=0, hw=None, max_size=int(max_size), interp=interp))
        if isinstance(size, int):
            return ("resize", dict(short=size, hw=None, max_size=int(max_size or 0), interp=interp))
        size = list(size)
        if len(size) == 1:
            return ("resize", dict(short=int(size[0]), hw=None, max_size=int(max_size or 0), interp=interp))
        return ("resize", dict(short=0, hw=(int(size[0]), int(size[1])), max_size=0, interp=interp))
    if name == "CenterCrop":
        return ("center_crop", dict(size=_pair(t.size, name)))
    if name == "RandomHorizontalFlip":
        return ("flip", dict(p=float(t.p)))
    if name == "RandomVerticalFlip":
        return ("vflip", dict(p=float(t.p)))
    if name == "RandomGrayscale":
        return ("random_gray", dict(p=float(t.p)))
    if name == "RandomRotation" and not ours:
        return ("rotate", dict(obj=t))
    if name == "RandomAffine" and not ours:
        return ("affine", dict(obj=t, v2=v2))
    if name == "ColorJitter":
        return _jitter_desc(t, 1.0)
    if name == "GaussianBlur" and not ours:
        return _blur_desc(t, 1.0)
    if name == "RandomApply" and not ours:   # RandomApply([ColorJitter(...)] or [GaussianBlur(...)], p), as timm
        inner = list(getattr(t, "transforms", []))   # and SimCLR use them
        if len(inner) == 1 and _is_torchvision(inner[0]) and type(inner[0]).__name__ == "ColorJitter":
            return _jitter_desc(inner[0], float(t.p))
        if len(inner) == 1 and _is_torchvision(inner[0]) and type(inner[0]).__name__ == "GaussianBlur":
            return _blur_desc(inner[0], float(t.p))
        return None
    if name == "ToTensor":
        return ("to_tensor", {})
    if name in ("PILToTensor", "ToImage"):
        return ("to_image", {})
    if name in ("ToDtype", "ConvertImageDtype"):
        dtype = t.dtype
        if isinstance(dtype, dict):   # v2: {tv_tensors.Image: dtype, "others": ...}
            picks = [v for k, v in dtype.items() if getattr(k, "__name__", k) in ("Image", "Tensor")]
            if len(picks) != 1:
                return None
            dtype = picks[0]
        dname = _dtype_name(dtype)
        if name == "ConvertImageDtype":
            scale = _SCALE_MUL if v2 else _SCALE_DIV   # v1 divides, v2 multiplies by 1/255
        else:
            scale = _SCALE_MUL if t.scale else _SCALE_NONE
        if dname == "uint8":
            return ("to_dtype", dict(dtype="uint8", scale=_SCALE_NONE))
        if dname not in _FLOAT_DTYPES:
            return None
        return ("to_dtype", dict(dtype=dname, scale=scale))
    if name == "Normalize":
        return ("normalize", dict(mean=[float(m) for m in t.mean], std=[float(s) for s in t.std]))
    return None


def _jitter_desc(t: Any, p: float) -> tuple[str, dict] | None:
    """("jitter", {p, and the (lo, hi) of each adjustment present}) for a
    torchvision v1/v2 (or fastloader) ColorJitter applied with probability
    p, or None when its ranges are not what the native op takes."""
    ranges = {}
    for key in ("brightness", "contrast", "saturation", "hue"):
        r = getattr(t, key, None)
        if r is None:
            continue
        try:
            lo, hi = (float(v) for v in r)
        except (TypeError, ValueError):
            return None
        bound = (-0.5, 0.5) if key == "hue" else (0.0, float("inf"))
        if not bound[0] <= lo <= hi <= bound[1]:
            return None
        ranges[key] = (lo, hi)
    if not 0.0 <= p <= 1.0:
        return None
    return ("jitter", dict(p=p, ranges=ranges))


_JITTER_AFTER_FLIPS, _JITTER_BEFORE_POLICY, _JITTER_AFTER_POLICY = 0, 1, 2   # imgops.h FL_JITTER_*
_BLUR_BEFORE_GRAY, _BLUR_AFTER_GRAY = 0, 1   # imgops.h FL_BLUR_*
_BLUR_MAX_K = 127                            # augment.h FL_GBLUR_MAX_K
_BLUR_SIGMA = (1e-6, 1e6)                    # the sigmas fl_gblur_kernel1d takes


def _blur_desc(t: Any, p: float) -> tuple[str, dict] | None:
    """("blur", {p, kernel (kx, ky), sigma (lo, hi), v2}) for a torchvision
    v1/v2 GaussianBlur applied with probability p, or None when its
    attributes are not what torchvision's own checks let through."""
    try:
        kx, ky = (int(k) for k in t.kernel_size)
        lo, hi = (float(v) for v in t.sigma)
    except (TypeError, ValueError, AttributeError):
        return None
    if kx < 1 or ky < 1 or kx % 2 == 0 or ky % 2 == 0 or not 0.0 < lo <= hi or not 0.0 <= p <= 1.0:
        return None
    return ("blur", dict(p=p, kernel=(kx, ky), sigma=(lo, hi), v2=".v2." in type(t).__module__))


# (kernel, sigma, v2, out size, channels) -> (lanes, exp) or the reason it stays in Python
_BLUR_VERDICTS: dict = {}


def _blur_native(d: dict, out_w: int, out_h: int, channels: int) -> tuple[dict | None, str | None]:
    """The spec's "blur" part (without p and pos) for a _blur_desc, or
    (None, reason) when it stays in Python.

    The native op reproduces torch 2.14's float32 arithmetic on the CPU,
    which depends on torch's CPU capability (the vector width of its sums),
    on the exp behind torch.exp (v1: MKL's in torch's MKL builds) and on
    oneDNN's convolution.  So before a GaussianBlur goes native, this
    machine's torch is asked: torchvision's own _get_gaussian_kernel1d for
    50 sigmas across [lo, hi] and its tensor kernel on a noise image of the
    output size, against the native ones, bit for bit; any difference keeps
    it in Python (a note names it).  Once per configuration and process."""
    (kx, ky), (lo, hi), v2 = d["kernel"], d["sigma"], d["v2"]
    if kx > _BLUR_MAX_K or ky > _BLUR_MAX_K:
        return None, f"GaussianBlur with a kernel side over {_BLUR_MAX_K} is not native"
    if kx // 2 >= out_w or ky // 2 >= out_h:   # torch's reflect padding raises on every sample
        return None, (f"GaussianBlur's padding ({kx // 2}, {ky // 2}) is not below the {out_w} x {out_h} image "
                      "(torch raises)")
    if not _BLUR_SIGMA[0] <= lo <= hi <= _BLUR_SIGMA[1]:
        return None, f"GaussianBlur's sigma ({lo}, {hi}) is outside [{_BLUR_SIGMA[0]}, {_BLUR_SIGMA[1]}]"
    # augment.h fl_gblur_torch_gemm: torch's own choice of convolution for a small one-channel blur
    if (channels == 1 and (kx, ky) != (1, 1) and (kx <= 3 or ky <= 3)
            and (out_w + kx // 2 * 2) * (out_h + ky // 2 * 2) <= 20480):
        return None, (f"GaussianBlur {kx} x {ky} on a one-channel {out_w} x {out_h} image: torch sums it with its "
                      "GEMM convolution, whose order is not reproduced natively")
    key = (kx, ky, lo, hi, v2, out_w, out_h, channels)
    verdict = _BLUR_VERDICTS.get(key)
    if verdict is None:
        verdict = _BLUR_VERDICTS[key] = _blur_check(kx, ky, lo, hi, v2, out_w, out_h, channels)
    if isinstance(verdict, str):
        return None, verdict
    lanes, exp = verdict
    spec = dict(sigma=(lo, hi), kernel=(kx, ky), v2=v2, lanes=lanes)
    if not v2:
        spec["exp"] = exp
    return spec, None


def _blur_check(kx: int, ky: int, lo: float, hi: float, v2: bool, out_w: int, out_h: int,
                channels: int) -> tuple[int, str] | str:
    """(lanes, exp) when the native GaussianBlur equals this torch's on
    this machine (_blur_native), else the reason it does not."""
    try:
        import numpy as np
        import torch
        from torchvision.transforms import _functional_tensor as F_t
        from torchvision.transforms.v2.functional import _misc as F_misc
    except ImportError as e:   # pragma: no cover - a torchvision GaussianBlur comes with them
        return f"GaussianBlur stays in Python: {e}"
    from . import _C

    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"GaussianBlur stays in Python: torch's CPU capability {capability} (native: AVX2, AVX512)"
    # the width of the one sum each version runs: v2's softmax kernel is registered for AVX512 too
    # (ALSO_REGISTER_AVX512_DISPATCH), so it sums 16 lanes there; v1's pdf.sum() is sum_stub, registered
    # by REGISTER_DISPATCH, which leaves ATen's AVX512 slot empty, so an AVX512 machine runs its AVX2
    # kernel: 8 lanes on both
    lanes = 16 if v2 and capability == "AVX512" else 8
    exp = "sleef" if v2 or not torch.backends.mkl.is_available() else "mkl"
    kernel1d = F_misc._get_gaussian_kernel1d if v2 else F_t._get_gaussian_kernel1d
    rng = np.random.default_rng(0x6A55)
    sigmas = np.concatenate([[lo, hi], rng.uniform(lo, hi, 48)]).astype(np.float32)
    try:
        for s in map(float, sigmas):
            for k in sorted({kx, ky}):
                want = kernel1d(k, s, dtype=torch.float32, device=torch.device("cpu")).numpy()
                got = _C._gaussian_kernel(k, s, v2, lanes=lanes, exp=exp)
                if not np.array_equal(want.view(np.int32), got.view(np.int32)):
                    return (f"GaussianBlur stays in Python: torch {torch.__version__}'s kernel ({k}, sigma {s}) "
                            f"on this {capability} machine differs from the native one")
        img = rng.integers(0, 256, (out_h, out_w, channels), dtype=np.uint8)
        t = torch.from_numpy(img).permute(2, 0, 1)
        for s in map(float, sigmas[:2]):
            want = (F_misc.gaussian_blur_image(t, [kx, ky], [s, s]) if v2 else
                    F_t.gaussian_blur(t, [kx, ky], [s, s])).permute(1, 2, 0).numpy()
            got = _C._gaussian_blur(img, (kx, ky), s, v2, lanes=lanes, exp=exp)
            if not np.array_equal(want, got):
                return (f"GaussianBlur stays in Python: torch {torch.__version__}'s blur (sigma {s}) on this "
                        f"{capability} machine differs from the native one in {int((want != got).sum())} values")
    except (ValueError, RuntimeError) as e:   # torch's exp not found, or torch refusing the blur
        return f"GaussianBlur stays in Python: {e}"
    return lanes, exp


# csrc/image/augment.h FL_AUG_*, by torchvision's op names
_AUG_OPS = {"Identity": 0, "ShearX": 1, "ShearY": 2, "TranslateX": 3, "TranslateY": 4, "Rotate": 5,
            "Brightness": 6, "Color": 7, "Contrast": 8, "Sharpness": 9, "Posterize": 10, "Solarize": 11,
            "AutoContrast": 12, "Equalize": 13, "Invert": 14}
_POLICY_MAX_OPS, _POLICY_MAX_BINS, _POLICY_MAX_SUB, _POLICY_MAX_ROUNDS = 16, 32, 32, 8   # imgops.h
_POLICY_MAX_TIMM = 64   # imgops.h FL_POLICY_MAX_TIMM


def _aug_interp(interp: Any) -> int | None:
    """0 nearest, 1 bilinear (augment.h FL_AUG_*), None for other modes."""
    value = getattr(interp, "value", interp)
    return {"nearest": 0, 0: 0, "bilinear": 1, 2: 1}.get(value)


def _pil_fill(fill: Any, channels: int) -> tuple[int, int, int] | None:
    """What torchvision's PIL kernels make of ``fill`` (_parse_fill: None is
    0, a number or one value is repeated, values truncated to int), or None
    when it is not a valid uint8 fill."""
    if fill is None:
        vals = [0]
    elif isinstance(fill, (int, float)):
        vals = [fill]
    elif isinstance(fill, (list, tuple)) and len(fill) in (1, channels):
        vals = list(fill)
    else:
        return None
    try:
        vals = [int(v) for v in vals]
    except (TypeError, ValueError):
        return None
    if any(v < 0 or v > 255 for v in vals):
        return None
    vals = vals * 3 if len(vals) == 1 else vals + [0] * (3 - len(vals))
    return (vals[0], vals[1], vals[2])


def _rotation_spec(t: Any, channels: int) -> dict | None:
    """The spec keys (rotate, rot_lo, rot_hi, rot_interp, rot_fill) for a
    torchvision v1/v2 RandomRotation acting on the PIL image, or None when
    the native op cannot run it exactly: expand, a centre, another
    interpolation than nearest/bilinear, a fill that is not uint8."""
    if getattr(t, "expand", False) or getattr(t, "center", None) is not None:
        return None
    interp = _aug_interp(t.interpolation)
    fill = _pil_fill(t.fill, channels)
    if interp is None or fill is None:
        return None
    lo, hi = (float(d) for d in t.degrees)
    return dict(rotate=1, rot_lo=lo, rot_hi=hi, rot_interp=interp, rot_fill=fill)


def _affine_spec(t: Any, v2: bool, channels: int) -> dict | None:
    """The spec keys (rotate 2 or 3, rot_*, aff_*) for a torchvision v1/v2
    RandomAffine acting on the PIL image, or None when the native op cannot
    run it exactly: an interpolation other than nearest, bilinear or
    bicubic (Pillow's transform filters), a fill that is not uint8."""
    value = getattr(t.interpolation, "value", t.interpolation)
    interp = {"nearest": 0, 0: 0, "bilinear": 1, 2: 1, "bicubic": 2, 3: 2}.get(value)
    fill = _pil_fill(t.fill, channels)
    if interp is None or fill is None:
        return None
    try:
        lo, hi = (float(d) for d in t.degrees)
        out = dict(rotate=3 if v2 else 2, rot_lo=lo, rot_hi=hi, rot_interp=interp, rot_fill=fill)
        if t.translate is not None:
            out.update(aff_tx=float(t.translate[0]), aff_ty=float(t.translate[1]))
        if t.scale is not None:
            out.update(aff_scale_lo=float(t.scale[0]), aff_scale_hi=float(t.scale[1]))
        if t.shear is not None:
            out["aff_shear"] = [float(v) for v in t.shear]
            if len(out["aff_shear"]) not in (2, 4):
                return None
        if t.center is not None:
            out.update(aff_center=1, aff_cx=float(t.center[0]), aff_cy=float(t.center[1]))
    except (TypeError, ValueError, IndexError):
        return None
    return out


# csrc/image/augment.h: the tensor kernels AugMix runs (v1 code, v2 code), by torchvision's op names;
# Posterize, Solarize and Equalize give Pillow's bytes on tensors too
_AUGMIX_OPS = {"ShearX": (24, 29), "ShearY": (25, 30), "TranslateX": (26, 31), "TranslateY": (27, 32),
               "Rotate": (28, 33), "Brightness": (34, 34), "Color": (35, 36), "Contrast": (37, 38),
               "Sharpness": (39, 40), "AutoContrast": (41, 42), "Posterize": (10, 10), "Solarize": (11, 11),
               "Equalize": (13, 13)}
_AUGMIX_MAX_OPS = 32   # imgops.h FL_AUGMIX_MAX_OPS


def _augmix_spec(t: Any, v2: bool, h: int, w: int) -> dict | None:
    """The fl_policy dict (kind "augmix") for a torchvision v1/v2 AugMix on
    an h x w sample: its op table from the object's own augmentation space
    (all_ops or not), each op's first `severity` magnitude bins (the ones
    forward draws from), its chains, depth and alpha; or None when it cannot
    run natively (a fill, an interpolation the tensor kernels lack, more
    chains or ops than the C tables hold)."""
    interp = _aug_interp(t.interpolation)
    if interp is None or t.fill is not None:
        return None
    width, depth, severity = int(t.mixture_width), int(t.chain_depth), int(t.severity)
    if not 1 <= width <= _POLICY_MAX_ROUNDS or not 1 <= severity <= 10:
        return None
    if (depth if depth > 0 else 3) * width > _AUGMIX_MAX_OPS:
        return None
    alpha = float(t.alpha)
    if not 0.0 < alpha < 1e6:
        return None
    if v2:
        table = t._AUGMENTATION_SPACE if t.all_ops else t._PARTIAL_AUGMENTATION_SPACE
        space = {k: (fn(t._PARAMETER_MAX, h, w), signed) for k, (fn, signed) in table.items()}
    else:
        space = t._augmentation_space(t._PARAMETER_MAX, (h, w))
    if len(space) > _POLICY_MAX_OPS or any(n not in _AUGMIX_OPS for n in space):
        return None
    ops = []
    for n, (mags, signed) in space.items():
        if mags is None or getattr(mags, "ndim", 1) == 0:
            values: list[float] = []
        else:
            values = [float(m) for m in mags.reshape(-1).tolist()[:severity]]
            if n == "Solarize" and v2:   # v2 scales its [0, 1] table by the uint8 bound
                values = [255 * m for m in values]
        ops.append((_AUGMIX_OPS[n][1 if v2 else 0], bool(signed) and bool(values), values))
    return dict(kind="augmix", rounds=width, depth=depth, alpha=alpha, interp=interp, fill=(0, 0, 0), ops=ops)


def _policy_spec(t: Any, v2: bool, h: int, w: int, channels: int) -> dict | None:
    """The fl_policy dict (csrc/image/imgops.h) for a torchvision v1/v2
    TrivialAugmentWide, RandAugment or AutoAugment acting on the PIL image
    of an h x w sample, with the op tables taken from the transform's own
    augmentation space (so magnitudes, bins and signs are torchvision's), or
    None when it cannot run natively (another interpolation, a fill that is
    not uint8, more bins than the C tables hold, ops it does not know)."""
    name = type(t).__name__
    if name == "AugMix":
        return _augmix_spec(t, v2, h, w)
    interp = _aug_interp(t.interpolation)
    fill = t.fill
    if v2 and isinstance(fill, dict):
        return None
    fill = _pil_fill(fill, channels)
    if interp is None or fill is None:
        return None
    nbins = {"TrivialAugmentWide": getattr(t, "num_magnitude_bins", 31), "RandAugment":
             getattr(t, "num_magnitude_bins", 31), "AutoAugment": 10}[name]
    if nbins > _POLICY_MAX_BINS:
        return None
    if v2:
        space = {k: (fn(nbins, h, w), signed) for k, (fn, signed) in t._AUGMENTATION_SPACE.items()}
    elif name == "TrivialAugmentWide":
        space = t._augmentation_space(nbins)
    else:
        space = t._augmentation_space(nbins, (h, w))
    names = list(space)
    if len(names) > _POLICY_MAX_OPS or any(n not in _AUG_OPS for n in names):
        return None
    ops = []
    for n in names:
        mags, signed = space[n]
        if mags is None or getattr(mags, "ndim", 1) == 0:
            values: list[float] = []
        else:
            values = [float(m) for m in mags.reshape(-1).tolist()]
            if n == "Solarize" and v2:   # v2 scales its [0, 1] table by the PIL bound
                values = [255.0 * m for m in values]
        ops.append((_AUG_OPS[n], bool(signed), values))
    index = {n: i for i, n in enumerate(names)}
    if name == "TrivialAugmentWide":
        subs, rounds = [[(i, -1, 1.0)] for i in range(len(names))], 1
    elif name == "RandAugment":
        if not 0 <= t.magnitude < nbins:
            return None
        subs = [[(i, int(t.magnitude), 1.0)] for i in range(len(names))]
        rounds = int(t.num_ops)
        if rounds > _POLICY_MAX_ROUNDS:
            return None
    else:
        table = t._policies if v2 else t.policies
        if len(table) > _POLICY_MAX_SUB:
            return None
        subs = []
        for sub in table:
            steps = []
            for op_name, prob, mag_id in sub:
                if op_name not in index:
                    return None
                steps.append((index[op_name], -1 if mag_id is None else int(mag_id), float(prob)))
            subs.append(steps)
        rounds = 1
    if rounds == 0:
        return {}
    return dict(rounds=rounds, interp=interp, fill=fill, ops=ops, subs=subs)


# timm.data.auto_augment's op names -> (csrc/image/augment.h FL_AUG_*, imgops.h FL_LEVEL_*): the
# op its NAME_TO_OP function amounts to, and its LEVEL_TO_ARG function
_TIMM_OPS = {
    "AutoContrast": (12, 0), "Equalize": (13, 0), "Invert": (14, 0), "Rotate": (5, 1),
    "Posterize": (10, 7), "PosterizeIncreasing": (10, 8), "PosterizeOriginal": (10, 9),
    "Solarize": (11, 10), "SolarizeIncreasing": (11, 11), "SolarizeAdd": (15, 12),
    "Brightness": (20, 2), "BrightnessIncreasing": (20, 3), "Color": (21, 2), "ColorIncreasing": (21, 3),
    "Contrast": (22, 2), "ContrastIncreasing": (22, 3), "Sharpness": (23, 2), "SharpnessIncreasing": (23, 3),
    "ShearX": (16, 4), "ShearY": (17, 4), "TranslateX": (18, 5), "TranslateY": (19, 5),
    "TranslateXRel": (18, 6), "TranslateYRel": (19, 6),
    "Desaturate": (21, 13), "GaussianBlur": (46, 14), "GaussianBlurRand": (46, 15),   # the 3a ops
}
_TIMM_GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
_AUG_BICUBIC, _AUG_RANDOM = 2, 3   # augment.h FL_AUG_BICUBIC, FL_AUG_RANDOM


def _timm_resample(resample: Any) -> int | None:
    """augment.h's filter for an AugmentOp's resample kwarg: one PIL filter
    (NEAREST, BILINEAR, BICUBIC), or a tuple drawn with random.choice
    (BILINEAR and BICUBIC: FL_AUG_RANDOM); None otherwise."""
    one = {0: 0, 2: 1, 3: _AUG_BICUBIC}

    def code(r: Any) -> int | None:
        v = getattr(r, "value", r)
        return one.get(v) if isinstance(v, int) and not isinstance(v, bool) else None

    if isinstance(resample, (list, tuple)):
        codes = [code(r) for r in resample]
        if len(codes) == 1:
            return codes[0]
        return _AUG_RANDOM if len(codes) == 2 and set(codes) == {1, _AUG_BICUBIC} else None
    return code(resample)


def _timm_ops(ops_in: list, mod: Any, channels: int) -> tuple[list, int, tuple] | None:
    """timm's AugmentOps as fl_timm_op tuples (op, level, prob, m, mstd,
    mmax, hparam), with the one filter and fill their geometric ops hand
    Pillow; None when one of them cannot run natively (see _timm_ra_spec)."""
    name_to_op, level_to_arg = getattr(mod, "NAME_TO_OP", None), getattr(mod, "LEVEL_TO_ARG", None)
    if name_to_op is None or level_to_arg is None:
        return None
    ops, resamples, fills = [], set(), set()
    for op in ops_in:
        nm = getattr(op, "name", None)
        if nm not in _TIMM_OPS or op.aug_fn is not name_to_op.get(nm) or op.level_fn is not level_to_arg.get(nm):
            return None
        code, level = _TIMM_OPS[nm]
        try:
            hparam = 0.0
            if level == 5:
                hparam = float(op.hparams["translate_const"])
            elif level == 6:
                hparam = float(op.hparams.get("translate_pct", 0.45))
            ops.append((code, level, float(op.prob), float(op.magnitude), float(op.magnitude_std),
                        float(op.magnitude_max or 0.0), hparam))
        except (TypeError, ValueError, KeyError, AttributeError):
            return None
        if nm in _TIMM_GEOMETRIC:
            resamples.add(_timm_resample(op.kwargs.get("resample")))
            fills.add(_pil_fill(op.kwargs.get("fillcolor"), channels))
    if None in resamples or None in fills or len(resamples) > 1 or len(fills) > 1:
        return None
    return ops, (resamples.pop() if resamples else 1), (fills.pop() if fills else (0, 0, 0))


def _timm_ra_spec(t: Any, channels: int) -> dict | None:
    """The fl_policy dict (kind "timm_ra", csrc/image/imgops.h) for timm's
    RandAugment acting on an RGB PIL image, read from its own AugmentOps:
    each op's name, prob, magnitude, magnitude_std, magnitude_max and
    hparams, the resample and fillcolor they pass Pillow, num_layers and
    choice_weights.  None when it cannot run natively: an op it does not
    know, an op whose functions are not timm's
    own for its name, geometric ops that disagree on filter or fill, a gray
    image, more layers or ops than the C tables hold."""
    import sys
    ops_in = list(getattr(t, "ops", None) or [])
    n_layers = getattr(t, "num_layers", None)
    if channels != 3 or not isinstance(n_layers, int):
        return None
    if not 0 <= n_layers <= _POLICY_MAX_ROUNDS or not 1 <= len(ops_in) <= _POLICY_MAX_OPS:
        return None
    if n_layers == 0:
        return {}
    got = _timm_ops(ops_in, sys.modules.get(type(t).__module__), channels)
    if got is None:
        return None
    ops, interp, fill = got
    weights = t.choice_weights
    if weights is not None:
        weights = [float(w) for w in weights]
        if len(weights) != len(ops):
            return None
    return dict(kind="timm_ra", rounds=n_layers, interp=interp, fill=fill, ops=ops, weights=weights)


def _timm_aa_spec(t: Any, channels: int) -> dict | None:
    """The fl_policy dict (kind "timm_aa") for timm's AutoAugment (the
    "original", "v0", "originalr" and "v0r" policies): its sub-policies of
    AugmentOps, each op read as _timm_ra_spec reads them (the "3a" policy's
    Solarize, Desaturate and GaussianBlurRand too); None when one op cannot
    run natively, or the policy is larger than the C tables (32 sub-policies
    of 1..2 ops, 64 ops)."""
    import sys
    policy = list(getattr(t, "policy", None) or [])
    if channels != 3 or not 1 <= len(policy) <= _POLICY_MAX_SUB:
        return None
    flat, subs = [], []
    for sub in policy:
        sub = list(sub)
        if not 1 <= len(sub) <= 2:
            return None
        subs.append(list(range(len(flat), len(flat) + len(sub))))
        flat.extend(sub)
    if len(flat) > _POLICY_MAX_TIMM:
        return None
    got = _timm_ops(flat, sys.modules.get(type(t).__module__), channels)
    if got is None:
        return None
    ops, interp, fill = got
    return dict(kind="timm_aa", rounds=1, interp=interp, fill=fill, ops=ops, subs=subs)


def _timm_augmix_spec(t: Any, channels: int) -> dict | None:
    """The fl_policy dict (kind "timm_augmix") for timm's AugMixAugment
    (``augment_and_mix_transform``, ``auto_augment="augmix-..."``): its
    AugmentOps read as _timm_ra_spec reads them, width, depth and alpha.
    None when it cannot run natively: the blended mode, a gray image, an op
    it does not know, more chains or ops than the C tables hold."""
    import sys
    ops_in = list(getattr(t, "ops", None) or [])
    if channels != 3 or getattr(t, "blended", True) or not 1 <= len(ops_in) <= _POLICY_MAX_OPS:
        return None
    try:
        width, depth, alpha = int(t.width), int(t.depth), float(t.alpha)
    except (AttributeError, TypeError, ValueError):
        return None
    if not 1 <= width <= _POLICY_MAX_ROUNDS or (depth if depth > 0 else 3) * width > _AUGMIX_MAX_OPS:
        return None
    if not 0.0 < alpha < 1e6:
        return None
    got = _timm_ops(ops_in, sys.modules.get(type(t).__module__), channels)
    if got is None:
        return None
    ops, interp, fill = got
    return dict(kind="timm_augmix", rounds=width, depth=depth, alpha=alpha, interp=interp, fill=fill, ops=ops)


def _erase_spec(t: Any, v2: bool, channels: int, dtype: str, timm: bool = False) -> dict | None:
    """The fl_erase dict for a torchvision v1/v2 (or, timm=True, timm) RandomErasing on the
    finished sample, or None when it cannot run natively."""
    if timm:
        import math

        mode = 1 if t.per_pixel else 2 if t.rand_color else 0
        if dtype == "uint8" and mode:
            return None
        lo, hi = t.log_aspect_ratio
        return dict(p=float(t.probability), scale=(float(t.min_area), float(t.max_area)),
                    ratio=(math.exp(lo), math.exp(hi)), mode=mode, value=[0.0],
                    count=(int(t.min_count), int(t.max_count)))
    value = t.value
    if v2:
        mode, vals = (1, [0.0]) if value is None else (0, list(value))
    elif isinstance(value, str):
        if value != "random":
            return None
        mode, vals = 1, [0.0]
    elif isinstance(value, (int, float)):
        mode, vals = 0, [float(value)]
    elif isinstance(value, (list, tuple)):
        mode, vals = 0, [float(v) for v in value]
    else:
        return None
    if len(vals) not in (1, channels):
        return None
    if dtype == "uint8" and (mode == 1 or any(v != int(v) or not 0 <= v <= 255 for v in vals)):
        return None
    return dict(p=float(t.p), scale=(float(t.scale[0]), float(t.scale[1])),
                ratio=(float(t.ratio[0]), float(t.ratio[1])), mode=mode, value=vals)


class _PythonRest:
    """The part of a pipeline that runs in Python, per sample, on the native
    output (a torch tensor, or a numpy array when torch is absent).  When the
    native part ended before any to-tensor step, the sample is first turned
    back into a PIL image so the remaining transforms see what they expect."""

    def __init__(self, transforms: list, to_pil: bool, layout: str) -> None:
        self.transforms = transforms
        self.to_pil = to_pil
        self.layout = layout

    def __call__(self, x: Any) -> Any:
        if self.to_pil:
            import numpy as np
            from PIL import Image
            a = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
            if self.layout == "CHW":
                a = a.transpose(1, 2, 0)
            x = Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else np.ascontiguousarray(a))
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        head = "to_pil_image -> " if self.to_pil else ""
        return head + " -> ".join(_short(t) for t in self.transforms)


def _short(t: Any) -> str:
    r = repr(t).replace("\n", " ")
    return r if len(r) <= 80 else r[:77] + "..."


# what the native path runs on the decoded (PIL-like) image, before the to-tensor step
_PIL_STAGE_KINDS = frozenset(("gray", "rrc", "resize", "center_crop", "flip", "vflip", "rotate", "affine", "jitter",
                              "policy", "blur", "random_gray"))


def _tensor_first_note(t: Any) -> str:
    """The note for a pipeline whose to-tensor step (ToImage, PILToTensor,
    ToTensor) comes before a step the native path runs on the image: that
    step then works on a tensor, with torchvision's tensor kernels, which
    are not Pillow's (torch's antialiased uint8 resize is within 1 of
    Pillow's bilinear and further from its bicubic, the colour ops compute
    in float), so it stays in Python."""
    return (f"{type(t).__name__} comes after the to-tensor step, so torchvision runs it on a tensor, whose kernels "
            "the native path does not replicate; with the to-tensor step after the image steps (the order of "
            "torchvision's reference presets) they run in C, with Pillow's pixels, which differ slightly from the "
            "tensor kernels' (docs/recipes.md, 'Not native yet')")


def compile_transform(transform: Any, *, layout: str = "CHW") -> tuple[dict, Callable | None, str]:
    """Split a pipeline into a native spec and a Python remainder.

    transform: our Compose / transform, a torchvision (v1 or v2) Compose or
    single transform, a list of transforms, or None.
    layout: "CHW" or "HWC" for the native output.

    Returns (spec, rest, description): spec is the dict the C pipeline takes
    (keys as csrc/image/imgops.h fl_tspec; see fastloader._C._render); rest is None
    or a callable to run per sample on the native output tensor; description
    says which part runs where.  Output dtype: uint8 unless the prefix has
    ToTensor (float32) or a float ToDtype.  A spec whose out_h/out_w are 0
    gives variable-size samples (Resize(int) without a crop), which only a
    batch of equally sized images can collate.
    """
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    items = [] if transform is None else _flatten(transform)
    descs = [_describe(t) for t in items]
    spec: dict = dict(geom="none", out_h=0, out_w=0, flip_p=0.0, out_channels=3, dtype="uint8",
                      scale_to_unit=_SCALE_NONE, normalize=False, layout=layout)
    pos = 0
    notes: list[str] = []
    flips: dict = {}

    def kind(i: int) -> str | None:
        return descs[i][0] if i < len(descs) and descs[i] is not None else None

    if kind(pos) == "gray":
        spec["out_channels"] = 1
        pos += 1
    if kind(pos) == "rrc":
        p = descs[pos][1]
        spec.update(geom="rrc", out_h=p["size"][0], out_w=p["size"][1], scale_lo=p["scale"][0],
                    scale_hi=p["scale"][1], ratio_lo=p["ratio"][0], ratio_hi=p["ratio"][1])
        if p["interp"]:   # the key only when not the default (bilinear)
            spec["interp"] = p["interp"]
        pos += 1
    elif kind(pos) in ("resize", "center_crop"):
        spec["geom"] = "resize_crop"
        if kind(pos) == "resize":
            p = descs[pos][1]
            if p["hw"]:
                spec.update(resize_h=p["hw"][0], resize_w=p["hw"][1], out_h=p["hw"][0], out_w=p["hw"][1])
            else:
                spec.update(resize_short=p["short"], max_size=p["max_size"])
            if p["interp"]:
                spec["interp"] = p["interp"]
            pos += 1
        if kind(pos) == "center_crop":
            h, w = descs[pos][1]["size"]
            spec.update(crop_h=h, crop_w=w, out_h=h, out_w=w)
            pos += 1
        if spec["out_h"] == 0:
            notes.append("variable output size (Resize(int) without a crop)")
    # the flips, each at most once, in either order: they commute with each
    # other, and both come after the geometry and before the policy
    for _ in range(2):
        if kind(pos) == "flip" and "flip_p" not in flips:
            flips["flip_p"] = descs[pos][1]["p"]
        elif kind(pos) == "vflip" and "vflip_p" not in flips:
            flips["vflip_p"] = descs[pos][1]["p"]
        else:
            break
        pos += 1
    spec["flip_p"] = flips.get("flip_p", 0.0)
    if flips.get("vflip_p", 0.0) > 0:   # the key only when there is one (older specs draw as before)
        spec["vflip_p"] = flips["vflip_p"]
    jitter_seen = False

    def take_jitter(where: int) -> None:
        """A ColorJitter at this place of the Compose (one a spec): into the
        spec when it does anything, consumed either way."""
        nonlocal pos, jitter_seen
        if jitter_seen or kind(pos) != "jitter" or not spec["out_h"]:
            return
        j = descs[pos][1]
        if j["p"] > 0 and j["ranges"]:
            spec["jitter"] = dict(p=j["p"], pos=where, **j["ranges"])
        jitter_seen = True
        pos += 1

    take_jitter(_JITTER_AFTER_FLIPS)
    rot = None
    if kind(pos) in ("rotate", "affine") and spec["out_h"]:
        d = descs[pos][1]
        rot = (_rotation_spec(d["obj"], spec["out_channels"]) if kind(pos) == "rotate" else
               _affine_spec(d["obj"], d["v2"], spec["out_channels"]))
        if rot is not None:
            spec.update(rot)
            pos += 1
    take_jitter(_JITTER_BEFORE_POLICY)
    if kind(pos) == "policy" and spec["out_h"]:
        p = descs[pos][1]
        timm = p.get("timm")
        pol = (_timm_ra_spec(p["obj"], spec["out_channels"]) if timm == "RandAugment" else
               _timm_aa_spec(p["obj"], spec["out_channels"]) if timm == "AutoAugment" else
               _timm_augmix_spec(p["obj"], spec["out_channels"]) if timm == "AugMixAugment" else
               _policy_spec(p["obj"], p["v2"], spec["out_h"], spec["out_w"], spec["out_channels"]))
        if pol is not None and rot is not None and tuple(pol.get("fill", rot["rot_fill"])) != rot["rot_fill"]:
            pol = None   # one fill for the augmented render: a policy with another stays in Python
        if pol is not None:
            if pol:
                spec["policy"] = pol
            pos += 1
    if spec.get("policy", {}).get("kind") not in ("augmix", "timm_augmix"):   # after AugMix: Python (FL_JITTER_AFTER_POLICY)
        take_jitter(_JITTER_AFTER_POLICY)
    blur_seen = False

    def take_blur(where: int) -> None:
        """A GaussianBlur here (one a spec), when it goes native
        (_blur_native): into the spec when it does anything, consumed
        either way; else the Python part starts at it, with a note."""
        nonlocal pos, blur_seen
        if blur_seen or kind(pos) != "blur" or not spec["out_h"]:
            return
        blur_seen = True
        d = descs[pos][1]
        blur, reason = _blur_native(d, spec["out_w"], spec["out_h"], spec["out_channels"])
        if blur is None:
            notes.append(reason)
            return
        if d["p"] > 0:
            spec["blur"] = dict(p=d["p"], pos=where, **blur)
        pos += 1

    take_blur(_BLUR_BEFORE_GRAY)
    if kind(pos) == "random_gray":   # on the finished uint8 image, after the policy
        if descs[pos][1]["p"] > 0:
            spec["gray_p"] = descs[pos][1]["p"]
        pos += 1
    take_blur(_BLUR_AFTER_GRAY)
    tensor_stage = False
    if kind(pos) == "to_tensor":
        spec.update(dtype="float32", scale_to_unit=_SCALE_DIV)
        tensor_stage = True
        pos += 1
    elif kind(pos) == "to_image":
        tensor_stage = True
        pos += 1
        if kind(pos) == "to_dtype":
            p = descs[pos][1]
            spec.update(dtype=p["dtype"], scale_to_unit=p["scale"])
            pos += 1
    if kind(pos) == "normalize" and tensor_stage and spec["dtype"] in _FLOAT_DTYPES:
        p = descs[pos][1]
        n = spec["out_channels"]
        if len(p["mean"]) in (1, n) and len(p["std"]) in (1, n):
            spec.update(normalize=True, mean=p["mean"], std=p["std"])
            if spec["dtype"] != "float32":
                notes.append(f"Normalize computed in float32, then rounded to {spec['dtype']}")
            pos += 1
    if kind(pos) == "erase" and tensor_stage:
        p = descs[pos][1]
        er = _erase_spec(p["obj"], p["v2"], spec["out_channels"], spec["dtype"], p.get("timm", False))
        if er is not None:
            if er["p"] > 0:
                spec["erase"] = er
            pos += 1
    if tensor_stage:   # identities (ToPureTensor: the output is a plain tensor already)
        while kind(pos) == "identity":
            pos += 1

    native, remainder = items[:pos], items[pos:]
    if tensor_stage and kind(pos) in _PIL_STAGE_KINDS:
        notes.append(_tensor_first_note(items[pos]))
    rest = _PythonRest(remainder, to_pil=not tensor_stage, layout=layout) if remainder else None
    if not tensor_stage and not remainder:
        notes.append("no to-tensor step: samples come out as uint8 tensors, not PIL images")
    native_desc = " -> ".join(_short(t) for t in native) or "decode only"
    desc = (f"native (C workers): {native_desc} [{spec['dtype']} {layout}]; "
            f"python (per sample): {rest!r}" if rest else
            f"native (C workers): {native_desc} [{spec['dtype']} {layout}]; python: nothing")
    if notes:
        desc += "; note: " + "; ".join(notes)
    return spec, rest, desc


# --------------------------------------------------------------------------
# the native call for custom datasets

_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finalizer (csrc/core/rng.h fl_mix64): a bijective 64-bit mixer."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _global_seed() -> int:
    """A fresh seed from torch's global generator (NumPy's without torch), as
    ImageFolder's __getitem__ draws outside a fastloader loader."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
        import numpy as np
        return int(np.random.randint(0, 2**62, dtype=np.int64))
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


class NativeTransform:
    """Read, decode and transform one image in C, with the GIL released:
    the native pipeline of ``fastloader.ImageFolder``, called from your own
    ``__getitem__``::

        self.load = fastloader.NativeTransform(T.Compose([T.RandomResizedCrop(224), ...]))
        ...
        def __getitem__(self, i):
            return self.load(self.paths[i]), self.labels[i]

    transform: what ImageFolder accepts (fastloader.transforms or a
    torchvision v1/v2 Compose); the prefix that compiles runs in C, fused,
    and an unsupported tail runs in Python on the output, with the GIL
    (``pipeline_description`` says which part runs where).  It must give a
    fixed output size (RandomResizedCrop, Resize((h, w)) or Resize +
    CenterCrop).  layout, dct_scaling, max_pixels: as ImageFolder's.

    Calling it, ``load(src, index=None)``: src is a path (str or
    os.PathLike), encoded bytes (bytes, bytearray, memoryview) or a numpy
    uint8 image (H x W or H x W x C, C 1 or 3).  JPEG, PNG and WebP decode
    natively; other formats (GIF, BMP, ...) through Pillow, as ImageFolder
    does (one warning).  Returns a torch tensor (a numpy array without torch) equal to
    the sample ImageFolder gives.  A bad file raises fastloader.DecodeError
    (OSError for the read) naming the path.

    Random choices (crop, flip):
      * under fastloader.DataLoader, from (seed, epoch, index) as in
        ImageFolder: the same numbers for any num_workers and any thread
        scheduling, and the same crop ImageFolder gives that sample.  The
        loader says which index __getitem__ is loading; under __getitems__
        or an IterableDataset it cannot, so pass ``index=``.  A second call
        for the same sample (two views) gets its own, equally reproducible
        choices;
      * elsewhere (a plain call, torch's DataLoader) from one draw of
        torch's global generator per call, as torchvision's transforms
        draw from it: torch.manual_seed (or torch's per-worker seeding)
        makes them reproducible.  The distributions are torchvision's; the
        numbers are not the ones torchvision would draw.

    Picklable (rebuilt from the transform), so torch's DataLoader can send
    it to spawned worker processes.
    """

    def __init__(self, transform: Any, *, layout: str = "CHW", dct_scaling: bool = False,
                 max_pixels: int = 0) -> None:
        from . import _C

        spec, rest, description = compile_transform(transform, layout=layout)
        self.transform = transform
        self.layout = layout
        self.dct_scaling = bool(dct_scaling)
        self.max_pixels = int(max_pixels)
        self.pipeline_description = description.replace("native (C workers)", "native (C, GIL released)")
        self._spec = spec
        self._rest = rest
        self._call = _C.NativeCall(spec, dct_scaling=self.dct_scaling, max_pixels=self.max_pixels)
        self._pil_warned = False
        self._unkeyed_warned = False
        try:
            import torch
            self._to_output = torch.from_dlpack
        except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
            import numpy as np
            self._to_output = np.from_dlpack

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """The shape of one output of the native part."""
        return self._call.sample_shape

    def __call__(self, src: Any, *, index: int | None = None) -> Any:
        index, epoch, seed = self._key(index)
        buf = self._call.call(src, index, epoch, seed)
        if buf is None:
            buf = self._pillow(src, index, epoch, seed)
        out = self._to_output(buf)
        return out if self._rest is None else self._rest(out)

    def _key(self, index: int | None) -> tuple[int, int, int]:
        """(index, epoch, seed) for this call's random choices (class doc)."""
        ctx = getattr(tls, "epoch_ctx", None)
        if ctx is not None:
            if index is None:
                index = getattr(tls, "index", None)
            if index is not None:
                index = int(index)
                calls = getattr(tls, "calls", None)
                if calls is None:
                    calls = tls.calls = {}
                k = calls.get(index, 0)
                calls[index] = k + 1
                seed = ctx[2]
                # the first call is ImageFolder's sample; later ones (more
                # views of it) get streams of their own
                if k:
                    seed = _mix64((seed ^ (k * 0x9E3779B97F4A7C15)) & _MASK64)
                return index, int(ctx[1]), seed
            if not self._unkeyed_warned:
                self._unkeyed_warned = True
                import warnings
                warnings.warn("fastloader.NativeTransform: called in a fastloader.DataLoader worker where the "
                              "sample index is unknown (__getitems__ or an IterableDataset), so its random "
                              "choices come from torch's generator and depend on thread scheduling; pass "
                              "index= for ones keyed by (seed, epoch, index)", UserWarning, stacklevel=3)
        return (0 if index is None else int(index)), 0, _global_seed()

    def _pillow(self, src: Any, index: int, epoch: int, seed: int) -> Any:
        """What ImageFolder does for a file that is not a JPEG: Pillow
        decodes, the native part transforms the pixels."""
        import io
        import os
        import warnings

        import numpy as np

        from . import _C

        is_path = isinstance(src, (str, os.PathLike))
        name = os.fspath(src) if is_path else "<bytes>"
        try:
            from PIL import Image
        except ImportError:
            raise _C.DecodeError(f"{name}: not a JPEG file, and Pillow is not installed to decode it") from None
        try:
            with Image.open(src if is_path else io.BytesIO(memoryview(src).tobytes())) as im:
                arr = np.asarray(im.convert("L" if self._spec.get("out_channels", 3) == 1 else "RGB"))
        except Exception as e:
            raise _C.DecodeError(f"{name}: {e}") from e
        if not self._pil_warned:
            self._pil_warned = True
            warnings.warn(f"fastloader: {name} is not a JPEG, PNG or still WebP; decoding it (and any other such images) "
                          "through Pillow, which is slower than the native path", UserWarning, stacklevel=3)
        return self._call.call(np.ascontiguousarray(arr), index, epoch, seed)

    def __reduce__(self):
        return (_rebuild_native_transform, (self.transform, self.layout, self.dct_scaling, self.max_pixels))

    def __repr__(self) -> str:
        return f"NativeTransform({self.pipeline_description})"


def _rebuild_native_transform(transform, layout, dct_scaling, max_pixels):
    return NativeTransform(transform, layout=layout, dct_scaling=dct_scaling, max_pixels=max_pixels)
