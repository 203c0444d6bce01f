"""Where snapshots are kept: manifests, a listing index and content blobs on a filesystem.

Layout below the store's prefix (``.agentvfs/snapshots`` of the workspace itself by
default)::

    manifests/<id>.json          the manifest; <id> is the SHA-256 of its bytes
    index/<id>.json              id, name, time and counts, for listings (not trusted: a
                                 name found there is checked against the manifest it names)
    blobs/<h[:2]>/<h>            file contents by SHA-256 (the layout of
                                 agentvfs.vfs.BlobStore, shared with skill stores)
    locks/snapshot-<r>.json      a lease of a snapshot being taken  } when it was taken,
    locks/gc-<r>.json            a claim of a garbage collection    } by which process

Blobs a snapshot needs are written before its manifest, and a snapshot reuses blobs it finds
stored without reading or writing them again. So garbage collection and taking a snapshot
exclude each other: each writes its lock, then looks for the other's; a collection that sees
a lease takes its claim back and tries again later, a snapshot that sees a claim waits. A
lock older than ``stale_after`` was left by a process that died and is ignored (and removed
by the next collection); so is one of a process of this machine that has exited.

Whoever can write the store (the agent, where the store is the workspace's own) can put
files there too. Manifests, listing records and locks are therefore signed with the host's
:class:`~agentvfs.snapshots.SnapshotKey`: a manifest or record that does not verify is
refused (never listed, never resolved by name, never the base of the next snapshot), and a
lock that does not verify holds a snapshot off only for as long as that snapshot is willing
to wait. No lock holds anyone off for longer than ``max_stale_after`` without being renewed,
whatever ``stale_after`` it claims.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import anyio

from .._procs import pid_alive, start_time
from ..errors import (
    BlobIntegrityError,
    FileExists,
    FileNotFound,
    SnapshotNotFoundError,
    WorkspaceReadOnlyError,
)
from ..vfs import (
    BlobStore,
    FileStat,
    FsspecFilesystem,
    LocalFilesystem,
    WorkspaceFilesystem,
    is_digest,
    normalize_path,
    read_many,
    walk_stats,
)
from ._keys import SnapshotKey
from ._manifest import (
    ACCEPT_UNSIGNED_ENV,
    RESERVED_DIR,
    Snapshot,
    SnapshotInfo,
    canonical_json,
    is_reserved,
)
from ._tree import task_group
from ._versions import unwrapped

__all__ = ["DEFAULT_GRACE", "DEFAULT_PREFIX", "MAX_STALE_AFTER", "GarbageReport", "SnapshotStore", "check_outside"]

_log = logging.getLogger("agentvfs.snapshots")

#: Where a workspace keeps its own snapshots, below its root.
DEFAULT_PREFIX = f"{RESERVED_DIR}/snapshots"
#: The shortest id prefix that names a snapshot (as a short git hash does).
MIN_ID_PREFIX = 6
#: How long garbage collection leaves new blobs alone (a writer that takes no lease, such as
#: an earlier agentvfs, stores its blobs well within it).
DEFAULT_GRACE = timedelta(hours=1)
#: A lease or claim not renewed for this long was left by a process that died (a live one
#: is rewritten every fifth of it).
DEFAULT_STALE_AFTER = timedelta(minutes=10)
#: The longest ``stale_after`` a lock may claim for itself (its holder's setting, where that
#: is longer than the reader's): a lock found in storage holds nobody off for longer.
MAX_STALE_AFTER = timedelta(hours=1)
#: How far the clocks of the hosts sharing a store may disagree: a signed lock whose own
#: time is older than its limit by more than this is a copy of one released long ago.
_CLOCK_SLACK = 15 * 60.0
#: How long a snapshot waits for a collection under way, and a collection for snapshots.
DEFAULT_LOCK_WAIT = 300.0
_LOCKS = "locks"
_LOCK_POLL = 0.25
#: Longest a lock's removal may hold up a task leaving (a hung DELETE).
_RELEASE_TIMEOUT = 30.0
#: What a snapshot store's directory may hold; garbage collection refuses any other entry
#: (a skill store sharing the prefix: its blobs would look unused).
_OWN_ENTRIES = frozenset({"manifests", "index", "blobs", _LOCKS})
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
        Blobs left: held by a snapshot, newer than the grace period, or of unknown time.
    """

    blobs_deleted: int
    bytes_freed: int
    blobs_kept: int


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
    lock_wait : float
        Seconds a snapshot waits for a garbage collection under way, and a collection for
        the snapshots being taken, before giving up with ``TimeoutError``.
    stale_after : timedelta
        Age past which a lease or claim is taken for one left by a process that died.
    key : SnapshotKey, bytes, str or path-like, optional
        What signs and verifies the store's manifests, listing records and locks: a key, its
        secret, or the path of a key file (made if missing). Default: the per-user key file
        (:func:`~agentvfs.snapshots.default_key_file`), made on first use. Every host and
        process that uses the store must have the same key.
    accept_unsigned : bool, optional
        Also read manifests without a signature (written by an agentvfs from before they
        were signed): only for a store that nothing but this host could ever write. They
        are never the base of a new snapshot, and a signed snapshot of a name wins over an
        unsigned one. Default: ``$AGENTVFS_SNAPSHOT_ACCEPT_UNSIGNED`` is ``1``.
    max_stale_after : timedelta
        The longest ``stale_after`` a lock found in storage may claim for itself.
    """

    def __init__(
        self,
        fs: WorkspaceFilesystem | Any,
        *,
        prefix: str = "",
        lock_wait: float = DEFAULT_LOCK_WAIT,
        stale_after: timedelta = DEFAULT_STALE_AFTER,
        key: SnapshotKey | bytes | str | os.PathLike[str] | None = None,
        accept_unsigned: bool | None = None,
        max_stale_after: timedelta = MAX_STALE_AFTER,
    ) -> None:
        if isinstance(fs, str) or not isinstance(fs, WorkspaceFilesystem):
            fs = FsspecFilesystem(fs)
        self.fs: WorkspaceFilesystem = fs
        self.prefix = normalize_path(prefix)
        self.blobs = BlobStore(fs, self.prefix)
        if not lock_wait >= 0:
            raise ValueError(f"lock_wait must be 0 seconds or more, got {lock_wait!r}")
        if not stale_after > timedelta(0):
            raise ValueError(f"stale_after must be longer than 0, got {stale_after!r}")
        if not max_stale_after >= stale_after:
            raise ValueError(f"max_stale_after ({max_stale_after}) must not be shorter than stale_after ({stale_after})")
        if key is not None and not isinstance(key, (SnapshotKey, bytes, str, os.PathLike)):
            raise TypeError(f"key must be a SnapshotKey, its secret (bytes) or a key file's path, not {type(key).__name__}")
        self.lock_wait = lock_wait
        self.stale_after = stale_after
        self.max_stale_after = max_stale_after
        self._key_given = key
        if accept_unsigned is None:
            accept_unsigned = os.environ.get(ACCEPT_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")
        self.accept_unsigned = accept_unsigned
        #: Until when (monotonic) locks that do not verify are not waited for: once a snapshot
        #: has waited one out, the next ones do not wait again (a forged lock kept fresh
        #: would delay each of them).
        self._unverified_ignored_until = 0.0
        #: Manifests left out of listings (refused), each warned of once.
        self._not_listed: set[str] = set()
        #: Hashes of local files known from snapshots taken through this object.
        self.memo = StatMemo()

    @functools.cached_property
    def key(self) -> SnapshotKey:
        """The key that signs and verifies this store's records (read or made on first use).

        Raises
        ------
        PermissionError
            The key file may be read by others, or cannot be made (the message says how to
            give one).
        ValueError
            The key file holds no key.
        """
        given = self._key_given
        if isinstance(given, SnapshotKey):
            return given
        if isinstance(given, bytes):
            return SnapshotKey(given)
        return SnapshotKey.from_file(given)

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
        never replaced), then its listing record, signed with :attr:`key`."""
        with contextlib.suppress(FileExists):  # the same bytes: the same snapshot
            await self.fs.write_file(self.manifest_path(snapshot.id), manifest, overwrite=False)
        record: dict[str, Any] = {**snapshot.info().to_dict(), "key": self.key.id}
        record["mac"] = self.key.sign("index", canonical_json(record))
        await self.fs.write_file(self._index_path(snapshot.id), canonical_json(record))

    async def load(self, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id``, its manifest checked against the id and its
        signature against :attr:`key`.

        Raises
        ------
        SnapshotNotFoundError
            No manifest of that id.
        BlobIntegrityError
            The manifest was changed in storage, is not a manifest, or was not signed with
            this store's key (written by someone else; unsigned ones only with
            ``accept_unsigned``).
        """
        return (await self._load(snapshot_id))[0]

    async def _load(self, snapshot_id: str) -> tuple[Snapshot, bool]:
        """:meth:`load`, and whether the manifest is signed (not an accepted unsigned one)."""
        path = self.manifest_path(snapshot_id)
        try:
            data = await self.fs.read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            raise SnapshotNotFoundError(snapshot_id, self.describe()) from None
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        return Snapshot.decode_signed(raw, snapshot_id, path, key=self.key, accept_unsigned=self.accept_unsigned)

    async def list(self) -> list[SnapshotInfo]:
        """Every snapshot kept here whose manifest is signed with this store's key (and the
        unsigned ones, with ``accept_unsigned``), oldest first. A manifest without a listing
        record that verifies is listed from the manifest itself; one that does not verify is
        left out, with a warning naming it."""
        return [info for info, _ in await self._listing()]

    async def _listing(self) -> builtins.list[tuple[SnapshotInfo, bool]]:
        """:meth:`list`, each with whether it is signed."""
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
        out: builtins.list[tuple[SnapshotInfo, bool]] = []
        for snapshot_id in ids:
            got = records.get(self._index_path(snapshot_id))
            info = _parse_info(got, snapshot_id, self.key) if isinstance(got, bytes) else None
            signed = True
            if info is None:
                try:
                    snapshot, signed = await self._load(snapshot_id)
                except (BlobIntegrityError, SnapshotNotFoundError) as exc:
                    if snapshot_id not in self._not_listed:  # said once per store object
                        self._not_listed.add(snapshot_id)
                        _log.warning("snapshot %s is not listed: %s", snapshot_id, exc)
                    continue
                info = snapshot.info()
            out.append((info, signed))
        return sorted(out, key=lambda pair: (pair[0].created_at, pair[0].id))

    async def resolve(self, ref: str) -> Snapshot:
        """The snapshot ``ref`` names: its id, a name (the newest snapshot of that name), or
        a prefix of an id (at least six characters) that only one snapshot has. Only
        snapshots :meth:`list` shows are found by a name or prefix; a signed snapshot of a
        name wins over any unsigned one.

        Raises
        ------
        SnapshotNotFoundError
            Nothing here goes by ``ref``.
        ValueError
            ``ref`` is an id prefix that several snapshots share.
        BlobIntegrityError
            The manifest was changed in storage, or is not signed with this store's key.
        """
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"a snapshot is named by its id or name, not {ref!r}")
        if is_digest(ref):
            return await self.load(ref)
        listed = await self._listing()
        named = [pair for pair in listed if pair[0].name == ref]
        # The newest signed one first; an unsigned one (accepted on request) only after them.
        for info, _ in sorted(named, key=lambda pair: (pair[1], pair[0].created_at, pair[0].id), reverse=True):
            snapshot = await self.load(info.id)
            if snapshot.name == ref:  # the listing record of an unsigned one is not trusted
                return snapshot
        if len(ref) >= MIN_ID_PREFIX and all(c in "0123456789abcdef" for c in ref):
            matching = [i for i, _ in listed if i.id.startswith(ref)]
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
        be deleted too. Blobs are only ever deleted by :meth:`collect_garbage`.

        Raises
        ------
        SnapshotNotFoundError
            Nothing here goes by ``ref``.
        ValueError
            ``ref`` is an id prefix that several snapshots share.
        BlobIntegrityError
            ``ref`` is a name or prefix, and the manifest it leads to was changed in storage
            (delete it by its id).
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

    # -- taking snapshots and collecting garbage exclude each other ------------------------------------

    @contextlib.asynccontextmanager
    async def taking(self, *, wait: float | None = None) -> AsyncIterator[None]:
        """Hold a lease for taking a snapshot: no :meth:`collect_garbage` runs while it is
        held, and it waits for one under way (up to ``wait`` seconds, default
        ``lock_wait``). The lease is renewed while held.

        A claim not signed with this store's key (forged by whoever can write the store, or
        left by an agentvfs from before locks were signed) holds it off for ``wait`` seconds
        at most: past that the snapshot goes on, with a warning naming the claim, and the
        snapshots this store object takes in the next ``stale_after`` do not wait for such
        claims at all.

        Raises
        ------
        TimeoutError
            A collection kept its (signed) claim for ``wait`` seconds.
        """
        wait = self.lock_wait if wait is None else wait
        async with self._lock("snapshot") as path:
            # Written, then checked: of a snapshot and a collection starting together, at
            # least one sees the other (the collection then gives way).
            deadline = time.monotonic() + wait
            while claims := await self._live_locks("gc", path):
                now = time.monotonic()
                unverified = [p for p, verified in claims if not verified]
                if len(unverified) == len(claims) and (now > deadline or now < self._unverified_ignored_until):
                    if now >= self._unverified_ignored_until:  # waited it out (not within the window)
                        _log.warning(
                            "snapshot store %s: not waiting any longer for %s, not signed with this store's key "
                            "(%s): nothing but a process with the key holds snapshots off for longer. If a collection "
                            "without the key is really under way (an older agentvfs, a host with another key), give "
                            "every host of the store the same key",
                            self.describe(), ", ".join(unverified), self.key.source,
                        )  # fmt: skip
                        self._unverified_ignored_until = now + self.stale_after.total_seconds()
                    break
                if now > deadline:
                    first = next(p for p, verified in claims if verified)
                    raise TimeoutError(
                        f"a garbage collection of {self.describe()} has been under way for over {wait:g} seconds "
                        f"({first}); try again later, or remove that file if no collection is running"
                    )
                await anyio.sleep(_LOCK_POLL)
            yield

    @contextlib.asynccontextmanager
    async def _lock(self, kind: str) -> AsyncIterator[str]:
        """Write a lock of ``kind`` ("snapshot" or "gc"), keep it fresh, and remove it on the
        way out (also when writing it failed halfway, or the task was cancelled)."""
        path = self._path(_LOCKS, f"{kind}-{secrets.token_hex(8)}.json")
        started = False
        try:
            # Shielded, as every write of the lock: a write abandoned to a cancellation could
            # land after the removal below and leave the lock behind.
            with anyio.CancelScope(shield=True):
                started = True
                await self.fs.write_file(path, self._record(path))
            async with task_group() as tg:  # what the body raises comes out as itself
                tg.start_soon(self._renew, path)
                try:
                    yield path
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if started:
                await self._release(kind, path)

    async def _release(self, kind: str, path: str) -> None:
        with anyio.move_on_after(_RELEASE_TIMEOUT, shield=True) as scope:
            for attempt in range(3):
                try:
                    await self.fs.delete_file(path, force=True)
                    return
                except WorkspaceReadOnlyError:
                    return  # it was never written
                except Exception as exc:
                    if attempt == 2:  # left behind: it holds the other side off until it is stale
                        _log.warning("%s lock %s not removed: %s", kind, path, exc)
                        return
                    await anyio.sleep(0.5)
        if scope.cancelled_caught:
            _log.warning("%s lock %s not removed: storage did not answer in %g s", kind, path, _RELEASE_TIMEOUT)

    async def _renew(self, path: str) -> None:
        """Rewrite the lock at ``path`` every fifth of ``stale_after``, so a long snapshot or
        collection is never taken for a dead one; give up, failing the holder, when it could
        not be rewritten for half of ``stale_after`` (it would soon look dead)."""
        period = self.stale_after.total_seconds() / 5
        renewed = time.monotonic()
        while True:
            await anyio.sleep(period if time.monotonic() - renewed < period else min(period, 1.0))
            try:
                with anyio.CancelScope(shield=True):
                    await self.fs.write_file(path, self._record(path))
                renewed = time.monotonic()
            except OSError as exc:
                if time.monotonic() - renewed > 2.5 * period:
                    raise TimeoutError(
                        f"the lock {path} could not be renewed for {time.monotonic() - renewed:.0f} seconds ({exc}); "
                        "stopped, since it would soon look like a dead process's"
                    ) from exc
                _log.warning("lock %s not renewed, trying again: %s", path, exc)

    def _record(self, path: str) -> bytes:
        """The record of the lock at ``path``, signed (its name too: a copy under another
        name does not verify)."""
        record: dict[str, Any] = _lock_record(self.stale_after.total_seconds())
        record["mac"] = self.key.sign("lock", _lock_signed_bytes(path, record))
        return json.dumps(record).encode()

    def _verified(self, path: str, data: bytes | OSError) -> bool:
        """Whether the lock record ``data`` at ``path`` is signed with this store's key."""
        if not isinstance(data, bytes):
            return False
        try:
            record = json.loads(data)
        except ValueError:
            return False
        if not isinstance(record, dict):
            return False
        body = {k: v for k, v in record.items() if k != "mac"}
        return self.key.verify("lock", _lock_signed_bytes(path, body), record.get("mac"))

    async def _locks(self) -> dict[str, tuple[FileStat, bytes | OSError]]:
        """Every lock of the store: its stat and its record."""
        stats = await self._stats(_LOCKS, 1)
        paths = [self._path(_LOCKS, name) for name, _ in stats]
        found = await read_many(self.fs, paths)
        return {path: (stat, found.get(path, FileNotFound(path))) for path, (_, stat) in zip(paths, stats, strict=True)}

    def _stale(self, path: str, lock: tuple[FileStat, bytes | OSError], now: datetime | None) -> bool:
        """Whether a lock was left by a process that died.

        Its age is measured on the storage's clock where the listing gives times (``now``:
        the time of a lock just written), else on the writer's (the time it records); a
        lock that cannot be read or parsed is aged by the listing alone. On local disk, a
        lock of a process of this machine that has exited is stale at once.

        A lock is stale past this reader's ``stale_after``, or past the longer one its
        holder claims where the record is signed with this store's key, up to
        ``max_stale_after``: a lock file's own say never holds anyone off for longer. A
        signed record whose own time is that much older (plus the clocks' slack) is a copy
        of a lock released long ago, however fresh the file."""
        stat, data = lock
        record = _lock_fields(data) if isinstance(data, bytes) else None
        verified = record is not None and self._verified(path, data)
        limit = self.stale_after.total_seconds()
        if verified and record is not None and record.stale_after is not None:
            limit = max(limit, min(record.stale_after, self.max_stale_after.total_seconds()))
        if record is not None and self._local and _exited(record):
            return True
        if verified and record is not None and time.time() - record.at > limit + _CLOCK_SLACK:
            return True
        if now is not None and stat.modified_at.timestamp() > 0:
            return (now - stat.modified_at).total_seconds() > limit
        if record is not None:
            return time.time() - record.at > limit
        return False

    async def _live_locks(self, kind: str, mine: str) -> builtins.list[tuple[str, bool]]:
        """Paths of the live locks of ``kind`` besides ``mine`` (a lock this process has just
        written, whose listed time is the storage's now), each with whether it is signed
        with this store's key."""
        locks = await self._locks()
        now = _storage_now(locks, mine)
        return [
            (path, self._verified(path, lock[1]))
            for path, lock in locks.items()
            if path != mine
            and path.rsplit("/", 1)[-1].startswith(f"{kind}-")
            and not isinstance(lock[1], FileNotFoundError)  # released meanwhile
            and not self._stale(path, lock, now)
        ]

    @functools.cached_property
    def _local(self) -> bool:
        # Process ids name processes only where every writer of the store runs on this
        # machine: a store on a local disk (clones of one VM share a boot id, not a disk;
        # they may share a network filesystem).
        location = self.fs.location
        return isinstance(self.fs, LocalFilesystem) and location is not None and not _on_network_fs(location)

    async def collect_garbage(self, *, grace: timedelta = DEFAULT_GRACE) -> GarbageReport:
        """Delete the blobs no snapshot holds.

        It runs while no snapshot of this store is being taken (a lease of
        :meth:`taking`): it waits for those under way (up to ``lock_wait`` seconds), and
        snapshots started meanwhile wait for it. A blob is deleted when no manifest names it
        and it was written more than ``grace`` ago (a blob whose time the storage does not
        give is kept). Leases and claims left by processes that died are removed.

        Raises
        ------
        ValueError
            ``grace`` is negative, or the store's directory holds entries that are not a
            snapshot store's (a skill store sharing it): nothing is deleted.
        BlobIntegrityError
            A manifest was changed in storage, so what it holds is unknown: nothing is
            deleted (delete that snapshot by its id first).
        TimeoutError
            Snapshots were being taken for ``lock_wait`` seconds.
        WorkspaceReadOnlyError
            The store's filesystem is read-only.
        OSError
            A blob could not be deleted (the others were; the first error is raised).
        """
        if grace < timedelta(0):
            raise ValueError(f"grace must not be negative, got {grace}")
        try:
            entries = await self.fs.readdir(self.prefix or ".")
        except (FileNotFoundError, NotADirectoryError):
            return GarbageReport(0, 0, 0)
        foreign = sorted(
            e.name for e in entries if e.name not in _OWN_ENTRIES and not e.name.startswith(".") and e.name != "lost+found"
        )
        if foreign:
            raise ValueError(
                f"{self.describe()} holds {foreign[0]!r}, which is not part of a snapshot store: refusing to collect "
                "garbage (a skill store sharing the directory would lose its blobs); keep snapshots in a directory "
                "of their own"
            )
        deadline = time.monotonic() + self.lock_wait
        while True:
            async with self._lock("gc") as claim:
                # Every live lease, signed or not: a collection that went on past a lease of a
                # snapshot under way could delete the blobs it counts on.
                leases = [path for path, _ in await self._live_locks("snapshot", claim)]
                if not leases:
                    return await self._collect(grace, claim)
            # Gave way to the snapshots (they may be waiting on this claim); try again.
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"snapshots of {self.describe()} have been taken for over {self.lock_wait:g} seconds "
                    f"({leases[0]}); try again later, or remove that file if no snapshot is being taken"
                )
            await anyio.sleep(_LOCK_POLL)

    async def _collect(self, grace: timedelta, claim: str) -> GarbageReport:
        held = await self._held([self._path("manifests", n) for n, _ in await self._stats("manifests", 1)])
        blobs: dict[str, FileStat] = {}
        for name, stat in await self._stats("blobs", 2):
            digest = name.rsplit("/", 1)[-1]
            if is_digest(digest) and name == f"{digest[:2]}/{digest}":  # elsewhere: not a blob of this store
                blobs[digest] = stat
        now = datetime.now(UTC)
        doomed = [
            d
            for d, stat in blobs.items()
            if d not in held and stat.modified_at.timestamp() > 0 and now - stat.modified_at > grace
        ]
        limiter = anyio.Semaphore(_DELETE_CONCURRENCY)
        failures: builtins.list[OSError] = []

        async def delete(path: str) -> None:
            async with limiter:
                try:
                    await self.fs.delete_file(path, force=True)
                except OSError as exc:
                    failures.append(exc)

        async with anyio.create_task_group() as tg:
            for digest in doomed:
                tg.start_soon(delete, self.blobs.path(digest))
            locks = await self._locks()
            storage_now = _storage_now(locks, claim)
            for path, lock in locks.items():
                if path != claim and self._stale(path, lock, storage_now):
                    tg.start_soon(delete, path)
        if failures:
            raise failures[0]
        freed = sum(blobs[d].size for d in doomed)
        _log.info("snapshot store %s: %d unused blobs deleted (%d bytes)", self.describe(), len(doomed), freed)
        return GarbageReport(len(doomed), freed, len(blobs) - len(doomed))

    async def _stats(self, directory: str, depth: int) -> Sequence[tuple[str, FileStat]]:
        """``(name below directory, stat)`` of the files of one of the store's directories."""
        try:
            return await walk_stats(self.fs, self._path(directory), max_depth=depth)
        except (FileNotFoundError, NotADirectoryError):
            return []

    async def _held(self, paths: Sequence[str]) -> set[str]:
        """The blobs the manifests at ``paths`` name (a manifest deleted meanwhile names none)."""
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
                continue  # not a manifest (list() ignores it too)
            try:
                snapshot = Snapshot.decode(data, name, path)
            except BlobIntegrityError as exc:
                raise BlobIntegrityError(
                    f"{exc}. Garbage collection is refused, since what that snapshot holds is unknown: delete it "
                    f"with `agentvfs snapshots URL --delete {name}` (or delete_snapshot) first"
                ) from None
            held.update(r.sha256 for r in snapshot.files.values() if r.version is None)
        return held

    async def latest(self) -> Snapshot | None:
        """The newest snapshot whose manifest loads and is signed with this store's key (an
        unsigned one never: a new snapshot takes hashes from it without reading), or None."""
        for info, signed in reversed(await self._listing()):
            if not signed:
                continue
            try:
                snapshot, signed = await self._load(info.id)
            except (BlobIntegrityError, SnapshotNotFoundError) as exc:
                _log.warning("snapshot %s is skipped: %s", info.id, exc)
                continue
            if signed:
                return snapshot
        return None

    def describe(self) -> str:
        """Where this store is, for messages."""
        where = self.fs.location or self.fs.id
        return f"{where}/{self.prefix}" if self.prefix else str(where)

    def __repr__(self) -> str:
        return f"SnapshotStore(fs={self.fs!r}, prefix={self.prefix!r})"


