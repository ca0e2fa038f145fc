"""Real training recipes: torch DataLoader + torchvision ImageFolder vs fastloader, same transform objects.

Each recipe's transform is built by the libraries' own code -- torchvision's
transforms (v1 and v2), timm's ``create_transform`` -- in the measured
process, and the SAME object is handed, unchanged, to both sides:

  torch       torchvision.datasets.ImageFolder(root, transform=t)
              + torch.utils.data.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True[, collate_fn=c])
  fastloader  fastloader.ImageFolder(root, transform=t)
              + fastloader.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True[, batch_transform=m])

Recipes (``--list`` prints them):

  tv-*     ``PresetTrain`` below: torchvision's reference training preset
           (references/classification/presets.py ``ClassificationPresetTrain``
           in pytorch/vision), rewritten here from its public definition, not
           vendored.  Like the original, the object holds only
           ``self.transforms = T.Compose([...])`` and ``__call__`` returns
           ``self.transforms(img)``; the object itself is passed as
           ``transform=``, as torchvision's train.py does.  RandomResizedCrop
           (bilinear, antialias) + RandomHorizontalFlip(0.5) [+ policy] +
           PILToTensor + ConvertImageDtype(float) / ToDtype(float, scale=True)
           + Normalize [+ RandomErasing] [+ ToPureTensor with v2]; policies:
           classic (none), ta_wide + random_erase_prob=0.1 (the recipe of
           torchvision's newest ResNet50 weights, IMAGENET1K_V2, here at crop
           224 rather than its 176), ra (RandAugment m9), augmix (severity 3),
           aa-imagenet (AutoAugment IMAGENET); each with torchvision.transforms
           (v1) and torchvision.transforms.v2 (use_v2=True).
  timm-*   timm.data.create_transform(224, is_training=True,
           auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel",
           interpolation="bicubic"), the same with interpolation="random", the
           same with auto_augment="original" (timm's AutoAugment), and
           create_transform(224, is_training=False).  On torch's side timm's
           posterize keeps 0 bits as black, as before Pillow 13
           (timm_posterize_zero_bits_as_before_pillow13: Pillow 13 refuses
           0 bits, which stopped those runs at random).
  tv-aerial-v1  a torchvision v1 Compose of RandomResizedCrop + both flips +
           RandomRotation(15) + RandomGrayscale(0.1) + ToTensor + Normalize,
           the kind of recipe aerial and medical images train with.
  user-*   a torchvision v1 Compose with the user's own transform after the
           native prefix: RandomResizedCrop + RandomHorizontalFlip, then
           ``RandomPILBlur`` below (a user class: a PIL Gaussian blur of
           random radius half the time, as SimCLR/BYOL recipes write it) +
           ToTensor + Normalize ("user-pil-blur"), or ToTensor, then
           ``AddGaussianNoise`` (a user class: a tensor op drawing from
           torch's generator) + Normalize ("user-tensor-noise").  On
           fastloader the prefix runs in C and the rest in Python, in worker
           processes by default (worker_mode "auto"; --worker-mode sets it).
  *+mixcut a v2 preset plus train.py's batch stage:
           collate_fn(batch) = RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])(*default_collate(batch))
           -- torch gets it as collate_fn (train.py's spelling); fastloader
           gets the same RandomChoice object as batch_transform= (its
           documented spelling: a custom collate_fn would take it off the
           native batch path), applied to each default-collated batch.
  *+mixup  the timm-train-bicubic transform plus timm's Mixup with its
           train.py defaults (mixup_alpha 0.8, cutmix_alpha 1.0, switch_prob
           0.5, label_smoothing 0.1, mode 'batch'): torch gets it in the
           collate_fn as above (timm's train.py calls it in its loop, on
           the main process); fastloader gets the same Mixup object as
           batch_transform=.

Protocol (the shared harness, fastloader/tools/harness.py, as bench_images.py):
every (recipe, loader, num_workers) runs in a fresh process; the two loaders
of one (recipe, num_workers) run back to back, their order alternating per
group and per round; torch.set_num_threads(--torch-threads, default 1) in
every measured process.  The sample folder is fastloader.tools.sample's
(``--n`` real JPEG photographs, generated once and cached where
bench_images.py caches it).  images/s counts the batches after the first (the
first one pays the folder scan and the worker start); at most --max-batches
batches of 64 per run.

Reported per recipe: each loader's median images/s at each num_workers and at
its best num_workers, fastloader/torch at the same num_workers (median of the
per-round pairs) and best against best (ratio of the two best medians), and
fastloader's ``pipeline_description`` (which part of the transform runs
natively in the C workers and which in Python per sample), its loader path
(``loader.stats()["path"]``: "native" = C workers build whole batches,
"python" = __getitem__ + collate_fn in Python threads), where its workers spent
their time, and the warnings it gave.  A configuration that fails (fastloader
refusing a transform, a crash, a timeout) is shown in the tables with its
message; the run goes on, and the "Errors" section has the details.

    python benchmarks/bench_recipes.py [--quick] [--n 2000] [--workers 0,1,2,4]
        [--recipes PATTERN,...] [--rounds 2] [--max-batches 16]
        [--only both|torch|fastloader] [--worker-mode auto|thread|process] [--out FILE] [--list]

--quick: n=256 images, 3 batches per run, workers 0,2, 1 round (checks that
everything runs; the numbers mean little).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ----------------------------------------------------------------------------
# the recipes (module level: torch's worker processes use these objects)


def _tv_module(use_v2):
    if use_v2:
        import torchvision.transforms.v2 as T

        return T
    import torchvision.transforms as T

    return T


class PresetTrain:
    """torchvision's reference training preset (ClassificationPresetTrain in
    pytorch/vision references/classification/presets.py), from its public
    definition.  Its only state is ``self.transforms`` (a Compose), as the
    original's."""

    def __init__(self, *, crop_size, mean=MEAN, std=STD, interpolation=None, hflip_prob=0.5,
                 auto_augment_policy=None, ra_magnitude=9, augmix_severity=3, random_erase_prob=0.0,
                 backend="pil", use_v2=False):
        import torch
        from torchvision.transforms import InterpolationMode

        if interpolation is None:
            interpolation = InterpolationMode.BILINEAR
        T = _tv_module(use_v2)
        trans = []
        backend = backend.lower()
        if backend == "tv_tensor":
            trans.append(T.ToImage())
        elif backend == "tensor":
            trans.append(T.PILToTensor())
        elif backend != "pil":
            raise ValueError(f"backend can be 'tv_tensor', 'tensor' or 'pil', but got {backend}")
        trans.append(T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True))
        if hflip_prob > 0:
            trans.append(T.RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy is not None:
            if auto_augment_policy == "ra":
                trans.append(T.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
            elif auto_augment_policy == "ta_wide":
                trans.append(T.TrivialAugmentWide(interpolation=interpolation))
            elif auto_augment_policy == "augmix":
                trans.append(T.AugMix(interpolation=interpolation, severity=augmix_severity))
            else:
                trans.append(T.AutoAugment(policy=T.AutoAugmentPolicy(auto_augment_policy),
                                           interpolation=interpolation))
        if backend == "pil":
            trans.append(T.PILToTensor())
        trans += [T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                  T.Normalize(mean=mean, std=std)]
        if random_erase_prob > 0:
            trans.append(T.RandomErasing(p=random_erase_prob))
        if use_v2:
            trans.append(T.ToPureTensor())
        self.transforms = T.Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


class MixUpCutMixCollate:
    """torchvision train.py's batch stage: default_collate, then one of
    MixUp / CutMix (v2) on the batch (labels become soft, [B, num_classes])."""

    def __init__(self, num_classes, mixup_alpha=0.2, cutmix_alpha=1.0):
        from torchvision.transforms import v2

        self.mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=mixup_alpha, num_classes=num_classes),
                                             v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)])

    def __call__(self, batch):
        from torch.utils.data import default_collate

        return self.mixup_cutmix(*default_collate(batch))


