#!/usr/bin/env bash
# The systemd unit (deploy/systemd/tandem.service) passes `systemd-analyze
# verify` with its binary paths pointed at this tree; a unit with a broken
# line fails it (so the check can fail). Skipped (77) where systemd-analyze
# is not installed.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not installed: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
unit="$src/deploy/systemd/tandem.service"
sed "s#/opt/tandem/bin/tandem-supervisor#$src/deploy/tandem-supervisor#g" "$unit" > "$dir/tandem.service"
if ! out=$(systemd-analyze verify "$dir/tandem.service" 2>&1) || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify $unit:"
    echo "$out"
    exit 1
fi
sed 's#^ExecStart=.*#ExecStart=relative/tandem-supervisor run#' "$dir/tandem.service" > "$dir/broken.service"
if systemd-analyze verify "$dir/broken.service" >/dev/null 2>&1; then
    echo "FAIL: a unit whose ExecStart is a relative path passed systemd-analyze verify"
    exit 1
fi
echo "deploy/systemd/tandem.service: systemd-analyze verify clean"
