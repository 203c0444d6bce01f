"""How a :class:`~agentvfs.sandbox.LocalSandbox` starts each command: isolation, limits and
containment put together into a :class:`~._processes.LaunchPlan`.

* ``isolation="bwrap"``: the first process is the hardened ``bwrap`` (:mod:`._isolation`). It
  reports its sandbox's first process on ``--info-fd`` and waits on ``--block-fd``; in that
  window this process sets that process's rlimits (``prlimit``) and moves it into the
  command's cgroup, so everything the command starts inherits both. ``stop()`` ends the PID
  namespace (bwrap's child dies with bwrap) and empties the cgroup.
* ``isolation="none"`` with cgroups: the command runs as ``/bin/sh -c <prefix>; <command>``,
  the prefix (on the command's first line, so the shell's line numbers stay the command's)
  entering the command's cgroup and setting the rlimits (``ulimit``) before anything of the
  command runs. ``stop()`` kills everything in the sandbox's cgroup.
* ``isolation="none"`` without cgroups: the first process is the supervisor of
  :mod:`._supervisor`, a child subreaper that takes the rlimits, runs the command and kills
  every descendant when it ends or is killed.

Nothing a sandbox keeps on the host can be reached by another sandbox, whatever paths either
may write: the egress proxy is reached through a socket pair each command inherits, never a
path (:mod:`._egress`); when this process is root, each sandbox gets device nodes of its own
(its user is the host's root to the kernel, see :mod:`._isolation`), kept in a directory that
is nobody's and hidden from every sandbox, and checked before every command
(:mod:`._devices`). The mount manager's markers are hidden the same way. Where the temporary
directory's filesystem refuses device nodes (``nodev``), the host's are used and a warning
says so.

``max_disk_bytes`` bounds what a command can store: its ``/tmp`` and ``/dev/shm`` are tmpfs of
that size (and the rest of ``/dev`` read-only). A path it may write on the host (the working
directory, ``read_write_paths``, a read-write mount's target) is bounded only by its
filesystem: where that holds more than the limit (no filesystem of its own of that size, no
project quota on the directory), the sandbox says so when it starts, naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import shlex
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ._devices import DeviceNodes, NoDeviceNodes, devices_root
from ._egress import EgressProxy, proxy_environment
from ._isolation import (
    PROXY_PORT,
    BwrapSupport,
    build_bwrap_args,
    bwrap_support,
    host_unsafe_variable,
)
from ._limits import (
    CommandCgroup,
    ResourceLimits,
    SandboxCgroup,
    apply_rlimits,
    detect_cgroups,
    shell_limits,
    user_task_count,
)
from ._processes import LaunchPlan
from ._seccomp import native_filter
from ._supervisor import supervisor_argv

__all__ = ["Launcher"]

_log = logging.getLogger("agentvfs.sandbox")

# Warnings about this machine already logged (see Launcher._warn_once).
_WARNED: set[str] = set()

# How long bubblewrap may take to report its sandbox's first process.
_INFO_TIMEOUT = 30.0

# Put in front of the command, on its first line (so the shell's line numbers in messages stay
# the command's own): enter the command's cgroups, set the limits, or stop with status 126.
_PREFIX = '{{ {steps}; }} || {{ echo "agentvfs: cannot enter the command\'s cgroup or set its limits" >&2; exit 126; }}; '


def _covered(path: str, by: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in by)


class Launcher:
    """Starts the commands of one sandbox and holds what they share on the host.

    Parameters
    ----------
    name : str
        The sandbox's id (log lines, directory names).
    isolation : str
        ``"none"`` or ``"bwrap"``.
    config : mapping
        Normalised ``native_sandbox`` options.
    """

    def __init__(self, name: str, isolation: str, config: Mapping[str, Any]) -> None:
        self.name = name
        self.isolation = isolation
        self.config = config
        self.limits = ResourceLimits.from_options(config)
        self.support: BwrapSupport | None = bwrap_support() if isolation == "bwrap" else None
        self.cgroup: SandboxCgroup | None = None
        self.proxy: EgressProxy | None = None
        self.devices: DeviceNodes | None = None
        # A directory of this launcher's own for its device nodes, when the usual one cannot
        # be used (removed at close).
        self._own_root: str | None = None
        # Writable paths whose room max_disk_bytes was already compared with.
        self._disk_checked: set[str] = set()
        self._drop_devices: weakref.finalize[Any, Any] | None = None
        self._drop_cgroup: weakref.finalize[Any, Any] | None = None
        # Held while descriptors of the device nodes or the proxy are duplicated for a command,
        # and while those are replaced or closed: commands start from several threads, and
        # the duplicate of a descriptor closed meanwhile could be another file.
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    def open(self, working_directory: str | None = None) -> None:
        """Create what commands share: the cgroup, the device nodes, the egress proxy; and
        say where ``max_disk_bytes`` cannot hold.

        Parameters
        ----------
        working_directory : str, optional
            The sandbox's working directory (absolute), one of the paths it writes.

        Raises
        ------
        OSError
            The egress proxy cannot be started (a cgroup that cannot be made only means
            rlimits; device nodes that cannot be made, the host's with a warning).
        """
        if self.cgroup is None:
            support, reason = detect_cgroups()
            if support is not None:
                try:
                    self.cgroup = SandboxCgroup(support)
                    # A sandbox dropped without stop() (or the interpreter ending) takes its
                    # processes and cgroup with it; stop() does it earlier.
                    self._drop_cgroup = weakref.finalize(self, _drop, self.cgroup)
                except OSError as exc:
                    reason = f"cannot create the sandbox's cgroup: {exc.strerror or exc}"
            if self.cgroup is None:
                self._warn_once(
                    f"cgroup-{self.isolation}",
                    "sandbox %s: no cgroups (%s); limits are per-process rlimits and "
                    + ("the PID namespace" if self.isolation == "bwrap" else "a supervisor per command")
                    + " keeps processes from outliving stop()",
                    self.name,
                    reason,
                )
        if self.isolation == "bwrap" and self.devices is None and os.geteuid() == 0:
            self._make_devices()
        patterns = self.config.get("allowed_hosts")
        if self.isolation == "bwrap" and patterns is not None and self.proxy is None:
            proxy = EgressProxy(patterns, name=self.name)
            proxy.start()
            self.proxy = proxy
        self._check_disk(self._writable(working_directory), start=True)

    def _make_devices(self) -> DeviceNodes | None:
        """Make the sandbox's device nodes (see :mod:`._devices`), or warn why there are none."""
        try:
            try:
                devices = DeviceNodes.make()
            except PermissionError as exc:
                # Someone else's directory where ours belongs: one of this launcher's own,
                # which only this process's sandboxes hide, until it is removed.
                root = tempfile.mkdtemp(prefix=".agentvfs-devices-")
                _log.warning(
                    "sandbox %s: cannot keep device nodes in %s (%s; remove it so it can be made "
                    "again); keeping them in %s, which only this process's sandboxes hide",
                    self.name,
                    devices_root(),
                    exc.strerror,
                    root,
                )
                try:
                    devices = DeviceNodes.make(root)
                except BaseException:
                    os.rmdir(root)
                    raise
                self._own_root = root
        except OSError as exc:
            reason = (
                f"{tempfile.gettempdir()} refuses device nodes (nodev)"
                if isinstance(exc, NoDeviceNodes)
                else f"device nodes cannot be made ({exc.strerror or exc})"
            )
            self._warn_once(
                "devices",
                "sandbox %s: %s; commands get the host's own /dev/null and the like, which they "
                "can chmod (they run as the host's root)",
                self.name,
                reason,
            )
            return None
        self.devices = devices
        self._drop_devices = weakref.finalize(self, _drop_devices, devices, self._own_root)
        return devices

    def kill_all(self) -> None:
        """Kill every process still in the sandbox's cgroup (``stop()``, interpreter exit)."""
        cgroup = self.cgroup
        if cgroup is not None and not cgroup.kill():
            _log.warning("sandbox %s: processes kept appearing in %s while it was killed", self.name, cgroup.directories)

    def close(self) -> None:
        """Kill what is left, remove the cgroup, stop the proxy, remove the device nodes."""
        self.kill_all()
        self.cgroup = None
        if self._drop_cgroup is not None:
            self._drop_cgroup()
            self._drop_cgroup = None
        with self._lock:
            proxy, self.proxy = self.proxy, None
            if proxy is not None:
                proxy.close()
            self.devices = None
            self._own_root = None
            if self._drop_devices is not None:
                self._drop_devices()
                self._drop_devices = None

    def hidden_paths(self) -> list[str]:
        """Host directories of agentvfs's own that no command may see (see :mod:`._devices`):
        where root-run sandboxes keep their device nodes, those of other sandboxes too."""
        if os.geteuid() != 0:
            return []
        paths = [devices_root()]
        if self._own_root is not None:
            paths.append(self._own_root)
        return paths

    def _writable(self, working_directory: str | None, binds: Sequence[tuple[str, bool]] = ()) -> list[str]:
        """The host paths a command may write: the working directory (unless ``read_only``),
        ``read_write_paths`` and the read-write ``binds``."""
        paths = [working_directory] if working_directory and not self.config.get("read_only") else []
        paths += self.config.get("read_write_paths", ())
        paths += [path for path, writable in binds if writable]
        return paths

    def _check_disk(self, paths: Sequence[str], *, start: bool = False) -> None:
        """Warn about each of ``paths`` (not yet checked) that can take more than
        ``max_disk_bytes`` (see the module): once per path and sandbox."""
        limit = self.config.get("max_disk_bytes")
        if limit is None:
            return
        if self.isolation == "none" or self.config.get("bwrap_args"):
            if start:
                why = (
                    "commands without isolation write wherever this user can; use isolation='bwrap'"
                    if self.isolation == "none"
                    else "custom bwrap_args decide what commands can write"
                )
                _log.warning("sandbox %s: max_disk_bytes is not enforced: %s", self.name, why)
            return
        with self._lock:
            paths = [path for path in paths if path not in self._disk_checked]
            self._disk_checked.update(paths)
        unbounded: list[str] = []
        for path in paths:
            try:
                info = os.statvfs(path)
            except OSError:
                continue  # bubblewrap says it when it binds the path
            size = info.f_blocks * info.f_frsize
            if size > limit:
                unbounded.append(f"{path} (a filesystem of {_gib(size)})")
        if unbounded:
            _log.warning(
                "sandbox %s: max_disk_bytes=%d bounds each command's /tmp and /dev/shm, but not %s, "
                "which its commands can fill. To bound such a path, give it a filesystem of its own "
                "of that size (mount -t tmpfs -o size=%d tmpfs <path>, or a loop-mounted image) or "
                "a project quota on the directory (XFS, or ext4 mounted with prjquota): a path "
                "whose filesystem reports no more room than the limit needs nothing more",
                self.name,
                limit,
                ", ".join(unbounded),
                limit,
            )

    # -- commands ---------------------------------------------------------------------------

    def launch(
        self,
        command: str,
        *,
        cwd: str,
        working_directory: str,
        binds: Sequence[tuple[str, bool]] = (),
        protect: Sequence[str] = (),
        hidden: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> LaunchPlan:
        """The plan that runs ``command`` in ``cwd`` (with ``env``, the command's variables:
        see :func:`~._isolation.host_unsafe_variable`). With isolation, ``protect`` is bound
        read-only and ``hidden`` (with :meth:`hidden_paths`) covered where a bind shows it.

        Raises
        ------
        OSError
            The command's cgroup cannot be created, or the sandbox's device nodes were
            changed and cannot be made again.
        PermissionError
            A path bound into the sandbox lies in a hidden directory.
        """
        group = self.cgroup.command(self.limits) if self.cgroup is not None else None
        try:
            if self.isolation == "bwrap":
                return self._bwrap(command, cwd, working_directory, binds, protect, hidden, group, env or {})
            return self._plain(command, group)
        except BaseException:
            if group is not None:
                group.remove()
            raise

    def _memory_by_rlimit(self) -> bool:
        return self.cgroup is None or not self.cgroup.support.memory

    def _pids_by_cgroup(self) -> bool:
        return self.cgroup is not None and self.cgroup.support.pids

    def _plain(self, command: str, group: CommandCgroup | None) -> LaunchPlan:
        limits = self.limits
        if group is not None:
            if limits.processes is not None and not self._pids_by_cgroup():
                self._warn_once("nproc", "sandbox %s: no pids cgroup; max_processes is not enforced", self.name)
            steps = [f"echo 0 >{shlex.quote(procs)}" for procs in group.procs_files]
            shell = shell_limits(limits, memory=self._memory_by_rlimit())
            if shell:
                steps.append(shell)
            # The same shell then runs the command: no second exec (about 0.8 ms a command).
            script = _PREFIX.format(steps=" && ".join(steps)) + command
            return LaunchPlan(["/bin/sh", "-c", script], cgroup=group, cleanup=group.remove)
        nproc = None
        if limits.processes is not None:
            if os.getuid() == 0:
                # The kernel exempts root from RLIMIT_NPROC.
                self._warn_once(
                    "nproc", "sandbox %s: running as root without cgroups, max_processes cannot be enforced", self.name
                )
            else:
                # Outside a user namespace RLIMIT_NPROC counts every task of this user.
                nproc = user_task_count() + limits.processes
        argv = supervisor_argv(
            ["/bin/sh", "-c", command],
            parent=os.getpid(),
            rlimits=limits.rlimits(memory=True, processes=nproc),
        )
        return LaunchPlan(argv, supervised=True)

    def _bwrap(
        self,
        command: str,
        cwd: str,
        working_directory: str,
        binds: Sequence[tuple[str, bool]],
        protect: Sequence[str],
        hidden: Sequence[str],
        group: CommandCgroup | None,
        env: Mapping[str, str],
    ) -> LaunchPlan:
        support = self.support
        assert support is not None
        assert support.path is not None
        limits = self.limits
        nproc = None
        if limits.processes is not None and not self._pids_by_cgroup():
            if support.user_namespace and os.getuid() != 0:
                # Counted per user namespace: the command's own processes, plus bwrap's init.
                nproc = limits.processes + 1
            else:
                self._warn_once(
                    "nproc",
                    "sandbox %s: no pids cgroup and the sandbox's user is the host's root; "
                    "max_processes cannot be enforced",
                    self.name,
                )
        rlimits = limits.rlimits(memory=self._memory_by_rlimit(), processes=nproc)
        writable = self._writable(working_directory, binds)
        self._check_disk(writable)
        fds: list[int] = []
        device_fds: dict[str, int] = {}
        proxy_fd: int | None = None
        try:
            seccomp_r, seccomp_w = os.pipe()
            fds += [seccomp_r, seccomp_w]
            os.write(seccomp_w, native_filter())
            os.close(seccomp_w)
            fds.remove(seccomp_w)
            info_r, info_w = os.pipe()
            fds += [info_r, info_w]
            block_r, block_w = os.pipe()
            fds += [block_r, block_w]
            # Duplicates for the command: the plan closes what it passes once it started.
            with self._lock:
                devices = self._checked_devices()
                for name, fd in devices.descriptors.items() if devices is not None else ():
                    device_fds[name] = os.dup(fd)
                    fds.append(device_fds[name])
                proxy = self.proxy
                if proxy is not None:
                    proxy_fd = os.dup(proxy.descriptor)
                    fds.append(proxy_fd)
            unsafe = {name: value for name, value in env.items() if host_unsafe_variable(name)}
            argv = build_bwrap_args(
                command,
                working_directory=working_directory,
                config=self.config,
                cwd=cwd,
                binds=binds,
                bwrap=support.path,
                support=support,
                seccomp_fd=seccomp_r,
                info_fd=info_w,
                block_fd=block_r,
                proxy_fd=proxy_fd,
                protect=[p for p in protect if _covered(p, writable)],
                hidden=[*hidden, *self.hidden_paths()],
                devices=devices.paths if devices is not None else None,
                device_fds=device_fds,
                setenv=unsafe,
            )
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise

        def gate(pid: int) -> None:
            # bubblewrap reports its first sandboxed process, then waits for our byte: that
            # process has not forked yet, so everything the command starts inherits both.
            try:
                child = _read_child_pid(info_r)
                if child is not None:
                    apply_rlimits(child, rlimits)
                    if group is not None:
                        group.attach(child)
                with contextlib.suppress(OSError):
                    os.write(block_w, b"1")
            finally:
                for fd in (info_r, block_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)

        inherited = (seccomp_r, info_w, block_r, *device_fds.values(), *([proxy_fd] if proxy_fd is not None else []))
        return LaunchPlan(
            argv,
            env=proxy_environment(PROXY_PORT) if proxy is not None else {},
            pass_fds=inherited,
            gate=gate,
            withheld=frozenset(unsafe),
            cgroup=group,
            cleanup=group.remove if group is not None else None,
        )

    def _checked_devices(self) -> DeviceNodes | None:
        """The sandbox's device nodes, checked as bubblewrap will reach them; made anew (with
        a warning) when anything changed them (see :mod:`._devices`). Called with the lock.

        Raises
        ------
        OSError
            They cannot be made again.
        """
        devices = self.devices
        if devices is None:
            return None
        problem = devices.verify()
        if problem is None:
            return devices
        _log.warning("sandbox %s: its device nodes were changed (%s); making them anew", self.name, problem)
        if self._drop_devices is not None:
            self._drop_devices()
            self._drop_devices = None
        self.devices = None
        self._own_root = None
        made = self._make_devices()
        if made is None:
            raise PermissionError(
                errno.EACCES, f"sandbox {self.name}: its device nodes were changed ({problem}) and cannot be made again"
            )
        return made

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        # Once per process: the condition (no cgroups, root) is the machine's, not the sandbox's.
        if key not in _WARNED:
            _WARNED.add(key)
            _log.warning(message, *args)


def _read_child_pid(fd: int) -> int | None:
    """Read bubblewrap's ``--info-fd`` JSON to its end; the ``child-pid``, or None when bwrap
    closed it without one (it failed; its error goes to the command's stderr)."""
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], _INFO_TIMEOUT)
        if not ready:
            raise TimeoutError(f"bubblewrap did not start its sandbox within {_INFO_TIMEOUT:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    if not data.strip():
        return None
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise OSError(f"bubblewrap wrote an unexpected --info-fd answer: {data[:200]!r}") from exc


def _drop(cgroup: SandboxCgroup) -> None:
    cgroup.kill()
    cgroup.remove()


def _drop_devices(devices: DeviceNodes, own_root: str | None) -> None:
    devices.close()
    if own_root is not None:
        with contextlib.suppress(OSError):
            os.rmdir(own_root)


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"
