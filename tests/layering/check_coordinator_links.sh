#!/usr/bin/env bash
# The coordinator binary must contain no model (llama_*, safetensors_*),
# kernel (kern_*) or speculation-engine (specdec_*) code and load no CUDA
# library. Fails naming what it found.
set -euo pipefail
bin=${1:?usage: check_coordinator_links.sh PATH-TO-tandem-coordinator}
bad=$(nm -C "$bin" | awk '{print $NF}' | grep -E '^(llama_|kern_|safetensors_|specdec_|cuda)' | sort -u || true)
if [ -n "$bad" ]; then
    echo "FAIL: tandem-coordinator contains model/kernel code:"; echo "$bad" | head -20; exit 1
fi
libs=$(ldd "$bin" | grep -Ei 'cudart|cublas|libcuda' || true)
if [ -n "$libs" ]; then
    echo "FAIL: tandem-coordinator loads CUDA libraries:"; echo "$libs"; exit 1
fi
n=$(nm "$bin" | grep -cE ' T (intake_|registry_|scheduler_|adaptive_k_)' || true)
if [ "$n" -lt 4 ]; then
    echo "FAIL: tandem-coordinator looks stripped or wrong ($n coordinator symbols): cannot check it"; exit 1
fi
echo "ok: tandem-coordinator links no model, kernel or CUDA code ($n coordinator symbols checked)"
