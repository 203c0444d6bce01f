"""Resource limits per command (memory, processes, CPU time, file size) with and without
isolation, through cgroups where this process may create them and rlimits otherwise: a fork
bomb, a memory hog, a CPU burner and a huge write each stop, and this process goes on."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import anyio
import pytest

from agentvfs.sandbox import LocalSandbox, _launch, _limits
from agentvfs.sandbox._isolation import detect_isolation
from agentvfs.sandbox._limits import (
    ResourceLimits,
    _detect,
    apply_rlimits,
    detect_cgroups,
    shell_limits,
)

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
CGROUPS, CGROUP_REASON = detect_cgroups()
ISOLATIONS = ["none", pytest.param("bwrap", marks=pytest.mark.skipif(not BWRAP["available"], reason=BWRAP["message"]))]

LIMITS = {
    "max_processes": 64,
    "max_memory_bytes": 256 << 20,
    "max_cpu_seconds": 1,
    "max_file_size_bytes": 8 << 20,
}


@pytest.fixture(params=["cgroups", "rlimits"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test with cgroups (where available) and with rlimits alone."""
    if request.param == "cgroups":
        if CGROUPS is None:
            pytest.skip(f"no cgroups for this user: {CGROUP_REASON}")
    else:
        monkeypatch.setattr(_launch, "detect_cgroups", lambda: (None, "disabled by the test"))
    return str(request.param)


