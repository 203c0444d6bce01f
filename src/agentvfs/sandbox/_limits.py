"""Resource limits of sandbox commands, and the cgroups that hold a sandbox's processes.

Every command of a :class:`~agentvfs.sandbox.LocalSandbox` runs under four limits per process
or command (the ``native_sandbox`` options ``max_memory_bytes``, ``max_processes``,
``max_cpu_seconds`` and ``max_file_size_bytes``; None lifts one):

* **memory**: the cgroup's ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) for the whole
  command, swap included, so the kernel's OOM killer ends the process that went over; without
  a memory cgroup, ``RLIMIT_DATA`` per process, so an allocation past it fails (``MemoryError``,
  ``malloc`` returning NULL). ``RLIMIT_DATA`` counts the heap and private writable mappings,
  not reserved-but-unused address space (``RLIMIT_AS`` would break runtimes that reserve
  large regions up front, such as V8 and Go).
* **processes**: the cgroup's ``pids.max`` for the whole command (threads count); without one,
  ``RLIMIT_NPROC``, but only where it counts the command's own processes: inside bubblewrap's
  user namespace for an unprivileged user (the kernel counts tasks per user *per user
  namespace*, and the namespace is the command's alone). Where the namespace maps to the
  host's root uid the kernel does not enforce ``RLIMIT_NPROC`` at all (root is exempt), and
  without a user namespace it counts every process of the user on the host; there it is
  raised by the user's current task count (isolation ``"none"`` without cgroups) or, for
  root without cgroups, not enforced (a warning is logged).
* **CPU time**: ``RLIMIT_CPU`` per process (``SIGXCPU`` at the limit, ``SIGKILL`` two seconds
  of CPU later); the wall-clock ``timeout`` of a command is separate.
* **file size**: ``RLIMIT_FSIZE`` per process: a write past it fails with ``EFBIG`` (and
  ``SIGXFSZ``, which ends programs that do not handle it).

A fifth, ``max_disk_bytes`` (no limit by default), bounds what a bubblewrap command can store
rather than what each process does: its ``/tmp`` and ``/dev/shm`` are tmpfs of that size (the
rest of ``/dev`` read-only), and a host path it may write is bounded by that path's filesystem
alone, which the launcher compares with the limit when the sandbox starts (see
:mod:`._launch`). Without isolation nothing bounds it, and a warning says so.

Cgroups are used where this process may create them: as root, or in a delegated subtree. The
unified (v2) hierarchy is preferred when it has the ``memory`` and ``pids`` controllers;
otherwise the v1 ``pids`` and ``memory`` hierarchies. Each sandbox gets a cgroup
``agentvfs-<pid>-<n>`` below this process's own, and each command a child of it with the
command's limits; :meth:`SandboxCgroup.kill` ends everything in it, which is how ``stop()``
reaches processes that left the command's process group or session (``setsid``, double
forks). Cgroups of a process that died are removed by the next sandbox that starts.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import re
import resource
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._procs import pid_alive

__all__ = [
    "LIMIT_DEFAULTS",
    "CgroupSupport",
    "CommandCgroup",
    "ResourceLimits",
    "SandboxCgroup",
    "apply_rlimits",
    "detect_cgroups",
    "normalize_limits",
    "shell_limits",
    "user_task_count",
]

_log = logging.getLogger("agentvfs.sandbox")

_GIB = 1 << 30

#: The limit options of ``native_sandbox`` and their defaults (None: no limit).
LIMIT_DEFAULTS: Mapping[str, int | None] = {
    "max_memory_bytes": 4 * _GIB,
    "max_processes": 1024,
    "max_cpu_seconds": 3600,
    "max_file_size_bytes": 8 * _GIB,
    "max_disk_bytes": None,
}

_UNITS = {
    "max_memory_bytes": "bytes (e.g. 2 * 1024**3 for 2 GiB)",
    "max_processes": "processes (threads count)",
    "max_cpu_seconds": "seconds of CPU time per process",
    "max_file_size_bytes": "bytes (e.g. 1024**3 for 1 GiB)",
    "max_disk_bytes": "bytes (e.g. 10 * 1024**3 for 10 GiB)",
}

# A process is given this much CPU time after SIGXCPU before SIGKILL.
_CPU_GRACE_SECONDS = 2
# How long the kill of a cgroup keeps signalling newcomers (a fork loop) before it gives up.
_KILL_SECONDS = 5.0


def normalize_limits(options: Mapping[str, Any]) -> dict[str, int | None]:
    """Check the limit options in ``options`` and fill in the defaults.

    Raises
    ------
    ValueError
        A limit that is not a positive integer or None; the message names it and its unit.
    """
    limits: dict[str, int | None] = {}
    for key, default in LIMIT_DEFAULTS.items():
        value = options.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(
                f"native_sandbox[{key!r}] must be a positive integer number of {_UNITS[key]} "
                f"or None for no limit, got {value!r}"
            )
        limits[key] = value
    return limits


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """The limits of one command (None: unlimited).

    Attributes
    ----------
    memory_bytes, processes, cpu_seconds, file_size_bytes : int or None
        See the module documentation.
    """

    memory_bytes: int | None = None
    processes: int | None = None
    cpu_seconds: int | None = None
    file_size_bytes: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ResourceLimits:
        """From normalised ``native_sandbox`` options (:func:`normalize_limits`)."""
        return cls(
            memory_bytes=options.get("max_memory_bytes"),
            processes=options.get("max_processes"),
            cpu_seconds=options.get("max_cpu_seconds"),
            file_size_bytes=options.get("max_file_size_bytes"),
        )

    def rlimits(self, *, memory: bool, processes: int | None) -> list[tuple[int, tuple[int, int]]]:
        """``(RLIMIT_*, (soft, hard))`` pairs to set on a command's first process.

        Parameters
        ----------
        memory : bool
            Whether ``RLIMIT_DATA`` must carry the memory limit (no memory cgroup).
        processes : int, optional
            The ``RLIMIT_NPROC`` value, when it is to be used at all (see the module).
        """
        out: list[tuple[int, tuple[int, int]]] = []
        if self.cpu_seconds is not None:
            out.append((resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds + _CPU_GRACE_SECONDS)))
        if self.file_size_bytes is not None:
            out.append((resource.RLIMIT_FSIZE, (self.file_size_bytes, self.file_size_bytes)))
        if memory and self.memory_bytes is not None:
            out.append((resource.RLIMIT_DATA, (self.memory_bytes, self.memory_bytes)))
        if processes is not None:
            out.append((resource.RLIMIT_NPROC, (processes, processes)))
        return out


def apply_rlimits(pid: int, rlimits: Iterable[tuple[int, tuple[int, int]]]) -> None:
    """Lower the limits of process ``pid`` (never raising a hard limit it already has).

    Raises
    ------
    OSError
        The kernel refused (``pid`` gone, or not ours).
    """
    for which, (soft, hard) in rlimits:
        old_soft, old_hard = resource.prlimit(pid, which)
        if old_hard != resource.RLIM_INFINITY:
            hard = min(hard, old_hard)
        soft = min(soft, hard)
        if old_soft != resource.RLIM_INFINITY:
            soft = min(soft, old_soft)
        resource.prlimit(pid, which, (soft, hard))


def user_task_count(uid: int | None = None) -> int:
    """How many tasks (threads included) of real user ``uid`` (this process's by default)
    exist, as far as ``/proc`` shows: what ``RLIMIT_NPROC`` counts outside a user namespace."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count


# -- cgroups ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """Where this process may create cgroups, and with which controllers.

    Attributes
    ----------
    version : int
        1 or 2.
    bases : mapping
        Controller (``"pids"``, ``"memory"``; ``"unified"`` for v2) -> the directory of this
        process's own cgroup in that hierarchy, under which sandbox cgroups are created.
    controllers : frozenset
        ``"pids"`` and/or ``"memory"``.
    """

    version: int
    bases: Mapping[str, str]
    controllers: frozenset[str]

    @property
    def memory(self) -> bool:
        """Whether commands get a memory limit from the cgroup."""
        return "memory" in self.controllers

    @property
    def pids(self) -> bool:
        """Whether commands get a process limit from the cgroup."""
        return "pids" in self.controllers


_WANTED = ("pids", "memory")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """``(mount point, root, fstype, super options)`` of the cgroup mounts in ``mountinfo``."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        fstype = fields[sep + 1]
        if fstype in ("cgroup", "cgroup2"):
            out.append((_unescape(fields[4]), _unescape(fields[3]), fstype, fields[sep + 3] if len(fields) > sep + 3 else ""))
    return out


def _own_directory(point: str, root: str, path: str) -> str:
    # The cgroup path is relative to the hierarchy's root; the mount shows ``root`` of it.
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")) :] or "/"
    return os.path.join(point, path.lstrip("/")).rstrip("/") or point


def _can_create(base: str) -> bool:
    probe = os.path.join(base, f"agentvfs-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


def _detect(mountinfo: str, cgroups: str) -> tuple[CgroupSupport | None, str]:
    """The support described by ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` texts."""
    own: dict[str, str] = {}
    for line in cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, names, path = parts
        if hierarchy == "0" and names == "":
            own["unified"] = path
        for name in names.split(","):
            if name:
                own[name] = path
    mounts = _mounts(mountinfo)
    reasons: list[str] = []
    # v2: the unified hierarchy, when this process's cgroup offers both controllers.
    for point, root, fstype, _options in mounts:
        if fstype != "cgroup2" or "unified" not in own:
            continue
        base = _own_directory(point, root, own["unified"])
        try:
            offered = set(_read(os.path.join(base, "cgroup.controllers")).split())
        except OSError as exc:
            reasons.append(f"cgroup v2 at {base}: {exc.strerror}")
            continue
        if not set(_WANTED) <= offered:
            reasons.append(f"cgroup v2 at {base} offers {' '.join(sorted(offered)) or 'no controllers'}")
            continue
        if not _can_create(base):
            reasons.append(f"cgroup v2 at {base} is not writable by this user")
            continue
        return CgroupSupport(2, {"unified": base}, frozenset(_WANTED)), ""
    # v1: one hierarchy per controller.
    bases: dict[str, str] = {}
    for controller in _WANTED:
        for point, root, fstype, options in mounts:
            if fstype != "cgroup" or controller not in options.split(",") or controller not in own:
                continue
            base = _own_directory(point, root, own[controller])
            if _can_create(base):
                bases[controller] = base
            else:
                reasons.append(f"cgroup v1 {controller} at {base} is not writable by this user")
            break
    if bases:
        return CgroupSupport(1, bases, frozenset(bases)), ""
    return None, "; ".join(reasons) or "no cgroup hierarchy with the pids or memory controller is mounted"


@functools.cache
def detect_cgroups() -> tuple[CgroupSupport | None, str]:
    """Where sandbox cgroups can be made here (checked once per process).

    Returns
    -------
    (CgroupSupport or None, str)
        The support, or None and why there is none.
    """
    try:
        mountinfo = _read("/proc/self/mountinfo")
        cgroups = _read("/proc/self/cgroup")
    except OSError as exc:
        return None, f"cannot read /proc: {exc.strerror}"
    return _detect(mountinfo, cgroups)


_SANDBOX_PREFIX = "agentvfs-"
_counter = itertools.count(1)


def _procs(directory: str) -> list[int]:
    try:
        return [int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _tree(directory: str) -> list[str]:
    """``directory`` and every cgroup below it, deepest first (the order rmdir needs)."""
    out: list[str] = []
    for parent, dirs, _files in os.walk(directory, topdown=False):
        for name in dirs:
            out.append(os.path.join(parent, name))
    out.append(directory)
    return out


def _kill_tree(directory: str) -> bool:
    """SIGKILL every process in ``directory`` and below until none is left (or the time is up:
    a fork loop without a pids limit could outrun it); True when it is empty."""
    kill_file = os.path.join(directory, "cgroup.kill")
    deadline = time.monotonic() + _KILL_SECONDS
    while True:
        found = False
        if os.path.exists(kill_file):
            # cgroup v2 (Linux 5.14+): the kernel kills the whole subtree, newcomers included.
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        for group in _tree(directory):
            for pid in _procs(group):
                found = True
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if not found:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def _remove_tree(directory: str, *, wait: float = 0.0) -> bool:
    """Remove ``directory`` and the cgroups below it; True when all are gone. A cgroup stays
    busy until its killed processes are reaped by their parents: ``wait`` seconds for that."""
    deadline = time.monotonic() + wait
    while True:
        for group in _tree(directory):
            with contextlib.suppress(OSError):
                os.rmdir(group)
        if not os.path.exists(directory):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


@dataclass
class CommandCgroup:
    """The cgroup(s) of one command: one directory per hierarchy.

    Attributes
    ----------
    directories : dict
        Controller -> directory.
    """

    directories: dict[str, str] = field(default_factory=dict)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes ``0`` to, to enter the command's cgroups."""
        return [os.path.join(d, "cgroup.procs") for d in self.directories.values()]

    def attach(self, pid: int) -> None:
        """Move process ``pid`` into the command's cgroups.

        Raises
        ------
        OSError
            The kernel refused.
        """
        for procs in self.procs_files:
            _write(procs, str(pid))

    def pids(self) -> list[int]:
        """Processes in the command's cgroup now."""
        for directory in self.directories.values():
            return _procs(directory)
        return []

    def kill(self) -> bool:
        """SIGKILL everything in the command's cgroup; True when it is empty."""
        done = True
        for directory in self.directories.values():
            done = _kill_tree(directory) and done
        return done

    def remove(self) -> None:
        """Remove the (empty) cgroup directories; a busy one stays for the sandbox's kill."""
        for directory in self.directories.values():
            _remove_tree(directory)


class SandboxCgroup:
    """A sandbox's cgroup: one per hierarchy, with a child per command.

    Parameters
    ----------
    support : CgroupSupport
        From :func:`detect_cgroups`.

    Raises
    ------
    OSError
        The directories cannot be created.
    """

    def __init__(self, support: CgroupSupport) -> None:
        self.support = support
        _remove_stale(support)
        name = f"{_SANDBOX_PREFIX}{os.getpid()}-{next(_counter)}"
        self.directories: dict[str, str] = {}
        self._commands = itertools.count(1)
        try:
            for controller, base in support.bases.items():
                path = os.path.join(base, name)
                os.mkdir(path, 0o755)
                self.directories[controller] = path
                if support.version == 2:
                    # Children get the controllers (this cgroup holds no process itself).
                    _write(os.path.join(path, "cgroup.subtree_control"), "+pids +memory")
        except OSError:
            self.remove()
            raise

    def command(self, limits: ResourceLimits) -> CommandCgroup:
        """A new child cgroup with ``limits`` for one command.

        Raises
        ------
        OSError
            It cannot be created or limited.
        """
        name = f"c{next(self._commands)}"
        group = CommandCgroup()
        try:
            for controller, parent in self.directories.items():
                path = os.path.join(parent, name)
                os.mkdir(path, 0o755)
                group.directories[controller] = path
                self._limit(controller, path, limits)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, controller: str, path: str, limits: ResourceLimits) -> None:
        v2 = self.support.version == 2
        if (controller in ("pids", "unified")) and limits.processes is not None:
            _write(os.path.join(path, "pids.max"), str(limits.processes))
        if (controller in ("memory", "unified")) and limits.memory_bytes is not None:
            if v2:
                _write(os.path.join(path, "memory.max"), str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limits.memory_bytes))
                # Swap counts too, when the kernel accounts it (memsw must be >= the limit).
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limits.memory_bytes))

    def kill(self) -> bool:
        """SIGKILL every process of the sandbox; True when none is left."""
        done = True
        for directory in self.directories.values():
            done = _kill_tree(directory) and done
        return done

    def remove(self) -> None:
        """Remove the sandbox's cgroups (after :meth:`kill`)."""
        for directory in self.directories.values():
            if not _remove_tree(directory, wait=2.0):
                _log.warning("the cgroup %s stays busy; the next sandbox removes it", directory)
        self.directories = {}


