"""Two mount processes on one storage: no write is lost without an error to its writer.

Every publish is conditional on the version the mount last saw, so when the other mount
changed the file meanwhile the losing writer's ``close`` fails with ``EIO``, its data goes to
the recovery area, and the winner's version stays. Real ``agentvfs mount`` processes on moto
S3 and on a local directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from _mounted import wait_until
from _mountproc import Storage, mount_point, start_mount
from agentvfs.mounts import fuse_available, list_recovered
from agentvfs.testing import appender_command

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")

KINDS = ["local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)]
#: fake-gcs-server ignores ifGenerationMatch on uploads (real GCS honours it): on the emulator
#: two mounts racing within milliseconds are caught only by the check just before the upload.
RACING_KINDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]

@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[tuple[str, str]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = mount_point(tmp_path / "a")
    second = mount_point(tmp_path / "b")
    yield next(first), next(second)
    for gen in (first, second):
        next(gen, None)


class _Pair:
    """Two mount processes of one storage, each with its own state directory."""

    def __init__(self, storage: Storage, points: tuple[str, str], tmp_path: Path) -> None:
        self.storage = storage
        self.points = points
        self.states = (tmp_path / "state-a", tmp_path / "state-b")
        self.log = tmp_path / "mounts.log"
        # A short TTL: each mount sees the other's changes soon (the race is still there).
        self.procs = [
            start_mount(storage, point, state, "-o", "metadata_ttl=0.3", log=self.log)
            for point, state in zip(points, self.states, strict=True)
        ]

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=60)

    def kept(self) -> list[str]:
        """The data of every file either mount put into its recovery area."""
        out = []
        for state in self.states:
            for entry in list_recovered(os.fspath(state)):
                with open(entry.data, encoding="utf-8") as f:
                    out.append(f.read())
        return out


@pytest.mark.parametrize("kind", RACING_KINDS)
def test_appends_from_two_mounts_never_lose_a_line_silently(
    kind: str, mounts: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    storage.put("log.txt", b"")
    pair = _Pair(storage, mounts, tmp_path)
    try:
        writers = [
            subprocess.Popen(appender_command(f"{point}/log.txt", tag, 50), stdout=subprocess.PIPE, text=True)
            for point, tag in zip(mounts, ("a", "b"), strict=True)
        ]
        outcomes: dict[str, str] = {}
        for writer in writers:
            out, _ = writer.communicate(timeout=300)
            outcomes.update(json.loads(out))
    finally:
        pair.stop()
    final = (storage.get("log.txt") or b"").decode().splitlines(keepends=True)
    succeeded = {line for line, how in outcomes.items() if how == "ok"}
    failed = {line for line, how in outcomes.items() if how != "ok"}
    # Every append whose close succeeded is in storage, once; every other one was told
    # (EIO) and its file is in a recovery area.
    assert sorted(final) == sorted(succeeded), (len(final), len(succeeded))
    assert all(outcomes[line] == os.strerror(5) for line in failed)
    kept = "".join(pair.kept())
    assert all(line in kept for line in failed)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("elsewhere", ["rm", "mv", "rm -r"])
def test_a_late_close_never_recreates_what_the_other_mount_removed(
    kind: str, elsewhere: str, mounts: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    storage.put("d/f.txt", b"version one\n")
    pair = _Pair(storage, mounts, tmp_path)
    a, b = mounts
    try:
        fd = os.open(f"{b}/d/f.txt", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"written in b\n")
        command = {"rm": ["rm", f"{a}/d/f.txt"], "mv": ["mv", f"{a}/d/f.txt", f"{a}/d/g.txt"], "rm -r": ["rm", "-r", f"{a}/d"]}
        subprocess.run(command[elsewhere], check=True)
        with pytest.raises(OSError) as closed:
            os.close(fd)
        assert closed.value.errno == 5
    finally:
        pair.stop()
    assert storage.get("d/f.txt") is None
    if elsewhere == "mv":
        assert storage.get("d/g.txt") == b"version one\n"
    assert pair.kept() == ["version one\nwritten in b\n"]


@pytest.mark.parametrize("kind", KINDS)
def test_edits_of_two_byte_ranges_one_wins_the_other_is_told(
    kind: str, mounts: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    storage.put("f.bin", b"." * 200)
    pair = _Pair(storage, mounts, tmp_path)
    a, b = mounts
    try:
        fa = os.open(f"{a}/f.bin", os.O_RDWR)
        fb = os.open(f"{b}/f.bin", os.O_RDWR)
        os.pwrite(fa, b"A" * 10, 0)
        os.pwrite(fb, b"B" * 10, 100)
        os.close(fa)  # first close wins
        with pytest.raises(OSError) as closed:
            os.close(fb)
        assert closed.value.errno == 5
        # The loser's mount shows the winner's version now, as the next mount will.
        assert wait_until(lambda: open(f"{b}/f.bin", "rb").read(10) == b"A" * 10)
    finally:
        pair.stop()
    assert storage.get("f.bin") == b"A" * 10 + b"." * 190
    assert pair.kept() == ["." * 100 + "B" * 10 + "." * 90]


def test_a_file_published_on_local_disk_has_one_name_there_while_still_open(
    mounts: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Local disk publishes the staged copy by a link. Its name in the staging area goes at
    # once: every other reader (the second mount among them) sees a file with one link, not
    # a hard link, and the second mount's writes stay atomic publishes, conditional on the
    # version it saw.
    storage = Storage("local", tmp_path, request)
    storage.put("f.txt", b"")
    pair = _Pair(storage, mounts, tmp_path)
    a, b = mounts
    try:
        fd = os.open(f"{a}/f.txt", os.O_RDWR)
        os.write(fd, b"from a\n")
        os.fsync(fd)  # published, still open (its staged copy is kept for the reads)
        assert os.stat(storage.dir / "f.txt").st_nlink == 1
        assert wait_until(lambda: open(f"{b}/f.txt", "rb").read() == b"from a\n")
        assert os.stat(f"{b}/f.txt").st_nlink == 1
        with open(f"{b}/f.txt", "ab") as f:
            f.write(b"from b\n")
        assert os.pread(fd, 100, 0) == b"from a\n"  # a's descriptor keeps a's version
        os.write(fd, b"a again\n")
        with pytest.raises(OSError) as closed:
            os.close(fd)  # over the version a saw, which b replaced: refused
        assert closed.value.errno == 5
    finally:
        pair.stop()
    assert storage.get("f.txt") == b"from a\nfrom b\n"
    assert os.stat(storage.dir / "f.txt").st_nlink == 1
    assert pair.kept() == ["from a\na again\n"]
