#!/usr/bin/env bash
# Installs everything weft needs on Debian 12: Debian packages (apt-get), Python packages (pip) and
# the default model. Idempotent: a second run installs nothing and takes a few seconds.
#
#   scripts/setup.sh            build + runtime dependencies and the default model
#   scripts/setup.sh --test     also the packages the test tiers need (llama-cpp-python, openai,
#                               torch + transformers for the trainer oracle, matplotlib,
#                               chromium + websocket-client for the chat page's browser test)
#   scripts/setup.sh --bench    also the benchmark baselines: ray, ray-cpp, matplotlib, llama-server
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

want_test=0
want_bench=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --bench) want_bench=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

apt_packages=(
  build-essential cmake ninja-build ccache pkg-config git unzip python3 python3-pip
  libcaf-dev capnproto libcapnp-dev libucx-dev ucx-utils libspdlog-dev libfmt-dev
  libopenblas-dev libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev iproute2 procps curl
)
if [ "$want_test" = 1 ]; then
  # chromium: the chat page's browser test (tests/integration/serve/test_chat_page.py).
  apt_packages+=(clang libclang-rt-14-dev clang-format chromium)
fi

missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "[setup] Debian packages: all present"
fi

# Python: use the python3 on PATH (pyenv or Debian). Debian's own python needs the PEP 668 override.
PY=python3
pip_flags=(-q --disable-pip-version-check)
if $PY -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then
  if [ -e "$($PY -c 'import sysconfig;print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]; then
    pip_flags+=(--break-system-packages)
  fi
fi
if ! $PY -m pip --version >/dev/null 2>&1; then
  echo "[setup] python3 has no pip" >&2; exit 1
fi

pip_want=()
py_has() { $PY -c "import $1" >/dev/null 2>&1; }
# The installed version of a distribution, without importing it ("" if absent).
py_version() { $PY -c "import importlib.metadata as m;print(m.version('$1'))" 2>/dev/null || true; }

# llama.cpp (the engine oracle's reference) is built for the ISA whose numerics weft reproduces
# (docs/engine.md, "The host's vector width matters"). On an AVX-512 host that is AVX-512 with
# VNNI/BF16/VBMI but without AMX: -march=native on a host with AMX routes ggml's quantized matmuls
# through its AMX kernels, whose rounding weft does not model (seen: 3/18 identical greedy
# continuations, 47 % teacher-forced top-1 agreement). AVX2-only hosts build native.
has_cpu_flag() { grep -m1 "^flags" /proc/cpuinfo | grep -w "$1" >/dev/null; }
llama_cmake_args=""
if has_cpu_flag avx512f && has_cpu_flag avx512dq; then
  llama_cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  llama_cmake_args+=" -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  has_cpu_flag avx512_vnni && llama_cmake_args+=" -DGGML_AVX512_VNNI=ON"
  has_cpu_flag avx512_bf16 && llama_cmake_args+=" -DGGML_AVX512_BF16=ON"
  has_cpu_flag avx512vbmi && llama_cmake_args+=" -DGGML_AVX512_VBMI=ON"
fi
# An installed llama.cpp built with AMX kernels is rebuilt (an earlier native build on this host).
llama_has_amx() {
  local lib
  lib="$($PY -c 'import llama_cpp,os;print(os.path.join(os.path.dirname(llama_cpp.__file__),"lib","libggml-cpu.so"))' 2>/dev/null)" || return 1
  [ -f "$lib" ] && nm -D "$lib" 2>/dev/null | grep ggml_backend_amx_mul_mat >/dev/null
}
if [ "$want_test" = 1 ] && py_has llama_cpp && llama_has_amx; then
  echo "[setup] rebuilding llama-cpp-python without AMX kernels (the oracle's numerics)"
  CMAKE_ARGS="$llama_cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" $PY -m pip install \
    "${pip_flags[@]}" --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.16"
fi
py_has numpy || pip_want+=(numpy)
if [ "$want_test" = 1 ]; then
  # llama-cpp-python compiles llama.cpp from source (~10 min on 2 cores, once).
  py_has llama_cpp || pip_want+=("llama-cpp-python==0.3.16")
  py_has openai || pip_want+=(openai)
  # Structured outputs are validated by an independent JSON Schema validator.
  py_has jsonschema || pip_want+=(jsonschema)
  # Chat templates are checked against jinja2 (tests/oracle/gpu/test_jinja.py, the tokenizer oracle).
  py_has jinja2 || pip_want+=(jinja2)
  # `weft train/rl --plot` draw with matplotlib; their CLI tests check the PNG.
  py_has matplotlib || pip_want+=(matplotlib)
  py_has websocket || pip_want+=(websocket-client)  # drives Chromium over DevTools
  # The trainer's oracle: PyTorch autograd on the GGUF as Hugging Face transformers loads it
  # (tests/oracle/gpu/train_oracle.py). torch from PyPI brings its CUDA wheels (~3 GB, once).
  py_has torch || pip_want+=("torch==2.5.1")
  py_has transformers || pip_want+=("transformers==4.46.3")
  py_has gguf || pip_want+=("gguf==0.19.0")
  py_has accelerate || pip_want+=("accelerate==1.15.0")
  py_has sentencepiece || pip_want+=("sentencepiece==0.2.3")
fi
if [ "$want_bench" = 1 ]; then
  py_has matplotlib || pip_want+=(matplotlib)
  # Ray's Python actors and its C++ API (ray-cpp: headers, libray_api.so, the C++ worker) are the
  # baselines of bench/micro/runtime; ray-cpp runs only on the ray of its own version.
  ray_version=2.60.0
  { [ "$(py_version ray)" = "$ray_version" ] && [ "$(py_version ray-cpp)" = "$ray_version" ]; } ||
    pip_want+=("ray[default]==$ray_version" "ray-cpp==$ray_version")
  # The llama.cpp server baseline of `weft bench serve` (python3 -m llama_cpp.server).
  { py_has llama_cpp && py_has uvicorn && py_has sse_starlette && py_has starlette_context; } ||
    pip_want+=("llama-cpp-python[server]==0.3.16")
fi
if [ "${#pip_want[@]}" -gt 0 ]; then
  echo "[setup] installing Python packages: ${pip_want[*]}"
  CMAKE_ARGS="$llama_cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    $PY -m pip install "${pip_flags[@]}" --no-cache-dir "${pip_want[@]}"
else
  echo "[setup] Python packages: all present"
fi

"$here/fetch_model.sh"
# llama.cpp's own llama-server (parallel slots): the serving baseline of
# bench/e2e/serve_vs_llama_server.py, built once from the pinned sdist's llama.cpp source.
if [ "$want_bench" = 1 ]; then
  "$here/build_llama_server.sh"
  # The Ray C++ API baseline of weft_bench_runtime (build/ray-cpp/ray_cpp_pingpong).
  "$here/build_ray_cpp_bench.sh"
fi
