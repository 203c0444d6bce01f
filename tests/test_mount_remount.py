"""What a mount shows survives the mount: a tree made through one mount process is checked by
a **new** mount process after the first one exited, on a local directory, on S3 (moto) and
on GCS (fake-gcs-server).

The tree holds what pjdfstest's fixtures make: modes (set-ID and sticky bits, 0000), owners,
nanosecond times, symbolic links (relative, absolute, dangling, to a directory), FIFOs, hard
links, empty directories and unicode and 255-byte names. Each entry must come back with the
same type, mode, owner, modification time, size and link target; a script keeps its +x and
runs. Where storage cannot keep something (hard links on object stores), the call that
would make it fails with EPERM in the first mount, rather than coming back different.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
from _mountproc import CLI, Storage, cli_env, mount_point, start_mount, stop_mount
from agentvfs.mounts import fuse_available, is_mounted

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")

ROOT = os.geteuid() == 0
KINDS = ["local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)]

UNICODE = "résumé ☃ 東京.txt"
LONG = "n" * 251 + ".txt"  # 255 bytes


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    yield from mount_point(tmp_path)


@dataclass(frozen=True)
class Seen:
    """What ``lstat`` and ``readlink`` show of one entry."""

    kind: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int | None
    target: str | None

    @classmethod
    def of(cls, path: str) -> Seen:
        st = os.lstat(path)
        kind = stat.S_IFMT(st.st_mode)
        return cls(
            kind,
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
            st.st_mtime_ns,
            # A link's size is its target path's length, before and after a remount.
            st.st_size if kind in (stat.S_IFREG, stat.S_IFLNK) else None,
            os.readlink(path) if kind == stat.S_IFLNK else None,
        )


def _build(mnt: str, kind: str) -> list[str]:
    """Make the fixture tree through the mount; the names to compare afterwards."""
    m = Path(mnt)
    names: list[str] = []

    def file(name: str, data: bytes, mode: int, mtime_ns: int | None = None) -> None:
        (m / name).write_bytes(data)
        os.chmod(m / name, mode)
        if mtime_ns is not None:
            os.utime(m / name, ns=(mtime_ns, mtime_ns))
        names.append(name)

    (m / "hooks").mkdir()
    file("hooks/pre-commit", b"#!/bin/sh\necho hook ran\nexit 3\n", 0o755)
    file("secret.key", b"k" * 100, 0o600)
    file("shared.txt", b"shared\n", 0o644, 1_600_000_000_123_456_789)
    file("locked", b"", 0o000)
    file(UNICODE, "unicode ☃\n".encode(), 0o640, 1_500_000_000_000_000_001)
    file(LONG, b"long name\n", 0o604)
    if ROOT:
        file("setuid", b"#!/bin/sh\n", 0o4755)
        file("setgid", b"", 0o2710)
        file("owned", b"owned\n", 0o640)
        os.chown(m / "owned", 1234, 5678)
    os.symlink("shared.txt", m / "rel-link")
    os.symlink("/etc/hostname", m / "abs-link")
    os.symlink("no/such/target", m / "dangling")
    os.symlink("hooks", m / "dir-link")
    os.symlink(UNICODE, m / "☃-link")
    names += ["rel-link", "abs-link", "dangling", "dir-link", "☃-link"]
    os.mkfifo(m / "pipe", 0o640)
    names.append("pipe")
    (m / "empty").mkdir()
    (m / "deep/er/est").mkdir(parents=True)
    names += ["empty", "deep/er/est", "hooks"]
    os.chmod(m / "empty", 0o700)
    os.chmod(m / "deep/er", 0o1777)
    (m / "private").mkdir(0o750)
    names += ["deep/er", "private"]
    if ROOT:
        os.chown(m / "private", 1234, 5678)
    if kind == "local":
        os.link(m / "shared.txt", m / "hard-link")
        names.append("hard-link")
    else:
        # Two copies that drift apart after a remount are not made: EPERM, as s3fs-fuse.
        with pytest.raises(OSError) as info:
            os.link(m / "shared.txt", m / "hard-link")
        assert info.value.errno == errno.EPERM
    if ROOT:
        os.lchown(m / "rel-link", 1234, 5678)
    return names


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_mount_process_shows_what_the_last_one_made(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    log = tmp_path / "mount.log"
    first = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        names = _build(mnt, kind)
        before = {name: Seen.of(f"{mnt}/{name}") for name in names}
        inode = os.stat(f"{mnt}/shared.txt").st_ino
        if kind == "local":
            assert os.stat(f"{mnt}/hard-link").st_ino == inode
    finally:
        stop_mount(first, log)
    if kind == "local":
        # On local disk the files themselves hold it all: what the mount showed is the disk.
        for name in names:
            assert Seen.of(os.fspath(storage.dir / name)) == before[name], name
    # A fresh process: nothing of the first one's memory is left.
    second = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        after = {name: Seen.of(f"{mnt}/{name}") for name in names}
        differ = {name: (before[name], after[name]) for name in names if before[name] != after[name]}
        if kind != "local":
            # An object store's directory keeps its mode and owner in its marker object, but
            # not the time of its last entry change (no write per entry made below it).
            differ = {
                n: (a, b) for n, (a, b) in differ.items()
                if a.kind != stat.S_IFDIR or (a.mode, a.uid, a.gid) != (b.mode, b.uid, b.gid)
            }  # fmt: skip
        assert not differ, "\n".join(f"{n}: {a}\n  -> {b}" for n, (a, b) in differ.items())
        assert sorted(os.listdir(mnt)) == sorted({n.split("/")[0] for n in names})
        assert Path(mnt, "rel-link").read_text() == "shared\n"
        assert os.path.isdir(f"{mnt}/dir-link")
        assert stat.S_ISFIFO(os.lstat(f"{mnt}/pipe").st_mode)
        # A git hook keeps its +x: it runs, and its exit status is seen.
        ran = subprocess.run([f"{mnt}/hooks/pre-commit"], capture_output=True, check=False)
        assert (ran.returncode, ran.stdout) == (3, b"hook ran\n")
        if kind == "local":
            # Still one file under two names: a write through one shows through the other.
            assert os.stat(f"{mnt}/hard-link").st_ino == os.stat(f"{mnt}/shared.txt").st_ino
            assert os.stat(f"{mnt}/shared.txt").st_nlink == 2
            with open(f"{mnt}/hard-link", "a") as f:
                f.write("more\n")
            assert Path(mnt, "shared.txt").read_text() == "shared\nmore\n"
        # A rewrite keeps the mode and owner it had.
        with open(f"{mnt}/secret.key", "ab") as f:
            f.write(b"!")
        if ROOT:
            with open(f"{mnt}/owned", "ab") as f:
                f.write(b"!")
    finally:
        stop_mount(second, log)
    third = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        assert Seen.of(f"{mnt}/secret.key").mode == 0o600
        assert Seen.of(f"{mnt}/secret.key").size == 101
        if ROOT:
            owned = Seen.of(f"{mnt}/owned")
            assert (owned.uid, owned.gid, owned.mode) == (1234, 5678, 0o640)
        if kind == "local":
            assert Path(mnt, "hard-link").read_text() == "shared\nmore\n"
    finally:
        stop_mount(third, log)


@pytest.mark.parametrize("kind", KINDS)
def test_chmod_utime_and_rename_of_special_files_persist(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        (m / "f").write_text("data\n")
        os.symlink("f", m / "link")
        os.mkfifo(m / "fifo", 0o600)
        (m / "d").mkdir()
        os.rename(m / "link", m / "d/link")
        os.rename(m / "fifo", m / "d/fifo")
        os.chmod(m / "d/fifo", 0o644)
        os.utime(m / "d/fifo", ns=(1_000_000_001, 2_000_000_002))
        os.utime(m / "d/link", ns=(3_000_000_003, 4_000_000_004), follow_symlinks=False)
        os.chmod(m / "f", 0o700)
        os.utime(m / "f", ns=(5_000_000_005, 6_000_000_006))
        (m / "gone").write_text("x")
        os.symlink("f", m / "gone-link")
        os.unlink(m / "gone-link")
        os.unlink(m / "gone")
    finally:
        stop_mount(proc, log)
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        assert sorted(os.listdir(mnt)) == ["d", "f"]
        assert sorted(os.listdir(f"{mnt}/d")) == ["fifo", "link"]
        fifo, link, f = (Seen.of(f"{mnt}/{n}") for n in ("d/fifo", "d/link", "f"))
        assert (fifo.kind, fifo.mode, fifo.mtime_ns) == (stat.S_IFIFO, 0o644, 2_000_000_002)
        assert (link.kind, link.target, link.mtime_ns) == (stat.S_IFLNK, "f", 4_000_000_004)
        assert (f.mode, f.mtime_ns, f.size) == (0o700, 6_000_000_006, 5)
    finally:
        stop_mount(proc, log)
    if kind != "local":
        # The chmod and utime of a file already in storage did not upload it again: the
        # object keeps its content (a server-side copy or a metadata update).
        assert storage.get("f") == b"data\n"


@pytest.mark.s3
def test_metadata_off_writes_no_metadata_and_keeps_attributes_for_the_mount_only(
    mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("s3", tmp_path, request)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", "-o", "metadata=off", log=log)
    try:
        m = Path(mnt)
        (m / "f").write_text("data\n")
        os.chmod(m / "f", 0o700)
        os.symlink("f", m / "link")
        assert stat.S_IMODE(os.stat(m / "f").st_mode) == 0o700  # the mount's, for its life
        assert os.readlink(m / "link") == "f"
    finally:
        stop_mount(proc, log)
    bucket, _, prefix = storage.prefix.partition("/")
    head = storage.raw.call_s3("head_object", Bucket=bucket, Key=f"{prefix}/f")
    assert head["Metadata"] == {}
    assert storage.get("link") is None  # nothing of the link reached storage
    proc = start_mount(storage, mnt, tmp_path / "state", "-o", "metadata=off", log=log)
    try:
        assert sorted(os.listdir(mnt)) == ["f"]
        assert stat.S_IMODE(os.stat(f"{mnt}/f").st_mode) == 0o644  # file_mode
    finally:
        stop_mount(proc, log)


@pytest.mark.s3
def test_a_chmod_on_s3_copies_the_object_onto_itself_and_sends_no_data(tmp_path: Path, mnt: str, moto: Any) -> None:
    from agentvfs import FsspecFilesystem
    from agentvfs.mounts import Mount
    from conftest import S3_BUCKET, unique

    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('chmod')}"
    raw.pipe_file(f"{root}/data.bin", b"x" * 100_000, Metadata={"owner-team": "infra"})
    calls: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: calls.append(model.name))
    with Mount(FsspecFilesystem(raw, root=root), mnt):
        os.stat(f"{mnt}/data.bin")
        calls.clear()
        os.chmod(f"{mnt}/data.bin", 0o751)
        os.utime(f"{mnt}/data.bin", ns=(1, 2_000_000_003))
        assert "PutObject" not in calls and "UploadPart" not in calls
        assert calls.count("CopyObject") == 2
    bucket, _, prefix = root.partition("/")
    head = raw.call_s3("head_object", Bucket=bucket, Key=f"{prefix}/data.bin")
    assert head["Metadata"]["owner-team"] == "infra"  # another tool's key stays
    assert (head["Metadata"]["mode"], head["Metadata"]["mtime"]) == (str(stat.S_IFREG | 0o751), "2.000000003")
    assert raw.cat_file(f"{root}/data.bin") == b"x" * 100_000


@pytest.mark.s3
def test_s3_special_files_and_outside_chmods_survive_relisting(tmp_path: Path, mnt: str, moto: Any) -> None:
    """S3 lists no metadata: a relisting after ``metadata_ttl`` must not turn a symlink or a
    FIFO into a plain file, and a chmod made elsewhere (a self-copy, same ETag) is seen."""
    import time

    from agentvfs import FsspecFilesystem
    from agentvfs.mounts import Mount
    from conftest import S3_BUCKET, unique

    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('relist')}"
    raw.pipe_file(f"{root}/t/data", b"data")
    with Mount(FsspecFilesystem(raw, root=root), mnt, options={"metadata_ttl": 0.3}):
        os.symlink("data", f"{mnt}/t/link")
        os.mkfifo(f"{mnt}/t/pipe", 0o600)
        os.lchown(f"{mnt}/t/link", 5, 5)
        time.sleep(0.5)
        os.listdir(f"{mnt}/t")
        time.sleep(0.5)
        assert stat.S_ISLNK(os.lstat(f"{mnt}/t/link").st_mode) and os.readlink(f"{mnt}/t/link") == "data"
        assert os.lstat(f"{mnt}/t/link").st_uid == 5
        assert stat.S_ISFIFO(os.lstat(f"{mnt}/t/pipe").st_mode)
        os.chmod(f"{mnt}/t/pipe", 0o640)
        # Another tool's chmod: the object copied onto itself, its ETag unchanged.
        bucket, _, prefix = root.partition("/")
        key = f"{prefix}/t/data"
        time.sleep(1.1)  # a LastModified of its own (S3 keeps it to the second)
        raw.call_s3(
            "copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
            MetadataDirective="REPLACE", Metadata={"mode": str(stat.S_IFREG | 0o600), "uid": "77"},
        )  # fmt: skip
        time.sleep(0.5)
        os.listdir(f"{mnt}/t")
        seen = os.stat(f"{mnt}/t/data")
        assert (stat.S_IMODE(seen.st_mode), seen.st_uid) == (0o600, 77)
    with Mount(FsspecFilesystem(raw, root=root), mnt):
        assert stat.S_ISLNK(os.lstat(f"{mnt}/t/link").st_mode)
        pipe = os.lstat(f"{mnt}/t/pipe")
        assert stat.S_ISFIFO(pipe.st_mode) and stat.S_IMODE(pipe.st_mode) == 0o640


@pytest.mark.s3
def test_a_listing_whose_heads_outlast_the_ttl_is_not_listed_again(mnt: str, moto: Any) -> None:
    """The HEADs that follow a cold S3 listing (one per file new to the mount) can take
    longer than ``metadata_ttl``: the listing is as old as the moment they ended, so an
    ``ls -l`` right after sends no request."""
    import time

    from agentvfs import FsspecFilesystem
    from agentvfs.mounts import Mount
    from agentvfs.vfs import ObjectStoreBackend
    from conftest import S3_BUCKET, unique

    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('warm')}"
    for i in range(64):
        raw.pipe_file(f"{root}/d/f{i:02d}", b"x", Metadata={"mode": str(stat.S_IFREG | 0o640)})
    fs = FsspecFilesystem(raw, root=root)
    backend = fs.backend
    assert isinstance(backend, ObjectStoreBackend) and backend.ranged is not None
    head = backend.ranged.head
    heads: list[str] = []

    def slow_head(path: str) -> dict[str, str] | None:
        heads.append(path)
        time.sleep(0.4)  # 64 HEADs, 32 at a time: 0.8 s, past the TTL of 0.5 s
        return head(path)

    backend.ranged.head = slow_head  # type: ignore[method-assign]
    calls: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: calls.append(model.name))
    with Mount(fs, mnt, options={"metadata_ttl": 0.5}):
        started = time.monotonic()
        cold = subprocess.run(["ls", "-ln", f"{mnt}/d"], capture_output=True, text=True, check=True).stdout
        assert time.monotonic() - started > 0.5
        assert len([h for h in heads if "/d/f" in h]) == 64 and cold.count("-rw-r-----") == 64
        heads.clear()
        calls.clear()
        warm = subprocess.run(["ls", "-ln", f"{mnt}/d"], capture_output=True, text=True, check=True).stdout
        assert warm == cold
        assert (calls, heads) == ([], [])


@pytest.mark.parametrize("kind", KINDS)
def test_a_renamed_directory_keeps_what_is_below_it(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage(kind, tmp_path, request)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        (m / "rr/sub").mkdir(parents=True)
        (m / "rr/sub/tool").write_text("#!/bin/sh\n")
        os.chmod(m / "rr/sub/tool", 0o750)
        os.symlink("sub/tool", m / "rr/link")
        os.mkfifo(m / "rr/pipe", 0o600)
        os.chmod(m / "rr", 0o700)
        os.rename(m / "rr", m / "rr2")
        os.symlink("/etc/hostname", m / "out-link")
        os.rename(m / "out-link", m / "rr2/out-link")  # a link leading out is moved as a name
    finally:
        stop_mount(proc, log)
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        assert sorted(os.listdir(m)) == ["rr2"]
        assert stat.S_IMODE(os.stat(m / "rr2").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(m / "rr2/sub/tool").st_mode) == 0o750
        assert os.readlink(m / "rr2/link") == "sub/tool"
        assert os.readlink(m / "rr2/out-link") == "/etc/hostname"
        assert stat.S_ISFIFO(os.lstat(m / "rr2/pipe").st_mode)
    finally:
        stop_mount(proc, log)


def test_hard_links_across_directories_stay_one_file(mnt: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Staged writes (passthrough off) through any name of a file linked in several
    directories, also one renamed while open, land in the one file on disk."""
    storage = Storage("local", tmp_path, request)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        (m / "a").mkdir()
        (m / "b").mkdir()
        (m / "a/f").write_text("orig\n")
        os.link(m / "a/f", m / "b/f")
        os.link(m / "a/f", m / "a/g")
    finally:
        stop_mount(proc, log)
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        (m / "b/f").write_text("new1\n")  # b listed first: the mount knows one name of three
        assert (m / "a/f").read_text() == "new1\n"
        with open(m / "a/g", "a") as f:
            f.write("more\n")
            f.flush()
            os.rename(m / "a/g", m / "a/h")
    finally:
        stop_mount(proc, log)
    disk = storage.dir
    assert {os.stat(disk / n).st_ino for n in ("a/f", "b/f", "a/h")} == {os.stat(disk / "a/f").st_ino}
    assert (disk / "b/f").read_text() == "new1\nmore\n"


