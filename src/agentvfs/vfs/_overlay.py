"""``OverlayFilesystem``: copy-on-write over any filesystem, with a guarded commit.

Reads fall through to a ``base`` filesystem; every change lands in an ``upper`` one. Deleting
(or renaming away) something that ``base`` shows records a *whiteout*; a directory removed
and made again is *opaque* (it shows only what the overlay put there since). ``base`` is never
written until :meth:`OverlayFilesystem.commit`, which applies the changes into ``base`` or
another filesystem, each one guarded by the version of ``base`` it was derived from.

Where the overlay keeps its records
-----------------------------------

Whiteouts, opaque directories and the base version of every changed path are one JSON
document in the upper filesystem, ``.agentvfs-overlay/manifest.json``, not marker files
beside the user's (``.wh.name``, as the kernel's overlayfs and OCI layers do):

- a marker beside the files has a name an agent can also write, list or delete, and a
  directory whose markers live inside it makes "rmdir, then mkdir of the same name" need an
  opaque flag kept in the directory that is being emptied; one reserved name at the root of
  the upper filesystem is the only thing to hide and refuse;
- one document is replaced whole, so a whiteout and the base version it guards appear
  together or not at all, on every backend (object stores have no atomic rename of several
  keys) and without empty-directory markers;
- it is small: a removed directory is one entry however large its tree, and new files need
  no entry at all (a file in the upper filesystem without one was created where ``base``
  had nothing). Only the base versions of a removed tree are listed one by one, because the
  commit must not delete a file that changed in the target since.

The cost is one write of the document when the overlay first changes a path that ``base``
has; later writes of that path, and writes of new files, write nothing more. The document is
kept in memory and written through, so one overlay object owns its upper filesystem: two
overlays writing into one upper filesystem at once would overwrite each other's records.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, TypeVar

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import KnownVersions, Version
from ._backend_fs import _named
from ._base import (
    WorkspaceFilesystem,
    as_bytes,
    decoded,
    download_file,
    drop_hidden,
    filter_extension,
    list_stats,
    new_id,
    order_tree,
    publish_file,
    read_range,
    read_range_into,
    run_sync,
    upload_file,
)
from ._records import Capabilities, FileEntry, FileStat, _replace_stat

__all__ = ["CommitReport", "OverlayFilesystem"]

T = TypeVar("T")

#: The one name the overlay keeps for itself, at the root of the upper filesystem.
RESERVED = ".agentvfs-overlay"
MANIFEST = f"{RESERVED}/manifest.json"
_FORMAT = 1

#: What a path held in ``base`` before the overlay first changed it: a file's version, or a
#: directory. A path with no record held nothing.
Origin = Version | Literal["directory"]

Layer = Literal["upper", "base"]
#: Prefixes of the versions the overlay shows, so that a version seen in one layer never
#: matches a version of the other (two memory stores both count ``m1``, ``m2``...).
_TAGS: dict[Layer, str] = {"upper": "u:", "base": "b:"}


class _Found(NamedTuple):
    layer: Layer
    stat: FileStat


@dataclass(frozen=True, slots=True)
class CommitReport:
    """What :meth:`OverlayFilesystem.commit` did.

    Attributes
    ----------
    applied : tuple of str
        Paths changed in the target: files written or deleted, directories made or removed.
    conflicts : tuple of str
        Paths left in the overlay because the target changed them since the overlay's base
        version (or a type changed: a file where a directory was).
    reasons : mapping of str to str
        Why each path in ``conflicts`` conflicts.
    """

    applied: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ok(self) -> bool:
        """True when nothing conflicted."""
        return not self.conflicts


class _Records:
    """The overlay's records: whiteouts (``hidden``) and base versions (``origins``)."""

    def __init__(self) -> None:
        #: Paths below and at which ``base`` is not shown (a whiteout; with a directory of
        #: the upper layer at the same path, an opaque directory).
        self.hidden: set[str] = set()
        #: The base version of every path of ``base`` the overlay replaced or hid.
        self.origins: dict[str, Origin] = {}

    def __bool__(self) -> bool:
        return bool(self.hidden or self.origins)

    def dump(self) -> bytes:
        origins: dict[str, Any] = {}
        for path, origin in sorted(self.origins.items()):
            if origin == "directory":
                origins[path] = {"type": "directory"}
            else:
                assert isinstance(origin, Version)
                moment = origin.modified_at.isoformat() if origin.modified_at else None
                origins[path] = {"type": "file", "etag": origin.etag, "modified_at": moment}
        document = {"format": _FORMAT, "hidden": sorted(self.hidden), "origins": origins}
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def load(cls, raw: bytes) -> _Records:
        """Parse a manifest; ``ValueError`` naming what is wrong."""
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise ValueError(f"not an overlay manifest of format {_FORMAT}")
        hidden, origins = document.get("hidden"), document.get("origins")
        if not isinstance(hidden, list) or not isinstance(origins, dict):
            raise ValueError("'hidden' must be a list and 'origins' an object")
        records = cls()
        for path in hidden:
            records.hidden.add(_stored_path(path))
        for path, origin in origins.items():
            if not isinstance(origin, dict) or origin.get("type") not in ("file", "directory"):
                raise ValueError(f"origin of {path!r} is not a file or directory record")
            if origin["type"] == "directory":
                records.origins[_stored_path(path)] = "directory"
                continue
            etag, moment = origin.get("etag"), origin.get("modified_at")
            if not isinstance(etag, str | None) or not isinstance(moment, str | None) or (etag is None and moment is None):
                raise ValueError(f"origin of {path!r} needs an etag or a modification time")
            when = datetime.fromisoformat(moment) if moment is not None else None
            records.origins[_stored_path(path)] = Version(etag, when)
        return records


