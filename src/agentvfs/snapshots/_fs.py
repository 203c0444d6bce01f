"""A snapshot as a read-only workspace filesystem."""

from __future__ import annotations

import posixpath
import stat as stat_module
from datetime import datetime
from typing import Any

from ..errors import (
    DirectoryNotFound,
    FileDecodeError,
    FileNotFound,
    FilesystemNotReadyError,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
)
from ..vfs import FileEntry, FileStat, WorkspaceFilesystem, get_mime_type, new_id, normalize_path
from ._manifest import Snapshot
from ._store import DEFAULT_PREFIX, SnapshotStore
from ._take import SnapshotContent

__all__ = ["SnapshotFilesystem"]

_DEFAULT_MAX_DEPTH = 100
#: Symbolic links followed in one lookup before giving up (a loop).
_MAX_LINKS = 40


class SnapshotFilesystem(WorkspaceFilesystem):
    """The state a snapshot recorded, as a read-only :class:`~agentvfs.vfs.WorkspaceFilesystem`.

    Every file reads as the content the snapshot recorded (its blob, or the object version
    it pinned), checked against the snapshot's hash before it is returned. :meth:`stat`
    gives each file's ETag, size and modification time as they were when the snapshot was
    taken, so a guarded write into the live filesystem (``expected_mtime=`` a stat from
    here) succeeds only where the live file is still the version the snapshot saw: the base
    layer of a copy-on-write overlay. Every write is refused with
    :class:`~agentvfs.errors.WorkspaceReadOnlyError`.

    Parameters
    ----------
    fs : WorkspaceFilesystem
        The workspace filesystem the snapshot was taken of (it reads pinned object versions
        through it; and, without ``store``, holds the snapshots in ``.agentvfs/snapshots``).
    snapshot : Snapshot or str
        The snapshot, or its id, id prefix or name (resolved in ``store`` on first use).
    store : SnapshotStore, optional
        Where the snapshot is kept; default the workspace's own store in ``fs``.
    id, display_name, description, icon, instructions
        See :class:`~agentvfs.vfs.WorkspaceFilesystem`.
    """

    name = "SnapshotFilesystem"
    provider = "snapshot"

    def __init__(
        self,
        fs: WorkspaceFilesystem,
        snapshot: Snapshot | str,
        *,
        store: SnapshotStore | None = None,
        id: str | None = None,
        display_name: str | None = None,
        description: str | None = None,
        icon: str | None = None,
        instructions: str | None = None,
    ) -> None:
        if not isinstance(fs, WorkspaceFilesystem):
            raise TypeError(f"fs must be a WorkspaceFilesystem, not {type(fs).__name__}")
        if not isinstance(snapshot, (Snapshot, str)):
            raise TypeError(f"snapshot must be a Snapshot or its id or name, not {type(snapshot).__name__}")
        super().__init__(
            id=id or new_id("snapshot-fs"),
            read_only=True,
            display_name=display_name,
            description=description,
            icon=icon,
            instructions=instructions,
            text_extensions=fs.text_extensions,
        )
        self.base = fs
        self.store = store if store is not None else SnapshotStore(fs, prefix=DEFAULT_PREFIX)
        self._ref = snapshot
        self._snapshot: Snapshot | None = snapshot if isinstance(snapshot, Snapshot) else None
        self._content: SnapshotContent | None = None
        self._children: dict[str, dict[str, str]] = {}
        if self._snapshot is not None:
            self._index(self._snapshot)

    @property
    def snapshot(self) -> Snapshot:
        """The snapshot shown (resolved by :meth:`init` when given by id or name).

        Raises
        ------
        FilesystemNotReadyError
            It was given by id or name and has not been resolved yet.
        """
        if self._snapshot is None:
            raise FilesystemNotReadyError(self.id)
        return self._snapshot

    async def setup(self) -> None:
        """Resolve the snapshot (given by id or name) and check its manifest."""
        if self._snapshot is None:
            assert isinstance(self._ref, str)
            self._snapshot = await self.store.resolve(self._ref)
            self._index(self._snapshot)

    def _index(self, snapshot: Snapshot) -> None:
        self._content = SnapshotContent(snapshot, self.store, self.base)
        children: dict[str, dict[str, str]] = {"": {}}
        kinds = [(d, "directory") for d in snapshot.directories]
        kinds += [(f, "file") for f in snapshot.files]
        kinds += [(link, "symlink") for link in snapshot.links]
        for path, kind in kinds:
            if kind == "directory":
                children.setdefault(path, {})
            parent = posixpath.dirname(path)
            # A manifest of an object store may name a file below a directory it does not
            # list (a prefix without a marker): every ancestor is a directory.
            while True:
                children.setdefault(parent, {})
                if parent == "" or parent in snapshot.directories:
                    break
                grand = posixpath.dirname(parent)
                children.setdefault(grand, {})[posixpath.basename(parent)] = "directory"
                parent = grand
            children[posixpath.dirname(path)][posixpath.basename(path)] = kind
        self._children = children

    async def _ready(self) -> Snapshot:
        if self.status != "ready":
            await self.ensure_ready()
        return self.snapshot

    def _resolve(self, path: str, *, follow_last: bool = True) -> str:
        """The snapshot path ``path`` names, its symbolic links followed inside the
        snapshot (one leading outside is ``FileNotFound``)."""
        rel = normalize_path(path)
        snapshot = self.snapshot
        for _ in range(_MAX_LINKS):
            parts = rel.split("/") if rel else []
            for i in range(len(parts)):
                prefix = "/".join(parts[: i + 1])
                last = i == len(parts) - 1
                if prefix in snapshot.links and (follow_last or not last):
                    target = snapshot.links[prefix]
                    if target.startswith("/"):
                        raise FileNotFound(path)
                    joined = posixpath.join(posixpath.dirname(prefix), target, *parts[i + 1 :])
                    try:
                        rel = normalize_path(joined)
                    except PermissionDenied:
                        raise FileNotFound(path) from None
                    break
            else:
                return rel
        raise FileNotFound(path)

    # -- reads ---------------------------------------------------------------------------------

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """The content the snapshot recorded, checked against its hash.

        Raises
        ------
        FileNotFound
            ``ENOENT``: not in the snapshot, or its content is gone from storage.
        IsDirectory
            ``EISDIR``.
        BlobIntegrityError
            Storage holds other bytes than the snapshot recorded.
        """
        snapshot = await self._ready()
        rel = self._resolve(path)
        record = snapshot.files.get(rel)
        if record is None:
            raise IsDirectory(path) if rel in self._children else FileNotFound(path)
        assert self._content is not None
        data = await self._content.read(record)
        if encoding is None:
            return data
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise FileDecodeError(path, encoding, f"byte 0x{data[exc.start]:02x} at offset {exc.start}") from None

    async def stat(self, path: str) -> FileStat:
        """The file or directory as the snapshot saw it: a file's original ETag, size and
        modification time; a symbolic link as itself (``file_kind`` ``S_IFLNK``).

        Raises
        ------
        FileNotFound
            ``ENOENT``.
        """
        snapshot = await self._ready()
        rel = self._resolve(path, follow_last=False)
        name = posixpath.basename(rel)
        if rel in snapshot.links:
            target = snapshot.links[rel]
            return FileStat(
                name, rel, "file", len(target.encode()), snapshot.created_at, snapshot.created_at,
                file_kind=stat_module.S_IFLNK, link_target=target,
            )  # fmt: skip
        record = snapshot.files.get(rel)
        if record is not None:
            return FileStat(
                name, rel, "file", record.size, record.modified_at, record.modified_at,
                get_mime_type(name), record.etag,
            )  # fmt: skip
        if rel in self._children:
            return FileStat(name, rel, "directory", 0, snapshot.created_at, snapshot.created_at)
        raise FileNotFound(path)

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        """List a directory of the snapshot; see :meth:`WorkspaceFilesystem.readdir`.

        Raises
        ------
        DirectoryNotFound
            ``ENOENT``.
        NotDirectory
            ``ENOTDIR``.
        """
        snapshot = await self._ready()
        rel = self._resolve(path)
        if rel not in self._children:
            if rel in snapshot.files:
                raise NotDirectory(path)
            raise DirectoryNotFound(path)
        limit = (max_depth or _DEFAULT_MAX_DEPTH) if recursive else 1
        found: dict[str, FileEntry] = {}

        def visit(directory: str, shown: str, depth: int) -> None:
            for name, kind in sorted(self._children.get(directory, {}).items()):
                child = f"{directory}/{name}" if directory else name
                label = f"{shown}/{name}" if shown else name
                if kind == "file":
                    found[label] = FileEntry(label, "file", snapshot.files[child].size)
                elif kind == "symlink":
                    target = snapshot.links[child]
                    pointed = self._kind_of_target(child)
                    found[label] = FileEntry(label, pointed, None, True, target)
                else:
                    found[label] = FileEntry(label, "directory")
                    if depth < limit:
                        visit(child, label, depth + 1)

        visit(rel, "", 1)
        entries = list(found.values())
        if extension is None:
            return entries
        wanted = [e.lower() if e.startswith(".") else f".{e.lower()}" for e in ([extension] if isinstance(extension, str) else extension)]
        return [e for e in entries if e.type == "directory" or e.name.lower().endswith(tuple(wanted))]

    def _kind_of_target(self, link: str) -> Any:
        try:
            target = self._resolve(link)
        except FileNotFoundError:
            return "file"
        return "directory" if target in self._children else "file"

    # -- writes: refused -----------------------------------------------------------------------

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
        """Refused: a snapshot never changes.

        Raises
        ------
        WorkspaceReadOnlyError
            Always.
        """
        self._check_writable("write_file")

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        """Refused: a snapshot never changes.

        Raises
        ------
        WorkspaceReadOnlyError
            Always.
        """
        self._check_writable("delete_file")

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Refused: a snapshot never changes.

        Raises
        ------
        WorkspaceReadOnlyError
            Always.
        """
        self._check_writable("mkdir")

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Refused: a snapshot never changes.

        Raises
        ------
        WorkspaceReadOnlyError
            Always.
        """
        self._check_writable("rmdir")

    # -- description ---------------------------------------------------------------------------

    @property
    def location(self) -> str | None:
        where = self.base.location
        ref = self._snapshot.id if self._snapshot is not None else str(self._ref)
        return f"{where}@snapshot:{ref}" if where else f"snapshot:{ref}"

    def default_instructions(self) -> str:
        label = self._snapshot.name or self._snapshot.id[:12] if self._snapshot is not None else str(self._ref)
        return f"A read-only snapshot ({label}) of a workspace: files as they were when it was taken."

    def metadata(self) -> dict[str, Any]:
        snapshot = self._snapshot
        if snapshot is None:
            return {"snapshot": str(self._ref)}
        return {
            "snapshot": snapshot.id,
            "name": snapshot.name,
            "created_at": snapshot.created_at.isoformat(),
            "content": snapshot.content,
        }
