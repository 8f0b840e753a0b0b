#!/usr/bin/env bash
# run_gpu_tests.sh: builds Tandem with the CUDA backend on a machine with a GPU,
# runs the tests labelled `gpu`, runs compute-sanitizer on the kernel and
# sampling tests, and times the batch-invariant GEMM against cuBLAS
# (tandem-bench-kernels) and runs tandem-bench runtime/spec --backend cuda.
#
# Usage: tests/gpu/run_gpu_tests.sh [--asan] [--debs DIR] [BUILD_DIR]
#   BUILD_DIR  default <source>/build-gpu (the ASan build goes to BUILD_DIR-asan)
#   --asan     also build with -DTANDEM_SANITIZE=ON and run `ctest -L gpu` there
#   --debs DIR unpack every DIR/*.deb into /tmp/tandem-debs first and point
#              pkg-config, the compiler and the loader at it: for a bare GPU
#              image without the project's libraries. tests/gpu/fetch_debs.sh
#              downloads them on a machine with apt (into .deps/gpu-debs: carry
#              that folder). The unpacked .pc files lose their Requires.private
#              lines, and a library the image already has is loaded from the
#              image, not from DIR.
# Environment: TANDEM_CUDA_ARCHITECTURES (default 90), JOBS (default nproc),
#   TANDEM_CUDA_DEVICE (device the test uses, default "0"),
#   OUT (when set, logs are copied there).
# Exit status: 0 when every step passed or was skipped for want of a tool,
#   1 when a step failed, 77 when no GPU is visible.
#
# What the gpu-labelled tests cover:
#   - test_cuda_kernels: every op against the CPU backend; batch invariance
#     bit for bit: matmul row i alone (n = 1) vs inside calls of every
#     n = 1..256 and 257, 383, 511, 512 rows, through the op table and every
#     kernel and tile shape (skinny, tiled 32x32 / 16x32 / 16x16), bf16, f16
#     and f32 weights, d_in odd, % 8 == 4 and < 256, d_out off the tiles,
#     unaligned and row-offset inputs, plus a 3072-wide bf16 shape; the rows
#     within f32 accumulation error of the CPU; a self-check that the
#     comparison catches one ulp; the cuBLAS benchmark path against the CPU;
#     attention across a split boundary;
#   - test_cuda_sampling: sampling and speculative accept/reject on the device
#     (kernels/cuda/sampling.cu) against common/spec: Philox uniforms bit for
#     bit (also checked on the host without a GPU); argmax equal; adjusted
#     rows (temperature, top-k, top-p, min-p; 29 parameter sets x 9 logit
#     patterns, vocab 1..128256) within 1e-6 relative with the same kept set;
#     draws equal on equal rows; the chi-square tests of test_speculate.c
#     (alpha 1e-4, 40,000 rounds, sampled and point mass, K = 1 and 3) on the
#     device's output, the broken variant (correction from p) rejected, each
#     round equal to speculate_verify; greedy and sampled rounds on random
#     rows equal to speculate_verify; time of sampling 1 and 17 rows of vocab
#     128256 on the device vs the CPU (printed below the summary's ctest line);
#   - test_cuda_devsample: the engine's device sampling (logits left on the
#     device, kern_cuda_* drafting, sampling and accept/reject, only ids
#     downloaded: tandem-generate's default on cuda) on the tiny and small
#     presets: greedy ids == the host sampler's == the CPU backend's over 64
#     tokens; speculative greedy == target-only for K 1..8 and adaptive, both
#     draft modes; seeded sampling (T, top-k, top-p, min-p) reproducible run
#     to run, target-only and with K = 1, 3, and unchanged with the draft on a
#     second backend (q rows through host memory); agreement of sampled ids
#     with the host sampler printed, not gated (the kernels' contract allows a
#     draw boundary to differ by rounding);
#   - test_cuda_runtime (tandem-generate and the workers sample on the device
#     by default on cuda, so its checks run the device path): tandem-generate --backend cuda == the CPU backend's
#     greedy ids (tiny, small); in-process speculative == target-only on cuda
#     for K 1..8 and adaptive, both draft modes; --draft-device by UUID; the
#     three-process pipeline with both workers on the GPU == target-only, streamed
#     and not; under deploy/tandem-supervisor, once per variant (POSIX shared
#     memory, cuda_ipc with the device slab and interprocess events (the
#     draft's sampling kernels write q into the slab, the target's accept/reject
#     reads it there after the event wait: no host copy; both logs checked),
#     cuda_ipc forced through pinned host staging by the draft and by the
#     target (q through the host face, uploaded for the device accept/reject),
#     cuda_ipc under the instance's MPS daemon, all with sampler "device"; and
#     cuda_ipc with sampler "host" in both workers): greedy == target-only
#     streamed and not, seeded sampling with fixed K = 3 reproducible and (device
#     sampler) equal to the POSIX variant's token for token, the host sampler's
#     agreement printed; one summary row per variant ("pipeline ..."); kill -9 of
#     the draft mid-request (target-only ids, GPU memory back to its level after
#     the restart) and of the target (target_unavailable within the worker
#     timeout, recovery); compute-sanitizer memcheck on each worker for a short
#     cuda_ipc run (the runtime test starts those itself).
# What this does NOT cover yet (TODO, in rough order of value):
#   - the Llama forward pass on the CUDA backend against HF transformers
#     (bf16 reference logits on the GPU machine's PyTorch);
#   - CUDA graphs; the skinny GEMM at the bandwidth floor (the GPU runtime
#     issue; `tandem-bench runtime --backend cuda` below measures how far);
#   - two GPUs: peer access between devices and the UUID lookup of another
#     GPU (the staging variants run the fallback path on one GPU; the lent
#     machines have one GPU), including a target that falls back to staging
#     by itself while the draft writes q only into its slab (sampled
#     verifications must fail with the error naming shm_staging);
#   - the pipeline benchmark with and without MPS (issue 11's figures);
#   - timings against the two floors of METHOD.md (skinny GEMM bandwidth vs
#     the weight bytes, attention at long contexts); the batch-invariant GEMM
#     against cuBLAS is timed by `tandem-bench-kernels --backend cuda`, run
#     at the end of this script (its table is in bench-kernels-cuda.log; it
#     reports, it does not pass or fail on speed);
#   - compute-sanitizer runs with --report-api-errors no: the test makes
#     failing calls on purpose (a 1 PiB cudaMalloc); the test checks codes;
#   - initcheck (cuBLAS internals may report false positives) and
#     contexts near 131072 positions (attention scratch growth).
set -u

