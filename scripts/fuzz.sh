#!/usr/bin/env bash
# Fuzz the C core with libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
#
#   SECONDS  total fuzzing time, split evenly over the targets (default 600:
#            the 10-minute run recorded in docs/hardening.md; 60 is the CI smoke pass)
#   TARGET   decode | region | render | render-noavx2 | augment | augment-noavx2 | mix | tar | codecs
#            (default: decode region render augment mix codecs; mix is fuzz/fuzz_mix.c,
#            the batch stage (timm's Mixup, torchvision's MixUp / CutMix); tar is fuzz/fuzz_tar.c,
#            the shard reader, run on request; codecs is fuzz/fuzz_codecs.c, the
#            PNG and WebP decoders)
#            render-noavx2 / augment-noavx2 are the render / augment binaries with
#            FASTLOADER_NO_AVX2=1 (the portable kernels); each shares its
#            binary's corpus.
#
# Builds fuzz/fuzz_<target>.c against the core sources (every csrc/<layer>/*.c but
# csrc/binding/; -ljpeg -lspng -ldeflate -lwebp -lz -llmdb -lmvec -lm -lpthread -ldl, no Python) into build/fuzz/, makes
# the seed corpus with scripts/make_fuzz_corpus.py when build/fuzz/seeds is
# missing or older than the script, replays tests/data/fuzz-regressions/<target>-* first, then fuzzes
# each target with its growing corpus in build/fuzz/corpus/<target>.  Crash,
# leak and timeout inputs go to build/fuzz/crashes/.  Prints executions,
# exec/s, coverage (cov/ft) and corpus size per target; exits non-zero if any
# target found anything.  Installs clang (Debian package) when it is missing.
#
# Environment: FASTLOADER_VENV (a virtual environment with Pillow, default
# .venv, else python3), FUZZ_ARGS (extra libFuzzer flags), FUZZ_SKIP_KNOWN=1
# (build the harnesses without the checks that trip on known, still unfixed
# findings; see docs/hardening.md).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-600}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode region render augment mix codecs)
for t in "${targets[@]}"; do
    case $t in decode|region|render|render-noavx2|augment|augment-noavx2|mix|tar|codecs) ;;
        *) echo "fuzz: unknown target '$t'" >&2; exit 2 ;; esac
done

# --- toolchain: clang with libFuzzer (Debian: clang pulls libclang-rt-*-dev)
need_apt=()
command -v clang >/dev/null || need_apt+=(clang)
[ -f /usr/include/jpeglib.h ] || need_apt+=(libjpeg62-turbo-dev)
[ -f /usr/include/spng.h ] || need_apt+=(libspng-dev)
[ -f /usr/include/libdeflate.h ] || need_apt+=(libdeflate-dev)
[ -f /usr/include/webp/decode.h ] || need_apt+=(libwebp-dev)
command -v cjpeg >/dev/null || need_apt+=(libjpeg-turbo-progs)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "fuzz: installing Debian packages: ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
B=build/fuzz
mkdir -p "$B/obj" "$B/crashes" "$B/corpus"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
    > "$B/obj/probe.c"
if ! clang -fsanitize=fuzzer,address,undefined "$B/obj/probe.c" -o "$B/obj/probe" 2>"$B/obj/probe.log"; then
    echo "fuzz: clang cannot link -fsanitize=fuzzer (libFuzzer missing?):" >&2
    cat "$B/obj/probe.log" >&2
    exit 1
fi

# --- build (a few seconds; always rebuilt so csrc/ edits are picked up)
CFLAGS=(-g -O1 -fno-omit-frame-pointer -std=c11 -D_GNU_SOURCE -pthread -Wall -Wextra
        -Wno-missing-field-initializers -fno-sanitize-recover=undefined)
