"""The mount manager: which filesystems a sandbox mounts, where, and in what state.

A workspace hands its ``mounts`` to the sandbox's manager (state ``pending``); the sandbox
processes them when it starts. Each goes through the ``on_mount`` hook first (skip, done by
the hook, failed, or default), then the sandbox mounts it: object stores and read-only
directories are FUSE-mounted at ``<working_directory>/<mount path>``, a read-write local
directory becomes a symlink. A marker file records what is mounted where (with a hash of the
mount configuration), so a later sandbox on the same working directory reuses a matching
mount and replaces one whose configuration changed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread

from .._aio import maybe_await as _maybe_await
from ..errors import MountToolNotFoundError
from ..vfs import LocalFilesystem, WorkspaceFilesystem

if TYPE_CHECKING:
    from ..mounts import Mount, ProcessMount

__all__ = [
    "MountEntry",
    "MountManager",
    "MountState",
    "config_hash",
    "marker_filename",
    "parse_marker_content",
]

_log = logging.getLogger("agentvfs.sandbox")

MountState = Literal["pending", "mounting", "mounted", "error", "unsupported", "unavailable"]

_MOUNT_PATH = re.compile(r"^/[A-Za-z0-9_.\-/]+$")


@dataclass
class MountEntry:
    """One filesystem a sandbox mounts, and how that went.

    Attributes
    ----------
    filesystem : WorkspaceFilesystem
        What is mounted.
    state : str
        ``pending mounting mounted error unsupported unavailable``.
    error : str or None
        Why the mount is not ``mounted`` (None when it is, or has not been tried).
    config : dict or None
        The filesystem's mount configuration (never credentials).
    config_hash : str or None
        16 hex digits identifying ``config``.
    """

    filesystem: WorkspaceFilesystem
    state: MountState = "pending"
    error: str | None = None
    config: dict[str, Any] | None = None
    config_hash: str | None = None


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted(item) for item in value]
    return value


def config_hash(config: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of ``config`` as JSON with keys sorted at every
    level (so the same configuration always gets the same hash)."""
    text = json.dumps(_sorted(config), separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rem = divmod(number, 36)
        out = digits[rem] + out
        if not number:
            return out


def marker_filename(path: str) -> str:
    """``mount-<base36 of |32-bit string hash of path|>``: the marker of a host path."""
    h = 0
    # The 32-bit string hash over UTF-16 code units (h = 31 * h + c, wrapping).
    data = path.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return "mount-" + _base36(abs(h))


def parse_marker_content(content: str) -> tuple[str, str] | None:
    """Split ``"<path>|<config hash>"`` at the last ``|``; None if malformed."""
    path, sep, digest = content.strip().rpartition("|")
    if not sep or not path or not digest:
        return None
    return path, digest


def canonical_mount_path(mount_path: str) -> str:
    """Check a sandbox mount path and return it without trailing slashes.

    Raises
    ------
    ValueError
        Not absolute, ``/`` itself, characters outside ``[A-Za-z0-9_.-/]``, or a ``.`` or
        ``..`` segment.
    """
    if isinstance(mount_path, str) and mount_path and not mount_path.strip("/"):
        raise ValueError(f"Invalid mount path: {mount_path!r}. Cannot mount at the root '/'.")
    if not isinstance(mount_path, str) or not _MOUNT_PATH.match(mount_path):
        raise ValueError(
            f"Invalid mount path: {mount_path!r}. Must be an absolute path of letters, digits, "
            "'_', '.', '-' and '/' (e.g. /data)."
        )
    segments = [s for s in mount_path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"Invalid mount path: {mount_path!r}. Path segments '.' and '..' are not allowed.")
    return "/" + "/".join(segments)




class MountManager:
    """The filesystems a sandbox mounts, keyed by mount path, with their states.

    Parameters
    ----------
    sandbox : object
        The sandbox that owns this manager (``working_directory`` gives the host paths).
    """

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self._workspace: Any = None
        self._on_mount: Callable[..., Any] | None = None
        self._entries: dict[str, MountEntry] = {}
        # host path -> what serves it (a FUSE mount, or a symlink we made)
        self._live: dict[str, _Live] = {}

    # -- configuration (called by Workspace) -------------------------------------------------

    @property
    def entries(self) -> dict[str, MountEntry]:
        """Mount path -> :class:`MountEntry`, in insertion order."""
        return self._entries

    def set_context(self, *, sandbox: Any = None, workspace: Any = None) -> None:
        """Record the sandbox and workspace passed to the ``on_mount`` hook."""
        if sandbox is not None:
            self._sandbox = sandbox
        self._workspace = workspace

    def set_on_mount(self, hook: Callable[..., Any] | None) -> None:
        """Set the hook called before each mount (see the module documentation)."""
        self._on_mount = hook

    def add(self, mounts: Mapping[str, WorkspaceFilesystem]) -> None:
        """Add filesystems to mount, state ``pending``."""
        for path, fs in mounts.items():
            self._entries[path] = MountEntry(filesystem=fs)

    def get(self, mount_path: str) -> MountEntry | None:
        """The entry of ``mount_path``, if any."""
        return self._entries.get(mount_path)

    def host_path(self, mount_path: str) -> str:
        """Where ``mount_path`` appears on this machine: ``<working_directory>/<mount path>``."""
        workdir = os.path.abspath(os.path.expanduser(str(self._sandbox.working_directory)))
        return os.path.join(workdir, canonical_mount_path(mount_path).lstrip("/"))

    def protected_paths(self) -> list[str]:
        """Host-side state of the manager no command may see or change (the markers): hidden
        in every isolated command."""
        with contextlib.suppress(OSError):
            return [markers_directory()]
        return []

    def isolation_binds(self) -> list[tuple[str, bool]]:
        """Host paths an isolated command needs bound, with whether they are writable: the
        real targets of symlink mounts (FUSE mounts sit under the working directory, which
        is bound recursively)."""
        binds: list[tuple[str, bool]] = []
        for live in self._live.values():
            if live.kind == "symlink" and live.target is not None:
                binds.append((live.target, not live.read_only))
        return binds

    # -- processing ---------------------------------------------------------------------------

    async def process_pending(self) -> None:
        """Mount every ``pending`` entry, in order, one after the other.

        Failures become entry states; nothing is raised.
        """
        for path, entry in list(self._entries.items()):
            if entry.state != "pending":
                continue
            try:
                await self._process(path, entry)
            except Exception as exc:  # pragma: no cover - _process maps every failure
                entry.state, entry.error = "error", str(exc)
            if entry.state not in ("mounted",):
                _log.warning("mount %s: %s (%s)", path, entry.state, entry.error)

    async def _process(self, path: str, entry: MountEntry) -> None:
        fs = entry.filesystem
        get_config = getattr(fs, "get_mount_config", None)
        config: dict[str, Any] | None = get_config() if callable(get_config) else None
        if self._on_mount is not None:
            try:
                result = await _maybe_await(
                    self._on_mount(
                        filesystem=fs, mount_path=path, config=config, sandbox=self._sandbox, workspace=self._workspace
                    )
                )
            except Exception as exc:
                entry.state, entry.error = "error", f"Mount hook error: {exc}"
                return
            if result is False:
                entry.state, entry.error = "unsupported", "Skipped by onMount hook"
                return
            if isinstance(result, Mapping):
                if result.get("success"):
                    entry.state, entry.error = "mounted", None
                    if config is not None:
                        entry.config, entry.config_hash = config, config_hash(config)
                    return
                entry.state, entry.error = "error", str(result.get("error") or "Mount hook failed")
                return
        if config is None:
            entry.state, entry.error = "unsupported", "Filesystem does not support mounting"
            return
        entry.config, entry.config_hash = config, config_hash(config)
        entry.state, entry.error = "mounting", None
        mount = getattr(self._sandbox, "mount", None)
        try:
            outcome = await _maybe_await(mount(fs, path)) if callable(mount) else None
        except MountToolNotFoundError as exc:
            entry.state, entry.error = "unavailable", str(exc) or "FUSE tool not installed"
            return
        except Exception as exc:
            entry.state, entry.error = "error", str(exc)
            return
        outcome = outcome if isinstance(outcome, Mapping) else {}
        if outcome.get("success"):
            entry.state, entry.error = "mounted", None
        elif outcome.get("unavailable"):
            entry.state, entry.error = "unavailable", str(outcome.get("error") or "FUSE tool not installed")
        elif outcome.get("unsupported"):
            entry.state, entry.error = "unsupported", str(outcome.get("error") or "Unsupported mount type")
        else:
            entry.state, entry.error = "error", str(outcome.get("error") or "Mount failed")

    # -- mounting (LocalSandbox.mount / unmount) ---------------------------------------------

    async def mount_filesystem(self, filesystem: WorkspaceFilesystem, mount_path: str) -> dict[str, Any]:
        """Mount ``filesystem`` at ``<working_directory>/<mount_path>``.

        A read-write :class:`LocalFilesystem` becomes a symlink to its directory; any other
        filesystem with a mount configuration (object stores, memory, read-only
        directories) is FUSE-mounted, read-only when the filesystem is.

        Returns
        -------
        dict
            ``{"success": True}``, or ``{"success": False, "error": ...}`` with
            ``"unsupported": True`` or ``"unavailable": True`` when that is why.
        """
        try:
            path = canonical_mount_path(mount_path)
        except ValueError as exc:
            return {"success": False, "error": str(exc)}
        get_config = getattr(filesystem, "get_mount_config", None)
        config = get_config() if callable(get_config) else None
        if not isinstance(config, Mapping):
            return {"success": False, "unsupported": True, "error": "Filesystem does not support mounting"}
        digest = config_hash(config)
        host = self.host_path(path)
        symlink = isinstance(filesystem, LocalFilesystem) and not filesystem.read_only
        if not symlink:
            from ..mounts import fuse_available

            reason = fuse_available()
            if reason is not None:
                return {"success": False, "unavailable": True, "error": f"FUSE is not available: {reason}"}
        live = self._live.get(host)
        if live is not None:
            if live.digest == digest and live.alive():
                return {"success": True}
            await self._release(host)
        # The configured directory: what is linked and bound, never what a link now points at.
        target = os.fspath(filesystem.base_path) if isinstance(filesystem, LocalFilesystem) and symlink else None
        try:
            refusal = await anyio.to_thread.run_sync(self._check_target, host, digest, target)
        except OSError as exc:
            return {"success": False, "error": f"Cannot mount at {host}: {exc.strerror or exc}"}
        if refusal == "reuse":
            self._live[host] = _Live("symlink", digest, target=target, read_only=False)
            return {"success": True}
        if refusal is not None:
            return {"success": False, "error": refusal}
        try:
            if target is not None:
                await anyio.to_thread.run_sync(self._make_symlink, host, target)
                self._live[host] = _Live("symlink", digest, target=target, read_only=False)
            else:
                handle = await self._fuse_mount(filesystem, host)
                self._live[host] = _Live("fuse", digest, handle=handle, read_only=filesystem.read_only)
        except Exception as exc:
            await anyio.to_thread.run_sync(self._undo_target, host)
            return {"success": False, "error": str(exc)}
        await anyio.to_thread.run_sync(_write_marker, host, digest)
        return {"success": True}

    async def unmount_path(self, mount_path: str) -> None:
        """Unmount what this manager mounted at ``mount_path`` (a no-op if nothing is).

        Raises
        ------
        MountError
            Writes made through a FUSE mount could not all be uploaded.
        """
        host = self.host_path(mount_path)
        await self._release(host)
        entry = self._entries.get(mount_path)
        if entry is not None and entry.state == "mounted":
            entry.state = "pending"

    async def unmount_all(self) -> None:
        """Unmount everything this manager mounted; mounted entries go back to ``pending`` (a
        restarted sandbox mounts them again). Upload failures are logged, never lost
        silently: the FUSE layer keeps their staged copies and names them."""
        for host in list(self._live):
            try:
                await self._release(host)
            except Exception:
                _log.exception("unmounting %s failed", host)
        for entry in self._entries.values():
            if entry.state == "mounted":
                entry.state = "pending"

    def clear(self) -> None:
        """Forget every entry (after :meth:`unmount_all`)."""
        self._entries.clear()

    # -- internals ----------------------------------------------------------------------------------

    async def _release(self, host: str) -> None:
        live = self._live.pop(host, None)
        if live is None:
            return
        try:
            if live.handle is not None:
                await anyio.to_thread.run_sync(live.handle.close)
        finally:
            await anyio.to_thread.run_sync(self._undo_target, host)
            await anyio.to_thread.run_sync(_remove_marker, host)

    def _workdir(self) -> str:
        return os.path.abspath(os.path.expanduser(str(self._sandbox.working_directory)))

    def _check_target(self, host: str, digest: str, target: str | None) -> str | None:
        """Why ``host`` cannot be mounted on (a message), ``"reuse"`` for our own symlink that
        still points at ``target`` (the configured directory of a symlink mount), or None
        when it is free (a stale mount, or our own symlink pointing elsewhere, is removed).

        The mount point's parents are opened one by one below the working directory without
        following symlinks, and created where missing, so an agent that replaced one with a
        symlink cannot make this process create or mount anything outside.
        """
        from ..mounts import cleanup_stale_mount, is_mounted

        try:
            parent, name = _open_parent(self._workdir(), host, create=True)
        except _PathRefused as exc:
            return str(exc)
        try:
            marker = _read_marker(host)
            ours = marker is not None and marker[0] == host
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(info.st_mode):
                if not ours:
                    return (
                        f"Cannot mount at {host}: path is already occupied by an existing mount or "
                        "symlink that was not created by this sandbox. Remove it or choose another mount path."
                    )
                # Reused only while it still points where the configuration says: the agent
                # can re-point a link in its working directory, never the configuration.
                assert marker is not None
                if target is not None and marker[1] == digest and os.readlink(name, dir_fd=parent) == target:
                    return "reuse"
                os.unlink(name, dir_fd=parent)
                return None
            if is_mounted(host):
                try:
                    if cleanup_stale_mount(host):
                        return None
                except Exception:
                    pass
                return (
                    f"Cannot mount at {host}: path is already occupied by an existing mount or "
                    "symlink that was not created by this sandbox. Unmount it or choose another mount path."
                )
            if stat.S_ISDIR(info.st_mode):
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                try:
                    if os.listdir(fd):
                        return (
                            f"Cannot mount at {host}: directory exists and is not empty. "
                            "Empty it or choose another mount path."
                        )
                finally:
                    os.close(fd)
                return None
            return f"Cannot mount at {host}: a file exists at that path. Remove it or choose another mount path."
        finally:
            os.close(parent)

    def _make_symlink(self, host: str, target: str) -> None:
        parent, name = _open_parent(self._workdir(), host, create=True)
        try:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    os.rmdir(name, dir_fd=parent)  # checked empty
            os.symlink(target, name, target_is_directory=True, dir_fd=parent)
        finally:
            os.close(parent)

    def _undo_target(self, host: str) -> None:
        """Remove our symlink, or the empty directory we mounted on; nothing when a parent
        is no longer the directory it was (a symlink: whatever it points at is not ours)."""
        from ..mounts import is_mounted

        try:
            parent, name = _open_parent(self._workdir(), host, create=False)
        except (_PathRefused, OSError):
            return
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                os.unlink(name, dir_fd=parent)
            elif stat.S_ISDIR(info.st_mode) and not is_mounted(host):
                os.rmdir(name, dir_fd=parent)  # only the empty directory we mounted on
        except OSError:
            pass
        finally:
            os.close(parent)

    def _mount_point(self, host: str) -> tuple[int, int]:
        """Create the mount point's directory below the working directory (never through a
        symlink) and return its ``(st_dev, st_ino)``."""
        parent, name = _open_parent(self._workdir(), host, create=True)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent)
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise _PathRefused(f"Cannot mount at {host}: it is not a directory ({exc.strerror})") from exc
            try:
                info = os.fstat(fd)
            finally:
                os.close(fd)
            return info.st_dev, info.st_ino
        finally:
            os.close(parent)

    def _verify_mount_point(self, host: str, identity: tuple[int, int]) -> None:
        """Just before mounting by path: ``host`` must still resolve, symlink-free, to the
        directory :meth:`_mount_point` made (an agent may have swapped a parent since)."""
        parent, name = _open_parent(self._workdir(), host, create=False)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            try:
                info = os.fstat(fd)
            finally:
                os.close(fd)
        finally:
            os.close(parent)
        if (info.st_dev, info.st_ino) != identity or os.path.realpath(host) != self._expected_real_path(host):
            raise _PathRefused(f"Cannot mount at {host}: the path changed while it was being mounted")

    def _expected_real_path(self, host: str) -> str:
        workdir = self._workdir()
        return os.path.join(os.path.realpath(workdir), os.path.relpath(host, workdir))

    def _landed(self, host: str) -> bool:
        from ..mounts import is_mounted

        return is_mounted(host) and os.path.realpath(host) == self._expected_real_path(host)

    async def _fuse_mount(self, filesystem: WorkspaceFilesystem, host: str) -> Mount | ProcessMount:
        from ..mounts import Mount, ProcessMount, recipe_for

        # A window stays open between the check and the mount, and it is not short. The
        # check works on descriptors, but the mount is made by path, by libfuse in
        # ``handle.start`` (in this process for a Mount, in a child it starts for a
        # ProcessMount, where the mount comes after that child's start-up: about 0.6 s from
        # the check to the check after, measured on a 2-core VM). If a parent of ``host`` is
        # swapped for a symlink in that time, the kernel mounts the configured filesystem on
        # a directory of the same name wherever the link points (as root, any directory; as
        # another user, fusermount3 mounts only on a directory that user may write). It stays
        # there until ``_landed`` below sees this and unmounts it. Only a process that runs
        # during the mount can do the swap. Of this sandbox's, that means a command already
        # running when ``mount()`` is called later on: the mounts of ``start()`` come before
        # its first command, and stop() killed the earlier ones.
        # What the agent gets is the configured filesystem showing at an outside path for
        # that moment. It never gets its own data there, nor write access it did not have.
        # To close the window, the mount would have to be made on the checked directory
        # itself, for example on ``/proc/self/fd/N`` of its descriptor in the process that
        # mounts, or by ``move_mount`` of a detached mount onto that descriptor. Both are
        # changes to ``agentvfs.mounts``, whose handles identify their mount by its path.
        identity = await anyio.to_thread.run_sync(self._mount_point, host)
        await anyio.to_thread.run_sync(self._verify_mount_point, host, identity)
        handle: Mount | ProcessMount
        if recipe_for(filesystem) is not None:
            # A filesystem that can be rebuilt is served by a process of its own: any number
            # of mounts, and the FUSE server never competes with this process for the GIL.
            handle = ProcessMount(filesystem, host)
        else:
            handle = Mount(filesystem, host)
        await anyio.to_thread.run_sync(handle.start)
        # The kernel resolved the path when it mounted: make sure it landed at ``host``
        # itself, not where a parent swapped in meanwhile pointed.
        if not await anyio.to_thread.run_sync(self._landed, host):
            await anyio.to_thread.run_sync(handle.close)
            raise _PathRefused(f"Cannot mount at {host}: the path changed while it was being mounted")
        return handle

    def __repr__(self) -> str:
        states = ", ".join(f"{path}: {entry.state}" for path, entry in self._entries.items())
        return f"<MountManager {{{states}}}>"


