"""Bringing a workspace back to a snapshot's state, one conditional write at a time.

The rule: without ``force``, a restore only adds back what is missing (files and
directories deleted since the snapshot); it never replaces or deletes anything that differs
from the snapshot, because that is a change made after the snapshot, and the snapshot does
not hold it. Those paths are reported as conflicts. With ``force`` they are brought back
too (replaced, or deleted where the snapshot has nothing), each write conditional on the
version the restore saw when it compared: a change made while the restore runs is never
overwritten, with or without ``force``, and is reported.

Every content is read and checked against its hash before the first write, so a tampered
or missing blob or version stops the restore before it changes anything. Writes come
before deletions, so a restore that fails midway leaves extra files, never missing ones.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import stat as stat_module
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from ..errors import FileExists, FileNotFound, StaleFileError
from ..vfs import (
    PosixAttributes,
    Version,
    WorkspaceFilesystem,
    attribute_storage,
    check_version,
    list_stats,
    make_special,
    normalize_path,
)
from ._diff import Side
from ._manifest import FileRecord, Snapshot, is_reserved
from ._take import SnapshotContent
from ._tree import Tree, scan, task_group

__all__ = ["RestoreConflict", "RestoreResult", "apply_restore"]

_log = logging.getLogger("agentvfs.snapshots")

#: Contents fetched and checked at once before a restore writes.
FETCH_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class RestoreConflict:
    """A path a restore left as it is, and why.

    Attributes
    ----------
    path : str
        Relative to the workspace root.
    reason : str
        ``modified`` (other content than the snapshot's), ``added`` (not in the snapshot),
        ``type`` (a file where the snapshot has a directory, or the reverse), ``changed
        during restore`` (written by someone else while the restore ran), ``not empty``
        (a directory to remove still holds kept paths) or ``unsupported`` (a symbolic link
        this storage cannot make).
    """

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did.

    Attributes
    ----------
    snapshot : str
        The id of the snapshot restored.
    restored : tuple of str
        Paths written, created or removed to match the snapshot.
    conflicts : tuple of RestoreConflict
        Paths left as they are (see :class:`RestoreConflict`); without ``force``, every
        change made after the snapshot.
    skipped : tuple of str
        Paths that already matched the snapshot.
    """

    snapshot: str
    restored: tuple[str, ...]
    conflicts: tuple[RestoreConflict, ...]
    skipped: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Whether the selected paths now match the snapshot (no conflicts)."""
        return not self.conflicts


@dataclass(frozen=True, slots=True)
class _Step:
    path: str
    action: str  # write, mkdir, link, delete, rmdir, unlink
    record: FileRecord | None = None
    guard: Version | None = None  # the version seen; None: nothing was there
    target: str | None = None  # a link's target
    after_removal: bool = False  # something of another kind must go first


def _selected(paths: Sequence[str] | None) -> list[str] | None:
    if paths is None:
        return None
    if isinstance(paths, str):
        raise TypeError("paths is a list of paths, not one string: paths=[...]")
    out: list[str] = []
    for p in paths:
        normal = normalize_path(p)
        if is_reserved(normal):
            raise ValueError(f"{p!r} is agentvfs's own data (.agentvfs), which restores never touch")
        out.append(normal)
    return out


def _within(path: str, selection: list[str] | None) -> bool:
    if selection is None:
        return True
    return any(not s or path == s or path.startswith(s + "/") for s in selection)


async def apply_restore(
    fs: WorkspaceFilesystem,
    snapshot: Snapshot,
    content: SnapshotContent,
    *,
    paths: Sequence[str] | None = None,
    force: bool = False,
) -> RestoreResult:
    """Restore ``fs`` (the ``paths`` below, default all) to ``snapshot``; see the module
    notes and :meth:`agentvfs.Workspace.restore`.

    Raises
    ------
    BlobIntegrityError
        A content the restore needs does not match the snapshot (nothing was written).
    FileNotFound
        A content the restore needs is gone from the store or the bucket (nothing was
        written).
    """
    selection = _selected(paths)
    fs._check_writable("restore")
    tree = await scan(fs)
    live = Side(fs=fs, tree=tree)
    steps, conflicts, skipped = await _plan(snapshot, tree, live, selection, force, fs)
    # What is created below a path whose kind changes waits for that path's removal.
    blocked = {s.path for s in steps if s.after_removal}
    steps = [
        dataclasses.replace(s, after_removal=True)
        if s.action in ("mkdir", "write", "link") and any(s.path.startswith(b + "/") for b in blocked)
        else s
        for s in steps
    ]
    data = await _fetch(steps, content)
    restored: list[str] = []
    # Additions and replacements first (parents before children), then removals (children
    # before parents), then what needed a removal first.
    for step in sorted((s for s in steps if s.action in ("mkdir", "write", "link") and not s.after_removal), key=_depth):
        await _apply(fs, step, data, restored, conflicts)
    for step in sorted((s for s in steps if s.action in ("delete", "unlink", "rmdir")), key=_depth, reverse=True):
        await _apply(fs, step, data, restored, conflicts)
    later = [s for s in steps if s.after_removal]
    removed_failed = {c.path for c in conflicts}
    for step in sorted(later, key=_depth):
        if step.path in removed_failed:
            continue
        await _apply(fs, step, data, restored, conflicts)
    # A path of another kind is listed once, though it was removed and then made.
    result = RestoreResult(snapshot.id, tuple(sorted(set(restored))), tuple(sorted(conflicts, key=lambda c: c.path)), tuple(sorted(skipped)))
    _log.info(
        "restored snapshot %s: %d paths restored, %d conflicts, %d unchanged",
        snapshot.id[:12], len(result.restored), len(result.conflicts), len(result.skipped),
    )  # fmt: skip
    return result


def _depth(step: _Step) -> int:
    return step.path.count("/")


async def _plan(
    snapshot: Snapshot,
    tree: Tree,
    live: Side,
    selection: list[str] | None,
    force: bool,
    fs: WorkspaceFilesystem,
) -> tuple[list[_Step], list[RestoreConflict], list[str]]:
    steps: list[_Step] = []
    conflicts: list[RestoreConflict] = []
    skipped: list[str] = []
    wanted: dict[str, str] = {}
    wanted.update(dict.fromkeys(snapshot.directories, "directory"))
    wanted.update(dict.fromkeys(snapshot.files, "file"))
    wanted.update(dict.fromkeys(snapshot.links, "symlink"))
    can_link = attribute_storage(fs) is not None
    same: dict[str, bool] = {}
    limiter = anyio.Semaphore(FETCH_CONCURRENCY)

    async def compare(path: str) -> None:
        async with limiter:
            record = snapshot.files[path]
            same[path] = await live.digest(path, record, snapshot.created_at) == record.sha256

    async with task_group() as tg:
        for path in snapshot.files:
            if path in tree.files and _within(path, selection):
                tg.start_soon(compare, path)

    def refuse(path: str, reason: str) -> None:
        conflicts.append(RestoreConflict(path, reason))

    #: Paths removed before what the snapshot has there is made.
    removing: set[str] = set()

    def removal(path: str) -> _Step:
        removing.add(path)
        kind = tree.kind(path)
        if kind == "file":
            return _Step(path, "delete", guard=Version.of(tree.files[path]))
        if kind == "symlink":
            return _Step(path, "unlink", target=tree.links[path])
        return _Step(path, "rmdir")

    def below_kept(path: str) -> bool:
        """Whether a path above ``path`` is kept as something other than a directory (a
        symbolic link above all: what is made below it must never go through it)."""
        parts = path.split("/")[:-1]
        return any(
            tree.kind(above) not in (None, "directory") and above not in removing
            for above in ("/".join(parts[: i + 1]) for i in range(len(parts)))
        )

    for path in sorted(wanted.keys() | tree.files.keys() | tree.directories | tree.links.keys() | tree.special):
        if not _within(path, selection):
            continue
        want, have = wanted.get(path), tree.kind(path)
        if want is None:
            if have == "special":
                continue  # never recorded, never removed
            if force:
                steps.append(removal(path))
            else:
                refuse(path, "added")
            continue
        if have == "special" or (have is not None and have != want):
            if not force or have == "special":
                refuse(path, "type")
                continue
            steps.append(removal(path))
            steps.append(_creation(path, want, snapshot, after_removal=True))
            continue
        if have is None:
            if below_kept(path):
                refuse(path, "type")  # its parent is of another kind, and stays so
                continue
            if want == "symlink" and not can_link:
                refuse(path, "unsupported")
                continue
            steps.append(_creation(path, want, snapshot))
            continue
        if want == "directory":
            skipped.append(path)
        elif want == "symlink":
            if tree.links[path] == snapshot.links[path]:
                skipped.append(path)
            elif not force:
                refuse(path, "modified")
            elif not can_link:
                refuse(path, "unsupported")
            else:
                steps.append(removal(path))
                steps.append(_creation(path, want, snapshot, after_removal=True))
        elif same.get(path):
            skipped.append(path)
        elif not force:
            refuse(path, "modified")
        else:
            steps.append(_Step(path, "write", snapshot.files[path], guard=Version.of(tree.files[path])))
    return steps, conflicts, skipped


def _creation(path: str, kind: str, snapshot: Snapshot, *, after_removal: bool = False) -> _Step:
    if kind == "file":
        return _Step(path, "write", snapshot.files[path], after_removal=after_removal)
    if kind == "symlink":
        return _Step(path, "link", target=snapshot.links[path], after_removal=after_removal)
    return _Step(path, "mkdir", after_removal=after_removal)


async def _fetch(steps: list[_Step], content: SnapshotContent) -> dict[str, bytes]:
    """The content of every file to write, each checked against the snapshot before any
    write happens."""
    out: dict[str, bytes] = {}
    limiter = anyio.Semaphore(FETCH_CONCURRENCY)

    async def one(record: FileRecord) -> None:
        async with limiter:
            out[record.path] = await content.read(record)

    async with task_group() as tg:
        for step in steps:
            if step.record is not None:
                tg.start_soon(one, step.record)
    return out


async def _apply(
    fs: WorkspaceFilesystem,
    step: _Step,
    data: dict[str, bytes],
    restored: list[str],
    conflicts: list[RestoreConflict],
) -> None:
    """One step, conditional on what the plan saw; a refusal by storage is a conflict."""
    path = step.path
    try:
        if step.action == "mkdir":
            await fs.mkdir(path, recursive=True)
        elif step.action == "write":
            assert step.record is not None
            if step.guard is None:
                await fs.write_file(path, data[path], overwrite=False)
            else:
                stat = await fs.stat(path)
                if not step.guard.matches(stat):
                    raise StaleFileError(path, step.guard.modified_at, stat.modified_at)
                await fs.write_file(path, data[path], expected_mtime=stat)
        elif step.action == "link":
            assert step.target is not None
            if "/" in path:
                await fs.mkdir(path.rpartition("/")[0], recursive=True)
            await make_special(fs, path, PosixAttributes(mode=stat_module.S_IFLNK | 0o777, target=step.target))
        elif step.action == "delete":
            # Storage deletes take no condition: the version is checked just before (a race
            # between the two that a change landing in that moment can win).
            await check_version(fs, path, expected=step.guard)
            await fs.delete_file(path)
        elif step.action == "unlink":
            # The link itself, from its directory's listing (a stat would follow it).
            parent, _, name = path.rpartition("/")
            current = next((s for s in await list_stats(fs, parent) if s.name == name), None)
            if current is None:
                raise FileNotFound(path)
            if current.link_target != step.target:
                raise StaleFileError(path, None, current.modified_at)
            await fs.delete_file(path)
        elif step.action == "rmdir":
            await fs.rmdir(path)
    except NotADirectoryError:
        conflicts.append(RestoreConflict(path, "type"))  # below a path of another kind kept
        return
    except (StaleFileError, FileExists, FileNotFoundError) as exc:
        if step.action in ("delete", "unlink") and isinstance(exc, FileNotFoundError):
            restored.append(path)  # already gone: the snapshot's state
            return
        conflicts.append(RestoreConflict(path, "changed during restore"))
        return
    except OSError as exc:
        if step.action == "rmdir" and exc.errno == errno.ENOTEMPTY:
            conflicts.append(RestoreConflict(path, "not empty"))
            return
        raise
    restored.append(path)
