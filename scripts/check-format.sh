#!/usr/bin/env bash
# Fails when a C++/CUDA source is not formatted as .clang-format says (clang-format from
# Debian's packages, installed by install-deps). FIX=1 formats the files in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | grep -v '^bench/')
if [ "${FIX:-0}" = 1 ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "check-format: the files above are not formatted; run FIX=1 scripts/check-format.sh" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
