"""``LocalFilesystem``: a directory on this machine, with the reference's path rules."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from fsspec.implementations.local import LocalFileSystem

from ..errors import PermissionDenied
from . import _paths
from ._base import new_id
from ._disk import Disk
from ._disk_fs import DiskBackend, DiskFilesystem
from ._records import FileStat, _replace_stat

__all__ = ["LocalFilesystem"]


def _expand(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return os.path.expanduser(path)
    return path


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class LocalFilesystem(DiskFilesystem):
    """A local directory as a workspace filesystem.

    Relative paths resolve against ``base_path``. Absolute paths are host paths: with
    ``contained`` (the default) they must lie inside ``base_path`` or an allowed path, else
    :class:`~agentvfs.errors.PermissionDenied` with a hint to use a relative path. Symlinks are
    followed only while they stay inside those roots (a link may lead from ``base_path`` into
    an allowed path): nothing reachable through a link that points outside can be read, and
    nothing can be created through a linked directory that points outside. Each operation
    resolves its path once, beneath a descriptor of its root, and acts on what it found, so a
    symlink swapped in during a call cannot lead it out either (see
    :class:`~agentvfs.vfs._disk.Disk`). FIFOs, devices and sockets are never opened.

    Parameters
    ----------
    base_path : str or os.PathLike
        The workspace directory (``~`` expanded, made absolute against the current directory,
        created by ``init``).
    id : str, optional
        Default ``local-fs-<base36 time>-<random>``.
    contained : bool
        Confine paths to ``base_path`` and ``allowed_paths``. Without it any host path works.
    read_only : bool
        Refuse every write.
    allowed_paths : sequence of str
        More directories the workspace may reach (relative ones resolve against ``base_path``).
    instructions : str or callable, optional
        Replaces the default instructions.
    text_extensions : iterable of str
        Extra extensions grep reads as text.
    absolute_paths : {"host", "workspace"}
        What an absolute path outside every root means. ``"host"`` (the default, as the
        reference): the host path, refused with a hint. ``"workspace"``: a path from the
        workspace root, as agents often write them (``/notes.txt`` is ``notes.txt``); an
        absolute path inside a root is still that host path. With ``contained`` only.
    """

    name = "LocalFilesystem"

    def __init__(
        self,
        base_path: str | os.PathLike[str],
        *,
        id: str | None = None,
        contained: bool = True,
        read_only: bool = False,
        allowed_paths: Sequence[str | os.PathLike[str]] = (),
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        text_extensions: Iterable[str] = (),
        display_name: str | None = None,
        description: str | None = None,
        absolute_paths: Literal["host", "workspace"] = "host",
    ) -> None:
        if absolute_paths not in ("host", "workspace"):
            raise ValueError(f"absolute_paths must be 'host' or 'workspace', not {absolute_paths!r}")
        base = os.path.abspath(_expand(os.fspath(base_path)))
        _paths.check_name(base)
        # The wrapped fsspec root is the host root: workspace paths become host paths here,
        # so absolute paths inside an allowed directory work like the reference's.
        super().__init__(
            LocalFileSystem(),
            root="/",
            read_only=read_only,
            id=id or new_id("local-fs"),
            display_name=display_name,
            description=description,
            instructions=instructions,
            text_extensions=text_extensions,
        )
        self.provider = "local"
        self.base_path = base
        self._backend.base_dir = base
        self.contained = bool(contained)
        self.absolute_paths = absolute_paths
        self._allowed: list[str] = []
        self.set_allowed_paths(list(allowed_paths))

    # -- configuration ------------------------------------------------------------------------------

    @property
    def allowed_paths(self) -> list[str]:
        """The allowed directories, resolved to absolute paths."""
        return list(self._allowed)

    def set_allowed_paths(
        self,
        paths: Sequence[str | os.PathLike[str]] | Callable[[list[str]], Sequence[str | os.PathLike[str]]],
    ) -> None:
        """Replace the allowed paths, or update them with ``fn(current) -> new``."""
        new = paths(list(self._allowed)) if callable(paths) else paths
        resolved = []
        for item in new:
            raw = _expand(os.fspath(item))
            resolved.append(os.path.normpath(raw if os.path.isabs(raw) else os.path.join(self.base_path, raw)))
        self._allowed = resolved
        self._backend.disk = Disk([self.base_path, *resolved] if self.contained else ["/"])

    # -- path resolution ------------------------------------------------------------------------------

    def resolve_absolute_path(self, path: str) -> str | None:
        """Return the host path ``path`` names, or None when containment refuses it."""
        try:
            return "/" + self._rel(path)
        except PermissionError:
            return None

    def _rel(self, path: str) -> str:
        _paths.check_name(path)
        raw = _expand(path)
        target = os.path.normpath(raw if os.path.isabs(raw) else os.path.join(self.base_path, raw))
        # Lexically inside a root (by its path or its real path); symlinks on the way are the
        # business of each operation, which resolves beneath the root's descriptor.
        if self.contained and not self._backend.disk.contains(target):
            if self.absolute_paths == "workspace" and path.startswith("/"):
                # Joined below the root, then normalised: "/../x" is still refused.
                target = os.path.normpath(os.path.join(self.base_path, "./" + raw.lstrip("/")))
            if not self._backend.disk.contains(target):
                raise PermissionDenied(path, self._refusal(path))
        return target.lstrip("/")

    def _make_backend(self, fs: Any, root: str, listing_ttl: float) -> DiskBackend:
        # A symlink that leads out is reported with the host path it was met on.
        return DiskBackend(root, fs=fs, escape=lambda rel, display: "/" + rel)

    def _refusal(self, path: str) -> str:
        if not path.startswith("/"):
            return "access"
        stripped = path.lstrip("/")
        if not stripped:
            return "access"
        first = stripped.split("/", 1)[0]
        if os.path.lexists(os.path.join(self.base_path, first)):
            return f'access (path is outside the workspace; use a relative path like "{stripped}")'
        return 'access (path is outside the workspace; use a path relative to the workspace root, without a leading "/")'

    def _is_root(self, rel: str) -> bool:
        return not rel or "/" + rel == self.base_path

    def _public_path(self, rel: str) -> str:
        host = "/" + rel
        base = self.base_path
        if host == base:
            return ""
        # Both are normalised absolute paths: what lies inside is a plain suffix (cheaper than
        # os.path.relpath, which listing a large tree paid once per file).
        head = base.rstrip("/") + "/"
        return host[len(head) :] if host.startswith(head) else host

    def _public_stat(self, stat: FileStat) -> FileStat:
        host = "/" + stat.path
        relative = self._public_path(stat.path)
        # Only the name and path change: the disk's modes, owners, times and link targets
        # stay (a FUSE mount of this filesystem shows them).
        name = os.path.basename(host) if relative else os.path.basename(self.base_path)
        return _replace_stat(stat, name=name, path=relative)

    async def setup(self) -> None:
        """Create ``base_path`` (``mkdir -p``)."""
        await self._call(os.makedirs, self.base_path, 0o777, True)

    async def realpath(self, path: str) -> str:
        """Return the canonical path, relative to ``base_path`` when inside it."""
        return await self._call(self._realpath_sync, "/" + self._rel(path))

    def _realpath_sync(self, host: str) -> str:
        try:
            real = self._backend.disk.realpath(host)
        except Exception as exc:
            raise self._backend.refuse(exc, host.lstrip("/"), host, "realpath") from exc
        real_base = os.path.realpath(self.base_path)
        return os.path.relpath(real, real_base) if _inside(real, real_base) else real

    def _staging_root(self) -> str:
        # Beside the workspace's own files (never the host's "/", which is the wrapped root).
        return self.base_path

    # -- description ----------------------------------------------------------------------------------

    def default_instructions(self) -> str:
        """The reference's wording, naming the base path and allowed paths."""
        head = f'Local filesystem at "{self.base_path}". Relative paths resolve from this directory.'
        if not self.contained:
            return f"{head} Containment is disabled, so any path on the host filesystem is accessible."
        if self._allowed:
            return (
                f"{head} File access is restricted to this directory and the following allowed "
                f"paths: {', '.join(self._allowed)}."
            )
        return f"{head} File access is restricted to this directory."

    def get_mount_config(self) -> dict[str, Any]:
        """Return ``{"type": "local", "base_path": ...}``."""
        return {"type": "local", "base_path": self.base_path}

    @property
    def location(self) -> str | None:
        return os.fspath(self.base_path)

    def metadata(self) -> dict[str, Any]:
        """``base_path``, ``contained`` and, if any, ``allowed_paths``."""
        out: dict[str, Any] = {"base_path": self.base_path, "contained": self.contained}
        if self._allowed:
            out["allowed_paths"] = list(self._allowed)
        return out

    def __repr__(self) -> str:
        return f"LocalFilesystem(base_path={self.base_path!r}, contained={self.contained}, read_only={self.read_only})"
