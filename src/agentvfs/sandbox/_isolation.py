"""Native isolation of sandbox commands: bubblewrap on Linux, without privilege.

With ``isolation="bwrap"`` every command runs as ``bwrap <arguments> -- sh -c <command>``:

* **no privilege**: a new user namespace (``--unshare-user``) where the kernel allows one, in
  which the command runs as an ordinary user (this user's own uid, or :data:`SANDBOX_UID`
  when this process is root; uid 0 inside only with ``run_as_root``), with every capability
  dropped (``--cap-drop ALL``), no way to make further user namespaces
  (``--disable-userns``, bubblewrap 0.8+), a session of its own (``--new-session``: no
  ``TIOCSTI`` into a terminal) and the seccomp filter of :mod:`._seccomp` (``--seccomp FD``);
  it dies with this process (``--die-with-parent``);
* **nothing of the host**: new PID, IPC, UTS and cgroup namespaces (and network unless
  ``allow_network``), a fresh ``/proc`` that is read-only (see below), bubblewrap's minimal
  ``/dev`` (null, zero, full, random, urandom, tty, a private pts), a private ``/tmp``, the
  system directories read-only, the working directory read-write (read-only with
  ``read_only``), and nothing else. The root of the sandbox is read-only, so a command
  writes only to its working directory, ``/tmp`` and the ``read_write_paths`` (and, with
  ``max_disk_bytes``, ``/tmp`` and ``/dev/shm`` are tmpfs of that size and the rest of
  ``/dev`` is read-only). Directories where agentvfs keeps its own state on the host are
  covered by an empty read-only directory wherever a bind would show them, and a bind that
  brings the host's own ``/proc``, ``/dev`` or ``/sys`` along (a path given as ``/``) gets the
  sandbox's ``/proc`` and ``/dev`` mounted again over it, and an empty ``/sys``.

For every user, ``/proc/sys``, ``/proc/sysrq-trigger``, ``/proc/irq``, ``/proc/bus`` and
``/proc/fs`` are bound read-only from the host's ``/proc`` over the fresh one (bubblewrap
resolves a bind's source in the host's mount namespace; these are the same kernel objects,
and the sysctls of namespaced things follow the namespaces of whoever opens them), and the
whole fresh ``/proc`` is then remounted read-only: no sysctl, no ``chmod`` of an entry, and
also no write to ``/proc/self/oom_score_adj`` or to a thread's ``comm`` (reads, and
``/proc/self/fd/N``, which lead to the files themselves, work as before). bubblewrap covers
some of these paths itself, but only where ``access(W_OK)`` succeeds, which it does not for
``/proc/sys`` in a user namespace. ``/etc/ssl/private`` (the host's TLS keys, bound with
``/etc/ssl``) is covered by an empty read-only directory.

**When this process is root** the sandbox's user, whatever its uid inside, *is* the host's
root to the kernel (kuid 0): the user namespace maps it to the uid that made the namespace.
Capabilities are gone, but whatever the kernel decides by uid alone still holds, which is why
the covers above matter, and why there are more:

* ``/proc``: a sysctl write checks the effective uid against root's (that is how
  ``kernel.core_pattern`` ran a program of the sandbox's as root on the host), and the owner
  of a global ``/proc`` entry may ``chmod`` it for the whole machine; the read-only ``/proc``
  stops both. The files at the top of ``/proc`` only root may read (``slabinfo``,
  ``kpageflags``, ``timer_list``...) are also covered so that they cannot be opened.
* ``/dev``: bubblewrap binds the host's own device nodes, and their owner may ``chmod`` them
  (``chmod 0 /dev/null`` for the host); the launcher gives each sandbox nodes of its own,
  owned by nobody, in a directory no sandbox can see or change, and each command checks
  before it starts that its ``/dev`` holds those very nodes (see :mod:`._devices`).
* files: set-user-ID and set-group-ID modes are refused by the seccomp filter
  (:mod:`._seccomp`), file capabilities by the missing ``CAP_SETFCAP``. What remains is
  described in :class:`~agentvfs.sandbox.LocalSandbox`.

:func:`detect_isolation` runs bubblewrap once with these flags and reads the capabilities and
seccomp state of the process inside, and whether ``kernel.core_pattern`` is writable: where
capabilities survive, the filter is missing or the sysctl could be written, bwrap counts as
unavailable.

Custom ``bwrap_args`` replace the namespaces and the binds (everything between the binary and
``--``, the user namespace included), not the hardening: ``--cap-drop ALL``, the seccomp
filter, ``--new-session`` and ``--die-with-parent`` are always added in front of them. Dropping privilege costs a custom
layout nothing, and a sandbox that silently keeps root's capabilities because someone added
a bind is the failure this module exists to prevent; a custom ``--cap-add`` (which comes
later) still wins. ``--seccomp`` in custom arguments is refused (use ``--add-seccomp-fd``).
A ``--proc`` or ``--dev`` among custom arguments gets the covers of the default layout, added
after them; what a custom layout binds from the host (``--bind / /`` includes the host's
``/proc``) is its own choice, but for the directories of agentvfs's own state, covered wherever
a custom bind shows them too.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import IsolationUnavailableError
from ._egress import FORWARDER_SCRIPT, parse_host_patterns
from ._limits import LIMIT_DEFAULTS, normalize_limits
from ._seccomp import native_filter

__all__ = [
    "ISOLATION_BACKENDS",
    "NATIVE_SANDBOX_DEFAULTS",
    "PROXY_PORT",
    "SANDBOX_UID",
    "BwrapSupport",
    "build_bwrap_args",
    "bwrap_path",
    "bwrap_support",
    "check_isolation",
    "detect_isolation",
    "device_args",
    "device_check",
    "forwarder_python",
    "hidden_covers",
    "normalize_native_sandbox",
    "proc_args",
    "python_binds",
    "sandbox_ids",
    "working_bwrap",
]

#: The isolation names a sandbox accepts (``seatbelt`` is macOS's, which agentvfs lacks).
ISOLATION_BACKENDS = ("none", "bwrap", "seatbelt")

#: The uid and gid commands run as inside bubblewrap when this process is root (an ordinary
#: user's, as on most Linux systems); a non-root user keeps its own ids.
SANDBOX_UID = 1000

#: The loopback port the in-sandbox egress forwarder listens on (see :mod:`._egress`).
PROXY_PORT = 3128

#: The options of ``native_sandbox`` and their defaults.
NATIVE_SANDBOX_DEFAULTS: Mapping[str, Any] = {
    "allow_network": False,
    "allowed_hosts": None,
    "read_only_paths": (),
    "read_write_paths": (),
    "allow_system_binaries": True,
    "bwrap_args": None,
    "read_only": False,
    "run_as_root": False,
    **LIMIT_DEFAULTS,
}

# System paths bound read-only when they exist: what ordinary commands need to run.
_SYSTEM_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/localtime",
)

# Bound with /etc/ssl, covered by an empty directory (see build_bwrap_args).
_TLS_KEYS = "/etc/ssl/private"

# Runtime locations bound read-only with ``allow_system_binaries``.
_RUNTIME_PATHS = ("/opt", "/snap")

_INSTALL_HINT = (
    "Install with: apt install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap (Fedora)"
)

# Every capability set and the seccomp state, as /proc/<pid>/status names them.
_CAPABILITY_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")

# The parts of /proc that change the machine rather than the sandbox, bound read-only from the
# host's /proc over the fresh one (the module docstring says why bubblewrap's own cover is not
# enough). The remount of the whole /proc that follows covers them too: these binds say what
# must never be writable even if a layout leaves /proc itself writable.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")

# The probe's line: whether kernel.core_pattern (the sysctl that makes the kernel run a
# program as root on a crash) is writable inside.
_CORE_PATTERN_FIELD = "AgentvfsCorePattern"
_CORE_PATTERN_PROBE = (
    f"if test -w /proc/sys/kernel/core_pattern; then echo '{_CORE_PATTERN_FIELD}: writable'; "
    f"else echo '{_CORE_PATTERN_FIELD}: read-only'; fi"
)


def _platform() -> str:
    # A function, so type checkers do not narrow ``sys.platform`` to the checking machine's.
    return sys.platform


def bwrap_path() -> str | None:
    """Where the ``bwrap`` binary is (searched on ``PATH``), or None."""
    return shutil.which("bwrap")


def sandbox_ids(*, run_as_root: bool = False) -> tuple[int, int]:
    """The ``(uid, gid)`` commands run as inside bubblewrap's user namespace."""
    if run_as_root:
        return 0, 0
    if os.getuid() == 0:
        return SANDBOX_UID, SANDBOX_UID
    return os.getuid(), os.getgid()


