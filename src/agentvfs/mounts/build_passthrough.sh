#!/usr/bin/env bash
# FUSE passthrough for agentvfs mounts: libfuse 3.17 into <environment>/opt/libfuse and pyfuse3
# rebuilt against it, for the Python environment of PYTHON (default: python3 on PATH); the
# mount's helper library (agentvfs/mounts/_helper.c) is compiled for whichever libfuse pyfuse3
# links the first time agentvfs.mounts is imported. Needs root, a C compiler, pkg-config and
# network access to the Debian mirror of this machine's apt sources. Run by scripts/setup.sh
# and by `agentvfs setup-passthrough`; idempotent. Optional: mounts work
# without it (no passthrough), so a failure is a warning and the exit status 1.
#
# usage: build_passthrough.sh [PYTHON]
set -uo pipefail

python="${1:-python3}"
# FUSE passthrough (the kernel serves reads and writes of files on local-directory mounts from the
# files themselves) needs libfuse >= 3.16, and the mount's helper library >= 3.17; Debian 12 ships
# 3.14. This release's source is Debian's, fetched from the Debian mirror this machine's apt
# sources name (its pool holds every release's source), checked against its hash.
libfuse_version=3.17.2
libfuse_sha256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
libfuse_pool_path="pool/main/f/fuse3/fuse3_${libfuse_version}.orig.tar.gz"

log() { printf '[passthrough] %s\n' "$*"; }

install_libfuse() {
    [[ "${AGENTVFS_PASSTHROUGH:-1}" != 0 ]] || { log "passthrough skipped (AGENTVFS_PASSTHROUGH=0)"; return 0; }
    local prefix
    prefix="$("$python" -c 'import sys; print(sys.prefix)')/opt/libfuse" || return 1
    local build_log="${prefix%/libfuse}/libfuse-build.log"
    if [[ $(id -u) -ne 0 ]]; then
        # Registering backing files needs CAP_SYS_ADMIN, and libfuse 3.17 needs its own
        # fusermount3, which only root can install setuid.
        log "not root: mounts run without FUSE passthrough"
        return 1
    fi
    if [[ "$(cat "$prefix/.version" 2>/dev/null)" != "$libfuse_version with fusermount3" ]]; then
        log "building libfuse $libfuse_version into $prefix (for FUSE passthrough)"
        mkdir -p "${prefix%/libfuse}"
        if ! build_libfuse "$prefix" >"$build_log" 2>&1; then
            log "warning: libfuse build failed (see $build_log); mounts run without passthrough"
            return 1
        fi
    fi
    local extension
    extension=$("$python" -c 'import glob, importlib.util, os
spec = importlib.util.find_spec("pyfuse3")
print(*glob.glob(os.path.join(os.path.dirname(spec.origin), "*.so")) if spec and spec.origin else [])')
    if [[ -n $extension ]] && ldd $extension | grep -q "$prefix/lib/libfuse3.so.4"; then
        log "pyfuse3 uses libfuse $libfuse_version"
        return 0
    fi
    local version
    version=$("$python" -c 'import importlib.metadata as m; print(m.version("pyfuse3"))') || {
        log "warning: pyfuse3 is not installed in $python's environment (pip install 'agentvfs[fuse]')"
        return 1
    }
    log "rebuilding pyfuse3 $version against libfuse $libfuse_version"
    PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$prefix/lib" \
        "$python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir \
        --no-binary pyfuse3 "pyfuse3==$version" \
        || { log "warning: pyfuse3 did not build against libfuse $libfuse_version; mounts run without passthrough"; return 1; }
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
    "$python" -m pip install -q --disable-pip-version-check meson ninja || return 1
    local bin
    bin="$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')"
    local mirror
    mirror=$(debian_mirror) || { echo "no Debian archive in the apt sources"; return 1; }
    curl -fsSL --retry 3 -o "$work/fuse.tar.gz" "$mirror/$libfuse_pool_path" || return 1
    echo "$libfuse_sha256  $work/fuse.tar.gz" | sha256sum -c - || return 1
    tar -xzf "$work/fuse.tar.gz" -C "$work" || return 1
    rm -rf "$prefix"
    # Everything inside the prefix (the install would write /etc/fuse.conf otherwise). libfuse
    # 3.17 runs its own fusermount3 (the system's 3.14 lacks --auto-unmount), from the prefix.
    PATH="$bin:$PATH" "$bin/meson" setup "$work/build" "$work/fuse-$libfuse_version" \
        --prefix="$prefix" --libdir=lib --sysconfdir="$prefix/etc" --buildtype=release \
        -Dexamples=false -Dtests=false -Ddisable-mtab=true -Duseroot=false \
        -Dinitscriptdir= -Dudevrulesdir="$prefix/lib/udev" || return 1
    PATH="$bin:$PATH" "$bin/ninja" -C "$work/build" install || return 1
    # The system's settings (user_allow_other), and setuid root like the system's own copy.
    [[ -f /etc/fuse.conf ]] && ln -sf /etc/fuse.conf "$prefix/etc/fuse.conf"
    chown root:root "$prefix/bin/fusermount3" && chmod u+s "$prefix/bin/fusermount3" || return 1
    printf '%s\n' "$libfuse_version with fusermount3" >"$prefix/.version"
}

install_libfuse
