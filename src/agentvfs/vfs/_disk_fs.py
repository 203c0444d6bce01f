"""The local-disk kind: :class:`DiskBackend` does every operation through descriptors of
:class:`~agentvfs.vfs._disk.Disk`, so that a symlink swapped during a call cannot take it
outside its roots; :class:`DiskFilesystem` is the agent-facing layer over it.

``FsspecFilesystem("file:///path")`` (or around a ``LocalFileSystem`` instance) is built as a
:class:`DiskFilesystem`, and ``LocalFilesystem`` extends it. Beyond the storage contract the
disk offers what only a local file can: descriptors for a FUSE mount's passthrough, a
staging directory beside the files, reads beneath a directory that cannot leave it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno as _errno
import fcntl
import functools
import os
import posixpath
import stat as stat_module
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from fsspec.implementations.local import LocalFileSystem

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    FileTooLarge,
    IsDirectory,
    NotDirectory,
    NotRegularFile,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import Version
from ._base import run_sync
from ._disk import (
    TMP_MARK,
    ContainmentError,
    Disk,
    DiskEntry,
    NotRegularFileError,
    TooLargeError,
    copy_fd,
    copy_into,
    link_or_copy_from,
    set_attributes_at,
    set_attributes_of,
    write_into,
)
from ._fsspec import FsspecFilesystem
from ._fsspec_backends import NEVER, FsspecBackend, display_parent
from ._posix import PosixAttributes
from ._records import Capabilities, FileEntry, FileStat, FileType

__all__ = ["DiskBackend", "DiskFilesystem", "leads_out_of_directory", "translated_reads"]

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_PATH = getattr(os, "O_PATH", 0)


def _info_dict(host: str, own: os.stat_result, seen: os.stat_result | None, link: str | None) -> dict[str, Any]:
    """The info record fsspec's LocalFileSystem gives, from a (possibly followed) status."""
    out = seen if seen is not None else own
    mode = out.st_mode
    kind = "directory" if stat_module.S_ISDIR(mode) else "file" if stat_module.S_ISREG(mode) else "other"
    info: dict[str, Any] = {
        "name": host,
        "size": out.st_size,
        "type": kind,
        "created": getattr(out, "st_birthtime", out.st_ctime),
        "islink": link is not None,
        "mode": out.st_mode,
        "uid": out.st_uid,
        "gid": out.st_gid,
        "mtime": out.st_mtime,
        "atime_ns": out.st_atime_ns,
        "mtime_ns": out.st_mtime_ns,
        "ctime_ns": out.st_ctime_ns,
        "ino": out.st_ino,
        "nlink": out.st_nlink,
        # The entry itself (a link, not its target): what a mount shows of it.
        "own": own,
    }
    if link is not None:
        info["destination"] = link
    return info


def leads_out_of_directory(path: str) -> PermissionDenied:
    """The refusal of a read beneath a directory whose ``path`` leads out of it."""
    return PermissionDenied(path, "access (it leads outside its directory)")


@contextlib.contextmanager
def translated_reads(shown: str, escape: Callable[[], BaseException]) -> Iterator[None]:
    """Map the builtin errors of a read through :class:`~agentvfs.vfs._disk.Disk` to workspace
    errors naming ``shown``; a path that leads out raises ``escape()``."""
    try:
        yield
    except ContainmentError:
        raise escape() from None
    except NotRegularFileError as exc:
        raise NotRegularFile(shown, exc.kind) from None
    except TooLargeError as exc:
        raise FileTooLarge(shown, exc.limit) from None
    except IsADirectoryError:
        raise IsDirectory(shown) from None
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFound(shown) from None


def _settle(attrs: PosixAttributes, dirfd: int, name: str) -> None:
    """Give the file about to be published as ``name`` (in ``dirfd``) the permission bits,
    owner and times of ``attrs``. An owner this process may not give a file to is left to
    it, and then so are set-ID bits: the file would run as this process's user."""
    try:
        DiskBackend._set_entry_attributes(dirfd, name, attrs)
    except PermissionError:
        if attrs.owner in (None, (os.geteuid(), os.getegid())):
            raise
        kept = dataclasses.replace(
            attrs, uid=None, gid=None, mode=attrs.mode & ~(stat_module.S_ISUID | stat_module.S_ISGID)
        )
        DiskBackend._set_entry_attributes(dirfd, name, kept)


