"""Build script for the fastloader C extension (fastloader._C).

Only the extension is configured here; metadata lives in pyproject.toml.
Environment knobs:
  FASTLOADER_SANITIZE=1   build with AddressSanitizer + UndefinedBehaviorSanitizer
  FASTLOADER_SANITIZE=thread  build with ThreadSanitizer (scripts/test-tsan.sh)
  FASTLOADER_JPEG_PREFIX  a prefix holding include/ and lib/ of libjpeg-turbo
                          (for example a Debian package unpacked with dpkg -x)
"""
import glob
import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
JPEG_PACKAGE = "libjpeg62-turbo-dev"


def _jpeg_dirs():
    """Return (include_dirs, library_dirs) for libjpeg-turbo, or exit with one clear line."""
    prefix = os.environ.get("FASTLOADER_JPEG_PREFIX")
    inc, lib = [], []
    if prefix:
        inc = [os.path.join(prefix, "usr/include"), os.path.join(prefix, "usr/include/x86_64-linux-gnu"),
               os.path.join(prefix, "include")]
        lib = [os.path.join(prefix, "usr/lib/x86_64-linux-gnu"), os.path.join(prefix, "lib")]
    search = inc + ["/usr/include", "/usr/local/include", "/opt/homebrew/include"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        search.append(os.path.join("/usr/include", multiarch))
    have_header = any(os.path.exists(os.path.join(d, "jpeglib.h")) for d in search)
    have_turbo = False
    for d in search:
        p = os.path.join(d, "jconfig.h")
        if os.path.exists(p):
            with open(p, encoding="latin-1") as f:
                if "LIBJPEG_TURBO_VERSION" in f.read():
                    have_turbo = True
    if not (have_header and have_turbo):
        sys.exit(
            "fastloader: libjpeg-turbo development headers not found "
            f"(jpeglib.h from libjpeg-turbo); install them with: apt-get install -y {JPEG_PACKAGE}"
        )
    return inc, lib


def _check_header(header, package, search):
    """Exit with one clear line when a library's development header is missing."""
    if not any(os.path.exists(os.path.join(d, header)) for d in search):
        sys.exit(f"fastloader: {header} not found; install it with: apt-get install -y {package}")


class BuildExt(build_ext):
    def build_extensions(self):
        import numpy

        inc, lib = _jpeg_dirs()
        search = inc + ["/usr/include", "/usr/local/include"]
        multiarch = sysconfig.get_config_var("MULTIARCH")
        if multiarch:
            search.append(os.path.join("/usr/include", multiarch))
        _check_header("lmdb.h", "liblmdb-dev", search)              # LMDBDataset
        _check_header("curl/curl.h", "libcurl4-openssl-dev", search)  # WebDataset over http(s)
        _check_header("spng.h", "libspng-dev", search)               # PNG
        _check_header("libdeflate.h", "libdeflate-dev", search)     # PNG's fast inflate
        _check_header("webp/decode.h", "libwebp-dev", search)        # WebP
        _check_header("zlib.h", "zlib1g-dev", search)                # PNG chunk CRCs
        for ext in self.extensions:
            ext.include_dirs += inc + [numpy.get_include()]
            ext.library_dirs += lib
            if os.environ.get("FASTLOADER_JPEG_PREFIX"):
                ext.extra_link_args += [f"-Wl,-rpath,{d}" for d in lib]
        super().build_extensions()


cflags = ["-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-std=c11",
          "-D_GNU_SOURCE", "-fvisibility=hidden", "-pthread"]
ldflags = ["-pthread"]
sanitize = os.environ.get("FASTLOADER_SANITIZE", "")
if sanitize:
    if sanitize == "thread":
        san = ["-fsanitize=thread", "-fno-omit-frame-pointer"]
    else:
        # float-cast-overflow is not part of gcc's "undefined" group: a double
        # out of an int's range (a NaN view origin, say) must abort too
        san = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-omit-frame-pointer",
               "-fno-sanitize-recover=undefined,float-cast-overflow"]
    cflags = [f for f in cflags if f != "-O3"] + ["-O1", "-g"] + san
    ldflags += san

# csrc/ is one folder per layer (docs/architecture.md); every .c of every layer
# goes into the one extension.
sources = sorted(glob.glob(os.path.join("csrc", "*", "*.c")))

setup(
    ext_modules=[
        Extension(
            "fastloader._C",
            sources=sources,
            include_dirs=["csrc"],
            libraries=["jpeg", "spng", "deflate", "webp", "z", "lmdb", "dl", "mvec", "m"],  # libcurl: dlopen, csrc/sources/stream.c
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            depends=sorted(glob.glob(os.path.join("csrc", "*", "*.h"))),
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
