"""Comparing and restoring by snapshot id or name, on a filesystem and a store."""

from __future__ import annotations

from collections.abc import Sequence

from ..vfs import WorkspaceFilesystem
from ._diff import Side, SnapshotDiff, diff_states
from ._manifest import Snapshot
from ._restore import RestoreResult, apply_restore
from ._store import DEFAULT_PREFIX, SnapshotStore, check_outside
from ._take import SnapshotContent
from ._tree import scan

__all__ = ["default_store", "diff_snapshots", "restore_snapshot"]


def default_store(fs: WorkspaceFilesystem) -> SnapshotStore:
    """The store a workspace keeps its own snapshots in: ``.agentvfs/snapshots`` of ``fs``."""
    return SnapshotStore(fs, prefix=DEFAULT_PREFIX)


async def _side(fs: WorkspaceFilesystem, store: SnapshotStore, ref: Snapshot | str | None) -> Side:
    if ref is None:
        return Side(fs=fs, tree=await scan(fs), memo=store.memo)
    snapshot = ref if isinstance(ref, Snapshot) else await store.resolve(ref)
    return Side(snapshot=snapshot, content=SnapshotContent(snapshot, store, fs))


async def diff_snapshots(
    fs: WorkspaceFilesystem,
    before: Snapshot | str | None,
    after: Snapshot | str | None = None,
    *,
    store: SnapshotStore | None = None,
    patches: bool = True,
) -> SnapshotDiff:
    """What changed from ``before`` to ``after`` (snapshots, their ids or names; None: the
    live files of ``fs``); see :meth:`agentvfs.Workspace.diff`.

    Raises
    ------
    SnapshotNotFoundError
        No snapshot goes by a name or id given.
    BlobIntegrityError
        A manifest or content was changed in storage.
    """
    store = store if store is not None else default_store(fs)
    return await diff_states(await _side(fs, store, before), await _side(fs, store, after), patches=patches)


async def restore_snapshot(
    fs: WorkspaceFilesystem,
    snapshot: Snapshot | str,
    *,
    store: SnapshotStore | None = None,
    paths: Sequence[str] | None = None,
    force: bool = False,
) -> RestoreResult:
    """Bring ``fs`` (or the ``paths`` below) back to ``snapshot``; see
    :meth:`agentvfs.Workspace.restore`.

    Raises
    ------
    SnapshotNotFoundError
        No snapshot goes by that name or id.
    BlobIntegrityError
        The manifest, or a content to write, was changed in storage (nothing was written).
    WorkspaceReadOnlyError
        ``fs`` is read-only.
    ValueError
        The store is inside the workspace (anywhere but in ``.agentvfs``).
    """
    store = store if store is not None else default_store(fs)
    check_outside(fs, store)
    resolved = snapshot if isinstance(snapshot, Snapshot) else await store.resolve(snapshot)
    return await apply_restore(fs, resolved, SnapshotContent(resolved, store, fs), paths=paths, force=force)
