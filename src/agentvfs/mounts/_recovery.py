"""What a mount could not publish: the staging journal, and the recovery area.

Every staged copy of a file being written is named in a journal, one JSON line per change of
its state, in the mount's own session directory under the state directory
(``<state>/mounts/<storage key>/<session>/``, where staged copies of remote files also
live). A mount that stops cleanly removes its session. One that was killed leaves it, and
the next mount of the same storage finds it (its lock is free): every file that was still
unpublished goes to the recovery area, ``<state>/recovery/<storage key>/<id>/`` (the bytes as
``data``, the facts as ``entry.json``), is reported, and the multipart uploads the journal
names are aborted. Nothing here uploads what it finds, or deletes data that never reached
storage beyond the area's budget: ``agentvfs recover`` lists, restores or discards it.

The live mount puts files into the recovery area too: a file still open for writing when the
mount stops, an upload that failed (and was reported to its writer), a write refused because
storage changed since the mount last saw the file. The area has a budget (bytes, files, and
versions of one path; ``RecoveryArea``): past it the oldest copies are dropped, each logged as
an error, so conflicts made on purpose cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import pwd
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "RecoveredFile",
    "RecoveryArea",
    "Session",
    "default_state_dir",
    "discard_recovered",
    "list_recovered",
    "recover_sessions",
    "storage_key",
]

_log = logging.getLogger("agentvfs.mounts")

_JOURNAL = "journal"
_LOCK = "lock"
_SESSION = "session.json"
_ENTRY = "entry.json"
_DATA = "data"


def default_state_dir() -> str:
    """Where mounts keep journals and recovered files: ``$AGENTVFS_STATE_DIR``, else
    ``$XDG_STATE_HOME/agentvfs``, else ``~/.local/state/agentvfs`` (of the user running)."""
    explicit = os.environ.get("AGENTVFS_STATE_DIR")
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return os.path.join(os.path.abspath(xdg), "agentvfs")
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return os.path.join(home, ".local", "state", "agentvfs")


def storage_key(url: str) -> str:
    """The directory name of one storage location (a hash of its URL)."""
    return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class RecoveredFile:
    """A file the mount kept instead of publishing it.

    Attributes
    ----------
    id : str
        Its name in the recovery area (``agentvfs recover --restore ID``).
    storage : str
        The storage URL it belongs to.
    path : str
        Its path in that storage.
    size : int
        Bytes kept.
    base : str or None
        The version (ETag, generation) storage held when the mount began writing it; None
        for a file that did not exist yet, or a version the mount did not know.
    reason : str
        Why it was not published.
    kept_at : str
        When, ISO 8601 in UTC.
    mountpoint : str
        The mount it came from.
    data : str
        The file holding its bytes.
    """

    id: str
    storage: str
    path: str
    size: int
    base: str | None
    reason: str
    kept_at: str
    mountpoint: str
    data: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _write_json(path: str, value: Mapping[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _move_into(source: str, dest: str) -> int:
    """Move the file ``source`` to ``dest``; its size. On the same filesystem a rename, else
    a copy (synced) then the removal of ``source``."""
    try:
        os.rename(source, dest)
        return os.stat(dest).st_size
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    with open(source, "rb") as src, open(dest, "xb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
    os.unlink(source)
    return os.stat(dest).st_size


#: The budget of one storage location's recovery area (see :meth:`RecoveryArea._prune`).
RECOVERY_MAX_BYTES = 1 << 30
RECOVERY_MAX_FILES = 1000
RECOVERY_MAX_VERSIONS = 256


class RecoveryArea:
    """The recovery area of one storage location.

    Parameters
    ----------
    root : str
        The state directory.
    url : str
        The storage URL.
    mountpoint : str
        The mount whose files are kept (recorded with each).
    max_bytes, max_files, max_versions : int, optional
        The area's budget: bytes and files in all, and kept versions of one path. Past it,
        the oldest copies are dropped (each logged as an error).
    """

    def __init__(
        self,
        root: str,
        url: str,
        mountpoint: str,
        *,
        max_bytes: int = RECOVERY_MAX_BYTES,
        max_files: int = RECOVERY_MAX_FILES,
        max_versions: int = RECOVERY_MAX_VERSIONS,
    ) -> None:
        self.url = url
        self.mountpoint = mountpoint
        self.path = os.path.join(root, "recovery", storage_key(url))
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.max_versions = max_versions
        self._names = itertools.count()

    def keep(self, source: str, *, path: str, base: str | None, reason: str) -> RecoveredFile:
        """Move the file ``source`` here as the unpublished version of ``path``, and log it."""
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        while True:
            ident = f"{stamp}-{os.getpid()}-{next(self._names)}"
            folder = os.path.join(self.path, ident)
            try:
                os.mkdir(folder, 0o700)
                break
            except FileExistsError:
                continue
        data = os.path.join(folder, _DATA)
        size = _move_into(source, data)
        kept = RecoveredFile(
            id=ident, storage=self.url, path=path, size=size, base=base, reason=reason,
            kept_at=_now(), mountpoint=self.mountpoint, data=data,
        )  # fmt: skip
        _write_json(os.path.join(folder, _ENTRY), kept.to_dict())
        _log.warning(
            "/%s was not published (%s); its %d bytes are kept as %s (agentvfs recover --list)",
            path, reason, size, data,
        )
        self._prune(kept)
        return kept

    def _prune(self, newest: RecoveredFile) -> None:
        """Hold the area to its budget: the newest ``max_versions`` of a path, ``max_files``
        files and ``max_bytes`` bytes, dropping the oldest first (never ``newest``).

        Whoever can write through a mount can make conflicts (a command and the API writing
        one file in turn, or another writer): unbounded, the copies they leave would fill the
        host's disk. Each dropped copy is logged as an error.
        """
        entries: list[RecoveredFile] = []
        with contextlib.suppress(FileNotFoundError):
            for ident in os.listdir(self.path):
                try:
                    with open(os.path.join(self.path, ident, _ENTRY), encoding="utf-8") as f:
                        entries.append(RecoveredFile(**json.load(f)))
                except (OSError, ValueError, TypeError):
                    continue
        entries.sort(key=_age)
        drop: dict[str, RecoveredFile] = {}
        versions = [entry for entry in entries if entry.path == newest.path]
        for entry in versions[: max(0, len(versions) - self.max_versions)]:
            drop[entry.id] = entry
        left = [entry for entry in entries if entry.id not in drop]
        total = sum(entry.size for entry in left)
        count = len(left)
        for entry in left:
            if total <= self.max_bytes and count <= self.max_files:
                break
            if entry.id == newest.id:
                continue
            drop[entry.id] = entry
            total -= entry.size
            count -= 1
        for entry in drop.values():
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(os.path.dirname(entry.data))
            _log.error(
                "recovery area of %s over its budget (%d versions of a path, %d files, %d bytes): "
                "dropped %s, the copy of /%s kept at %s (%d bytes)",
                self.url, self.max_versions, self.max_files, self.max_bytes,
                entry.id, entry.path, entry.kept_at, entry.size,
            )  # fmt: skip


def _age(entry: RecoveredFile) -> tuple[str, str, int]:
    """Order of keeping: the time, then the keeping process's counter (``stamp-pid-n``)."""
    stamp, _, rest = entry.id.partition("-")
    pid, _, number = rest.partition("-")
    return (entry.kept_at, f"{stamp}-{pid}", int(number) if number.isdigit() else 0)