# FUZZ_SKIP_KNOWN=1: the harnesses steer clear of the findings recorded in
# docs/hardening.md that csrc/ does not fix yet, so a run can look for new ones.
[ "${FUZZ_SKIP_KNOWN:-0}" = 1 ] && CFLAGS+=(-DFZ_SKIP_KNOWN)
# The core: every csrc/<layer>/*.c but the Python binding (csrc/binding/), so a
# split or a new core file needs no change here.  Objects are named
# layer_file.o, so two layers may hold files of the same name.
CORE=()
for f in csrc/*/*.c; do
    case $f in csrc/binding/*) ;; *) f=${f#csrc/}; CORE+=("${f%.c}") ;; esac
done
echo "fuzz: building into $B ($(clang --version | head -1)): ${CORE[*]}"
rm -f "$B"/obj/*.o
for f in "${CORE[@]}"; do
    clang "${CFLAGS[@]}" -fsanitize=fuzzer-no-link,address,undefined -Icsrc -c "csrc/$f.c" -o "$B/obj/${f//\//_}.o" &
done
wait
objs=()
for f in "${CORE[@]}"; do
    [ -f "$B/obj/${f//\//_}.o" ] || { echo "fuzz: building csrc/$f.c failed" >&2; exit 1; }
    objs+=("$B/obj/${f//\//_}.o")
done
bins=()
for t in "${targets[@]}"; do
    b=${t%-noavx2}
    case " ${bins[*]:-} " in *" $b "*) continue ;; esac
    bins+=("$b")
    clang "${CFLAGS[@]}" -fsanitize=fuzzer,address,undefined -Icsrc "fuzz/fuzz_$b.c" "${objs[@]}" \
        -ljpeg -lspng -ldeflate -lwebp -lz -llmdb -lmvec -lm -lpthread -ldl -o "$B/fuzz_$b"
done

# --- seed corpus
if [ ! -d "$B/seeds/decode" ] || [ scripts/make_fuzz_corpus.py -nt "$B/seeds/decode" ]; then
    PY=python3
    [ -x "${FASTLOADER_VENV:-.venv}/bin/python" ] && PY="${FASTLOADER_VENV:-.venv}/bin/python"
    "$PY" scripts/make_fuzz_corpus.py "$B/seeds"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# --- replay the regression inputs of earlier findings
failed=0
shopt -s nullglob
for t in "${targets[@]}"; do
    b=${t%-noavx2}
    files=(tests/data/fuzz-regressions/"$b"-*)
    [ ${#files[@]} -gt 0 ] || continue
    if ! "$B/fuzz_$b" -runs=0 "${files[@]}" >"$B/regressions-$t.log" 2>&1; then
        echo "fuzz: $t: a regression input fails again, see $B/regressions-$t.log" >&2
        failed=1
    fi
done

# --- fuzz
touch "$B/crashes/.start"
n=${#targets[@]}
per=$(( secs / n )); [ $per -ge 1 ] || per=1
printf '%-14s %10s %7s %8s %7s %7s %9s %s\n' target execs secs exec/s cov ft corpus result
summary=()
for t in "${targets[@]}"; do
    b=${t%-noavx2}
    env=()
    case $t in *-noavx2) env=(FASTLOADER_NO_AVX2=1) ;; esac
    # the JPEG targets' and the shard reader's dictionaries; augment's and mix's
    # input is parameters and raw pixels, which no dictionary describes
    dict=()
    case $b in tar) dict=(-dict=fuzz/tar.dict) ;; codecs) dict=(-dict=fuzz/codecs.dict) ;; augment|mix) ;;
        *) dict=(-dict=fuzz/jpeg.dict) ;; esac
    mkdir -p "$B/corpus/$b"
    log="$B/fuzz-$t.log"
    start=$(date +%s)
    rc=0
    # -max_len: the seeds are under 1.5 KB; 16 KB leaves room for grown
    # headers (many markers, EXIF, tables) without slowing the mutator.
    env "${env[@]}" "$B/fuzz_$b" -max_total_time="$per" -max_len=16384 -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 "${dict[@]}" \
        -artifact_prefix="$B/crashes/$t-" \
        ${FUZZ_ARGS:-} \
        "$B/corpus/$b" "$B/seeds/$b" >"$log" 2>&1 || rc=$?
    dur=$(( $(date +%s) - start ))
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(sed -E -n 's/^#([0-9]+).*/\1/p' <<<"$last")
    cov=$(sed -E -n 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -E -n 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
    corp=$(ls "$B/corpus/$b" | wc -l)
    eps=$(( ${execs:-0} / (dur > 0 ? dur : 1) ))
    res=ok
    if [ $rc -ne 0 ]; then
        res="FOUND (rc $rc): $(grep -E -m1 'ERROR: |FUZZ CONTRACT|runtime error' "$log" || echo "see $log")"
        failed=1
    fi
    line=$(printf '%-14s %10s %7s %8s %7s %7s %9s %s' "$t" "${execs:-?}" "$dur" "$eps" "${cov:-?}" "${ft:-?}" "$corp" "$res")
    echo "$line"
    summary+=("$line")
done
find "$B/crashes" -type f -newer "$B/crashes/.start" -printf 'fuzz: new crash file: %p\n'
if [ $failed -ne 0 ]; then
    echo "fuzz: FAILED (logs: $B/fuzz-<target>.log; inputs: $B/crashes/)" >&2
    exit 1
fi
echo "fuzz: ok"
