"""Taking a snapshot, and reading back what one holds."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from datetime import UTC, datetime

import anyio

from ..errors import FileNotFound, StaleFileError
from ..vfs import FileStat, WorkspaceFilesystem, list_stats, sha256_hex
from ._manifest import ContentKind, FileRecord, Snapshot
from ._store import DEFAULT_PREFIX, SnapshotStore, check_outside
from ._tree import (
    Tree,
    check_content,
    read_live,
    same_version,
    scan,
    task_group,
    version_kind,
    vouches,
)
from ._versions import PinnedContent, pinned_content, pinned_reader

__all__ = ["SnapshotContent", "take_snapshot"]

_log = logging.getLogger("agentvfs.snapshots")

#: Files read (and hashed, and stored) at once while a snapshot is taken.
READ_CONCURRENCY = 16
#: Times the files that changed while they were read are read again before giving up.
ATTEMPTS = 4
#: Longest snapshot name.
MAX_NAME = 200


def check_name(name: str | None) -> None:
    """Refuse a snapshot name that cannot be told from an id or shown on one line."""
    if name is None:
        return
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a snapshot name is a non-empty string, not {name!r}")
    if len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"a snapshot name is at most {MAX_NAME} characters without control characters: {name!r}")


async def take_snapshot(
    fs: WorkspaceFilesystem,
    store: SnapshotStore | None = None,
    *,
    name: str | None = None,
    lock_wait: float | None = None,
) -> Snapshot:
    """Record the state of ``fs`` as a new snapshot in ``store`` (default: the workspace's
    own, ``.agentvfs/snapshots`` of ``fs``); see :meth:`agentvfs.Workspace.snapshot`.

    Raises
    ------
    ValueError
        ``name`` is not a usable name, or the store is inside the workspace (anywhere but
        in ``.agentvfs``).
    StaleFileError
        Files kept changing while they were read, ``ATTEMPTS`` times over.
    WorkspaceReadOnlyError
        The store's filesystem is read-only.
    TimeoutError
        A garbage collection of the store kept it for ``lock_wait`` seconds (default: the
        store's ``lock_wait``).
    """
    check_name(name)
    if store is None:
        store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    check_outside(fs, store)
    created = datetime.now(UTC)
    listed_ns = time.time_ns()  # before the listing: what the memo's margin is measured from
    tree = await scan(fs)
    pinned = await pinned_content(fs)
    # Blobs found stored are counted on without being written again, until the manifest
    # naming them is saved: no garbage collection may run meanwhile. Pinned versions are
    # no blobs.
    async with store.taking(wait=lock_wait) if pinned is None else contextlib.nullcontext():
        previous = await _previous(fs, store)
        if pinned is not None:
            files = await _pinned_records(pinned, tree, previous)
            content: ContentKind = pinned.kind
            root: str | None = pinned.root
        else:
            location = store.memo.location(fs)
            files = await _blob_records(fs, store, tree, previous, location)
            for path, record in files.items():
                listed = tree.files.get(path)
                if listed is not None and listed.etag == record.etag and listed.size == record.size:
                    store.memo.put(location, listed, record.sha256, listed_ns)
            content, root = "blobs", None
        snapshot, manifest = Snapshot.create(
            name=name, created_at=created, storage=fs.location, root=root, content=content,
            files=files, directories=tree.directories, links=tree.links, key=store.key,
        )  # fmt: skip
        await store.save(snapshot, manifest)
    _log.info(
        "snapshot %s%s: %d files, %d directories, %d links (%s)",
        snapshot.id[:12], f" ({name})" if name else "", len(files), len(tree.directories), len(tree.links), content,
    )  # fmt: skip
    return snapshot


async def _previous(fs: WorkspaceFilesystem, store: SnapshotStore) -> Snapshot | None:
    """The newest snapshot of this storage in ``store`` signed with its key (one anybody
    else wrote would lend its hashes to files it never saw), whose hashes can be reused for
    files whose version has not changed since."""
    latest = await store.latest()
    if latest is None or latest.storage != fs.location:
        return None
    return latest


async def _pinned_records(pinned: PinnedContent, tree: Tree, previous: Snapshot | None) -> dict[str, FileRecord]:
    """Records of the bucket's current versions: one listing gives each object's version,
    ETag, size and time together; the content is read (once per version, ever) only to hash
    it, and nothing is copied."""
    listed = await pinned.current()
    records: dict[str, FileRecord] = {}
    limiter = anyio.Semaphore(READ_CONCURRENCY)

    async def record(path: str) -> None:
        item = listed[path]
        before = previous.files.get(path) if previous is not None else None
        if before is not None and before.version == item.version:
            digest = before.sha256  # a version never changes: its hash is known
        else:
            async with limiter:
                data = await pinned.read(path, item.version)
            digest = sha256_hex(data)
        records[path] = FileRecord(path, item.size, item.modified_at, item.etag, digest, item.version)

    async with task_group() as tg:
        for path in listed:
            # A listing shows keys; the scan tells which of them the workspace shows as files.
            if path not in tree.directories and path not in tree.links:
                tg.start_soon(record, path)
    return records


async def _blob_records(
    fs: WorkspaceFilesystem, store: SnapshotStore, tree: Tree, previous: Snapshot | None, location: str | None
) -> dict[str, FileRecord]:
    """Records of files whose content goes to blobs: a file whose version the previous
    snapshot saw (where storage's ETag, size and time vouch for it: see :func:`vouches`),
    or that the store's memo knows as this very file (``location``: where the memo
    applies, else None), is neither read nor stored again; any other is read, hashed, and
    stored unless a blob of its hash is there.

    A file is read between two listings of its directory, and its record is kept only if
    both show the same version: the record's hash is of the version it names, even while
    the workspace is written meanwhile."""
    kind = version_kind(fs)
    known: set[str] | None = None
    known_lock = anyio.Lock()
    limiter = anyio.Semaphore(READ_CONCURRENCY)
    records: dict[str, FileRecord] = {}
    pending: dict[str, FileStat] = dict(tree.files)
    hashes: dict[str, str] = {}

    async def stored() -> set[str]:
        nonlocal known
        async with known_lock:
            if known is None:
                known = await store.blobs.digests()
            return known

    async def one(path: str, stat: FileStat) -> None:
        before = previous.files.get(path) if previous is not None else None
        reusable = (
            before is not None
            and previous is not None
            and before.version is None
            and vouches(before, previous.created_at, stat, kind)
        )
        if reusable and before is not None and before.sha256 in await stored():
            records[path] = FileRecord(path, stat.size, stat.modified_at, stat.etag, before.sha256)
            return
        async with limiter:
            try:
                data = await read_live(fs, stat)
            except (StaleFileError, FileNotFoundError):
                return  # changed or gone since it was listed: the second listing decides
            digest = sha256_hex(data)
            if len(data) == stat.size:
                hashes[path] = digest
            if digest not in await stored():
                # The store was listed once: a blob missing then needs no stat of its own.
                (await stored()).add(digest)
                await store.blobs.put(data, digest=digest, absent=True)

    for _ in range(ATTEMPTS):
        hashes.clear()
        # Files hashed as these very files (size, times and inode) by an earlier snapshot
        # of this process: settled here, without a task each.
        hits = {path: hit for path, stat in pending.items() if (hit := store.memo.get(location, stat)) is not None}
        if hits:
            have = await stored()
            for path, hit in hits.items():
                if hit in have:
                    seen = pending[path]
                    records[path] = FileRecord(path, seen.size, seen.modified_at, seen.etag, hit)
        async with task_group() as tg:
            for path, stat in pending.items():
                if path not in records:
                    tg.start_soon(one, path, stat)
        unsettled = {p: s for p, s in pending.items() if p not in records}
        if not unsettled:
            return records
        again = await _stats_again(fs, unsettled)
        pending = {}
        for path, seen in unsettled.items():
            now = again.get(path)
            if now is None:
                continue  # deleted while the snapshot was taken: not part of it
            if path in hashes and same_version(seen, now):
                records[path] = FileRecord(path, seen.size, seen.modified_at, seen.etag, hashes[path])
            else:
                pending[path] = now
        if not pending:
            return records
        _log.info("%d files changed while they were read; reading them again", len(pending))
    first = sorted(pending)[0]
    raise StaleFileError(first, pending[first].modified_at, None)


async def _stats_again(fs: WorkspaceFilesystem, files: dict[str, FileStat]) -> dict[str, FileStat]:
    """The current stat of each of ``files``, from one listing of each directory they are in."""
    parents = {p.rpartition("/")[0] for p in files}
    found: dict[str, FileStat] = {}
    limiter = anyio.Semaphore(READ_CONCURRENCY)

    async def listing(parent: str) -> None:
        async with limiter:
            try:
                children = await list_stats(fs, parent)
            except (FileNotFoundError, NotADirectoryError):
                return
        for child in children:
            path = f"{parent}/{child.name}" if parent else child.name
            if path in files and child.type == "file":
                found[path] = child

    async with task_group() as tg:
        for parent in parents:
            tg.start_soon(listing, parent)
    return found


class SnapshotContent:
    """The contents of one snapshot's files, each checked against the snapshot's hash
    before it is returned; small ones kept in memory (they never change).

    Parameters
    ----------
    snapshot : Snapshot
        The snapshot.
    store : SnapshotStore
        Where its blobs are.
    fs : WorkspaceFilesystem
        The workspace filesystem on the bucket whose versions it pinned (used only for
        those).
    """

    CACHE_BYTES = 32 * 1024 * 1024

    def __init__(self, snapshot: Snapshot, store: SnapshotStore, fs: WorkspaceFilesystem) -> None:
        self.snapshot = snapshot
        self.store = store
        self.fs = fs
        self._pinned: PinnedContent | None = None
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0

    async def read(self, record: FileRecord) -> bytes:
        """The content ``record`` names.

        Raises
        ------
        FileNotFound
            Its blob or version is gone.
        BlobIntegrityError
            What storage holds is not that content (nothing is returned).
        ValueError
            The snapshot pinned versions of a bucket that ``fs`` is not on.
        """
        cached = self._cache.get(record.sha256)
        if cached is not None:
            self._cache.move_to_end(record.sha256)
            return cached
        if record.version is None:
            try:
                blob = await self.store.blobs.get(record.sha256, name=record.path)
            except FileNotFoundError as exc:
                # Named as the file and snapshot it is the content of, not as a blob's path.
                raise FileNotFound(
                    f"{record.path} (its content in snapshot {self.snapshot.id[:12]}, blob {record.sha256} of "
                    f"{self.store.describe()}, is gone: was the snapshot deleted and its blobs collected?)"
                ) from exc
            data = check_content(record, blob, self.store.describe())
        else:
            if self._pinned is None:
                self._pinned = pinned_reader(self.fs, self.snapshot.content, self.snapshot.root)
            data = check_content(
                record, await self._pinned.read(record.path, record.version), f"version {record.version}"
            )
        if len(data) <= self.CACHE_BYTES // 8:
            self._cache[record.sha256] = data
            self._cached += len(data)
            while self._cached > self.CACHE_BYTES:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= len(dropped)
        return data
