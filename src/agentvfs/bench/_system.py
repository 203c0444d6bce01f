"""The machine under the benchmark: its description, its caches, its processes and mounts."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ..mounts import is_mounted

__all__ = [
    "can_drop_caches",
    "drop_caches",
    "free_port",
    "machine_description",
    "stop_process",
    "tail",
    "unmount",
]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _libfuse() -> str:
    from ..mounts import libfuse_version

    return libfuse_version() or "unknown"


def _passthrough_state() -> str:
    from ..mounts import passthrough_unavailable_reason

    reason = passthrough_unavailable_reason()
    if reason is None and os.geteuid() != 0:
        reason = "needs root"
    return "available (local-directory mounts)" if reason is None else f"off: {reason}"


def _first_line(argv: list[str]) -> str:
    """First output line of a version command, or "not installed"."""
    if shutil.which(argv[0]) is None:
        return "not installed"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _git_head() -> str | None:
    """Commit of the checkout agentvfs is imported from, when it is one."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{' (modified)' if dirty else ''}"


def machine_description(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Cores, CPU model, memory, kernel, and the version of everything that can be measured."""
    mem = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    head = _git_head()
    desc = {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "agentvfs": _version("agentvfs") + (f" at {head}" if head else ""),
        "pyfuse3": _version("pyfuse3"),
        "libfuse3 (pyfuse3)": _libfuse(),
        "FUSE passthrough": _passthrough_state(),
        "fsspec": _version("fsspec"),
        "s3fs": _version("s3fs"),
        "gcsfs": _version("gcsfs"),
        "boto3": _version("boto3"),
        "duckdb": _version("duckdb"),
        "fusepy (fsspec.fuse)": _version("fusepy"),
        "rclone": _first_line(["rclone", "version"]),
        "s3fs-fuse": _first_line(["s3fs", "--version"]),
        "fio": _first_line(["fio", "--version"]),
        "bwrap": _first_line(["bwrap", "--version"]),
        "bm25s": _version("bm25s"),
        "sqlite": _sqlite_version(),
    }
    desc.update(extra or {})
    desc["load average at start"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return desc


def _os_name() -> str:
    with contextlib.suppress(OSError), open("/etc/os-release") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


def can_drop_caches() -> bool:
    """Whether this process may write ``/proc/sys/vm/drop_caches`` (root, writable /proc)."""
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> bool:
    """Write back dirty pages, then drop page cache, dentries and inodes; False when not allowed.

    Dropping dentries and inodes also makes the kernel forget FUSE inodes, so the next lookup
    on a mount goes to its server: "cold" then means cold in the kernel on every layer.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        return False
    return True


def unmount(path: str) -> bool:
    """``fusermount3 -u``, then lazy ``-uz`` when busy or stuck; True when nothing is left."""
    for flags in ("-u", "-uz"):
        if not is_mounted(path):
            return True
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["fusermount3", flags, path], capture_output=True, timeout=30, check=False)
        time.sleep(0.05)
    return not is_mounted(path)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0, sig: int = signal.SIGTERM) -> bool:
    """Signal a process we started, SIGKILL it after ``grace`` seconds; True when it exited in time."""
    if proc.poll() is not None:
        return True
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(grace)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path | str, n: int = 6) -> str:
    """Last ``n`` lines of a log file on one line, for error messages."""
    with contextlib.suppress(OSError):
        lines = Path(path).read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-n:])
    return ""
