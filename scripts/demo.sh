#!/usr/bin/env bash
# Set up the checkout with what the demo needs (FUSE mounts and search), then run
# `agentvfs demo` with arguments passed through.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh fuse,search
exec .venv/bin/agentvfs demo "$@"
