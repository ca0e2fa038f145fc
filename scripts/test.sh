#!/usr/bin/env bash
# Run the whole test suite (set-up included): the normal build, then the same
# suite against an AddressSanitizer + UndefinedBehaviorSanitizer build.
#   scripts/test.sh            both
#   scripts/test.sh --no-asan  normal build only
#   extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${FASTLOADER_VENV:-.venv}"
asan=1
if [ "${1:-}" = "--no-asan" ]; then asan=0; shift; fi
echo "== pytest (release build)"
"$VENV/bin/python" -m pytest -q "$@" tests
if [ $asan = 1 ]; then
    bash scripts/test-asan.sh "$@"
fi
