"""No process of a sandbox outlives ``stop()`` or ``destroy()``: ``setsid``, a double fork and
``nohup`` escapes from foreground and background commands, with bubblewrap (the PID namespace),
without isolation through a cgroup, and without isolation or cgroups through the supervisor."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import anyio
import pytest

from agentvfs.sandbox import LocalSandbox, _launch
from agentvfs.sandbox._isolation import detect_isolation
from agentvfs.sandbox._limits import detect_cgroups

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
CGROUPS, CGROUP_REASON = detect_cgroups()


@pytest.fixture(
    params=[
        pytest.param("bwrap", marks=pytest.mark.skipif(not BWRAP["available"], reason=BWRAP["message"])),
        pytest.param("none+cgroup", marks=pytest.mark.skipif(CGROUPS is None, reason=f"no cgroups: {CGROUP_REASON}")),
        "none+supervisor",
    ]
)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "none+supervisor":
        monkeypatch.setattr(_launch, "detect_cgroups", lambda: (None, "disabled by the test"))
    return str(request.param)


def sleepers(tag: str) -> list[int]:
    """Live processes whose command line holds ``tag`` (not zombies, not shells that quote it)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if argv and argv[0].endswith(b"sleep") and any(tag.encode() in a for a in argv) and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


async def wait_for(predicate: object, seconds: float = 10.0) -> bool:
    with anyio.move_on_after(seconds):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 (other processes change it)
            await anyio.sleep(0.02)
        return True
    return False


ESCAPES = (
    "setsid sleep {t}1 & "
    "(sleep {t}2 &) ; "
    "nohup setsid sh -c 'sleep {t}3' >/dev/null 2>&1 & "
    "sh -c 'setsid sh -c \"sleep {t}4 & exit\" &' ; "
    "echo started"
)


@pytest.mark.parametrize("how", ["stop", "destroy"])
async def test_escapes_do_not_outlive_the_sandbox(tmp_path: Path, mode: str, how: str) -> None:
    tag = "9" + "".join(str(secrets.randbelow(10)) for _ in range(6))
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap" if mode == "bwrap" else "none")
    foreground = await box.execute_command(ESCAPES.format(t=tag + "0"))
    assert foreground.stdout == "started\n", foreground
    background = await box.processes.spawn(ESCAPES.format(t=tag + "5") + "; sleep 30")
    # The background command's escapes are running (a foreground command's may already be
    # gone: bubblewrap and the supervisor end them with the command).
    assert await wait_for(lambda: len(sleepers(tag + "5")) >= 4), sleepers(tag)
    if how == "stop":
        await box.stop()
    else:
        await box.destroy()
    assert await wait_for(lambda: not sleepers(tag), 5), f"left running after {how}(): {sleepers(tag)}"
    assert background.exit_code == 128
    await box.destroy()


async def test_a_command_killed_takes_its_escaped_children(tmp_path: Path, mode: str) -> None:
    tag = "8" + "".join(str(secrets.randbelow(10)) for _ in range(6))
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap" if mode == "bwrap" else "none")
    try:
        handle = await box.processes.spawn(f"setsid sleep {tag}1 & sleep {tag}2")
        assert await wait_for(lambda: len(sleepers(tag)) == 2)
        # A process that left the command's group is still in its cgroup, PID namespace or
        # supervisor's care: killed with the command.
        assert await box.processes.kill(handle.pid)
        assert await wait_for(lambda: not sleepers(tag)), sleepers(tag)
        result = await box.execute_command(f"setsid sleep {tag}3 & sleep {tag}4", timeout=300)
        assert result.timed_out
        assert await wait_for(lambda: not sleepers(tag)), sleepers(tag)
    finally:
        await box.destroy()
    assert await wait_for(lambda: not sleepers(tag)), sleepers(tag)
