"""Process-group checks shared by the sandbox tests: what is still running, waiting for state
that other threads and processes change, and small file helpers."""

from __future__ import annotations

import os
from collections.abc import Callable

import anyio

__all__ = ["assert_group_gone", "eventually", "live_members", "read", "write"]


def live_members(pgid: int) -> list[int]:
    """Processes (not zombies) in process group ``pgid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            found.append(int(name))
    return found


async def eventually(predicate: Callable[[], object], seconds: float = 5) -> None:
    """Wait until ``predicate()`` holds (state changed by other threads and processes)."""
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def assert_group_gone(pgid: int) -> None:
    """Fail unless every process of group ``pgid`` is gone within 3 s."""
    with anyio.move_on_after(3):
        await eventually(lambda: not live_members(pgid))
    assert live_members(pgid) == [], f"processes left in group {pgid}"


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()
