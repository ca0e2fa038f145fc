#!/usr/bin/env bash
# Run the whole test suite (set-up included):
#   1. the suite on the release build, then the benchmarks' quick pass (pytest benchmarks/
#      --bench-quick: every benchmark runs a few batches and its batches are checked)
#   2. a 60 s fuzz smoke pass (libFuzzer + ASan/UBSan; installs clang if missing)
#   3. the suite on an AddressSanitizer + UndefinedBehaviorSanitizer build
#   4. the engine and loader tests on a ThreadSanitizer build
#   scripts/test.sh            all four
#   scripts/test.sh --no-asan  the release build only
#   extra arguments go to pytest (release and ASan runs)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${FASTLOADER_VENV:-.venv}"
full=1
if [ "${1:-}" = "--no-asan" ]; then full=0; shift; fi
echo "== pytest (release build)"
"$VENV/bin/python" -m pytest -q --timeout=300 "$@" tests
echo "== pytest benchmarks/ --bench-quick (each benchmark runs, its batches right; the figures mean nothing)"
"$VENV/bin/python" -m pytest -q --timeout=300 benchmarks --bench-quick --benchmark-columns=median,ops,rounds
if [ $full = 1 ]; then
    echo "== fuzz smoke (60 s)"
    FASTLOADER_VENV="$VENV" bash scripts/fuzz.sh 60
    echo "== pytest (ASan + UBSan build)"
    bash scripts/test-asan.sh "$@"
    echo "== pytest (TSan build: engine and loader tests)"
    FASTLOADER_VENV="$VENV" bash scripts/test-tsan.sh
fi