def check_outside(fs: WorkspaceFilesystem, store: SnapshotStore) -> None:
    """Refuse a store kept inside the workspace ``fs`` it records, anywhere but in agentvfs's
    own ``.agentvfs``: every snapshot would record the store's own files (and its locks),
    and a forced restore would delete them.

    Raises
    ------
    ValueError
        The store is inside the workspace.
    """
    inside = _place_in(fs, store)
    if inside is None or is_reserved(inside):
        return
    raise ValueError(
        f"the snapshot store {store.describe()} is inside the workspace it records (at {inside or 'its root'!r}): "
        f"its own files would be recorded in every snapshot and a forced restore would delete them; keep it in "
        f"{DEFAULT_PREFIX} (the default) or outside the workspace"
    )


def _place_in(fs: WorkspaceFilesystem, store: SnapshotStore) -> str | None:
    """Where in the workspace ``fs`` the store's directory is (``""``: its root), or None
    when it is not inside it."""
    if store.fs is fs:
        return store.prefix
    here, there = fs.location, store.fs.location
    kinds = {fs.provider, store.fs.provider}
    if not here or not there or (len(kinds) > 1 and kinds != {"local", "file"}):  # local disk is either
        return None
    if kinds <= {"local", "file"}:
        here, there = os.path.realpath(here), os.path.realpath(there)
    # The store's own directory: its filesystem's root may lie above the workspace.
    where = "/".join(p for p in (there.rstrip("/"), store.prefix) if p)
    here = here.rstrip("/")
    if where == here:
        return ""
    if where.startswith(here + "/"):
        return normalize_path(where[len(here) + 1 :])
    return None


