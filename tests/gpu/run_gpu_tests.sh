#!/usr/bin/env bash
# run_gpu_tests.sh: the GPU checks in stages, each bounded in time, run from
# programs built elsewhere (tests/gpu/pack.sh): a GPU machine lent for 15
# minutes runs the stages that matter most first and compiles nothing.
#
# Usage: tests/gpu/run_gpu_tests.sh --plan
#        tests/gpu/run_gpu_tests.sh --stage NAME[,NAME...]|all [--pack DIR | --build DIR]
#                                   [--out DIR] [--logs DIR]
#   --plan       print one line per stage, "STAGE <name> <budget_s>", in the
#                order a short window runs them, and exit 0
#   --stage      run the named stages (all: every stage, in plan order)
#   --pack DIR   programs, libraries and tokenizer files from tests/gpu/pack.sh
#                (default <source>/.deps/gpu-pack when it exists)
#   --build DIR  a CUDA build tree instead of a pack (a GPU machine with the
#                project's libraries installed)
#   --out DIR    one JSON result per stage (<stage>.json: stage, status,
#                budget_s, elapsed_s, steps [{name, status, elapsed_s,
#                detail}]), summary.txt and logs.tgz (every step's log)
#   --logs DIR   where the steps' logs go (default a new folder under /tmp)
#   --max-stage-s N  cap every stage's budget at N seconds (a shorter window)
# Environment: TANDEM_CUDA_DEVICE (default 0), NVIDIA_SMI (the nvidia-smi to
#   ask, default the one on PATH: a test puts a stand-in there).
# Exit status: 0 when every step of the stages passed (a SKIP row is allowed
#   only where a tool the image may lack is missing: MPS, nsys), 1 when a
#   step failed or ran out of its time, 77 when no GPU is visible (one line
#   on stdout says why), 2 on a usage error.
#
# A GPU test's exit 77 ("no usable GPU") is a FAIL here: where nvidia-smi
# lists a GPU, a GPU call that fails is a failure, never a skip.
set -u

SRC_DIR=$(cd "$(dirname "$0")/../.." && pwd)
STAGES_ORDER="smoke correctness pipeline sanitize bench"
declare -A BUDGET=([smoke]=120 [correctness]=420 [pipeline]=420 [sanitize]=420 [bench]=420)

usage() { sed -n '2,29p' "$0" >&2; exit 2; }

PLAN=0 STAGES="" PACK="" BUILD="" OUT_DIR="" LOGS="" MAX_STAGE_S=""
while [ $# -gt 0 ]; do
    case "$1" in
    --plan) PLAN=1 ;;
    --stage) [ $# -ge 2 ] || usage; STAGES=$2; shift ;;
    --pack) [ $# -ge 2 ] || usage; PACK=$2; shift ;;
    --build) [ $# -ge 2 ] || usage; BUILD=$2; shift ;;
    --out) [ $# -ge 2 ] || usage; OUT_DIR=$2; shift ;;
    --logs) [ $# -ge 2 ] || usage; LOGS=$2; shift ;;
    --max-stage-s) [ $# -ge 2 ] || usage; MAX_STAGE_S=$2; shift ;;
    -h|--help) usage ;;
    *) echo "run_gpu_tests: unknown argument $1" >&2; usage ;;
    esac
    shift
done

if [ "$PLAN" = 1 ]; then
    for s in $STAGES_ORDER; do echo "STAGE $s ${BUDGET[$s]}"; done
    exit 0