usage() { sed -n '2,21p' "$0"; exit 2; }

SRC_DIR=$(cd "$(dirname "$0")/../.." && pwd)
ASAN=0
DEBS=""
BUILD_DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
    --asan) ASAN=1 ;;
    --debs) [ $# -ge 2 ] || usage; DEBS=$2; shift ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) BUILD_DIR=$1 ;;
    esac
    shift
done
BUILD_DIR=${BUILD_DIR:-$SRC_DIR/build-gpu}
ARCHS=${TANDEM_CUDA_ARCHITECTURES:-90}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
LOG_DIR=$BUILD_DIR-logs
mkdir -p "$LOG_DIR" || exit 1

SUMMARY=()
FAILED=0
record() { # step status detail
    SUMMARY+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")")
    [ "$2" = FAIL ] && FAILED=1
}
finish() {
    echo
    echo "==== run_gpu_tests summary ($(date -u +%FT%TZ)) ===="
    printf '%s\n' "${SUMMARY[@]}"
    echo "logs: $LOG_DIR"
    if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
        cp "$LOG_DIR"/*.log "$OUT"/ 2>/dev/null
        printf '%s\n' "${SUMMARY[@]}" >"$OUT/summary.txt"
    fi
    exit "$1"
}
run_step() { # name log command...
    local name=$1 log=$LOG_DIR/$2
    shift 2
    echo "---- $name: $*"
    "$@" >"$log" 2>&1
    local rc=$? # the command's status (after an `if` without an else, $? is 0)
    if [ "$rc" -eq 0 ]; then
        record "$name" PASS "$log"
        return 0
    fi
    tail -n 40 "$log"
    record "$name" FAIL "exit $rc, $log"
    return 1
}

# ---- preflight -------------------------------------------------------------
if [ -n "$DEBS" ]; then
    PREFIX=/tmp/tandem-debs
    mkdir -p "$PREFIX"
    for deb in "$DEBS"/*.deb; do
        [ -e "$deb" ] || continue
        dpkg -x "$deb" "$PREFIX" || { echo "cannot unpack $deb" >&2; exit 1; }
    done
    MULTI=$PREFIX/usr/lib/x86_64-linux-gnu
    # Requires.private names what only a static link needs (libzmq's:
    # krb5-gssapi, libsodium, openpgm, norm, libbsd), whose .pc files the
    # image lacks and which pkg-config would refuse libzmq for.
    for pc in "$MULTI"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc; do
        [ -f "$pc" ] || continue
        sed -i '/^Requires\.private:/d' "$pc" || { echo "cannot edit $pc" >&2; exit 1; }
    done
    # Where the image has a library already, its own build stays the one
    # every program loads (python3 and torch too): the unpacked file of that
    # soname (libzmq.so.5, libssl.so.3) goes, so LD_LIBRARY_PATH below adds
    # only what the image lacks. What a link-time name points at
    # (libzmq.so -> libzmq.so.5.2.4, libcjson.so -> libcjson.so.1) stays.
    if command -v ldconfig >/dev/null 2>&1 || [ -x /sbin/ldconfig ]; then
        LDCONFIG=$(command -v ldconfig 2>/dev/null || echo /sbin/ldconfig)
        image_sonames=$("$LDCONFIG" -p 2>/dev/null | awk 'NR > 1 { print $1 }' | sort -u)
        kept=""
        for lib in "$MULTI"/*.so.* "$PREFIX"/lib/x86_64-linux-gnu/*.so.*; do
            name=${lib##*/}
            [[ $name =~ \.so\.[0-9]+$ ]] || continue
            [ -e "$lib" ] || [ -L "$lib" ] || continue
            if grep -qxF "$name" <<<"$image_sonames"; then
                # kept where a link-time name leads through it (libcjson.so -> libcjson.so.1)
                if [ -n "$(find "${lib%/*}" -maxdepth 1 -lname "$name")" ]; then
                    kept="$kept $name"
                else
                    rm -f "$lib"
                fi
            else
                kept="$kept $name"
            fi
        done
        echo "--debs: libraries loaded from $PREFIX (the image lacks them, or a link-time name needs them):${kept:- none}"
    fi
    export PATH=$PREFIX/usr/bin:$PATH
    export PKG_CONFIG_PATH=$MULTI/pkgconfig:$PREFIX/usr/share/pkgconfig:$PREFIX/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export PKG_CONFIG_SYSROOT_DIR=$PREFIX
    export LD_LIBRARY_PATH=$MULTI:$PREFIX/lib/x86_64-linux-gnu:$PREFIX/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LIBRARY_PATH=$MULTI${LIBRARY_PATH:+:$LIBRARY_PATH}
    record "unpack --debs" PASS "$DEBS -> $PREFIX"
fi

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L | tee "$LOG_DIR/nvidia-smi.log"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv >>"$LOG_DIR/nvidia-smi.log" 2>&1
    if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        echo "SKIPPED: nvidia-smi lists no GPU"
        record "gpu visible" SKIP "nvidia-smi lists no GPU"
        finish 77
    fi
    record "gpu visible" PASS "$(nvidia-smi -L | head -n 1)"
else
    echo "SKIPPED: nvidia-smi not found (no NVIDIA driver on this machine)"
    record "gpu visible" SKIP "no nvidia-smi"
    finish 77
fi

missing=""
for tool in cmake nvcc; do
    command -v "$tool" >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/$tool ] || missing="$missing $tool"
done
if command -v pkg-config >/dev/null 2>&1; then
    for mod in libzmq libcjson libpcre2-8 cmocka; do
        pkg-config --exists "$mod" || missing="$missing $mod"
    done
else
    missing="$missing pkg-config"
fi
if [ -n "$missing" ]; then
    echo "missing:$missing (tests/gpu/fetch_debs.sh on a machine with apt, then --debs: see the header of $0)" >&2
    record "prerequisites" FAIL "missing:$missing"
    finish 1
fi
record "prerequisites" PASS "cmake, nvcc, libzmq, cJSON, PCRE2, CMocka"

# ---- build and test ----------------------------------------------------------
# A build for one configuration: configure, build the gpu test targets, ctest -L gpu.
build_and_test() { # dir label extra-cmake-args...
    local dir=$1 label=$2
    shift 2
    run_step "configure ($label)" "configure-$label.log" \
        cmake -S "$SRC_DIR" -B "$dir" -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DTANDEM_CUDA_ARCHITECTURES="$ARCHS" "$@" || return 1
    # Everything: the runtime test drives the tools and the three processes.
    run_step "build ($label)" "build-$label.log" cmake --build "$dir" -j"$JOBS" || return 1
    local log=$LOG_DIR/ctest-$label.log
    echo "---- ctest -L gpu ($label)"
    (cd "$dir" && TANDEM_BUILD_DIR="$dir" ctest -L gpu --output-on-failure) >"$log" 2>&1
    local rc=$?
    cat "$log"
    if [ $rc -ne 0 ]; then
        record "ctest -L gpu ($label)" FAIL "exit $rc, $log"
    elif grep -q 'Skipped' "$log"; then
        # On a GPU machine a skipped gpu test means the device was not usable.
        record "ctest -L gpu ($label)" FAIL "a gpu test skipped on a GPU machine, $log"
    else
        record "ctest -L gpu ($label)" PASS "$log"
    fi
    # One row per gpu test ("Test #39: test_cuda_sampling ....   Passed   41.20 sec").
    local line name verdict
    while IFS= read -r line; do
        name=$(sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/' <<<"$line")
        verdict=$(sed -E 's/.*\.+ *(\*+)?([A-Za-z][A-Za-z ]*[a-z]).*/\2/' <<<"$line")
        case "$verdict" in
        Passed) record "  $name ($label)" PASS "$(grep -oE '[0-9.]+ sec' <<<"$line")" ;;
        *Skipped*) record "  $name ($label)" SKIP "$verdict" ;;
        *) record "  $name ($label)" FAIL "$verdict" ;;
        esac
    done < <(grep -E 'Test +#[0-9]+: ' "$log")
    # CTest keeps every test's output: the device sampling's figures, and
    # one row per pipeline variant of test_cuda_runtime ("pipeline-row: NAME
    # PASS|FAIL detail"; a variant never reached has no row).
    local full=$dir/Testing/Temporary/LastTest.log
    if [ -f "$full" ]; then
        cp "$full" "$LOG_DIR/ctest-$label-full.log"
        local vname vverdict vdetail
        while read -r _ vname vverdict vdetail; do
            record "    pipeline $vname ($label)" "$vverdict" "$vdetail"
        done < <(grep -E '^pipeline-row: [^ ]+ (PASS|FAIL)' "$full")
        grep -E '^(device (sampled|point-mass)|sampling time at vocab|  T=|sample: |adjust(: | at vocab)|(tiny|small) .*agrees with the host path)' \
            "$full" >"$LOG_DIR/sampling-figures-$label.log" || true
        cat "$LOG_DIR/sampling-figures-$label.log"
    fi
}

