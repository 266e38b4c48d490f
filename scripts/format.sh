#!/usr/bin/env bash
# Lays out nanscope's C++ by .clang-format, or with --check lists the files that
# differ and fails (CTest runs the check: Style.ClangFormat).
# Usage: scripts/format.sh [--check]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
clang_format=$(command -v clang-format || true)
[ -n "$clang_format" ] || { echo "format.sh: clang-format not found (apt-get install clang-format)"; exit 2; }
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.c' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$clang_format" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'not laid out by .clang-format (run scripts/format.sh):\n'; printf '  %s\n' "${bad[@]}"; exit 1
  fi
  echo "format.sh: ${#files[@]} files follow .clang-format"
else
  "$clang_format" -i "${files[@]}"
fi
