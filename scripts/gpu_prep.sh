#!/usr/bin/env bash
# Run here (with network) before scripts/gpu_check.sh runs on the GPU
# machine (which has no libjpeg-turbo, no scikit-image and no network):
# fills .debs/ (git-ignored; pass it in the device tool's carry) with
# Debian's libjpeg-turbo, libspng, libdeflate, libwebp, zlib headers, liblmdb and libcurl packages and copies of the sample's source
# photographs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
mkdir -p .debs/sources
# the extension links libjpeg, liblmdb and libcurl; libcurl4's own
# libraries that a non-Debian machine may lack come too (libssl, zlib, zstd,
# krb5 and libc are left to the machine: unpacked ones would shadow its own)
(cd .debs && apt-get download libjpeg62-turbo libjpeg62-turbo-dev libspng0 libspng-dev libdeflate0 libdeflate-dev libwebp7 libwebp-dev \
    zlib1g-dev liblmdb0 liblmdb-dev \
    libcurl4 libcurl4-openssl-dev libnghttp2-14 libssh2-1 librtmp1 libpsl5 libbrotli1 libidn2-0 \
    libldap-2.5-0 libsasl2-2)
"$PY" - <<'PYEOF'
import os, shutil
from fastloader.tools import sample
src = sample._skimage_data_dir()
for name, _ in sample._COLOR_SOURCES + sample._GRAY_SOURCES:
    if os.path.exists(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), ".debs/sources/")
print("sources:", sorted(os.listdir(".debs/sources")))
PYEOF
du -sh .debs