class DiskBackend(FsspecBackend):
    """A directory tree on local disk, every operation through descriptors of a :class:`Disk`.

    Paths below ``root`` are resolved beneath a descriptor of one of the disk's roots, once
    per operation, and acted on where they were found: a symlink swapped during a call cannot
    lead out. Symlinks that stay inside are followed; FIFOs, devices and sockets are listed
    but never opened (:class:`~agentvfs.errors.NotRegularFile`).

    Parameters
    ----------
    root : str
        The directory this backend's paths are relative to.
    disk : Disk, optional
        The roots nothing may leave (by default ``root`` alone).
    escape : callable, optional
        ``escape(rel, display)``: how a refusal of a path that leads out names it (by default
        as the caller wrote it).
    fs : LocalFileSystem, optional
        The fsspec instance shown as :attr:`fs` (nothing is read or written through it).
    """

    capabilities = Capabilities(empty_dirs=True, atomic_rename=True, symlinks=True, versions=False, blocking=True)

    def __init__(
        self,
        root: str,
        *,
        disk: Disk | None = None,
        escape: Callable[[str, str], str] | None = None,
        fs: LocalFileSystem | None = None,
    ) -> None:
        super().__init__(fs if fs is not None else LocalFileSystem(), root)
        self.provider = "file"
        #: The descriptors every path is resolved beneath (replaceable: new allowed roots).
        self.disk = disk if disk is not None else Disk([self.root_path or "/"])
        self.escape: Callable[[str, str], str] = escape or (lambda rel, display: display)
        #: A directory (a host path) that writes into it do not make (a workspace's base path).
        self.base_dir: str | None = None

    # -- errors ---------------------------------------------------------------------------------

    def translate(self, exc: BaseException, display: str, operation: str) -> FilesystemError:
        if isinstance(exc, ContainmentError):
            return PermissionDenied(display, "access")
        if isinstance(exc, NotRegularFileError):
            return NotRegularFile(display, exc.kind)
        return super().translate(exc, display, operation)

    def refuse(self, exc: BaseException, rel: str, display: str, operation: str) -> FilesystemError:
        """Translate ``exc``, naming escapes as ``escape`` says."""
        if isinstance(exc, ContainmentError):
            return PermissionDenied(self.escape(rel, display), "access")
        return self.translate(exc, display, operation)

    # -- reads ----------------------------------------------------------------------------------

    def info(self, rel: str) -> dict[str, Any] | None:
        host = self.bpath(rel)
        try:
            own = self.disk.lstat(host)
            link = None
            seen = own
            if stat_module.S_ISLNK(own.st_mode):
                link = self.disk.readlink(host)
                seen = self.disk.stat(host)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ContainmentError:
            raise PermissionDenied(self.escape(rel, rel), "access") from None
        return _info_dict(host, own, seen, link)

    def _native_attributes(self, info: dict[str, Any]) -> dict[str, Any]:
        own: os.stat_result | None = info.get("own")
        kind = stat_module.S_IFMT(own.st_mode) if own is not None else stat_module.S_IFREG
        if own is not None and kind not in (stat_module.S_IFREG, stat_module.S_IFDIR):
            return {}  # set by stat_of from the entry's own status
        return {
            "mode": stat_module.S_IMODE(info["mode"]),
            "uid": info.get("uid"),
            "gid": info.get("gid"),
            "atime_ns": info.get("atime_ns"),
            "mtime_ns": info.get("mtime_ns"),
            "ctime_ns": info.get("ctime_ns"),
            "inode": info.get("ino") if kind == stat_module.S_IFREG else None,
            "nlink": info.get("nlink") if kind == stat_module.S_IFREG else None,
        }

    def stat_of(self, rel: str, info: dict[str, Any]) -> FileStat:
        stat = super().stat_of(rel, info)
        own: os.stat_result | None = info.get("own")
        kind = stat_module.S_IFMT(own.st_mode) if own is not None else stat_module.S_IFREG
        if own is None or kind in (stat_module.S_IFREG, stat_module.S_IFDIR):
            return stat  # its attributes were set as it was made (_native_attributes)
        # A symbolic link, FIFO, socket or device node: its own attributes (the followed
        # ones above are what a tool reading through a link sees). A link keeps the size of
        # what it points to, as stat(2) through it gives and as tools report; a mount shows
        # the length of its target path instead.
        return dataclasses.replace(
            stat,
            size=stat.size if kind == stat_module.S_IFLNK else own.st_size,
            mode=stat_module.S_IMODE(own.st_mode),
            uid=own.st_uid,
            gid=own.st_gid,
            atime_ns=own.st_atime_ns,
            mtime_ns=own.st_mtime_ns,
            ctime_ns=own.st_ctime_ns,
            file_kind=kind,
            link_target=info.get("destination") if kind == stat_module.S_IFLNK else None,
            rdev=own.st_rdev or None,
        )

    def make_special_sync(self, rel: str, display: str, attrs: PosixAttributes) -> None:
        """Create the symbolic link, FIFO, socket or device node ``rel`` on disk (only where
        nothing is), then give it ``attrs``' owner and times where they are set."""
        if not rel:
            raise FileExists(display)
        kind = attrs.kind
        try:
            with self.disk.place(self.bpath(rel)) as (dirfd, name):
                if kind == stat_module.S_IFLNK:
                    os.symlink(attrs.target or "", name, dir_fd=dirfd)
                elif kind == stat_module.S_IFIFO:
                    os.mkfifo(name, attrs.perm, dir_fd=dirfd)
                else:
                    os.mknod(name, kind | attrs.perm, attrs.rdev, dir_fd=dirfd)
                try:
                    self._set_entry_attributes(dirfd, name, attrs)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=dirfd)
                    raise
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.refuse(exc, rel, display, "mknod") from exc
        self._written(rel, "file")

    @staticmethod
    def _set_entry_attributes(dirfd: int, name: str, attrs: PosixAttributes) -> None:
        """Owner, mode and times of the entry ``name`` itself (a link is not followed; a
        link's own mode cannot be set on Linux and is always 0777)."""
        own = attrs.owner
        if own is not None and own != (os.geteuid(), os.getegid()):
            os.chown(name, *own, dir_fd=dirfd, follow_symlinks=False)
        if attrs.kind != stat_module.S_IFLNK:
            # After the owner (a chown clears set-ID bits); mkfifo and mknod took the umask.
            # Through an O_PATH descriptor of the entry: a symlink swapped in is not followed.
            fd = os.open(name, _O_PATH | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dirfd)
            try:
                if stat_module.S_ISLNK(os.fstat(fd).st_mode):
                    raise OSError(_errno.ELOOP, "replaced by a symbolic link", name)
                os.chmod(f"/proc/self/fd/{fd}", attrs.perm)
            finally:
                os.close(fd)
        if attrs.times_ns is not None:
            os.utime(name, ns=attrs.times_ns, dir_fd=dirfd, follow_symlinks=False)

    def make_hard_link_sync(self, src_rel: str, dest_rel: str, display: str) -> None:
        """A second name ``dest_rel`` of the file ``src_rel`` (the same inode on disk)."""
        if not src_rel or not dest_rel:
            raise PermissionDenied(display, "link")
        try:
            with self.disk.place(self.bpath(src_rel)) as (src_dir, src_name), self.disk.place(
                self.bpath(dest_rel)
            ) as (dest_dir, dest_name):
                os.link(src_name, dest_name, src_dir_fd=src_dir, dst_dir_fd=dest_dir, follow_symlinks=False)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.refuse(exc, dest_rel, display, "link") from exc
        self._written(dest_rel, "file")

    def rewrite_sync(
        self,
        rel: str,
        display: str,
        local_path: str,
        guard: Version | None,
        times_ns: tuple[int, int] | None = None,
    ) -> str | None:
        """Write ``local_path``'s content over the regular file ``rel`` in place (its inode
        stays, with all its names), only while it is the version ``guard``: checked and
        written holding the ``flock`` a guarded publish holds (see :meth:`_version_lock`),
        through the descriptor that holds it. Returns the version after."""
        if not rel:
            raise IsDirectory(display)
        try:
            fd = self.disk.open_regular(self.bpath(rel), os.O_WRONLY | _O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if guard is not None:
                raise StaleFileError(display, guard.modified_at, None) from None
            raise FileNotFound(display) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "write_file") from exc
        try:
            with self._guard_lock(rel, guard is not None):
                fcntl.flock(fd, fcntl.LOCK_EX)
                if guard is not None:
                    try:
                        current: os.stat_result | None = self.disk.lstat(self.bpath(rel))
                    except FileNotFoundError:
                        current = None
                    held = os.fstat(fd)
                    if current is None or (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
                        # Replaced between the open and the lock: this is not that file.
                        raise StaleFileError(display, guard.modified_at, None)
                    self._check_guard(rel, display, guard)
                source = os.open(local_path, os.O_RDONLY | _O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.ftruncate(fd, 0)
                    copy_fd(source, fd)
                finally:
                    os.close(source)
                if times_ns is not None:
                    os.utime(fd, ns=times_ns)
                os.fsync(fd)
                info = self.info(rel)
        except FilesystemError:
            raise
        except OSError as exc:
            raise self.translate(exc, display, "write_file") from exc
        finally:
            os.close(fd)
        self._written(rel, "file")
        return self.stat_of(rel, info).etag if info is not None else None

    def set_attributes_sync(
        self,
        rel: str,
        display: str,
        *,
        mode: int | None = None,
        owner: tuple[int, int] | None = None,
        times_ns: tuple[int, int] | None = None,
        guard: Version | None = None,
    ) -> str | None:
        """Set the permission bits, owner (``(uid, gid)``, -1 keeps one) and access and
        modification times of the entry ``rel`` on disk (a symlink is not followed), only
        while the regular file there is the version ``guard`` when one is given. Returns
        the version of a regular file after the change (its modification time is part of
        it), None for any other entry.

        Raises
        ------
        StaleFileError
            ``guard`` is not what is there.
        """
        if not rel and mode is None and owner is None and times_ns is None:
            return None
        with self._guard_lock(rel, guard is not None), self._version_lock(rel, display, guard):
            if guard is not None:
                self._check_guard(rel, display, guard)
            try:
                if rel:
                    with self.disk.place(self.bpath(rel)) as (dirfd, name):
                        set_attributes_at(dirfd, name, mode=mode, owner=owner, times_ns=times_ns)
                else:
                    # The root has no place in a parent of its own; it is no symlink.
                    fd = self.disk.open(self.bpath(rel), _O_PATH | os.O_CLOEXEC)
                    try:
                        set_attributes_of(fd, mode=mode, owner=owner, times_ns=times_ns)
                    finally:
                        os.close(fd)
            except FileNotFoundError:
                raise FileNotFound(display) from None
            except FilesystemError:
                raise
            except Exception as exc:
                raise self.refuse(exc, rel, display, "setattr") from exc
            info = self.info(rel)
        if info is None or info.get("type") != "file" or info.get("islink"):
            return None
        return self.stat_of(rel, info).etag

    @contextlib.contextmanager
    def _reading(
        self, rel: str, display: str, operation: str, escape: Callable[[], BaseException] | None = None
    ) -> Iterator[None]:
        """Map the errors of a read of ``rel`` on disk to workspace errors naming ``display``
        (a path that leads out: ``escape()``, by default ``PermissionDenied``)."""
        refusal = escape or (lambda: PermissionDenied(self.escape(rel, display), "access"))
        try:
            with translated_reads(display, refusal):
                yield
        except FilesystemError:
            raise
        except OSError as exc:
            raise self.translate(exc, display, operation) from exc

    def read_sync(self, rel: str, display: str, start: int | None = None, end: int | None = None) -> bytes:
        if not rel:
            raise IsDirectory(display)
        with self._reading(rel, display, "read_file"):
            return self.disk.read(self.bpath(rel), start, end)
        raise AssertionError("unreachable")  # pragma: no cover - the context re-raises

    def read_into_sync(self, rel: str, display: str, start: int, buffer: memoryview) -> int:
        if not rel:
            raise IsDirectory(display)
        with self._reading(rel, display, "read_file"):
            return self.disk.read_into(self.bpath(rel), start, buffer)
        raise AssertionError("unreachable")  # pragma: no cover - the context re-raises

    def read_range_sync(self, rel: str, display: str, start: int, end: int) -> bytes:
        return self.read_sync(rel, display, start, end)

    def cat_many(self, rels: list[str], max_bytes: int | None = None) -> dict[str, bytes | OSError]:
        # A listing shows links and special files; only contained regular files are read, and
        # no more than max_bytes (+1) of each, whatever size the listing showed.
        out: dict[str, bytes | OSError] = {}
        for rel in rels:
            try:
                out[rel] = self.disk.read(self.bpath(rel), max_bytes=max_bytes)
            except TooLargeError as exc:
                out[rel] = FileTooLarge(rel, exc.limit)
            except (OSError, ValueError):
                continue
        return out

    def download_sync(self, rel: str, display: str, local_path: str) -> None:
        with self._reading(rel, display, "download_file"):
            self.disk.copy_out(self.bpath(rel), local_path)

    # -- listings -------------------------------------------------------------------------------

    def list_raw(self, rel: str, display: str) -> list[dict[str, Any]]:
        host = self.bpath(rel)
        try:
            entries = self.disk.listdir(host)
        except FileNotFoundError:
            raise self.missing_dir(rel, display) from None
        except NotADirectoryError:
            raise self.missing_dir(rel, display) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "readdir") from exc
        return [
            _info_dict(posixpath.join(host, e.name), e.lstat, e.stat, e.link) for e in entries
        ]

    def listed(self, rel: str, display: str) -> dict[str, dict[str, Any]]:
        # A directory lists its own entries even when empty; no second look needed.
        return self.children(rel, self.list_raw(rel, display), display)

    def entry(self, name: str, info: dict[str, Any]) -> FileEntry:
        link = bool(info.get("islink"))
        # A link's type is its target's, where that lies inside (else, or broken: a file).
        kind: FileType = "directory" if info.get("type") == "directory" else "file"
        return FileEntry(
            name=name,
            type=kind,
            size=int(info.get("size") or 0) if kind == "file" and not link else None,
            is_symlink=link,
            symlink_target=info.get("destination"),
        )

    def walk_sync(self, rel: str, display: str, max_depth: int, cancel: threading.Event = NEVER) -> list[FileEntry]:
        return [self._walk_entry(entry) for entry in self._walked(rel, display, max_depth, cancel)]

    def _walked(self, rel: str, display: str, max_depth: int, cancel: threading.Event) -> list[DiskEntry]:
        """The disk's walk below ``rel`` (staging files left out), its errors translated."""
        try:
            return self.disk.walk(
                self.bpath(rel), max_depth=max_depth, skip=lambda name: TMP_MARK in name, stop=cancel.is_set
            )
        except FileNotFoundError:
            raise self.missing_dir(rel, display) from None
        except NotADirectoryError:
            raise NotDirectory(display) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "readdir") from exc

    def walk_stats_sync(
        self, rel: str, display: str, max_depth: int, cancel: threading.Event = NEVER
    ) -> list[tuple[str, FileStat]]:
        """The metadata of every file below ``rel`` (what :meth:`walk_sync` lists, with the
        status each entry was listed with); names relative to ``rel``."""
        host = self.bpath(rel)
        found = self._walked(rel, display, max_depth, cancel)
        out: list[tuple[str, FileStat]] = []
        # Files below a linked directory are not listed (a walk does not follow links).
        linked = tuple(e.name + "/" for e in found if e.is_dir and e.link is not None)
        for entry in found:
            if entry.is_dir or (linked and entry.name.startswith(linked)):
                continue
            info = _info_dict(posixpath.join(host, entry.name), entry.lstat, entry.stat, entry.link)
            out.append((entry.name, self.stat_of(_paths.join(rel, entry.name) if rel else entry.name, info)))
        return out

    @staticmethod
    def _walk_entry(entry: DiskEntry) -> FileEntry:
        is_dir = entry.is_dir
        link = entry.link is not None
        size = entry.lstat.st_size if not is_dir and not link else None
        return FileEntry(entry.name, "directory" if is_dir else "file", size, link, entry.link)

    # -- writes ---------------------------------------------------------------------------------

    def prepare_parent(self, rel: str, display: str, recursive: bool) -> None:
        parent = _paths.dirname(rel)
        if not parent:
            return
        host = self.bpath(parent)
        if host == self.base_dir:
            return  # the workspace's own directory: made by setup, never made again here
        shown = display_parent(display)
        try:
            if recursive:
                self.disk.makedirs(host)
                return
            info = self.disk.stat(host)
        except (FileExistsError, NotADirectoryError):
            # A file on the way: in the way of a recursive write; without ``recursive``, the
            # directory is simply not there (as on every backend).
            raise (NotDirectory(shown) if recursive else DirectoryNotFound(shown)) from None
        except FileNotFoundError:
            raise DirectoryNotFound(shown) from None
        except Exception as exc:
            raise self.refuse(exc, parent, shown, "write_file") from exc
        if not stat_module.S_ISDIR(info.st_mode):
            raise NotDirectory(shown)

    def commit(
        self,
        rel: str,
        display: str,
        data: bytes,
        overwrite: bool,
        cancel: threading.Event,
        extra: dict[str, Any],
    ) -> None:
        self.publish_fill(rel, display, write_into(data), overwrite, cancel)

    def publish_fill(
        self,
        rel: str,
        display: str,
        fill: Any,
        overwrite: bool,
        cancel: threading.Event = NEVER,
        check: Callable[[], object] | None = None,
        settle: Callable[[int, str], None] | None = None,
    ) -> None:
        """Publish what ``fill`` stages as ``rel``, its attributes set by ``settle`` (see
        :meth:`Disk.publish`); ``check()``, called between the staging and the rename, may
        refuse it by raising (a version guard: its race is that short)."""

        def proceed() -> bool:
            if cancel.is_set():
                return False
            if check is not None:
                check()
            return True

        try:
            self.disk.publish(self.bpath(rel), fill, overwrite=overwrite, proceed=proceed, settle=settle)
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except FileExistsError:
            raise FileExists(display) from None
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.refuse(exc, rel, display, "write_file") from exc

    def upload_sync(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event = NEVER,
        *,
        guard: Version | None = None,
        create: bool = False,
        metadata: Mapping[str, str] | None = None,
        attributes: PosixAttributes | None = None,
    ) -> str | None:
        """Publish the local file ``local_path`` as ``rel`` (see :meth:`Disk.publish`), with
        ``attributes``' permission bits, owner and times set before it takes the name: the
        version returned is then the file's own, times and all (``metadata`` is for object
        stores: the disk keeps attributes in the file itself)."""
        if not rel:
            raise IsDirectory(display)
        settle = None if attributes is None else functools.partial(_settle, attributes)
        with self._guard_lock(rel, guard is not None), self._version_lock(rel, display, guard):
            self.prepare_parent(rel, display, True)
            if cancel.is_set():
                return None
            check = None if guard is None else functools.partial(self._check_guard, rel, display, guard)
            self.publish_fill(rel, display, link_or_copy_from(local_path), not create, cancel, check, settle)
            # Read under the lock: a guarded publish from elsewhere cannot come in between.
            info = self.info(rel)
        return self.stat_of(rel, info).etag if info is not None else None

    @contextlib.contextmanager
    def _version_lock(self, rel: str, display: str, guard: Version | None) -> Iterator[None]:
        """For a guarded publish: an exclusive ``flock`` on the file being replaced, held
        from the version check to the rename, so that another process publishing the same
        way (a second mount of the directory) checks only once this one is in place, and
        then finds the new version. Writers that take no lock still race it."""
        if guard is None:
            yield
            return
        try:
            fd = self.disk.open(self.bpath(rel), os.O_RDONLY | _O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StaleFileError(display, guard.modified_at, None) from None
        except OSError:
            yield  # not a regular file to lock (the check refuses it)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def delete_sync(self, rel: str, display: str, force: bool = False) -> None:
        if not rel:
            raise IsDirectory(display)
        host = self.bpath(rel)
        try:
            link = stat_module.S_ISLNK(self.disk.lstat(host).st_mode)
        except (OSError, ContainmentError):
            link = False  # the name itself is what info() below reports on
        if link:
            # The link itself, wherever it points (outside the root too): its name is inside,
            # and removing it never touches its target.
            try:
                self.disk.unlink(host)
                return
            except FileNotFoundError:
                if force:
                    return
                raise FileNotFound(display) from None
            except Exception as exc:
                raise self.refuse(exc, rel, display, "delete_file") from exc
        info = self.info(rel)
        if info is None:
            # A broken symlink has no info but is a name that can go.
            try:
                self.disk.unlink(self.bpath(rel))
                return
            except (FileNotFoundError, NotADirectoryError):
                if force:
                    return
                raise FileNotFound(display) from None
            except Exception as exc:
                raise self.refuse(exc, rel, display, "delete_file") from exc
        if info.get("type") == "directory":
            raise IsDirectory(display)
        try:
            self.disk.unlink(self.bpath(rel))
        except FileNotFoundError:
            if not force:
                raise FileNotFound(display) from None
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "delete_file") from exc

    def mkdir_sync(self, rel: str, display: str, recursive: bool = True) -> None:
        if not rel or not self.check_mkdir(rel, display, recursive):
            return
        host = self.bpath(rel)
        # A dangling symlink is a name that exists (check_mkdir saw no directory through it):
        # mkdir -p refuses it rather than creating the directory it points to.
        try:
            link = stat_module.S_ISLNK(self.disk.lstat(host).st_mode)
        except OSError:
            link = False
        if link:
            raise FileExists(display)
        try:
            if recursive:
                self.disk.makedirs(host)
            else:
                self.disk.mkdir(host)
        except FileExistsError:
            # Made by someone else meanwhile (fine if a directory), or a file in the way.
            again = self.info(rel)
            if again is not None and again.get("type") == "directory":
                return
            raise (FileExists(display) if again is not None else NotDirectory(display_parent(display))) from None
        except NotADirectoryError:
            raise NotDirectory(display_parent(display)) from None
        except FileNotFoundError:
            raise DirectoryNotFound(display_parent(display)) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "mkdir") from exc

    def rmdir_sync(self, rel: str, display: str, recursive: bool = False, force: bool = False) -> None:
        if not self.check_rmdir(rel, display, force):
            return
        host = self.bpath(rel)
        try:
            if recursive:
                self.disk.rmtree(host)
            else:
                if self.children(rel, self.list_raw(rel, display), display):
                    raise DirectoryNotEmpty(display)
                self.disk.rmdir(host)
        except FilesystemError:
            raise
        except FileNotFoundError:
            if not force:
                raise DirectoryNotFound(display) from None
        except OSError as exc:
            if exc.errno == _errno.ENOTEMPTY:
                raise DirectoryNotEmpty(display) from None
            raise self.refuse(exc, rel, display, "rmdir") from exc

    def copy_sync(
        self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event = NEVER
    ) -> None:
        self.check_copy(dest_rel, dest, overwrite)
        self.prepare_parent(dest_rel, dest, True)
        try:
            fd = self.disk.open_regular(self.bpath(src_rel))
        except IsADirectoryError:
            raise IsDirectory(src) from None
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFound(src) from None
        except Exception as exc:
            raise self.refuse(exc, src_rel, src, "copy_file") from exc
        try:
            self.publish_fill(dest_rel, dest, copy_into(fd), overwrite, cancel)
        finally:
            os.close(fd)

    def name_info(self, rel: str) -> dict[str, Any] | None:
        """The info record of the entry ``rel`` itself: rename(2) moves names, so a symbolic
        link is moved, or replaced, as itself, wherever it points (outside, nowhere)."""
        host = self.bpath(rel)
        try:
            own = self.disk.lstat(host)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ContainmentError:
            raise PermissionDenied(self.escape(rel, rel), "access") from None
        return _info_dict(host, own, None, None)

    def move_sync(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> None:
        self.check_move(src_rel, src, dest_rel, dest, overwrite)
        self.prepare_parent(dest_rel, dest, True)
        try:
            self.disk.rename(self.bpath(src_rel), self.bpath(dest_rel), replace=overwrite)
        except FileExistsError:
            raise FileExists(dest) from None
        except FileNotFoundError:
            raise FileNotFound(src) from None
        except IsADirectoryError:
            raise IsDirectory(dest) from None
        except OSError as exc:
            if exc.errno == _errno.ENOTEMPTY:
                raise DirectoryNotEmpty(dest) from None
            raise self.refuse(exc, dest_rel, dest, "move_file") from exc

    def read_beneath_sync(self, rel: str, path: str, shown: str, max_bytes: int | None) -> bytes:
        with self._reading(rel, shown, "read_file", escape=lambda: leads_out_of_directory(path)):
            return self.disk.read_beneath(self.bpath(rel), path, max_bytes=max_bytes)
        raise AssertionError("unreachable")  # pragma: no cover - the context re-raises

    def append_sync(self, rel: str, display: str, data: bytes) -> None:
        if not rel:
            raise IsDirectory(display)
        self.prepare_parent(rel, display, True)
        try:
            self.disk.append(self.bpath(rel), data)
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except Exception as exc:
            raise self.refuse(exc, rel, display, "append_file") from exc


class DiskFilesystem(FsspecFilesystem):
    """A directory on local disk under a root nothing can leave, not even through a race.

    See :class:`FsspecFilesystem` for the parameters; this is what it builds for ``file://``
    URLs and ``LocalFileSystem`` instances, over a :class:`DiskBackend`. Symlinks inside the
    root work while they stay inside (also when created after the check: each call resolves
    once, beneath a descriptor of the root, and acts on what it found). FIFOs, devices and
    sockets are listed but never opened: reading or writing one fails with
    :class:`~agentvfs.errors.NotRegularFile`.
    """

    _backend: DiskBackend

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A FUSE mount stages here (see local_staging_dir), held by descriptor.
        self._staging_fd = -1
        self._staging_users = 0
        self._staging_lock = threading.Lock()

    def _make_backend(self, fs: Any, root: str, listing_ttl: float) -> DiskBackend:
        return DiskBackend(root, fs=fs)

    @property
    def backend(self) -> DiskBackend:
        """The :class:`DiskBackend` under this filesystem."""
        return self._backend

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read ``path`` (relative) below ``directory`` without leaving it, not even through a
        symlink swapped in during the call (see :func:`agentvfs.vfs.read_file_beneath`).

        Raises
        ------
        PermissionDenied
            ``path`` leads out of ``directory``.
        FileNotFound, IsDirectory, NotRegularFile
            As :meth:`read_file`.
        FileTooLarge
            The file is larger than ``max_bytes`` (no more than one byte past it is read).
        """
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(directory)
        shown = f"{directory.rstrip('/')}/{path}" if directory.strip("/") else path
        return await self._call(self._backend.read_beneath_sync, rel, path, shown, max_bytes)

    async def append_file(self, path: str, content: str | bytes) -> None:
        """Append to a file in place, creating it and its parents if missing; the file is cut
        back to its old length if the append fails."""
        self._check_writable("append_file")
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        await self._call(self._backend.append_sync, rel, path, data)

    # -- direct access for mounts -------------------------------------------------------------

    def local_open(self, path: str, flags: int, mode: int = 0o600) -> int:
        """Open the file at ``path`` on disk, for a reader or writer that works on descriptors
        (a FUSE mount's passthrough). Only regular files open; symlinks are followed inside.

        Parameters
        ----------
        path : str
            A workspace path.
        flags : int
            ``os.open`` flags (``O_CREAT | O_EXCL`` creates; ``O_NOFOLLOW`` refuses a symlink).
        mode : int
            Permission bits of a created file.

        Returns
        -------
        int
            A new descriptor (close-on-exec), the caller's to close.

        Raises
        ------
        OSError
            As ``open(2)``; ``PermissionDenied`` for a path that leads out of the root,
            ``NotRegularFile`` for a FIFO, device or socket.
        """
        rel = self._rel(path)
        try:
            return self._backend.disk.open_regular(self._backend.bpath(rel), flags, mode)
        except Exception as exc:
            raise self._backend.refuse(exc, rel, path, "open") from exc

    def local_set_attributes(
        self,
        path: str,
        *,
        mode: int | None = None,
        owner: tuple[int, int] | None = None,
        times_ns: tuple[int, int] | None = None,
        expected: Version | None = None,
    ) -> str | None:
        """Set mode bits, owner and times of ``path`` on disk (see
        :class:`~agentvfs.vfs.SupportsLocalAttributes`)."""
        self._check_writable("setattr")
        backend = self._backend
        assert isinstance(backend, DiskBackend)
        return backend.set_attributes_sync(
            self._rel(path), path, mode=mode, owner=owner, times_ns=times_ns, guard=expected
        )

    def _published_with(self, attributes: PosixAttributes | None, keep: Mapping[str, str] | None) -> dict[str, Any]:
        # Set on the file before it takes its name, so the version published is the one
        # returned (its modification time is part of it).
        return {"attributes": attributes}

    # -- POSIX attributes: the disk's own ----------------------------------------------------

    @property
    def attribute_storage(self) -> Literal["native", "metadata"] | None:
        """``native``: modes, owners, times and special files are the disk's own."""
        return "native"

    async def set_attributes(self, path: str, attrs: PosixAttributes, *, expected: Version | None = None) -> str | None:
        """Set ``attrs``' permission bits, owner and times on disk, only while the file is
        the version ``expected`` when one is given; the file's version now (its modification
        time is part of it)."""
        change = functools.partial(
            self.local_set_attributes, path, mode=attrs.perm, owner=attrs.owner, times_ns=attrs.times_ns,
            expected=expected,
        )  # fmt: skip
        return await run_sync(change)

    async def make_special(self, path: str, attrs: PosixAttributes) -> None:
        """Create the symbolic link, FIFO, socket or device node ``path`` on disk."""
        self._check_writable("mknod")
        backend = self._backend
        assert isinstance(backend, DiskBackend)
        await self._call_write(lambda r, p, cancel: backend.make_special_sync(r, p, attrs), self._rel(path), path)

    async def make_hard_link(self, src: str, dest: str) -> None:
        """Make ``dest`` a second name of the file ``src`` on disk."""
        self._check_writable("link")
        backend = self._backend
        assert isinstance(backend, DiskBackend)
        src_rel, dest_rel = self._rel(src), self._rel(dest)
        await self._call_write(lambda r, p, cancel: backend.make_hard_link_sync(src_rel, r, p), dest_rel, dest)

    async def rewrite_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        attributes: PosixAttributes | None = None,
    ) -> str | None:
        """Write ``local_path`` over the file ``path`` in place (see
        :class:`~agentvfs.vfs.SupportsHardLinks`)."""
        self._check_writable("write_file")
        if self.status != "ready":
            await self.ensure_ready()
        backend = self._backend
        assert isinstance(backend, DiskBackend)
        times = None if attributes is None else attributes.times_ns
        return await self._call_write(
            lambda r, p, cancel: backend.rewrite_sync(r, p, local_path, expected, times), self._rel(path), path
        )

    def local_lstat(self, path: str) -> os.stat_result:
        """The status of the entry ``path`` on disk itself (a symbolic link not followed).

        Raises
        ------
        OSError
            As ``lstat(2)``; ``PermissionDenied`` for a path that leads out of the root.
        """
        rel = self._rel(path)
        backend = self._backend
        assert isinstance(backend, DiskBackend)
        try:
            return backend.disk.lstat(backend.bpath(rel))
        except ContainmentError:
            raise PermissionDenied(path, "access") from None

    def local_unlink(self, path: str) -> None:
        """Remove the name ``path`` on disk (a symlink itself, not its target).

        Raises
        ------
        OSError
            As ``unlink(2)``; ``PermissionDenied`` for a path that leads out of the root.
        """
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        try:
            self._backend.disk.unlink(self._backend.bpath(rel))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._backend.refuse(exc, rel, path, "unlink") from exc

    def local_staging_dir(self) -> str | None:
        """A directory beside the files where a FUSE mount stages writes, so that publishing
        one is a link and a rename instead of a copy; hidden from listings.

        It is made inside the root through descriptors and named by its descriptor
        (``/proc/self/fd/N``): nothing that renames or swaps it afterwards redirects what is
        staged there. Each caller gives it back with :meth:`local_staging_release`. None for a
        read-only filesystem, or where it cannot be made (a missing root).
        """
        if self.read_only:
            return None  # nothing will be written: no reason to touch the directory
        with self._staging_lock:
            if self._staging_fd < 0:
                try:
                    self._backend.disk.makedirs(self._staging_name())
                    self._staging_fd = self._backend.disk.open(
                        self._staging_name(), os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW
                    )
                except OSError:
                    return None
            self._staging_users += 1
            return f"/proc/self/fd/{self._staging_fd}"

    def local_staging_release(self) -> None:
        """One user of :meth:`local_staging_dir` is done; the last one closes it and removes
        it if empty."""
        with self._staging_lock:
            self._staging_users = max(0, self._staging_users - 1)
            if self._staging_users or self._staging_fd < 0:
                return
            os.close(self._staging_fd)
            self._staging_fd = -1
            with contextlib.suppress(OSError):  # not empty: a failed upload's copy is kept
                self._backend.disk.rmdir(self._staging_name())

    def _staging_name(self) -> str:
        return posixpath.join(self._staging_root(), f".mount{TMP_MARK}{os.getpid()}")

    def _staging_root(self) -> str:
        return self._backend.root_path or "/"
