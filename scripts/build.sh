#!/usr/bin/env bash
# Configures and builds weft with a CMake preset (default: release) into build/<preset>.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
preset="${1:-release}"
cd "$root"
# ccache keyed on paths relative to the checkout (and not on the build directory), so that another
# clone of the same commit on this machine — CI's — reuses what a build here compiled.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
jobs="${WEFT_BUILD_JOBS:-$(nproc)}"
cmake --build --preset "$preset" -j "$jobs"
