"""The storage kinds under :class:`~agentvfs.vfs.FsspecFilesystem`: one :class:`Backend` class
per kind of fsspec storage, chosen once by :func:`~agentvfs.vfs.fsspec_backend`.

- :class:`FsspecBackend`: any fsspec filesystem with real directories and no atomic write
  (SFTP, WebDAV, a ``DirFileSystem``...): writes are staged in a hidden sibling and renamed
  into place;
- :class:`MemoryStoreBackend`: fsspec's in-process ``MemoryFileSystem``, read and listed
  through its dictionaries (no threads, no per-key info records);
- the object-store kinds (S3, GCS, Azure...), in :mod:`agentvfs.vfs._object_store`;
- the local disk kind, :class:`~agentvfs.vfs._disk_fs.DiskBackend`, works through
  descriptors and lives beside the ``Disk`` it uses.

Each kind is a :class:`Backend` (its seven operations on paths relative to its root), and
also offers the blocking steps the agent-facing layer runs in worker threads: those take the
path as the caller wrote it (``display``) to name it in errors. Nothing here knows of agents:
read-only mode, the workspace root's rules and the change feed live in the filesystem above.
"""

from __future__ import annotations

import contextlib
import posixpath
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    FileTooLarge,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import Backend, ByteRange, KnownVersions, Version, WriteMode, translate
from ._base import order_tree, run_sync
from ._disk import TMP_MARK, staged_name
from ._mime import get_mime_type
from ._posix import MetadataStyle, attributes_from_metadata, with_posix_attributes
from ._records import Capabilities, FileEntry, FileStat, FileType

__all__ = [
    "NEVER",
    "READ_THREADS",
    "Cancelled",
    "FsspecBackend",
    "MemoryStoreBackend",
    "display_parent",
    "names_local_disk",
]

T = TypeVar("T")

_PROVIDER_ALIASES = {"gs": "gcs", "local": "file", "s3a": "s3", "abfss": "abfs", "az": "abfs"}

#: Files read at once by a batch read on threads (read_many, grep).
READ_THREADS = 16
#: Characters that make fsspec read a path as a glob pattern in its batch calls.
_GLOB_CHARS = frozenset("*?[]{}")
_EPOCH = datetime.fromtimestamp(0, UTC)

#: The cancel event of a call that cannot be abandoned (it is never set).
NEVER = threading.Event()


class Cancelled(Exception):
    """A staged write saw its caller give up before committing."""


def display_parent(display: str) -> str:
    """How errors name the parent directory of the path the caller wrote."""
    return posixpath.dirname(display.rstrip("/")) or "."


