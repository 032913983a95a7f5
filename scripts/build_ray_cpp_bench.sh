#!/usr/bin/env bash
# Builds the Ray C++ baseline of weft's actor round trip (bench/micro/runtime/ray_cpp_pingpong.cpp)
# with g++ against the ray-cpp wheel (headers and libray_api.so) of the python3 on PATH:
#   build/ray-cpp/ray_cpp_pingpong      the driver that weft_bench_runtime runs (--ray-cpp-bin)
#   build/ray-cpp/ray_cpp_pingpong.so   the same code, which the Ray C++ worker hosting the actor
#                                       loads (the job's code search path)
# A second run with nothing changed builds nothing. scripts/setup.sh --bench runs this after
# installing ray-cpp; by hand: pip install ray-cpp==2.60.0 ray==2.60.0.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/bench/micro/runtime/ray_cpp_pingpong.cpp"
out="${RAY_CPP_BENCH_OUT:-$root/build/ray-cpp}"
PY="${PYTHON:-python3}"

# Where the wheel put Ray (without importing it: `import ray` takes seconds), its version, and the
# `ray` command of the same environment (the driver runs `ray start`).
info="$($PY - <<'EOF' 2>/dev/null || true
import importlib.metadata as md, importlib.util, os, sysconfig
spec = importlib.util.find_spec("ray")
cpp = os.path.join(spec.submodule_search_locations[0], "cpp") if spec else ""
try:
    version = md.version("ray-cpp")
except md.PackageNotFoundError:
    version = ""
try:
    ray_version = md.version("ray")
except md.PackageNotFoundError:
    ray_version = ""
print(cpp)
print(version)
print(ray_version)
print(os.path.join(sysconfig.get_path("scripts"), "ray"))
EOF
)"
cpp_dir="$(sed -n 1p <<<"$info")"
version="$(sed -n 2p <<<"$info")"
ray_version="$(sed -n 3p <<<"$info")"
ray_cli="$(sed -n 4p <<<"$info")"
if [ -z "$version" ] || [ ! -f "$cpp_dir/include/ray/api.h" ] ||
  [ ! -f "$cpp_dir/lib/libray_api.so" ]; then
  echo "[ray-cpp] ray-cpp is not installed for $PY (no Ray C++ headers/libray_api.so):" >&2
  echo "[ray-cpp]   pip install ray-cpp==2.60.0 ray==2.60.0   (or scripts/setup.sh --bench)" >&2
  exit 1
fi
[ -x "$ray_cli" ] || ray_cli="$(command -v ray || true)"
if [ "$ray_version" != "$version" ] || [ -z "$ray_cli" ]; then
  echo "[ray-cpp] ray-cpp $version needs ray $version and its \`ray\` command (found ray" \
    "'${ray_version:-none}', command '${ray_cli:-none}'):" >&2
  echo "[ray-cpp]   pip install ray==$version" >&2
  exit 1
fi

inc="$cpp_dir/include"
lib="$cpp_dir/lib"
# The wheel's library is built for C++17 with the old libstdc++ string ABI (std::string crosses
# the API), so this program must be too.
cxxflags=(-std=c++17 -O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -isystem "$inc"
  "-DRAY_CPP_CLI=\"$ray_cli\"" "-DRAY_CPP_LIB_DIR=\"$lib\"" "-DRAY_CPP_VERSION=\"$version\"")
ldflags=(-L"$lib" -lray_api "-Wl,-rpath,$lib" -pthread)
stamp="$out/build.stamp"
# Up to date = built from this source with these flags against this libray_api.so.
want_stamp="$(printf '%s\n' "${CXX:-g++}" "${cxxflags[@]}" "${ldflags[@]}" \
  "$(sha256sum "$src" | cut -d' ' -f1)" "$(stat -c %Y "$lib/libray_api.so")")"
if [ -x "$out/ray_cpp_pingpong" ] && [ -f "$out/ray_cpp_pingpong.so" ] && [ -f "$stamp" ] &&
  [ "$(cat "$stamp")" = "$want_stamp" ]; then
  echo "[ray-cpp] $out/ray_cpp_pingpong (up to date, ray-cpp $version)"
  exit 0
fi

mkdir -p "$out"
echo "[ray-cpp] building $out/ray_cpp_pingpong against ray-cpp $version ($cpp_dir)"
"${CXX:-g++}" "${cxxflags[@]}" -c "$src" -o "$out/ray_cpp_pingpong.o"
"${CXX:-g++}" "$out/ray_cpp_pingpong.o" -o "$out/ray_cpp_pingpong.tmp" "${ldflags[@]}"
"${CXX:-g++}" -shared "$out/ray_cpp_pingpong.o" -o "$out/ray_cpp_pingpong.so.tmp" "${ldflags[@]}"
mv "$out/ray_cpp_pingpong.so.tmp" "$out/ray_cpp_pingpong.so"
mv "$out/ray_cpp_pingpong.tmp" "$out/ray_cpp_pingpong"
rm -f "$out/ray_cpp_pingpong.o"
printf '%s\n' "$want_stamp" >"$stamp"
echo "[ray-cpp] $out/ray_cpp_pingpong"
