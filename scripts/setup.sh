#!/usr/bin/env bash
# Set up everything fastloader needs on a fresh Debian machine (root), idempotently:
# libjpeg-turbo headers, a virtual environment in .venv, torch/torchvision from the
# local wheel cache, and an in-place build of the C extension.
#   FASTLOADER_VENV=path    use another virtual environment location
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FASTLOADER_VENV:-.venv}"

need_apt=()
[ -f /usr/include/jpeglib.h ] || need_apt+=(libjpeg62-turbo-dev)
# liblmdb: LMDBDataset; libcurl: WebDataset shards over http(s); nginx: the real
# HTTP server the shard tests and benchmarks start on loopback
[ -f /usr/include/lmdb.h ] || need_apt+=(liblmdb-dev)
[ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] || need_apt+=(libcurl4-openssl-dev)
# libspng (PNG) and libwebp (WebP): the native decoders besides JPEG; libdeflate
# inflates and checks a well-formed PNG (csrc/image/png.c's fast path); zlib for PNG's Adler-32
[ -f /usr/include/spng.h ] || need_apt+=(libspng-dev)
[ -f /usr/include/libdeflate.h ] || need_apt+=(libdeflate-dev)
[ -f /usr/include/webp/decode.h ] || need_apt+=(libwebp-dev)
[ -f /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v gcc >/dev/null || need_apt+=(gcc)
# cjpeg/jpegtran make the restart-marker and arithmetic-coding test images
command -v jpegtran >/dev/null || need_apt+=(libjpeg-turbo-progs)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating virtual environment $VENV"
    "$PY" -m venv "$VENV"
fi
# torch 2.14.1 + torchvision 0.29.1 come from this machine's local wheel cache
# (see DEVELOPERS.md); pip does nothing when they are already installed.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==2.14.1" "torchvision==0.29.1" "numpy>=1.23" "pillow>=9" "scikit-image>=0.21" "pytest>=7" "pytest-benchmark>=4" "pytest-timeout>=2" \
    "setuptools>=61" wheel \
    "lmdb>=1.4" "webdataset>=0.2" "datasets>=2.14" "accelerate>=1.0" "lightning>=2.2" "torchdata>=0.11" \
    "transformers>=4.46"
# timm (its transforms in the recipe tests and benchmarks) without its dependencies, so that
# it does not pull another torch; its small pure-Python needs beside it
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "timm>=1.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check huggingface_hub safetensors pyyaml
echo "setup: building fastloader._C"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
# the bytecode a regular pip install writes and an editable one does not (PYTHONDONTWRITEBYTECODE
# machines never write it at import): without it every process compiles the package again
"$VENV/bin/python" -m compileall -q fastloader
"$VENV/bin/python" -c "import fastloader, json; print('setup: ok', json.dumps(fastloader.build_info()))"
