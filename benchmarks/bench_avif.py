"""Would a native AVIF decoder pay? (issue 23: "AVIF if libavif with dav1d
proves worth it").

A native decoder helps a pipeline in two ways: its decode may be faster than
Pillow's, and everything after the decode runs in C instead of torchvision's
Python transforms.  The second is bounded by the first: the pipeline can be
no faster than the decode alone.  This measures both pieces on one thread,
so the bound is a number, not a guess:

  pillow_ms     Image.open(BytesIO(data)).convert("RGB") and load()
                (Pillow's own libavif and dav1d)
  libavif_ms    Debian's libavif (libavif-dev, with its dav1d) from C, as a
                native decoder would call it: avifDecoderReadMemory with
                dav1d and one thread, then avifImageYUVToRGB to RGB8
                (a harness compiled here; the file's bytes already in memory)
  torch_tf_ms   torchvision's textbook train transform on the decoded PIL
                image (RandomResizedCrop(224), flip, ToTensor, Normalize)

  ceiling = (pillow_ms + torch_tf_ms) / libavif_ms

is what a native path could reach against torch + Pillow with its own crop,
flip and Normalize costing nothing.  The harness also compares its first
--check files' RGB with Pillow's, byte for byte.

The images are the sample's photographs (fastloader.tools.sample), the first
--n of them, saved once as AVIF by Pillow (quality --quality, its default
speed) under --work-dir.

    python benchmarks/bench_avif.py [--n 150] [--quality 75] [--repeats 3] [--check 20]

Needs libavif's headers (``apt-get install libavif-dev``; scripts/setup.sh
installs them) and a Pillow with AVIF support (Pillow >= 11.2 wheels).
"""
from __future__ import annotations

import argparse
import glob
import io
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

HARNESS = r"""
#include <avif/avif.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* argv: repeats, out_dir (the first `check` files' RGB written there), check, files...
   Prints the best mean milliseconds a file over the repeats.  Exit 1 on any failure. */
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv)
{
    int repeats = atoi(argv[1]), check = atoi(argv[3]), n = argc - 4;
    unsigned char **buf = malloc(sizeof(*buf) * n);
    size_t *len = malloc(sizeof(*len) * n);
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[4 + i], "rb");
        if (!f || fseek(f, 0, SEEK_END)) return 1;
        len[i] = (size_t)ftell(f);
        rewind(f);
        buf[i] = malloc(len[i]);
        if (fread(buf[i], 1, len[i], f) != len[i]) return 1;
        fclose(f);
    }
    double best = 1e30;
    for (int rep = 0; rep < repeats; rep++) {
        double t0 = now();
        for (int i = 0; i < n; i++) {
            avifDecoder *d = avifDecoderCreate();
            d->maxThreads = 1;
            d->codecChoice = AVIF_CODEC_CHOICE_DAV1D;
            avifImage *im = avifImageCreateEmpty();
            avifResult r = avifDecoderReadMemory(d, im, buf[i], len[i]);
            if (r != AVIF_RESULT_OK) { fprintf(stderr, "%s: %s\n", argv[4 + i], avifResultToString(r)); return 1; }
            avifRGBImage rgb;
            avifRGBImageSetDefaults(&rgb, im);
            rgb.format = AVIF_RGB_FORMAT_RGB;
            rgb.depth = 8;
            avifRGBImageAllocatePixels(&rgb);
            if (avifImageYUVToRGB(im, &rgb) != AVIF_RESULT_OK) return 1;
            if (rep == 0 && i < check) {
                char name[4096];
                snprintf(name, sizeof name, "%s/%d.rgb", argv[2], i);
                FILE *o = fopen(name, "wb");
                for (uint32_t y = 0; y < rgb.height; y++)
                    fwrite(rgb.pixels + (size_t)y * rgb.rowBytes, 1, (size_t)rgb.width * 3, o);
                fclose(o);
            }
            avifRGBImageFreePixels(&rgb);
            avifImageDestroy(im);
            avifDecoderDestroy(d);
        }
        double t = (now() - t0) / n;
        if (t < best) best = t;
    }
    printf("%s %.4f\n", avifVersion(), best * 1e3);
    return 0;
}
"""


