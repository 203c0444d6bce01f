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
# FUSE passthrough (the kernel serves reads and writes of files on local-directory mounts from the
# files themselves) needs libfuse >= 3.16, and our passthrough library >= 3.17; Debian 12 ships
# 3.14. This release's source is Debian's, fetched from the Debian mirror this machine's apt
# sources name (its pool holds every release's source), checked against its hash.
libfuse_version=3.17.2
libfuse_sha256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
libfuse_pool_path="pool/main/f/fuse3/fuse3_${libfuse_version}.orig.tar.gz"

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

# An MCP client of the SDK's next major version in an environment of its own, for the test
# that the server answers clients on either (the server's own SDK is pinned below 2).
install_mcp2_client() {
    [[ $extras == *test* || $extras == dev ]] || return 0
    local dir=.venv/opt/mcp2
    if [[ "$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" == "$mcp2_version" ]]; then
        log "mcp $mcp2_version client present"
        return
    fi
    log "installing an mcp $mcp2_version client into $dir"
    rm -rf "$dir"
    "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "mcp==$mcp2_version"
}

# libfuse $libfuse_version into .venv/opt/libfuse, the passthrough library beside it, and pyfuse3
# rebuilt against it. Optional: mounts work without it (no passthrough), so a failure here is a
# warning. AGENTVFS_PASSTHROUGH=0 skips it.
install_libfuse() {
    [[ "${AGENTVFS_PASSTHROUGH:-1}" != 0 ]] || { log "passthrough skipped (AGENTVFS_PASSTHROUGH=0)"; return 0; }
    local prefix="$PWD/.venv/opt/libfuse"
    local shim="$prefix/lib/libagentvfs_passthrough.so" source=src/agentvfs/mounts/_passthrough.c
    if [[ $(id -u) -ne 0 ]]; then
        # Registering backing files needs CAP_SYS_ADMIN, and libfuse 3.17 needs its own
        # fusermount3, which only root can install setuid.
        log "not root: mounts run without FUSE passthrough"
        return 0
    fi
    if [[ "$(cat "$prefix/.version" 2>/dev/null)" != "$libfuse_version with fusermount3" ]]; then
        log "building libfuse $libfuse_version into $prefix (for FUSE passthrough)"
        if ! build_libfuse "$prefix" >.venv/libfuse-build.log 2>&1; then
            log "warning: libfuse build failed (see .venv/libfuse-build.log); mounts run without passthrough"
            return 0
        fi
    fi
    if [[ ! -f $shim || $source -nt $shim ]]; then
        log "compiling $shim"
        if ! gcc -O2 -Wall -shared -fPIC -o "$shim" "$source" -I"$prefix/include/fuse3" \
            -L"$prefix/lib" -Wl,-rpath,"$prefix/lib" -lfuse3 -ldl; then
            log "warning: the passthrough library did not compile; mounts run without passthrough"
            rm -f "$shim"
            return 0
        fi
    fi
    local extension
    extension=$(.venv/bin/python -c 'import glob, importlib.util, os
spec = importlib.util.find_spec("pyfuse3")
print(*glob.glob(os.path.join(os.path.dirname(spec.origin), "*.so")) if spec and spec.origin else [])')
    if [[ -n $extension ]] && ldd $extension | grep -q "$prefix/lib/libfuse3.so.4"; then
        log "pyfuse3 uses libfuse $libfuse_version"
        return 0
    fi
    local version
    version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyfuse3"))')
    log "rebuilding pyfuse3 $version against libfuse $libfuse_version"
    PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$prefix/lib" \
        .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir \
        --no-binary pyfuse3 "pyfuse3==$version" \
        || log "warning: pyfuse3 did not build against libfuse $libfuse_version; mounts run without passthrough"
}

# The first Debian archive (not -security) in apt's sources, deb822 or one-line format.
debian_mirror() {
    local file line
    for file in /etc/apt/sources.list.d/*.sources; do
        [[ -f $file ]] || continue
        while read -r line; do
            case $line in
                URIs:*) for uri in ${line#URIs:}; do
                            [[ $uri == */debian || $uri == */debian/ ]] && { echo "${uri%/}"; return 0; }
                        done ;;
            esac
        done <"$file"
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $file ]] || continue
        while read -r line; do
            # shellcheck disable=SC2086
            set -- $line
            [[ ${1:-} == deb || ${1:-} == deb-src ]] || continue
            shift
            [[ ${1:-} == \[* ]] && shift  # [arch=... signed-by=...]
            [[ ${1:-} == */debian || ${1:-} == */debian/ ]] && { echo "${1%/}"; return 0; }
        done <"$file"
    done
    return 1
}

build_libfuse() {
    local prefix=$1 work rc=0
    work=$(mktemp -d)
    build_libfuse_in "$prefix" "$work" || rc=$?
    rm -rf "$work"
    return $rc
}

# Called in a `||` list, where `set -e` does not apply: every step checks its own status.
build_libfuse_in() {
    local prefix=$1 work=$2
    .venv/bin/pip install -q --disable-pip-version-check meson ninja || return 1
    local mirror
    mirror=$(debian_mirror) || { echo "no Debian archive in the apt sources"; return 1; }
    curl -fsSL --retry 3 -o "$work/fuse.tar.gz" "$mirror/$libfuse_pool_path" || return 1
    echo "$libfuse_sha256  $work/fuse.tar.gz" | sha256sum -c - || return 1
    tar -xzf "$work/fuse.tar.gz" -C "$work" || return 1
    rm -rf "$prefix"
    # Everything inside the prefix (the install would write /etc/fuse.conf otherwise). libfuse
    # 3.17 runs its own fusermount3 (the system's 3.14 lacks --auto-unmount), from the prefix.
    PATH="$PWD/.venv/bin:$PATH" .venv/bin/meson setup "$work/build" "$work/fuse-$libfuse_version" \
        --prefix="$prefix" --libdir=lib --sysconfdir="$prefix/etc" --buildtype=release \
        -Dexamples=false -Dtests=false -Ddisable-mtab=true -Duseroot=false \
        -Dinitscriptdir= -Dudevrulesdir="$prefix/lib/udev" || return 1
    PATH="$PWD/.venv/bin:$PATH" .venv/bin/ninja -C "$work/build" install || return 1
    # The system's settings (user_allow_other), and setuid root like the system's own copy.
    [[ -f /etc/fuse.conf ]] && ln -sf /etc/fuse.conf "$prefix/etc/fuse.conf"
    chown root:root "$prefix/bin/fusermount3" && chmod u+s "$prefix/bin/fusermount3" || return 1
    printf '%s\n' "$libfuse_version with fusermount3" >"$prefix/.version"
}

install_system_packages
create_venv
install_project
install_libfuse
install_s3rver
install_mcp2_client
log "done"