class Session:
    """The journal and staging directory of one running mount; held by a lock while it runs.

    Parameters
    ----------
    root : str
        The state directory.
    url : str
        The storage URL.
    mountpoint : str
        Where the storage is mounted.
    """

    def __init__(self, root: str, url: str, mountpoint: str) -> None:
        self.root = root
        self.url = url
        self.mountpoint = mountpoint
        base = os.path.join(root, "mounts", storage_key(url))
        where = _mountpoint_key(mountpoint)
        self.path = os.path.join(base, f"{where}-{os.getpid()}-{time.time_ns()}")
        for _ in range(5):
            os.makedirs(base, mode=0o700, exist_ok=True)
            try:
                os.mkdir(self.path, 0o700)
                break
            except FileNotFoundError:
                continue  # the folder was removed by a session closing just now
        else:
            os.mkdir(self.path, 0o700)
        self._lock = os.open(os.path.join(self.path, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _write_json(
            os.path.join(self.path, _SESSION),
            {"storage": url, "mountpoint": mountpoint, "pid": os.getpid(), "started": _now()},
        )
        self._journal = os.open(
            os.path.join(self.path, _JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        #: Staged copies whose last recorded state is unpublished: their ``dirty`` record.
        self.open_entries: dict[str, dict[str, Any]] = {}

    def note_staging(self, directory: str) -> None:
        """Record where staged copies live (a directory beside the files on local disk is
        removed by the recovery once empty)."""
        path = os.path.join(self.path, _SESSION)
        with open(path, encoding="utf-8") as f:
            about = json.load(f)
        _write_json(path, {**about, "staging": directory})

    def record(self, event: str, ident: str, **fields: Any) -> None:
        """Append one change of state of the staged copy ``ident``.

        Not synced: the journal has to survive the mount's process, not the machine (staged
        bytes are not synced either).
        """
        if self._journal < 0:
            return  # closed: a late abort of a stream after the unmount
        line = json.dumps({"e": event, "id": ident, **fields}, separators=(",", ":")) + "\n"
        os.write(self._journal, line.encode("utf-8", "surrogateescape"))
        if event == "dirty":
            self.open_entries[ident] = fields
        elif event in ("clean", "gone"):
            self.open_entries.pop(ident, None)

    def close(self) -> None:
        """Stop: the session is removed when nothing in it is unpublished (else it is left
        for the next mount of the storage to recover)."""
        if self._journal < 0:
            return
        os.close(self._journal)
        self._journal = -1
        if not self.open_entries:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path))  # the storage's folder, once empty
        os.close(self._lock)  # releases the lock


def _mountpoint_key(mountpoint: str) -> str:
    """The prefix of a session directory's name for ``mountpoint``."""
    return hashlib.sha256(mountpoint.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def serving_process(mountpoint: str, state_dir: str | None = None) -> int | None:
    """The process id of the running ``agentvfs`` mount at ``mountpoint`` whose session is in
    ``state_dir`` (default: :func:`default_state_dir`), or None.

    A session names its process; the process is taken to be running it while it holds the
    session's lock file open (so a reused process id is not mistaken for it).
    """
    root = os.path.abspath(state_dir or default_state_dir())
    point = os.path.abspath(mountpoint)
    prefix = _mountpoint_key(point) + "-"
    base = os.path.join(root, "mounts")
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for storage in sorted(os.listdir(base)):
            with contextlib.suppress(OSError):
                for name in sorted(os.listdir(os.path.join(base, storage))):
                    if not name.startswith(prefix):
                        continue
                    session = os.path.join(base, storage, name)
                    try:
                        with open(os.path.join(session, _SESSION), encoding="utf-8") as f:
                            about = json.load(f)
                        pid = int(about["pid"])
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    if about.get("mountpoint") == point and _holds(pid, os.path.join(session, _LOCK)):
                        return pid
    return None


def _holds(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for fd in names:
        with contextlib.suppress(OSError):
            if os.readlink(os.path.join(fds, fd)) == path:
                return True
    return False


def _sessions(root: str, url: str) -> Iterator[str]:
    base = os.path.join(root, "mounts", storage_key(url))
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(base)):
            yield os.path.join(base, name)


def _fold(journal: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The last known state of each staged copy, and the multipart uploads left open."""
    states: dict[str, dict[str, Any]] = {}
    uploads: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(FileNotFoundError), open(journal, "rb") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue  # a line cut by the crash
            ident = entry.get("id")
            event = entry.get("e")
            if not isinstance(ident, str):
                continue
            if event == "upload":
                uploads[ident] = entry.get("ticket") or {}
            elif event == "upload-done":
                uploads.pop(ident, None)
            elif event == "dirty":
                states[ident] = {**states.get(ident, {}), **entry, "state": "dirty"}
            elif event == "failed":
                states.setdefault(ident, {}).update(state="failed", why=entry.get("why", ""))
            elif event in ("clean", "gone") and ident in states:
                states[ident]["state"] = event
    return states, [ticket for ticket in uploads.values() if ticket]


def recover_sessions(
    root: str, url: str, mountpoint: str, *, skip: str | None = None
) -> tuple[list[RecoveredFile], list[dict[str, Any]]]:
    """Take over every session of ``url`` whose mount is gone: move its unpublished files
    to the recovery area, remove its clean copies, and return what was kept and the
    multipart uploads (tickets) to abort.

    A session whose lock is held belongs to a live mount and is left alone, as is ``skip``
    (the caller's own).
    """
    kept: list[RecoveredFile] = []
    tickets: list[dict[str, Any]] = []
    area = RecoveryArea(root, url, mountpoint)
    for session in _sessions(root, url):
        if session == skip:
            continue
        try:
            lock = os.open(os.path.join(session, _LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # being made or removed right now
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live mount
            try:
                with open(os.path.join(session, _SESSION), encoding="utf-8") as f:
                    about = json.load(f)
            except (OSError, ValueError):
                about = {}
            states, open_uploads = _fold(os.path.join(session, _JOURNAL))
            tickets.extend(open_uploads)
            for entry in states.values():
                staged = entry.get("file")
                if not isinstance(staged, str):
                    continue
                if entry["state"] in ("clean", "gone"):
                    with contextlib.suppress(OSError):
                        os.unlink(staged)  # its bytes are in storage, or were let go
                    continue
                if not os.path.exists(staged):
                    _log.error("a staged copy of /%s named by %s is missing", entry.get("path"), session)
                    continue
                pid = about.get("pid", "?")
                why = f"the mount (pid {pid}) ended before publishing it"
                if entry["state"] == "failed":
                    why += f"; its upload had failed: {entry.get('why', '')}"
                kept.append(area.keep(staged, path=str(entry.get("path", "")), base=entry.get("base"), reason=why))
            shutil.rmtree(session, ignore_errors=True)
            folders = {os.path.dirname(str(e.get("file", ""))) for e in states.values()}
            folders.add(str(about.get("staging", "")))
            for folder in folders:
                if folder and not folder.startswith(session):
                    with contextlib.suppress(OSError):
                        os.rmdir(folder)  # a staging directory beside the files, now empty
                        holder = os.path.dirname(folder)
                        if os.path.basename(holder).startswith(".mount.agentvfs-tmp-"):
                            os.rmdir(holder)  # the hidden directory it was made in
        finally:
            os.close(lock)
    return kept, tickets


def list_recovered(root: str, url: str | None = None) -> list[RecoveredFile]:
    """Every file in the recovery area (of ``url`` only, when given), oldest first."""
    out: list[RecoveredFile] = []
    base = os.path.join(root, "recovery")
    keys = [storage_key(url)] if url is not None else sorted(os.listdir(base)) if os.path.isdir(base) else []
    for key in keys:
        folder = os.path.join(base, key)
        with contextlib.suppress(FileNotFoundError):
            for ident in sorted(os.listdir(folder)):
                try:
                    with open(os.path.join(folder, ident, _ENTRY), encoding="utf-8") as f:
                        out.append(RecoveredFile(**json.load(f)))
                except (OSError, ValueError, TypeError):
                    continue
    return out


def discard_recovered(entry: RecoveredFile) -> None:
    """Delete a recovered file for good."""
    shutil.rmtree(os.path.dirname(entry.data))
