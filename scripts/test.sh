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

# The adversarial suite again without root: what an agent cannot do to a root-run workspace it
# must not be able to do to one an ordinary user runs (bubblewrap in a user namespace, no
# cgroups, other file permissions). Only on a whole-suite run, as root, where runuser exists.
unprivileged=${AGENTVFS_UNPRIVILEGED_USER:-nobody}
if [[ $# -eq 0 && $(id -u) -eq 0 ]] && command -v runuser >/dev/null 2>&1 && id "$unprivileged" >/dev/null 2>&1; then
    home=$(mktemp -d)
    chown "$unprivileged" "$home"
    # The interpreter may live under a directory only root may enter (pyenv under /root): let
    # the user pass through (not list) each such directory for this run, and restore it after.
    opened=()
    dir=""
    IFS=/ read -ra parts <<<"$(dirname "$(readlink -f .venv/bin/python)")"
    for part in "${parts[@]}"; do
        [[ -n $part ]] || continue
        dir="$dir/$part"  # from the top down: a directory is tested once its parents open
        if ! runuser -u "$unprivileged" -- test -x "$dir"; then
            chmod o+x "$dir" && opened+=("$dir")
        fi
    done
    echo "[test] the adversarial suite as $unprivileged"
    second=0
    runuser -u "$unprivileged" -- env -i PATH="$PATH" HOME="$home" PYTHONDONTWRITEBYTECODE=1 \
        GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false \
        .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/test_adversary.py tests/test_disk.py \
        || second=$?
    rm -rf "$home"
    for dir in "${opened[@]}"; do chmod o-x "$dir"; done
    if [[ $second -eq 5 ]]; then
        echo "[test] error: the unprivileged run collected no tests" >&2
        second=1
    fi
    [[ $status -ne 0 ]] || status=$second
fi
exit "$status"
