#!/usr/bin/env bash
# The worker processes hold no CUDA code: draft_worker/, target_worker/ and
# worker/ reach the transports through common/xfer and the kernels through
# the engine, so none of their sources may include a CUDA header, call a
# kern_cuda_* entry point or fork on TANDEM_HAVE_CUDA. Fails naming each
# line it found.
set -euo pipefail
src=${1:?usage: check_workers_hold_no_cuda.sh SOURCE_DIR}
n=0
for dir in draft_worker target_worker worker; do
    [ -d "$src/$dir" ] || { echo "FAIL: $src/$dir does not exist: cannot check it"; exit 1; }
    n=$((n + $(find "$src/$dir" -name '*.[ch]' | wc -l)))
done
[ "$n" -ge 6 ] || { echo "FAIL: only $n sources under the worker folders: cannot check them"; exit 1; }
bad=$(cd "$src" && grep -nE 'TANDEM_HAVE_CUDA|kernels_cuda\.h|cuda_runtime|cublas|\bkern_cuda_' \
          draft_worker/*.[ch] target_worker/*.[ch] worker/*.[ch] || true)
if [ -n "$bad" ]; then
    echo "FAIL: the worker processes hold CUDA code (it belongs in common/xfer or the kernels):"
    echo "$bad"
    exit 1
fi
echo "ok: $n sources of draft_worker/, target_worker/ and worker/ hold no CUDA code"