def prepare(work_dir, n, quality):
    from PIL import Image

    from fastloader.tools.sample import default_sample_dir

    out = os.path.join(work_dir, f"q{quality}")
    os.makedirs(out, exist_ok=True)
    src = sorted(glob.glob(os.path.join(default_sample_dir(2000), "*", "*.JPEG")))[:n]
    if not src:
        raise SystemExit("bench_avif: no sample JPEGs")
    files = []
    for i, f in enumerate(src):
        dst = os.path.join(out, f"{i:05d}.avif")
        if not os.path.exists(dst):
            Image.open(f).convert("RGB").save(dst + ".tmp", format="AVIF", quality=quality)
            os.replace(dst + ".tmp", dst)
        files.append(dst)
    return files


def best_ms(fn, items, repeats):
    """The best over `repeats` passes of fn over items, in ms an item."""
    best = 1e30
    for _ in range(repeats):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--quality", type=int, default=75)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--check", type=int, default=20)
    p.add_argument("--work-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "fastloader", "avif"))
    a = p.parse_args(argv)

    import numpy as np
    import torch
    from PIL import Image, features
    from torchvision import transforms as T

    if not features.check("avif"):
        raise SystemExit("bench_avif: this Pillow has no AVIF support")
    if not os.path.exists("/usr/include/avif/avif.h"):
        raise SystemExit("bench_avif: libavif's headers are missing (apt-get install libavif-dev)")
    torch.set_num_threads(1)
    files = prepare(a.work_dir, a.n, a.quality)
    data = [open(f, "rb").read() for f in files]

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "h.c")
        exe = os.path.join(tmp, "h")
        with open(src, "w") as f:
            f.write(HARNESS)
        subprocess.run([os.environ.get("CC", "gcc"), "-O2", src, "-o", exe, "-lavif"], check=True)
        out = subprocess.run([exe, str(a.repeats), tmp, str(a.check)] + files, check=True,
                             capture_output=True, text=True).stdout.split()
        libavif_version, libavif_ms = out[0], float(out[1])
        same = 0
        for i in range(min(a.check, len(files))):
            ref = np.asarray(Image.open(io.BytesIO(data[i])).convert("RGB"))
            got = np.fromfile(os.path.join(tmp, f"{i}.rgb"), np.uint8)
            same += got.size == ref.size and bool((got.reshape(ref.shape) == ref).all())

    def pil_decode(b):
        im = Image.open(io.BytesIO(b)).convert("RGB")
        im.load()
        return im

    pillow_ms = best_ms(pil_decode, data, a.repeats)

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ims = [pil_decode(b) for b in data]
    torch_tf_ms = best_ms(tf, ims, a.repeats)

    mean_px = sum(im.width * im.height for im in ims) / len(ims)
    mean_kib = sum(map(len, data)) / len(data) / 1024
    print(f"# AVIF: would a native decoder pay? (benchmarks/bench_avif.py)\n")
    print(f"- command: `{' '.join(['python benchmarks/bench_avif.py'] + (sys.argv[1:] if argv is None else argv))}`")
    print(f"- {len(files)} sample photographs as AVIF (Pillow {Image.__version__}, libavif "
          f"{features.version('avif')}, quality {a.quality}), mean {mean_px / 1e3:.0f} kpx, {mean_kib:.1f} KiB; "
          f"one thread, best of {a.repeats}")
    print(f"- Debian's libavif {libavif_version} + dav1d, RGB equal to Pillow's on "
          f"{same} of {min(a.check, len(files))} files\n")
    print("| step | ms an image |")
    print("|---|--:|")
    print(f"| Pillow decode to RGB | {pillow_ms:.2f} |")
    print(f"| libavif + dav1d decode to RGB (C) | {libavif_ms:.2f} |")
    print(f"| torchvision's train transform on the PIL image | {torch_tf_ms:.2f} |")
    print(f"\ndecode speed-up {pillow_ms / libavif_ms:.2f}x; "
          f"ceiling of a native pipeline against torch + Pillow: "
          f"({pillow_ms:.2f} + {torch_tf_ms:.2f}) / {libavif_ms:.2f} = "
          f"**{(pillow_ms + torch_tf_ms) / libavif_ms:.2f}x**")
    return 0


if __name__ == "__main__":
    sys.exit(main())
