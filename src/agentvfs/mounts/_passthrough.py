"""FUSE passthrough: the kernel reads and writes an open file's bytes from a backing file.

A mount of a local directory otherwise carries every byte through ``/dev/fuse``, pyfuse3 and
this process (four copies per write), and re-reads come from the FUSE page cache, not the
one of the filesystem underneath. With passthrough (Linux >= 6.9, libfuse >= 3.17) the
server names the file on disk at open time and the kernel does the rest.

pyfuse3 has no API for it. ``scripts/setup.sh`` builds libfuse 3.17 into the venv, pyfuse3
against it, and ``_passthrough.c`` into a small library that pyfuse3 binds to in place of
four libfuse functions (it must be loaded before pyfuse3 is imported, which this module
does when the package is imported). Where any piece is missing, :data:`LIBRARY` is ``None``
and mounts work as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import sys
from pathlib import Path

__all__ = ["LIBRARY", "Passthrough", "libfuse_version", "unavailable_reason"]

_log = logging.getLogger("agentvfs.mounts")

_LIBRARY_NAME = "libagentvfs_passthrough.so"
# The soname of libfuse >= 3.17; pyfuse3 must be linked against the same library as ours.
_LIBFUSE_SONAME = b"libfuse3.so.4"


class Passthrough:
    """The loaded library: backing files registered with the kernel, open replies that
    name them, and handles whose reads it answers from a descriptor."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._lib = lib
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

    def request(self, on: bool) -> None:
        """Ask for passthrough when the next session starts (before ``pyfuse3.init``)."""
        self._lib.agentvfs_pt_request(1 if on else 0)

    def granted(self) -> bool:
        """The kernel agreed to passthrough for the running session."""
        return bool(self._lib.agentvfs_pt_granted())

    def open_backing(self, fd: int) -> int:
        """Register ``fd`` with the kernel; its backing id.

        Raises
        ------
        OSError
            The kernel refused (``EPERM`` without CAP_SYS_ADMIN, ``ELOOP`` for a file on a
            stacked filesystem, ...).
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


def _candidates() -> list[Path]:
    explicit = os.environ.get("AGENTVFS_PASSTHROUGH_LIB")
    if explicit:
        return [Path(explicit)]
    return [Path(sys.prefix) / "opt" / "libfuse" / "lib" / _LIBRARY_NAME]


def _pyfuse3_links_libfuse_317() -> bool:
    spec = importlib.util.find_spec("pyfuse3")
    if spec is None or spec.origin is None:
        return False
    folder = Path(spec.origin).parent
    for extension in [*folder.glob("*.so"), Path(spec.origin)]:
        if extension.suffix == ".so" and extension.is_file():
            # The soname sits in the extension's dynamic string table: linked against it.
            return _LIBFUSE_SONAME + b"\0" in extension.read_bytes()
    return False


def _load() -> tuple[Passthrough | None, str]:
    if os.environ.get("AGENTVFS_PASSTHROUGH", "1") == "0":
        return None, "turned off by AGENTVFS_PASSTHROUGH=0"
    path = next((p for p in _candidates() if p.is_file()), None)
    if path is None:
        return None, f"{_LIBRARY_NAME} is not installed (scripts/setup.sh builds it)"
    if "pyfuse3" in sys.modules:
        return None, "pyfuse3 was imported before agentvfs.mounts"
    try:
        if not _pyfuse3_links_libfuse_317():
            return (
                None,
                "pyfuse3 is not built against libfuse >= 3.17 (scripts/setup.sh rebuilds it)",
            )
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        if lib.agentvfs_pt_version() != 4:
            return None, f"{path} is of another version"
    except OSError as exc:
        return None, f"{path} cannot be loaded: {exc}"
    return Passthrough(lib, str(path)), ""


LIBRARY, _REASON = _load()


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


def unavailable_reason() -> str | None:
    """``None`` when passthrough can be asked for in this process, else why not (the kernel
    may still refuse it when a mount starts)."""
    return None if LIBRARY is not None else _REASON
