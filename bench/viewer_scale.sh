#!/usr/bin/env bash
# The viewer on long runs of 256 layers: 100,000 and 1,000,000 steps. For
# each, bench/viewer_scale.cpp prints the open time (with and without the
# crash rehearsal), the memory, the per-frame model work while panning and
# zooming, and a live run followed at 1,000 steps/s; then nanscope-view
# itself opens the file in a real window under Xvfb and says when its first
# frame was drawn. Each figure is printed against its budget.
# Usage: bench/viewer_scale.sh [BUILD_DIR]   (writes ~2.5 GB under $TMPDIR)
set -euo pipefail
build=${1:-build}
cmake --build "$build" --target viewer_scale nanscope-view  # viewer_scale is not in the default build
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for steps in 100000 1000000; do
  echo "== $steps steps x 256 layers"
  run=$dir/run-$steps.h5
  "$build/bench/viewer_scale" "$run" "$steps" 256
  for i in 1 2 3; do
    xvfb-run -a -s "-screen 0 1600x1000x24" /usr/bin/time -f "nanscope-view: peak memory %M KiB (budget 524288)" \
      "$build/viewer/nanscope-view" "$run" --screenshot "$dir/shot.png" --frames 120 2>&1 |
      grep -E "^opened|peak memory|frame build" | sed "s/^/  run $i: /"
  done
  rm -f "$run"
done
echo "(nanscope-view's 'first frame drawn' budget: 1000 ms; its frame build median covers ImGui's side of 120 frames)"