class TimmMixupCollate(MixUpCutMixCollate):
    """timm's Mixup with its train.py defaults on each default-collated batch
    (the same ``mixup_cutmix`` attribute, so both sides are built alike)."""

    def __init__(self, num_classes):
        from timm.data import Mixup

        self.mixup_cutmix = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
                                  label_smoothing=0.1, num_classes=num_classes)


class RandomPILBlur:
    """A user's own PIL transform, as SimCLR / BYOL recipes write it: with
    probability p, a Gaussian blur of radius uniform in `radius` (drawn from
    torch's generator)."""

    def __init__(self, p=0.5, radius=(0.1, 2.0)):
        self.p, self.radius = p, radius

    def __call__(self, img):
        import torch
        from PIL import ImageFilter

        if torch.rand(1).item() >= self.p:
            return img
        lo, hi = self.radius
        return img.filter(ImageFilter.GaussianBlur(radius=lo + (hi - lo) * torch.rand(1).item()))

    def __repr__(self):
        return f"RandomPILBlur(p={self.p}, radius={self.radius})"


class AddGaussianNoise:
    """A user's own tensor transform: x + N(0, std^2) noise from torch's generator."""

    def __init__(self, std=0.05):
        self.std = std

    def __call__(self, x):
        import torch

        return x + self.std * torch.randn_like(x)

    def __repr__(self):
        return f"AddGaussianNoise(std={self.std})"


