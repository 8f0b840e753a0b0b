#!/usr/bin/env bash
# The test command: installs dependencies, builds everything under
# AddressSanitizer + UndefinedBehaviorSanitizer (CUDA compiled and linked when
# the toolkit is present), and runs the whole suite with CTest. The suite
# replays the fuzz corpora and regressions (tests/fuzz, label unit).
# In CI (CI=true) with clang present it then runs every fuzz target for a
# bounded time (scripts/fuzz.sh): FUZZ_TIME_CI seconds each, default 30.
# Why 30 s: ten targets x 30 s = 5 minutes of fuzzing, plus about a minute
# and a half to build them with clang, keeps the step near 6.5 minutes; and
# started from the seeds, 15-30 s already reach 85-100% of the coverage (cov:)
# that 4-10 minutes reach, so the run catches a parser change that crashes on
# nearby inputs. Long campaigns are run by hand: scripts/fuzz.sh -t 600.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build="$root/build-test"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON \
      -DTANDEM_NATIVE=OFF -DTANDEM_CUDA=AUTO
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
if [[ ${CI:-} == true ]] && command -v clang >/dev/null; then
  "$root/scripts/fuzz.sh" -t "${FUZZ_TIME_CI:-30}"
fi
