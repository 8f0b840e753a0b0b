#!/usr/bin/env bash
# The test command: installs dependencies, builds everything under
# AddressSanitizer + UndefinedBehaviorSanitizer (CUDA compiled and linked when
# the toolkit is present), and runs the whole suite with CTest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build="$root/build-test"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON \
      -DTANDEM_NATIVE=OFF -DTANDEM_CUDA=AUTO
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
