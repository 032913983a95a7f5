#!/usr/bin/env bash
# The main job in one command: installs what weft needs (Debian + Python packages, the default
# model), builds the release binary and starts a local cluster on 127.0.0.1.
# `weft serve` (OpenAI-compatible, http://127.0.0.1:8000) replaces the cluster demo when the
# serving milestone lands; until then this runs `weft cluster up`, and `weft generate` runs the
# default model from the command line. Safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" release
exec "$root/build/release/apps/weft" cluster up --nodes "${WEFT_NODES:-3}" "$@"
