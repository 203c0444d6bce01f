"""The FUSE helper library: what pyfuse3 cannot tell or send, between pyfuse3 and libfuse.

pyfuse3 does not say which process sent a ``flush`` (so a mount could not tell the opener's
close, which publishes a file, from the close of a child sharing its descriptor, which must
not publish half a file), cannot answer an open with ``FOPEN_NOFLUSH``, and has no API for
FUSE passthrough. ``_helper.c`` is a small library that pyfuse3 binds to in place of a few
libfuse functions; it must be loaded before pyfuse3 is imported, which this module does when
``agentvfs.mounts`` is imported.

The library is compiled on the machine that mounts, for the libfuse that pyfuse3 itself
links and against that release's headers: the ``fuse`` extra builds pyfuse3 from source, so
a C compiler and the libfuse3 headers are there wherever it installed. It is kept beside
this module (in ``_built/``, as trusted as the code that loads it), or, where this process
may not write there, compiled into a private temporary directory for this process alone.
Passthrough needs libfuse >= 3.17 (``agentvfs setup-passthrough`` builds it for an
environment); everything else works with any libfuse 3.

Where the library cannot be built, :data:`HELPER` is ``None`` with the reason in
:func:`unavailable_reason`: mounts still work, publish files at their last close instead of
at their opener's (see ``docs/mount-semantics.md``), and say so when they start.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "HELPER",
    "Helper",
    "libfuse_version",
    "passthrough_unavailable_reason",
    "unavailable_reason",
]

_log = logging.getLogger("agentvfs.mounts")

#: The interface version of ``_helper.c`` this module speaks (``agentvfs_helper_version``).
_INTERFACE = 5
_SOURCE = Path(__file__).with_name("_helper.c")
#: Builds kept beside this module, one per libfuse and source (named by a hash of both).
_BUILT = Path(__file__).with_name("_built")
_PREFIX = "libagentvfs_fuse-"
#: Seconds after which another build beside this one is removed.
_STALE_BUILD = 3600.0

#: Printed by a child interpreter that imports pyfuse3: the libfuse it loaded, and its version.
_PROBE = """
import ctypes, json
import pyfuse3
paths = set()
with open("/proc/self/maps", encoding="utf-8") as maps:
    for line in maps:
        name = line.split()[-1]
        if "/libfuse3.so" in name:
            paths.add(name)
(path,) = paths
version = ctypes.CDLL(path).fuse_pkgversion
version.restype = ctypes.c_char_p
print(json.dumps({"path": path, "version": version().decode()}))
"""


class HelperUnavailable(Exception):
    """Why the helper library cannot be had in this process (the message says how to fix it)."""


class Helper:
    """The loaded library: which process sent a flush, handles whose reads it answers from
    a descriptor, and (libfuse >= 3.17) backing files registered for passthrough."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._lib = lib
        lib.agentvfs_helper_features.argtypes = []
        lib.agentvfs_helper_active.argtypes = []
        lib.agentvfs_pt_request.argtypes = [ctypes.c_int]
        lib.agentvfs_pt_request.restype = None
        lib.agentvfs_pt_granted.argtypes = []
        lib.agentvfs_pt_open_backing.argtypes = [ctypes.c_int]
        lib.agentvfs_pt_close_backing.argtypes = [ctypes.c_int]
        lib.agentvfs_pt_attach.argtypes = [ctypes.c_uint64, ctypes.c_int]
        lib.agentvfs_pt_detach.argtypes = [ctypes.c_uint64]
        lib.agentvfs_pt_detach.restype = None
        lib.agentvfs_flush_pid.argtypes = [ctypes.c_uint64]
        lib.agentvfs_serve.argtypes = [ctypes.c_uint64, ctypes.c_int]
        lib.agentvfs_unserve.argtypes = [ctypes.c_uint64]
        lib.agentvfs_unserve.restype = None
        features = int(lib.agentvfs_helper_features())
        #: Built against libfuse >= 3.17: passthrough can be asked for.
        self.supports_passthrough = bool(features & 1)

    def active(self) -> bool:
        """pyfuse3 created its session through the library (its definitions were bound)."""
        return bool(self._lib.agentvfs_helper_active())

    def request(self, on: bool) -> None:
        """Ask for passthrough when the next session starts (before ``pyfuse3.init``)."""
        self._lib.agentvfs_pt_request(1 if on and self.supports_passthrough else 0)

    def granted(self) -> bool:
        """The kernel agreed to passthrough for the running session."""
        return bool(self._lib.agentvfs_pt_granted())

    def open_backing(self, fd: int) -> int:
        """Register ``fd`` with the kernel; its backing id.

        Raises
        ------
        OSError
            The kernel refused (``EPERM`` without CAP_SYS_ADMIN, ``ELOOP`` for a file on a
            stacked filesystem, ``EOPNOTSUPP`` without passthrough, ...).
        """
        rc = int(self._lib.agentvfs_pt_open_backing(fd))
        if rc <= 0:
            code = -rc if rc < 0 else 0
            raise OSError(code, f"FUSE passthrough refused: {os.strerror(code)}")
        return rc

    def close_backing(self, backing_id: int) -> None:
        rc = int(self._lib.agentvfs_pt_close_backing(backing_id))
        if rc < 0:
            _log.warning("closing FUSE backing id %d failed: %s", backing_id, os.strerror(-rc))

    def attach(self, fh: int, backing_id: int) -> None:
        """Answer the open (or create) that returns handle ``fh`` in passthrough."""
        if self._lib.agentvfs_pt_attach(fh, backing_id) != 0:
            raise OSError(0, "too many passthrough opens waiting for their reply")

    def detach(self, fh: int) -> None:
        """Forget an attachment whose open failed before its reply."""
        self._lib.agentvfs_pt_detach(fh)

    def serve(self, fh: int, fd: int) -> bool:
        """Have the library answer reads of handle ``fh`` from descriptor ``fd`` itself (no
        trip through Python) until :meth:`unserve`; False when it cannot take more."""
        return int(self._lib.agentvfs_serve(fh, fd)) == 0

    def unserve(self, fh: int) -> None:
        """Reads of ``fh`` go through Python again (before ``fd`` is closed or what it
        serves changes)."""
        self._lib.agentvfs_unserve(fh)

    def flush_pid(self, fh: int) -> int:
        """The thread that sent the flush of ``fh`` being handled (0 when unknown). Valid
        only before the handler's first ``await``."""
        return int(self._lib.agentvfs_flush_pid(fh))


