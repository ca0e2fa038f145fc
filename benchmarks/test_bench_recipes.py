"""Real training recipes (bench_recipes.py's child): the transform built by the
libraries' own code -- torchvision's reference preset (``PresetTrain``, v1 and
v2 transforms, the classic/TrivialAugmentWide/RandAugment/AugMix/AutoAugment
policies), timm's ``create_transform``, MixUp/CutMix in a collate_fn -- and the
same object handed to torchvision.datasets.ImageFolder + torch's DataLoader and
to fastloader.ImageFolder + fastloader.DataLoader.  16 batches of 64 per run
(--bench-max-batches), torch.set_num_threads(1).

A recipe that fastloader refuses to run natively ("fastloader cannot run ...
natively") is reported as xfail with fastloader's message, and so is timm's
Posterize failing on Pillow >= 13 (a timm/Pillow incompatibility, random per
sample: bench_recipes.HINTS; torch's side now runs with timm's posterize
keeping 0 bits as black, bench_recipes.timm_posterize_zero_bits_as_before_pillow13).
Anything else that fails fails the test.
"""
import os

import pytest

import _suite as S

if not os.path.exists(S.script("bench_recipes.py")):
    pytest.skip("benchmarks/bench_recipes.py is not in this checkout", allow_module_level=True)

import bench_recipes as R  # noqa: E402

BATCH = R.BATCH_SIZE
CROP = 224


def _recipe_params():
    out = []
    for name, (_, (kind, _), _) in R.RECIPES.items():
        need = S.missing_module("timm") if kind == "timm" else None
        out.append(pytest.param(name, id=name, marks=pytest.mark.skipif(need is not None, reason=f"{need} is not "
                                                                                                 "installed")))
    return out


def _adapt(r):
    """bench_recipes.child reports a failure as ``failed`` (with what it knew): the harness's ``error``."""
    if "failed" in r:
        r = dict(r)
        r["error"] = r.pop("failed")
        r["stderr"] = r.pop("failed_tb", "")
    return r


def _known_failure(loader, r):
    msg = r.get("error") or ""
    hint = R._hint(msg)
    if hint:
        return f"{loader}: {R._last_line(msg, 200)} -- {hint}"
    if loader == "fastloader" and "fastloader cannot run" in msg and "natively" in msg:
        return "fastloader refuses this recipe (not native yet): " + R._last_line(msg, 300)
    return None


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader"))
@pytest.mark.parametrize("recipe", _recipe_params())
def test_recipe(bench, sample, recipe, workers, loader):
    """Training recipes, the same transform object on both loaders, img/s"""
    mb = bench.max_batches(16)
    cfg = dict(recipe=recipe, workers=workers, root=sample.root, crop_size=CROP, max_batches=mb, torch_threads=1)

    def config(ld):
        return S.Child(S.script("bench_recipes.py"), "child", dict(cfg, impl=ld))

    bench.run(config, adapt=_adapt, known_failure=_known_failure,
              expect=dict(shape=f"{BATCH}x3x{CROP}x{CROP}", dtype="float32",
                          batches=S.n_batches(sample.count, BATCH, mb)))
