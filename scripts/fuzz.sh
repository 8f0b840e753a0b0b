#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/fuzzing.md) one after the
# other, each for a bounded time, and fails when any of them crashes.
#
#   scripts/fuzz.sh [-t SECONDS] [TARGET...]
#
#   -t SECONDS  time per target (default $FUZZ_TIME or 60), libFuzzer's
#               -max_total_time
#   TARGET      safetensors safetensors_index model_config tokenizer_json
#               tokenizer_encode request worker_msg proc_config openai lane
#               grammar_schema grammar_gbnf (default: all)
#
# Builds build-fuzz with clang (TANDEM_FUZZ=ON: ASan + UBSan + coverage) if
# needed. Each target starts from its seeds and regressions (tests/fuzz/corpus/
# and regressions/, never written to) plus a working corpus kept in
# build-fuzz/fuzz-corpus/<target>/ between runs. A crash, leak, timeout or
# out-of-memory input is written to tests/fuzz/crashes/<target>/ (not tracked
# by git: fix the parser, then move the input to regressions/<target>/).
# Exit status: 0 when every target ran clean, 1 when any found something,
# 2 on a usage or build error. FUZZ_JOBS=N runs N targets at once (default 1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all_targets=(safetensors safetensors_index model_config tokenizer_json tokenizer_encode request
             worker_msg proc_config openai lane grammar_schema grammar_gbnf)
time_s=${FUZZ_TIME:-60}
while getopts "t:h" opt; do
  case $opt in
    t) time_s=$OPTARG ;;
    h) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
[[ $time_s =~ ^[0-9]+$ && $time_s -ge 1 ]] || { echo "fuzz: -t: not a positive integer: $time_s" >&2; exit 2; }
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target $t" >&2; exit 2; }
done
command -v clang >/dev/null || { echo "fuzz: clang not found (scripts/install-deps.sh installs it)" >&2; exit 2; }

build="$root/build-fuzz"
# CC applies only to a new build directory; an existing one configured with
# another compiler is refused by CMakeLists.txt (TANDEM_FUZZ needs clang).
CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON \
      -DTANDEM_CUDA=OFF -DTANDEM_NATIVE=OFF >/dev/null || exit 2
cmake --build "$build" -j"$(nproc)" --target fuzz_targets >/dev/null || exit 2

fuzz_dir="$root/tests/fuzz"
run_one() {
  local t=$1 exe="$build/tests/fuzz/fuzz_$1"
  local work="$build/fuzz-corpus/$t" crashes="$fuzz_dir/crashes/$t" log="$build/fuzz-logs/$t.log"
  mkdir -p "$work" "$crashes" "$(dirname "$log")"
  local seeds=("$fuzz_dir/corpus/$t")
  [[ -d $fuzz_dir/regressions/$t ]] && seeds+=("$fuzz_dir/regressions/$t")
  local before after rc=0
  before=$(find "$crashes" -type f | wc -l)
  touch "$log.start"
  # -timeout: one input over 10 s is a hang; -rss_limit_mb: a parser that
  # allocates gigabytes for a small file is a bug too. ASan's leak check
  # stays on (a leak is reported like a crash).
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$exe" -max_total_time="$time_s" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
           -print_final_stats=1 -artifact_prefix="$crashes/" "$work" "${seeds[@]}" >"$log" 2>&1 || rc=$?
  after=$(find "$crashes" -type f | wc -l)
  local stats
  stats=$(grep -aE '^#[0-9]+.*(DONE|cov:)' "$log" | tail -1 || true)
  if ((rc != 0 || after > before)); then
    echo "fuzz: $t: FOUND SOMETHING (exit $rc); log $log, inputs in $crashes" >&2
    # CI keeps only what is printed: the report's stack and the input itself
    # (base64) make a find reproducible without the machine it ran on.
    awk '/ERROR: |runtime error/ {on = 1} on && n < 40 {print; n++}' "$log" >&2 || true
    local f
    for f in $(find "$crashes" -type f -newer "$log.start" 2>/dev/null | head -3); do
      echo "fuzz: $t: input $(basename "$f") ($(stat -c %s "$f") bytes), base64:" >&2
      head -c 4096 "$f" | base64 -w 0 >&2; echo >&2
    done
    return 1
  fi
  echo "fuzz: $t: clean after ${time_s}s: ${stats#*\#}"
}

failed=0
n_failed=0
jobs=${FUZZ_JOBS:-1}
if ((jobs <= 1)); then
  for t in "${targets[@]}"; do run_one "$t" || { failed=1; n_failed=$((n_failed + 1)); }; done
else
  pids=()
  for t in "${targets[@]}"; do
    run_one "$t" & pids+=($!)
    if ((${#pids[@]} >= jobs)); then
      wait "${pids[0]}" || { failed=1; n_failed=$((n_failed + 1)); }
      pids=("${pids[@]:1}")
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || { failed=1; n_failed=$((n_failed + 1)); }; done
fi
# The plain closing line CI reads: one entry per fuzz target.
echo "fuzz: $((${#targets[@]} - n_failed)) passed, $n_failed failed"
exit $failed
