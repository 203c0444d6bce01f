"""Whether a process still runs, for the bookkeeping several units keep per process id."""

from __future__ import annotations

import contextlib
import os

__all__ = ["pid_alive", "start_time"]


def pid_alive(pid: int) -> bool:
    """Whether the process ``pid`` exists and has not exited.

    A process this user may not signal still exists (``EPERM``); a zombie (exited, not yet
    reaped by its parent) counts as gone: whatever it held (a cache fill, a cgroup, a mount)
    nobody will finish or release. A process whose first thread exited while others run is
    alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
            return True
        # The leader shows Z as soon as its own thread exits: the process runs on while
        # another of its threads does.
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    return True


def start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``, or None if unknown: with
    the pid it names one process, where a pid alone may since name another."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # Field 2 (the command name) may contain spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
