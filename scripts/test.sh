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

# The mount's promises again in an environment made the way a user makes one: the built wheel
# with the fuse and s3 extras in a fresh venv (pyfuse3 compiled against the system's libfuse3,
# no libfuse 3.17, no setup script), and the test tools beside it. The lifecycle, crash-trial,
# two-mount, publish and fsx suites run there; the ones that must also hold without root run
# again as an unprivileged user below. Only on a whole-suite run.
plain_suites=(tests/test_mount_units.py tests/test_mount_lifecycle.py tests/test_mount_recovery.py
    tests/test_mount_shared.py tests/test_mount_publish.py tests/test_mount_fsx.py)
plain_unprivileged=(tests/test_mount_units.py tests/test_mount_recovery.py -k "units or child_closing or between_two or redirect")
plain=""
if [[ $# -eq 0 ]]; then
    plain=$(mktemp -d)
    echo "[test] the mount suites in a plain pip install of the wheel ($plain)"
    base_python=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
    plain_status=0
    {
        .venv/bin/python -m build --wheel --outdir "$plain/dist" . >"$plain/build.log" 2>&1 \
            && "$base_python" -m venv "$plain/venv" \
            && "$plain/venv/bin/pip" install -q --disable-pip-version-check "$(ls "$plain"/dist/agentvfs-*.whl)[fuse,s3]" \
            && "$plain/venv/bin/pip" freeze --disable-pip-version-check >"$plain/constraints.txt" \
            && "$plain/venv/bin/pip" install -q --disable-pip-version-check -c "$plain/constraints.txt" \
                "pytest>=8,<10" "pytest-trio>=0.8,<0.9" "hypothesis>=6.100,<7" "moto[server]>=5.0,<6" boto3
    } || { echo "[test] error: the plain environment could not be made (see $plain/build.log)" >&2; plain_status=1; }
    if [[ $plain_status -eq 0 ]]; then
        # From the checkout's root (its pytest settings), importing agentvfs from the wheel.
        env -u PYTHONPATH "$plain/venv/bin/python" -m pytest -q -rs -m "not gcs" "${plain_suites[@]}" || plain_status=$?
        [[ $plain_status -ne 5 ]] || { echo "[test] error: the plain run collected no tests" >&2; plain_status=1; }
    fi
    [[ $status -ne 0 ]] || status=$plain_status
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
    if [[ -n $plain && -x $plain/venv/bin/python ]]; then
        # A user who may not write the installation: the helper library is built per process.
        chmod o+rx "$plain"
        # Distributions leave /dev/fuse open to every user (fusermount3 is set-user-ID root);
        # a container may not: opened for this run as those machines have it, then restored.
        fuse_mode=""
        if [[ -c /dev/fuse ]] && ! runuser -u "$unprivileged" -- test -r /dev/fuse -a -w /dev/fuse; then
            fuse_mode=$(stat -c %a /dev/fuse)
            chmod o+rw /dev/fuse
        fi
        echo "[test] the plain install's mount suites as $unprivileged"
        runuser -u "$unprivileged" -- env -i PATH="$PATH" HOME="$home" PYTHONDONTWRITEBYTECODE=1 \
            AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
            "$plain/venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m "not gcs" "${plain_unprivileged[@]}" \
            || { code=$?; [[ $second -ne 0 ]] || second=$code; }
        [[ -z $fuse_mode ]] || chmod "$fuse_mode" /dev/fuse
    fi
    rm -rf "$home"
    for dir in "${opened[@]}"; do chmod o-x "$dir"; done
    if [[ $second -eq 5 ]]; then
        echo "[test] error: the unprivileged run collected no tests" >&2
        second=1
    fi
    [[ $status -ne 0 ]] || status=$second
fi
[[ -z $plain ]] || rm -rf "$plain"
exit "$status"
