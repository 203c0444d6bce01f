"""Process groups on Linux: whether a group is still ours, whether it is alive, signalling it.

A command runs as the leader of its own process group; after the leader is reaped, ``/proc``
start times tell whether the group's id still names our processes (the kernel never reuses a
pid while it names a group).
"""

from __future__ import annotations

import os

from .._procs import start_time

__all__ = ["format_ms", "group_alive", "group_is_ours", "open_pidfd", "signal_group", "start_time"]


# -- process-group bookkeeping (Linux /proc) ------------------------------------------------------


_HAVE_PROC = os.path.exists("/proc/self/stat")


def group_is_ours(pgid: int, leader_start: int | None) -> bool:
    """Whether process group ``pgid``, whose leader we already reaped, is still ours.

    The kernel never reuses a pid while it names a process group. So if no process has
    pid ``pgid`` now, every process in group ``pgid`` descends from our command; if one
    has, it must be our leader (same start time), not a newcomer that got the recycled
    pid. Without ``/proc`` this cannot be told, and the answer is no.
    """
    if not _HAVE_PROC or leader_start is None:
        return False
    now = start_time(pgid)
    return now is None or now == leader_start


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def open_pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:
        return None


def format_ms(ms: float) -> str:
    return str(int(ms)) if float(ms).is_integer() else str(ms)
