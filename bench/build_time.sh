#!/usr/bin/env bash
# How long a new user's first build takes: a fresh clone of REPO's HEAD (default:
# this repository), configured and built as scripts/build.sh does, with ccache
# off. Prints the cold-build wall time and compiler time, the ten slowest steps
# from .ninja_log, and the time to rebuild after touching the training step's .cpp
# (core/src/step/train_step.cpp, which every program links).
#
# Usage: bench/build_time.sh [REPO] [CMAKE_ARG...]
#   JOBS=N      parallel jobs (default: all cores)
#   KEEP=1      keep the clone (its path is printed)
# Run it on a quiet machine: the figures are wall-clock.
set -euo pipefail
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
shift || true
jobs=${JOBS:-$(nproc)}
work=$(mktemp -d /tmp/nanscope-build-time.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/src"
export CCACHE_DISABLE=1
echo "build_time: $(git -C "$work/src" log -1 --format='%h %s' | cut -c1-72)"
echo "build_time: $(nproc) cores, $jobs jobs, ccache off, $work/src"

TIMEFORMAT='%R %U %S'
timed() {  # timed NAME CMD...: runs CMD, leaves "wall user sys" in $NAME
  local name=$1 log=$work/$1.log t
  shift
  { t=$( { time "$@" >"$log" 2>&1; } 2>&1 ); } || { tail -30 "$log"; exit 1; }
  printf -v "$name" '%s' "$t"
}
timed configure cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
timed cold ninja -C "$work/build" -j"$jobs"
read -r wall user sys <<<"$cold"
steps=$(awk 'NR > 1' "$work/build/.ninja_log" | wc -l)
echo "configure: $(cut -d' ' -f1 <<<"$configure") s"
awk -v w="$wall" -v u="$user" -v s="$sys" -v n="$steps" 'BEGIN {
  printf "cold build: %.1f s wall, %.0f s compiler CPU (user %.0f + sys %.0f), %d steps\n", w, u + s, u, s, n }'
echo "ten slowest steps (s):"
awk 'NR > 1 { printf "%8.1f  %s\n", ($2 - $1) / 1000, $4 }' "$work/build/.ninja_log" | sort -rn | sed -n 1,10p  # sed reads all: no SIGPIPE under pipefail

# One .cpp every program links (the training step): a name that no longer
# exists must fail here, not time a no-op.
touched=core/src/step/train_step.cpp
[ -f "$work/src/$touched" ] || { echo "build_time: $touched is gone: name another .cpp" >&2; exit 1; }
touch "$work/src/$touched"
before=$(wc -l <"$work/build/.ninja_log")
timed incremental ninja -C "$work/build" -j"$jobs"
rebuilt=$(( $(wc -l <"$work/build/.ninja_log") - before ))
[ "$rebuilt" -gt 0 ] || { echo "build_time: touching $touched rebuilt nothing" >&2; exit 1; }
echo "rebuild after touching $touched: $(cut -d' ' -f1 <<<"$incremental") s wall, $rebuilt steps"
