#!/usr/bin/env bash
# Run the whole test suite (set-up included):
#   1. the suite on the release build
#   2. the benchmarks' quick pass (pytest benchmarks/ --bench-quick: every benchmark
#      runs a few batches and its batches are checked), beside
#   3. a 60 s fuzz smoke pass (libFuzzer + ASan/UBSan; installs clang if missing),
#      then the engine and loader tests on a ThreadSanitizer build
#   4. the suite on an AddressSanitizer + UndefinedBehaviorSanitizer build
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
bench=("$VENV/bin/python" -m pytest -q --timeout=300 benchmarks --bench-quick --benchmark-columns=median,ops,rounds)
if [ $full = 0 ]; then
    echo "== pytest benchmarks/ --bench-quick (each benchmark runs, its batches right; the figures mean nothing)"
    "${bench[@]}"
    exit 0
fi
# The quick benchmarks check batches, not speed, and the fuzz smoke and the
# TSan pass keep about one of the two CPUs busy, so they run side by side
# (about 5 of CI's minutes); the release and ASan passes run alone.
bench_log=$(mktemp)
"${bench[@]}" >"$bench_log" 2>&1 &
bench_pid=$!
trap 'kill "$bench_pid" 2>/dev/null || true' EXIT
echo "== pytest benchmarks/ --bench-quick: started beside the fuzz smoke and the TSan pass (its output follows them)"
echo "== fuzz smoke (60 s)"
FASTLOADER_VENV="$VENV" bash scripts/fuzz.sh 60
echo "== pytest (TSan build: engine and loader tests)"
FASTLOADER_VENV="$VENV" bash scripts/test-tsan.sh
bench_status=0
wait "$bench_pid" || bench_status=$?
trap - EXIT
echo "== pytest benchmarks/ --bench-quick (each benchmark runs, its batches right; the figures mean nothing)"
cat "$bench_log"
rm -f "$bench_log"
if [ "$bench_status" -ne 0 ]; then
    echo "== pytest benchmarks/ --bench-quick failed (exit $bench_status)"
    exit "$bench_status"
fi
echo "== pytest (ASan + UBSan build)"
bash scripts/test-asan.sh "$@"
