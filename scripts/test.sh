#!/usr/bin/env bash
# Run the whole test suite (set-up included):
#   1. the suite on the release build, beside
#   2. the suite on an AddressSanitizer + UndefinedBehaviorSanitizer build
#   3. the benchmarks' quick pass (pytest benchmarks/ --bench-quick: every benchmark
#      runs a few batches and its batches are checked), beside
#   4. a 60 s fuzz smoke pass (libFuzzer + ASan/UBSan; installs clang if missing),
#      then the engine and loader tests on a ThreadSanitizer build
#   scripts/test.sh            all four
#   scripts/test.sh --no-asan  the release build only
#   extra arguments go to pytest (release and ASan runs)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${FASTLOADER_VENV:-.venv}"
full=1
if [ "${1:-}" = "--no-asan" ]; then full=0; shift; fi
# Wait for the background pass $1, print its title $3 and its log $2, and
# stop with its exit status if it failed.
finish_beside() {
    local status=0
    wait "$1" || status=$?
    echo "== $3"
    cat "$2"
    if [ "$status" -ne 0 ]; then
        echo "== $3: failed (exit $status)"
        exit "$status"
    fi
}

# The release and ASan passes run side by side: each keeps about one of the
# two CPUs busy on average (the release pass: 14.4 CPU-minutes in 12.5
# minutes; much of a test's time is worker start-up, sleeps and waits), so
# together they take about as long as the longer one alone instead of the
# sum (~25 minutes of CI's ~37 before).  The ASan pass's output follows the
# release pass's.
asan_log=$(mktemp)
bench_log=$(mktemp)
pids=()
# each background pass in its own process group (setsid), so that an early
# exit stops its pytest too, not only its shell
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -f "$asan_log" "$bench_log"' EXIT
if [ $full = 1 ]; then
    setsid bash scripts/test-asan.sh "$@" >"$asan_log" 2>&1 &
    asan_pid=$!
    pids+=("$asan_pid")
    echo "== pytest (ASan + UBSan build): started beside the release pass (its output follows it)"
fi
echo "== pytest (release build)"
"$VENV/bin/python" -m pytest -q --timeout=300 "$@" tests
bench=("$VENV/bin/python" -m pytest -q --timeout=300 benchmarks --bench-quick --benchmark-columns=median,ops,rounds)
bench_title="pytest benchmarks/ --bench-quick (each benchmark runs, its batches right; the figures mean nothing)"
if [ $full = 0 ]; then
    echo "== $bench_title"
    "${bench[@]}"
    exit 0
fi
finish_beside "$asan_pid" "$asan_log" "pytest (ASan + UBSan build)"
# The quick benchmarks check batches, not speed, and the fuzz smoke and the
# TSan pass keep about one of the two CPUs busy, so they run side by side
# (about 5 of CI's minutes).
setsid "${bench[@]}" >"$bench_log" 2>&1 &
bench_pid=$!
pids+=("$bench_pid")
echo "== pytest benchmarks/ --bench-quick: started beside the fuzz smoke and the TSan pass (its output follows them)"
echo "== fuzz smoke (60 s)"
FASTLOADER_VENV="$VENV" bash scripts/fuzz.sh 60
echo "== pytest (TSan build: engine and loader tests)"
FASTLOADER_VENV="$VENV" bash scripts/test-tsan.sh
finish_beside "$bench_pid" "$bench_log" "$bench_title"
