"""Differences between two states of a workspace: two snapshots, or one and the live files."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import anyio

from ..vfs import FileStat, WorkspaceFilesystem, sha256_hex
from ._manifest import FileRecord, Snapshot
from ._store import StatMemo
from ._take import SnapshotContent
from ._tree import Tree, read_live, task_group, version_kind, vouches

__all__ = ["Change", "SnapshotDiff", "diff_states"]

#: Text files up to this size (on both sides) get a unified diff.
MAX_PATCH_BYTES = 1024 * 1024
#: Files hashed at once while live content is compared.
COMPARE_CONCURRENCY = 16

EntryKind = Literal["file", "directory", "symlink"]


@dataclass(frozen=True, slots=True)
class Change:
    """One path that differs between two states.

    Attributes
    ----------
    path : str
        Relative to the workspace root.
    change : str
        ``added`` (only in the later state), ``removed`` (only in the earlier one) or
        ``changed`` (in both, with other content, another link target or another kind).
    type : str
        ``file``, ``directory`` or ``symlink``: what is there in the later state (for
        ``removed``: in the earlier one).
    patch : str or None
        A unified diff (``a/<path>`` to ``b/<path>``) where both sides are UTF-8 text of at
        most 1 MiB; None for directories, links and binary or large files.
    """

    path: str
    change: Literal["added", "removed", "changed"]
    type: EntryKind
    patch: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What changed from the state ``before`` to the state ``after`` (snapshot ids; None is
    the live workspace), path by path in path order. Agentvfs's own ``.agentvfs``
    directory is never part of it.
    """

    before: str | None
    after: str | None
    changes: tuple[Change, ...]

    @property
    def added(self) -> tuple[str, ...]:
        """Paths only in ``after``."""
        return tuple(c.path for c in self.changes if c.change == "added")

    @property
    def removed(self) -> tuple[str, ...]:
        """Paths only in ``before``."""
        return tuple(c.path for c in self.changes if c.change == "removed")

    @property
    def changed(self) -> tuple[str, ...]:
        """Paths in both, different."""
        return tuple(c.path for c in self.changes if c.change == "changed")

    def __bool__(self) -> bool:
        return bool(self.changes)

    def patch(self) -> str:
        """Every change as text: the unified diffs of text files, one line for the rest."""
        out: list[str] = []
        for c in self.changes:
            if c.patch is not None:
                out.append(c.patch)
            else:
                suffix = "/" if c.type == "directory" else " (symbolic link)" if c.type == "symlink" else ""
                binary = " (binary or large: no line diff)" if c.type == "file" else ""
                out.append(f"{c.change} {c.path}{suffix}{binary}\n")
        return "".join(out)


