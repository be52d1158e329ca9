#!/usr/bin/env bash
# The formatting check scripts/test.sh runs: every C++ file git tracks (*.cc, *.h, *.cu, *.cuh) is as
# clang-format writes it with the root's .clang-format (Debian's clang-format 14, which scripts/setup.sh
# installs). Prints the files that are not and exits 1; `scripts/check_format.sh --fix` rewrites them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh)" >&2; exit 1; }

mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]} > 0)); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not clang-format clean (scripts/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: ${#files[@]} files clang-format clean ($(clang-format --version | sed 's/^[^0-9]*//'))"