_TIMM_TRAIN = dict(is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel")

# name -> (what it is, how it is built: ("tv", PresetTrain kwargs) | ("timm", create_transform kwargs),
#          batch stage: False, True (torchvision MixUp/CutMix) or "timm" (timm Mixup))
RECIPES = {}
for _pol, _kw, _what in [("classic", {}, "RRC + flip"),
                         ("ta_wide-re0.1", dict(auto_augment_policy="ta_wide", random_erase_prob=0.1),
                          "RRC + flip + TrivialAugmentWide + RandomErasing(0.1)"),
                         ("ra-m9", dict(auto_augment_policy="ra", ra_magnitude=9), "RRC + flip + RandAugment(m9)"),
                         ("augmix", dict(auto_augment_policy="augmix"), "RRC + flip + AugMix(severity 3)"),
                         ("aa-imagenet", dict(auto_augment_policy="imagenet"), "RRC + flip + AutoAugment(IMAGENET)")]:
    for _v in (1, 2):
        RECIPES[f"tv-{_pol}-v{_v}"] = (f"torchvision preset, {_what}, transforms {'v2' if _v == 2 else 'v1'}",
                                       ("tv", dict(_kw, use_v2=_v == 2)), False)
RECIPES["timm-train-bicubic"] = ("timm create_transform(is_training, rand-m9-mstd0.5-inc1, re 0.25 pixel, bicubic)",
                                 ("timm", dict(_TIMM_TRAIN, interpolation="bicubic")), False)
RECIPES["timm-train-random"] = ("timm create_transform(is_training, rand-m9-mstd0.5-inc1, re 0.25 pixel, "
                                "interpolation random)", ("timm", dict(_TIMM_TRAIN, interpolation="random")), False)
RECIPES["timm-train-aa-original"] = ("timm create_transform(is_training, AutoAugment 'original', re 0.25 pixel, "
                                     "bicubic)", ("timm", dict(_TIMM_TRAIN, auto_augment="original",
                                                               interpolation="bicubic")), False)
RECIPES["timm-train-augmix"] = ("timm create_transform(is_training, augmix-m5-w4-d2, re 0.25 pixel, bilinear)",
                                ("timm", dict(_TIMM_TRAIN, auto_augment="augmix-m5-w4-d2",
                                              interpolation="bilinear")), False)
RECIPES["timm-train-3a"] = ("timm create_transform(is_training, 3a (DeiT III): Solarize / Desaturate / "
                            "GaussianBlurRand, then ColorJitter(0.4))", ("timm", dict(is_training=True,
                                                                                  auto_augment="3a")), False)
RECIPES["timm-train-bicubic+mixup"] = ("timm create_transform(is_training, rand-m9-mstd0.5-inc1, re 0.25 pixel, "
                                       "bicubic) + timm Mixup(0.8 / 1.0, smoothing 0.1)",
                                       ("timm", dict(_TIMM_TRAIN, interpolation="bicubic")), "timm")
RECIPES["timm-eval"] = ("timm create_transform(is_training=False)", ("timm", dict(is_training=False)), False)
RECIPES["timm-train-default"] = ("timm create_transform(is_training=True), its defaults: RRC + flip + "
                                 "ColorJitter(0.4, 0.4, 0.4)", ("timm", dict(is_training=True)), False)
RECIPES["tv-colour-v2"] = ("torchvision v2 Compose: RRC + flip + RandomApply(ColorJitter(0.4, 0.4, 0.4, 0.1), "
                           "p=0.8) + RandomGrayscale(0.2) + ToImage + ToDtype + Normalize (SimCLR's colour "
                           "distortion)", ("colour", {}), False)
RECIPES["tv-simclr-v1"] = ("torchvision v1 Compose: RRC + flip + RandomApply(ColorJitter(0.4, 0.4, 0.4, 0.1), p=0.8) + "
                           "RandomGrayscale(0.2) + GaussianBlur(23, (0.1, 2.0)) + ToTensor + Normalize (SimCLR's "
                           "augmentation)", ("simclr", {}), False)
RECIPES["tv-aerial-v1"] = ("torchvision v1 Compose: RRC + hflip + vflip + RandomRotation(15) + RandomGrayscale(0.1) "
                           "+ ToTensor + Normalize (an aerial / medical style recipe)", ("aerial", {}), False)
RECIPES["user-pil-blur"] = ("torchvision v1 Compose: RRC + hflip + the user's RandomPILBlur(0.5) + ToTensor + "
                             "Normalize", ("user", dict(kind="pil")), False)
RECIPES["user-tensor-noise"] = ("torchvision v1 Compose: RRC + hflip + ToTensor + the user's AddGaussianNoise(0.05) + "
                                "Normalize", ("user", dict(kind="tensor")), False)
# train.py's batch stage on each v2 preset (with use_v2=False train.py uses the MixUp/CutMix classes of its own
# references/classification/transforms.py, not a library's, so only the v2 presets get it here)
for _pol in ("classic", "ta_wide-re0.1", "ra-m9", "augmix", "aa-imagenet"):
    _what, _build, _ = RECIPES[f"tv-{_pol}-v2"]
    RECIPES[f"tv-{_pol}-v2+mixcut"] = (_what + " + MixUp(0.2)/CutMix(1.0) in collate_fn (train.py)", _build, True)


def timm_posterize_zero_bits_as_before_pillow13():
    """Make timm's posterize keep 0 bits as Pillow < 13 did (a black image)
    instead of raising, by replacing it in timm's NAME_TO_OP before the
    transform is built.  timm's PosterizeIncreasing asks for 0 bits at
    magnitude 10, which m9 + mstd0.5 reaches; Pillow 13's ImageOps.posterize
    refuses 0, so without this torch's side of the timm-train recipes stops
    at random (HINTS).  Only the torch side gets it; fastloader gets timm's
    unchanged objects, and its native Posterize gives black at 0 bits (the
    same bytes).  The shim adds one comparison per Posterize call."""
    import timm.data.auto_augment as aa
    from PIL import Image

    orig = aa.posterize
    if getattr(orig, "_bench_shim", False):
        return

    def posterize(img, bits_to_keep, **kw):
        if bits_to_keep <= 0:
            return Image.new(img.mode, img.size, 0)
        return orig(img, bits_to_keep, **kw)

    posterize._bench_shim = True
    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        if aa.NAME_TO_OP.get(name) is orig:
            aa.NAME_TO_OP[name] = posterize


def make_transform(recipe, crop_size, impl=None):
    """The recipe's transform object, built by the libraries' own code (for
    impl "torch", timm's posterize first made to accept 0 bits:
    timm_posterize_zero_bits_as_before_pillow13)."""
    kind, kw = RECIPES[recipe][1]
    if kind == "tv":
        return PresetTrain(crop_size=crop_size, **kw)
    if kind == "aerial":
        from torchvision import transforms as T

        return T.Compose([T.RandomResizedCrop(crop_size), T.RandomHorizontalFlip(), T.RandomVerticalFlip(),
                          T.RandomRotation(15), T.RandomGrayscale(0.1), T.ToTensor(),
                          T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    if kind == "colour":
        import torch
        from torchvision.transforms import v2

        return v2.Compose([v2.RandomResizedCrop(crop_size), v2.RandomHorizontalFlip(),
                           v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), v2.RandomGrayscale(0.2),
                           v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                           v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    if kind == "simclr":
        from torchvision import transforms as T

        return T.Compose([T.RandomResizedCrop(crop_size), T.RandomHorizontalFlip(),
                          T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(0.2),
                          T.GaussianBlur(23, (0.1, 2.0)), T.ToTensor(), T.Normalize(MEAN, STD)])
    if kind == "user":
        from torchvision import transforms as T

        if kw["kind"] == "pil":
            mid = [RandomPILBlur(0.5), T.ToTensor()]
        else:
            mid = [T.ToTensor(), AddGaussianNoise(0.05)]
        return T.Compose([T.RandomResizedCrop(crop_size), T.RandomHorizontalFlip(), *mid, T.Normalize(MEAN, STD)])
    import timm.data

    if impl == "torch":
        timm_posterize_zero_bits_as_before_pillow13()
    return timm.data.create_transform(crop_size, **kw)


# ----------------------------------------------------------------------------
# child


def child(cfg):
    """One measured configuration (runs in a fresh process, see C.run_child).

    A failure comes back as ``failed`` (not ``error``, which the harness would
    replace by its own dict) so that what is known -- fastloader's pipeline
    description, its warnings -- travels with the message; the parent turns
    it into an error."""
    import traceback

    import torch

    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg["torch_threads"])
    impl = cfg["impl"]
    out = {}
    holder = {}
    caught = []
    try:
        # imports and the transform outside the timed region
        transform = make_transform(cfg["recipe"], cfg["crop_size"], impl)
        if impl == "torch":
            import torch.utils.data
            import torchvision.datasets

            DS, DL = torchvision.datasets.ImageFolder, torch.utils.data.DataLoader
        else:
            fl = C.import_fastloader("DataLoader", "ImageFolder")
            DS, DL = fl.ImageFolder, fl.DataLoader
        mixcut = RECIPES[cfg["recipe"]][2]

        def make():
            ds = holder["ds"] = DS(cfg["root"], transform=transform)
            kw = {}
            if mixcut:
                collate = (TimmMixupCollate if mixcut == "timm" else MixUpCutMixCollate)(len(ds.classes))
                kw = (dict(batch_transform=collate.mixup_cutmix) if impl == "fastloader"
                      else dict(collate_fn=collate))
            if impl == "fastloader" and cfg.get("worker_mode"):
                kw["worker_mode"] = cfg["worker_mode"]
            dl = holder["dl"] = DL(ds, batch_size=BATCH_SIZE, num_workers=cfg["workers"], shuffle=True, **kw)
            return dl

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # each distinct warning once
            r = C.H.time_loader(make, epochs=1, max_batches=cfg.get("max_batches"), hold_batch=True)
        out.update(r)
    except BaseException as e:
        out["failed"] = f"{type(e).__name__}: {e}"
        out["failed_tb"] = "\n".join(traceback.format_exc().strip().splitlines()[-15:])
    ds, dl = holder.get("ds"), holder.get("dl")
    if impl == "fastloader":
        out["pipeline_description"] = getattr(ds, "pipeline_description", None)
        try:
            st = dl.stats() if dl is not None else {}
        except Exception as e:  # noqa: BLE001 - report, do not fail the run for it
            st = {"stats_error": f"{type(e).__name__}: {e}"}
        out["fl_path"] = st.get("path")
        out["fl_stages_s"] = st.get("stages_s")
        out["fl_busy"] = st.get("worker_busy_fraction")
        out["fl_worker_mode"] = st.get("worker_mode")
    out["warnings"] = C.distinct_warnings(caught, 6)
    out["torch_threads"] = torch.get_num_threads()
    out.update(cfg)
    return out


# ----------------------------------------------------------------------------
# parent: formatting


_ROOT = None  # the sample folder, left out of the messages in the tables


def _last_line(msg, limit=None):
    """One line of an error message: the last line where it carries a
    traceback (torch's "Caught ValueError in DataLoader worker process 0.
    Original Traceback ..." ends with the cause), else the first."""
    msg = (msg or "").strip()
    if _ROOT:
        msg = msg.replace(_ROOT.rstrip(os.sep) + os.sep, "")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    if not lines:
        return "error"
    s = lines[-1] if "Traceback" in msg else lines[0]
    if limit and len(s) > limit:
        s = s[:limit - 3] + "..."
    return s


def _kind(msg):
    """What makes two messages the same failure: without paths and numbers."""
    s = re.sub(r"\S*/\S*", "<path>", _last_line(msg))
    return re.sub(r"\d+(\.\d+)?", "N", s)


# known failures that are not the loader's, and what they are
HINTS = {
    "bits must be between or equal to 1 and 8":
        "timm's increasing Posterize (the '-inc1' of rand-m9-mstd0.5-inc1) keeps 4 - int(level * 4 / 10) bits, "
        "0 at magnitude 10 (m9 + mstd0.5 noise reaches it); Pillow >= 13's ImageOps.posterize refuses 0 bits. A "
        "timm/Pillow incompatibility, random per sample: runs with more samples fail more often",
}


def _hint(msg):
    return next((h for k, h in HINTS.items() if k in (msg or "")), None)


def _names(chain):
    """'A(x=1, ...) -> B(...)' -> 'A > B' (the transforms' class names)."""
    parts = []
    for p in chain.split(" -> "):
        p = p.strip()
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", p)
        parts.append(m.group(0) if m else p)
    return " > ".join(parts)


def split_of(desc):
    """fastloader's pipeline_description, shortened to 'native: ... | python: ...'."""
    if not desc:
        return None
    m = re.match(r"native \([^)]*\): (.*?) \[([^\]]*)\]; python(?: \(per sample\))?: (.*?)(?:; note: (.*))?$",
                 desc, re.S)
    if not m:
        return " ".join(desc.split())[:200]
    native, dtype, python, note = m.groups()
    py = "nothing" if python.strip() == "nothing" else _names(python)
    s = f"native [{dtype}]: {_names(native)} | python: {py}"
    if note:
        s += f" (note: {note.strip()})"
    return s


def _stage_split(r):
    """Where fastloader's workers spent their time, from loader.stats()."""
    st = r.get("fl_stages_s") or {}
    if not st:
        return None
    if r.get("fl_path") == "native":
        total = sum(v for v in st.values() if isinstance(v, (int, float)))
        if total <= 0:
            return None
        return ", ".join(f"{k[:-2]} {100 * v / total:.0f}%" for k, v in st.items() if isinstance(v, (int, float)))
    return ", ".join(f"{k} {v:.2f}s" for k, v in st.items() if isinstance(v, (int, float)) and v >= 0.005)


# ----------------------------------------------------------------------------
# parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--n", type=int, default=None, help="images in the sample folder (default 2000; --quick 256)")
    p.add_argument("--root", default=None, help="use/create the sample folder here (default: "
                   "fastloader.tools.sample.default_sample_dir(n), as bench_images.py)")
    p.add_argument("--no-generate", action="store_true", help="use --root as is, do not create a sample there")
    p.add_argument("--workers", default=None, help="comma-separated num_workers list, both loaders (default 0,1,2,4)")
    p.add_argument("--recipes", default=None,
                   help="comma-separated recipe names or fnmatch patterns (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="print the recipes and exit")
    p.add_argument("--crop-size", type=int, default=224, help="output size of every recipe (default 224)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds; medians are reported (default 2)")
    p.add_argument("--max-batches", type=int, default=None, help="at most this many batches per run (default 16)")
    p.add_argument("--quick", action="store_true", help="n=256, 3 batches per run, workers 0,2, 1 round")
    p.add_argument("--only", choices=["both", "fastloader", "torch"], default="both",
                   help="run only one side (torch needs no fastloader build)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run before it is killed "
                   "(default 600; --quick 300)")
    p.add_argument("--mem-interval", type=float, default=0.5,
                   help="seconds between memory samples of the worker processes (0 disables)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads() in every measured process, both loaders (default 1, as in "
                   "torch's worker processes; 0 keeps torch's default)")
    p.add_argument("--worker-mode", choices=["auto", "thread", "process"], default=None,
                   help="fastloader's worker_mode (default: its own default, 'auto')")
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)

    if a.list:
        for name, (what, _, _) in RECIPES.items():
            print(f"{name:28s} {what}")
        return 0
    if a.recipes:
        pats = [s.strip() for s in a.recipes.split(",") if s.strip()]
        recipes = [r for r in RECIPES if any(fnmatch.fnmatchcase(r, pt) or r == pt for pt in pats)]
        if not recipes:
            p.error(f"--recipes {a.recipes!r} matches none of: {', '.join(RECIPES)}")
    else:
        recipes = list(RECIPES)
    n = a.n or (256 if a.quick else 2000)
    workers = [int(x) for x in (a.workers or ("0,2" if a.quick else "0,1,2,4")).split(",")]
    max_batches = a.max_batches or (3 if a.quick else 16)
    rounds = a.rounds or (1 if a.quick else 2)
    timeout = a.timeout or (300.0 if a.quick else 600.0)
    impls = ["fastloader", "torch"] if a.only == "both" else [a.only]

    if "fastloader" in impls:
        try:
            C.import_fastloader("DataLoader", "ImageFolder")
        except C.FastloaderMissing as e:
            sys.exit(f"bench_recipes: {e}")

    if a.no_generate:
        if not a.root:
            p.error("--no-generate needs --root")
        root, stats = os.path.abspath(a.root), None
    else:
        sample = C.load_sample_module()
        root = sample.ensure_sample(n, a.root)
        stats = sample.read_stats(root)
    nfiles = sum(1 for d, _, fs in os.walk(root) for f in fs if f.lower().endswith((".jpg", ".jpeg")))
    global _ROOT
    _ROOT = root

    script = os.path.abspath(__file__)
    groups = []
    for rc in recipes:
        for w in workers:
            groups.append(((rc, w), [(impl, dict(impl=impl, recipe=rc, workers=w, root=root, crop_size=a.crop_size,
                                                 max_batches=max_batches, torch_threads=a.torch_threads,
                                                 worker_mode=a.worker_mode))
                                     for impl in impls]))

    def runner(cfg):
        res = C.run_child(script, cfg, mem_interval=a.mem_interval, timeout=timeout)
        if "failed" in res:
            res["error"] = res.pop("failed")
            res["stderr"] = res.pop("failed_tb", "")
        return res

    t0 = time.perf_counter()
    res = C.run_interleaved(groups, rounds, runner)
    elapsed = time.perf_counter() - t0

    # ---- report
    rep = C.Report("Training recipes: torch DataLoader + torchvision ImageFolder vs fastloader, same transforms")
    rep.add("\n".join(C.environment_lines()))
    try:
        import timm

        rep.add(f"- timm {timm.__version__}")
    except Exception:  # noqa: BLE001
        pass
    if stats:
        rep.add(f"- data: {nfiles} JPEGs in {root} (fastloader.tools.sample, seed {stats.get('seed')}): mean "
                f"{stats['mean_width']:.0f} x {stats['mean_height']:.0f}, mean {stats['mean_bytes'] / 1024:.1f} KiB, "
                f"{stats['progressive']} progressive, {stats['grayscale']} grayscale, {stats['classes']} classes")
    else:
        rep.add(f"- data: {nfiles} JPEGs in {root}")
    rep.add(f"- batch_size {BATCH_SIZE}, shuffle=True, crop {a.crop_size}, at most {max_batches} batches per run; "
            f"{rounds} interleaved round(s), each configuration in a fresh process; "
            + (f"torch.set_num_threads({a.torch_threads}) in the measured process"
               if a.torch_threads else "torch's default intra-op threads"))
    rep.add("- img/s: median over rounds, after the first batch; per-nw ratio: median of the per-round "
            "fastloader/torch pairs at that num_workers; best/best: fastloader's best median over torch's best "
            "median (each at its own best num_workers); >1 means fastloader is faster")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")

    def rs(rc, w, impl):
        return res.get(((rc, w), impl), [])

    def med(rc, w, impl):
        return C.median_of(rs(rc, w, impl), "rate")

    def first_error(rc, impl, w=None):
        ws = workers if w is None else [w]
        for ww in ws:
            for r in rs(rc, ww, impl):
                if "error" in r:
                    return r["error"]
        return None

    def best(rc, impl):
        cands = [(med(rc, w, impl), w) for w in workers]
        cands = [(v, w) for v, w in cands if v is not None]
        return max(cands) if cands else (None, None)

    def best_cell(rc, impl):
        v, w = best(rc, impl)
        if v is not None:
            bad = [ww for ww in workers if med(rc, ww, impl) is None]
            return f"{v:.0f} ({w})" + (f"; ERROR at nw {','.join(map(str, bad))}" if bad else "")
        err = first_error(rc, impl)
        return f"ERROR: {_last_line(err, 120)}" if err else "-"

    def fl_result(rc):
        """A fastloader result that has a pipeline description (a successful one first)."""
        cands = [r for w in workers for r in rs(rc, w, "fastloader")]
        cands.sort(key=lambda r: "error" in r)
        for r in cands:
            if r.get("pipeline_description"):
                return r
        return cands[0] if cands else None

    def fl_split_cell(rc):
        r = fl_result(rc)
        if r is None:
            return "-"
        s = split_of(r.get("pipeline_description")) or "(no description: the dataset was not built)"
        if r.get("fl_path") and r.get("fl_path") != "native":
            s += f"; loader path: {r['fl_path']}"
        return s

    both = len(impls) == 2
    rep.add("## Summary")
    rep.add("")
    headers = ["recipe"]
    if "torch" in impls:
        headers.append("torch best img/s (nw)")
    if "fastloader" in impls:
        headers.append("fastloader best img/s (nw)")
    if both:
        headers += ["best/best", "fastloader/torch at nw"]
    if "fastloader" in impls:
        headers.append("fastloader native / python split")
    rows = []
    for rc in recipes:
        row = [rc]
        for impl in ("torch", "fastloader"):
            if impl in impls:
                row.append(best_cell(rc, impl))
        if both:
            (fb, _), (tb, _) = best(rc, "fastloader"), best(rc, "torch")
            row.append(C.fmt_ratio(fb / tb if fb and tb else None))
            per = []
            for w in workers:
                rt = C.paired_ratio(rs(rc, w, "fastloader"), rs(rc, w, "torch"), "rate")
                per.append(f"{w}: " + (C.fmt_ratio(rt) if rt is not None else "ERR"))
            row.append(", ".join(per))
        if "fastloader" in impls:
            row.append(fl_split_cell(rc))
        rows.append(row)
    rep.add(C.markdown_table(headers, rows, align=["l"] + ["r"] * (len(headers) - 2) + ["l"]
                             if "fastloader" in impls else None))
    rep.add("")

    rep.add("## img/s at each num_workers" + (" (torch / fastloader, fastloader/torch)" if both else ""))
    rep.add("")
    rows = []
    for rc in recipes:
        row = [rc]
        for w in workers:
            cells = []
            for impl in ("torch", "fastloader"):
                if impl not in impls:
                    continue
                v = med(rc, w, impl)
                if v is None:
                    err = first_error(rc, impl, w)
                    cells.append("ERR" if err else "-")
                else:
                    lo, hi = C.spread(rs(rc, w, impl), "rate")
                    cells.append(f"{v:.0f}" + (f" ({lo:.0f}-{hi:.0f})" if rounds > 1 and lo is not None else ""))
            cell = " / ".join(cells)
            if both:
                rt = C.paired_ratio(rs(rc, w, "fastloader"), rs(rc, w, "torch"), "rate")
                cell += f", {C.fmt_ratio(rt)}"
            row.append(cell)
        rows.append(row)
    rep.add(C.markdown_table(["recipe"] + [f"nw={w}" for w in workers], rows))
    rep.add("")

    if "fastloader" in impls:
        rep.add("## fastloader, per recipe")
        rep.add("")
        for rc in recipes:
            r = fl_result(rc)
            rep.add(f"- **{rc}** -- {RECIPES[rc][0]}")
            if r is None:
                continue
            desc = r.get("pipeline_description")
            rep.add(f"  - pipeline_description: `{' '.join(desc.split()) if desc else '(dataset not built)'}`")
            paths = sorted({x.get("fl_path") for w in workers for x in rs(rc, w, "fastloader") if x.get("fl_path")})
            if paths:
                rep.add(f"  - loader path: {', '.join(paths)}")
            modes = sorted({x.get("fl_worker_mode") for w in workers for x in rs(rc, w, "fastloader")
                            if x.get("fl_worker_mode")})
            if modes:
                rep.add(f"  - workers: {', '.join(modes)} (stats()['worker_mode'])")
            for w in workers:
                ok = [x for x in rs(rc, w, "fastloader") if "error" not in x]
                if ok:
                    sp = _stage_split(ok[0])
                    if sp:
                        rep.add(f"  - worker time at nw={w}: {sp}")
            errs, kinds = [], set()
            for w in workers:
                e = first_error(rc, "fastloader", w)
                if e and _kind(e) not in kinds:
                    kinds.add(_kind(e))
                    h = _hint(e)
                    errs.append(f"(nw={w}) `{_last_line(e, 300)}`" + (f" -- {h}" if h else ""))
            for e in errs:
                rep.add(f"  - error {e}")
            warns, kinds = [], set()
            for w in workers:
                for x in rs(rc, w, "fastloader"):
                    for s in x.get("warnings") or ():
                        if _kind(s) not in kinds:  # the same warning with other measured numbers: once
                            kinds.add(_kind(s))
                            warns.append(f"(nw={w}) {s}")
            for s in warns[:4]:
                rep.add(f"  - warning: {s if len(s) <= 600 else s[:597] + '...'}")
        rep.add("")
    if "torch" in impls:
        terrs = []
        for rc in recipes:
            e = first_error(rc, "torch")
            if e:
                h = _hint(e)
                terrs.append(f"- {rc}: `{_last_line(e, 300)}`" + (f" -- {h}" if h else ""))
        if terrs:
            rep.add("## torch errors")
            rep.add("")
            rep.add("\n".join(terrs))
            rep.add("")

    # the Errors section (Report.finish): each kind of failure once (the
    # tables and the section above say where), with its stderr tail
    dedup, seen = {}, set()
    for key, v in res.items():
        for r in v:
            if "error" in r:
                sig = (key[1], _kind(r["error"]))
                if sig not in seen:
                    seen.add(sig)
                    dedup.setdefault(key, []).append(r)
    return rep.finish(dedup, a.out)


if __name__ == "__main__":
    sys.exit(main())
