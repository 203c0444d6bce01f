"""Where snapshots are kept: manifests, a listing index and content blobs on a filesystem.

Layout below the store's prefix (``.agentvfs/snapshots`` of the workspace itself by
default)::

    manifests/<id>.json          the manifest; <id> is the SHA-256 of its bytes
    index/<id>.json              id, name, time and counts, for listings (not trusted: a
                                 name found there is checked against the manifest it names)
    blobs/<h[:2]>/<h>            file contents by SHA-256 (the layout of
                                 agentvfs.vfs.BlobStore, shared with skill stores)
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime
from typing import Any

from ..errors import BlobIntegrityError, FileExists, SnapshotNotFoundError
from ..vfs import (
    BlobStore,
    FsspecFilesystem,
    WorkspaceFilesystem,
    is_digest,
    normalize_path,
    read_many,
)
from ._manifest import RESERVED_DIR, Snapshot, SnapshotInfo

__all__ = ["DEFAULT_PREFIX", "SnapshotStore"]

_log = logging.getLogger("agentvfs.snapshots")

#: Where a workspace keeps its own snapshots, below its root.
DEFAULT_PREFIX = f"{RESERVED_DIR}/snapshots"
#: The shortest id prefix that names a snapshot (as a short git hash does).
MIN_ID_PREFIX = 6


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
        :meth:`resolve` takes): its manifest, then its listing record; return its id.

        An id deletes that manifest without reading it, so a manifest changed in storage can
        still be deleted. Its blobs stay: they are named by content, and other snapshots may
        hold the same content.

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
        try:
            await self.fs.delete_file(self.manifest_path(snapshot_id))
        except FileNotFoundError:
            raise SnapshotNotFoundError(snapshot_id, self.describe()) from None
        # A listing record without its manifest is never listed; a failure here only leaves it.
        await self.fs.delete_file(self._index_path(snapshot_id), force=True)
        return snapshot_id

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
