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

The state a sandbox keeps on the host (the egress proxy's socket, its device nodes) lives in a
private directory of the system's temporary directory, outside everything the sandbox can
write; if a writable bind covers it anyway (``read_write_paths=["/tmp"]``), it is bound
read-only on top.

When this process is root, the sandbox's user is the host's root to the kernel (see
:mod:`._isolation`), and so the owner of the host's device nodes that bubblewrap binds into
``/dev``: ``chmod 0 /dev/null`` inside would change the host's. Each such sandbox gets nodes
of its own instead (null, zero, full, random, urandom, tty: the host's device numbers), made
in its state directory and owned by nobody, so a command can use them and change neither
them nor the host's. Where the temporary directory's filesystem refuses device nodes
(``nodev``), the host's are used and a warning says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shlex
import shutil
import stat
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

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

# The device nodes bubblewrap's --dev binds from the host, and the owner of the sandbox's own:
# the kernel's overflow uid, mapped to nothing in the sandbox's user namespace, so that the
# sandbox's user (the host's root, but without CAP_FOWNER) is not their owner.
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_NOBODY = 65534

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
        self.state_directory: str | None = None
        self.devices: dict[str, str] | None = None
        self._remove_state: weakref.finalize[Any, Any] | None = None
        self._drop_cgroup: weakref.finalize[Any, Any] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Create what commands share: the state directory, the cgroup, the egress proxy.

        Raises
        ------
        OSError
            The egress proxy cannot listen (a cgroup that cannot be made only means rlimits).
        """
        if self.state_directory is None:
            self.state_directory = tempfile.mkdtemp(prefix=f"agentvfs-{_safe(self.name)}-")
            # Removed at close, or when the launcher is collected or the interpreter exits.
            self._remove_state = weakref.finalize(self, shutil.rmtree, self.state_directory, True)
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
            self.devices = _private_devices(os.path.join(self.state_directory, "dev"))
            if self.devices is None:
                self._warn_once(
                    "devices",
                    "sandbox %s: %s refuses device nodes (nodev); commands get the host's own "
                    "/dev/null and the like, which they can chmod (they run as the host's root)",
                    self.name,
                    tempfile.gettempdir(),
                )
        patterns = self.config.get("allowed_hosts")
        if self.isolation == "bwrap" and patterns is not None and self.proxy is None:
            proxy_dir = os.path.join(self.state_directory, "egress")
            os.makedirs(proxy_dir, mode=0o700, exist_ok=True)
            proxy = EgressProxy(proxy_dir, patterns, name=self.name)
            proxy.start()
            self.proxy = proxy

    def kill_all(self) -> None:
        """Kill every process still in the sandbox's cgroup (``stop()``, interpreter exit)."""
        cgroup = self.cgroup
        if cgroup is not None and not cgroup.kill():
            _log.warning("sandbox %s: processes kept appearing in %s while it was killed", self.name, cgroup.directories)

    def close(self) -> None:
        """Kill what is left, remove the cgroup, stop the proxy, remove the state directory."""
        self.kill_all()
        self.cgroup = None
        if self._drop_cgroup is not None:
            self._drop_cgroup()
            self._drop_cgroup = None
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            proxy.close()
        self.state_directory = None
        self.devices = None
        if self._remove_state is not None:
            self._remove_state()
            self._remove_state = None

    def protected_paths(self) -> list[str]:
        """Host-side state the sandbox must not change."""
        return [self.state_directory] if self.state_directory is not None else []

    # -- commands ---------------------------------------------------------------------------

    def launch(
        self,
        command: str,
        *,
        cwd: str,
        working_directory: str,
        binds: Sequence[tuple[str, bool]] = (),
        protect: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> LaunchPlan:
        """The plan that runs ``command`` in ``cwd`` (with ``env``, the command's variables:
        see :func:`~._isolation.host_unsafe_variable`).

        Raises
        ------
        OSError
            The command's cgroup cannot be created.
        """
        group = self.cgroup.command(self.limits) if self.cgroup is not None else None
        try:
            if self.isolation == "bwrap":
                return self._bwrap(command, cwd, working_directory, binds, protect, group, env or {})
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
        fds: list[int] = []
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
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        proxy = self.proxy
        unsafe = {name: value for name, value in env.items() if host_unsafe_variable(name)}
        shielded = list(protect) + self.protected_paths()
        writable = [working_directory] if not self.config.get("read_only") else []
        writable += list(self.config.get("read_write_paths", ()))
        writable += [path for path, rw in binds if rw]
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
            proxy_directory=proxy.directory if proxy is not None else None,
            protect=[p for p in shielded if _covered(p, writable)],
            devices=self.devices,
            setenv=unsafe,
        )

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

        return LaunchPlan(
            argv,
            env=proxy_environment(PROXY_PORT) if proxy is not None else {},
            pass_fds=(seccomp_r, info_w, block_r),
            gate=gate,
            withheld=frozenset(unsafe),
            cgroup=group,
            cleanup=group.remove if group is not None else None,
        )

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


def _private_devices(directory: str) -> dict[str, str] | None:
    """Make the sandbox's own device nodes in ``directory`` (see the module docstring):
    ``{"null": path, ...}``, or None where they cannot be made or used (the directory's
    filesystem is mounted ``nodev``; then nothing is left behind)."""
    made: dict[str, str] = {}
    try:
        os.mkdir(directory, 0o755)
        for name in _DEVICES:
            try:
                host = os.stat(f"/dev/{name}")
            except OSError:
                continue
            if not stat.S_ISCHR(host.st_mode):
                continue
            path = os.path.join(directory, name)
            os.mknod(path, stat.S_IFCHR | 0o666, host.st_rdev)
            os.chmod(path, 0o666)  # whatever the umask took away
            os.chown(path, _NOBODY, _NOBODY)
            made[name] = path
        if "null" in made:
            # A node on a nodev filesystem exists but cannot be opened: try the harmless one.
            fd = os.open(made["null"], os.O_WRONLY | os.O_CLOEXEC)
            os.close(fd)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return made


def _drop(cgroup: SandboxCgroup) -> None:
    cgroup.kill()
    cgroup.remove()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