@pytest.fixture(params=ISOLATIONS)
def isolation(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def sandbox(wd: Path, isolation: str, **overrides: object) -> LocalSandbox:
    return LocalSandbox(working_directory=str(wd), isolation=isolation, native_sandbox={**LIMITS, **overrides})


def _process_limit_enforceable(isolation: str, mechanism: str) -> str | None:
    if mechanism == "cgroups":
        return None if CGROUPS is not None and CGROUPS.pids else "no pids cgroup"
    if os.getuid() == 0:
        return "root is exempt from RLIMIT_NPROC and there is no cgroup"
    return None


async def test_fork_bomb_is_contained(tmp_path: Path, isolation: str, mechanism: str) -> None:
    why = _process_limit_enforceable(isolation, mechanism)
    if why is not None:
        pytest.skip(why)
    box = sandbox(tmp_path, isolation)
    started = time.monotonic()
    try:
        result = await box.execute_command(
            "bomb() { bomb | bomb & }; bomb; sleep 1; echo this-shell-survived", timeout=20_000
        )
        # The sandbox is still usable, and so is this process.
        after = await box.execute_command("echo alive")
    finally:
        await box.destroy()
    assert "Cannot fork" in result.stderr or "Resource temporarily unavailable" in result.stderr, result.stderr[-500:]
    assert after.stdout == "alive\n"
    assert time.monotonic() - started < 30


async def test_memory_hog_is_killed_or_fails_allocation(tmp_path: Path, isolation: str, mechanism: str) -> None:
    box = sandbox(tmp_path, isolation)
    hog = "import sys; chunks = [bytearray(64 << 20) for _ in range(32)]; print('allocated', len(chunks))"
    try:
        result = await box.execute_command(f"{sys.executable} -c \"{hog}\"", timeout=60_000)
    finally:
        await box.destroy()
    assert "allocated" not in result.stdout
    # The OOM killer (a cgroup) answers SIGKILL, an rlimit a failed allocation.
    assert result.exit_code in (137, 128) or "MemoryError" in result.stderr, result
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 << 20  # this process did not grow 2 GiB


async def test_cpu_burner_is_stopped(tmp_path: Path, isolation: str, mechanism: str) -> None:
    box = sandbox(tmp_path, isolation)
    started = time.monotonic()
    try:
        result = await box.execute_command("while :; do :; done", timeout=60_000)
    finally:
        await box.destroy()
    assert not result.timed_out
    # SIGXCPU at the limit (128 + 24), or the supervisor's mirror of it (128).
    assert result.exit_code in (152, 128), result
    assert time.monotonic() - started < 30


async def test_huge_write_stops_at_the_file_size_limit(tmp_path: Path, isolation: str, mechanism: str) -> None:
    box = sandbox(tmp_path, isolation)
    try:
        result = await box.execute_command("head -c 100000000 /dev/zero > big.bin; echo status=$?", timeout=60_000)
    finally:
        await box.destroy()
    assert os.path.getsize(tmp_path / "big.bin") == 8 << 20
    assert "status=0" not in result.stdout


async def test_no_limit_when_lifted(tmp_path: Path, isolation: str) -> None:
    box = LocalSandbox(
        working_directory=str(tmp_path),
        isolation=isolation,
        native_sandbox={"max_file_size_bytes": None, "max_cpu_seconds": None},
    )
    try:
        result = await box.execute_command("ulimit -f; ulimit -t")
    finally:
        await box.destroy()
    assert result.stdout.split() == ["unlimited", "unlimited"]


# -- units --------------------------------------------------------------------------------------


def test_rlimits_and_shell_limits() -> None:
    limits = ResourceLimits(memory_bytes=1 << 30, processes=10, cpu_seconds=5, file_size_bytes=1000)
    pairs = dict(limits.rlimits(memory=True, processes=11))
    assert pairs[resource.RLIMIT_CPU] == (5, 7)
    assert pairs[resource.RLIMIT_FSIZE] == (1000, 1000)
    assert pairs[resource.RLIMIT_DATA] == (1 << 30, 1 << 30)
    assert pairs[resource.RLIMIT_NPROC] == (11, 11)
    assert resource.RLIMIT_DATA not in dict(limits.rlimits(memory=False, processes=None))
    assert shell_limits(limits, memory=True) == "ulimit -S -t 5 && ulimit -H -t 7 && ulimit -f 2 && ulimit -d 1048576"
    assert shell_limits(ResourceLimits(), memory=True) == ""


def test_apply_rlimits_never_raises_a_lower_limit() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
        time.sleep(2)
        os._exit(0)
    try:
        deadline = time.monotonic() + 2
        while resource.prlimit(pid, resource.RLIMIT_FSIZE) != (100, 100) and time.monotonic() < deadline:
            time.sleep(0.01)
        apply_rlimits(pid, [(resource.RLIMIT_FSIZE, (5000, 5000)), (resource.RLIMIT_CPU, (9, 11))])
        assert resource.prlimit(pid, resource.RLIMIT_FSIZE) == (100, 100)
        assert resource.prlimit(pid, resource.RLIMIT_CPU) == (9, 11)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


MOUNTINFO_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CGROUP_V1 = "8:pids:/\n4:memory:/job/7\n0::/\n"


def test_detection_from_mountinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cg"
    (root / "memory" / "job" / "7").mkdir(parents=True)
    (root / "pids").mkdir(parents=True)
    (root / "unified").mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    mountinfo = MOUNTINFO_V1.replace("/sys/fs/cgroup", str(root))
    support, reason = _detect(mountinfo, CGROUP_V1)
    assert support is not None, reason
    assert support.version == 1
    assert support.bases == {"pids": str(root / "pids"), "memory": str(root / "memory" / "job" / "7")}
    # v2 with both controllers wins.
    (root / "unified" / "cgroup.controllers").write_text("cpu memory pids\n")
    support, reason = _detect(mountinfo, CGROUP_V1)
    assert support is not None and support.version == 2
    assert support.bases == {"unified": str(root / "unified")}
    # Nothing writable: no support, and the reason says where it looked.
    monkeypatch.setattr(_limits, "_can_create", lambda base: False)
    support, reason = _detect(mountinfo, CGROUP_V1)
    assert support is None
    assert "not writable by this user" in reason


def test_limit_options_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"native_sandbox\['max_cpu_seconds'\] must be a positive integer number of seconds"):
        LocalSandbox(native_sandbox={"max_cpu_seconds": 1.5})
    with pytest.raises(ValueError, match="max_file_size_bytes"):
        LocalSandbox(native_sandbox={"max_file_size_bytes": -1})
    with pytest.raises(ValueError, match="did you mean 'max_processes'"):
        LocalSandbox(native_sandbox={"maxProcesses": 5})


