"""Snapshots of a workspace on any storage: take, list, compare, restore, and read one as a
filesystem.

``Workspace.snapshot()``, ``list_snapshots()``, ``diff()`` and ``restore()`` are the usual way
in. The pieces are public for programs that work on a filesystem directly:
:class:`SnapshotStore` (where manifests and blobs are kept), :func:`take_snapshot`,
:func:`diff_snapshots`, :func:`restore_snapshot` and :class:`SnapshotFilesystem` (a snapshot
as a read-only filesystem whose stats carry the original ETags).

A snapshot is a manifest: every file with its ETag, size, modification time and SHA-256,
every directory (empty ones too) and every symbolic link. Its id is the SHA-256 of the
manifest's bytes. Contents are kept without copying where the bucket keeps versions (S3
versioning, GCS object versioning: the manifest names each object's version) and as
content-addressed blobs elsewhere (only blobs not already stored are written).

Manifests, listing records and locks are signed with a :class:`SnapshotKey` of the host
(by default a per-user key file, :func:`default_key_file`): what anybody else writes into
the store, the agent included where the store is the workspace's own, is refused.
"""

from .._exports import fixup_module_metadata
from ..errors import BlobIntegrityError as BlobIntegrityError
from ..errors import SnapshotNotFoundError as SnapshotNotFoundError
from ._api import diff_snapshots as diff_snapshots
from ._api import restore_snapshot as restore_snapshot
from ._diff import Change as Change
from ._diff import SnapshotDiff as SnapshotDiff
from ._fs import SnapshotFilesystem as SnapshotFilesystem
from ._keys import KEY_FILE_ENV as KEY_FILE_ENV
from ._keys import SnapshotKey as SnapshotKey
from ._keys import default_key_file as default_key_file
from ._manifest import ACCEPT_UNSIGNED_ENV as ACCEPT_UNSIGNED_ENV
from ._manifest import RESERVED_DIR as RESERVED_DIR
from ._manifest import FileRecord as FileRecord
from ._manifest import Snapshot as Snapshot
from ._manifest import SnapshotInfo as SnapshotInfo
from ._restore import RestoreConflict as RestoreConflict
from ._restore import RestoreResult as RestoreResult
from ._store import DEFAULT_GRACE as DEFAULT_GRACE
from ._store import DEFAULT_PREFIX as DEFAULT_PREFIX
from ._store import MAX_STALE_AFTER as MAX_STALE_AFTER
from ._store import GarbageReport as GarbageReport
from ._store import SnapshotStore as SnapshotStore
from ._take import take_snapshot as take_snapshot

__all__ = [
    "ACCEPT_UNSIGNED_ENV",
    "DEFAULT_GRACE",
    "DEFAULT_PREFIX",
    "KEY_FILE_ENV",
    "MAX_STALE_AFTER",
    "RESERVED_DIR",
    "BlobIntegrityError",
    "Change",
    "FileRecord",
    "GarbageReport",
    "RestoreConflict",
    "RestoreResult",
    "Snapshot",
    "SnapshotDiff",
    "SnapshotFilesystem",
    "SnapshotInfo",
    "SnapshotKey",
    "SnapshotNotFoundError",
    "SnapshotStore",
    "default_key_file",
    "diff_snapshots",
    "restore_snapshot",
    "take_snapshot",
]

fixup_module_metadata(__name__, globals())
