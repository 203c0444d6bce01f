#!/usr/bin/env bash
# Run the test suite: set up the checkout, then pytest with arguments passed through.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test

# gcsfs reads this at import; its experimental filesystem stalls for minutes on emulators.
export GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
# Emulators speak plain HTTP; a machine-wide CA bundle only breaks tools that load it eagerly.
unset AWS_CA_BUNDLE
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-testing}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-testing}"
# us-east-1 is the one region where creating a bucket needs no LocationConstraint.
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"

# Static checks first: they take seconds and fail fast.
.venv/bin/python -m ruff check -q src tests benchmarks
.venv/bin/python -m mypy src tests benchmarks

status=0
.venv/bin/python -m pytest -q -rs "$@" || status=$?
if [[ $status -eq 5 ]]; then
    # pytest's "no tests collected" must not pass CI silently.
    echo "[test] error: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
