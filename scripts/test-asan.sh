#!/usr/bin/env bash
# Build fastloader._C with AddressSanitizer + UndefinedBehaviorSanitizer in a
# copy of the tree (build/asan) and run the test suite against it.  Any ASan or
# UBSan report aborts the process, so a clean run means no reports.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(cd "${FASTLOADER_VENV:-.venv}" && pwd)"
tree=build/asan
bash scripts/sanitized-build.sh "$tree" 1
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
# libstdc++ too: torch/triton abort under ASan without it preloaded
echo "== pytest (ASan + UBSan build)"
cd "$tree"
# detect_leaks=0: CPython itself does not free everything at exit.
LD_PRELOAD="$libasan $libubsan $(gcc -print-file-name=libstdc++.so)" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
FASTLOADER_UNDER_ASAN=1 \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" tests
