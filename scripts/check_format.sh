#!/usr/bin/env bash
# Checks that every C++ source of weft is formatted with .clang-format (whole tree, as CAF does).
#   scripts/check_format.sh          report files that differ (exit 1 if any)
#   scripts/check_format.sh --fix    format them in place
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fmt="$(command -v clang-format || command -v clang-format-14 || true)"
if [ -z "$fmt" ]; then
  echo "check_format: clang-format is not installed (apt-get install clang-format)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' | grep -v '^gpu/internal/tokenizer_unicode_data.cpp$')
if [ "${1:-}" = "--fix" ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "check_format: ${#files[@]} files formatted"
exit "$bad"
