#!/usr/bin/env bash
# One prepared run for a machine with a CUDA GPU (the device tool's H200):
# build the extension against libjpeg-turbo, liblmdb and libcurl unpacked from
# Debian's .deb files (that machine has none of them), run the GPU tests, take the GPU
# measurements.  A few minutes at most.
#
# Here, once:  bash scripts/gpu_prep.sh   (fills the git-ignored .debs/)
# There:       run with carry=[".debs"]:  bash scripts/gpu_check.sh
# Results go to $OUT (or ./gpu-out) as gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
PY="${PYTHON:-python3}"
prefix="$PWD/.jpeg-prefix"
rm -rf "$prefix"; mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg -x "$f" "$prefix"; done
# the -dev package's libjpeg.so is a symlink to the runtime library: both are unpacked above
export FASTLOADER_JPEG_PREFIX="$prefix"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi -L || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
# the sample's source photographs travel in .debs/sources (no scikit-image there)
[ -d .debs/sources ] && export FASTLOADER_SAMPLE_SOURCES="$PWD/.debs/sources"
export FASTLOADER_CACHE="$PWD/gpu-cache"
time "$PY" setup.py -q build_ext --inplace || exit 1
"$PY" -c "import fastloader, json; print(json.dumps(fastloader.build_info()))"
echo "== GPU tests"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -ra tests/test_cuda.py tests/test_cuda_delivery.py tests/test_devcopy.py
echo "== GPU measurements"
timeout 240 "$PY" benchmarks/bench_gpu.py --n 1000 --workers 8 --batches 40