def _parse_info(data: bytes, snapshot_id: str, key: SnapshotKey) -> SnapshotInfo | None:
    """The listing record ``data`` of ``snapshot_id`` if it is signed with ``key``, else None
    (the manifest is then read instead)."""
    try:
        raw = json.loads(data)
        if raw["id"] != snapshot_id:
            return None
        if not key.verify("index", canonical_json({k: v for k, v in raw.items() if k != "mac"}), raw.get("mac")):
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


def _storage_now(locks: Mapping[str, tuple[FileStat, bytes | OSError]], mine: str) -> datetime | None:
    """The storage's time now: the listed time of the lock ``mine`` just wrote (None where
    the listing gives no times)."""
    own = locks.get(mine)
    return own[0].modified_at if own is not None and own[0].modified_at.timestamp() > 0 else None


#: Filesystem types whose files other machines may write.
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "afs", "fuse")


class StatMemo:
    """The hashes of local files by their full stat, from snapshots taken in this process.

    On local disk an ETag derives from the modification time, size and inode, and a write
    within one tick of the clock may leave all three as they were, so a snapshot reads and
    hashes every file. A write always moves the file's change time (ctime), though, and no
    call sets it back: a file whose size, mtime, ctime and inode are all what they were
    when it was hashed still holds what was hashed (what git's index relies on). An entry
    is kept only for a file whose ctime and mtime were both at least :attr:`MARGIN_NS`
    older than the listing that saw it, so that no write in the same tick as that listing,
    or between the listing and the read, can hide behind equal times. Only files of a disk of this
    machine qualify (no network filesystem, no FUSE mount: their ctimes are not this
    kernel's to keep). The memo lives as long as its :class:`SnapshotStore` object.
    """

    #: How much older than its listing a file's ctime and mtime must be for its hash to be kept.
    MARGIN_NS = 2_000_000_000

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], tuple[tuple[int, int, int, int], str]] = {}
        self._applies: dict[str, bool] = {}

    def location(self, fs: WorkspaceFilesystem) -> str | None:
        """The directory of ``fs`` where the memo applies to it, else None."""
        inner = unwrapped(fs)
        location = inner.location if isinstance(inner, LocalFilesystem) else None
        if location is None:
            return None
        if location not in self._applies:
            self._applies[location] = not _on_network_fs(location)
        return location if self._applies[location] else None

    @staticmethod
    def _signature(stat: FileStat) -> tuple[int, int, int, int] | None:
        if stat.ctime_ns is None or stat.mtime_ns is None or stat.inode is None:
            return None
        return (stat.size, stat.mtime_ns, stat.ctime_ns, stat.inode)

    def get(self, location: str | None, stat: FileStat) -> str | None:
        """The hash of the file ``stat`` describes, if it was hashed as that very file."""
        if location is None:
            return None
        known = self._known.get((location, stat.path))
        signature = self._signature(stat)
        return known[1] if known is not None and signature is not None and known[0] == signature else None

    def put(self, location: str | None, stat: FileStat, digest: str, listed_ns: int) -> None:
        """Remember that the file ``stat`` describes (listed at ``listed_ns``, wall clock)
        hashes to ``digest``, unless it changed too shortly before that listing."""
        signature = self._signature(stat)
        if location is None or signature is None:
            return
        # Both times: where a filesystem's ctime is the creation time (vfat), the mtime,
        # in ticks of up to two seconds, is what a later write must move.
        if max(signature[1], signature[2]) < listed_ns - self.MARGIN_NS:
            self._known[(location, stat.path)] = (signature, digest)
        else:
            self._known.pop((location, stat.path), None)


