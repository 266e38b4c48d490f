#!/usr/bin/env bash
# The viewer on a run of 100,000 steps x 256 layers: open time and per-frame
# model work (bench/viewer_scale.cpp), then nanscope-view's own frame-build
# time in a real window under Xvfb. Usage: bench/viewer_scale.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
cmake --build "$build" --target viewer_scale  # not in the default build
run=$(mktemp -d)/run.h5
"$build/bench/viewer_scale" "$run"
start=$(date +%s.%N)
xvfb-run -a -s "-screen 0 1600x1000x24" "$build/viewer/nanscope-view" "$run" \
  --screenshot "${run%.h5}.png" --frames 120 | head -1
echo "nanscope-view: start, open, 120 frames and the screenshot in $(echo "$(date +%s.%N) - $start" | bc) s"
rm -rf "$(dirname "$run")"
