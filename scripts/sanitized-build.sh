#!/usr/bin/env bash
# Copy the tree into TREE and build fastloader._C there with a sanitizer
# (FASTLOADER_SANITIZE=MODE: 1 = ASan+UBSan, thread = TSan; see setup.py).
# Shared by scripts/test-asan.sh and scripts/test-tsan.sh.
#   bash scripts/sanitized-build.sh TREE MODE   (VENV: the Python to build with)
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$1 mode=$2
VENV="$(cd "${FASTLOADER_VENV:-.venv}" && pwd)"
rm -rf "$tree"; mkdir -p "$tree"
# .ci and fuzz too: tests/test_docs.py checks that the paths the docs name exist
cp -r setup.py pyproject.toml README.md .ci csrc fastloader fuzz tests scripts docs "$tree"/
[ -d benchmarks ] && cp -r benchmarks "$tree"/
rm -f "$tree"/fastloader/*.so
(cd "$tree" && FASTLOADER_SANITIZE="$mode" "$VENV/bin/python" setup.py -q build_ext --inplace >/dev/null)
