#!/usr/bin/env bash
# Set up the checkout, then run `agentvfs demo` with arguments passed through.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
exec .venv/bin/agentvfs demo "$@"
