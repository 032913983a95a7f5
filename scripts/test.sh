#!/usr/bin/env bash
# Builds weft and runs every test tier (unit, integration, chaos, oracle, fuzz).
# Installs what it needs first (scripts/setup.sh --test). Safe to run again.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L unit
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh" --test
"$root/scripts/build.sh" release
if [ -f "$root/build/fuzz/build.ninja" ] || command -v clang++ >/dev/null; then
  "$root/scripts/build.sh" fuzz
fi
cd "$root/build/release"
ctest --output-on-failure --no-tests=error -j 1 "$@"