@dataclass(frozen=True, slots=True)
class BwrapSupport:
    """What bubblewrap can do here, as proven by running it once (see :func:`bwrap_support`).

    Attributes
    ----------
    path : str or None
        The binary.
    reason : str or None
        Why bwrap cannot isolate commands here; None when it can.
    user_namespace : bool
        Commands get a user namespace of their own (``--unshare-user``).
    disable_userns : bool
        ``--disable-userns`` works (bubblewrap 0.8+ on a kernel that allows it).
    """

    path: str | None
    reason: str | None = None
    user_namespace: bool = True
    disable_userns: bool = True

    @property
    def available(self) -> bool:
        """Whether commands can be isolated."""
        return self.reason is None

    def describe(self) -> str:
        """The hardening in effect, in a few words."""
        parts = ["own user namespace" if self.user_namespace else "no user namespace (the kernel refuses one)"]
        if self.user_namespace:
            parts.append("nested user namespaces off" if self.disable_userns else "nested user namespaces refused by seccomp")
        parts += ["no capabilities", "seccomp filter"]
        return ", ".join(parts)


def _hardening(support: BwrapSupport, *, run_as_root: bool, user_namespace: bool = True) -> list[str]:
    """The privilege-dropping flags that go first on every command line."""
    args: list[str] = []
    if support.user_namespace and user_namespace:
        uid, gid = sandbox_ids(run_as_root=run_as_root)
        args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
        if support.disable_userns:
            args.append("--disable-userns")
    args += ["--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    return args


@functools.cache
def _root_only_proc_files() -> tuple[str, ...]:
    """The regular files at the top of this machine's ``/proc`` that only root may read
    (``kmsg``, ``slabinfo``, ``kpageflags``...): names of global entries, the same in every
    procfs of this kernel."""
    found: list[str] = []
    try:
        names = sorted(os.listdir("/proc"))
    except OSError:
        return ()
    for name in names:
        if name.isdigit() or name in _PROC_READ_ONLY:
            continue
        try:
            info = os.lstat(f"/proc/{name}")
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o044:
            found.append(name)
    return tuple(found)


def proc_args(destination: str = "/proc", *, host_root: bool | None = None) -> list[str]:
    """The bubblewrap arguments that follow ``--proc destination``: the machine's parts of
    ``/proc`` bound read-only, the root-only files covered (when the sandbox's user is the
    host's root), then the whole mount made read-only (see the module docstring).

    Parameters
    ----------
    destination : str
        Where the layout mounts its procfs.
    host_root : bool, optional
        Whether the sandbox's user is the host's root; by default, whether this process is.

    Returns
    -------
    list of str
        ``--ro-bind-try`` of each machine part, ``--ro-bind /dev/null`` over each root-only
        file (with ``host_root``), then ``--remount-ro destination``.
    """
    if host_root is None:
        host_root = os.geteuid() == 0
    base = destination.rstrip("/") or "/"
    args: list[str] = []
    for name in _PROC_READ_ONLY:
        args += ["--ro-bind-try", f"/proc/{name}", f"{base}/{name}"]
    if host_root:
        # A device node on a read-only bind cannot be opened at all (the bind is nodev): the
        # file answers EACCES, as it does to every other user of the host.
        for name in _root_only_proc_files():
            args += ["--ro-bind", "/dev/null", f"{base}/{name}"]
    args += ["--remount-ro", base]
    return args


def device_args(devices: Mapping[str, str] | None, destination: str = "/dev") -> list[str]:
    """The bubblewrap arguments that follow ``--dev destination``: each of ``devices`` bound
    over bubblewrap's bind of the host's node of that name.

    Parameters
    ----------
    devices : mapping or None
        ``{"null": "<host path of a node>", ...}``; None or empty for bubblewrap's own binds.
    destination : str
        Where the layout mounts its ``/dev``.

    Returns
    -------
    list of str
        A ``--dev-bind`` per device.
    """
    base = destination.rstrip("/") or "/"
    args: list[str] = []
    for name, path in (devices or {}).items():
        args += ["--dev-bind", path, f"{base}/{name}"]
    return args


def _status_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    return fields


def _probe_once(path: str, support: BwrapSupport) -> tuple[str | None, str | None]:
    """Run ``cat /proc/self/status`` in a sandbox with ``support``'s flags; returns
    ``(status text, None)`` or ``(None, why it failed)``."""
    try:
        program = native_filter()
    except ValueError as exc:
        return None, str(exc)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)
    finally:
        os.close(write_end)
    probe = [path, *_hardening(support, run_as_root=False), "--seccomp", str(read_end)]
    probe += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
    probe += ["--ro-bind", "/", "/", "--proc", "/proc", *proc_args("/proc"), "--dev", "/dev"]
    probe += ["--", "/bin/sh", "-c", f"cat /proc/self/status && {_CORE_PATTERN_PROBE}"]
    try:
        done = subprocess.run(
            probe,
            capture_output=True,
            timeout=10,
            check=False,
            env={"PATH": os.defpath},
            pass_fds=(read_end,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    finally:
        os.close(read_end)
    if done.returncode != 0:
        # Typically "No permissions to creating new namespace" in a container without user
        # namespaces (or where unprivileged ones are disabled).
        return None, done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
    return done.stdout.decode("utf-8", "replace"), None


@functools.cache
def bwrap_support() -> BwrapSupport:
    """Find bwrap and prove it can isolate commands without privilege; cached per process.

    The strongest form that works is kept: a user namespace with nested ones disabled, then
    a user namespace alone, then none of ours (root where the kernel refuses user namespaces,
    a setuid bwrap).
    Whatever form, the process inside must show no capability in any set, ``NoNewPrivs`` and
    the seccomp filter, and must not be able to write ``kernel.core_pattern``; otherwise bwrap
    is reported unavailable with what was seen.
    """
    if not _platform().startswith("linux"):
        return BwrapSupport(None, f"bubblewrap runs only on Linux, not on {_platform()}")
    path = bwrap_path()
    if path is None:
        return BwrapSupport(None, f"Linux bubblewrap (bwrap) not found. {_INSTALL_HINT}")
    # Last, no user namespace of ours: root where the kernel refuses them, or a setuid bwrap;
    # the capability check below still decides.
    candidates = [
        BwrapSupport(path),
        BwrapSupport(path, disable_userns=False),
        BwrapSupport(path, user_namespace=False, disable_userns=False),
    ]
    failures: list[str] = []
    for candidate in candidates:
        status, error = _probe_once(path, candidate)
        if status is None:
            failures.append(error or "unknown error")
            continue
        fields = _status_fields(status)
        kept = [f"{name} {fields.get(name)}" for name in _CAPABILITY_FIELDS if fields.get(name) != "0000000000000000"]
        if kept:
            return BwrapSupport(
                path, f"Linux bubblewrap at {path} leaves capabilities to the sandbox ({', '.join(kept)})"
            )
        if fields.get("NoNewPrivs") != "1" or fields.get("Seccomp") != "2":
            return BwrapSupport(
                path,
                f"Linux bubblewrap at {path} did not apply the seccomp filter "
                f"(NoNewPrivs {fields.get('NoNewPrivs')}, Seccomp {fields.get('Seccomp')})",
            )
        if fields.get(_CORE_PATTERN_FIELD) != "read-only":
            # Where the sandbox's user is the host's root, a written core_pattern makes the
            # kernel run a program of the sandbox's choice as root on the host.
            seen = fields.get(_CORE_PATTERN_FIELD, "not checked")
            return BwrapSupport(
                path,
                f"Linux bubblewrap at {path} leaves /proc/sys writable to the sandbox "
                f"(kernel.core_pattern: {seen})",
            )
        return candidate
    return BwrapSupport(path, f"Linux bubblewrap at {path} does not work here: {failures[0]}")


def _probe_bwrap() -> tuple[str | None, str | None]:
    """``(path, None)`` when bwrap works here, else ``(path or None, reason)``."""
    support = bwrap_support()
    return support.path, support.reason


def working_bwrap() -> str | None:
    """The bwrap binary if it works here (see :func:`detect_isolation`), else None."""
    path, reason = _probe_bwrap()
    return path if reason is None else None


def detect_isolation() -> dict[str, Any]:
    """Describe the isolation available here.

    Returns
    -------
    dict
        ``{"backend", "available", "message"}``: on Linux with a bwrap that isolates
        without privilege, backend ``"bwrap"``; otherwise backend ``"none"`` with a message
        saying why commands will run without isolation.
    """
    path, reason = _probe_bwrap()
    if reason is None:
        detail = bwrap_support().describe() if path is not None else ""
        return {
            "backend": "bwrap",
            "available": True,
            "message": f"Linux bubblewrap (bwrap) is available at {path} ({detail})",
        }
    if _platform().startswith("linux"):
        return {
            "backend": "none",
            "available": False,
            "message": f"{reason}. Commands will run without isolation.",
        }
    return {
        "backend": "none",
        "available": False,
        "message": f"Native sandboxing is not supported on {_platform()}. Commands will run without isolation.",
    }


def check_isolation(isolation: object) -> str:
    """Return ``isolation`` if it can be used here.

    Raises
    ------
    IsolationUnavailableError
        ``bwrap`` is missing or does not work, ``seatbelt`` was asked for, or the name is
        not an isolation backend.
    """
    if isolation == "none":
        return "none"
    if isolation == "bwrap":
        _path, reason = _probe_bwrap()
        if reason is not None:
            raise IsolationUnavailableError("bwrap", reason)
        return "bwrap"
    if isolation == "seatbelt":
        where = (
            "on macOS only"
            if sys.platform != "darwin"
            else "by macOS, but agentvfs does not implement it"
        )
        raise IsolationUnavailableError(
            "seatbelt",
            f"seatbelt (sandbox-exec) is provided {where}; use isolation='bwrap' on Linux",
        )
    raise IsolationUnavailableError(
        str(isolation),
        f"unknown isolation backend {isolation!r}; expected one of 'none', 'bwrap', 'seatbelt'",
    )


def _paths(value: object, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str | os.PathLike):
        value = [value]
    if not isinstance(value, Iterable):
        raise ValueError(f"native_sandbox[{name!r}] must be a list of paths, got {value!r}")
    paths: list[str] = []
    for item in value:
        if not isinstance(item, str | os.PathLike):
            raise ValueError(f"native_sandbox[{name!r}] must be a list of paths, got item {item!r}")
        paths.append(os.path.abspath(os.path.expanduser(os.fspath(item))))
    return tuple(paths)


def normalize_native_sandbox(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``native_sandbox`` options and fill in the defaults.

    Paths become absolute (``~`` expanded); ``bwrap_args`` a list of strings or None;
    ``allowed_hosts`` a tuple of :class:`~._egress.HostPattern` or None; the limits positive
    integers or None (see :mod:`._limits`).

    Raises
    ------
    ValueError
        An unknown option (camelCase names get a hint), a value of the wrong type, or
        options that contradict each other; the message names the option and what it takes.
    """
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"native_sandbox must be a mapping of options, got {options!r}")
    config = dict(NATIVE_SANDBOX_DEFAULTS)
    for key, value in (options or {}).items():
        if key not in NATIVE_SANDBOX_DEFAULTS:
            snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in str(key))
            hint = f" (did you mean {snake!r}?)" if snake in NATIVE_SANDBOX_DEFAULTS else ""
            known = ", ".join(NATIVE_SANDBOX_DEFAULTS)
            raise ValueError(f"Unknown native_sandbox option {key!r}{hint}; known options: {known}")
        config[key] = value
    for key in ("allow_network", "allow_system_binaries", "read_only", "run_as_root"):
        if not isinstance(config[key], bool):
            raise ValueError(f"native_sandbox[{key!r}] must be a bool, got {config[key]!r}")
    config["read_only_paths"] = _paths(config["read_only_paths"], "read_only_paths")
    config["read_write_paths"] = _paths(config["read_write_paths"], "read_write_paths")
    config.update(normalize_limits(config))
    config["allowed_hosts"] = parse_host_patterns(config["allowed_hosts"])
    extra = config["bwrap_args"]
    if extra is not None:
        if (
            isinstance(extra, str)
            or not isinstance(extra, Iterable)
            or not all(isinstance(a, str) for a in extra)
        ):
            raise ValueError(
                f"native_sandbox['bwrap_args'] must be a list of strings, got {extra!r}"
            )
        config["bwrap_args"] = list(extra)
        if "--seccomp" in config["bwrap_args"]:
            raise ValueError(
                "native_sandbox['bwrap_args'] may not contain --seccomp: agentvfs passes its own "
                "filter that way; add yours with --add-seccomp-fd"
            )
    if config["allowed_hosts"] is not None:
        if config["allow_network"]:
            raise ValueError(
                "native_sandbox: allow_network=True gives the whole network and allowed_hosts "
                "restricts it; set one of them, not both"
            )
        if config["bwrap_args"]:
            raise ValueError(
                "native_sandbox: allowed_hosts needs the network namespace agentvfs builds, "
                "which custom bwrap_args replace; drop one of them"
            )
    return config


def _covered(path: str, by: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in by)


def _elf_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def forwarder_python() -> str | None:
    """The interpreter binary that runs the egress forwarder inside the sandbox: a real
    file, whatever names this process by (a virtualenv's symlink, a venv reached through a
    symlinked directory, a pyenv shim, which is a script).

    ``sys.executable`` resolved, when that is a binary; otherwise the binary this process
    runs (``/proc/self/exe``). Its directory and its installation are bound into every
    sandbox that forwards (:func:`python_binds`).

    Returns
    -------
    str or None
        The path, or None when neither is a binary (an embedded interpreter).
    """
    candidates = [os.path.realpath(sys.executable)] if sys.executable else []
    with contextlib.suppress(OSError):
        candidates.append(os.readlink("/proc/self/exe"))
    return next((path for path in candidates if os.path.isfile(path) and _elf_file(path)), None)


def _link_chain(path: str) -> list[str]:
    """``path`` and each path its symlinks lead to, in order (absolute, as named)."""
    chain = [os.path.abspath(path)]
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            target = os.readlink(chain[-1])
        except OSError:
            break
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), target)))
    return chain


def python_binds() -> list[tuple[str, str]]:
    """``(source, destination)`` pairs that make this Python work inside the sandbox as it
    does outside: its installation prefixes (a virtualenv and its base interpreter) and the
    directories of its interpreter and of every symlink on the way to it, each at its real
    place and at the place it is named by (a virtualenv reached through a symlinked
    directory, a symlinked ``python``), so that ``sys.executable`` runs inside and the
    forwarder's interpreter (:func:`forwarder_python`) finds its standard library.

    Returns
    -------
    list of (str, str)
        Parents before children (a later bind over a parent would hide an earlier child);
        nothing below the system paths, which are bound anyway.
    """
    named = [sys.prefix, sys.base_prefix]
    if sys.executable:
        # Every link on the way from sys.executable to the binary must resolve inside too.
        named += [os.path.dirname(hop) for hop in _link_chain(sys.executable)]
    interpreter = forwarder_python()
    if interpreter is not None:
        named.append(os.path.dirname(interpreter))
    pairs: list[tuple[str, str]] = []
    for path in named:
        if not path:
            continue
        real = os.path.realpath(path)
        for destination in dict.fromkeys((real, os.path.abspath(path))):
            if destination == "/" or _covered(destination, _SYSTEM_PATHS):
                continue
            pairs.append((real, destination))
    pairs.sort(key=lambda pair: pair[1].count("/"))
    kept: list[tuple[str, str]] = []
    for source, destination in pairs:
        if not _covered(destination, [d for _, d in kept]):
            kept.append((source, destination))
    return kept


#: Runs the egress forwarder, then the command: ``sh -c CHAIN <python> <script> <descriptor>
#: <port> <command>``.
_FORWARD_THEN_RUN = '"$0" -I -S -c "$1" "$2" "$3" || exit 125; exec sh -c "$4"'

# Checks, before anything of the command runs, that each device node in /dev is the one the
# launcher made (the same inode as a descriptor it holds, reached through /proc/self/fd): a
# node replaced between the launcher's check and bubblewrap's bind is never used.
_DEVICE_CHECK = (
    "{tests} || {{ echo 'agentvfs: the device nodes bound into this sandbox are not the ones made for it "
    "(its state directory was changed); the command did not run' >&2; exit 126; }}; "
)

# The options of bubblewrap that bind a host path (source, destination) into a layout.
_BIND_FLAGS = frozenset({"--bind", "--bind-try", "--dev-bind", "--dev-bind-try", "--ro-bind", "--ro-bind-try"})


def device_check(descriptors: Mapping[str, int], destination: str = "/dev") -> str:
    """The shell prefix that stops a command (status 126) unless each node of ``destination``
    is the file a descriptor of ``descriptors`` (``{"null": fd, ...}``, inherited) refers to."""
    base = destination.rstrip("/") or "/"
    tests = " && ".join(f"[ {base}/{name} -ef /proc/self/fd/{fd} ]" for name, fd in descriptors.items())
    return _DEVICE_CHECK.format(tests=tests) if tests else ""


def _kernel_interfaces_again(shown: Sequence[str], devices: Mapping[str, str] | None, size: Sequence[str]) -> list[str]:
    """The arguments that mount ``/proc`` and ``/dev`` again, as at the start of the layout, and
    cover ``/sys`` and the host's TLS keys, where a bind at one of ``shown`` put the host's own
    there: a working directory or a path given as ``/`` brings the host's ``/proc``
    (``kernel.core_pattern`` writable by a sandbox whose user is the host's root), ``/dev``,
    ``/sys`` and ``/etc/ssl/private`` along."""
    args: list[str] = []
    if _covered("/proc", shown):
        args += ["--proc", "/proc", *proc_args("/proc")]
    if _covered("/dev", shown):
        args += ["--dev", "/dev", *device_args(devices)]
        if size:
            args += [*size, "--tmpfs", "/dev/shm"]
    if _covered("/sys", shown):
        args += ["--tmpfs", "/sys", "--remount-ro", "/sys"]
    if _covered(_TLS_KEYS, shown) and os.path.isdir(_TLS_KEYS):
        args += ["--tmpfs", _TLS_KEYS, "--remount-ro", _TLS_KEYS]
    return args


def _custom_binds(custom: Sequence[str]) -> list[tuple[str, str]]:
    return [(custom[i + 1], custom[i + 2]) for i in range(len(custom) - 2) if custom[i] in _BIND_FLAGS]


def hidden_covers(hidden: Iterable[str], binds: Iterable[tuple[str, str]]) -> list[str]:
    """The bubblewrap arguments that cover each of ``hidden`` (host directories no command
    may see) with an empty read-only directory wherever ``binds`` make it visible.

    Parameters
    ----------
    hidden : iterable of str
        Host directories; those that do not exist are skipped (nothing to see).
    binds : iterable of (str, str)
        The layout's binds, ``(host source, destination inside)``.

    Returns
    -------
    list of str
        ``--tmpfs D --remount-ro D`` for each place ``D`` a hidden directory shows up.

    Raises
    ------
    PermissionError
        A bind's source is a hidden directory or lies inside one: it would be covered, and
        no sandbox may see it.
    """
    sources = [(os.path.realpath(source), destination) for source, destination in binds]
    places: list[str] = []
    for path in hidden:
        if not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        for source, destination in sources:
            if _covered(source, [real]):
                raise PermissionError(
                    errno.EACCES,
                    f"{source} lies in {real}, where agentvfs keeps its sandboxes' own state on the host; "
                    "no sandbox may see it: bind another path",
                )
            if _covered(real, [source]):
                place = os.path.normpath(os.path.join(destination, os.path.relpath(real, source)))
                if place not in places:
                    places.append(place)
    return [arg for place in places for arg in ("--tmpfs", place, "--remount-ro", place)]


#: Variables that change how a program on the host loads and runs (glibc's list of those it
#: drops for set-user-ID programs, and every ``LD_*``): a command's environment may point them
#: at files the command can write, and bubblewrap runs on the host, as this process's user.
_HOST_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_PERTURB_", "MALLOC_TRACE", "NIS_PATH",
    "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZDIR",
})  # fmt: skip


def host_unsafe_variable(name: str) -> bool:
    """Whether the variable ``name`` must not reach bubblewrap's own process on the host.

    A command's variables reach it as bubblewrap's environment, which bubblewrap hands on to
    the command; ``LD_PRELOAD`` and its kind would act on bubblewrap first, outside the
    sandbox. Such variables go in as ``--setenv`` instead (:func:`build_bwrap_args`).
    """
    return name.startswith("LD_") or name in _HOST_UNSAFE


def _setenv_args(setenv: Mapping[str, str] | None) -> list[str]:
    return [part for name, value in (setenv or {}).items() for part in ("--setenv", name, value)]


def build_bwrap_args(
    command: str,
    *,
    working_directory: str,
    config: Mapping[str, Any],
    cwd: str | None = None,
    binds: Sequence[tuple[str, bool]] = (),
    bwrap: str = "bwrap",
    support: BwrapSupport | None = None,
    seccomp_fd: int | None = None,
    info_fd: int | None = None,
    block_fd: int | None = None,
    proxy_fd: int | None = None,
    protect: Sequence[str] = (),
    hidden: Sequence[str] = (),
    devices: Mapping[str, str] | None = None,
    device_fds: Mapping[str, int] | None = None,
    setenv: Mapping[str, str] | None = None,
) -> list[str]:
    """The argument vector that runs ``command`` under bubblewrap.

    Parameters
    ----------
    command : str
        The shell command line, run as ``sh -c <command>`` inside.
    working_directory : str
        The sandbox's working directory (absolute): bound read-write, or read-only with
        ``config["read_only"]``.
    config : mapping
        Normalised ``native_sandbox`` options (:func:`normalize_native_sandbox`); with
        ``max_disk_bytes``, ``/tmp`` and ``/dev/shm`` are tmpfs of that size and the rest of
        ``/dev`` is read-only.
    cwd : str, optional
        Where the command starts; the working directory by default.
    binds : sequence of (path, writable)
        Further host paths to bind at the same place (e.g. the targets of mounts).
    bwrap : str
        The bwrap binary.
    support : BwrapSupport, optional
        What the kernel allows (:func:`bwrap_support`); full hardening when not given.
    seccomp_fd : int, optional
        A descriptor the child inherits, holding :func:`~._seccomp.build_filter`'s program.
    info_fd, block_fd : int, optional
        bubblewrap writes the sandbox's first process id to ``info_fd`` and waits for a byte
        on ``block_fd`` before that process goes on: the window in which the caller puts it
        in its cgroup and sets its rlimits.
    proxy_fd : int, optional
        The command's end of the egress proxy's socket pair (with ``allowed_hosts``,
        inherited): the forwarder then runs before the command (see :mod:`._egress`).
    protect : sequence of str
        Host paths bound read-only after everything else, so a writable bind that contains
        them (the working directory, ``read_write_paths``) cannot change them.
    hidden : sequence of str
        Host directories no command may see (the state agentvfs keeps for its sandboxes):
        covered by an empty read-only directory wherever a bind, custom ones included,
        makes them visible (:func:`hidden_covers`).
    devices : mapping, optional
        Device nodes of the sandbox's own (``{"null": path, ...}``), bound over bubblewrap's
        binds of the host's nodes in ``/dev`` (see :func:`device_args`).
    device_fds : mapping, optional
        Descriptors of the same nodes (``{"null": fd, ...}``, inherited): in the default
        layout the command first checks that each node in ``/dev`` is that file
        (:func:`device_check`) and stops with status 126 otherwise.
    setenv : mapping, optional
        Variables set inside the sandbox only (``--setenv``): those bubblewrap itself, a
        process of the host, must not get (:func:`host_unsafe_variable`).

    Returns
    -------
    list of str
        ``[bwrap, ..., "--", "sh", "-c", command]``. Custom ``bwrap_args`` replace
        everything between the hardening and ``--``; a ``--proc`` or ``--dev`` among them
        gets the same covers as the default layout's, added after them.

    Raises
    ------
    PermissionError
        A bound path lies inside one of ``hidden``.
    """
    support = support or BwrapSupport(bwrap)
    custom = config.get("bwrap_args")
    # Custom arguments choose their own namespaces (the user namespace among them).
    hardening = _hardening(support, run_as_root=bool(config.get("run_as_root")), user_namespace=not custom)
    args = [bwrap, *hardening]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if info_fd is not None and block_fd is not None:
        args += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
    tail = ["--", "sh", "-c", command]
    if custom:
        covers: list[str] = []
        for flag, destination in itertools.pairwise(custom):
            if flag == "--proc":
                covers += proc_args(destination)
            elif flag == "--dev":
                covers += device_args(devices, destination)
        covers += hidden_covers(hidden, _custom_binds(custom))
        return [*args, *_setenv_args(setenv), *custom, *covers, *tail]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not config.get("allow_network"):
        args.append("--unshare-net")
    scratch = config.get("max_disk_bytes")
    size = ["--size", str(scratch)] if scratch is not None else []
    # /dev comes before the binds so that a path below /dev given by the caller is not hidden
    # by it; it must be --dev (device nodes of a plain bind are unusable: bwrap binds nodev).
    args += ["--proc", "/proc", *proc_args("/proc"), "--dev", "/dev", *device_args(devices)]
    if scratch is not None:
        # Every place a command can write without a bind holds at most max_disk_bytes: /tmp,
        # /dev/shm (POSIX shared memory and semaphores), and /dev itself nothing (it is made
        # read-only once the binds below it are in place).
        args += [*size, "--tmpfs", "/dev/shm"]
    args += [*size, "--tmpfs", "/tmp"]
    layout: list[tuple[str, str]] = []
    for path in _SYSTEM_PATHS:
        args += ["--ro-bind-try", path, path]
        layout.append((path, path))
    if os.path.isdir(_TLS_KEYS):
        # Private keys, not certificates: nothing a command needs, and readable to it when its
        # user is the host's root, whatever their mode.
        args += ["--tmpfs", _TLS_KEYS, "--remount-ro", _TLS_KEYS]
    forwarding = proxy_fd is not None and config.get("allowed_hosts") is not None
    if config.get("allow_system_binaries", True) or forwarding:
        # The forwarder is this Python: it must be visible even without system binaries.
        # Before the caller's paths: one of those may show the host's tree where this Python
        # is named, a symlink there that a bind could not be mounted on (and needs none).
        for source, destination in python_binds():
            args += ["--ro-bind", source, destination]
            layout.append((source, destination))
    for path in config.get("read_only_paths", ()):
        args += ["--ro-bind", path, path]
        layout.append((path, path))
    if config.get("allow_system_binaries", True):
        for path in _RUNTIME_PATHS:
            args += ["--ro-bind-try", path, path]
            layout.append((path, path))
    args += [
        "--ro-bind" if config.get("read_only") else "--bind",
        working_directory,
        working_directory,
    ]
    layout.append((working_directory, working_directory))
    for path in config.get("read_write_paths", ()):
        args += ["--bind", path, path]
        layout.append((path, path))
    for path, writable in binds:
        args += ["--bind" if writable else "--ro-bind", path, path]
        layout.append((path, path))
    # Only what was bound after the system paths can have covered /proc, /dev or the keys.
    later = [destination for _source, destination in layout[len(_SYSTEM_PATHS) :]]
    args += _kernel_interfaces_again(later, devices, size)
    for path in protect:
        args += ["--ro-bind-try", path, path]
    args += hidden_covers(hidden, layout)
    check = device_check(device_fds or {}) if devices else ""
    if forwarding:
        assert proxy_fd is not None
        interpreter = forwarder_python()
        if interpreter is None:
            raise OSError(
                errno.ENOENT,
                "allowed_hosts needs a Python interpreter binary for its forwarder, and neither "
                f"sys.executable ({sys.executable!r}) nor /proc/self/exe is one",
            )
        chain = check + _FORWARD_THEN_RUN
        tail = ["--", "sh", "-c", chain, interpreter, FORWARDER_SCRIPT, str(proxy_fd), str(PROXY_PORT), command]
    else:
        tail = ["--", "sh", "-c", check + command]
    if scratch is not None:
        args += ["--remount-ro", "/dev"]
    # Everything is in place: make the sandbox's own root (a tmpfs) read-only, so writes
    # outside the bound paths fail instead of landing in a throwaway directory.
    args += ["--remount-ro", "/"]
    args += ["--chdir", cwd or working_directory]
    return [*args, *_setenv_args(setenv), *tail]