fi
[ -n "$STAGES" ] || { echo "run_gpu_tests: --plan or --stage NAME is needed" >&2; usage; }
[ "$STAGES" = all ] && STAGES=${STAGES_ORDER// /,}
for s in ${STAGES//,/ }; do
    [ -n "${BUDGET[$s]:-}" ] || { echo "run_gpu_tests: no stage '$s' (stages: $STAGES_ORDER)" >&2; exit 2; }
    if [ -n "$MAX_STAGE_S" ]; then
        [[ $MAX_STAGE_S =~ ^[0-9]+$ ]] || { echo "run_gpu_tests: --max-stage-s takes seconds, got '$MAX_STAGE_S'" >&2; exit 2; }
        [ "${BUDGET[$s]}" -gt "$MAX_STAGE_S" ] && BUDGET[$s]=$MAX_STAGE_S
    fi
done

# ---- the GPU, before anything else -------------------------------------------
SMI=${NVIDIA_SMI:-$(command -v nvidia-smi 2>/dev/null)}
if [ -z "$SMI" ] || [ ! -x "$SMI" ]; then
    echo "no GPU: nvidia-smi not found (no NVIDIA driver on this machine)"
    exit 77
fi
if ! "$SMI" -L 2>/dev/null | grep -q '^GPU'; then
    echo "no GPU: nvidia-smi lists no GPU"
    exit 77
fi

# ---- programs: a pack or a build tree ------------------------------------------
if [ -z "$PACK" ] && [ -z "$BUILD" ] && [ -d "$SRC_DIR/.deps/gpu-pack" ]; then
    PACK=$SRC_DIR/.deps/gpu-pack
fi
if [ -n "$PACK" ]; then
    PACK=$(cd "$PACK" 2>/dev/null && pwd) || { echo "run_gpu_tests: no pack at $PACK (tests/gpu/pack.sh makes it)" >&2; exit 1; }
    BUILD=$PACK/build
    # The image's own CUDA libraries, then what the pack brought for the rest.
    export LD_LIBRARY_PATH=$PACK/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TANDEM_DEPS_DIR=$PACK/deps
    # CUDA's libraries where the image keeps them outside the loader's path
    # (the toolkit's lib folder, PyTorch's nvidia wheels)
    for so in $(ldd "$BUILD/tools/generate/tandem-generate" 2>/dev/null | awk '/not found/ { print $1 }'); do
        found=$(find /usr/local /opt /usr/lib -name "$so" 2>/dev/null | head -n 1)
        if [ -n "$found" ]; then
            export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:${found%/*}
        else
            echo "run_gpu_tests: $so, which the programs need, is nowhere on this machine" >&2
        fi
    done
else
    [ -n "$BUILD" ] || { echo "run_gpu_tests: no --pack or --build, and no $SRC_DIR/.deps/gpu-pack" >&2; exit 1; }
    BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "run_gpu_tests: no build at $BUILD" >&2; exit 1; }
    export TANDEM_DEPS_DIR=$SRC_DIR/.deps
fi
export TANDEM_BUILD_DIR=$BUILD TANDEM_SOURCE_DIR=$SRC_DIR PYTHONUNBUFFERED=1
export TANDEM_CUDA_DEVICE=${TANDEM_CUDA_DEVICE:-0}
DEV=$TANDEM_CUDA_DEVICE
LOGS=${LOGS:-$(mktemp -d /tmp/tandem-gpu-logs.XXXXXX)}
mkdir -p "$LOGS" || exit 1
[ -z "$OUT_DIR" ] || mkdir -p "$OUT_DIR" || exit 1
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
MODELS=$LOGS/models

# ---- steps ---------------------------------------------------------------------
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
FAILED=0
STAGE="" STAGE_T0=0 ROWS=""

record() { # name status elapsed_s detail
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$ROWS"
    printf '%-12s %-44s %-5s %6ss  %s\n' "$STAGE" "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"
    [ "$2" = FAIL ] && FAILED=1
}

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in a log of its
# own, bounded by TIMEOUT_S and by what is left of the stage's budget. Lines
# "SKIP <what>: <reason>" in its output become SKIP rows of their own.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((STAGE_T0 + BUDGET[$STAGE] - $(date +%s)))
    local log=$LOGS/$STAGE-$(tr -c 'A-Za-z0-9_.-' '_' <<<"$name" | sed 's/_*$//').log
    if [ "$left" -le 5 ]; then
        record "$name" FAIL 0 "not run: the stage's ${BUDGET[$STAGE]} s were spent"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "---- $STAGE / $name (at most ${limit} s): $*" >&2
    # timeout runs programs, not this script's functions: those run in a
    # bash that inherits them (export -f below)
    declare -F "$1" >/dev/null && set -- bash -c '"$@"' _ "$@"
    local t0 rc
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    grep -E '^SKIP [^:]+: ' "$log" | while IFS= read -r line; do
        local what=${line#SKIP }
        record "  ${what%%:*}" SKIP 0 "${what#*: }"
    done
    # the pipeline's variants, one row each ("pipeline-row: NAME PASS|FAIL detail")
    grep -E '^pipeline-row: [^ ]+ (PASS|FAIL) ' "$log" | while read -r _ vname vstatus vdetail; do
        record "  $vname" "$vstatus" 0 "$vdetail"
    done
    local last
    last=$(grep -vE '^\s*$' "$log" | tail -n 1 | cut -c1-160)
    case $rc in
    0) record "$name" PASS "$took" "$last" ;;
    124|137) record "$name" FAIL "$took" "timed out after ${limit} s; $(basename "$log")" ;;
    77) record "$name" FAIL "$took" "exit 77 (no usable GPU) where nvidia-smi lists one: $last" ;;
    *) record "$name" FAIL "$took" "exit $rc: $last" ;;
    esac
    [ "$rc" -eq 0 ] || { echo "---- $STAGE / $name: exit $rc, its log's end:" >&2; tail -n 30 "$log" >&2; }
    return $rc
}

# A tiny draft/target pair for the steps that need a model of their own.
tiny_pair() {
    [ -f "$MODELS/target/config.json" ] && return 0
    "$BUILD/tools/make_model/tandem-make-model" --preset tiny-draft --out "$MODELS/draft" --seed 1 &&
        "$BUILD/tools/make_model/tandem-make-model" --preset tiny --out "$MODELS/target" \
            --derive-from "$MODELS/draft" --noise 0.02 --seed 1
}

sanitized() { # tool program args...
    local tool=$1
    shift
    [ -x "$SANITIZER" ] || { echo "compute-sanitizer not found at $SANITIZER"; return 1; }
    local extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    local level=1
    [ "$tool" = racecheck ] && level=2
    # --report-api-errors no: the tests make failing calls on purpose (a 1 PiB
    # cudaMalloc) and check their codes themselves
    TANDEM_GPU_TEST_SHORT=$level "$SANITIZER" --tool "$tool" $extra --report-api-errors no --error-exitcode 99 "$@"
}

stage_smoke() {
    # the probe says "no CUDA device" and exits 0 where the runtime sees none
    step "device query" 30 sh -c '"$1" --query-gpu=name,uuid,driver_version,memory.total --format=csv &&
        out=$("$2/tools/cuda_probe/tandem-cuda-probe") && echo "$out" &&
        case "$out" in *"test kernel ran"*) ;; *) exit 1 ;; esac' _ "$SMI" "$BUILD"
    step "ops vs cpu, small shapes" 60 env TANDEM_GPU_TEST_SHORT=1 "$BUILD/tests/gpu/test_cuda_kernels"
    step "generate tiny: cuda == cpu" 45 python3 "$SRC_DIR/tests/gpu/test_cuda_runtime.py" --part smoke
    step "graphs: replay == eager, bit for bit" 45 "$BUILD/tests/gpu/test_cuda_graphs"
}

stage_correctness() {
    step "kernels (batch invariance to 512 rows)" 180 "$BUILD/tests/gpu/test_cuda_kernels"
    step "sampling and accept/reject" 180 "$BUILD/tests/gpu/test_cuda_sampling"
    step "device sampling in the engine" 180 python3 "$SRC_DIR/tests/gpu/test_cuda_devsample.py"
    step "runtime: cuda == cpu, spec == target" 240 python3 "$SRC_DIR/tests/gpu/test_cuda_runtime.py" --part runtime
}

stage_pipeline() {
    step "xfer: ordering, kill -9, teardown" 120 "$BUILD/tests/gpu/test_cuda_xfer"
    step "three processes, slab and staging" 400 python3 "$SRC_DIR/tests/gpu/test_cuda_runtime.py" --part pipeline
}

stage_sanitize() {
    local t
    for t in memcheck racecheck synccheck; do
        step "$t kernels" 150 sanitized "$t" "$BUILD/tests/gpu/test_cuda_kernels"
        step "$t sampling" 120 sanitized "$t" "$BUILD/tests/gpu/test_cuda_sampling"
    done
    step "memcheck graphs" 90 sanitized memcheck "$BUILD/tests/gpu/test_cuda_graphs"
    step "tiny pair" 30 tiny_pair
    step "memcheck generate, device sampling" 60 sanitized memcheck "$BUILD/tools/generate/tandem-generate" \
        --backend cuda --device "$DEV" --model "$MODELS/target" --draft "$MODELS/draft" --spec-k 3 \
        --temperature 0.9 --top-p 0.95 --seed 5 --ids 1,2,3 --max-tokens 24 --json
    step "memcheck workers (cuda_ipc)" 200 python3 "$SRC_DIR/tests/gpu/test_cuda_runtime.py" --part sanitize
}

stage_bench() {
    # the figures issue 48 asks for first: decode against the floor with and
    # without graphs (small, 1B, 3B), then speculation on the derived 3B pair
    step "bench runtime --backend cuda" 160 "$BUILD/tools/bench/tandem-bench" runtime --backend cuda --device "$DEV" \
        --presets small,llama-3.2-1b,llama-3.2-3b --tokens 64 --models "$LOGS/bench-models"
    step "bench spec 3b pair --backend cuda" 110 "$BUILD/tools/bench/tandem-bench" spec --backend cuda --device "$DEV" \
        --pair 3b --noise 0.03 --ks 2,4,6,0 --modes 0 --tokens 96 --models "$LOGS/bench-models"
    # the same pair's weights under HF transformers (the image's torch)
    step "HF transformers beside tandem-generate, 3b pair" 70 python3 "$SRC_DIR/tools/bench/bench_hf.py" \
        --build "$BUILD" --device "$DEV" --target "$LOGS/bench-models/3b-noise-0.03" \
        --draft "$LOGS/bench-models/llama-3.2-3b-draft" --tokens 64
    step "bench-kernels --backend cuda" 40 "$BUILD/tools/bench_kernels/tandem-bench-kernels" --backend cuda --device "$DEV"
    step "bench batch --backend cuda" 35 "$BUILD/tools/bench/tandem-bench" batch --backend cuda --device "$DEV" \
        --presets small --tokens 32 --models "$LOGS/bench-models"
    if command -v nsys >/dev/null 2>&1; then
        step "nsys: one decode step" 60 nsys profile -o "$LOGS/decode" --force-overwrite true \
            "$BUILD/tools/generate/tandem-generate" --backend cuda --device "$DEV" \
            --model "$LOGS/bench-models/llama-3.2-1b" --ids 1,2,3 --max-tokens 2
    else
        record "  nsys" SKIP 0 "nsys is not on PATH"
    fi
}

export -f tiny_pair sanitized
export BUILD DEV MODELS SANITIZER

write_stage_json() { # stage status elapsed
    [ -n "$OUT_DIR" ] || return 0
    python3 - "$ROWS" "$1" "$2" "${BUDGET[$1]}" "$3" >"$OUT_DIR/$1.json" <<'EOF'
import json, sys
rows, stage, status, budget, elapsed = sys.argv[1:6]
steps = []
for line in open(rows, encoding="utf-8", errors="replace"):
    name, st, took, detail = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
    steps.append({"name": name.strip(), "status": st, "elapsed_s": int(took or 0), "detail": detail})
print(json.dumps({"stage": stage, "status": status, "budget_s": int(budget), "elapsed_s": int(elapsed),
                  "steps": steps}, indent=1))
EOF
}

echo "GPU: $("$SMI" -L | head -n 1); programs from $BUILD; logs in $LOGS" >&2
for STAGE in ${STAGES//,/ }; do
    ROWS=$LOGS/$STAGE.rows
    : >"$ROWS"
    STAGE_T0=$(date +%s)
    before=$FAILED
    FAILED=0
    "stage_$STAGE"
    status=PASS
    [ "$FAILED" = 1 ] && status=FAIL
    [ "$before" = 1 ] && FAILED=1
    write_stage_json "$STAGE" "$status" $(($(date +%s) - STAGE_T0))
done

echo
echo "==== run_gpu_tests: $STAGES ($(date -u +%FT%TZ)) ===="
cat "$SUMMARY"
if [ -n "$OUT_DIR" ]; then
    cp "$SUMMARY" "$OUT_DIR/summary.txt"
    tar -czf "$OUT_DIR/logs.tgz" -C "$LOGS" --exclude models --exclude bench-models . 2>/dev/null
fi
exit "$FAILED"