_STALE = re.compile(rf"^{_SANDBOX_PREFIX}(\d+)-\d+$")


def _remove_stale(support: CgroupSupport) -> None:
    """Kill and remove sandbox cgroups of processes that no longer exist (a crash)."""
    for base in support.bases.values():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            match = _STALE.match(name)
            if match is None or pid_alive(int(match.group(1))):
                continue
            path = os.path.join(base, name)
            _log.warning("removing the cgroup %s of a sandbox whose process %s is gone", path, match.group(1))
            _kill_tree(path)
            _remove_tree(path, wait=1.0)


def _blocks(size: int, unit: int) -> int:
    return max(1, math.ceil(size / unit))


def shell_limits(limits: ResourceLimits, *, memory: bool) -> str:
    """``ulimit`` commands that set ``limits`` in a POSIX shell (dash, bash as ``sh``,
    BusyBox): ``-t`` seconds, ``-f`` 512-byte blocks, ``-d`` KiB, the units POSIX mode uses.

    Parameters
    ----------
    memory : bool
        Whether the data limit carries the memory limit (no memory cgroup).
    """
    parts: list[str] = []
    if limits.cpu_seconds is not None:
        # The soft limit first: a hard limit below the current (unlimited) soft one is invalid.
        parts.append(f"ulimit -S -t {limits.cpu_seconds}")
        parts.append(f"ulimit -H -t {limits.cpu_seconds + _CPU_GRACE_SECONDS}")
    if limits.file_size_bytes is not None:
        parts.append(f"ulimit -f {_blocks(limits.file_size_bytes, 512)}")
    if memory and limits.memory_bytes is not None:
        parts.append(f"ulimit -d {_blocks(limits.memory_bytes, 1024)}")
    return " && ".join(parts)

