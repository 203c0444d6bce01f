"""The staging area of a mount: local copies of files being written.

A file opened for writing gets a staged copy on local disk; writes land there, and the copy
is uploaded whole (or streamed) when the file is closed or synced. The area is bounded by
``staging_limit``; where the filesystem offers a place beside its files (local disk), staged
copies live there, held by descriptor, so that publishing is a link and a rename; elsewhere
they live in the mount's session directory (see ``_recovery``). Each copy that holds data not
yet in storage is named in the session's journal, so that a mount killed meanwhile leaves
nothing the next one cannot find.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyfuse3

from ..vfs import SupportsLocalStaging, WorkspaceFilesystem
from ._nodes import Node
from ._options import MountOptions
from ._recovery import Session

__all__ = ["StagingStore"]

_log = logging.getLogger("agentvfs.mounts")


@dataclass(frozen=True, slots=True)
class _Staging:
    """Where a mount stages: ``path`` to work in, ``shown`` in messages; a directory held by
    descriptor ``fd`` also has the ``parent`` it was made in and its ``name`` there. ``owned``:
    made for this mount, removed by it."""

    path: str
    shown: str
    fd: int = -1
    parent: str = ""
    name: str = ""
    owned: bool = True


def _default_staging(filesystem: WorkspaceFilesystem, session: Session | None) -> _Staging:
    """Stage beside the files where the filesystem offers a place (local disk: publishing is
    then a link and a rename), else in the mount's session directory (a private temporary
    directory for a mount that writes nothing).

    A directory beside the files may be within reach of whoever else writes there, so it is
    held by a descriptor and used through ``/proc/self/fd/N``: a rename or a symlink swapped
    in afterwards cannot redirect what the mount stages.
    """
    where = filesystem.local_staging_dir() if isinstance(filesystem, SupportsLocalStaging) else None
    if where is not None:
        try:
            made = tempfile.mkdtemp(prefix="s", dir=where)
            fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            _release_staging(filesystem)
        else:
            shown = os.readlink(f"/proc/self/fd/{fd}")
            return _Staging(f"/proc/self/fd/{fd}", shown, fd, where, os.path.basename(made))
    if session is not None:
        return _Staging(session.path, session.path, owned=False)  # the session removes it
    made = tempfile.mkdtemp(prefix="agentvfs-staging-")
    return _Staging(made, made)


def _release_staging(filesystem: WorkspaceFilesystem) -> None:
    if isinstance(filesystem, SupportsLocalStaging):
        filesystem.local_staging_release()


class StagingStore:
    """Staged copies of the files of one mount, and the bytes they take.

    Parameters
    ----------
    filesystem : WorkspaceFilesystem
        The mounted filesystem (asked for a place beside its files).
    options : MountOptions
        ``staging_dir`` (None: beside the files, else a private temporary directory) and
        ``staging_limit``.
    shown : callable
        How messages name a node.
    session : Session or None
        The journal of the mount (None: nothing is journaled, for a read-only mount).
    """

    def __init__(
        self,
        filesystem: WorkspaceFilesystem,
        options: MountOptions,
        shown: Callable[[Node], str],
        session: Session | None = None,
    ) -> None:
        self.fs = filesystem
        self.options = options
        self.shown = shown
        self.session = session
        if options.staging_dir is None:
            self._where = _default_staging(filesystem, session)
        else:
            self._where = _Staging(options.staging_dir, options.staging_dir, owned=False)
            os.makedirs(options.staging_dir, exist_ok=True)
        self._own = self._where.owned
        if session is not None:
            session.note_staging(self._where.shown)
        #: Where staged copies live (a ``/proc/self/fd`` path when held by descriptor).
        self.path = self._where.path
        #: The same place as a plain path, for messages.
        self.shown_path = self._where.shown
        self._names = itertools.count()
        #: Bytes the staged copies take together.
        self.used = 0

    # -- the journal ------------------------------------------------------------------------

    def _ident(self, node: Node) -> str | None:
        return os.path.basename(node.stage) if node.stage is not None and self.session is not None else None

    def mark_dirty(self, node: Node, path: str, base: str | None) -> None:
        """``node``'s staged copy now holds data storage does not have (journaled once until
        it is published or let go)."""
        ident = self._ident(node)
        if ident is None or self.session is None or ident in self.session.open_entries:
            return
        self.session.record("dirty", ident, file=os.path.join(self.shown_path, ident), path=path, base=base)

    def mark_clean(self, node: Node) -> None:
        """``node``'s staged copy is what storage holds now."""
        ident = self._ident(node)
        if ident is not None and self.session is not None and ident in self.session.open_entries:
            self.session.record("clean", ident)

    def mark_failed(self, node: Node, why: str) -> None:
        """The upload of ``node`` failed (the copy stays unpublished)."""
        ident = self._ident(node)
        if ident is not None and self.session is not None:
            self.session.record("failed", ident, why=why)

    def mark_upload(self, node: Node, ticket: dict[str, str] | None) -> None:
        """A streamed upload of ``node`` is open in storage (``ticket`` names it), or done
        (None: completed or aborted)."""
        ident = self._ident(node)
        if ident is None or self.session is None:
            return
        if ticket is None:
            self.session.record("upload-done", ident)
        else:
            self.session.record("upload", ident, ticket=ticket)

    def reserve(self, node: Node, new_size: int) -> None:
        """Count ``node``'s staged copy as ``new_size`` bytes: ``EFBIG`` for a file larger
        than the whole area, ``ENOSPC`` when the area is full."""
        grow = new_size - node.staged_bytes
        if grow <= 0:
            return
        if new_size > self.options.staging_limit:
            # One file larger than the whole staging area can never be written.
            raise pyfuse3.FUSEError(errno.EFBIG)
        if self.used + grow > self.options.staging_limit:
            _log.warning(
                "staging area full (%d of %d bytes): write to %s refused with ENOSPC",
                self.used, self.options.staging_limit, self.shown(node),
            )
            raise pyfuse3.FUSEError(errno.ENOSPC)
        self.used += grow
        node.staged_bytes = new_size

    def new_file(self) -> tuple[int, str]:
        """A new, empty, private file in the staging directory.

        Names come from a counter: ``tempfile.mkstemp`` draws random names and was most of
        the time a ``create`` took.
        """
        while True:
            path = os.path.join(self.path, f"stage-{os.getpid()}-{next(self._names)}")
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                return os.open(path, flags, 0o600), path
            except FileExistsError:
                continue  # left by an earlier mount that shared this staging directory

    def published(self, node: Node) -> None:
        """``node``'s clean staged copy was published: where publishing linked it into
        storage, its name here goes (the file on disk shows one link, not two, to whoever
        looks, a second mount among them); the descriptor still reads it."""
        if node.stage is None or node.stage_published or os.fstat(node.stage_fd).st_nlink <= 1:
            return
        self._forget(node)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(node.stage)
        node.stage_published = True

    def own(self, node: Node) -> None:
        """Before changing a staged copy: if publishing linked it into storage (local disk),
        copy it first, so storage only ever changes by the next atomic publish."""
        if node.stage is None or (not node.stage_published and os.fstat(node.stage_fd).st_nlink <= 1):
            return
        fd, path = self.new_file()
        os.fchmod(fd, node.perm & 0o777)
        try:
            # From the descriptor: the copy's name may be gone, and a staging area beside the
            # files may be within someone else's reach.
            size, offset = os.fstat(node.stage_fd).st_size, 0
            while offset < size:
                # By offset: the staged copy's own position does not move.
                sent = os.sendfile(fd, node.stage_fd, offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        moved = self._open_record(node)
        self._forget(node)
        os.close(node.stage_fd)
        if not node.stage_published:
            os.unlink(node.stage)
        node.stage, node.stage_fd, node.stage_published = path, fd, False
        if moved is not None:
            self.mark_dirty(node, str(moved.get("path", "")), moved.get("base"))

    def _open_record(self, node: Node) -> dict[str, Any] | None:
        ident = self._ident(node)
        return None if ident is None or self.session is None else self.session.open_entries.get(ident)

    def _forget(self, node: Node) -> None:
        ident = self._ident(node)
        if ident is not None and self.session is not None and ident in self.session.open_entries:
            self.session.record("gone", ident)

    def release_bytes(self, node: Node) -> None:
        """``node`` holds no staged bytes any more."""
        self.used -= node.staged_bytes
        node.staged_bytes = 0

    def drop(self, node: Node) -> None:
        """Remove ``node``'s staged copy (its data is in storage, or no longer wanted)."""
        if node.stage is None:
            return
        self._forget(node)
        os.close(node.stage_fd)
        if not node.stage_published:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(node.stage)
        node.stage, node.stage_fd, node.stage_published = None, -1, False
        self.release_bytes(node)

    def close(self) -> None:
        """Remove the staging area if it is this mount's own and empty. Dirty copies remain
        when an upload failed: data that did not reach storage is never deleted (rmdir fails
        on a non-empty directory)."""
        if not self._own:
            return
        staging, self._where = self._where, _Staging(self._where.shown, self._where.shown)
        self._own = False  # once: the descriptor is gone after this
        with contextlib.suppress(OSError):
            if staging.fd >= 0:
                # By name in the directory it was made in (itself held by descriptor).
                os.close(staging.fd)
                try:
                    os.rmdir(os.path.join(staging.parent, staging.name))
                finally:
                    _release_staging(self.fs)
            else:
                os.rmdir(staging.path)