@dataclass
class _Live:
    kind: Literal["fuse", "symlink"]
    digest: str
    handle: Any = None
    target: str | None = None
    read_only: bool = False

    def alive(self) -> bool:
        if self.kind == "symlink":
            return self.target is not None and os.path.isdir(self.target)
        return bool(getattr(self.handle, "mounted", False))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _PathRefused(Exception):
    """A mount point's path leaves the working directory (a symlink or a file in the way)."""


def _open_parent(workdir: str, host: str, *, create: bool) -> tuple[int, str]:
    """Open the directory that holds ``host`` (a path below ``workdir``) one component at a
    time from a descriptor of ``workdir``, never following a symlink, creating missing
    directories with ``create``; returns ``(descriptor, final name)``.

    Raises
    ------
    _PathRefused
        A component is a symlink or not a directory, or ``host`` is not below ``workdir``.
    FileNotFoundError
        A component is missing and ``create`` is false.
    """
    relative = os.path.relpath(host, workdir)
    segments = relative.split(os.sep)
    if relative.startswith("..") or os.path.isabs(relative) or not segments or "" in segments:
        raise _PathRefused(f"Cannot mount at {host}: not below the working directory {workdir}")
    if create:
        # The working directory itself is configuration, not the agent's: made as given.
        os.makedirs(workdir, exist_ok=True)
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = workdir
        for name in segments[:-1]:
            walked = os.path.join(walked, name)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _PathRefused(f"Cannot mount at {host}: {walked} is not a directory ({exc.strerror})") from exc
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _PathRefused(
                        f"Cannot mount at {host}: {walked} is a symlink or not a directory; "
                        "mount points are created only below the working directory itself"
                    ) from exc
                raise
            os.close(fd)
            fd = child
        return fd, segments[-1]
    except BaseException:
        os.close(fd)
        raise


def markers_directory() -> str:
    """Where mount markers are kept: a directory of this user's in the system's temporary
    directory, outside every sandbox's working directory (and hidden, an empty read-only
    directory over it, in every isolated command that a bind would show it to).

    Raises
    ------
    OSError
        The directory is not this user's own, or is a symlink (another user planted it).
    """
    path = os.path.join(tempfile.gettempdir(), f".agentvfs-mounts-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o022:
        raise PermissionError(
            errno.EPERM, f"{path} is not a private directory of this user; remove it so it can be recreated"
        )
    return path


def _marker_path(host: str) -> str:
    return os.path.join(markers_directory(), marker_filename(host))


def _read_marker(host: str) -> tuple[str, str] | None:
    try:
        fd = os.open(_marker_path(host), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8") as f:
        return parse_marker_content(f.read(4096))


def _write_marker(host: str, digest: str) -> None:
    path = _marker_path(host)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{host}|{digest}")
    os.replace(tmp, path)


def _remove_marker(host: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_marker_path(host))
