"""Mounting and unmounting: the FUSE session on its own trio thread, stale-mount cleanup,
kernel tuning, and the drain of pending uploads before the unmount."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
import pyfuse3
import trio

from ..errors import MountError
from ..vfs import WorkspaceFilesystem
from . import _helper
from ._ops import MountOperations, notify_kernel
from ._options import MountOptions
from ._recovery import RecoveredFile

__all__ = ["Mount", "cleanup_stale_mount", "fuse_available", "is_mounted", "mount"]

_log = logging.getLogger("agentvfs.mounts")

# pyfuse3 keeps one FUSE session per process (module-level state).
_session_lock = threading.Lock()


def fuse_available() -> str | None:
    """``None`` when FUSE mounts can work here, else the reason they cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not accessible"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


def _mount_table() -> dict[str, str]:
    """Mount point -> filesystem type, from ``/proc/self/mountinfo``."""
    table: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                point = fields[4].encode().decode("unicode_escape")
                table[point] = fields[sep + 1]
    except OSError:
        pass
    return table


def is_mounted(path: str) -> bool:
    """Whether ``path`` is a mount point (a dead FUSE mount counts)."""
    return os.path.realpath(path) in _mount_table() or os.path.abspath(path) in _mount_table()


def _fusermount(*args: str) -> bool:
    exe = shutil.which("fusermount3") or shutil.which("fusermount")
    if exe is not None:
        done = subprocess.run([exe, *args], capture_output=True, check=False)
        if done.returncode == 0:
            return True
    umount = shutil.which("umount")
    if umount is None:
        return False
    lazy = ["-l"] if "-z" in args else []
    return subprocess.run([umount, *lazy, args[-1]], capture_output=True, check=False).returncode == 0


def cleanup_stale_mount(path: str) -> bool:
    """Unmount a dead FUSE mount left at ``path`` by a process that died (its requests fail
    with ``ENOTCONN``); returns True if one was removed.

    Raises
    ------
    MountError
        A live filesystem is mounted there.
    """
    point = os.path.abspath(path)
    if not is_mounted(point):
        return False
    try:
        # statfs always reaches the mount's process; a stat may be answered by the kernel
        # from attributes it still caches, so a dead mount would pass for a live one.
        os.statvfs(point)
    except OSError as exc:
        if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO):
            raise
        _log.warning("removing a stale mount at %s (%s)", point, exc.strerror)
        if not _fusermount("-u", point):
            _fusermount("-uz", point)
        if is_mounted(point):
            raise MountError(f"Stale mount at {point} could not be removed") from None
        return True
    raise MountError(f"Mount point {point} is already in use by another mount")


def prepare_mountpoint(mountpoint: str, *, nonempty: bool = False) -> None:
    """Check that FUSE works and ``mountpoint`` is a free, empty directory (any directory
    with ``nonempty``), removing a dead mount a killed process left there (which also makes
    the directory readable again).

    Raises
    ------
    MountError
        FUSE is unavailable, the path is missing, not a directory or not empty, or a live
        mount is there.
    """
    reason = fuse_available()
    if reason is not None:
        raise MountError(f"FUSE is not available: {reason}")
    cleanup_stale_mount(mountpoint)
    if not os.path.lexists(mountpoint):
        raise MountError(f"Mount point {mountpoint} does not exist; create the directory first")
    if not os.path.isdir(mountpoint):
        raise MountError(f"Mount point {mountpoint} is not a directory")
    if not nonempty:
        try:
            with os.scandir(mountpoint) as entries:
                first = next(entries, None)
        except OSError as exc:
            raise MountError(f"Mount point {mountpoint} cannot be listed: {exc.strerror}") from None
        if first is not None:
            raise MountError(
                f"Mount point {mountpoint} is not empty (it holds {first.name!r}, which the mount would hide); "
                "use an empty directory, or mount option nonempty=true"
            )


