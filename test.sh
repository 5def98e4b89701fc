#!/usr/bin/env bash
# The test suite: sets up .venv if needed (no large downloads), checks lint and format, runs
# pytest. The heavy tests with the 1.5 GB default models: ./test.sh -m heavy
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
.venv/bin/ruff check specdec tests
.venv/bin/ruff format --check specdec tests
exec .venv/bin/python -m pytest "$@"
