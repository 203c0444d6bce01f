"""Where snapshots are kept: manifests, a listing index and content blobs on a filesystem.

Layout below the store's prefix (``.agentvfs/snapshots`` of the workspace itself by
default)::

    manifests/<id>.json          the manifest; <id> is the SHA-256 of its bytes
    index/<id>.json              id, name, time and counts, for listings (not trusted: a
                                 name found there is checked against the manifest it names)
    blobs/<h[:2]>/<h>            file contents by SHA-256 (the layout of
                                 agentvfs.vfs.BlobStore, shared with skill stores)
    trash/<id>.json              the manifest of a deleted snapshot, kept for the grace
                                 period of garbage collection

Blobs a snapshot needs are written before its manifest, and a snapshot reuses the blobs of
the one it follows without reading them. Garbage collection therefore deletes a blob only
when no manifest names it, no manifest deleted within the grace period named it, and the
blob itself is older than that period: a snapshot taken meanwhile (shorter than the grace
period) never loses a blob it counted on.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from ..errors import BlobIntegrityError, FileExists, SnapshotNotFoundError
from ..vfs import (
    BlobStore,
    FileStat,
    FsspecFilesystem,
    WorkspaceFilesystem,
    is_digest,
    normalize_path,
    read_many,
    walk_stats,
)
from ._manifest import RESERVED_DIR, Snapshot, SnapshotInfo

__all__ = ["DEFAULT_GRACE", "DEFAULT_PREFIX", "GarbageReport", "SnapshotStore"]

_log = logging.getLogger("agentvfs.snapshots")

#: Where a workspace keeps its own snapshots, below its root.
DEFAULT_PREFIX = f"{RESERVED_DIR}/snapshots"
#: The shortest id prefix that names a snapshot (as a short git hash does).
MIN_ID_PREFIX = 6
#: How long garbage collection leaves new blobs and the blobs of deleted snapshots alone:
#: longer than any snapshot takes.
DEFAULT_GRACE = timedelta(hours=1)
#: What a snapshot store's directory may hold; garbage collection refuses any other entry
#: (a skill store sharing the prefix: its blobs would look unused).
_OWN_ENTRIES = frozenset({"manifests", "index", "blobs", "trash"})
#: Blobs deleted at once.
_DELETE_CONCURRENCY = 16


@dataclass(frozen=True)
class GarbageReport:
    """What :meth:`SnapshotStore.collect_garbage` did.

    Attributes
    ----------
    blobs_deleted : int
        Blobs no snapshot holds, deleted.
    bytes_freed : int
        Their size.
    blobs_kept : int
        Blobs left: held by a snapshot (or one deleted within the grace period), or newer
        than the grace period.
    trash_deleted : int
        Manifests of deleted snapshots past the grace period, removed for good.
    """

    blobs_deleted: int
    bytes_freed: int
    blobs_kept: int
    trash_deleted: int


class SnapshotStore:
    """Snapshots of one workspace, kept on any filesystem.

    Parameters
    ----------
    fs : WorkspaceFilesystem, fsspec.AbstractFileSystem or str
        Where the store lives: the workspace's own filesystem (the default store of a
        workspace, below :data:`DEFAULT_PREFIX`), another filesystem, an fsspec instance or
        a URL such as ``s3://bucket/snapshots``.
    prefix : str
        The directory of ``fs`` holding the store.
    """

    def __init__(self, fs: WorkspaceFilesystem | Any, *, prefix: str = "") -> None:
        if isinstance(fs, str) or not isinstance(fs, WorkspaceFilesystem):
            fs = FsspecFilesystem(fs)
        self.fs: WorkspaceFilesystem = fs
        self.prefix = normalize_path(prefix)
        self.blobs = BlobStore(fs, self.prefix)

    def _path(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def manifest_path(self, snapshot_id: str) -> str:
        """Where the manifest of ``snapshot_id`` is kept."""
        if not is_digest(snapshot_id):
            raise ValueError(f"not a snapshot id (64 hex digits): {snapshot_id!r}")
        return self._path("manifests", f"{snapshot_id}.json")

    def _index_path(self, snapshot_id: str) -> str:
        return self._path("index", f"{snapshot_id}.json")

    async def save(self, snapshot: Snapshot, manifest: bytes) -> None:
        """Keep a new snapshot: its manifest (written only where nothing is: a manifest is
        never replaced), then its listing record."""
        with contextlib.suppress(FileExists):  # the same bytes: the same snapshot
            await self.fs.write_file(self.manifest_path(snapshot.id), manifest, overwrite=False)
        info = json.dumps(snapshot.info().to_dict(), sort_keys=True).encode()
        await self.fs.write_file(self._index_path(snapshot.id), info)

    async def load(self, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id``, its manifest checked against the id.

        Raises
        ------
        SnapshotNotFoundError
            No manifest of that id.
        BlobIntegrityError
            The manifest was changed in storage, or is not a manifest.
        """
        path = self.manifest_path(snapshot_id)
        try:
            data = await self.fs.read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            raise SnapshotNotFoundError(snapshot_id, self.describe()) from None
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        return Snapshot.decode(raw, snapshot_id, path)

    async def list(self) -> list[SnapshotInfo]:
        """Every snapshot kept here, oldest first. A manifest without a readable listing
        record is listed from the manifest itself."""
        try:
            entries = await self.fs.readdir(self._path("manifests"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        ids = [
            e.name.removesuffix(".json")
            for e in entries
            if e.type == "file" and e.name.endswith(".json") and is_digest(e.name.removesuffix(".json"))
        ]
        records = await read_many(self.fs, [self._index_path(i) for i in ids])
        out: list[SnapshotInfo] = []
        for snapshot_id in ids:
            got = records.get(self._index_path(snapshot_id))
            info = _parse_info(got, snapshot_id) if isinstance(got, bytes) else None
            if info is None:
                try:
                    info = (await self.load(snapshot_id)).info()
                except (BlobIntegrityError, SnapshotNotFoundError) as exc:
                    _log.warning("snapshot %s is not listed: %s", snapshot_id, exc)
                    continue
            out.append(info)
        return sorted(out, key=lambda i: (i.created_at, i.id))

    async def resolve(self, ref: str) -> Snapshot:
        """The snapshot ``ref`` names: its id, a name (the newest snapshot of that name), or
        a prefix of an id (at least six characters) that only one snapshot has.

        Raises
        ------
        SnapshotNotFoundError
            Nothing here goes by ``ref``.
        ValueError
            ``ref`` is an id prefix that several snapshots share.
        BlobIntegrityError
            The manifest was changed in storage.
        """
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"a snapshot is named by its id or name, not {ref!r}")
        if is_digest(ref):
            return await self.load(ref)
        listed = await self.list()
        named = [i for i in listed if i.name == ref]
        for info in reversed(named):
            snapshot = await self.load(info.id)
            if snapshot.name == ref:  # the listing record is not trusted; the manifest is
                return snapshot
        if len(ref) >= MIN_ID_PREFIX and all(c in "0123456789abcdef" for c in ref):
            matching = [i for i in listed if i.id.startswith(ref)]
            if len(matching) == 1:
                return await self.load(matching[0].id)
            if matching:
                ids = ", ".join(i.id[:12] for i in matching)
                raise ValueError(f"{ref!r} is the start of several snapshot ids ({ids}); give more of the id")
        raise SnapshotNotFoundError(ref, self.describe())

    async def delete(self, ref: str) -> str:
        """Delete the snapshot ``ref`` names (its id, a name or an id prefix, as
        :meth:`resolve` takes) and return its id.

        The manifest moves to ``trash/`` (where :meth:`collect_garbage` still counts its
        blobs as held for the grace period, then removes it) and its listing record goes. An
        id deletes a manifest changed in storage too (outright: what it holds is unknown).
        Blobs are only ever deleted by :meth:`collect_garbage`.

        Raises
        ------
        SnapshotNotFoundError
            Nothing here goes by ``ref``.
        ValueError
            ``ref`` is an id prefix that several snapshots share.
        WorkspaceReadOnlyError
            The store's filesystem is read-only.
        """
        snapshot_id = ref if isinstance(ref, str) and is_digest(ref) else (await self.resolve(ref)).id
        path = self.manifest_path(snapshot_id)
        try:
            data = await self.fs.read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            raise SnapshotNotFoundError(snapshot_id, self.describe()) from None
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        try:
            Snapshot.decode(raw, snapshot_id, path)
        except BlobIntegrityError:
            pass  # not what the id names: nothing to keep it for
        else:
            # In the trash first: a crash between the two steps leaves the snapshot listed.
            await self.fs.write_file(self._trash_path(snapshot_id), raw)
        await self.fs.delete_file(path, force=True)
        # A listing record without its manifest is never listed; a failure here only leaves it.
        await self.fs.delete_file(self._index_path(snapshot_id), force=True)
        return snapshot_id

    def _trash_path(self, snapshot_id: str) -> str:
        return self._path("trash", f"{snapshot_id}.json")

    async def collect_garbage(self, *, grace: timedelta = DEFAULT_GRACE) -> GarbageReport:
        """Delete the blobs no snapshot holds.

        A blob is deleted when no manifest names it, no snapshot deleted less than ``grace``
        ago named it, and it was written more than ``grace`` ago (a snapshot being taken
        writes its blobs before its manifest). Manifests of snapshots deleted more than
        ``grace`` ago are removed for good. Run it while no snapshot takes longer than
        ``grace``.

        Raises
        ------
        ValueError
            ``grace`` is negative, or the store's directory holds entries that are not a
            snapshot store's (a skill store sharing it): nothing is deleted.
        BlobIntegrityError
            A manifest (or one deleted within ``grace``) was changed in storage, so what it
            holds is unknown: nothing is deleted (delete that snapshot by its id first).
        WorkspaceReadOnlyError
            The store's filesystem is read-only.
        """
        if grace < timedelta(0):
            raise ValueError(f"grace must not be negative, got {grace}")
        try:
            entries = await self.fs.readdir(self.prefix or ".")
        except (FileNotFoundError, NotADirectoryError):
            return GarbageReport(0, 0, 0, 0)
        foreign = sorted(e.name for e in entries if e.name not in _OWN_ENTRIES)
        if foreign:
            raise ValueError(
                f"{self.describe()} holds {foreign[0]!r}, which is not part of a snapshot store: refusing to collect "
                "garbage (a skill store sharing the directory would lose its blobs); keep snapshots in a directory "
                "of their own"
            )
        # Blobs first: one written after this listing is not a candidate whatever happens next.
        blobs = {
            name.rsplit("/", 1)[-1]: stat
            for name, stat in await self._stats("blobs", 2)
            if is_digest(name.rsplit("/", 1)[-1])
        }
        now = datetime.now(UTC)
        trash = await self._stats("trash", 1)
        expired = [name for name, stat in trash if now - stat.modified_at > grace]
        recent = [name for name, stat in trash if now - stat.modified_at <= grace]
        held = await self._held([self._path("manifests", n) for n, _ in await self._stats("manifests", 1)])
        held |= await self._held([self._path("trash", n) for n in recent])
        doomed = [d for d, stat in blobs.items() if d not in held and now - stat.modified_at > grace]
        limiter = anyio.Semaphore(_DELETE_CONCURRENCY)

        async def delete(path: str) -> None:
            async with limiter:
                await self.fs.delete_file(path, force=True)

        async with anyio.create_task_group() as tg:
            for digest in doomed:
                tg.start_soon(delete, self.blobs.path(digest))
        async with anyio.create_task_group() as tg:
            for name in expired:
                tg.start_soon(delete, self._path("trash", name))
        freed = sum(blobs[d].size for d in doomed)
        _log.info("snapshot store %s: %d unused blobs deleted (%d bytes)", self.describe(), len(doomed), freed)
        return GarbageReport(len(doomed), freed, len(blobs) - len(doomed), len(expired))

    async def _stats(self, directory: str, depth: int) -> Sequence[tuple[str, FileStat]]:
        """``(name below directory, stat)`` of the files of one of the store's directories."""
        try:
            return await walk_stats(self.fs, self._path(directory), max_depth=depth)
        except (FileNotFoundError, NotADirectoryError):
            return []

    async def _held(self, paths: Sequence[str]) -> set[str]:
        """The blobs the manifests at ``paths`` name (a manifest gone meanwhile names none)."""
        held: set[str] = set()
        found = await read_many(self.fs, paths)
        for path in paths:
            data = found.get(path)
            if data is None or isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise data
            name = path.rsplit("/", 1)[-1].removesuffix(".json")
            if not is_digest(name):
                raise BlobIntegrityError(f"{path} is not named by a snapshot id: refusing to collect garbage")
            try:
                snapshot = Snapshot.decode(data, name, path)
            except BlobIntegrityError as exc:
                raise BlobIntegrityError(
                    f"{exc}; refusing to collect garbage: delete the snapshot by its id first"
                ) from None
            held.update(r.sha256 for r in snapshot.files.values() if r.version is None)
        return held

    async def latest(self) -> Snapshot | None:
        """The newest snapshot whose manifest loads, or None."""
        for info in reversed(await self.list()):
            try:
                return await self.load(info.id)
            except (BlobIntegrityError, SnapshotNotFoundError) as exc:
                _log.warning("snapshot %s is skipped: %s", info.id, exc)
        return None

    def describe(self) -> str:
        """Where this store is, for messages."""
        where = self.fs.location or self.fs.id
        return f"{where}/{self.prefix}" if self.prefix else str(where)

    def __repr__(self) -> str:
        return f"SnapshotStore(fs={self.fs!r}, prefix={self.prefix!r})"


def _parse_info(data: bytes, snapshot_id: str) -> SnapshotInfo | None:
    try:
        raw = json.loads(data)
        if raw["id"] != snapshot_id:
            return None
        return SnapshotInfo(
            snapshot_id,
            None if raw.get("name") is None else str(raw["name"]),
            datetime.fromisoformat(raw["created_at"]),
            int(raw["files"]),
            int(raw["directories"]),
            int(raw["bytes"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
