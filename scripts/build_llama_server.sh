#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the serving baseline of bench/e2e/serve_vs_llama_server.py)
# from the llama.cpp source vendored in the llama-cpp-python sdist that weft's tests pin, once:
# the binary is cached in ~/.cache/weft/llama-server-<version>/ (or $WEFT_CACHE_DIR), and a second
# run only checks it. Network: PyPI (the sdist). scripts/setup.sh --bench runs this.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.16}"
cache="${WEFT_CACHE_DIR:-$HOME/.cache/weft}"
dest="$cache/llama-server-$version"
if [ -x "$dest/llama-server" ]; then
  echo "[llama-server] $dest/llama-server (cached)"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "[llama-server] fetching the llama-cpp-python $version sdist"
python3 -m pip download --no-binary :all: --no-deps --quiet "llama-cpp-python==$version" -d "$work"
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
echo "[llama-server] building llama-server from $src ($(nproc) jobs; a few minutes)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  > "$work/cmake.log"
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" ||
  { tail -30 "$work/build.log"; exit 1; }
mkdir -p "$dest"
cp "$work/build/bin/llama-server" "$dest/llama-server.tmp"
mv "$dest/llama-server.tmp" "$dest/llama-server"
echo "[llama-server] $dest/llama-server"
