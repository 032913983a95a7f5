#!/usr/bin/env bash
# Checks the Debian package that `cpack --preset package` built (docs/embedding.md):
# its file list, its declared dependencies, that apt can resolve them on this Debian 12 machine,
# and that a program builds against the package's files with a plain find_package(weft).
#   scripts/check_deb.sh build/package/packages/weft_*.deb
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deb="${1:?usage: check_deb.sh PACKAGE.deb}"
fail() { echo "check_deb: FAIL: $*" >&2; exit 1; }

files="$(dpkg-deb -c "$deb" | awk '{print $6}')"
for f in ./usr/bin/weft ./usr/include/weft/actors/node.hpp ./usr/include/weft/schema/control.capnp.h \
         ./usr/lib/x86_64-linux-gnu/cmake/weft/weftConfig.cmake \
         ./usr/lib/x86_64-linux-gnu/cmake/weft/weftTargets.cmake \
         ./usr/lib/x86_64-linux-gnu/pkgconfig/weft.pc; do
  grep -qxF "$f" <<<"$files" || fail "$f missing from the package"
done
for lib in schema gpu transport actors testing; do
  grep -qxF "./usr/lib/x86_64-linux-gnu/libweft_$lib.a" <<<"$files" || fail "libweft_$lib.a missing"
done
if grep -q '\.cuh$\|http_queue.hpp' <<<"$files"; then fail "internal headers in the package"; fi
echo "check_deb: $(wc -l <<<"$files") paths, every expected one present"

depends="$(dpkg-deb -f "$deb" Depends)"
echo "check_deb: Depends: $depends"
for dep in libcaf-dev libcapnp-dev libucx-dev libspdlog-dev nlohmann-json3-dev libopenblas-dev \
           libxxhash-dev libssl-dev libcpp-httplib-dev libgtest-dev libc6 libstdc++6; do
  grep -q "\\b$dep\\b" <<<"$depends" || fail "Depends lacks $dep"
done
# apt resolves every dependency (a dry run; nothing is installed).
if ! out="$(apt-get install --simulate --no-install-recommends "$(realpath "$deb")" 2>&1)"; then
  echo "$out" >&2
  fail "apt cannot install the package's dependencies"
fi
echo "check_deb: apt resolves the dependencies"

# The package's files are enough to build against: extract, find_package, build, run.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp/root"
mkdir -p "$tmp/proj"
cat >"$tmp/proj/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(from_deb LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(weft REQUIRED)
add_executable(batch_jsonl $root/examples/batch_jsonl/main.cpp)
target_link_libraries(batch_jsonl PRIVATE weft::actors)
CMAKE
cmake -S "$tmp/proj" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/root/usr" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/batch_jsonl" --help | grep -q -- "--input" || fail "the program built from the package does not run"
"$tmp/root/usr/bin/weft" --version >/dev/null || fail "the packaged weft binary does not run"
echo "check_deb: a program builds and runs against the package's files"