build_and_test "$BUILD_DIR" normal

# ---- compute-sanitizer -------------------------------------------------------
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || true)
[ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer
# TANDEM_GPU_TEST_SHORT under the slow sanitizers: test_cuda_kernels checks 15
# matmul row counts (every shape, path and tile edge kind) instead of 260;
# test_cuda_sampling skips the 128256-wide rows and runs 500 rounds per
# goodness-of-fit test (each still equal to the CPU's). The normal ctest run
# above checks everything.
for test_name in test_cuda_kernels test_cuda_sampling; do
    TEST_BIN=$BUILD_DIR/tests/gpu/$test_name
    short=${test_name#test_cuda_}
    if [ -z "$SANITIZER" ]; then
        record "compute-sanitizer ($short)" SKIP "not installed"
    elif [ ! -x "$TEST_BIN" ]; then
        record "compute-sanitizer ($short)" SKIP "$test_name was not built"
    else
        run_step "compute-sanitizer memcheck ($short)" "sanitizer-memcheck-$short.log" \
            env TANDEM_GPU_TEST_SHORT=1 \
            "$SANITIZER" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99 "$TEST_BIN"
        run_step "compute-sanitizer racecheck ($short)" "sanitizer-racecheck-$short.log" \
            env TANDEM_GPU_TEST_SHORT=1 \
            "$SANITIZER" --tool racecheck --report-api-errors no --error-exitcode 99 "$TEST_BIN"
        run_step "compute-sanitizer synccheck ($short)" "sanitizer-synccheck-$short.log" \
            env TANDEM_GPU_TEST_SHORT=1 \
            "$SANITIZER" --tool synccheck --report-api-errors no --error-exitcode 99 "$TEST_BIN"
    fi
done

# The engine's device path (logits in device memory, drafting, sampling and
# accept/reject in the kernels, q rows on the device) under memcheck: one
# sampled speculative run (K = 3: drafts, q rows, residual or bonus) and one
# greedy target-only run of tandem-generate on the tiny pair.
GEN_BIN=$BUILD_DIR/tools/generate/tandem-generate
MK_BIN=$BUILD_DIR/tools/make_model/tandem-make-model
if [ -z "$SANITIZER" ]; then
    record "compute-sanitizer (device sampling)" SKIP "not installed"
elif [ ! -x "$GEN_BIN" ] || [ ! -x "$MK_BIN" ]; then
    record "compute-sanitizer (device sampling)" SKIP "tandem-generate or tandem-make-model was not built"
else
    SAN_MODELS=$LOG_DIR/sanitizer-models
    if "$MK_BIN" --preset tiny-draft --out "$SAN_MODELS/draft" --seed 1 >/dev/null 2>&1 &&
        "$MK_BIN" --preset tiny --out "$SAN_MODELS/target" --derive-from "$SAN_MODELS/draft" \
            --noise 0.02 --seed 1 >/dev/null 2>&1; then
        run_step "compute-sanitizer memcheck (device sampling)" "sanitizer-memcheck-devsample.log" \
            "$SANITIZER" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99 \
            "$GEN_BIN" --backend cuda --device "${TANDEM_CUDA_DEVICE:-0}" --model "$SAN_MODELS/target" \
            --draft "$SAN_MODELS/draft" --spec-k 3 --temperature 0.9 --top-p 0.95 --seed 5 \
            --ids 1,2,3 --max-tokens 24 --json
        run_step "compute-sanitizer memcheck (device greedy)" "sanitizer-memcheck-devgreedy.log" \
            "$SANITIZER" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99 \
            "$GEN_BIN" --backend cuda --device "${TANDEM_CUDA_DEVICE:-0}" --model "$SAN_MODELS/target" \
            --temperature 0 --ids 1,2,3 --max-tokens 24 --json
    else
        record "compute-sanitizer (device sampling)" FAIL "tandem-make-model could not write the tiny pair"
    fi
fi

# ---- the batch-invariant GEMM against cuBLAS (figures, not a gate) ----------
BENCH_BIN=$BUILD_DIR/tools/bench_kernels/tandem-bench-kernels
if [ -x "$BENCH_BIN" ]; then
    run_step "bench-kernels --backend cuda" "bench-kernels-cuda.log" \
        "$BENCH_BIN" --backend cuda --device "${TANDEM_CUDA_DEVICE:-0}" &&
        sed -n '/batch-invariant GEMM (auto) vs cuBLAS/,/aim: >= 90%/p' "$LOG_DIR/bench-kernels-cuda.log"
else
    record "bench-kernels --backend cuda" SKIP "tandem-bench-kernels was not built"
fi

# ---- the runtime on the GPU (figures; the rows check that it runs) ----------
# A small preset, so the rows are quick. The issue's full runtime benchmark
# (generates 2.5 + 6.4 GB of weights into bench-models on its first run):
#   $BUILD_DIR/tools/bench/tandem-bench runtime --backend cuda --device 0 \
#       --presets llama-3.2-1b,llama-3.2-3b --tokens 128 --models bench-models
# and speculative decoding with device sampling in both halves:
#   $BUILD_DIR/tools/bench/tandem-bench spec --backend cuda --device 0
# Exit 77 here would mean the benchmark found no GPU on a machine that has
# one: a failure.
RT_BENCH_BIN=$BUILD_DIR/tools/bench/tandem-bench
if [ -x "$RT_BENCH_BIN" ]; then
    run_step "bench runtime --backend cuda" "bench-runtime-cuda.log" \
        "$RT_BENCH_BIN" runtime --backend cuda --device "${TANDEM_CUDA_DEVICE:-0}" \
        --presets small --tokens 32 --models "$BUILD_DIR/bench-models" &&
        grep -vE '^tandem-bench: generating' "$LOG_DIR/bench-runtime-cuda.log"
    run_step "bench spec --backend cuda" "bench-spec-cuda.log" \
        "$RT_BENCH_BIN" spec --backend cuda --device "${TANDEM_CUDA_DEVICE:-0}" \
        --noise 0.05 --ks 1,4,0 --modes 1 --tokens 32 --models "$BUILD_DIR/bench-models" &&
        grep -vE '^tandem-bench: generating' "$LOG_DIR/bench-spec-cuda.log"
else
    record "bench runtime --backend cuda" SKIP "tandem-bench was not built"
fi

# ---- ASan build (optional) -------------------------------------------------
if [ "$ASAN" = 1 ]; then
    build_and_test "$BUILD_DIR-asan" asan -DTANDEM_SANITIZE=ON
fi

finish "$FAILED"
