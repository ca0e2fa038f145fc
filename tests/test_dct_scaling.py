"""dct_scaling=True: decode at libjpeg's 1/2, 1/4, 1/8 scale when the crop is
at least that much larger than the output.  Faster, not bit-exact; this test
bounds the difference from torchvision (PSNR, mean absolute difference)."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402

skdata = pytest.importorskip("skimage.data")


def _psnr(a, b):
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module")
def big_photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    paths = []
    for i, (name, size) in enumerate([("hubble_deep_field", (1000, 872)), ("coffee", (1200, 800)),
                                      ("chelsea", (902, 600)), ("astronaut", (1024, 1024))]):
        im = Image.fromarray(getattr(skdata, name)()).convert("RGB").resize(size, Image.LANCZOS)
        p = d / f"{i}.jpg"
        im.save(p, quality=90, subsampling=2)
        paths.append(str(p))
    return paths


def test_scaled_val_pipeline_is_close_to_torchvision(big_photos):
    tf = FT.Compose([FT.Resize(256), FT.CenterCrop(224), FT.PILToTensor()])
    exact = fastloader.ImageList(big_photos, transform=tf)
    scaled = fastloader.ImageList(big_photos, transform=tf, dct_scaling=True)
    xe, _ = exact.load_batch(range(len(big_photos)), 0, 0)
    xs, _ = scaled.load_batch(range(len(big_photos)), 0, 0)
    ref = torch.stack([T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])(
        Image.open(p).convert("RGB")) for p in big_photos])
    assert torch.equal(xe, ref)            # full-scale decode is exact
    assert not torch.equal(xs, ref)        # the scaled path really ran
    for a, b in zip(xs.numpy(), ref.numpy()):
        psnr = _psnr(a, b)
        mad = float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())
        # DCT-domain downscaling is a box-like prefilter where Pillow uses a
        # triangle filter: the difference is a slight change in sharpness,
        # not a shift.  Measured 38.5-49.5 dB and MAD 0.4-1.6 on these
        # photos (the sharp, detailed astronaut is the worst).
        assert psnr > 35.0, psnr
        assert mad < 3.0, mad
