"""A mount killed mid-write: storage keeps the old version, and the next mount of the same
storage finds what the killed one had staged, reports it and aborts its multipart uploads;
``agentvfs recover`` lists, restores (conditionally) and discards it. Real mount processes
(``agentvfs mount``), killed with SIGKILL, on moto S3 and on a local directory."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
from _mountproc import Storage, mount_point, recover, start_mount, stop_mount, wait_unmounted
from agentvfs.mounts import fuse_available, list_recovered
from agentvfs.mounts._recovery import Session, recover_sessions
from agentvfs.testing import MotoServer

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    yield from mount_point(tmp_path)

def _writer(path: str, data_path: str, *, keep_open: bool = True) -> subprocess.Popen[bytes]:
    """A process that overwrites ``path`` with the bytes of ``data_path``, says so, and
    keeps the file open (a writer caught by the crash)."""
    code = (
        "import os, sys, time\n"
        f"data = open({data_path!r}, 'rb').read()\n"
        f"fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
        "view = memoryview(data)\n"
        "for i in range(0, len(data), 1 << 20):\n"
        "    os.write(fd, view[i:i + (1 << 20)])\n"
        "print('written', flush=True)\n"
        "time.sleep(120)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


@pytest.mark.parametrize(
    "kind", ["local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)]
)
def test_a_killed_mount_publishes_nothing_and_the_next_one_recovers_it(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    state = tmp_path / "state"
    log = tmp_path / "mount.log"
    old = b"the old version\n" * 1000
    new = os.urandom(3 << 20)
    (tmp_path / "new.bin").write_bytes(new)
    storage.put("f.bin", old)
    base = storage.etag("f.bin")
    first = start_mount(storage, mnt, state, log=log)
    writer = _writer(f"{mnt}/f.bin", os.fspath(tmp_path / "new.bin"))
    fresh = _writer(f"{mnt}/created.bin", os.fspath(tmp_path / "new.bin"))
    try:
        assert writer.stdout is not None and fresh.stdout is not None
        assert writer.stdout.readline() == b"written\n" and fresh.stdout.readline() == b"written\n"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        for proc in (writer, fresh):
            proc.kill()
            proc.communicate()
    wait_unmounted(mnt)  # auto_unmount
    # Storage holds the complete old version, never the empty or half-written file.
    assert storage.get("f.bin") == old
    assert storage.get("created.bin") is None
    # The next mount of the same storage moves what the killed one staged into the recovery
    # area and says so; it uploads nothing.
    second = start_mount(storage, mnt, state, log=log)
    try:
        assert wait_until(lambda: "was not published" in log.read_text(), timeout=10), log.read_text()
        assert open(f"{mnt}/f.bin", "rb").read() == old
    finally:
        stop_mount(second, log)
    assert storage.get("f.bin") == old
    listed = recover(state, storage.url, "--json")
    assert listed.returncode == 0, listed.stderr
    entries = {e["path"]: e for e in json.loads(listed.stdout)}
    assert set(entries) == {"f.bin", "created.bin"}, entries
    kept = entries["f.bin"]
    assert kept["size"] == len(new) and open(kept["data"], "rb").read() == new
    # The version it was based on: the ETag on S3, the disk's own version tag locally.
    assert kept["base"] == base if base is not None else kept["base"]
    assert "ended before publishing" in kept["reason"]
    assert entries["created.bin"]["base"] is None
    # Restoring is conditional: storage changed since, so it is refused without --force.
    storage.put("f.bin", b"changed meanwhile")
    refused = recover(state, storage.url, *storage.options, "--restore", kept["id"])
    assert refused.returncode == 1 and "changed since" in refused.stderr, refused.stderr
    assert storage.get("f.bin") == b"changed meanwhile"
    forced = recover(state, storage.url, *storage.options, "--restore", kept["id"], "--force")
    assert forced.returncode == 0, forced.stderr
    assert storage.get("f.bin") == new
    # A new file restores where nothing is; discarding deletes the entry for good.
    created = entries["created.bin"]["id"]
    assert recover(state, storage.url, *storage.options, "--restore", created).returncode == 0
    assert storage.get("created.bin") == new
    assert json.loads(recover(state, storage.url, "--json").stdout) == []
    # Nothing is left of the killed mount's session, nor of its staging beside the files.
    assert not any((state / "mounts").rglob("journal"))
    if kind == "local":
        assert sorted(p.name for p in storage.dir.iterdir()) == ["created.bin", "f.bin"]


@pytest.mark.s3
def test_a_killed_streamed_upload_is_aborted_by_the_next_mount(
    moto: MotoServer, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("s3", tmp_path, request)
    state = tmp_path / "state"
    log = tmp_path / "mount.log"
    stream = ["-o", "stream_threshold=5242880", "-o", "stream_part_size=5242880"]
    big = os.urandom(14 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    first = start_mount(storage, mnt, state, *stream, log=log)
    client = moto.boto3_client()
    bucket, prefix = storage.prefix.split("/", 1)

    def uploads() -> list[Any]:
        found = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
        return list(found)

    writer = _writer(f"{mnt}/big.bin", os.fspath(tmp_path / "big.bin"))
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
        assert wait_until(lambda: len(uploads()) == 1, timeout=30)
        journal = next((state / "mounts").rglob("journal"))
        # Named in the journal once its first part is out.
        assert wait_until(lambda: '"e":"upload"' in journal.read_text(), timeout=30)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        writer.kill()
        writer.communicate()
    wait_unmounted(mnt)
    assert storage.get("big.bin") is None and len(uploads()) == 1
    second = start_mount(storage, mnt, state, log=log)
    try:
        assert wait_until(lambda: not uploads(), timeout=15), log.read_text()
    finally:
        stop_mount(second, log)
    (kept,) = list_recovered(os.fspath(state), storage.url)
    assert kept.path == "big.bin" and open(kept.data, "rb").read() == big


def test_a_live_session_is_left_alone_and_a_torn_journal_line_is_skipped(tmp_path: Path) -> None:
    state = os.fspath(tmp_path / "state")
    live = Session(state, "memory:///x", "/mnt/a")
    staged = os.path.join(live.path, "stage-1")
    with open(staged, "wb") as f:
        f.write(b"unpublished")
    live.record("dirty", "stage-1", file=staged, path="a.txt", base=None)
    # Another mount of the same storage starting now: the session is locked, so it is live.
    assert recover_sessions(state, "memory:///x", "/mnt/b") == ([], [])
    assert os.path.exists(staged)
    # The process dies (its lock goes with it); the journal ends in a half-written line.
    with open(os.path.join(live.path, "journal"), "ab") as f:
        f.write(b'{"e":"clean","id":"stage-1"')
    os.close(live._lock)
    kept, tickets = recover_sessions(state, "memory:///x", "/mnt/b")
    assert [k.path for k in kept] == ["a.txt"] and tickets == []
    assert open(kept[0].data, "rb").read() == b"unpublished"
    assert not os.path.exists(live.path)


def test_an_unusable_default_state_directory_falls_back_to_the_temporary_one(
    mnt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agentvfs.errors import MountError
    from agentvfs.mounts import Mount
    from conftest import memory_harness

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.delenv("AGENTVFS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", os.fspath(blocker))
    with Mount(memory_harness().fs, mnt) as handle:
        assert handle.operations is not None and handle.operations.session is not None
        where = handle.operations.session.path
        assert where.startswith(os.path.join(tempfile.gettempdir(), f"agentvfs-state-{os.getuid()}"))
    assert any("state directory" in r.getMessage() and "unusable" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(where)  # a clean stop leaves no session behind
    # Asked for explicitly, it is not replaced: the mount fails and says why.
    with pytest.raises(MountError, match=r"Cannot use the state directory .*state_dir"):
        Mount(memory_harness().fs, mnt, options={"state_dir": os.fspath(blocker / "x")}).start()


#: Writes the 16 MiB of new.bin in two halves from two processes sharing the shell's descriptor,
#: with a pause between them: each closes its copy of the descriptor, mid-file.
_SHARED_WRITER = "(head -c 8388608 {big}; sleep 2; tail -c +8388609 {big}) > {target}"


def _mount_over_old(
    kind: str, helper: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Storage, Path, subprocess.Popen[bytes]]:
    """Storage holding the old ``f.bin`` (``old\\n`` 50,000 times), 16 MiB of new bytes in
    ``new.bin`` beside it, and a mount process on it (with the helper library or without)."""
    storage = Storage(kind, tmp_path, request)
    (tmp_path / "new.bin").write_bytes(os.urandom(16 << 20))
    storage.put("f.bin", b"old\n" * 50_000)
    env = {"AGENTVFS_FUSE_HELPER": "0"} if helper == "no-helper" else {}
    log = tmp_path / "mount.log"
    return storage, log, start_mount(storage, mnt, tmp_path / "state", log=log, env=env)


@pytest.mark.parametrize("helper", ["helper", "no-helper"])
@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_child_closing_a_shared_descriptor_publishes_nothing(
    kind: str, helper: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The close of ``head``'s copy of the shell's descriptor is not the end of the file:
    readers of storage see the old file or the whole new one, also where the mount cannot
    tell which process closes (no helper library: every file waits for its last close), and
    the mount says so when it starts."""
    storage, log, proc = _mount_over_old(kind, helper, mnt, tmp_path, request)
    old, new = b"old\n" * 50_000, (tmp_path / "new.bin").read_bytes()
    try:
        assert wait_until(lambda: " mounted at " in log.read_text(), timeout=30), log.read_text()
        warned = "cannot tell which process closes a file" in log.read_text()
        assert warned == (helper == "no-helper"), log.read_text()
        writer = subprocess.Popen(["bash", "-c", _SHARED_WRITER.format(big=tmp_path / "new.bin", target=f"{mnt}/f.bin")])
        seen: set[str] = set()
        while writer.poll() is None:
            got = storage.get("f.bin")
            seen.add("old" if got == old else "new" if got == new else _describe(got, old, new))
            time.sleep(0.05)
        assert writer.returncode == 0
        # Published when the opener (the subshell) closes; without the helper at the last
        # close, which the kernel sends moments after.
        assert wait_until(lambda: storage.get("f.bin") == new, timeout=30), log.read_text()
        assert seen <= {"old", "new"}, seen
    finally:
        stop_mount(proc, log)