def _on_network_fs(path: str) -> bool:
    """Whether ``path`` is on a filesystem other machines may share (or it cannot be told)."""
    try:
        real = os.path.realpath(path)
        best, kind = "", ""
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                mount = fields[4].replace("\\040", " ")
                fstype = fields[fields.index("-") + 1]
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, fstype
    except (OSError, ValueError, IndexError):
        return True
    return not best or kind.split(".", 1)[0] in _NETWORK_FS


def _process_space() -> str | None:
    """This kernel's boot and this process's PID namespace: where a lock's process id names
    one process (None where the system does not tell)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _lock_record(stale_after: float) -> dict[str, Any]:
    """What a lease or claim holds: when it was written, by which process, and after how
    long without a renewal it is stale."""
    pid = os.getpid()
    return {
        "at": time.time(), "host": socket.gethostname(), "pid": pid, "space": _process_space(),
        "started": start_time(pid), "stale_after": stale_after,
    }  # fmt: skip


def _lock_signed_bytes(path: str, record: Mapping[str, Any]) -> bytes:
    """What a lock's MAC is taken of: its file's name and its record."""
    return path.rsplit("/", 1)[-1].encode("utf-8") + b"\0" + canonical_json(record)


class _Fields(NamedTuple):
    """What a lock record says (None: not said, or not of the right type)."""

    at: float
    pid: int | None
    space: str | None
    started: int | None
    stale_after: float | None
    host: str | None


def _lock_fields(data: bytes) -> _Fields | None:
    """The fields of a lock record; None when it is not one."""
    try:
        record = json.loads(data)
        at = record["at"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return None

    def number(key: str) -> int | None:
        value = record.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    space, host, stale = record.get("space"), record.get("host"), record.get("stale_after")
    return _Fields(
        float(at),
        number("pid"),
        space if isinstance(space, str) else None,
        number("started"),
        float(stale) if isinstance(stale, (int, float)) and not isinstance(stale, bool) and stale > 0 else None,
        host if isinstance(host, str) else None,
    )


def _exited(record: _Fields) -> bool:
    """Whether the process that wrote a lock record, on this host in this PID namespace of
    this boot, has exited (a process now holding its id started at another time)."""
    pid, space = record.pid, record.space
    if pid is None or space is None or space != _process_space() or record.host != socket.gethostname():
        return False
    if not pid_alive(pid):
        return True
    return record.started is not None and start_time(pid) not in (None, record.started)
