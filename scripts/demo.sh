#!/usr/bin/env bash
# The main job: set up, generate an ImageNet-like sample folder from real
# photographs (scikit-image's sample data), and benchmark fastloader's native
# ImageFolder against torch's DataLoader + torchvision on it, side by side.
#   extra arguments go to benchmarks/bench_images.py (e.g. --quick, --n 5000)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${FASTLOADER_VENV:-.venv}"
exec "$VENV/bin/python" benchmarks/bench_images.py "$@"