# -- finding or building the library ---------------------------------------------------------


def _pyfuse3_extension() -> Path:
    spec = importlib.util.find_spec("pyfuse3")
    if spec is None or spec.origin is None:
        raise HelperUnavailable("pyfuse3 is not installed (pip install 'agentvfs[fuse]')")
    origin = Path(spec.origin)
    if origin.suffix == ".so":
        return origin
    # A package (pyfuse3 >= 3.4 is one): its compiled module sits beside __init__.py.
    found = sorted(origin.parent.glob("*.so"))
    if not found:
        raise HelperUnavailable(f"pyfuse3 at {origin.parent} has no compiled module")
    return found[0]


def _key(extension: Path) -> str:
    """Names one build: this source for the pyfuse3 build at ``extension`` (a pyfuse3
    rebuilt against another libfuse, by ``agentvfs setup-passthrough`` say, is a new file)."""
    st = extension.stat()
    digest = hashlib.sha256(_SOURCE.read_bytes())
    digest.update(f"\0{extension.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{_INTERFACE}".encode())
    return digest.hexdigest()[:20]


def _trusted(path: Path) -> bool:
    """``path`` belongs to this user (or root) and nobody else may write it, nor its
    directory: a library that another user could have replaced is never loaded."""
    for item in (path, path.parent):
        try:
            st = os.lstat(item)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            return False
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def _pyfuse3_libfuse() -> tuple[str, str]:
    """The libfuse pyfuse3 loads (its path) and its version, asked of a child interpreter:
    importing pyfuse3 here would bind it before the library is loaded."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise HelperUnavailable(f"pyfuse3's libfuse could not be found: {exc}") from None
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return str(found["path"]), str(found["version"])
    except (ValueError, IndexError, KeyError, TypeError):
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HelperUnavailable(f"pyfuse3 cannot be imported: {detail}") from None


def _header_minor(directory: Path) -> int | None:
    """The minor version of libfuse 3 whose headers are in ``directory``, or None."""
    if not (directory / "fuse_lowlevel.h").is_file():
        return None
    text = ""
    # fuse_common.h defines the version up to 3.16; libfuse_config.h from 3.17 on.
    for name in ("fuse_common.h", "libfuse_config.h"):
        with contextlib.suppress(OSError):
            text += (directory / name).read_text(encoding="utf-8", errors="replace")
    major = re.search(r"#define\s+FUSE_MAJOR_VERSION\s+(\d+)", text)
    minor = re.search(r"#define\s+FUSE_MINOR_VERSION\s+(\d+)", text)
    if major is None or minor is None or major.group(1) != "3":
        return None
    return int(minor.group(1))


def _headers(library: str, minor: int) -> Path:
    """The headers of libfuse 3.``minor``: beside the library (a prefix of its own, as
    ``agentvfs setup-passthrough`` makes), where pkg-config says, or the usual places."""
    candidates = [Path(library).resolve().parent.parent / "include" / "fuse3"]
    pkg_config = shutil.which("pkg-config")
    if pkg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            flags = subprocess.run(
                [pkg_config, "--cflags-only-I", "fuse3"], capture_output=True, text=True, timeout=30, check=False
            ).stdout.split()
            candidates += [Path(flag.removeprefix("-I")) for flag in flags if flag.startswith("-I")]
    candidates += [Path("/usr/include/fuse3"), Path("/usr/local/include/fuse3")]
    for candidate in candidates:
        if _header_minor(candidate) == minor:
            return candidate
    raise HelperUnavailable(
        f"the headers of libfuse 3.{minor} (fuse_lowlevel.h), which pyfuse3 links, were not found: "
        "install them (Debian, Ubuntu: libfuse3-dev; Fedora: fuse3-devel)"
    )


def _compiler() -> str:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found is not None:
            return found
    raise HelperUnavailable("no C compiler was found (cc, gcc or clang; $CC): install one (Debian: gcc)")


def _build(target: Path) -> None:
    """Compile the library to ``target`` (atomically: a concurrent build of the same key
    writes the same bytes, and the last rename wins)."""
    library, version = _pyfuse3_libfuse()
    parts = version.split(".")
    if len(parts) < 2 or parts[0] != "3" or not parts[1].isdigit():
        raise HelperUnavailable(f"pyfuse3 links libfuse {version}, not libfuse 3")
    minor = int(parts[1])
    headers = _headers(library, minor)
    compiler = _compiler()
    fd, temporary = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    command = [
        compiler, "-O2", "-shared", "-fPIC", f"-DAGENTVFS_FUSE_MINOR={minor}", f"-I{headers}",
        "-o", temporary, os.fspath(_SOURCE),
        # The very file pyfuse3 loads, found again at run time through the rpath.
        library, f"-Wl,-rpath,{Path(library).parent}", "-ldl", "-lpthread",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            detail = " ".join(done.stderr.strip().splitlines()[-3:]) or f"exit status {done.returncode}"
            raise HelperUnavailable(f"the helper library did not compile ({compiler}): {detail}")
        os.chmod(temporary, 0o755)
        os.replace(temporary, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HelperUnavailable(f"the helper library did not compile ({compiler}): {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _log.info("built the FUSE helper library %s for libfuse %s (%s)", target, version, library)


def _kept_build(key: str) -> Path | None:
    """The build of ``key`` beside this module, made now if missing; None where this process
    may not keep one there."""
    target = _BUILT / f"{_PREFIX}{key}.so"
    if target.is_file():
        return target if _trusted(target) else None
    try:
        _BUILT.mkdir(mode=0o755, exist_ok=True)
    except OSError:
        return None
    if not os.access(_BUILT, os.W_OK) or not _trusted(_BUILT):
        return None
    _build(target)
    for old in _BUILT.glob(f"{_PREFIX}*.so"):
        # Builds for another source or pyfuse3, once nobody can be about to load them (a
        # process that loaded one keeps its mapping).
        with contextlib.suppress(OSError):
            if old != target and time.time() - old.stat().st_mtime > _STALE_BUILD:
                old.unlink()
    return target


def _load() -> tuple[Helper | None, str]:
    if os.environ.get("AGENTVFS_FUSE_HELPER", "1") == "0":
        return None, "turned off by AGENTVFS_FUSE_HELPER=0"
    if "pyfuse3" in sys.modules:
        return None, "pyfuse3 was imported before agentvfs.mounts"
    private: str | None = None
    try:
        key = _key(_pyfuse3_extension())
        path = _kept_build(key)
        if path is None:
            # Not ours to keep (a system-wide install used by another user): built for this
            # process in a directory of its own, gone once loaded (the mapping stays).
            private = tempfile.mkdtemp(prefix="agentvfs-fuse-")
            path = Path(private) / f"{_PREFIX}{key}.so"
            _build(path)
        lib = ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)
        if lib.agentvfs_helper_version() != _INTERFACE:
            return None, f"{path} is of another version"
        return Helper(lib, os.fspath(path)), ""
    except HelperUnavailable as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"the helper library cannot be loaded: {exc}"
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


HELPER, _REASON = _load()


def unavailable_reason() -> str | None:
    """``None`` when the helper library is loaded, else why not (and how to fix it)."""
    return None if HELPER is not None else _REASON


def libfuse_version() -> str:
    """The version of the libfuse pyfuse3 runs on in this process (``""`` when unknown)."""
    import pyfuse3  # noqa: F401  # loads libfuse

    with contextlib.suppress(OSError, AttributeError), open("/proc/self/maps", encoding="utf-8") as f:
        paths = {line.split()[-1] for line in f if "libfuse3.so" in line}
        for path in sorted(paths):
            version = ctypes.CDLL(path).fuse_pkgversion
            version.restype = ctypes.c_char_p
            return str(version().decode())
    return ""


def passthrough_unavailable_reason() -> str | None:
    """``None`` when passthrough can be asked for in this process, else why not (the kernel
    may still refuse it when a mount starts)."""
    if os.environ.get("AGENTVFS_PASSTHROUGH", "1") == "0":
        return "turned off by AGENTVFS_PASSTHROUGH=0"
    if HELPER is None:
        return f"the FUSE helper library is not loaded: {_REASON}"
    if not HELPER.supports_passthrough:
        return (
            f"libfuse {libfuse_version() or '< 3.17'} is older than 3.17 "
            "(`agentvfs setup-passthrough`, as root, builds 3.17 for this environment)"
        )
    return None