def _to_datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _first(info: dict[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        value = info.get(key)
        if value is not None:
            return value
    return None


class FsspecBackend(Backend):
    """A filesystem of fsspec with real directories under ``root``: the generic kind.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The storage.
    root : str
        The path of ``fs`` that is this backend's root (``""``: the filesystem's own root).
    """

    capabilities = Capabilities(empty_dirs=True, atomic_rename=False, symlinks=False, versions=False, blocking=True)

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self._fs = fs
        self._root = root.rstrip("/")
        marker = getattr(fs, "root_marker", "")
        self._prefix = f"{self._root}/" if self._root else marker
        self.root_path = self._root or marker
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        #: The first protocol name of ``fs`` (``s3``, ``memory``, ``file``...).
        self.protocol = protocols[0] if protocols else "unknown"
        self.provider = _PROVIDER_ALIASES.get(self.protocol, self.protocol)
        #: The version of each file as last seen, for guards built from a modification time.
        self.known = KnownVersions()
        self._ls_kwargs: dict[str, Any] = {}
        # A guarded write checks the version, then writes: within this process the two are
        # one step (a lock per path stripe); a kind whose store checks the version itself in
        # the write (S3's If-Match) needs none.
        self._guard_locks = tuple(threading.Lock() for _ in range(64))
        #: Called with ``(rel, version, size, modified second)`` of every file a stat or
        #: listing shows (a filesystem with a content cache keeps them: a listing is a
        #: close-to-open check).
        self.seen: Callable[[str, str | None, int, int], None] | None = None

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec instance (no confinement: use with care)."""
        return self._fs

    def bpath(self, rel: str) -> str:
        """The path of ``fs`` that ``rel`` names."""
        return self._prefix + rel if rel else self.root_path

    def translate(self, exc: BaseException, display: str, operation: str) -> FilesystemError:
        """The workspace error for ``exc`` (see :func:`~agentvfs.vfs.translate`)."""
        return translate(exc, display, operation)

    def _forget_cached(self, bpath: str) -> None:
        """Drop what ``fs`` cached about ``bpath`` (object stores cache listings)."""

    # Hooks of the object-store kind for the names it keeps for write checks.
    def _written(self, rel: str, kind: str) -> None:
        """``rel`` now exists as ``kind``."""

    def _removed(self, rel: str) -> None:
        """``rel`` (and what was below it) is gone."""

    def _unsure(self, rel: str) -> None:
        """What was known of ``rel`` may be wrong now."""

    # -- setup ----------------------------------------------------------------------------------

    def probe_sync(self, rel: str = "", display: str = "") -> None:
        """One request that proves the storage answers (a stat of ``rel``)."""
        self.stat_sync(rel, display)

    def setup_sync(self) -> None:
        """Create the root directory (a filesystem with real directories needs it)."""
        if self._root:
            self._fs.makedirs(self.root_path, exist_ok=True)

    # -- metadata -------------------------------------------------------------------------------

    def info(self, rel: str) -> dict[str, Any] | None:
        """The fsspec info record of ``rel``, or None if nothing is there."""
        bpath = self.bpath(rel)
        try:
            info: dict[str, Any] = self._fs.info(bpath)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            self._forget_cached(bpath)
        return info

    def _times(self, rel: str, info: dict[str, Any], kind: FileType) -> tuple[datetime | None, datetime | None]:
        modified = _to_datetime(_first(info, ("mtime", "LastModified", "updated", "last_modified", "modified")))
        created = _to_datetime(_first(info, ("created", "timeCreated", "creation_time", "ctime")))
        return modified, created

    def _derived_etag(self, info: dict[str, Any], modified: datetime) -> str | None:
        # No native version: derive one that changes on every write even within one clock
        # tick (staged writes give a new inode).
        if "ino" in info:
            return f"{info.get('mtime')}-{info.get('size')}-{info['ino']}"
        return None

    #: Where the store keeps POSIX attributes as object metadata, how it spells them
    #: (:mod:`agentvfs.vfs._posix`); None where it keeps none or keeps them natively.
    metadata_style: MetadataStyle | None = None

    def _metadata_of(self, info: dict[str, Any]) -> dict[str, str] | None:
        """The object metadata in ``info``: ``{}`` where there is none, None where ``info``
        does not say (a listing of a store that lists no metadata)."""
        return {}

    def stat_of(self, rel: str, info: dict[str, Any]) -> FileStat:
        """The :class:`FileStat` (path ``rel``) of an info record of ``rel``."""
        kind: FileType = "directory" if info.get("type") == "directory" else "file"
        modified, created = self._times(rel, info, kind)
        modified = modified or created or _EPOCH
        etag = _first(info, ("generation", "ETag", "etag", "md5Hash", "VersionId"))
        if etag is None and kind == "file":
            etag = self._derived_etag(info, modified)
        name = _paths.basename(rel) if rel else (posixpath.basename(self._root) or "")
        stat = FileStat(
            name=name,
            path=rel,
            type=kind,
            size=int(info.get("size") or 0),
            created_at=created or modified,
            modified_at=modified,
            mime_type=get_mime_type(name) if kind == "file" else None,
            etag=str(etag).strip('"') if etag is not None and kind == "file" else None,
            # A directory's too where the store keeps one (an object store's marker object).
            metadata=self._metadata_of(info),
            **self._native_attributes(info),
        )
        if self.metadata_style is not None and stat.metadata:
            stat = with_posix_attributes(stat, attributes_from_metadata(stat.metadata))
        self.known.remember(stat)
        if self.seen is not None and kind == "file":
            self.seen(rel, stat.etag, stat.size, int(stat.modified_at.timestamp()))
        return stat

    def _native_attributes(self, info: dict[str, Any]) -> dict[str, Any]:
        """More :class:`FileStat` fields a store keeps natively (local disk: modes, owners,
        times in ns), set as the stat is made: a listing of a large tree makes one per file."""
        return {}

    def _saw(self, rel: str, info: dict[str, Any]) -> None:
        """Tell :attr:`seen` of a file a listing showed (only stores with versions of their own)."""
        if self.seen is None or info.get("type") == "directory":
            return
        etag = _first(info, ("generation", "ETag", "etag", "md5Hash", "VersionId"))
        if etag is not None:
            modified, created = self._times(rel, info, "file")
            moment = modified or created
            stamp = int(moment.timestamp()) if moment is not None else 0
            self.seen(rel, str(etag).strip('"'), int(info.get("size") or 0), stamp)

    def stat_sync(self, rel: str, display: str) -> FileStat:
        """Metadata of ``rel``; the root always exists."""
        try:
            info = self.info(rel)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "stat") from exc
        if info is None:
            if not rel:
                # The root always exists, even as an empty object-store prefix.
                return FileStat(
                    name=posixpath.basename(self._root), path="", type="directory", size=0,
                    created_at=_EPOCH, modified_at=_EPOCH,
                )
            raise FileNotFound(display)
        return self.stat_of(rel, info)

    # -- reads ----------------------------------------------------------------------------------

    def read_sync(self, rel: str, display: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of the file ``rel`` (``start`` to ``end`` where given)."""
        if not rel:
            raise IsDirectory(display)
        try:
            data: bytes = self._fs.cat_file(self.bpath(rel), start=start, end=end)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            info = self.info(rel)
            if info is not None and info.get("type") == "directory":
                raise IsDirectory(display) from None
            raise FileNotFound(display) from None
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "read_file") from exc
        return data

    def read_range_sync(self, rel: str, display: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the file ``rel``; fewer at its end."""
        try:
            return self.read_sync(rel, display, start, end)
        except FilesystemError as exc:
            # Object stores refuse a range that starts past the end (HTTP 416); a file read
            # there has nothing left, as a local file has.
            if type(exc) is not FilesystemError:
                raise
            info = self.info(rel)
            if info is None or info.get("type") != "file" or start < int(info.get("size") or 0):
                raise
            return b""

    def read_version_into_sync(self, rel: str, display: str, start: int, buffer: memoryview, version: str) -> int:
        """:meth:`read_into_sync` of the version ``version`` of ``rel`` only, where the store
        can name a version in a read (object stores); elsewhere of what is there."""
        return self.read_into_sync(rel, display, start, buffer)

    def read_exact_version_sync(self, rel: str, display: str, start: int, buffer: memoryview, version: str) -> int | None:
        """:meth:`read_version_into_sync`, but None (nothing read) where this store cannot
        pin a read to a version: what a cache keeps under a version must be that version."""
        return None

    def read_into_sync(self, rel: str, display: str, start: int, buffer: memoryview) -> int:
        """Read from ``start`` into ``buffer``; how many bytes were read."""
        data = self.read_range_sync(rel, display, start, start + len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def download_sync(self, rel: str, display: str, local_path: str) -> None:
        """Copy the file ``rel`` into the local file ``local_path``, streamed."""
        try:
            self._fs.get_file(self.bpath(rel), local_path)
        except FilesystemError:
            raise
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except Exception as exc:
            raise self.translate(exc, display, "download_file") from exc

    def cat_many(self, rels: list[str], max_bytes: int | None = None) -> dict[str, bytes | OSError]:
        """Each readable file's bytes (or ``FileTooLarge`` past ``max_bytes``); what cannot
        be read is left out."""
        if not rels:
            return {}
        if max_bytes is not None:
            return self._cat_many_bounded(rels, max_bytes)
        return self._cat(rels)

    def _cat(self, rels: list[str], **extra: Any) -> dict[str, bytes | OSError]:
        # fsspec's batch ``cat`` expands every name holding a glob character as a pattern:
        # "[br]ackets.md" would read "backets.md" and "rackets.md", never itself. Such names
        # are read one by one with ``cat_file``, which takes a path literally (the root may
        # hold such characters too).
        paths: dict[str, str] = {}
        globbed: dict[str, str] = {}
        for rel in rels:
            bpath = self.bpath(rel)
            (globbed if _GLOB_CHARS.intersection(bpath) else paths)[bpath] = rel
        out: dict[str, bytes | OSError] = {}
        if paths:
            got = self._fs.cat(list(paths), on_error="return", **extra)
            if not isinstance(got, dict):
                got = {next(iter(paths)): got}
            out.update({paths[k]: v for k, v in got.items() if k in paths and isinstance(v, bytes)})
        for bpath, rel in globbed.items():
            try:
                out[rel] = bytes(self._fs.cat_file(bpath, **extra))
            except Exception:
                continue  # unreadable, as in the batch: the caller's "not found"
        return out

    def _read_head(self, rel: str, count: int) -> bytes | None:
        """The first ``count`` bytes of ``rel`` in one ranged request, or None where this way
        cannot read it."""
        return None

    def _cat_many_bounded(self, rels: list[str], max_bytes: int) -> dict[str, bytes | OSError]:
        """Read each file's first ``max_bytes + 1`` bytes (one ranged GET each on object
        stores): an object larger than the limit, replaced since its listing or not, is known
        without fetching it whole."""

        def one(rel: str) -> bytes | OSError | None:
            data = self._read_head(rel, max_bytes + 1)
            if data is None:
                try:
                    data = bytes(self._fs.cat_file(self.bpath(rel), start=0, end=max_bytes + 1))
                except Exception:
                    # Stores refuse a range of an empty object (HTTP 416); a missing one, a
                    # directory or any other refusal is the caller's "not found".
                    info = self.info(rel)
                    if info is None or info.get("type") == "directory":
                        return None
                    if int(info.get("size") or 0) > max_bytes:
                        return FileTooLarge(rel, max_bytes)
                    try:
                        data = self.read_sync(rel, rel)
                    except OSError:
                        return None
            if len(data) > max_bytes:
                return FileTooLarge(rel, max_bytes)
            return data

        out: dict[str, bytes | OSError] = {}
        with ThreadPoolExecutor(min(READ_THREADS, len(rels)), thread_name_prefix="agentvfs-read") as pool:
            for rel, got in zip(rels, pool.map(one, rels), strict=True):
                if got is not None:
                    out[rel] = got
        return out

    # -- listings -------------------------------------------------------------------------------

    def entry(self, name: str, info: dict[str, Any]) -> FileEntry:
        """The listing entry ``name`` of an info record."""
        kind: FileType = "directory" if info.get("type") == "directory" else "file"
        link = bool(info.get("islink"))
        target = info.get("destination") if link else None
        return FileEntry(
            name=name,
            type=kind,
            size=int(info.get("size") or 0) if kind == "file" and not link else None,
            is_symlink=link,
            symlink_target=target,
        )

    def missing_dir(self, rel: str, display: str) -> FilesystemError:
        """The error for a listing of ``rel`` that found no directory."""
        info = self.info(rel)
        if info is None:
            return DirectoryNotFound(display)
        return NotDirectory(display)

    def _require_dir(self, rel: str, display: str) -> None:
        """An empty listing: fine for an empty directory, else the listing's error."""
        info = self.info(rel)
        if info is None or info.get("type") != "directory":
            raise NotDirectory(display) if info is not None else DirectoryNotFound(display)

    def list_raw(self, rel: str, display: str) -> list[dict[str, Any]]:
        """The info records of one listing of ``rel``."""
        bpath = self.bpath(rel)
        try:
            raw: list[dict[str, Any]] = self._fs.ls(bpath, detail=True, **self._ls_kwargs)
        except FileNotFoundError:
            if not rel:
                return []  # the root always exists, even as an empty object-store prefix
            raise self.missing_dir(rel, display) from None
        except NotADirectoryError:
            # The path itself is a file (ENOTDIR), or a file sits above it: then, as on
            # object stores, the directory is simply not there (ENOENT).
            raise self.missing_dir(rel, display) from None
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "readdir") from exc
        finally:
            self._forget_cached(bpath)
        return raw

    def children(self, rel: str, raw: list[dict[str, Any]], display: str) -> dict[str, dict[str, Any]]:
        """Name -> info of the entries of ``rel``, without markers, staging files or itself."""
        own = self.bpath(rel).rstrip("/")
        out: dict[str, dict[str, Any]] = {}
        for info in raw:
            full = info["name"].rstrip("/")
            if full == own or not full:
                if info.get("type") == "file" and not info["name"].endswith("/") and full == own and rel:
                    raise NotDirectory(display)
                continue
            name = posixpath.basename(full)
            if TMP_MARK in name:
                continue
            # Where a key and a prefix share a name, the directory wins (it shadows the file).
            if name in out and out[name].get("type") == "directory":
                continue
            out[name] = info
        return out

    def listed(self, rel: str, display: str) -> dict[str, dict[str, Any]]:
        """Name -> info of the children of ``rel`` from one listing (an empty listing must
        come from a directory that exists)."""
        raw = self.list_raw(rel, display)
        if not raw and rel:
            self._require_dir(rel, display)
        return self.children(rel, raw, display)

    def list_sync(self, rel: str, display: str) -> list[FileEntry]:
        """The entries of the directory ``rel``, by name."""
        children = self.listed(rel, display)
        if self.seen is not None:
            for name, info in children.items():
                self._saw(_paths.join(rel, name) if rel else name, info)
        return [self.entry(name, children[name]) for name in sorted(children)]

    def list_stats_sync(self, rel: str, display: str) -> list[FileStat]:
        """Metadata of every child of ``rel`` from one listing, by name."""
        children = self.listed(rel, display)
        return [
            self.stat_of(_paths.join(rel, name) if rel else name, info)
            for name, info in sorted(children.items())
        ]

    def walk_sync(self, rel: str, display: str, max_depth: int, cancel: threading.Event = NEVER) -> list[FileEntry]:
        """Every entry below ``rel`` down to ``max_depth`` levels, names relative to it."""
        entries: dict[str, FileEntry] = {}
        for sub, info in self._walk_infos(rel, display, max_depth).items():
            if sub in entries and entries[sub].type == "directory":
                continue
            entries[sub] = self.entry(sub, info)
            # Object stores list keys; make sure every implied directory has its entry.
            parent = _paths.dirname(sub)
            while parent and parent not in entries:
                entries[parent] = FileEntry(name=parent, type="directory")
                parent = _paths.dirname(parent)
        return order_tree(entries)

    def walk_stats_sync(
        self, rel: str, display: str, max_depth: int, cancel: threading.Event = NEVER
    ) -> list[tuple[str, FileStat]]:
        """The metadata of every file below ``rel`` down to ``max_depth`` levels, from the
        same one listing as :meth:`walk_sync`; names relative to ``rel``."""
        out: list[tuple[str, FileStat]] = []
        for sub, info in self._walk_infos(rel, display, max_depth).items():
            stat = self.stat_of(_paths.join(rel, sub) if rel else sub, info)
            if stat.type == "file":
                out.append((sub, stat))
        return out

    def _walk_infos(self, rel: str, display: str, max_depth: int) -> dict[str, dict[str, Any]]:
        """The listing infos of every key below ``rel`` (one paginated listing), by name
        relative to it, down to ``max_depth`` levels."""
        bpath = self.bpath(rel)
        try:
            # No maxdepth: with one, s3fs and gcsfs fall back to one listing per directory;
            # without, the whole tree is one paginated flat listing. Depth is cut below.
            found: dict[str, dict[str, Any]] = self._fs.find(
                bpath, withdirs=True, detail=True, **self._ls_kwargs
            )
        except FileNotFoundError:
            raise self.missing_dir(rel, display) from None
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "readdir") from exc
        finally:
            self._forget_cached(bpath)
        own = bpath.rstrip("/")
        head = own + "/" if own else ""
        infos: dict[str, dict[str, Any]] = {}
        for key, info in found.items():
            full = key.rstrip("/")
            if full == own:
                # The directory's own marker object ("dir/") is no file in the way.
                marker = key.endswith("/") or str(info.get("name", "")).endswith("/")
                if info.get("type") == "file" and rel and not marker:
                    raise NotDirectory(display)
                continue
            if not full.startswith(head):
                continue
            sub = full[len(head) :]
            if TMP_MARK in sub or sub.count("/") >= max_depth:
                continue
            if sub in infos and infos[sub].get("type") == "directory":
                continue
            infos[sub] = info
            if self.seen is not None:
                self._saw(_paths.join(rel, sub) if rel else sub, info)
        if not found and rel:
            self._require_dir(rel, display)
        return infos

    # -- writes ---------------------------------------------------------------------------------

    def _write_options(self, mime_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, Any]:
        """Keyword arguments of the PUT that keep a content type and metadata (object stores)."""
        return {}

    def _check_guard(self, rel: str, display: str, guard: Version) -> FileStat:
        """Refuse unless the file ``rel`` is ``guard``'s version; return what is there."""
        info = self.info(rel)
        if info is None:
            raise StaleFileError(display, guard.modified_at, None)
        current = self.stat_of(rel, info)
        if current.type == "directory":
            raise IsDirectory(display)
        if not guard.matches(current):
            raise StaleFileError(display, guard.modified_at, current.modified_at)
        return current

    def _guarded(self, rel: str, display: str, guard: Version, extra: dict[str, Any]) -> dict[str, Any]:
        """The write options under ``guard`` (checked here where the store cannot)."""
        self._check_guard(rel, display, guard)
        return extra

    def _refused(self, exc: OSError, extra: dict[str, Any]) -> bool:
        """Whether ``exc`` is the store refusing a conditional write."""
        return False

    #: Whether the store itself refuses a write of a stale version (no lock needed).
    _store_checks_versions = False

    def _guard_lock(self, rel: str, guarded: bool) -> contextlib.AbstractContextManager[object]:
        if not guarded or self._store_checks_versions:
            return contextlib.nullcontext()
        return self._guard_locks[hash(rel) % len(self._guard_locks)]

    def write_sync(
        self,
        rel: str,
        display: str,
        data: bytes,
        *,
        recursive: bool = True,
        overwrite: bool = True,
        guard: Version | None = None,
        mime_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
        cancel: threading.Event = NEVER,
    ) -> None:
        """Write the whole file ``rel`` atomically.

        Raises
        ------
        StaleFileError
            ``guard`` does not match the file, or the file is gone (``actual_mtime`` None).
        """
        if not rel:
            raise IsDirectory(display)
        extra = self._write_options(mime_type, metadata)
        with self._guard_lock(rel, guard is not None):
            if guard is not None:
                extra = self._guarded(rel, display, guard, extra)
            try:
                self.prepare_parent(rel, display, recursive)
                if cancel.is_set():
                    raise Cancelled
                self.commit(rel, display, data, overwrite, cancel, extra)
            except Cancelled:
                return
            except FilesystemError:
                raise
            except OSError as exc:
                if guard is not None and self._refused(exc, extra):
                    self._refused_write(rel, display, guard)
                raise self.translate(exc, display, "write_file") from exc
        self._written(rel, "file")

    def put_new_sync(self, rel: str, display: str, data: bytes, cancel: threading.Event = NEVER) -> None:
        """Create the file ``rel``, never over one: here a create-only :meth:`write_sync`
        (object stores skip its parent checks)."""
        self.write_sync(rel, display, data, recursive=True, overwrite=False, cancel=cancel)

    def _refused_write(self, rel: str, display: str, guard: Version) -> None:
        """The store refused a conditional write: say why (gone, a directory, or stale)."""
        info = self.info(rel)
        if info is None:
            raise StaleFileError(display, guard.modified_at, None)
        if info.get("type") == "directory":
            raise IsDirectory(display)
        raise StaleFileError(display, guard.modified_at, self.stat_of(rel, info).modified_at)

    def commit(
        self,
        rel: str,
        display: str,
        data: bytes,
        overwrite: bool,
        cancel: threading.Event,
        extra: dict[str, Any],
    ) -> None:
        """Put ``data`` in place of ``rel`` in one step readers cannot see half-done."""
        self.publish(rel, display, lambda tmp: self._fs.pipe_file(tmp, data), overwrite, cancel)

    def publish(
        self,
        rel: str,
        display: str,
        stage: Callable[[str], object],
        overwrite: bool,
        cancel: threading.Event,
    ) -> None:
        """Stage new content in a hidden sibling with ``stage(tmp)``, then move it into place."""
        bpath = self.bpath(rel)
        parent, _, name = bpath.rpartition("/")
        tmp = f"{parent}/{staged_name(name)}"
        try:
            stage(tmp)
            if cancel.is_set():
                raise Cancelled
            # A move onto a directory would put the file inside it: refuse, as a write must.
            there = self.info(rel)
            if there is not None and there.get("type") == "directory":
                raise IsDirectory(display)
            if there is not None and not overwrite:
                raise FileExists(display)
            self._fs.mv(tmp, bpath)
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm_file(tmp)
            raise

    def prepare_parent(self, rel: str, display: str, recursive: bool) -> None:
        """Make sure the parent directory of ``rel`` exists (creating it with ``recursive``)."""
        parent = _paths.dirname(rel)
        if not parent:
            return
        if recursive:
            try:
                self._fs.makedirs(self.bpath(parent), exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise NotDirectory(display_parent(display)) from None
            return
        info = self.info(parent)
        if info is None:
            raise DirectoryNotFound(display_parent(display))
        if info.get("type") != "directory":
            raise NotDirectory(display_parent(display))

    def upload_sync(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event = NEVER,
        *,
        guard: Version | None = None,
        create: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        """Publish the local file ``local_path`` as ``rel``, creating parents.

        With ``guard``, only over that version of the file; with ``create``, only where
        nothing is; with ``metadata``, the object metadata the new file has (object stores).
        Returns the version now there where the store gives it with the write (S3's ETag,
        local disk), else None.

        Raises
        ------
        StaleFileError
            ``guard`` does not match the file, or the file is gone (``actual_mtime`` None).
        FileExists
            ``create`` and something is at ``rel``.
        """
        if not rel:
            raise IsDirectory(display)
        version: str | None = None
        with self._guard_lock(rel, guard is not None or create):
            try:
                self.prepare_parent(rel, display, True)
                if cancel.is_set():
                    raise Cancelled
                if not self._store_checks_versions:
                    if guard is not None:
                        self._check_guard(rel, display, guard)
                    elif create and self.info(rel) is not None:
                        raise FileExists(display)
                version = self._put_local(rel, display, local_path, cancel, guard, create, metadata)
            except Cancelled:
                return None
            except FilesystemError:
                raise
            except Exception as exc:
                refused = create and isinstance(exc, FileExistsError)
                if refused or ((guard is not None or create) and self._refused_upload(exc, guard, create)):
                    if guard is None:
                        raise FileExists(display) from exc
                    self._refused_write(rel, display, guard)
                raise self.translate(exc, display, "upload_file") from exc
        self._written(rel, "file")
        return version

    def _refused_upload(self, exc: Exception, guard: Version | None, create: bool) -> bool:
        """Whether ``exc`` is the store refusing a conditional upload."""
        return False

    def _put_local(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event,
        guard: Version | None,
        create: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        self.publish(rel, display, lambda tmp: self._fs.put_file(local_path, tmp), not create, cancel)
        return None

    def open_upload_sync(
        self, rel: str, display: str, part_size: int, metadata: Mapping[str, str] | None = None
    ) -> Any:
        """A writable file object of ``fs`` that uploads ``rel`` in parts (object stores)."""
        raise NotImplementedError  # pragma: no cover - only the object-store kind streams

    def delete_sync(self, rel: str, display: str, force: bool = False) -> None:
        """Delete the file ``rel`` (``force``: a missing one is fine)."""
        if not rel:
            raise IsDirectory(display)
        if not (force and self._known_file(rel)):
            info = self.info(rel)
            if info is None:
                if force:
                    return
                raise FileNotFound(display)
            if info.get("type") == "directory":
                raise IsDirectory(display)
        try:
            self._fs.rm_file(self.bpath(rel))
            self._keep_parent(rel)
        except Exception as exc:
            self._unsure(rel)
            raise self.translate(exc, display, "delete_file") from exc
        self._removed(rel)

    def _known_file(self, rel: str) -> bool:
        """Whether a fresh listing shows ``rel`` as a file (a forced delete then needs no
        existence check)."""
        return False

    def _keep_parent(self, rel: str) -> None:
        """Keep the parent directory of a removed ``rel`` (object stores drop empty prefixes)."""

    def check_mkdir(self, rel: str, display: str, recursive: bool) -> bool:
        """Refuse an mkdir the contract forbids; False when the directory is already there.

        A file at ``rel`` is in the way (``FileExists``), and so is a file as the parent
        (``NotDirectory``); a missing parent is missing unless ``recursive`` makes it.
        """
        info = self.info(rel)
        if info is not None:
            if info.get("type") == "directory":
                return False
            raise FileExists(display)
        parent = _paths.dirname(rel)
        if parent:
            pinfo = self.info(parent)
            if pinfo is not None and pinfo.get("type") != "directory":
                raise NotDirectory(display_parent(display))
            if pinfo is None:
                if not recursive:
                    raise DirectoryNotFound(display_parent(display))
                self._check_ancestors(_paths.dirname(parent))
        return True

    def mkdir_sync(self, rel: str, display: str, recursive: bool = True) -> None:
        """Create the directory ``rel`` (``recursive``: and its missing parents)."""
        if not rel or not self.check_mkdir(rel, display, recursive):
            return
        try:
            self._make_dir(rel)
        except (FileExistsError, NotADirectoryError):
            raise NotDirectory(display_parent(display)) from None
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "mkdir") from exc
        self._written(rel, "directory")

    def _check_ancestors(self, rel: str) -> None:
        """Refuse a directory below a file (where making it would not refuse it itself)."""

    def _make_dir(self, rel: str) -> None:
        self._fs.makedirs(self.bpath(rel), exist_ok=True)

    def check_rmdir(self, rel: str, display: str, force: bool) -> bool:
        """Refuse an rmdir the contract forbids; False when there is nothing to remove."""
        info = self.info(rel)
        if info is None:
            if force:
                return False
            raise DirectoryNotFound(display)
        if info.get("type") != "directory":
            raise NotDirectory(display)
        return True

    def rmdir_sync(self, rel: str, display: str, recursive: bool = False, force: bool = False) -> None:
        """Remove the directory ``rel`` (never call it with the root)."""
        if not self.check_rmdir(rel, display, force):
            return
        bpath = self.bpath(rel)
        try:
            if recursive:
                self._fs.rm(bpath, recursive=True)
            else:
                if self.children(rel, self.list_raw(rel, display), display):
                    raise DirectoryNotEmpty(display)
                self._remove_empty_dir(rel)
            self._keep_parent(rel)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "rmdir") from exc
        finally:
            self._unsure(rel)
            self._forget_cached(bpath)

    def _remove_empty_dir(self, rel: str) -> None:
        self._fs.rmdir(self.bpath(rel))

    def check_copy(self, dest_rel: str, dest: str, overwrite: bool) -> None:
        """Refuse a copy onto a directory, or onto a file without ``overwrite``."""
        if not dest_rel:
            raise IsDirectory(dest)
        dinfo = self.info(dest_rel)
        if dinfo is not None:
            if dinfo.get("type") == "directory":
                raise IsDirectory(dest)
            if not overwrite:
                raise FileExists(dest)

    def copy_sync(
        self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event = NEVER
    ) -> None:
        """Copy the file ``src_rel`` to ``dest_rel``, creating parents."""
        self.check_copy(dest_rel, dest, overwrite)
        try:
            self.prepare_parent(dest_rel, dest, True)
            self._copy_file(src_rel, dest_rel, dest, overwrite, cancel)
        except Cancelled:
            return
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, dest, "copy_file") from exc
        self._written(dest_rel, "file")

    def _copy_file(self, src_rel: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event) -> None:
        bsrc = self.bpath(src_rel)
        self.publish(dest_rel, dest, lambda tmp: self._fs.cp_file(bsrc, tmp), overwrite, cancel)

    def name_info(self, rel: str) -> dict[str, Any] | None:
        """The info record of the name ``rel`` as a move sees it (where storage has links,
        the link itself: local disk overrides this)."""
        return self.info(rel)

    def check_move(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> dict[str, Any]:
        """Refuse a move the contract forbids; return the source's info."""
        info = self.name_info(src_rel)
        if info is None:
            raise FileNotFound(src)
        if not dest_rel:
            raise IsDirectory(dest)
        dinfo = self.name_info(dest_rel)
        if dinfo is not None:
            if not overwrite:
                raise FileExists(dest)
            if dinfo.get("type") == "directory" and info.get("type") != "directory":
                raise IsDirectory(dest)
        if info.get("type") == "directory" and (dest_rel + "/").startswith(src_rel + "/"):
            raise PermissionDenied(dest, "move_file (cannot move a directory into itself)")
        return info

    def move_sync(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> None:
        """Rename ``src_rel`` to ``dest_rel`` in one step (kinds with ``atomic_rename``)."""
        info = self.check_move(src_rel, src, dest_rel, dest, overwrite)
        try:
            self.prepare_parent(dest_rel, dest, True)
            self._fs.mv(self.bpath(src_rel), self.bpath(dest_rel), recursive=info.get("type") == "directory")
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, dest, "move_file") from exc

    # -- the Backend contract ---------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.capabilities.blocking:
            return fn(*args, **kwargs)
        return await run_sync(lambda: fn(*args, **kwargs))

    async def _run_write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # A write abandoned by a timeout keeps running in its thread; the event tells it not
        # to commit, so it lands whole before the deadline or not at all.
        if not self.capabilities.blocking:
            return fn(*args, **kwargs, cancel=NEVER)
        cancel = threading.Event()
        try:
            return await run_sync(lambda: fn(*args, **kwargs, cancel=cancel))
        except anyio.get_cancelled_exc_class():
            cancel.set()
            raise

    async def stat(self, path: str) -> FileStat:
        return await self._run(self.stat_sync, path, path)

    async def list(self, path: str) -> list[FileStat]:
        return await self._run(self.list_stats_sync, path, path)

    async def read(self, path: str, range: ByteRange | None = None) -> bytes:
        if range is None:
            return await self._run(self.read_sync, path, path)
        if range.end is None:
            return await self._run(self.read_sync, path, path, range.start, None)
        if range.start >= range.end:
            await self.stat(path)
            return b""
        return await self._run(self.read_range_sync, path, path, range.start, range.end)

    async def read_into(self, path: str, start: int, buffer: memoryview) -> int:
        return await self._run(self.read_into_sync, path, path, start, buffer)

    async def read_many(self, paths: Sequence[str], *, max_bytes: int | None = None) -> dict[str, bytes | OSError]:
        got = await self._run(self.cat_many, list(dict.fromkeys(paths)), max_bytes)
        return {p: got.get(p, FileNotFound(p)) for p in paths}

    async def write(
        self,
        path: str,
        data: bytes,
        *,
        mode: WriteMode = WriteMode.OVERWRITE,
        guard: Version | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> FileStat:
        await self._run_write(
            self.write_sync, path, path, data, recursive=False, overwrite=mode is WriteMode.OVERWRITE,
            guard=guard, metadata=metadata,
        )  # fmt: skip
        return await self.stat(path)

    async def delete(self, path: str) -> None:
        await self._run(self.delete_sync, path, path)

    async def make_dir(self, path: str) -> None:
        await self._run(self.mkdir_sync, path, path, False)

    async def remove_dir(self, path: str) -> None:
        if not path:
            raise PermissionDenied(".", "rmdir (the root cannot be removed)")
        await self._run(self.rmdir_sync, path, path)

    async def copy(self, src: str, dest: str, *, mode: WriteMode = WriteMode.OVERWRITE) -> None:
        info = await self.stat(src)
        if info.type == "directory":
            raise IsDirectory(src)
        if src == dest:
            if mode is WriteMode.CREATE:
                raise FileExists(dest)
            return
        await self._run_write(self.copy_sync, src, src, dest, dest, mode is WriteMode.OVERWRITE)

    async def move(self, src: str, dest: str, *, mode: WriteMode = WriteMode.OVERWRITE) -> None:
        if not self.capabilities.atomic_rename:
            await super().move(src, dest, mode=mode)
            return
        if not src:
            raise PermissionDenied(".", "move (the root cannot be moved)")
        await self._run(self.move_sync, src, src, dest, dest, mode is WriteMode.OVERWRITE)

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish the local file as ``path`` without reading it into memory."""
        await self._run_write(self.upload_sync, path, path, local_path)

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path`` in a streamed transfer."""
        await self._run(self.download_sync, path, path, local_path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(protocol={self.protocol!r}, root={self._root!r})"


class MemoryStoreBackend(FsspecBackend):
    """fsspec's ``MemoryFileSystem`` under ``root``: atomic dictionary updates, no threads.

    Files are found with dictionary lookups and directories listed in one pass over its
    store, where the fsspec calls would build an info record per key.
    """

    capabilities = Capabilities(empty_dirs=True, atomic_rename=True, symlinks=False, versions=False, blocking=False)
    _fs: MemoryFileSystem

    def read_now(self, rel: str, display: str) -> bytes:
        """The bytes of ``rel``: the hot path of an in-process store, one dict lookup."""
        item = self._fs.store.get(self._prefix + rel) if rel else None
        return bytes(item.getbuffer()) if item is not None else self.read_sync(rel, display)

    def read_range_now(self, rel: str, display: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of ``rel``, copying only those (see :meth:`read_now`)."""
        item = self._fs.store.get(self._prefix + rel) if rel else None
        if item is None:
            return self.read_range_sync(rel, display, start, end)
        with item.getbuffer() as view:
            return bytes(view[start:end])

    def info(self, rel: str) -> dict[str, Any] | None:
        bpath = self.bpath(rel)
        item = self._fs.store.get(bpath)
        if item is not None:
            return {"name": bpath, "size": item.size, "type": "file"}
        return super().info(rel)

    def _times(self, rel: str, info: dict[str, Any], kind: FileType) -> tuple[datetime | None, datetime | None]:
        if kind != "file":
            return super()._times(rel, info, kind)
        item = self._fs.store.get(self.bpath(rel))
        modified = getattr(item, "modified", None)
        return modified, getattr(item, "created", None) or modified

    def _derived_etag(self, info: dict[str, Any], modified: datetime) -> str | None:
        return f"{modified.timestamp():.6f}-{info.get('size')}"  # memory keeps microseconds

    def list_sync(self, rel: str, display: str) -> list[FileEntry]:
        bpath = self.bpath(rel)
        store = self._fs.store
        if rel and bpath in store:
            raise NotDirectory(display)
        head = bpath.rstrip("/") + "/"
        cut = len(head)
        files: dict[str, int] = {}
        dirs: set[str] = set()
        for key in list(store):
            if key.startswith(head):
                rest = key[cut:]
                slash = rest.find("/")
                if slash < 0:
                    files[rest] = store[key].size
                else:
                    dirs.add(rest[:slash])
        for pdir in list(self._fs.pseudo_dirs):
            if pdir.startswith(head):
                rest = pdir[cut:]
                slash = rest.find("/")
                dirs.add(rest if slash < 0 else rest[:slash])
        if not files and not dirs and rel and bpath not in self._fs.pseudo_dirs:
            raise DirectoryNotFound(display)
        entries = [FileEntry(n, "directory") for n in dirs if TMP_MARK not in n]
        # Where a key and a prefix share a name, the directory wins (it shadows the file).
        entries.extend(FileEntry(n, "file", size) for n, size in files.items() if n not in dirs and TMP_MARK not in n)
        entries.sort(key=lambda e: e.name)
        return entries

    def download_sync(self, rel: str, display: str, local_path: str) -> None:
        # get_file copies through Python a block at a time; this is one write.
        try:
            data = self._fs.cat_file(self.bpath(rel))
            with open(local_path, "wb") as f:
                f.write(data)
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except Exception as exc:
            raise self.translate(exc, display, "download_file") from exc

    def prepare_parent(self, rel: str, display: str, recursive: bool) -> None:
        parent = _paths.dirname(rel)
        if parent and recursive:
            if self.bpath(parent) in self._fs.pseudo_dirs:
                return
            # Walk up with dict lookups: a file anywhere above refuses the write.
            probe = parent
            while probe:
                if self.bpath(probe) in self._fs.store:
                    raise NotDirectory(display_parent(display))
                probe = _paths.dirname(probe)
        super().prepare_parent(rel, display, recursive)

    def commit(
        self, rel: str, display: str, data: bytes, overwrite: bool, cancel: threading.Event, extra: dict[str, Any]
    ) -> None:
        # One dict assignment replaces the whole file: already atomic.
        bpath = self.bpath(rel)
        if bpath in self._fs.pseudo_dirs:
            raise IsDirectory(display)
        if not overwrite and bpath in self._fs.store:
            raise FileExists(display)
        self._fs.pipe_file(bpath, data)

    def _put_local(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event,
        guard: Version | None,
        create: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        bpath = self.bpath(rel)
        if bpath in self._fs.pseudo_dirs:
            raise IsDirectory(display)
        with open(local_path, "rb") as f:
            self._fs.pipe_file(bpath, f.read())
        return None

    def _copy_file(self, src_rel: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event) -> None:
        self._fs.cp_file(self.bpath(src_rel), self.bpath(dest_rel))


def names_local_disk(fs_or_url: Any) -> bool:
    """Whether ``fs_or_url`` (an fsspec instance or URL) names this machine's disk."""
    if isinstance(fs_or_url, LocalFileSystem):
        return True
    if isinstance(fs_or_url, str) and "::" not in fs_or_url:
        protocol, _ = fsspec.core.split_protocol(fs_or_url)
        return protocol in (None, "file", "local")
    return False
