"""``LocalSandbox``: shell commands on this machine, optionally isolated by bubblewrap."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._aio import maybe_await as _maybe_await
from ..errors import SandboxError, SandboxNotReadyError
from ..vfs import new_id
from ._isolation import (
    check_isolation,
    detect_isolation,
    normalize_native_sandbox,
)
from ._launch import Launcher
from ._loop import OutputCallback
from ._mounts import MountManager
from ._processes import AbortSignal, LaunchPlan, LocalProcessManager
from ._records import CommandResult

if TYPE_CHECKING:
    from .._context import RequestContext
    from ..vfs import WorkspaceFilesystem

__all__ = ["LocalSandbox", "shell_quote"]

_log = logging.getLogger("agentvfs.sandbox")

#: Output :meth:`LocalSandbox.execute_command` keeps per stream unless told otherwise.
COMMAND_RETAINED_BYTES = 8 << 20

#: Arguments that need no quotes (matched whole: ``$`` alone would let a trailing newline,
#: and the command after it, through unquoted).
_SAFE_ARG = re.compile(r"[A-Za-z0-9._\-/=:@]+")

#: A lifecycle hook: ``fn(ctx)``, sync or async; ``ctx`` has ``"sandbox"`` (and ``"outcome"``
#: for ``on_start``: ``"connected"`` or ``"created"``).
LifecycleHook = Callable[[dict[str, Any]], Any]


def shell_quote(arg: str) -> str:
    """Quote one argument for ``sh``: unchanged if it is only ``[A-Za-z0-9._-/=:@]``,
    otherwise in single quotes with ``'`` written as ``'\\''``.

    >>> shell_quote("it's")
    "'it'\\\\''s'"
    """
    if _SAFE_ARG.fullmatch(arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"



class LocalSandbox:
    """Runs an agent's shell commands on this machine, in a working directory.

    Commands run through ``sh -c`` with only ``PATH`` taken from this process's environment
    (plus ``env``), each in a process group of its own, under per-command resource limits.

    ``isolation="none"`` (the default, as in the reference) **isolates nothing**: a command runs
    as this process's user, with this user's access to every file, the network, other
    processes and this process's own environment (``cat /proc/$PPID/environ`` shows its
    secrets); only the resource limits and the cleanup at :meth:`stop` apply. A WARNING is
    logged when such a sandbox starts. Use it for trusted commands only.

    ``isolation="bwrap"`` runs each command inside bubblewrap without privilege (see
    :mod:`agentvfs.sandbox._isolation`): its own user namespace as an ordinary user, no
    capabilities, a seccomp filter, no nested namespaces; it writes only to the working
    directory (and ``/tmp``, private to it, and ``read_write_paths``), sees no host network
    unless ``allow_network`` (or only ``allowed_hosts`` through a proxy), none of the host's
    processes and no host environment.

    **Run as root**, a bwrap command's user (uid 1000 inside, or 0 with ``run_as_root``) is
    the host's root to the kernel (kuid 0), though without any capability: bubblewrap's user
    namespace maps it to the uid that made the namespace. It is not a separate host user,
    because the host process and the commands edit the same files. The files this process
    writes are root's with mode 0644, and a command running as another host uid could read
    them but not change them. What the kernel grants by uid alone is covered where it reaches
    the host: ``/proc`` is read-only (no sysctl such as ``kernel.core_pattern``, no ``chmod``
    of an entry) and its root-only files cannot be opened; ``/dev`` holds nodes of the
    sandbox's own, kept where no other sandbox can reach them (see
    :mod:`agentvfs.sandbox._devices`); set-ID modes and file capabilities are refused. What
    remains:

    * files a command creates in the working directory, the ``read_write_paths`` and
      read-write mounts are owned by root on the host (never set-user-ID, set-group-ID or
      with a file capability), and it may change, ``chmod`` or delete every root-owned file
      there, as this process may;
    * every file bound into the sandbox (the system directories, ``/opt``, this Python, the
      ``read_only_paths``) is readable whatever its mode, as it is to root. The host's TLS keys
      in ``/etc/ssl/private`` are hidden, but a root-only file elsewhere in those paths is
      not protected by its mode;
    * with ``allow_network=True`` the command shares the host's network namespace: a host
      service on an abstract unix socket that trusts its peer's uid (``SO_PEERCRED``) sees
      root;
    * ``max_processes`` holds only through a pids cgroup (the kernel exempts root from
      ``RLIMIT_NPROC``; a warning says so).

    Running this process as an ordinary user removes all of this: the commands are then that
    user, to the kernel too.

    The sandbox starts on the first command (or :meth:`start`): status ``pending`` ->
    ``starting`` -> ``running``. :meth:`stop` kills its processes -- all of them, also those
    that left their process group or session (``setsid``, double forks): bubblewrap's PID
    namespace, the sandbox's cgroup, or a subreaper supervisor per command when there is no
    cgroup -- and unmounts its mounts (a later command starts it again); :meth:`destroy` does
    the same for good. Files in the working directory are never deleted.

    Parameters
    ----------
    id : str, optional
        Default ``local-sandbox-<base36 ms timestamp>-<6 random [a-z0-9]>``.
    working_directory : str, optional
        Where commands run; ``~`` is expanded, a relative path stays relative (to the
        current directory at each command). Default ``<current directory>/.sandbox``.
    env : mapping, optional
        Variables for every command.
    timeout : float, optional
        Kept as ``self.timeout`` for callers (milliseconds); commands are not limited by it.
    isolation : {"none", "bwrap"}
        ``"bwrap"`` runs commands inside bubblewrap (Linux).
    native_sandbox : mapping, optional
        Options, checked when the sandbox is made (an unknown key or a bad value is a
        ``ValueError`` naming it). With bwrap: ``allow_network`` (False),
        ``allowed_hosts`` (None: no network; a list of host patterns such as
        ``["example.org", "*.internal", "api.test:8443"]`` reached through an HTTP(S) proxy,
        see :mod:`agentvfs.sandbox._egress`), ``read_only_paths``, ``read_write_paths``,
        ``allow_system_binaries`` (True: this Python's install and ``/opt``, ``/snap`` are
        visible), ``bwrap_args`` (replace bwrap's namespaces and binds; the capability drop
        and the seccomp filter stay), ``read_only`` (the working directory is read-only
        too), ``run_as_root`` (False: uid 0 inside the user namespace, still without
        capabilities). In both modes, per command: ``max_memory_bytes`` (4 GiB),
        ``max_processes`` (1024, threads count), ``max_cpu_seconds`` (3600, per process),
        ``max_file_size_bytes`` (8 GiB); None lifts a limit (see
        :mod:`agentvfs.sandbox._limits`). ``max_disk_bytes`` (None) bounds what a bwrap
        command can store: its ``/tmp`` and ``/dev/shm`` hold at most that much each; a host
        path it writes (the working directory, ``read_write_paths``) only where that path's
        filesystem holds no more (a filesystem of its own, a project quota). A WARNING
        at start names each path it cannot bound, and says it is not enforced at all
        without isolation.
    instructions : str or callable, optional
        Replaces :meth:`get_instructions`'s text (an empty string suppresses it); a
        function receives ``{"default_instructions", "request_context"}``.
    on_start, on_stop, on_destroy : callable, optional
        Lifecycle hooks, ``fn(ctx)`` (see :data:`LifecycleHook`). A failing ``on_start``
        puts the sandbox in status ``error``.

    Raises
    ------
    IsolationUnavailableError
        ``isolation`` cannot be used here (bwrap missing or not working, seatbelt, or an
        unknown name).
    ValueError
        An unknown or invalid ``native_sandbox`` option.
    """

    name = "LocalSandbox"
    provider = "local"

    def __init__(
        self,
        *,
        id: str | None = None,
        working_directory: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        isolation: str = "none",
        native_sandbox: Mapping[str, Any] | None = None,
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        on_start: LifecycleHook | None = None,
        on_stop: LifecycleHook | None = None,
        on_destroy: LifecycleHook | None = None,
    ) -> None:
        self.id = id or new_id("local-sandbox")
        if working_directory is None:
            self.working_directory = os.path.join(os.getcwd(), ".sandbox")
        else:
            self.working_directory = os.path.expanduser(os.fspath(working_directory))
        self._env: dict[str, str] = dict(env or {})
        self.timeout = timeout
        self.native_sandbox = normalize_native_sandbox(native_sandbox)
        self.isolation = check_isolation(isolation)
        if self.isolation == "none" and self.native_sandbox["allowed_hosts"] is not None:
            raise ValueError(
                "native_sandbox['allowed_hosts'] needs isolation='bwrap': without isolation a "
                "command reaches the network directly and no allow-list can hold"
            )
        self._launcher = Launcher(self.id, self.isolation, self.native_sandbox)
        self._instructions = instructions
        self._on_start = on_start
        self._on_stop = on_stop
        self._on_destroy = on_destroy
        self.status = "pending"
        self.created_at = datetime.now(UTC)
        self.last_used_at: datetime | None = None
        self.processes = LocalProcessManager()
        self.processes.sandbox = self
        self.processes.on_kill_all = self._launcher.kill_all
        self.mounts = MountManager(self)
        self._protected: list[str] = []
        self._starting: anyio.Event | None = None
        self._start_error: BaseException | None = None
        self._stopping: anyio.Event | None = None
        self._destroying: anyio.Event | None = None
        self._destroy_error: BaseException | None = None

    # -- environment and isolation ---------------------------------------------------------------

    def get_env(self) -> dict[str, str]:
        """A copy of the variables given to every command."""
        return dict(self._env)

    def set_env(
        self, updater: Mapping[str, str | None] | Callable[[dict[str, str]], Mapping[str, str]]
    ) -> None:
        """Change the variables given to every command.

        Parameters
        ----------
        updater : mapping or callable
            A mapping is merged in (a None value removes the variable); a function receives
            a copy of the current variables and returns the new ones.
        """
        if callable(updater):
            self._env = {str(k): str(v) for k, v in updater(self.get_env()).items()}
            return
        for key, value in updater.items():
            if value is None:
                self._env.pop(key, None)
            else:
                self._env[key] = str(value)

    def launch(
        self, command: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> LaunchPlan:
        """How to start ``command`` here: the argument vector (``bwrap ... -- sh -c`` with
        isolation; a shim or supervisor that applies the limits without), the descriptors
        and environment it needs, and its cgroup. Used by the process manager; every plan
        must be started or given up with :meth:`~._processes.LaunchPlan.abandon`. ``env``
        is the command's environment: with isolation, the variables that would act on
        bubblewrap itself on the host (``LD_PRELOAD``, ...) go in through its arguments and
        are withheld from its own environment.

        Raises
        ------
        OSError
            The command's cgroup cannot be created.
        """
        workdir = os.path.abspath(self.working_directory)
        return self._launcher.launch(
            command,
            cwd=cwd or workdir,
            working_directory=workdir,
            binds=self.mounts.isolation_binds(),
            protect=self._protected,
            hidden=self.mounts.protected_paths(),
            env=env,
        )

    def protect_path(self, path: str | os.PathLike[str]) -> None:
        """Keep the host's own state at ``path`` out of the commands' reach: with isolation
        it is bound read-only into every command started from now on (it must exist, and
        lies typically in the working directory, e.g. the default search index). Without
        isolation nothing is protected (``"none"`` isolates nothing)."""
        where = os.path.abspath(os.fspath(path))
        if where not in self._protected:
            self._protected.append(where)

    @staticmethod
    def detect_isolation() -> dict[str, Any]:
        """Describe the isolation available here: ``{"backend", "available", "message"}``.

        On Linux the backend is ``"bwrap"`` when the bubblewrap binary exists and works
        (checked once per process); otherwise ``"none"`` with the reason in ``message``.
        """
        return detect_isolation()

    # -- lifecycle -------------------------------------------------------------------------------

    def _acquire(self) -> str:
        existed = os.path.isdir(self.working_directory)
        os.makedirs(self.working_directory, exist_ok=True)
        self._launcher.open(os.path.abspath(self.working_directory))
        if self.isolation == "none":
            _log.warning(
                "sandbox %s runs commands WITHOUT ISOLATION (isolation='none'): they can read, "
                "change and delete whatever this user can, reach the network and other "
                "processes, and read this process's environment through /proc. Use "
                "isolation='bwrap' to isolate them.",
                self.id,
            )
        return "connected" if existed else "created"

    async def start(self) -> None:
        """Start the sandbox: create the working directory, run ``on_start``, mount the
        pending mounts (their failures only show in ``mounts.entries``).

        Concurrent calls share one start; a running sandbox returns at once.

        Raises
        ------
        SandboxError
            The sandbox was destroyed, or ``on_start`` failed (status ``error``).
        OSError
            The working directory cannot be created (status ``error``).
        """
        if self.status == "running":
            return
        if self._stopping is not None:
            await self._stopping.wait()
        if self._destroying is not None:
            await self._destroying.wait()
        if self.status == "destroyed":
            raise SandboxError("Cannot start a destroyed sandbox", "NOT_READY", {"id": self.id})
        if self._starting is not None:
            await self._starting.wait()
            if self.status != "running":
                if self._start_error is not None:
                    raise self._start_error
                raise SandboxNotReadyError(self.id)
            return
        done = self._starting = anyio.Event()
        previous = self.status
        self._start_error = None
        self.status = "starting"
        try:
            outcome = await anyio.to_thread.run_sync(self._acquire)
            self.status = "running"
            if self._on_start is not None:
                try:
                    await _maybe_await(self._on_start({"sandbox": self, "outcome": outcome}))
                except Exception as exc:
                    raise SandboxError(
                        f"Sandbox '{self.id}' onStart hook failed: {exc}",
                        "START_FAILED",
                        {"id": self.id},
                    ) from exc
            try:
                await self.mounts.process_pending()
            except Exception:
                _log.warning(
                    "Unexpected error processing pending mounts of sandbox %s",
                    self.id,
                    exc_info=True,
                )
        except Exception as exc:
            self.status = "error"
            self._start_error = exc
            raise
        except BaseException:
            # Cancelled: a sandbox that got as far as running stays running.
            if self.status == "starting":
                self.status = previous
            raise
        finally:
            self._starting = None
            done.set()

    async def ensure_running(self) -> None:
        """Start the sandbox unless it runs (or is being stopped or destroyed).

        Raises
        ------
        SandboxNotReadyError
            The sandbox was destroyed, or did not reach ``running``.
        """
        if self.status == "running" or self.status in ("stopping", "destroying"):
            return
        if self.status == "destroyed":
            raise SandboxNotReadyError(self.id)
        await self.start()
        if self.status != "running":
            raise SandboxNotReadyError(self.id)

    async def _teardown(self) -> None:
        try:
            await self.processes.kill_all()
        finally:
            try:
                await self.mounts.unmount_all()
            finally:
                await anyio.to_thread.run_sync(self._launcher.close)

    async def stop(self) -> None:
        """Kill every process of the sandbox (background ones and what commands left
        running) and unmount its mounts; status ``stopped``. The next command starts the
        sandbox again. Concurrent calls share one stop.

        Raises
        ------
        Exception
            Whatever ``on_stop`` raised (the teardown still happens; status ``error``).
        """
        if self.status in ("stopped", "destroyed", "destroying"):
            return
        if self._starting is not None:
            await self._starting.wait()
        if self._stopping is not None:
            await self._stopping.wait()
            return
        done = self._stopping = anyio.Event()
        self.status = "stopping"
        try:
            try:
                if self._on_stop is not None:
                    await _maybe_await(self._on_stop({"sandbox": self}))
            finally:
                await self._teardown()
        except BaseException:
            self.status = "error"
            raise
        else:
            self.status = "stopped"
        finally:
            self._stopping = None
            done.set()

    async def destroy(self) -> None:
        """Stop for good: kill every process, unmount and forget the mounts; status
        ``destroyed``. Idempotent; concurrent calls share one destroy. Files in the working
        directory are kept.

        Raises
        ------
        Exception
            Whatever ``on_destroy`` raised (the teardown still happens; status ``error``).
        """
        if self.status == "destroyed":
            return
        if self._destroying is not None:
            await self._destroying.wait()
            if self._destroy_error is not None:
                raise self._destroy_error
            return
        done = self._destroying = anyio.Event()
        self._destroy_error = None
        try:
            if self._starting is not None:
                await self._starting.wait()
            if self._stopping is not None:
                await self._stopping.wait()
            if self.status == "pending":
                # Never started: nothing runs; mounts made directly are still undone.
                await self.mounts.unmount_all()
                self.mounts.clear()
                self.status = "destroyed"
                return
            self.status = "destroying"
            try:
                try:
                    if self._on_destroy is not None:
                        await _maybe_await(self._on_destroy({"sandbox": self}))
                finally:
                    await self._teardown()
                    self.mounts.clear()
            except BaseException as exc:
                self.status = "error"
                self._destroy_error = exc
                raise
            self.status = "destroyed"
        finally:
            self._destroying = None
            done.set()

    async def __aenter__(self) -> LocalSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    # -- commands --------------------------------------------------------------------------------

    async def execute_command(
        self,
        command: str,
        args: Sequence[str] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (milliseconds the command may run)
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        abort_signal: AbortSignal | None = None,
        max_retained_bytes: int | float = COMMAND_RETAINED_BYTES,
    ) -> CommandResult:
        """Run a command to completion and return its result.

        The command line is ``command`` followed by each of ``args`` shell-quoted (see
        :func:`shell_quote`). Standard input is empty, so ``cat`` returns at once. The first
        command starts the sandbox. If this call is cancelled, the command's process group
        is killed.

        Parameters
        ----------
        command : str
            A shell command line.
        args : sequence of str, optional
            Arguments appended, quoted.
        timeout : float, optional
            Milliseconds; then the process group gets SIGTERM and the result has
            ``exit_code`` 124, ``timed_out`` and ``killed``. None: no limit.
        env : mapping, optional
            Extra variables for this command (a None value removes one).
        cwd : str, optional
            Working directory; relative to the sandbox's working directory.
        on_stdout, on_stderr : callable, optional
            Called with each decoded chunk (sync or async) before this returns.
        abort_signal : AbortSignal, optional
            When set, the process group is killed.
        max_retained_bytes : int or math.inf
            Output kept in the result per stream (the newest UTF-8 bytes):
            :data:`COMMAND_RETAINED_BYTES` (8 MiB) by default, so a command that prints
            gigabytes costs no more memory than that (the reference keeps everything; pass
            ``math.inf`` for that). ``stdout_truncated``/``stdout_dropped_bytes`` say what
            was dropped.

        Returns
        -------
        CommandResult
            With ``command`` (the full command line) and ``args``.

        Raises
        ------
        SandboxNotReadyError
            The sandbox was destroyed.
        ValueError
            An invalid ``timeout`` or ``max_retained_bytes``.
        """
        if isinstance(args, str | bytes):
            raise TypeError("args must be a sequence of strings, not a single string")
        arg_list = [str(a) for a in args] if args is not None else []
        full = " ".join([command, *(shell_quote(a) for a in arg_list)]) if arg_list else command
        self.last_used_at = datetime.now(UTC)
        handle = await self.processes.spawn(
            full,
            cwd=cwd,
            env=env,
            timeout=timeout,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            stdin_mode="ignore",
            max_retained_bytes=max_retained_bytes,
            abort_signal=abort_signal,
        )
        try:
            result = await handle.wait()
        finally:
            # Shielded: a cancelled call must still kill its command and forget its pid.
            with anyio.CancelScope(shield=True):
                try:
                    if handle.exit_code is None:
                        await handle.kill()
                finally:
                    self.processes.release(handle.pid)
        return dataclasses.replace(result, command=full, args=tuple(arg_list))

    # -- mounts ----------------------------------------------------------------------------------

    async def mount(self, filesystem: WorkspaceFilesystem, mount_path: str) -> dict[str, Any]:
        """Mount ``filesystem`` at ``<working_directory>/<mount_path>`` (see the mount
        manager); returns ``{"success": ...}`` with ``error`` when it failed."""
        return await self.mounts.mount_filesystem(filesystem, mount_path)

    async def unmount(self, mount_path: str) -> None:
        """Undo :meth:`mount` of ``mount_path``."""
        await self.mounts.unmount_path(mount_path)

    # -- description -----------------------------------------------------------------------------

    def default_instructions(self) -> str:
        """``Local command execution. Working directory: "<working directory>".``"""
        return f'Local command execution. Working directory: "{self.working_directory}".'

    def get_instructions(self, *, request_context: RequestContext | None = None) -> str:
        """What agents should know about running commands here (``instructions`` wins)."""
        default = self.default_instructions()
        custom = self._instructions
        if custom is None:
            return default
        if isinstance(custom, str):
            return custom
        return str(custom({"default_instructions": default, "request_context": request_context}))

    async def get_info(self) -> dict[str, Any]:
        """Describe the sandbox: ``id, name, provider, status, created_at, last_used_at,
        mounts, resources, metadata`` (never secrets; ``env`` is not included)."""
        metadata: dict[str, Any] = {
            "working_directory": self.working_directory,
            "platform": sys.platform,
            "python_version": platform.python_version(),
            "isolation": self.isolation,
        }
        if self.isolation != "none":
            metadata["isolation_config"] = {
                key: [str(v) for v in value] if isinstance(value, tuple) else value
                for key, value in self.native_sandbox.items()
            }
        return {
            "id": self.id,
            "name": self.name,
            "provider": self.provider,
            "status": self.status,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "mounts": {
                path: {"state": entry.state, "error": entry.error, "config_hash": entry.config_hash}
                for path, entry in self.mounts.entries.items()
            },
            "resources": {"memory_mb": _memory_mb(), "cpu_cores": os.cpu_count()},
            "metadata": metadata,
        }

    def __repr__(self) -> str:
        return (
            f"LocalSandbox(id={self.id!r}, working_directory={self.working_directory!r}, "
            f"isolation={self.isolation!r}, status={self.status!r})"
        )


def _memory_mb() -> int | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 20))
    except (ValueError, OSError, AttributeError):
        return None