def _tune(mountpoint: str, options: MountOptions) -> None:
    """Raise the kernel's read-ahead and background-request limits of this FUSE connection
    (root only; silently kept as they are elsewhere)."""
    try:
        dev = os.stat(mountpoint).st_dev
    except OSError:
        return
    major, minor = os.major(dev), os.minor(dev)
    if options.read_ahead_kb:
        with contextlib.suppress(OSError), open(f"/sys/class/bdi/{major}:{minor}/read_ahead_kb", "w") as f:
            f.write(str(options.read_ahead_kb))
    if options.max_background:
        conn = f"/sys/fs/fuse/connections/{minor}"
        if not os.path.isdir(conn) and os.geteuid() == 0:
            subprocess.run(
                ["mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections"],
                capture_output=True,
                check=False,
            )
        with contextlib.suppress(OSError):
            with open(f"{conn}/max_background", "w") as f:
                f.write(str(options.max_background))
            with open(f"{conn}/congestion_threshold", "w") as f:
                f.write(str(max(1, options.max_background * 3 // 4)))


#: Per-mount flags of mountinfo and the mount(2) flags that set them again in a remount.
_MOUNT_FLAGS = {
    "ro": 0x1,  # MS_RDONLY
    "nodev": 0x4,  # MS_NODEV
    "noexec": 0x8,  # MS_NOEXEC
    "noatime": 0x400,  # MS_NOATIME
    "nodiratime": 0x800,  # MS_NODIRATIME
    "relatime": 0x200000,  # MS_RELATIME
    "strictatime": 0x1000000,  # MS_STRICTATIME
}
_MS_REMOUNT, _MS_BIND = 0x20, 0x1000


def _mount_flags(mountpoint: str) -> list[str]:
    """The per-mount flags (``rw``, ``nosuid``, ...) of the mount at ``mountpoint`` (the one
    on top, the last listed)."""
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for row in f:
            fields = row.split()
            # Space, tab, newline and backslash appear as octal escapes.
            if len(fields) > 5 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]) == mountpoint:
                found = fields[5].split(",")
    return found


def _allow_set_id(mountpoint: str) -> str | None:
    """Take ``nosuid`` off a mount asked for ``suid=true``; why it stays, or None.

    libfuse before 3.17 makes every mount with ``auto_unmount`` (every mount here) ``nosuid``
    whatever it was asked; only root may change that, by a remount of the mount's flags.
    """
    flags = _mount_flags(mountpoint)
    if "nosuid" not in flags:
        return None
    if os.geteuid() != 0:
        return "only root may mount with suid=true (the mount is nosuid)"
    keep = 0
    for flag in flags:
        keep |= _MOUNT_FLAGS.get(flag, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, os.fsencode(mountpoint), None, _MS_REMOUNT | _MS_BIND | keep, None) != 0:
        code = ctypes.get_errno()
        return f"the remount without nosuid failed: {os.strerror(code)} (the mount is nosuid)"
    return None


def _closes_unattributed() -> str | None:
    """Why this process's mounts cannot tell which process closed a file (see the
    Durability section of docs/mount-semantics.md), or None when they can."""
    helper = _helper.HELPER
    if helper is None:
        return _helper.unavailable_reason()
    if not helper.active():
        return "pyfuse3 did not bind to the FUSE helper library (another libfuse was loaded before it)"
    return None


def _syncfs(path: str) -> None:
    """syncfs(2) on ``path`` with the GIL released (the FUSE thread must run meanwhile to
    receive the pages; pyfuse3's own ``syncfs`` keeps the GIL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)


def _stop_unmount_helper(mountpoint: str) -> None:
    """End the ``fusermount3`` auto-unmount helper libfuse left for ``mountpoint``.

    It waits for this process to die (then unmounts), so after a clean unmount it would live
    on for every mount this process ever made; and were the path mounted again by someone
    else, it would unmount that at exit.
    """
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            if ppid != me:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (OSError, IndexError):
            continue
        # "-o auto_unmount" up to libfuse 3.16, "--auto-unmount" from 3.17
        auto_unmount = any(b"auto_unmount" in a or a == b"--auto-unmount" for a in args)
        if b"fusermount" in args[0] and auto_unmount and os.fsencode(mountpoint) in args:
            with contextlib.suppress(OSError):
                # It ignores SIGTERM; the mount it guards is gone already.
                os.kill(int(pid), signal.SIGKILL)
                os.waitpid(int(pid), 0)
    _close_unmount_socket()


def _close_unmount_socket() -> None:
    """Close this process's end of the auto-unmount helper's socket (libfuse >= 3.17).

    libfuse names it in ``_FUSE_COMMFD2`` of the C environment and never closes it: one
    descriptor per mount for the life of the process otherwise. Closed only once the helper
    is gone (closing it tells a live helper to unmount).
    """
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(b"_FUSE_COMMFD2")
    if not value:
        return
    libc.unsetenv(b"_FUSE_COMMFD2")
    with contextlib.suppress(ValueError, OSError):
        fd = int(value)
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)


class Mount:
    """A workspace filesystem FUSE-mounted at a directory, served by a thread of this process.

    ``start()`` returns once the mount answers; ``close()`` uploads what is pending, then
    unmounts. Used as a context manager it does both. Only one mount can be served per
    process (a limit of pyfuse3).

    Parameters
    ----------
    filesystem : WorkspaceFilesystem
        What to mount.
    mountpoint : str
        An existing directory. A dead mount left there by a killed process is cleaned first.
    read_only : bool, optional
        Mount read-only (``ro``): every write fails with ``EROFS`` and nothing reaches
        storage. Defaults to the filesystem's own ``read_only``.
    options : MountOptions or mapping, optional
        See :class:`MountOptions`.

    Raises
    ------
    MountError
        FUSE is unavailable, the mount point is busy or missing, or another mount is served
        by this process.
    """

    def __init__(
        self,
        filesystem: WorkspaceFilesystem,
        mountpoint: str | os.PathLike[str],
        *,
        read_only: bool | None = None,
        options: MountOptions | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(filesystem, WorkspaceFilesystem):
            raise TypeError(f"filesystem must be a WorkspaceFilesystem, not {type(filesystem).__name__}")
        if read_only is False and filesystem.read_only:
            raise MountError(f"Filesystem {filesystem.id} is read-only and cannot be mounted read-write")
        self.filesystem = filesystem
        self.mountpoint = os.path.abspath(os.fspath(mountpoint))
        self.read_only = filesystem.read_only if read_only is None else bool(read_only)
        self.options = MountOptions.from_value(options)
        self.operations: MountOperations | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._unwatch: Any = None
        self._holds_session = False
        #: Paths the last ``close`` could not publish, with the reason (their data is in
        #: the recovery area, see ``kept``).
        self.pending_failures: dict[str, str] = {}

    @property
    def recovered(self) -> list[RecoveredFile]:
        """Files a mount of the same storage that ended without publishing them left behind,
        moved to the recovery area when this one started (``agentvfs recover``)."""
        return list(self.operations.recovered) if self.operations is not None else []

    @property
    def kept(self) -> list[RecoveredFile]:
        """Files this mount put into the recovery area instead of storage."""
        return list(self.operations.kept) if self.operations is not None else []

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def mounted(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    def start(self) -> Mount:
        """Mount and return once the mount point answers.

        Raises
        ------
        MountError
            See the class.
        """
        prepare_mountpoint(self.mountpoint, nonempty=self.options.nonempty)
        if not _session_lock.acquire(blocking=False):
            raise MountError("Another mount is already served by this process (one FUSE session per process)")
        self._holds_session = True
        try:
            self.operations = MountOperations(
                self.filesystem, self.options, read_only=self.read_only, mountpoint=self.mountpoint
            )
            self._thread = threading.Thread(target=self._serve, name=f"agentvfs-mount {self.mountpoint}", daemon=True)
            self._thread.start()
            self._ready.wait()
            if self._error is not None:
                raise MountError(f"Mounting at {self.mountpoint} failed: {self._error}") from self._error
            self._unwatch = self.filesystem.watch(self._on_change)
            _tune(self.mountpoint, self.options)
            if self.options.suid and (why := _allow_set_id(self.mountpoint)) is not None:
                _log.warning("%s: set-user-ID bits of programs in %s are not honoured", why, self.mountpoint)
            if not self.read_only and (why := _closes_unattributed()) is not None:
                # Files stay whole (never published at a close that may be a child's), but
                # the data of a close() reaches storage only moments after it returns.
                _log.warning(
                    "the mount at %s cannot tell which process closes a file (%s): each file written "
                    "through it is published at its last close, moments after close() returns, "
                    "instead of when the opener's close() returns", self.mountpoint, why,
                )  # fmt: skip
            _log.info(
                "serving %s at %s (%s)", self.filesystem.location or self.filesystem.id, self.mountpoint,
                "read-only" if self.read_only else "read-write",
            )  # fmt: skip
        except BaseException:
            self._stop_thread()
            self._release_session()
            raise
        return self

    def _serve(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
            else:
                _log.exception("FUSE server for %s stopped with an error", self.mountpoint)

    async def _main(self) -> None:
        ops = self.operations
        assert ops is not None
        await self.filesystem.ensure_ready()
        # One request before the mount appears: it proves the storage answers (a missing
        # bucket or bad credentials fail the mount, not the first `ls`) and sets up its client,
        # so the first read through the mount does not pay for that.
        await self.filesystem.probe()
        # What an earlier mount of this storage could not publish was moved to the recovery
        # area when the operations were made; the uploads it left open go now.
        await ops.abort_left_uploads()
        flags = {
            "fsname=" + self.options.fsname,
            "subtype=agentvfs",
            "default_permissions",
            "nodev",
            # With auto_unmount, fusermount3 unmounts when this process dies (even by kill -9),
            # so no dead mount is left behind.
            "auto_unmount",
        }
        # Modes come from storage (object metadata anyone with write access to the bucket
        # can set): a set-user-ID bit there must not make a root program here unless asked.
        flags.add("suid" if self.options.suid else "nosuid")
        if self.options.allow_other:
            flags.add("allow_other")
        if self.read_only:
            flags.add("ro")
        if self.options.debug:
            flags.add("debug")
        if _helper.HELPER is not None:
            # Asked for (or not) at the kernel's first request, which this session answers.
            _helper.HELPER.request(ops.passthrough is not None)
        pyfuse3.init(ops, self.mountpoint, flags)
        try:
            self._token = trio.lowlevel.current_trio_token()
            ops.set_thread()
            async with trio.open_nursery() as nursery:
                ops.nursery = nursery
                self._ready.set()
                await pyfuse3.main(min_tasks=1, max_tasks=self.options.max_tasks)
                nursery.cancel_scope.cancel()
        finally:
            ops.nursery = None
            pyfuse3.close(unmount=True)

    def _on_change(self, fs: WorkspaceFilesystem, operation: str, paths: tuple[str, ...]) -> None:
        """A change made through the filesystem object (by the Workspace API in this process):
        drop what the mount and the kernel cached about those paths before the call returns."""
        ops = self.operations
        token = self._token
        if ops is None or token is None or threading.get_ident() == ops.thread_id:
            return  # the mount's own change: it updated its state itself
        try:
            notes = trio.from_thread.run_sync(ops.forget_paths, paths, trio_token=token)
        except (trio.RunFinishedError, RuntimeError):
            return
        for parent, name, ino in notes:
            notify_kernel(parent, name, ino)  # this is the caller's thread, not the FUSE one

    def close(self) -> None:
        """Wait up to ``stop_timeout`` for files open for writing to be closed, upload what
        is pending, then unmount. A file still open, or whose upload failed, is not
        published: it goes to the recovery area (``agentvfs recover``).

        Raises
        ------
        MountError
            Some files were not published (each named with the reason; details ``failed``
            by path and ``kept``, the recovery entries).
        """
        if self._thread is None:
            return
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        failures: dict[str, str] = {}
        ops = self.operations
        if ops is not None and self._token is not None and self._thread.is_alive():
            # Dirty pages of files still open sit in the kernel (writeback cache): make the
            # kernel send them before the staged copies are uploaded.
            _syncfs(self.mountpoint)
            with contextlib.suppress(trio.RunFinishedError):
                failures = trio.from_thread.run(ops.drain, trio_token=self._token)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run(ops.release_cache, trio_token=self._token)
        self._stop_thread()
        _stop_unmount_helper(self.mountpoint)
        if ops is not None:
            ops.close_staging()
        self._release_session()
        if is_mounted(self.mountpoint) and not _fusermount("-u", self.mountpoint):
            _fusermount("-uz", self.mountpoint)
        self.pending_failures = failures
        _log.info("unmounted %s (%d file(s) not published)", self.mountpoint, len(failures))
        if failures:
            listed = "; ".join(f"{path}: {why}" for path, why in sorted(failures.items()))
            assert ops is not None
            kept = [entry.to_dict() for entry in ops.kept]
            where = ops.recovery.path if ops.recovery is not None else ops.staging_shown
            raise MountError(
                f"Unmounted {self.mountpoint} without publishing {len(failures)} file(s), kept in {where} "
                f"(agentvfs recover --list): {listed}",
                {"failed": failures, "kept": kept, "recovery_dir": where, "staging_dir": ops.staging_shown},
            )

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive() and self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(pyfuse3.terminate)
        thread.join(timeout=30)
        if thread.is_alive():
            # A request is stuck in storage: detach the mount so callers are not blocked.
            _fusermount("-uz", self.mountpoint)
            thread.join(timeout=30)
        self._thread = None

    def _release_session(self) -> None:
        if self._holds_session:
            self._holds_session = False
            _session_lock.release()

    def __enter__(self) -> Mount:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "not mounted"
        mode = "ro" if self.read_only else "rw"
        return f"<Mount {self.filesystem.id} at {self.mountpoint} ({mode}, {state})>"


@contextlib.asynccontextmanager
async def mount(
    filesystem: WorkspaceFilesystem,
    mountpoint: str | os.PathLike[str],
    *,
    read_only: bool | None = None,
    options: MountOptions | Mapping[str, Any] | None = None,
) -> AsyncIterator[Mount]:
    """Mount ``filesystem`` at ``mountpoint`` for the body of an ``async with``.

    Returns once the mount is ready; on exit uploads pending writes and unmounts (also when
    the body raises). Works under asyncio and trio: the FUSE server has its own thread.
    See :class:`Mount` for the parameters and errors.
    """
    handle = Mount(filesystem, mountpoint, read_only=read_only, options=options)
    await anyio.to_thread.run_sync(handle.start)
    try:
        yield handle
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(handle.close)
