#!/usr/bin/env bash
# Lays out nanscope's C++ by .clang-format, or with --check lists the files that
# differ and fails (CTest runs the check: Style.ClangFormat).
# Usage: scripts/format.sh [--check]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
clang_format=$(command -v clang-format || true)
[ -n "$clang_format" ] || { echo "format.sh: clang-format not found (apt-get install clang-format)"; exit 2; }
# Tracked files and new ones not yet added (not the ignored build folders): a
# file formatted only once it is tracked would fail the check in a clean clone.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.c' '*.h')
if [ "${1:-}" = "--check" ]; then
  # One clang-format for every file (one per file took 44 s, most of it in
  # starting 383 processes); it names each file that differs in its errors.
  status=0
  errors=$("$clang_format" --dry-run --Werror "${files[@]}" 2>&1 >/dev/null) || status=$?
  mapfile -t bad < <(printf '%s\n' "$errors" |
    sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'not laid out by .clang-format (run scripts/format.sh):\n'; printf '  %s\n' "${bad[@]}"; exit 1
  fi
  if [ "$status" != 0 ]; then  # not a layout: .clang-format or a file it cannot read
    printf '%s\n' "$errors"; echo "format.sh: clang-format failed (exit $status)"; exit 2
  fi
  echo "format.sh: ${#files[@]} files follow .clang-format"
else
  "$clang_format" -i "${files[@]}"
fi
