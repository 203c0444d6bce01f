"""A persistent cache of remote file contents on local disk, shared by the processes of a machine.

A :class:`ContentCache` keeps whole files of remote storage, each under the key of its storage,
path and *version* (the ETag or generation the store gave it). A version is never changed in
place, so an entry never goes stale: a file changed in storage has a new version, and readers
that check the version before they use the cache (close-to-open, see :class:`VersionMemo`)
never see old bytes. The cache survives mounts and processes; several processes of one machine
may share a directory. Only its owner may read it: its directories are made with mode 0700
(``v1`` is made so again if an earlier version left it open), its files 0600.

Where an ETag is a digest of the content (S3's MD5: whoever writes can make two contents of
one ETag), a version is the ETag together with the object's modification time (a second), and
it is cached only once a listing or stat has shown that time at least :data:`SETTLE_SECONDS`
old: any later write gets a later time. A rewrite with colliding bytes in the same second as
the version it replaces is then never filed under that version.

Layout of ``directory`` (format 1)::

    v1/lock                    flock: budget accounting and eviction, one process at a time
    v1/used                    bytes held or reserved (a decimal number, rewritten under lock)
    v1/entries/<kk>/<key>      the bytes of one version of one file
    v1/entries/<kk>/<key>.m    its record (JSON): size, the data file's identity, blake2b
    v1/tmp/<pid>.<rand>.<n>    an entry being written (``n`` bytes reserved for it)

How it stays correct:

- **No half entry is served.** An entry is written under ``tmp/``, renamed into place, and
  only then its record is renamed beside it: the record is the commit. A reader needs the
  record and a data file of exactly the recorded size, inode and modification time; anything
  else (a crash between the renames, a data file replaced or written to in place, a truncated
  file) is a miss, and the entry is removed and fetched again. Entries read whole through the
  Python API are also checked against their blake2b hash.
- **The budget holds across processes.** Bytes are reserved under the lock before an entry is
  written (``used`` counts them at once) and eviction (least recently used first, by the time
  of the record, which each hit touches) makes room before the reservation is granted. A
  process killed mid-write leaves a ``tmp`` file named by its pid and reservation; the next
  eviction counts it while that pid lives and removes it after, and recounts ``used`` from
  what is on disk.
- **Deleting is safe while others read**: a reader holds a descriptor, which outlives the name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._procs import pid_alive

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "SETTLE_SECONDS",
    "CacheFill",
    "CacheInfo",
    "ContentCache",
    "SupportsContentCache",
    "VersionMemo",
    "default_cache_dir",
    "settled",
]

_log = logging.getLogger("agentvfs.cache")

#: The budget of a cache made without one.
DEFAULT_CACHE_BYTES = 4 * 1024**3
_FORMAT = "v1"
#: Disk taken beyond its bytes by each entry (the record, and a block of slack), counted so
#: that the budget bounds what the directory really takes.
_ENTRY_OVERHEAD = 8192
#: Eviction frees this share of the budget beyond what a reservation needs, so that a full
#: cache does not scan its directory for every new entry.
_HEADROOM = 0.1
_HASH_BYTES = 16
#: The share of the budget (1/n) kept for metadata records, and what one is counted as
#: (the record, its index entry and the write-ahead log's copy, generously).
_STAT_SHARE = 32
_STAT_ROW = 2048
#: Bytes reserved at a time for the entries one process writes (see ``_reserve``).
_CREDIT_BLOCK = 64 * 1024 * 1024
#: A data file without its record this old is left from a crash (younger, a commit may be
#: between its two renames).
_STRAY_AGE = 60.0
#: Keys asked for in one query by ``get_stats`` (SQLite allows 32,766 parameters).
_STATS_PER_QUERY = 500
#: Bytes read of an entry's record at once (a record names the file and its version: far less).
_RECORD_READ = 16384
#: An entry's record is touched (its time orders eviction) at most this often, in seconds.
_TOUCH_EVERY = 60.0
#: How much older (seconds) than the moment storage showed it an object's modification time
#: must be for its ETag, size and time to name one content where the ETag is a digest a
#: writer can collide (``Capabilities.digest_etags``): a later write gets a later time, to
#: the second, as long as this host's clock is within a few seconds of the storage's (the
#: rule git's index and the local stat memo of snapshots follow for racy timestamps).
SETTLE_SECONDS = 4.0


def settled(modified: float, seen: float) -> bool:
    """Whether a modification time ``modified`` (seconds since the epoch, storage's clock)
    shown at ``seen`` (this host's clock) is older than :data:`SETTLE_SECONDS` then; a time
    of 0 or less (none given) never is."""
    return 0 < modified < seen - SETTLE_SECONDS


def default_cache_dir() -> str:
    """``$AGENTVFS_CACHE_DIR``, else ``$XDG_CACHE_HOME/agentvfs``, else ``~/.cache/agentvfs``."""
    explicit = os.environ.get("AGENTVFS_CACHE_DIR")
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(os.path.abspath(xdg), "agentvfs")
    return os.path.join(os.path.expanduser("~"), ".cache", "agentvfs")


def _digest(data: bytes | bytearray | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=_HASH_BYTES).hexdigest()


def _footprint(size: int) -> int:
    return -(-size // 4096) * 4096 + _ENTRY_OVERHEAD


def _read_number(path: str) -> int | None:
    """The decimal number a bookkeeping file holds; None if it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return int(f.read().strip() or b"0")
    except (OSError, ValueError):
        return None


def _write_number(path: str, value: int) -> None:
    """Rewrite a bookkeeping file in place with ``value``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        data = str(value).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """What a cache directory holds."""

    directory: str
    entries: int
    bytes: int
    max_bytes: int
    #: Bytes reserved for entries being written (by this or another live process).
    pending: int = 0


@runtime_checkable
class SupportsContentCache(Protocol):
    """Filesystems that can keep what they read of remote storage in a :class:`ContentCache`
    (:class:`~agentvfs.vfs.FsspecFilesystem` on object stores), and hand a FUSE mount
    descriptors of cached files."""

    @property
    def cache(self) -> ContentCache | None:
        """The cache in use, or None."""
        ...

    def use_cache(
        self, cache: ContentCache | bool | str | os.PathLike[str] = True, *, cache_bytes: int | None = None,
        metadata_ttl: float = 5.0,
    ) -> ContentCache | None:
        """Start using a cache; None where this storage is not cached."""
        ...

    async def open_cached(self, path: str, version: str, size: int, *, fetch_below: int = 0) -> int | None:
        """A read-only descriptor of the cached ``version`` of ``path``, or None."""
        ...

    def prefetch(self, files: Sequence[tuple[str, str, int]]) -> None:
        """Fetch ``(path, version, size)`` files into the cache in the background."""
        ...

    def flush_cache(self) -> None:
        """Wait for what is being written to the cache in the background; blocking."""
        ...


class ContentCache:
    """Whole files of remote storage on local disk, by storage, path and version.

    Parameters
    ----------
    directory : str or path-like, optional
        Where entries live (created if missing; default :func:`default_cache_dir`). Share it
        between processes freely; give each user a directory of their own.
    max_bytes : int
        The budget: the most bytes of local disk the entries may take together (their records
        and block slack included). A file larger than the budget is never cached.

    Raises
    ------
    ValueError
        ``max_bytes`` is not positive.
    NotADirectoryError, PermissionError
        ``directory`` cannot be made or written.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes, not {max_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory) if directory is not None else default_cache_dir())
        self.max_bytes = max_bytes
        #: What file contents may take; the rest of the budget is the records of metadata
        #: (``put_stat``): at most ``_STAT_SHARE`` of it, at ``_STAT_ROW`` bytes a record.
        self._data_bytes = max_bytes - max_bytes // _STAT_SHARE
        self._stat_rows = max(16, (max_bytes // _STAT_SHARE) // _STAT_ROW)
        self._db: sqlite3.Connection | None = None
        self._db_pid = 0
        self._db_lock = threading.Lock()
        self._stat_puts = 0
        self._base = os.path.join(self.directory, _FORMAT)
        self._entries = os.path.join(self._base, "entries")
        self._tmp = os.path.join(self._base, "tmp")
        # The directory given is made private if it is made here; an existing one is the
        # caller's to keep as it is (a directory shared for other things): everything the
        # cache keeps is below its format directory, which is private either way.
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        for path in (self._base, self._entries, self._tmp):
            _private_directory(path)
        self._lock_path = os.path.join(self._base, "lock")
        self._used_path = os.path.join(self._base, "used")
        #: Serialises this process's threads around the file lock (flock is per open file)
        #: and guards the credit: bytes reserved for this process not given to an entry yet.
        self._thread_lock = threading.RLock()
        self._credit = 0
        self._credit_pid = os.getpid()
        self.hits = 0
        self.misses = 0

    # -- keys ------------------------------------------------------------------------------------

    @staticmethod
    def key(storage: str, path: str, version: str) -> str:
        """The key of ``version`` of the file ``path`` of ``storage`` (a URL naming the store)."""
        raw = "\0".join((storage, path, version)).encode("utf-8", "surrogatepass")
        return hashlib.sha256(raw).hexdigest()

    def _paths(self, key: str) -> tuple[str, str]:
        data = os.path.join(self._entries, key[:2], key)
        return data, data + ".m"

    # -- reading ---------------------------------------------------------------------------------

    def _record(self, key: str, size: int) -> tuple[dict[str, object], str] | None:
        """The record of the entry ``key`` and the path of its data; None when there is no
        complete entry of ``size`` bytes. The record's file is touched (the order of
        eviction) when it was last touched over a minute ago."""
        data_path, record_path = self._paths(key)
        try:
            # os calls, not open(): this runs at every open of a cached file through a mount.
            fd = os.open(record_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:
            self._drop(key, "its record cannot be read")
            return None
        try:
            touched = os.fstat(fd).st_mtime
            raw = os.read(fd, _RECORD_READ)
            while len(raw) % _RECORD_READ == 0 and raw:  # a record longer than usual
                more = os.read(fd, _RECORD_READ)
                if not more:
                    break
                raw += more
            record = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError):
            self._drop(key, "its record cannot be read")
            return None
        finally:
            os.close(fd)
        if not isinstance(record, dict) or record.get("size") != size:
            self._drop(key, f"it records {record.get('size') if isinstance(record, dict) else '?'} bytes, not {size}")
            return None
        if time.time() - touched > _TOUCH_EVERY:
            with contextlib.suppress(OSError):
                os.utime(record_path)
        return record, data_path

    def _check(self, key: str, record: dict[str, object], st: os.stat_result) -> bool:
        if st.st_size != record.get("size") or st.st_ino != record.get("ino") or st.st_mtime_ns != record.get("mtime_ns"):
            self._drop(key, "its data file is not the one recorded (replaced, truncated or written to)")
            return False
        return True

    def open(self, key: str, size: int) -> int | None:
        """A read-only descriptor of the complete entry ``key`` of ``size`` bytes, or None.

        The entry is checked by its size and the identity of its data file (not its hash:
        a reader of a descriptor may read only part of it); a mismatch removes it.
        """
        found = self._record(key, size)
        if found is None:
            self.misses += 1
            return None
        record, data_path = found
        try:
            fd = os.open(data_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self._drop(key, "its data file is missing")
            self.misses += 1
            return None
        if not self._check(key, record, os.fstat(fd)):
            os.close(fd)
            self.misses += 1
            return None
        self.hits += 1
        return fd

    def get(self, key: str, size: int) -> bytes | None:
        """The bytes of the entry ``key`` of ``size`` bytes, checked against its hash, or None."""
        if size == 0:
            return b""
        found = self._record(key, size)
        if found is None:
            self.misses += 1
            return None
        record, data_path = found
        try:
            with open(data_path, "rb", buffering=0) as f:
                if not self._check(key, record, os.fstat(f.fileno())):
                    self.misses += 1
                    return None
                data = f.read()
        except OSError:
            self._drop(key, "its data file is missing")
            self.misses += 1
            return None
        expected = record.get("blake2b")
        if len(data) != size or (expected is not None and _digest(data) != expected):
            self._drop(key, "its content does not match its hash")
            self.misses += 1
            return None
        self.hits += 1
        return data

    def contains(self, key: str, size: int) -> bool:
        """Whether a complete entry ``key`` of ``size`` bytes is there (nothing is touched)."""
        data_path, record_path = self._paths(key)
        try:
            st = os.stat(data_path)
            return os.path.exists(record_path) and st.st_size == size
        except OSError:
            return False

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview, *, describe: dict[str, str] | None = None) -> bool:
        """Keep ``data`` as the entry ``key``; False when it does not fit the budget (or the
        disk refused it: the cache is an optimisation, so that is logged, not raised)."""
        fill = self.begin(key, len(data), describe=describe, hashed=True)
        if fill is None:
            return False
        try:
            fill.write(0, data)
            return fill.commit(_digest(data))
        except OSError as exc:
            _log.warning("cache: could not keep %s: %s", (describe or {}).get("path", key), exc)
            fill.abort()
            return False

    def begin(
        self, key: str, size: int, *, describe: dict[str, str] | None = None, hashed: bool = False
    ) -> CacheFill | None:
        """Start writing the entry ``key`` of ``size`` bytes in any order of ranges; None when
        it cannot fit the budget. Commit the fill once every byte is written, or abort it."""
        need = _footprint(size)
        if need > self._data_bytes:
            return None
        tmp_path = os.path.join(self._tmp, f"{os.getpid()}.{secrets.token_hex(6)}.{need}")
        try:
            fd = self._reserve(need, tmp_path)
        except OSError as exc:
            _log.warning("cache: cannot write in %s: %s", self._tmp, exc)
            return None
        if fd is None:
            return None
        return CacheFill(self, key, size, fd, tmp_path, need, describe or {})

    def _commit(self, fill: CacheFill, digest: str | None) -> bool:
        data_path, record_path = self._paths(fill.key)
        st = os.fstat(fill.fd)
        record = {"size": fill.size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "blake2b": digest, **fill.describe}
        record_tmp = fill.tmp_path + ".m"
        # os calls, not open(): a cold `grep -r` through a mount commits an entry per file.
        fd = os.open(record_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(record, ensure_ascii=False).encode("utf-8"))
        finally:
            os.close(fd)
        # The data first, the record last: a record names only a data file already in place.
        replaced = os.path.exists(data_path)
        try:
            os.rename(fill.tmp_path, data_path)
        except FileNotFoundError:
            # Its shard's directory is made at the first entry that goes there (or again
            # after a clear): not looked for at every commit.
            os.makedirs(os.path.dirname(data_path), mode=0o700, exist_ok=True)
            os.rename(fill.tmp_path, data_path)
        os.rename(record_tmp, record_path)
        if replaced:
            # Another process kept the same version meanwhile; its bytes were counted too.
            self._release(fill.reserved)
        return True

    # -- the budget ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read_used(self) -> int | None:
        return _read_number(self._used_path)

    def _write_used(self, used: int) -> None:
        _write_number(self._used_path, max(0, used))  # under the file lock: never read half written

    def _set_credit(self, credit: int) -> None:
        """Keep this process's unassigned reservation where a recount finds it (under the
        thread lock). Only a credit that grows is written at once: one handed out to a fill
        (whose file's name counts it anyway) leaves the file over-stating it until the next
        write, which a recount counts as reserved (at most one block: the budget still
        holds), and an entry costs no rewrite of it."""
        grew = credit > self._credit
        self._credit = credit
        if grew:
            _write_number(os.path.join(self._tmp, f"{os.getpid()}.credit"), credit)

    def _reserve(self, need: int, tmp_path: str) -> int | None:
        """Reserve ``need`` bytes and create the fill's file (named by the reservation, so a
        recount finds it); its descriptor, or None: no room.

        Bytes are reserved under the file lock a block at a time (up to ``max_bytes / 16``)
        and handed out within the process from that credit, which is kept in a file of its
        own: filling many small entries takes the lock once per block, not once per entry.
        """
        open_flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        with self._thread_lock:
            if self._credit_pid != os.getpid():
                self._credit, self._credit_pid = 0, os.getpid()  # a forked child owns none
            if self._credit >= need:
                fd = os.open(tmp_path, open_flags, 0o600)
                self._set_credit(self._credit - need)
                return fd
        block = max(need, min(_CREDIT_BLOCK, self._data_bytes // 16))
        with self._locked():
            used = self._read_used()
            for ask in (block, need):
                if used is None or used + ask > self._data_bytes:
                    used = self._evict(self._data_bytes - ask - int(self._data_bytes * _HEADROOM))
                if used + ask <= self._data_bytes:
                    break
            else:
                return None
            fd = os.open(tmp_path, open_flags, 0o600)
            self._write_used(used + ask)
            self._set_credit(self._credit + ask - need)
            return fd

    def _release(self, amount: int) -> None:
        """Bytes reserved and not used (a fill given up): back to this process's credit."""
        with self._thread_lock:
            if self._credit_pid == os.getpid():
                self._set_credit(self._credit + amount)

    def _scan(self, credits: list[int] | None = None) -> tuple[list[tuple[float, int, str]], int, list[str]]:
        """(mtime, footprint, key) of every committed entry; bytes reserved by live fills and
        processes (each process's unassigned credit also appended to ``credits``); the paths
        of dead fills and credits and of data files without a record."""
        entries: list[tuple[float, int, str]] = []
        stray: list[str] = []
        young = 0
        with os.scandir(self._entries) as shards:
            for shard in shards:
                if not shard.is_dir(follow_symlinks=False):
                    continue
                names = set(os.listdir(shard.path))
                for name in names:
                    if name.endswith(".m"):
                        continue
                    path = os.path.join(shard.path, name)
                    if name + ".m" not in names:
                        # A crash between the two renames, or a commit under way right now.
                        with contextlib.suppress(OSError):
                            st = os.stat(path)
                            if time.time() - st.st_mtime > _STRAY_AGE:
                                stray.append(path)
                            else:
                                young += _footprint(st.st_size)
                        continue
                    try:
                        record_time = os.stat(path + ".m").st_mtime
                        size = os.stat(path).st_size
                    except OSError:
                        continue
                    entries.append((record_time, _footprint(size), name))
                for name in names:
                    if name.endswith(".m") and name[:-2] not in names:
                        stray.append(os.path.join(shard.path, name))  # its data was removed
        pending = young
        for name in os.listdir(self._tmp):
            parts = name.split(".")
            if len(parts) == 2 and parts[1] == "credit" and parts[0].isdigit():
                pid = int(parts[0])
                path = os.path.join(self._tmp, name)
                credit = 0
                if pid == os.getpid():
                    credit = self._credit
                elif pid_alive(pid):
                    credit = _read_number(path) or 0
                else:
                    stray.append(path)
                pending += credit
                if credits is not None:
                    credits.append(credit)
                continue
            try:
                pid, reserved = int(parts[0]), int(parts[2])
            except (IndexError, ValueError):
                stray.append(os.path.join(self._tmp, name))
                continue
            if pid == os.getpid() or pid_alive(pid):
                pending += reserved if len(parts) == 3 else 0
            else:
                stray.append(os.path.join(self._tmp, name))
        return entries, pending, stray

    def _evict(self, target: int) -> int:
        """Under the lock: remove dead fills, then the least recently used entries until what
        is held is at most ``target``; recount and return what is held."""
        entries, pending, stray = self._scan()
        for path in stray:
            with contextlib.suppress(OSError):
                os.unlink(path)
        used = pending + sum(e[1] for e in entries)
        if used > target:
            entries.sort()
            for _, footprint, key in entries:
                if used <= target:
                    break
                self._remove_files(key)
                used -= footprint
        self._write_used(used)
        return used

    # -- metadata records --------------------------------------------------------------------------

    def _stats(self) -> sqlite3.Connection:
        """The database of metadata records (one connection per process, used under a lock)."""
        if self._db is None or self._db_pid != os.getpid():
            path = os.path.join(self._base, "stats.sqlite")
            # Made private before SQLite opens it: its journal files take its mode.
            for name in (path, path + "-wal", path + "-shm"):
                _private_file(name, create=name == path)
            db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS stats (key TEXT PRIMARY KEY, value TEXT NOT NULL, used REAL NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS stats_used ON stats (used)")
            self._db, self._db_pid = db, os.getpid()
        return self._db

    def get_stat(self, key: str) -> dict[str, object] | None:
        """The metadata record ``key`` (a JSON object), or None. Keys name a version as
        :meth:`key` does: a record never goes stale, it is only forgotten."""
        try:
            with self._db_lock:
                row = self._stats().execute("SELECT value FROM stats WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            _log.warning("cache: metadata records unreadable: %s", exc)
            return None
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def get_stats(self, keys: Sequence[str]) -> dict[str, dict[str, object]]:
        """The metadata records of those ``keys`` that are kept, by key (a few queries for
        any number of keys, where :meth:`get_stat` is one per key)."""
        found: dict[str, dict[str, object]] = {}
        for start in range(0, len(keys), _STATS_PER_QUERY):
            chunk = list(keys[start : start + _STATS_PER_QUERY])
            marks = ",".join("?" * len(chunk))
            try:
                with self._db_lock:
                    rows = self._stats().execute(f"SELECT key, value FROM stats WHERE key IN ({marks})", chunk).fetchall()
            except sqlite3.Error as exc:
                _log.warning("cache: metadata records unreadable: %s", exc)
                return found
            for key, text in rows:
                try:
                    value = json.loads(text)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    found[key] = value
        return found

    def put_stat(self, key: str, value: dict[str, object]) -> None:
        """Keep the metadata record ``key``; the oldest records go beyond their share."""
        try:
            with self._db_lock:
                db = self._stats()
                db.execute(
                    "INSERT OR REPLACE INTO stats (key, value, used) VALUES (?, ?, ?)",
                    (key, json.dumps(value, ensure_ascii=False), time.time()),
                )
                self._stat_puts += 1
                if self._stat_puts % max(1, min(256, self._stat_rows // 4)) == 0:
                    (count,) = db.execute("SELECT count(*) FROM stats").fetchone()
                    if count > self._stat_rows:
                        db.execute(
                            "DELETE FROM stats WHERE key IN (SELECT key FROM stats ORDER BY used LIMIT ?)",
                            (count - int(self._stat_rows * (1 - _HEADROOM)),),
                        )
        except sqlite3.Error as exc:
            _log.warning("cache: metadata record not kept: %s", exc)

    # -- upkeep ----------------------------------------------------------------------------------

    def _remove_files(self, key: str) -> None:
        data_path, record_path = self._paths(key)
        # The record first: without it the data is never served.
        for path in (record_path, data_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _drop(self, key: str, why: str) -> None:
        _log.warning("cache: entry %s dropped: %s; it will be fetched again", key[:16], why)
        self._remove_files(key)

    def info(self) -> CacheInfo:
        """Entries and bytes held, and the budget."""
        credits: list[int] = []
        with self._locked():
            entries, pending, _ = self._scan(credits)
        return CacheInfo(self.directory, len(entries), sum(e[1] for e in entries), self.max_bytes, pending - sum(credits))

    def clear(self) -> int:
        """Remove every entry (fills under way in other processes finish or fail on their
        own); the number removed."""
        with self._locked():
            entries, pending, stray = self._scan()
            for path in stray:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            for _, _, key in entries:
                self._remove_files(key)
            self._write_used(pending)
        with contextlib.suppress(sqlite3.Error), self._db_lock:
            self._stats().execute("DELETE FROM stats")
        return len(entries)

    def __repr__(self) -> str:
        return f"ContentCache({self.directory!r}, max_bytes={self.max_bytes})"


def _private_directory(path: str) -> None:
    """Make the directory ``path`` (mode 0700), or take group and other access from one of
    this user's that has it (a cache made by an earlier version). Another user's directory
    is left as it is: its entries are still 0600."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def _private_file(path: str, *, create: bool) -> None:
    """Make the file ``path`` with mode 0600 (where ``create``), or take group and other
    access from it: only its owner may read what the cache keeps."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o600)
    finally:
        os.close(fd)


class CacheFill:
    """An entry being written: ranges in any order, then :meth:`commit` or :meth:`abort`."""

    def __init__(
        self, cache: ContentCache, key: str, size: int, fd: int, tmp_path: str, reserved: int, describe: dict[str, str]
    ) -> None:
        self.cache = cache
        self.key = key
        self.size = size
        self.fd = fd
        self.tmp_path = tmp_path
        self.reserved = reserved
        self.describe = describe
        self._have: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self.done = False
        #: Reads of the file under way that will write here (kept by the reader), and whether
        #: one has reached the end of the file.
        self.inflight = 0
        self.reached_end = False
        #: Parts handed to a writer and not written yet; the fill is being completed.
        self.queued = 0
        self.finishing = False

    @property
    def complete(self) -> bool:
        """Every byte of the file has been written."""
        with self._lock:
            return self._covered() >= self.size

    def missing(self) -> list[tuple[int, int]]:
        """The ranges ``(start, end)`` not written yet, in order."""
        with self._lock:
            holes: list[tuple[int, int]] = []
            end = 0
            for start, stop in sorted(self._have):
                if start > end:
                    holes.append((end, start))
                end = max(end, stop)
            if end < self.size:
                holes.append((end, self.size))
            return holes

    def _covered(self) -> int:
        total = 0
        end = -1
        for start, stop in sorted(self._have):
            if stop <= end:
                continue
            total += stop - max(start, end)
            end = stop
        return total

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset`` (within the file's size)."""
        view = memoryview(data)
        if offset < 0 or offset + len(view) > self.size:
            raise ValueError(f"bytes {offset}..{offset + len(view)} lie outside a file of {self.size}")
        # Under the lock: no byte lands after the commit has recorded the file's identity
        # (a copy into the page cache, quick next to the network read that brought it).
        with self._lock:
            if self.done:
                return
            written = 0
            while written < len(view):
                written += os.pwrite(self.fd, view[written:], offset + written)
            self._have.append((offset, offset + len(view)))
            if len(self._have) > 64:
                merged: list[tuple[int, int]] = []
                for start, stop in sorted(self._have):
                    if merged and start <= merged[-1][1]:
                        merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
                    else:
                        merged.append((start, stop))
                self._have = merged

    def commit(self, digest: str | None = None) -> bool:
        """Publish the entry (every byte must have been written); False if it was not."""
        with self._lock:
            if self.done:
                return False
            if self._covered() < self.size:
                raise ValueError(f"a cache entry of {self.size} bytes was committed with bytes missing")
            self.done = True
        try:
            return self.cache._commit(self, digest)
        except OSError as exc:
            _log.warning("cache: could not keep %s: %s", self.describe.get("path", self.key), exc)
            self._discard()
            return False
        finally:
            os.close(self.fd)

    def abort(self) -> None:
        """Give the entry up: nothing is kept and its reservation is released."""
        with self._lock:
            if self.done:
                return
            self.done = True
        os.close(self.fd)
        self._discard()

    def _discard(self) -> None:
        for path in (self.tmp_path, self.tmp_path + ".m"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.cache._release(self.reserved)


class VersionMemo:
    """The version and size of each file as last seen in a listing or stat, for ``ttl`` seconds.

    Close-to-open: a read that finds a version here younger than ``ttl`` uses it (and the
    cache entry of that version) without asking storage; an older one is asked again. Every
    change made through the same filesystem object forgets the path it touched and all below
    it at once (a cut: one entry per change, checked against a path's ancestors on lookup).
    """

    def __init__(self, ttl: float, limit: int = 200_000) -> None:
        self.ttl = ttl
        self._limit = limit
        #: path -> (version, size, when seen (monotonic), modification second, whether that
        #: second was :func:`settled` when seen).
        self._seen: dict[str, tuple[str, int, float, int, bool]] = {}
        self._cuts: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, path: str, version: str | None, size: int, stamp: int = 0) -> None:
        """``path`` is at ``version`` of ``size`` bytes now, modified at second ``stamp``."""
        if version is None:
            return
        seen = (version, size, time.monotonic(), stamp, settled(stamp, time.time()))
        with self._lock:
            if len(self._seen) >= self._limit:
                self._seen.clear()  # rare: a fresh start costs one request per file
            self._seen[path] = seen

    def stamp_of(self, path: str, version: str) -> tuple[int, bool] | None:
        """The modification second of ``version`` of ``path`` as last seen (at any age), and
        whether it was :func:`settled` then; None where ``path`` was last seen at another
        version, or never."""
        with self._lock:
            seen = self._seen.get(path)
        return (seen[3], seen[4]) if seen is not None and seen[0] == version else None

    def fresh(self, path: str) -> tuple[str, int] | None:
        """``(version, size)`` of ``path`` if seen within ``ttl`` and not changed here since."""
        found = self.fresh_stamped(path)
        return None if found is None else (found[0], found[1])

    def fresh_stamped(self, path: str) -> tuple[str, int, int] | None:
        """``(version, size, stamp)`` of ``path`` as :meth:`fresh`."""
        with self._lock:
            seen = self._seen.get(path)
            if seen is None or time.monotonic() - seen[2] > self.ttl or self._cut_since(path, seen[2]):
                return None
        return seen[0], seen[1], seen[3]

    def size_of(self, path: str, version: str) -> int | None:
        """The size of ``version`` of ``path`` if it was ever seen (a version has one size)."""
        with self._lock:
            seen = self._seen.get(path)
        return seen[1] if seen is not None and seen[0] == version else None

    def _cut_since(self, path: str, moment: float) -> bool:
        if not self._cuts:
            return False
        if self._cuts.get("", -1.0) >= moment:
            return True
        end = len(path)
        while end > 0:
            if self._cuts.get(path[:end], -1.0) >= moment:
                return True
            end = path.rfind("/", 0, end)
        return False

    def changed_since(self, path: str, moment: float) -> bool:
        """Whether a change made here since ``moment`` (monotonic) touched ``path``, a path
        above it or one below it (a listing of ``path`` is then out of date)."""
        with self._lock:
            if self._cut_since(path, moment):
                return True
            head = path.rstrip("/") + "/" if path else ""
            return any(t >= moment and p.startswith(head) for p, t in self._cuts.items())

    def forget(self, *paths: str) -> None:
        """Distrust what was seen of each of ``paths`` and everything below it (``""``: all)."""
        now = time.monotonic()
        with self._lock:
            for path in paths:
                path = path.strip("/")
                self._seen.pop(path, None)
                self._cuts[path] = now
            if len(self._cuts) > 10_000:
                # A cut older than the TTL hides only what is too old to be trusted anyway.
                self._cuts = {p: t for p, t in self._cuts.items() if now - t <= self.ttl}
