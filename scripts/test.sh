#!/usr/bin/env bash
# Builds weft and runs every test tier: unit, integration, chaos, oracle (release build, gcc) and
# fuzz (libFuzzer targets, clang build); builds the Debian package (package preset, cpack) and
# checks it (scripts/check_deb.sh). Installs what it needs first (scripts/setup.sh --test).
# Safe to run again.
#   scripts/test.sh                 everything
#   scripts/test.sh -L unit         extra arguments go to the release build's ctest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh" --test
"$root/scripts/build.sh" release
"$root/scripts/build.sh" fuzz
echo "[test] libFuzzer targets (clang build)"
ctest --test-dir "$root/build/fuzz" --output-on-failure --no-tests=error -L fuzz
echo "[test] Debian package: package preset, cpack, scripts/check_deb.sh"
"$root/scripts/build.sh" package
rm -rf "$root/build/package/packages"
cpack --preset package >/dev/null
bash "$root/scripts/check_deb.sh" "$(ls "$root"/build/package/packages/weft_*.deb)"
echo "[test] release build: every tier"
ctest --test-dir "$root/build/release" --output-on-failure --no-tests=error "$@"