class Side:
    """One state being compared: a snapshot, or the live workspace."""

    def __init__(
        self,
        *,
        snapshot: Snapshot | None = None,
        content: SnapshotContent | None = None,
        fs: WorkspaceFilesystem | None = None,
        tree: Tree | None = None,
        memo: StatMemo | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.content = content
        self.fs = fs
        self.tree = tree
        #: Hashes of live local files known from snapshots (files not read again).
        self.memo = memo
        self._digests: dict[str, str] = {}

    @property
    def id(self) -> str | None:
        return self.snapshot.id if self.snapshot is not None else None

    @property
    def observed(self) -> datetime | None:
        """When the snapshot of this side began listing (None: the live side)."""
        return self.snapshot.created_at if self.snapshot is not None else None

    def kinds(self) -> dict[str, EntryKind]:
        """Every path of this state and what is there."""
        out: dict[str, EntryKind] = {}
        if self.snapshot is not None:
            out.update(dict.fromkeys(self.snapshot.directories, "directory"))
            out.update(dict.fromkeys(self.snapshot.files, "file"))
            out.update(dict.fromkeys(self.snapshot.links, "symlink"))
        else:
            assert self.tree is not None
            out.update(dict.fromkeys(self.tree.directories, "directory"))
            out.update(dict.fromkeys(self.tree.files, "file"))
            out.update(dict.fromkeys(self.tree.links, "symlink"))
        return out

    def link(self, path: str) -> str:
        links = self.snapshot.links if self.snapshot is not None else self.tree.links  # type: ignore[union-attr]
        return links[path]

    def record(self, path: str) -> FileRecord | None:
        return self.snapshot.files.get(path) if self.snapshot is not None else None

    def stat(self, path: str) -> FileStat | None:
        return self.tree.files.get(path) if self.tree is not None else None

    def known(self, path: str, other: FileRecord | None = None, observed: datetime | None = None) -> str | None:
        """The SHA-256 of the file ``path`` where it is known without reading it: from the
        snapshot, from ``other`` (a record, of a snapshot that listed after ``observed``,
        that storage vouches is of this very version: see :func:`vouches`), or from the memo
        of local files hashed by snapshots."""
        record = self.record(path)
        if record is not None:
            return record.sha256
        if path in self._digests:
            return self._digests[path]
        assert self.fs is not None
        assert self.tree is not None
        stat = self.tree.files[path]
        if other is not None and observed is not None and vouches(other, observed, stat, version_kind(self.fs)):
            return other.sha256
        if self.memo is not None:
            return self.memo.get(self.memo.location(self.fs), stat)
        return None

    async def digest(self, path: str, other: FileRecord | None = None, observed: datetime | None = None) -> str:
        """The SHA-256 of the file ``path`` (read where it is not :meth:`known`)."""
        known = self.known(path, other, observed)
        if known is not None:
            return known
        assert self.fs is not None
        assert self.tree is not None
        self._digests[path] = sha256_hex(await read_live(self.fs, self.tree.files[path]))
        return self._digests[path]

    async def read(self, path: str) -> bytes:
        record = self.record(path)
        if record is not None:
            assert self.content is not None
            return await self.content.read(record)
        assert self.fs is not None
        assert self.tree is not None
        return await read_live(self.fs, self.tree.files[path])

    def size(self, path: str) -> int:
        record = self.record(path)
        if record is not None:
            return record.size
        stat = self.stat(path)
        return stat.size if stat is not None else 0


async def diff_states(before: Side, after: Side, *, patches: bool = True) -> SnapshotDiff:
    """The differences from ``before`` to ``after`` (see :class:`SnapshotDiff`)."""
    old, new = before.kinds(), after.kinds()
    changes: dict[str, Change] = {}
    limiter = anyio.Semaphore(COMPARE_CONCURRENCY)

    async def compare_files(path: str, a: str | None, b: str | None) -> None:
        """Compare the file ``path``, reading a side whose hash (``a``, ``b``) is not known."""
        async with limiter:
            if a is None:
                a = await before.digest(path, after.record(path), after.observed)
            if b is None:
                b = await after.digest(path, before.record(path), before.observed)
            if a != b:
                changes[path] = Change(path, "changed", "file", await _patch(before, after, path, path, path) if patches else None)

    async def one_sided(path: str, side: Side, change: Literal["added", "removed"]) -> None:
        async with limiter:
            patch = None
            if patches:
                patch = await _patch(before if change == "removed" else None, after if change == "added" else None, path, path, path)
            changes[path] = Change(path, change, "file", patch)

    async with task_group() as tg:
        for path in sorted(old.keys() | new.keys()):
            a_kind, b_kind = old.get(path), new.get(path)
            if a_kind is None and b_kind is not None:
                if b_kind == "file":
                    tg.start_soon(one_sided, path, after, "added")
                else:
                    changes[path] = Change(path, "added", b_kind)
            elif b_kind is None and a_kind is not None:
                if a_kind == "file":
                    tg.start_soon(one_sided, path, before, "removed")
                else:
                    changes[path] = Change(path, "removed", a_kind)
            elif a_kind != b_kind:
                assert b_kind is not None
                changes[path] = Change(path, "changed", b_kind)
            elif a_kind == "symlink" and before.link(path) != after.link(path):
                changes[path] = Change(path, "changed", "symlink")
            elif a_kind == "file":
                a = before.known(path, after.record(path), after.observed)
                b = after.known(path, before.record(path), before.observed)
                if a is not None and a == b:
                    continue  # the same content, known without a read (or a task)
                tg.start_soon(compare_files, path, a, b)
    return SnapshotDiff(before.id, after.id, tuple(changes[p] for p in sorted(changes)))


async def _patch(before: Side | None, after: Side | None, path: str, a_path: str, b_path: str) -> str | None:
    """A unified diff of the text file ``path`` between the two sides (None: absent), or
    None where either side is binary or larger than :data:`MAX_PATCH_BYTES`."""
    texts: list[str] = []
    for side in (before, after):
        if side is None:
            texts.append("")
            continue
        if side.size(path) > MAX_PATCH_BYTES:
            return None
        data = await side.read(path)
        if b"\0" in data:
            return None
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    a_name = f"a/{a_path}" if before is not None else "/dev/null"
    b_name = f"b/{b_path}" if after is not None else "/dev/null"
    lines = difflib.unified_diff(texts[0].splitlines(keepends=True), texts[1].splitlines(keepends=True), a_name, b_name)
    # An empty file added or removed has no lines: its headers alone say so.
    return "".join(_terminated(lines)) or f"--- {a_name}\n+++ {b_name}\n"


def _terminated(lines: Iterable[str]) -> Iterable[str]:
    """Diff lines each ending in a newline; a last line without one is marked as ``diff``
    marks it."""
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"