@pytest.mark.parametrize("helper", ["helper", "no-helper"])
@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_mount_killed_between_two_writers_of_one_descriptor_keeps_the_old_file(
    kind: str, helper: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``kill -9`` of the mount while the shell's second writer has not started: the first
    half was written and its descriptor closed, and storage still holds the old file."""
    storage, log, proc = _mount_over_old(kind, helper, mnt, tmp_path, request)
    old, new = b"old\n" * 50_000, (tmp_path / "new.bin").read_bytes()
    marker = tmp_path / "first-half-written"
    script = f"(head -c 8388608 {tmp_path / 'new.bin'}; touch {marker}; sleep 3; tail -c +8388609 {tmp_path / 'new.bin'}) > {mnt}/f.bin"
    writer = subprocess.Popen(["bash", "-c", script], stderr=subprocess.DEVNULL)
    try:
        assert wait_until(marker.exists, timeout=60), log.read_text()
        time.sleep(0.5)  # the mount has had time to act on head's close, if it would
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        try:
            writer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()
            writer.wait()
    wait_unmounted(mnt)
    got = storage.get("f.bin")
    assert got == old, "old" if got == old else _describe(got, old, new)
    for leftover in Path(mnt).iterdir():
        leftover.unlink()
    stop_mount(start_mount(storage, mnt, tmp_path / "state", log=log), log)  # recovers what was staged


_WRITERS = {
    # Each replaces f.bin with the 1 MiB block of new.bin repeated 16 times.
    "cp": "cp {big} {target}",
    "dd": "dd if={big} of={target} bs=64k status=none",
    "redirect": "for i in $(seq 16); do cat {block}; done > {target}",
    "python": "python3 -c \"import sys; d=open('{big}','rb').read(); f=open('{target}','wb'); "
    "[f.write(d[i:i+65536]) for i in range(0, len(d), 65536)]; f.close()\"",
}


def _describe(got: bytes | None, old: bytes, new: bytes) -> str:
    """What an object that is neither version holds, in a line."""
    if got is None:
        return "missing"
    same = next((i for i, (a, b) in enumerate(zip(got, new, strict=False)) if a != b), min(len(got), len(new)))
    return f"neither old nor new: {len(got)} bytes, the first {same} of the new version's {len(new)}"


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_crash_trials_leave_the_old_or_the_new_file(
    kind: str, writer: str, seed: int, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import random

    storage = Storage(kind, tmp_path, request)
    state = tmp_path / "state"
    log = tmp_path / "mount.log"
    old = b"old\n" * 50_000
    block = os.urandom(1 << 20)
    new = block * 16
    (tmp_path / "block.bin").write_bytes(block)
    (tmp_path / "new.bin").write_bytes(new)
    storage.put("f.bin", old)
    first = start_mount(storage, mnt, state, log=log)
    script = _WRITERS[writer].format(
        big=tmp_path / "new.bin", block=tmp_path / "block.bin", target=f"{mnt}/f.bin"
    )
    proc = subprocess.Popen(["bash", "-c", script], stderr=subprocess.DEVNULL)
    time.sleep(random.Random(f"{kind}{writer}{seed}").uniform(0.02, 0.3))
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    wait_unmounted(mnt)
    got = storage.get("f.bin")
    # Compared here, not in the assert: a diff of two 16 MiB byte strings takes minutes.
    outcome = "old" if got == old else "new" if got == new else _describe(got, old, new)
    assert outcome in ("old", "new"), outcome
    # A writer that started after the mount was gone wrote into the bare directory.
    for leftover in Path(mnt).iterdir():
        leftover.unlink()
    second = start_mount(storage, mnt, state, log=log)
    stop_mount(second, log)
    kept = list_recovered(os.fspath(state), storage.recovery_url)
    # What the killed mount had staged and not published is reported, never uploaded. (A PUT
    # the killed mount had sent whole may still land in storage afterwards: the new version.)
    final = storage.get("f.bin")
    outcome = "old" if final == old else "new" if final == new else _describe(final, old, new)
    assert outcome in ("old", "new"), outcome
    for entry in kept:
        assert entry.path == "f.bin" and len(open(entry.data, "rb").read()) == entry.size


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_sigterm_with_a_writer_open_keeps_the_half_written_file_out_of_storage(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    state = tmp_path / "state"
    log = tmp_path / "mount.log"
    old = b"the old version\n" * 10_000
    new = os.urandom(3 << 20)
    (tmp_path / "new.bin").write_bytes(new)
    storage.put("f.bin", old)
    proc = start_mount(storage, mnt, state, "-o", "stop_timeout=1", log=log)
    writer = _writer(f"{mnt}/f.bin", os.fspath(tmp_path / "new.bin"))
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # It waited stop_timeout for the writer, then unmounted without publishing.
        assert proc.wait(timeout=60) == 1, log.read_text()
        assert time.monotonic() - started >= 0.9
    finally:
        writer.kill()
        writer.communicate()
    assert storage.get("f.bin") == old
    text = log.read_text()
    assert "still open for writing" in text and "agentvfs recover --list" in text
    (kept,) = list_recovered(os.fspath(state), storage.recovery_url)
    assert kept.path == "f.bin" and open(kept.data, "rb").read() == new


def test_a_second_sigterm_stops_at_once_and_the_next_mount_recovers(mnt: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The first SIGTERM waits up to stop_timeout for a writer; a second one stops the mount
    at once, as a crash would: nothing half-written is published, and the next mount of the
    storage moves the staged file to the recovery area."""
    storage = Storage("local", tmp_path, request)
    state = tmp_path / "state"
    log = tmp_path / "mount.log"
    old = b"the old version\n" * 1000
    new = os.urandom(1 << 20)
    (tmp_path / "new.bin").write_bytes(new)
    storage.put("f.bin", old)
    proc = start_mount(storage, mnt, state, "-o", "stop_timeout=120", log=log)
    writer = _writer(f"{mnt}/f.bin", os.fspath(tmp_path / "new.bin"))
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
        proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert proc.poll() is None  # waiting for the writer, as it should
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1, log.read_text()
        assert time.monotonic() - started < 10
    finally:
        writer.kill()
        writer.communicate()
    assert "stopping at once (a second signal)" in log.read_text()
    wait_unmounted(mnt)
    assert storage.get("f.bin") == old
    second = start_mount(storage, mnt, state, log=log)
    try:
        assert wait_until(lambda: "was not published" in log.read_text(), timeout=10), log.read_text()
    finally:
        stop_mount(second, log)
    (kept,) = list_recovered(os.fspath(state), storage.recovery_url)
    assert kept.path == "f.bin" and open(kept.data, "rb").read() == new


def test_the_recovery_area_holds_to_its_budget(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Conflicts can be made on purpose (a command and the API writing one file in turn): the
    copies they leave are bounded per path, in files and in bytes, oldest dropped first."""
    from agentvfs.mounts._recovery import RecoveryArea

    area = RecoveryArea(os.fspath(tmp_path / "state"), "memory://budget", "/mnt", max_bytes=1000, max_files=6, max_versions=3)

    def keep(path: str, size: int, tag: str) -> str:
        source = tmp_path / f"stage-{tag}"
        source.write_bytes(tag.encode().ljust(size, b"."))
        return area.keep(os.fspath(source), path=path, base=None, reason="conflict").id

    with caplog.at_level(logging.ERROR, logger="agentvfs"):
        ids = [keep("same.txt", 10, f"v{i}") for i in range(5)]
        kept = list_recovered(os.fspath(tmp_path / "state"), "memory://budget")
        assert [entry.id for entry in kept if entry.path == "same.txt"] == ids[-3:]  # the newest 3
        others = [keep(f"f{i}.txt", 10, f"o{i}") for i in range(5)]
        kept = list_recovered(os.fspath(tmp_path / "state"), "memory://budget")
        assert len(kept) == 6 and others[-1] in {entry.id for entry in kept}
        big = keep("big.bin", 900, "big")
        kept = list_recovered(os.fspath(tmp_path / "state"), "memory://budget")
        assert sum(entry.size for entry in kept) <= 1000
        assert big in {entry.id for entry in kept}  # the newest is never the one dropped
        huge = keep("huge.bin", 5000, "huge")  # alone over the budget: kept, all else dropped
        kept = list_recovered(os.fspath(tmp_path / "state"), "memory://budget")
        assert [entry.id for entry in kept] == [huge]
    assert "over its budget" in caplog.text and "dropped" in caplog.text
    # What remains is whole: each kept copy holds the bytes it was kept with.
    assert Path(kept[0].data).read_bytes().startswith(b"huge")