def _stored_path(path: object) -> str:
    """A path read from a manifest, refused unless it is a normalised path of the view."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"bad path {path!r}")
    try:
        clean = _paths.normalize(path)
    except (OSError, ValueError):
        raise ValueError(f"bad path {path!r}") from None
    if clean != path or _reserved(clean):
        raise ValueError(f"bad path {path!r}")
    return clean


def _reserved(rel: str) -> bool:
    return rel == RESERVED or rel.startswith(RESERVED + "/")


def _under(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or below it."""
    return path == top or path.startswith(top + "/")


def _depth(path: str) -> int:
    return path.count("/")


class OverlayFilesystem(WorkspaceFilesystem):
    """Copy-on-write over ``base``: reads fall through to it, changes go to ``upper``.

    Listings merge both layers; a file of ``base`` that is appended to or edited is copied
    up whole; deleting or renaming away what ``base`` has records a whiteout, and a directory
    of ``base`` removed and made again is empty (opaque). ``base`` is never written by the
    overlay's operations, only by :meth:`commit`. ``base`` may be read-only (a snapshot).

    Versions (``FileStat.etag``) are those of the layer the file is in, prefixed with the
    layer (``u:``, ``b:``), so a version seen before a copy-up never matches the copy:
    ``expected_mtime`` and conditional publishes work as on any filesystem.

    The name ``.agentvfs-overlay`` at the root is the overlay's own (its records, in the
    upper filesystem): it is never listed, reads as missing and cannot be written. One
    overlay object owns its upper filesystem; see the module's notes.

    Parameters
    ----------
    base : WorkspaceFilesystem
        What the overlay shows until changed; never written except by :meth:`commit`.
    upper : WorkspaceFilesystem
        Where changes and the overlay's records are kept; writable unless ``read_only``.
    id, read_only, display_name, description, icon, instructions, text_extensions
        See :class:`WorkspaceFilesystem`. ``read_only`` refuses every change, ``commit``
        and ``discard`` too.

    Raises
    ------
    TypeError
        ``base`` or ``upper`` is not a ``WorkspaceFilesystem``.
    ValueError
        ``base`` and ``upper`` are one object, or ``upper`` is read-only in a writable
        overlay.

    Examples
    --------
    >>> from agentvfs.vfs import BackendFilesystem, MemoryBackend, OverlayFilesystem
    >>> overlay = OverlayFilesystem(BackendFilesystem(MemoryBackend()), BackendFilesystem(MemoryBackend()))
    """

    name = "OverlayFilesystem"
    provider = "overlay"

    def __init__(
        self,
        base: WorkspaceFilesystem,
        upper: WorkspaceFilesystem,
        *,
        id: str | None = None,
        read_only: bool = False,
        display_name: str | None = None,
        description: str | None = None,
        icon: str | None = None,
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        text_extensions: Iterable[str] = (),
    ) -> None:
        for role, fs in (("base", base), ("upper", upper)):
            if not isinstance(fs, WorkspaceFilesystem):
                raise TypeError(f"{role} must be a WorkspaceFilesystem, not {type(fs).__name__}")
        if base is upper:
            raise ValueError("base and upper must be two filesystems: the upper one keeps the changes")
        if upper.read_only and not read_only:
            raise ValueError(
                "the upper filesystem is read-only, so the overlay could keep no change: "
                "pass a writable upper filesystem, or read_only=True"
            )
        super().__init__(
            id=id or new_id("overlay-fs"),
            read_only=read_only,
            display_name=display_name,
            description=description,
            icon=icon,
            instructions=instructions,
            text_extensions=text_extensions,
        )
        self.base = base
        self.upper = upper
        self.capabilities = Capabilities(
            empty_dirs=True,
            atomic_rename=False,
            versions=base.capabilities.versions and upper.capabilities.versions,
            blocking=base.capabilities.blocking or upper.capabilities.blocking,
            digest_etags=base.capabilities.digest_etags or upper.capabilities.digest_etags,
        )
        self._records = _Records()
        self._known = KnownVersions()
        # The records are changed from any thread (a mount serves from its own event loop),
        # so a thread lock; it is held only around in-memory steps, never across an await.
        self._lock = threading.Lock()
        self._generation = 0  # of the records in memory
        self._landed = 0  # of the newest records whose write has completed
        self._committing = False
        #: Every path of the upper layer (True for a directory); see :meth:`_index`.
        self._upper_index: dict[str, bool] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Initialise both layers and read the overlay's records from the upper one.

        Raises
        ------
        ValueError
            The records are damaged (the message says how; :meth:`discard` drops them with
            the changes).
        """
        await self.base.ensure_ready()
        await self.upper.ensure_ready()
        try:
            raw = await self.upper.read_file(MANIFEST)
        except (FileNotFoundError, NotADirectoryError):
            return
        assert isinstance(raw, bytes)
        try:
            records = _Records.load(raw)
        except ValueError as exc:
            raise ValueError(
                f"the overlay's records in {MANIFEST} of the upper filesystem are damaged: {exc}; "
                "discard() drops them with the overlay's changes"
            ) from None
        with self._lock:
            self._records = records

    async def _ready(self) -> None:
        if self.status != "ready":
            await self.ensure_ready()

    @property
    def location(self) -> str | None:
        upper, base = self.upper.location, self.base.location
        if upper is None or base is None:
            return None
        return f"{upper} over {base}"

    def default_instructions(self) -> str:
        return self.base.default_instructions()

    def metadata(self) -> dict[str, Any]:
        return {"base": self.base.provider, "upper": self.upper.provider}

    # -- paths and layers ------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        """``path`` normalised, ``FileNotFound`` for the reserved name (the view has none)."""
        rel = _paths.normalize(path)
        if _reserved(rel):
            raise FileNotFound(path)
        return rel

    def _writable(self, path: str, operation: str) -> str:
        """``path`` normalised for a change; refuses read-only mode and the reserved name."""
        self._check_writable(operation)
        rel = _paths.normalize(path)
        if _reserved(rel):
            raise PermissionDenied(path, f"{operation} ({RESERVED} is reserved for the overlay's records)")
        return rel

    def _hidden_at(self, rel: str) -> bool:
        """Whether a whiteout hides ``base`` at ``rel`` (at it or at an ancestor)."""
        hidden = self._records.hidden
        if not hidden:
            return False
        while rel:
            if rel in hidden:
                return True
            rel = _paths.dirname(rel)
        return False

    # The overlay keeps an index of every path in the upper layer, so that a path it never
    # changed goes straight to base: asking the upper layer about a path it does not have costs
    # a request on object stores, and a scan of the whole store in fsspec's memory store. The
    # index is built by one recursive listing and kept up to date by the overlay's own changes
    # (it owns the upper layer); after a change of the upper layer that failed, whose effect is
    # unknown, it is dropped and built again when next needed.

    async def _index(self) -> dict[str, bool]:
        """Every path of the upper layer, True for a directory."""
        index = self._upper_index
        if index is None:
            entries = await self.upper.readdir("", recursive=True)
            index = {e.name: e.type == "directory" for e in entries if not _reserved(e.name)}
            self._upper_index = index
        return index

    @staticmethod
    def _file_above(index: Mapping[str, bool], rel: str) -> bool:
        """Whether a file of the upper layer is above ``rel`` (and so hides base there)."""
        parent = _paths.dirname(rel)
        while parent:
            if index.get(parent) is False:
                return True
            parent = _paths.dirname(parent)
        return False

    async def _changing_upper(
        self, change: Awaitable[T], *, added: str | None = None, is_dir: bool = False, removed: str | None = None
    ) -> T:
        """Run ``change`` of the upper layer and keep the index: ``added`` (with its
        parents) or ``removed`` (with everything below)."""
        try:
            result = await change
        except BaseException:
            self._upper_index = None
            raise
        with self._lock:
            index = self._upper_index
            if index is not None:
                if removed is not None:
                    for path in [p for p in index if _under(p, removed)]:
                        del index[path]
                if added is not None:
                    index[added] = is_dir
                    parent = _paths.dirname(added)
                    while parent:
                        index[parent] = True
                        parent = _paths.dirname(parent)
        return result

    async def _find(self, rel: str) -> _Found | None:
        """What the view has at ``rel``, and in which layer."""
        index = await self._index()
        if rel in index:
            try:
                return _Found("upper", await self.upper.stat(rel))
            except NotADirectoryError:
                return None
            except FileNotFoundError:
                self._upper_index = None  # changed behind the overlay's back
        elif self._file_above(index, rel):
            return None  # a file of the upper layer above it hides whatever base has
        if self._hidden_at(rel):
            return None
        stat = await self._base_stat(rel)
        return None if stat is None else _Found("base", stat)

    async def _base_stat(self, rel: str) -> FileStat | None:
        try:
            return await self.base.stat(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _public(self, found: _Found) -> FileStat:
        """``found`` as the view shows it: its version tagged with its layer."""
        stat = found.stat
        if stat.etag is not None:
            stat = _replace_stat(stat, etag=_TAGS[found.layer] + stat.etag)
        self._known.remember(stat)
        return stat

    def _check_expected(self, path: str, rel: str, expected: datetime | FileStat, current: _Found) -> None:
        guard = self._known.guard(rel, expected)
        public = self._public(current)
        if not guard.matches(public):
            raise StaleFileError(path, guard.modified_at, public.modified_at)

    # -- the records ---------------------------------------------------------------------------

    async def _save(self) -> None:
        """Write the records in memory to the upper layer (none: remove the document).

        Concurrent saves may complete out of order; one that completes after a newer one
        has landed writes again, so the document ends with the newest records.
        """
        while True:
            with self._lock:
                generation = self._generation
                data = self._records.dump() if self._records else None
            if data is None:
                await self.upper.rmdir(RESERVED, recursive=True, force=True)
            else:
                await self.upper.write_file(MANIFEST, data)
            with self._lock:
                overtaken = self._landed > generation
                self._landed = max(self._landed, generation)
            if not overtaken:
                return

    async def _note(self, rel: str, origin: Origin) -> None:
        """Record the base version of ``rel`` before the overlay first changes it."""
        with self._lock:
            if rel in self._records.origins:
                return
            self._records.origins[rel] = origin
            self._generation += 1
        await self._save()

    async def _hide(self, rel: str, base_stat: FileStat) -> None:
        """Hide ``base`` at and below ``rel`` (a whiteout), recording the base version of
        everything hidden so that the commit deletes only what it saw."""
        found: dict[str, Origin] = {}
        if base_stat.type == "directory":
            found[rel] = "directory"
            pending = [rel]
            while pending:
                directory = pending.pop()
                try:
                    children = await list_stats(self.base, directory)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for child in children:
                    below = _paths.join(directory, child.name)
                    if child.type == "directory":
                        found[below] = "directory"
                        pending.append(below)
                    else:
                        found[below] = Version.of(child)
        else:
            found[rel] = Version.of(base_stat)
        with self._lock:
            records = self._records
            for path, origin in found.items():
                records.origins.setdefault(path, origin)
            # Whiteouts below this one say nothing more (their base versions stay).
            records.hidden = {h for h in records.hidden if not _under(h, rel)}
            records.hidden.add(rel)
            self._generation += 1
        await self._save()

    # -- reads -------------------------------------------------------------------------------

    async def stat(self, path: str) -> FileStat:
        """Metadata of ``path`` in the layer that shows it; see :meth:`WorkspaceFilesystem.stat`."""
        rel = self._rel(path)
        await self._ready()
        if not rel:
            try:
                return self._public(_Found("base", await self.base.stat("")))
            except FileNotFoundError:
                return self._public(_Found("upper", await self.upper.stat("")))
        found = await self._find(rel)
        if found is None:
            raise FileNotFound(path)
        return self._public(found)

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """Read a whole file from the layer that shows it; see :meth:`WorkspaceFilesystem.read_file`."""
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        data = await self._from_layer(path, rel, lambda fs: fs.read_file(rel))
        assert isinstance(data, bytes)
        return decoded(data, encoding, path)

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of a file, read from the layer that shows it."""
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        return await self._from_layer(path, rel, lambda fs: read_range(fs, rel, start, end))

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read from ``start`` into ``buffer`` from the layer that shows the file."""
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        return await self._from_layer(path, rel, lambda fs: read_range_into(fs, rel, start, buffer))

    async def read_range_pinned(self, path: str, start: int, buffer: memoryview, version: str) -> int:
        """:meth:`read_range_into` of the version ``version`` (an ``etag`` this overlay
        showed), from the layer that version is in; see :class:`~agentvfs.vfs.SupportsPinnedRead`.

        Raises
        ------
        StaleFileError
            ``ESTALE``: that version is gone.
        """
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        await self._ready()
        for layer, tag in _TAGS.items():
            if version.startswith(tag):
                fs = self.upper if layer == "upper" else self.base
                if layer == "base" and self._hidden_at(rel):
                    raise StaleFileError(path, None, None)
                try:
                    return await read_range_into(fs, rel, start, buffer, version=version[len(tag) :])
                except FileNotFoundError:
                    raise StaleFileError(path, None, None) from None
        return await self.read_range_into(path, start, buffer)

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path``, streamed where its layer can."""
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        await self._from_layer(path, rel, lambda fs: download_file(fs, rel, local_path))

    async def _from_layer(self, path: str, rel: str, call: Callable[[WorkspaceFilesystem], Awaitable[T]]) -> T:
        """``call`` on the upper layer, else (not hidden) on ``base``; errors name ``path``."""
        await self._ready()
        try:
            index = await self._index()
            if rel in index:
                try:
                    return await call(self.upper)
                except NotADirectoryError:
                    raise FileNotFound(rel) from None
                except FileNotFoundError:
                    self._upper_index = None  # changed behind the overlay's back
            elif self._file_above(index, rel):
                raise FileNotFound(rel)
            if self._hidden_at(rel):
                raise FileNotFound(rel)
            return await call(self.base)
        except FilesystemError as exc:
            renamed = _named(exc, rel, path) if isinstance(exc, _ONE_PATH) else exc
            if renamed is exc:
                raise
            raise renamed from None

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        """List a directory, merging both layers; see :meth:`WorkspaceFilesystem.readdir`.

        A recursive listing is one recursive listing of each layer (one paginated request
        each on object stores), merged.
        """
        rel = self._rel_dir(path)
        await self._ready()

        async def listing(fs: WorkspaceFilesystem) -> list[FileEntry]:
            if recursive:
                return await fs.readdir(rel, recursive=True, max_depth=max_depth)
            return await fs.readdir(rel)

        upper, base = await self._both(path, rel, listing)
        found: dict[str, FileEntry] = {}
        upper_files = {e.name for e in upper if e.type == "file"}
        for entry in base:
            if self._shown_from_base(rel, entry.name, upper_files):
                found[entry.name] = entry
        for entry in upper:
            found[entry.name] = entry
        if not rel:
            found = {n: e for n, e in found.items() if not _reserved(n)}
        entries = order_tree(found) if recursive else [found[n] for n in sorted(found)]
        return filter_extension(entries, extension)

    async def list_stats(self, path: str = "") -> list[FileStat]:
        """Metadata of every child of ``path``, merged: one listing of each layer."""
        rel = self._rel_dir(path)
        await self._ready()
        upper, base = await self._both(path, rel, lambda fs: list_stats(fs, rel))
        found: dict[str, FileStat] = {}
        for stat in base:
            if self._shown_from_base(rel, stat.name, ()):
                found[stat.name] = self._public(_Found("base", stat))
        for stat in upper:
            found[stat.name] = self._public(_Found("upper", stat))
        if not rel:
            found.pop(RESERVED, None)
        return [found[n] for n in sorted(found)]

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """List a whole tree, merged (see :meth:`readdir`); hidden entries dropped unless
        ``include_hidden``."""
        entries = await self.readdir(path, recursive=True, max_depth=max_depth)
        return entries if include_hidden else drop_hidden(entries)

    def _rel_dir(self, path: str) -> str:
        rel = _paths.normalize(path)
        if _reserved(rel):
            raise DirectoryNotFound(path)
        return rel

    async def _both(
        self, path: str, rel: str, listing: Callable[[WorkspaceFilesystem], Awaitable[list[T]]]
    ) -> tuple[list[T], list[T]]:
        """``listing`` of the directory ``rel`` in each layer that has one; the errors of
        a listing when neither has it."""
        upper: list[T] | None = None
        base: list[T] | None = None
        missing: OSError | None = None
        index = await self._index()
        if index.get(rel) is False:
            raise NotDirectory(path)
        if self._file_above(index, rel):
            raise DirectoryNotFound(path)
        if not rel or rel in index:
            try:
                upper = await listing(self.upper)
            except FileNotFoundError as exc:
                missing = exc
            except NotADirectoryError:
                raise NotDirectory(path) from None
        if not self._hidden_at(rel):
            try:
                base = await listing(self.base)
            except FileNotFoundError as exc:
                missing = exc
            except NotADirectoryError:
                if upper is None:
                    raise NotDirectory(path) from None
        if upper is None and base is None:
            if isinstance(missing, DirectoryNotFound) and missing.path != path:
                raise DirectoryNotFound(path) from None
            raise missing or DirectoryNotFound(path)
        return upper or [], base or []

    def _shown_from_base(self, rel: str, name: str, upper_files: Iterable[str]) -> bool:
        """Whether the base entry ``name`` (relative to ``rel``) shows: not below a
        whiteout, nor below a file of the upper layer."""
        if not self._records.hidden and not upper_files:
            return True
        parts = name.split("/")
        files = upper_files if isinstance(upper_files, set) else set(upper_files)
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if _paths.join(rel, prefix) in self._records.hidden:
                return False
            if depth < len(parts) and prefix in files:
                return False
        return True

    # -- writes ------------------------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        recursive: bool = True,
        overwrite: bool = True,
        mime_type: str | None = None,
        expected_mtime: datetime | FileStat | None = None,
    ) -> None:
        """Write a whole file into the upper layer (a copy-up of a base file records its
        base version); see :meth:`WorkspaceFilesystem.write_file`."""
        rel = self._writable(path, "write_file")
        data = as_bytes(content)
        if not rel:
            raise IsDirectory(path)
        await self._ready()
        current = await self._find(rel)
        if current is not None:
            if current.stat.type == "directory":
                raise IsDirectory(path)
            if not overwrite:
                raise FileExists(path)
            if expected_mtime is not None:
                self._check_expected(path, rel, expected_mtime, current)
        await self._make_parent(path, rel, recursive)
        if current is not None and current.layer == "upper":
            # The upper layer's own compare-and-swap against the version just checked.
            guard = current.stat if expected_mtime is not None else None
            await self._changing_upper(
                self.upper.write_file(rel, data, mime_type=mime_type, expected_mtime=guard), added=rel
            )
            return
        if current is not None:
            await self._note(rel, Version.of(current.stat))
        await self._changing_upper(
            self.upper.write_file(rel, data, overwrite=overwrite, mime_type=mime_type), added=rel
        )

    async def publish_file(
        self, local_path: str, path: str, *, expected: Version | None = None, create: bool = False
    ) -> str | None:
        """Publish the local file ``local_path`` as ``path`` in the upper layer, only over
        the version ``expected`` (one this overlay showed) or, with ``create``, only where
        the view has nothing; see :class:`~agentvfs.vfs.SupportsConditionalUpload`.

        Raises
        ------
        StaleFileError
            ``ESTALE``: the view shows another version now, or none.
        FileExists
            ``EEXIST``: ``create``, and something is there.
        """
        rel = self._writable(path, "upload_file")
        if not rel:
            raise IsDirectory(path)
        await self._ready()
        current = await self._find(rel)
        if current is not None and current.stat.type == "directory":
            raise IsDirectory(path)
        if create and current is not None:
            raise FileExists(path)
        if expected is not None:
            if current is None:
                raise StaleFileError(path, expected.modified_at, None)
            public = self._public(current)
            if not expected.matches(public):
                raise StaleFileError(path, expected.modified_at, public.modified_at)
        await self._make_parent(path, rel, True)
        if current is not None and current.layer == "upper":
            guard = Version.of(current.stat) if expected is not None else None
            version = await self._changing_upper(
                publish_file(self.upper, local_path, rel, expected=guard), added=rel
            )
        else:
            if current is not None:
                await self._note(rel, Version.of(current.stat))
            version = await self._changing_upper(
                publish_file(self.upper, local_path, rel, create=create), added=rel
            )
        return None if version is None else _TAGS["upper"] + version

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish the local file ``local_path`` as ``path`` (into the upper layer)."""
        await self.publish_file(local_path, path)

    async def _make_parent(self, display: str, rel: str, recursive: bool) -> None:
        """Make sure the view has the parent directory of ``rel``, and the upper layer too."""
        parent = _paths.dirname(rel)
        if not parent or (await self._index()).get(parent):
            return  # the upper layer has it, so the view has it
        found = await self._find(parent)
        if found is not None:
            if found.stat.type != "directory":
                raise NotDirectory(parent)
            if found.layer == "base":
                await self._changing_upper(self.upper.mkdir(parent, recursive=True), added=parent, is_dir=True)
            return
        if not recursive:
            raise DirectoryNotFound(_paths.dirname(display.rstrip("/")) or parent)
        await self._check_ancestors(parent)
        await self._changing_upper(self.upper.mkdir(parent, recursive=True), added=parent, is_dir=True)

    async def _check_ancestors(self, rel: str) -> None:
        """``NotDirectory`` where the nearest ancestor of ``rel`` that the view has is a file."""
        ancestor = _paths.dirname(rel)
        while ancestor:
            found = await self._find(ancestor)
            if found is not None:
                if found.stat.type != "directory":
                    raise NotDirectory(ancestor)
                return
            ancestor = _paths.dirname(ancestor)

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        """Delete a file: from the upper layer, and with a whiteout where ``base`` has it;
        see :meth:`WorkspaceFilesystem.delete_file`."""
        rel = self._writable(path, "delete_file")
        if not rel:
            raise IsDirectory(path)
        await self._ready()
        current = await self._find(rel)
        if current is None:
            if force:
                return
            raise FileNotFound(path)
        if current.stat.type == "directory":
            raise IsDirectory(path)
        await self._remove(
            rel, current, lambda: self._changing_upper(self.upper.delete_file(rel, force=True), removed=rel)
        )

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Create a directory in the upper layer; made where a base directory was removed,
        it is opaque (empty). See :meth:`WorkspaceFilesystem.mkdir`."""
        rel = self._writable(path, "mkdir")
        if not rel:
            return
        await self._ready()
        current = await self._find(rel)
        if current is not None:
            if current.stat.type != "directory":
                raise FileExists(path)
            return
        parent = _paths.dirname(rel)
        if recursive:
            await self._check_ancestors(rel)
        elif parent:
            found = await self._find(parent)
            if found is None:
                raise DirectoryNotFound(_paths.dirname(path.rstrip("/")) or parent)
            if found.stat.type != "directory":
                raise NotDirectory(parent)
        await self._changing_upper(self.upper.mkdir(rel, recursive=True), added=rel, is_dir=True)

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Remove a directory: from the upper layer, and with a whiteout where ``base`` has
        it; see :meth:`WorkspaceFilesystem.rmdir`."""
        rel = self._writable(path, "rmdir")
        if not rel:
            raise PermissionDenied(path or ".", "rmdir (the root cannot be removed)")
        await self._ready()
        current = await self._find(rel)
        if current is None:
            if force:
                return
            raise DirectoryNotFound(path)
        if current.stat.type != "directory":
            raise NotDirectory(path)
        if not recursive and await self.readdir(path):
            raise DirectoryNotEmpty(path)
        await self._remove(
            rel,
            current,
            lambda: self._changing_upper(self.upper.rmdir(rel, recursive=True, force=True), removed=rel),
        )

    async def _remove(self, rel: str, current: _Found, remove_upper: Callable[[], Any]) -> None:
        """Remove what the view has at ``rel``: a whiteout for what ``base`` has there
        (recorded before the upper copy goes, so a failure never shows base's old version
        in its place), then the upper copy."""
        if current.layer == "base":
            await self._hide(rel, current.stat)
            return
        base_stat = None if self._hidden_at(rel) else await self._base_stat(rel)
        if base_stat is not None:
            await self._hide(rel, base_stat)
        await remove_upper()

    # -- commit and discard ------------------------------------------------------------------

    async def changes(self) -> list[str]:
        """The paths the overlay changed: files and directories in the upper layer, and
        whiteouts, sorted.

        Returns
        -------
        list of str
        """
        await self._ready()
        entries = await self.upper.readdir("", recursive=True)
        paths = {e.name for e in entries if not _reserved(e.name)}
        with self._lock:
            paths |= self._records.hidden
        return sorted(paths)

    async def commit(self, into: WorkspaceFilesystem | None = None, *, force: bool = False) -> CommitReport:
        """Apply the overlay's changes into ``into`` (default: ``base``), each guarded by the
        version of ``base`` it was derived from.

        A file of the upper layer is published only over the base version it replaced (only
        where nothing is, for a new file); a deleted file is deleted only while it is that
        version (a ``stat`` and a delete: storage has no conditional delete); a removed
        directory only once the files the overlay saw in it are gone and nothing else is
        left; directories are made where missing. A path that changed in ``into`` since is
        a conflict: left in the overlay, not overwritten, and reported.

        What was applied leaves the upper layer; what conflicts stays in it (with its base
        version, so a later commit checks it again, and :meth:`discard` drops it). After a
        commit without conflicts the upper layer is empty. Into another filesystem than
        ``base``, the applied changes leave this overlay's view (which then shows ``base``
        there again).

        The commit is not atomic across paths, and changes made through the overlay while
        it runs may or may not be applied.

        Parameters
        ----------
        into : WorkspaceFilesystem, optional
            Where to apply the changes; ``base`` by default. A filesystem showing what
            ``base`` was taken from (``base`` a snapshot of it) gets guards that are exact.
        force : bool
            Apply every change without checking versions: overwrite and delete whatever the
            target has now.

        Returns
        -------
        CommitReport
            The paths applied and the paths that conflict, with the reasons.

        Raises
        ------
        WorkspaceReadOnlyError
            ``EROFS``: the overlay is read-only.
        ValueError
            ``into`` is read-only, or this overlay itself.
        RuntimeError
            Another commit of this overlay is running.
        """
        self._check_writable("commit")
        target = self.base if into is None else into
        if not isinstance(target, WorkspaceFilesystem):
            raise TypeError(f"into must be a WorkspaceFilesystem, not {type(target).__name__}")
        if target is self or target is self.upper:
            raise ValueError("into must be another filesystem than the overlay and its upper layer")
        if target.read_only:
            which = "the base filesystem" if into is None else "into"
            raise ValueError(f"cannot commit into a read-only filesystem ({which}): pass into= a writable one")
        if self._committing:
            raise RuntimeError("a commit of this overlay is already running")
        self._committing = True
        try:
            await self._ready()
            await target.ensure_ready()
            report = await _Commit(self, target, force).run()
        finally:
            self._committing = False
            self._upper_index = None  # built again from what the commit left
        if report.applied:
            self._announce("commit", report.applied)
        return report

    async def discard(self) -> None:
        """Drop every change: empty the upper layer (the overlay's records too), so the view
        is ``base`` again.

        Raises
        ------
        WorkspaceReadOnlyError
            ``EROFS``: the overlay is read-only.
        """
        self._check_writable("discard")
        await self.upper.ensure_ready()
        self._upper_index = None  # whatever happens below, the upper layer changes
        with self._lock:
            hidden = sorted(self._records.hidden)
        entries = await self.upper.readdir("")
        for entry in entries:
            if entry.type == "directory":
                await self.upper.rmdir(entry.name, recursive=True, force=True)
            else:
                await self.upper.delete_file(entry.name, force=True)
        with self._lock:
            self._records = _Records()
            self._upper_index = {}
            self._generation += 1
            self._landed = self._generation
        changed = [e.name for e in entries if not _reserved(e.name)] + hidden
        if changed:
            self._announce("discard", tuple(changed))

    def __repr__(self) -> str:
        return f"OverlayFilesystem(base={self.base!r}, upper={self.upper!r}, read_only={self.read_only})"


#: Errors that name one path, renamed to the path as the caller gave it.
_ONE_PATH = (FileNotFound, DirectoryNotFound, FileExists, IsDirectory, NotDirectory, DirectoryNotEmpty)


class _Commit:
    """One run of :meth:`OverlayFilesystem.commit`."""

    def __init__(self, overlay: OverlayFilesystem, target: WorkspaceFilesystem, force: bool) -> None:
        self.overlay = overlay
        self.upper = overlay.upper
        self.target = target
        self.force = force
        self.applied: list[str] = []
        self.reasons: dict[str, str] = {}
        #: Base paths whose deletion is done (or needs none): their records go.
        self.settled: set[str] = set()
        self.files_done: list[str] = []

    def conflict(self, path: str, reason: str) -> None:
        self.reasons.setdefault(path, reason)

    async def run(self) -> CommitReport:
        overlay = self.overlay
        entries = await self.upper.readdir("", recursive=True)
        files = {e.name for e in entries if e.type == "file" and not _reserved(e.name)}
        dirs = {e.name for e in entries if e.type == "directory" and not _reserved(e.name)}
        with overlay._lock:
            hidden = set(overlay._records.hidden)
            origins = dict(overlay._records.origins)
        # What base had below the whiteouts goes first (files, then directories, deepest
        # first), then directories are made, then files written: a file replacing a base
        # directory is written where that directory was removed.
        doomed = [p for p in origins if overlay._hidden_at(p)]
        doomed_files = [p for p in doomed if origins[p] != "directory" and p not in files]
        doomed_dirs = [p for p in doomed if origins[p] == "directory"]
        await self._delete_files(sorted(doomed_files, key=_depth, reverse=True), origins)
        await self._remove_dirs(sorted(doomed_dirs, key=_depth, reverse=True), files, dirs)
        await self._make_dirs(sorted(dirs))
        scratch = await run_sync(functools.partial(tempfile.mkdtemp, prefix="agentvfs-commit-"))
        try:
            for path in sorted(files):
                await self._write(path, origins.get(path), os.path.join(scratch, "file"))
        finally:
            await run_sync(functools.partial(shutil.rmtree, scratch, ignore_errors=True))
        await self._settle(hidden, files, dirs)
        conflicts = tuple(sorted(self.reasons))
        return CommitReport(
            applied=tuple(sorted(set(self.applied))),
            conflicts=conflicts,
            reasons=MappingProxyType(dict(self.reasons)),
        )

    async def _target_stat(self, path: str) -> FileStat | None:
        try:
            return await self.target.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def _delete_files(self, paths: Sequence[str], origins: Mapping[str, Origin]) -> None:
        for path in paths:
            origin = origins[path]
            assert isinstance(origin, Version)
            current = await self._target_stat(path)
            if current is None:
                self.settled.add(path)  # gone already: what the overlay wanted
                continue
            if current.type == "directory" and not self.force:
                self.conflict(path, "a directory is there now in the target")
                continue
            if not self.force and not origin.matches(current):
                self.conflict(path, "changed in the target since the overlay's base version")
                continue
            if current.type == "directory":
                await self.target.rmdir(path, recursive=True, force=True)
            else:
                await self.target.delete_file(path, force=True)
            self.applied.append(path)
            self.settled.add(path)

    async def _remove_dirs(self, paths: Sequence[str], files: set[str], dirs: set[str]) -> None:
        for path in paths:
            if path in dirs:
                # Made again in the overlay (opaque): it stays, and must hold nothing but
                # what the overlay has in it once base's files are gone.
                ours = {_paths.basename(p) for p in files | dirs if _paths.dirname(p) == path}
                try:
                    theirs = {e.name for e in await self.target.readdir(path)}
                except (FileNotFoundError, NotADirectoryError):
                    theirs = set()
                if theirs - ours and not self.force:
                    self.conflict(path, "the directory has entries in the target the overlay did not see")
                    continue
                for name in sorted(theirs - ours):
                    below = _paths.join(path, name)
                    if (await self.target.stat(below)).type == "directory":
                        await self.target.rmdir(below, recursive=True, force=True)
                    else:
                        await self.target.delete_file(below, force=True)
                self.settled.add(path)
                continue
            current = await self._target_stat(path)
            if current is None:
                self.settled.add(path)
                continue
            if current.type != "directory":
                if not self.force:
                    self.conflict(path, "a file is there now in the target")
                    continue
                await self.target.delete_file(path, force=True)
            elif self.force:
                await self.target.rmdir(path, recursive=True, force=True)
            else:
                try:
                    await self.target.rmdir(path)
                except DirectoryNotEmpty:
                    self.conflict(path, "the directory has entries in the target the overlay did not see")
                    continue
            self.applied.append(path)
            self.settled.add(path)

    async def _make_dirs(self, paths: Sequence[str]) -> None:
        for path in paths:
            current = await self._target_stat(path)
            if current is not None and current.type == "directory":
                continue
            if current is not None:
                if not self.force:
                    self.conflict(path, "a file is there in the target")
                    continue
                await self.target.delete_file(path, force=True)
            try:
                await self.target.mkdir(path, recursive=True)
            except (FileExistsError, NotADirectoryError):
                self.conflict(path, "a file is in the way in the target")
                continue
            self.applied.append(path)

    async def _write(self, path: str, origin: Origin | None, scratch: str) -> None:
        await download_file(self.upper, path, scratch)
        expected = origin if isinstance(origin, Version) else None
        try:
            if self.force:
                current = await self._target_stat(path)
                if current is not None and current.type == "directory":
                    await self.target.rmdir(path, recursive=True, force=True)
                await upload_file(self.target, scratch, path)
            else:
                await publish_file(self.target, scratch, path, expected=expected, create=expected is None)
        except StaleFileError as exc:
            gone = exc.actual_mtime is None
            self.conflict(path, "deleted in the target since" if gone else "changed in the target since the overlay's base version")
        except FileExistsError:
            self.conflict(path, "created in the target since the overlay began")
        except IsADirectoryError:
            self.conflict(path, "a directory is there in the target")
        except NotADirectoryError:
            self.conflict(path, "a parent is a file in the target")
        else:
            self.applied.append(path)
            self.files_done.append(path)
        finally:
            await run_sync(_remove_local, scratch)

    async def _settle(self, hidden: set[str], files: set[str], dirs: set[str]) -> None:
        """Take what was applied out of the upper layer and the records; keep conflicts."""
        overlay = self.overlay
        for path in self.files_done:
            await self.upper.delete_file(path, force=True)
        done_files = set(self.files_done)
        with overlay._lock:
            records = overlay._records
            for path in done_files | self.settled:
                if path not in self.reasons:
                    records.origins.pop(path, None)
            for top in hidden:
                # A whiteout stays while something below it still waits (a conflict).
                waiting = any(_under(p, top) for p in records.origins)
                if not waiting:
                    records.hidden.discard(top)
            remaining = {p for p in files if p not in done_files}
            # A record of a path neither waiting below a whiteout nor kept in the upper
            # layer has nothing left to guard.
            records.origins = {
                p: o for p, o in records.origins.items() if p in remaining or any(_under(p, h) for h in records.hidden)
            }
            overlay._generation += 1
        # Empty directories of the upper layer go, deepest first, except those still opaque.
        for path in sorted(dirs, key=_depth, reverse=True):
            if path in records.hidden or path in self.reasons:
                continue
            try:
                await self.upper.rmdir(path)
            except (DirectoryNotEmpty, FileNotFoundError):
                continue
        await overlay._save()


def _remove_local(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
