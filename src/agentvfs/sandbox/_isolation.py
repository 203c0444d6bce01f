"""Native isolation of sandbox commands: bubblewrap on Linux.

With ``isolation="bwrap"`` every command runs as ``bwrap <arguments> -- sh -c <command>``:
new PID, IPC and UTS namespaces (and network namespace unless ``allow_network``), a fresh
``/proc``, ``/dev`` and ``/tmp``, the system directories read-only, the working directory
read-write (read-only with ``read_only``), and nothing else of the host. The root of the
sandbox is read-only, so a command can write only to its working directory, ``/tmp`` (a
tmpfs that disappears with it) and the ``read_write_paths``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import IsolationUnavailableError

__all__ = [
    "ISOLATION_BACKENDS",
    "NATIVE_SANDBOX_DEFAULTS",
    "build_bwrap_args",
    "bwrap_path",
    "check_isolation",
    "detect_isolation",
    "normalize_native_sandbox",
    "working_bwrap",
]

#: The isolation names a sandbox accepts (``seatbelt`` is macOS's, which agentvfs lacks).
ISOLATION_BACKENDS = ("none", "bwrap", "seatbelt")

#: The options of ``native_sandbox`` and their defaults.
NATIVE_SANDBOX_DEFAULTS: Mapping[str, Any] = {
    "allow_network": False,
    "read_only_paths": (),
    "read_write_paths": (),
    "allow_system_binaries": True,
    "bwrap_args": None,
    "read_only": False,
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

# Runtime locations bound read-only with ``allow_system_binaries``.
_RUNTIME_PATHS = ("/opt", "/snap")

_INSTALL_HINT = (
    "Install with: apt install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap (Fedora)"
)


def _platform() -> str:
    # A function, so type checkers do not narrow ``sys.platform`` to the checking machine's.
    return sys.platform


def bwrap_path() -> str | None:
    """Where the ``bwrap`` binary is (searched on ``PATH``), or None."""
    return shutil.which("bwrap")


@functools.cache
def _probe_bwrap() -> tuple[str | None, str | None]:
    """Find bwrap and prove it can build the namespaces commands run in; cached per process.

    Returns ``(path, None)`` when it works, else ``(path or None, reason)``.
    """
    if not _platform().startswith("linux"):
        return None, f"bubblewrap runs only on Linux, not on {_platform()}"
    path = bwrap_path()
    if path is None:
        return None, f"Linux bubblewrap (bwrap) not found. {_INSTALL_HINT}"
    probe = [path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    probe += ["--proc", "/proc", "--dev", "/dev", "--die-with-parent", "true"]
    try:
        done = subprocess.run(
            probe, capture_output=True, timeout=10, check=False, env={"PATH": os.defpath}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return path, f"Linux bubblewrap at {path} does not work here: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
        # Typically "No permissions to creating new namespace" in a container without user
        # namespaces (or where unprivileged ones are disabled).
        return path, f"Linux bubblewrap at {path} does not work here: {detail}"
    return path, None


def working_bwrap() -> str | None:
    """The bwrap binary if it works here (see :func:`detect_isolation`), else None."""
    path, reason = _probe_bwrap()
    return path if reason is None else None


def detect_isolation() -> dict[str, Any]:
    """Describe the isolation available here.

    Returns
    -------
    dict
        ``{"backend", "available", "message"}``: on Linux with a working bwrap, backend
        ``"bwrap"``; otherwise backend ``"none"`` with a message saying why commands will
        run without isolation.
    """
    path, reason = _probe_bwrap()
    if reason is None:
        return {
            "backend": "bwrap",
            "available": True,
            "message": f"Linux bubblewrap (bwrap) is available at {path}",
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

    Paths become absolute (``~`` expanded); ``bwrap_args`` a list of strings or None.

    Raises
    ------
    ValueError
        An unknown option (camelCase names get a hint) or a value of the wrong type.
    """
    config = dict(NATIVE_SANDBOX_DEFAULTS)
    for key, value in (options or {}).items():
        if key not in NATIVE_SANDBOX_DEFAULTS:
            snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in str(key))
            hint = f" (did you mean {snake!r}?)" if snake in NATIVE_SANDBOX_DEFAULTS else ""
            known = ", ".join(NATIVE_SANDBOX_DEFAULTS)
            raise ValueError(f"Unknown native_sandbox option {key!r}{hint}; known options: {known}")
        config[key] = value
    for key in ("allow_network", "allow_system_binaries", "read_only"):
        if not isinstance(config[key], bool):
            raise ValueError(f"native_sandbox[{key!r}] must be a bool, got {config[key]!r}")
    config["read_only_paths"] = _paths(config["read_only_paths"], "read_only_paths")
    config["read_write_paths"] = _paths(config["read_write_paths"], "read_write_paths")
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
    return config


def _covered(path: str, by: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in by)


def _python_paths() -> list[str]:
    """The install prefixes of this Python (a virtualenv and its base interpreter), so
    ``python`` works inside the sandbox as it does outside."""
    found: list[str] = []
    for path in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        path = os.path.realpath(path)
        if path and path != "/" and not _covered(path, _SYSTEM_PATHS) and not _covered(path, found):
            found.append(path)
    return found


def build_bwrap_args(
    command: str,
    *,
    working_directory: str,
    config: Mapping[str, Any],
    cwd: str | None = None,
    binds: Sequence[tuple[str, bool]] = (),
    bwrap: str = "bwrap",
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
        Normalised ``native_sandbox`` options (:func:`normalize_native_sandbox`).
    cwd : str, optional
        Where the command starts; the working directory by default.
    binds : sequence of (path, writable)
        Further host paths to bind at the same place (e.g. the targets of mounts).
    bwrap : str
        The bwrap binary.

    Returns
    -------
    list of str
        ``[bwrap, ..., "--", "sh", "-c", command]``. Custom ``bwrap_args`` replace
        everything between the binary and ``--``.
    """
    tail = ["--", "sh", "-c", command]
    custom = config.get("bwrap_args")
    if custom:
        return [bwrap, *custom, *tail]
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not config.get("allow_network"):
        args.append("--unshare-net")
    # /dev comes before the binds so that a path below /dev given by the caller is not hidden
    # by it; it must be --dev (device nodes of a plain bind are unusable: bwrap binds nodev).
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in _SYSTEM_PATHS:
        args += ["--ro-bind-try", path, path]
    for path in config.get("read_only_paths", ()):
        args += ["--ro-bind", path, path]
    if config.get("allow_system_binaries", True):
        for path in _python_paths():
            args += ["--ro-bind", path, path]
        for path in _RUNTIME_PATHS:
            args += ["--ro-bind-try", path, path]
    args += [
        "--ro-bind" if config.get("read_only") else "--bind",
        working_directory,
        working_directory,
    ]
    for path in config.get("read_write_paths", ()):
        args += ["--bind", path, path]
    for path, writable in binds:
        args += ["--bind" if writable else "--ro-bind", path, path]
    # Everything is in place: make the sandbox's own root (a tmpfs) read-only, so writes
    # outside the bound paths fail instead of landing in a throwaway directory.
    args += ["--remount-ro", "/"]
    args += ["--chdir", cwd or working_directory, "--die-with-parent"]
    return [*args, *tail]
