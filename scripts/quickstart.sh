#!/usr/bin/env bash
# The main job in one command: installs what weft needs (Debian + Python packages, the default
# model), builds the release binary and serves the default model (SmolLM2-135M-Instruct, Q4_1) on
# an OpenAI-compatible API at http://127.0.0.1:8000 (Ctrl-C stops it). Extra arguments go to
# `weft serve` (e.g. --workers 2 --policy mlfq). Safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" release
exec "$root/build/release/apps/weft" serve --host 127.0.0.1 --port "${WEFT_PORT:-8000}" "$@"
