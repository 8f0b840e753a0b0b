#!/usr/bin/env bash
# fetch_debs.sh: downloads, on a machine with apt, the Debian packages that
# run_gpu_tests.sh --debs unpacks on a bare GPU image (which has CUDA, cmake
# and python3 but none of the project's libraries, and no network).
#
# Usage: tests/gpu/fetch_debs.sh [DIR]   (default <source>/.deps/gpu-debs,
#                                         which git ignores)
# Then, with the device tool: carry DIR (relative to the source) and run
#   tests/gpu/run_gpu_tests.sh --debs DIR
#
# What it fetches: the -dev packages the build needs (headers, .pc files,
# link symlinks) without their own dependencies, and the runtime libraries
# with the closure of what they depend on, but for the C and C++ runtime
# (libc6, libgcc-s1, libstdc++6 and gcc's base package), which must be the
# image's own. run_gpu_tests.sh keeps an unpacked library only where the
# image lacks that soname, so fetching more than the image needs is harmless.
# Exit status: 0, or 1 when apt could not download a package (the message
# names it; `apt-get update` first on a fresh machine).
set -u

SRC_DIR=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$SRC_DIR/.deps/gpu-debs}
case "${1:-}" in -h|--help) sed -n '2,19p' "$0"; exit 0 ;; esac

DEV_PACKAGES="libzmq3-dev libcjson-dev libpcre2-dev libcmocka-dev libmicrohttpd-dev"
RUNTIME_PACKAGES="libzmq5 libcjson1 libpcre2-8-0 libcmocka0 libmicrohttpd12 pkgconf"
IMAGE_OWN="libc6 libgcc-s1 libstdc++6 gcc-12-base gcc-13-base gcc-14-base"

for tool in apt-get apt-cache; do
    command -v "$tool" >/dev/null 2>&1 || { echo "fetch_debs: $tool not found (a Debian or Ubuntu machine is needed)" >&2; exit 1; }
done

closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances $RUNTIME_PACKAGES 2>/dev/null | grep -E '^[a-z0-9]' | sort -u)
[ -n "$closure" ] || { echo "fetch_debs: apt-cache knows none of: $RUNTIME_PACKAGES (run apt-get update)" >&2; exit 1; }
wanted=$DEV_PACKAGES
for pkg in $closure; do
    case " $IMAGE_OWN " in *" $pkg "*) continue ;; esac
    wanted="$wanted $pkg"
done

mkdir -p "$DIR" || exit 1
rm -f "$DIR"/*.deb
# apt downloads as the _apt user where it can write the folder, as root (with
# a warning) where it cannot
chmod a+rwx "$DIR" 2>/dev/null
for pkg in $wanted; do
    if ! (cd "$DIR" && apt-get download "$pkg" >/dev/null 2>"$DIR/.apt-error"); then
        echo "fetch_debs: apt-get download $pkg failed:" >&2
        cat "$DIR/.apt-error" >&2
        rm -f "$DIR/.apt-error"
        exit 1
    fi
done
rm -f "$DIR/.apt-error"
count=$(ls "$DIR"/*.deb | wc -l)
size=$(du -sh "$DIR" | cut -f1)
echo "fetch_debs: $count packages ($size) in $DIR"
rel=${DIR#"$SRC_DIR"/}
echo "on the GPU machine: carry \"$rel\" and run tests/gpu/run_gpu_tests.sh --debs $rel"
