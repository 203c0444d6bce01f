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
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread

from .._aio import maybe_await as _maybe_await
from ..errors import MountToolNotFoundError
from ..vfs import LocalFilesystem, WorkspaceFilesystem

if TYPE_CHECKING:
    from ..mounts._child import ProcessMount
    from ..mounts._server import Mount

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


def _markers_dir() -> str:
    return os.path.join(tempfile.gettempdir(), ".agentvfs-mounts")



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
        refusal = await anyio.to_thread.run_sync(self._check_target, host, digest, symlink)
        if refusal == "reuse":
            target = await anyio.to_thread.run_sync(os.path.realpath, host)
            self._live[host] = _Live("symlink", digest, target=target, read_only=False)
            return {"success": True}
        if refusal is not None:
            return {"success": False, "error": refusal}
        try:
            if symlink:
                assert isinstance(filesystem, LocalFilesystem)
                await anyio.to_thread.run_sync(self._make_symlink, host, filesystem.base_path)
                self._live[host] = _Live("symlink", digest, target=filesystem.base_path, read_only=False)
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

    @staticmethod
    def _check_target(host: str, digest: str, symlink: bool) -> str | None:
        """Why ``host`` cannot be mounted on (a message), ``"reuse"`` for our own matching
        symlink, or None when it is free (a stale mount or our own old symlink is removed)."""
        from ..mounts import cleanup_stale_mount, is_mounted

        marker = _read_marker(host)
        ours = marker is not None and marker[0] == host
        if os.path.islink(host):
            if not ours:
                return (
                    f"Cannot mount at {host}: path is already occupied by an existing mount or "
                    "symlink that was not created by this sandbox. Remove it or choose another mount path."
                )
            if symlink and marker is not None and marker[1] == digest and os.path.exists(host):
                return "reuse"
            os.unlink(host)
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
        if os.path.isdir(host):
            if os.listdir(host):
                return (
                    f"Cannot mount at {host}: directory exists and is not empty. "
                    "Empty it or choose another mount path."
                )
            return None
        if os.path.lexists(host):
            return f"Cannot mount at {host}: a file exists at that path. Remove it or choose another mount path."
        return None

    @staticmethod
    def _make_symlink(host: str, target: str) -> None:
        os.makedirs(os.path.dirname(host), exist_ok=True)
        if os.path.isdir(host) and not os.path.islink(host):
            os.rmdir(host)  # checked empty
        os.symlink(target, host, target_is_directory=True)

    @staticmethod
    def _undo_target(host: str) -> None:
        from ..mounts import is_mounted

        if os.path.islink(host):
            os.unlink(host)
        elif os.path.isdir(host) and not is_mounted(host):
            with contextlib.suppress(OSError):
                os.rmdir(host)  # only the empty directory we mounted on

    async def _fuse_mount(self, filesystem: WorkspaceFilesystem, host: str) -> Mount | ProcessMount:
        from ..mounts._child import ProcessMount, recipe_for
        from ..mounts._server import Mount

        await anyio.to_thread.run_sync(lambda: os.makedirs(host, exist_ok=True))
        handle: Mount | ProcessMount
        if recipe_for(filesystem) is not None:
            # A filesystem that can be rebuilt is served by a process of its own: any number
            # of mounts, and the FUSE server never competes with this process for the GIL.
            handle = ProcessMount(filesystem, host)
        else:
            handle = Mount(filesystem, host)
        await anyio.to_thread.run_sync(handle.start)
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


def _marker_path(host: str) -> str:
    return os.path.join(_markers_dir(), marker_filename(host))


def _read_marker(host: str) -> tuple[str, str] | None:
    try:
        with open(_marker_path(host), encoding="utf-8") as f:
            return parse_marker_content(f.read())
    except OSError:
        return None


def _write_marker(host: str, digest: str) -> None:
    os.makedirs(_markers_dir(), exist_ok=True)
    path = _marker_path(host)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{host}|{digest}")
    os.replace(tmp, path)


def _remove_marker(host: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_marker_path(host))

