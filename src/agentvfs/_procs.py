"""Whether a process still runs, for the bookkeeping several units keep per process id."""

from __future__ import annotations

import contextlib
import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether the process ``pid`` exists and has not exited.

    A process this user may not signal still exists (``EPERM``); a zombie (exited, not yet
    reaped by its parent) counts as gone: whatever it held (a cache fill, a cgroup, a mount)
    nobody will finish or release.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return True