@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("passthrough", ["true", "false"])
def test_no_set_id_file_of_the_mount_user_for_someone_else(
    passthrough: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A mount that may not give files away (no CAP_CHOWN) keeps a file another user made as
    its own: it shows that owner, and that user cannot make it a set-user-ID program."""
    storage = Storage("local", tmp_path, request)
    os.chmod(storage.dir, 0o1777)
    log = tmp_path / "mount.log"
    # A mount point the other user can reach (pytest's directories are 0700).
    outer = Path(tempfile.mkdtemp(prefix="agentvfs-nobody-"))
    outer.chmod(0o755)
    mnt = os.fspath(outer / "mnt")
    os.mkdir(mnt)
    argv = [
        "setpriv", "--inh-caps=-chown", "--bounding-set=-chown", *CLI, "mount", os.fspath(storage.dir), mnt,
        "-o", f"state_dir={tmp_path / 'state'}", "-o", "allow_other=true", "-o", f"passthrough={passthrough}",
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=cli_env())
    try:
        assert wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=30), log.read_text()
        os.mkdir(f"{mnt}/pub")
        os.chmod(f"{mnt}/pub", 0o1777)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        subprocess.run([*nobody, "cp", "/usr/bin/id", f"{mnt}/pub/evil"], check=True)
        subprocess.run([*nobody, "chmod", "4755", f"{mnt}/pub/evil"], check=False, capture_output=True)
        on_disk = os.stat(storage.dir / "pub/evil")
        assert not (on_disk.st_uid == 0 and on_disk.st_mode & stat.S_ISUID), stat.filemode(on_disk.st_mode)
        seen = os.stat(f"{mnt}/pub/evil")
        assert (seen.st_uid, seen.st_mode & 0o7777) == (on_disk.st_uid, on_disk.st_mode & 0o7777)
    finally:
        stop_mount(proc, log)
        shutil.rmtree(outer, ignore_errors=True)


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_renamed_while_written_keeps_its_attributes(
    kind: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A rename of a file with unpublished writes publishes it under the new name: with the
    # mode and times the mount shows, as its close would have.
    storage = Storage(kind, tmp_path, request)
    log = tmp_path / "mount.log"
    first = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        fd = os.open(f"{mnt}/draft.sh", os.O_CREAT | os.O_WRONLY, 0o700)
        os.write(fd, b"#!/bin/sh\nexit 0\n")
        os.utime(fd, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
        os.rename(f"{mnt}/draft.sh", f"{mnt}/run.sh")
        os.close(fd)
        before = Seen.of(f"{mnt}/run.sh")
    finally:
        stop_mount(first, log)
    assert (before.mode, before.mtime_ns) == (0o700, 1_600_000_000_123_456_789)
    second = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        assert Seen.of(f"{mnt}/run.sh") == before
        assert not os.path.lexists(f"{mnt}/draft.sh")
    finally:
        stop_mount(second, log)