# -- disk ---------------------------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")
DISK = 8 << 20

# Fill each place a command can write without a bind: one big file, then many small ones (a
# limit per file would let these through), then count the bytes it holds.
_FILL = (
    "for place in /tmp /dev/shm /dev; do "
    "head -c 50000000 /dev/zero > $place/fill 2>/dev/null; "
    "i=0; while [ $i -lt 40 ]; do head -c 1000000 /dev/zero > $place/part$i 2>/dev/null || break; i=$((i+1)); done; "
    "echo $place $(cat $place/fill $place/part* 2>/dev/null | wc -c); done"
)


@needs_bwrap
async def test_max_disk_bytes_bounds_every_scratch_space(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    box = sandbox(tmp_path, "bwrap", max_disk_bytes=DISK)
    try:
        with caplog.at_level(logging.WARNING, logger="agentvfs.sandbox"):
            result = await box.execute_command(_FILL, timeout=120_000)
            # Shared memory still works where it is needed (POSIX semaphores live there).
            shared = await box.execute_command(
                f"{sys.executable} -c 'import multiprocessing as m; l = m.Lock(); l.acquire(); print(\"locked\")'"
            )
    finally:
        await box.destroy()
    held = {line.split()[0]: int(line.split()[1]) for line in result.stdout.splitlines()}
    assert set(held) == {"/tmp", "/dev/shm", "/dev"}, result
    assert 0 < held["/tmp"] <= DISK and 0 < held["/dev/shm"] <= DISK, held
    assert held["/dev"] == 0, held
    assert shared.stdout == "locked\n", shared
    # Its working directory lies on a filesystem far larger: the sandbox says so, and how to
    # bound it.
    warned = [r.getMessage() for r in caplog.records if "max_disk_bytes" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"max_disk_bytes={DISK} bounds each command's /tmp and /dev/shm, but not {tmp_path} (" in warned[0]
    assert f"mount -t tmpfs -o size={DISK} tmpfs <path>" in warned[0] and "project quota" in warned[0]


async def test_max_disk_bytes_without_isolation_says_it_is_not_enforced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = sandbox(tmp_path, "none", max_disk_bytes=DISK)
    try:
        with caplog.at_level(logging.WARNING, logger="agentvfs.sandbox"):
            await box.start()
    finally:
        await box.destroy()
    assert "max_disk_bytes is not enforced: commands without isolation write wherever this user can" in caplog.text


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root")
async def test_max_disk_bytes_trusts_a_filesystem_of_that_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    small = tmp_path / "small"
    small.mkdir()
    await anyio.run_process(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(small)])
    try:
        box = sandbox(tmp_path / "small", "bwrap", max_disk_bytes=DISK, read_write_paths=[str(tmp_path)])
        try:
            with caplog.at_level(logging.WARNING, logger="agentvfs.sandbox"):
                result = await box.execute_command(
                    "head -c 50000000 /dev/zero > fill; echo status=$?; wc -c < fill", timeout=60_000
                )
        finally:
            await box.destroy()
    finally:
        await anyio.run_process(["umount", str(small)])
    assert result.stdout.splitlines()[0] != "status=0" and int(result.stdout.splitlines()[1]) <= DISK, result
    # Only the path that can take more is named.
    warned = [r.getMessage() for r in caplog.records if "max_disk_bytes" in r.getMessage()]
    assert len(warned) == 1 and f"but not {tmp_path} (" in warned[0] and str(small) not in warned[0], warned


def test_max_disk_bytes_is_checked_by_name() -> None:
    for bad in ("1G", 0, -5, True, 1.5):
        with pytest.raises(
            ValueError,
            match=r"native_sandbox\['max_disk_bytes'\] must be a positive integer number of bytes \(e\.g\. 10 \* 1024\*\*3",
        ):
            LocalSandbox(native_sandbox={"max_disk_bytes": bad})
    assert LocalSandbox(native_sandbox={"max_disk_bytes": None}).native_sandbox["max_disk_bytes"] is None
    assert LocalSandbox(native_sandbox={}).native_sandbox["max_disk_bytes"] is None
