"""The persistent content cache: entries, the budget across processes, corruption, and reads
through it on every backend (memory and local disk are not cached; S3 and GCS are)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
from agentvfs.errors import StaleFileError
from agentvfs.testing import FilesystemTests, Harness, fsspec_harness
from agentvfs.vfs import (
    SETTLE_SECONDS,
    ContentCache,
    FsspecFilesystem,
    LocalFilesystem,
    ObjectStoreBackend,
    default_cache_dir,
)
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024


def _du(directory: Path) -> int:
    """Bytes the files under ``directory`` take on disk. Other processes may be evicting
    entries meanwhile: a file or directory gone between the listing and its stat counts 0."""
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _fills(directory: Path) -> list[Path]:
    """Entries being written (each process's credit file aside)."""
    return [p for p in (directory / "v1" / "tmp").iterdir() if not p.name.endswith(".credit")]


# -- entries -------------------------------------------------------------------------------------


def test_put_get_open_and_a_new_instance_sees_the_entry(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=64 * MiB)
    key = cache.key("s3://host", "bucket/a.txt", "etag-1")
    assert cache.get(key, 5) is None
    assert cache.put(key, b"hello")
    assert cache.get(key, 5) == b"hello"
    again = ContentCache(tmp_path, max_bytes=64 * MiB)  # time passes: a new process
    fd = again.open(key, 5)
    assert fd is not None
    try:
        assert os.pread(fd, 10, 0) == b"hello"
    finally:
        os.close(fd)
    # Another version, path or store is another entry.
    assert again.get(cache.key("s3://host", "bucket/a.txt", "etag-2"), 5) is None
    assert again.get(cache.key("s3://other", "bucket/a.txt", "etag-1"), 5) is None
    assert again.get(key, 6) is None  # the size the caller expects is part of the check


def test_default_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTVFS_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("AGENTVFS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "agentvfs")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_only_its_owner_may_read_the_cache(tmp_path: Path) -> None:
    """Entries, records, bookkeeping and the metadata database (with its journal files) are
    0600 in directories of mode 0700, whatever the umask; a cache an earlier version left
    open to others is closed when it is next used (its format directory and database; the
    directory given is left as it is)."""
    old_umask = os.umask(0o022)
    try:
        top = tmp_path / "cache"
        cache = ContentCache(top, max_bytes=64 * MiB)
        key = cache.key("s3://h", "b/x", "v")
        assert cache.put(key, b"secret bytes")
        cache.put_stat(cache.key("s3://h", "stat\0b/x", "v@1"), {"size": 12})
        assert cache.get_stat(cache.key("s3://h", "stat\0b/x", "v@1")) == {"size": 12}
        for directory in (top, top / "v1", top / "v1" / "entries", top / "v1" / "entries" / key[:2], top / "v1" / "tmp"):
            assert _mode(directory) == 0o700, directory
        files = [p for p in top.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"stats.sqlite", "stats.sqlite-wal", "stats.sqlite-shm", "used", "lock"}
        for path in files:
            assert _mode(path) == 0o600, path
        # As an earlier version left it: world-readable.
        del cache
        for directory in (top, top / "v1"):
            directory.chmod(0o755)
        for name in ("stats.sqlite", "stats.sqlite-wal", "stats.sqlite-shm"):
            (top / "v1" / name).chmod(0o644)
        again = ContentCache(top, max_bytes=64 * MiB)
        assert again.get_stat(again.key("s3://h", "stat\0b/x", "v@1")) == {"size": 12}
        assert _mode(top / "v1") == 0o700  # what holds every file of the cache
        assert _mode(top) == 0o755  # the directory given is the caller's
        for name in ("stats.sqlite", "stats.sqlite-wal", "stats.sqlite-shm"):
            assert _mode(top / "v1" / name) == 0o600, name
    finally:
        os.umask(old_umask)


def test_bad_budget_is_refused_with_its_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes must be a positive number of bytes, not 0"):
        ContentCache(tmp_path, max_bytes=0)


def _entry_files(cache: ContentCache, key: str) -> tuple[Path, Path]:
    data = Path(cache.directory, "v1", "entries", key[:2], key)
    return data, Path(str(data) + ".m")


def test_an_entry_written_to_in_place_is_dropped_and_not_served(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=64 * MiB)
    key = cache.key("s3://h", "b/x", "v")
    cache.put(key, b"A" * 1000)
    data, record = _entry_files(cache, key)
    with open(data, "r+b") as f:
        f.write(b"B")  # same size, another modification time
    assert cache.open(key, 1000) is None
    assert not data.exists() and not record.exists()


def test_a_corruption_that_keeps_size_and_time_is_caught_by_the_hash(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=64 * MiB)
    key = cache.key("s3://h", "b/x", "v")
    cache.put(key, b"A" * 1000)
    data, _ = _entry_files(cache, key)
    st = data.stat()
    with open(data, "r+b") as f:
        f.write(b"B")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.get(key, 1000) is None  # a whole read checks the hash
    assert not data.exists()


def test_a_truncated_entry_and_a_crash_between_renames_are_never_served(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=64 * MiB)
    key = cache.key("s3://h", "b/x", "v")
    cache.put(key, b"A" * 1000)
    data, _ = _entry_files(cache, key)
    os.truncate(data, 10)
    assert cache.get(key, 1000) is None and cache.open(key, 1000) is None
    # A data file without its record (a crash after the first rename) is no entry, and the
    # next scan removes it.
    key2 = cache.key("s3://h", "b/y", "v")
    cache.put(key2, b"C" * 100)
    data2, record2 = _entry_files(cache, key2)
    record2.unlink()
    assert cache.get(key2, 100) is None
    assert cache.info().entries == 0
    old = time.time() - 3600
    os.utime(data2, (old, old))  # left by a crash, not a commit under way
    cache._evict(cache.max_bytes)
    assert not data2.exists()


def test_fill_in_any_order_then_commit(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=64 * MiB)
    key = cache.key("s3://h", "b/big", "v")
    payload = os.urandom(3 * MiB + 17)
    fill = cache.begin(key, len(payload))
    assert fill is not None
    fill.write(2 * MiB, payload[2 * MiB :])
    with pytest.raises(ValueError, match="bytes missing"):
        fill.commit()
    assert fill.missing() == [(0, 2 * MiB)]
    fill.write(0, payload[: 2 * MiB])
    assert fill.complete and fill.commit()
    assert cache.get(key, len(payload)) == payload
    bad = cache.begin(cache.key("s3://h", "b/o", "v"), 10)
    assert bad is not None
    with pytest.raises(ValueError, match="outside a file of"):
        bad.write(5, b"0123456789")
    bad.abort()


def test_an_aborted_fill_leaves_nothing_and_releases_its_bytes(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path, max_bytes=8 * MiB)
    fill = cache.begin(cache.key("s3://h", "b/a", "v"), 6 * MiB)
    assert fill is not None
    assert cache.begin(cache.key("s3://h", "b/b", "v"), 6 * MiB) is None  # reserved: no room
    fill.abort()
    assert not _fills(Path(cache.directory))
    again = cache.begin(cache.key("s3://h", "b/b", "v"), 6 * MiB)
    assert again is not None
    again.abort()


def test_a_credit_file_never_understates_what_its_process_holds(tmp_path: Path) -> None:
    # Another process's recount reads this file: it may over-state the bytes reserved (an
    # entry takes from the credit without rewriting it) but never under-state them.
    cache = ContentCache(tmp_path / "c", max_bytes=64 * 1024 * 1024)
    credit_file = tmp_path / "c" / "v1" / "tmp" / f"{os.getpid()}.credit"

    def on_file() -> int:
        return int(credit_file.read_text())

    for i in range(40):
        assert cache.put(ContentCache.key("s3://b", f"f{i}", "v"), b"x" * 3000)
        assert on_file() >= cache._credit > 0
    before = cache._credit
    fill = cache.begin(ContentCache.key("s3://b", "given-up", "v"), 5000)
    assert fill is not None and cache._credit < before
    fill.abort()  # its bytes go back to the credit, and to the file at once
    assert cache._credit == before == on_file()
    # The sharded entry directories are made as entries arrive, and again after a clear.
    cache.clear()
    key = ContentCache.key("s3://b", "after-clear", "v")
    shard = tmp_path / "c" / "v1" / "entries" / key[:2]
    if shard.exists():
        shard.rmdir()
    assert cache.put(key, b"y" * 10)
    assert cache.get(key, 10) == b"y" * 10


def test_budget_holds_under_a_fill_of_three_times_it_and_evicts_least_recently_used(tmp_path: Path) -> None:
    budget = 4 * MiB
    cache = ContentCache(tmp_path, max_bytes=budget)
    keys = []
    for i in range(48):  # 48 x 256 KiB = 3x the budget
        key = cache.key("s3://h", f"b/{i}", "v")
        keys.append(key)
        assert cache.put(key, bytes([i % 256]) * (256 * 1024))
        if i == 2:
            time.sleep(0.01)
        assert cache.info().bytes <= budget
        assert _du(tmp_path) <= budget + 64 * 1024  # the records and the lock file beside
        if i >= 1:
            # Keep entry 0 in use: reads make it the most recently used.
            record = _entry_files(cache, keys[0])[1]
            os.utime(record)
    assert cache.get(keys[0], 256 * 1024) == b"\0" * (256 * 1024)
    assert cache.get(keys[1], 256 * 1024) is None  # long evicted
    assert cache.get(keys[-1], 256 * 1024) is not None
    # A file larger than the whole budget is never kept.
    assert not cache.put(cache.key("s3://h", "b/huge", "v"), b"x" * (budget + 1))
    assert cache.clear() > 0 and cache.info().entries == 0


_WORKER = textwrap.dedent(
    """
    import os, random, sys, hashlib
    from agentvfs.vfs import ContentCache
    cache = ContentCache(sys.argv[1], max_bytes=int(sys.argv[2]))
    rng = random.Random(int(sys.argv[3]))
    while True:
        i = rng.randrange(64)
        key = cache.key("s3://h", f"b/{i}", "v1")
        size = 32 * 1024 * (1 + i % 8)
        payload = hashlib.sha256(str(i).encode()).digest() * (size // 32)
        if rng.random() < 0.5:
            got = cache.get(key, size)
            if got is not None and got != payload:
                print("WRONG", i, flush=True)
                os._exit(3)
            fd = cache.open(key, size)
            if fd is not None:
                data = os.pread(fd, size, 0)
                os.close(fd)
                if data != payload:
                    print("WRONG-FD", i, flush=True)
                    os._exit(3)
        else:
            fill = cache.begin(key, size)
            if fill is not None:
                half = size // 2
                fill.write(half, payload[half:])
                fill.write(0, payload[:half])
                fill.commit()
    """
)


def test_processes_sharing_a_cache_with_random_kills(tmp_path: Path) -> None:
    """Several processes read and fill one cache for 3 s while some are killed with SIGKILL at
    random points: no process ever reads a wrong byte, the budget holds, and what the dead left
    behind is cleared by the next scan."""
    budget = 2 * MiB
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    directory = tmp_path / "cache"
    rng = random.Random(7)
    procs: list[subprocess.Popen[bytes]] = []
    logs: dict[int, Path] = {}
    seed = 0

    def spawn() -> None:
        nonlocal seed
        seed += 1
        log = tmp_path / f"worker-{seed}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(script), str(directory), str(budget), str(seed)], stdout=out, stderr=out)
        procs.append(proc)
        logs[proc.pid] = log

    def said(proc: subprocess.Popen[bytes]) -> str:
        return logs[proc.pid].read_text(errors="replace")[-3000:]

    killed = 0
    try:
        for _ in range(4):
            spawn()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.3))
            victim = procs[rng.randrange(len(procs))]
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed += 1
                procs.remove(victim)
                spawn()
            for proc in procs:
                assert proc.poll() is None, f"a worker exited with {proc.returncode}:\n{said(proc)}"
            assert _du(directory / "v1" / "entries") <= budget + 4096 * 64
    finally:
        # Also when an assertion fails: the workers loop until killed.
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert killed >= 3
    cache = ContentCache(directory, max_bytes=budget)
    info = cache.info()
    assert info.bytes + info.pending <= budget
    # A worker killed between its two renames left a data file without its record: counted
    # (as a commit under way) until it is old enough to be known as left by a crash.
    old = time.time() - 3600
    for data in (directory / "v1" / "entries").rglob("*"):
        if data.is_file() and not data.name.endswith(".m") and not Path(f"{data}.m").exists():
            os.utime(data, (old, old))
    cache._evict(budget)
    assert cache.info().pending == 0
    # The next reservation scans: fills of dead processes are removed.
    fill = cache.begin(cache.key("s3://h", "b/new", "v"), budget // 2)
    assert fill is not None
    fill.abort()
    cache._evict(budget)
    assert not _fills(directory)
    for i in range(64):
        size = 32 * 1024 * (1 + i % 8)
        got = cache.get(cache.key("s3://h", f"b/{i}", "v1"), size)
        assert got is None or got == hashlib.sha256(str(i).encode()).digest() * (size // 32)


# -- reads through the cache ----------------------------------------------------------------------


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A fresh root on one backend: a function making a cached filesystem over it, a raw fsspec
    instance to change storage behind its back, and the root's path in it."""
    kind = request.param
    if kind == "memory":
        from fsspec.implementations.memory import MemoryFileSystem

        raw: Any = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        root = f"/{unique('ws')}"
    elif kind == "local":
        from fsspec.implementations.local import LocalFileSystem

        raw = LocalFileSystem()
        root = str(tmp_path / "root")
        os.makedirs(root)
    elif kind == "s3":
        raw = request.getfixturevalue("moto").s3fs(use_listings_cache=False)
        root = f"{S3_BUCKET}/{unique('ws')}"
    else:
        raw = request.getfixturevalue("fake_gcs").gcsfs()
        root = f"{GCS_BUCKET}/{unique('ws')}"

    def make(**kw: Any) -> FsspecFilesystem:
        return FsspecFilesystem(raw, root=root, **({"cache": str(tmp_path / "cache")} | kw))

    def put(path: str, data: bytes) -> None:
        raw.pipe_file(f"{root}/{path}", data)
        raw.invalidate_cache()

    return {"kind": kind, "make": make, "put": put, "raw": raw, "root": root}


async def _settle(store: dict[str, Any]) -> None:
    """Wait until what was just written can be cached: on S3 (an ETag is an MD5) a version is
    kept once a listing shows its modification time settled."""
    if store["kind"] == "s3":
        await asyncio.sleep(SETTLE_SECONDS + 1.1)


def _gets(fs: FsspecFilesystem) -> list[str]:
    """Count the whole-object and ranged GETs of ``fs`` (by path) from now on."""
    seen: list[str] = []
    backend = fs.backend
    assert isinstance(backend, ObjectStoreBackend)
    exact = backend.read_exact_version_sync
    plain = backend.cat_many

    def counted_exact(rel: str, *args: Any) -> Any:
        seen.append(rel)
        return exact(rel, *args)

    def counted_plain(rels: list[str], *args: Any) -> Any:
        seen.extend(rels)
        return plain(rels, *args)

    backend.read_exact_version_sync = counted_exact  # type: ignore[method-assign,assignment]
    backend.cat_many = counted_plain  # type: ignore[method-assign,assignment]
    return seen


def _calls(owner: Any, name: str) -> list[str]:
    """The first argument of every call of ``owner.name`` from now on."""
    seen: list[str] = []
    plain = getattr(owner, name)

    def counted(first: str, *args: Any) -> Any:
        seen.append(first)
        return plain(first, *args)

    setattr(owner, name, counted)
    return seen


def _heads(fs: FsspecFilesystem) -> list[str]:
    """Count the stats (HEADs on S3) ``fs`` sends to storage from now on."""
    return _calls(fs.backend, "info")


async def test_reads_hit_the_cache_across_instances_and_never_serve_a_changed_file(store: dict[str, Any]) -> None:
    fs = store["make"](metadata_ttl=30)
    await fs.write_file("docs/a.txt", "first")
    await fs.write_file("docs/b.txt", "TODO b")
    await _settle(store)
    fs = store["make"](metadata_ttl=30)  # one that has not seen them unsettled
    assert await fs.read_file("docs/a.txt", encoding="utf-8") == "first"
    if store["kind"] in ("memory", "local"):
        assert fs.cache is None  # nothing to cache: the files are already here
        store["put"]("docs/a.txt", b"changed")
        assert await fs.read_file("docs/a.txt", encoding="utf-8") == "changed"
        return
    assert fs.cache is not None
    # A new filesystem object (a new process would be the same) finds the entry.
    other = store["make"](metadata_ttl=30)
    gets = _gets(other)
    assert await other.read_file("docs/a.txt", encoding="utf-8") == "first"
    assert gets == []
    # Changed directly in storage: within the TTL the version seen is trusted; a new object
    # (or the TTL passing) asks storage and reads the new version, never the old bytes.
    store["put"]("docs/a.txt", b"second version")
    fresh = store["make"](metadata_ttl=0)
    assert await fresh.read_file("docs/a.txt", encoding="utf-8") == "second version"
    short = store["make"](metadata_ttl=0.5)
    assert await short.read_file("docs/a.txt", encoding="utf-8") == "second version"
    store["put"]("docs/a.txt", b"third")
    await asyncio.sleep(0.6)
    assert await short.read_file("docs/a.txt", encoding="utf-8") == "third"
    # A change made through the same object is seen at once, whatever the TTL.
    await other.write_file("docs/a.txt", "fourth")
    assert await other.read_file("docs/a.txt", encoding="utf-8") == "fourth"
    await other.delete_file("docs/a.txt")
    with pytest.raises(FileNotFoundError):
        await other.read_file("docs/a.txt")


async def test_grep_and_read_many_take_versions_from_the_listing(store: dict[str, Any]) -> None:
    if store["kind"] in ("memory", "local"):
        pytest.skip("memory and local disk are not cached")
    fs = store["make"](metadata_ttl=30)
    for i in range(12):
        await fs.write_file(f"src/m{i}.py", f"x = {i}\n" + ("# TODO\n" if i % 3 == 0 else ""))
    await fs.write_file("src/ünïcode ✓.py", "# TODO unicode\n")
    await _settle(store)
    first = store["make"](metadata_ttl=30)
    found = await first.grep("TODO", "src")
    assert len(found) == 5
    second = store["make"](metadata_ttl=30)
    gets = _gets(second)
    assert [r.path for r in await second.grep("TODO", "src")] == [r.path for r in found]
    assert gets == []  # one listing, every file from the cache
    got = await second.read_many(["src/m1.py", "src/m2.py", "src/none.py"])
    assert got["src/m1.py"] == b"x = 1\n" and isinstance(got["src/none.py"], FileNotFoundError)
    # A file changed in storage after the listing: the next listing has its new version.
    store["put"]("src/m1.py", b"x = 1  # TODO now\n")
    third = store["make"](metadata_ttl=30)
    assert len(await third.grep("TODO", "src")) == 6


async def test_ranged_and_pinned_reads_fill_and_use_the_cache(store: dict[str, Any]) -> None:
    if store["kind"] in ("memory", "local"):
        pytest.skip("memory and local disk are not cached")
    payload = os.urandom(3 * MiB + 11)
    store["put"]("big.bin", payload)
    await _settle(store)
    fs = store["make"](metadata_ttl=30)
    st = await fs.stat("big.bin")
    assert st.etag is not None
    # A reader going through the file from its start, its parts arriving out of order.
    out = bytearray(len(payload))
    for start in (MiB, 0, 2 * MiB):
        view = memoryview(out)[start : start + MiB]
        assert await fs.read_range_pinned("big.bin", start, view, st.etag) == MiB
    tail = memoryview(out)[3 * MiB :]
    assert await fs.read_range_pinned("big.bin", 3 * MiB, tail, st.etag) == 11
    assert bytes(out) == payload
    assert fs.cache is not None
    for _ in range(200):  # the parts are written to the cache in a thread of its own
        if fs.cache.info().entries == 1:
            break
        await asyncio.sleep(0.02)
    assert fs.cache.info().entries == 1
    other = store["make"](metadata_ttl=30)
    await other.stat("big.bin")
    gets = _gets(other)
    assert await other.read_range("big.bin", 5, 105) == payload[5:105]
    buf = bytearray(10)
    assert await other.read_range_pinned("big.bin", 100, memoryview(buf), st.etag) == 10
    assert bytes(buf) == payload[100:110]
    assert gets == []
    # Replaced in storage: a reader pinned to the old version is served that version from the
    # cache (the bytes it opened), and a new reader gets the new one.
    store["put"]("big.bin", b"new")
    buf = bytearray(10)
    assert await other.read_range_pinned("big.bin", 0, memoryview(buf), st.etag) == 10
    assert bytes(buf) == payload[:10]
    newer = store["make"](metadata_ttl=0)
    assert await newer.read_file("big.bin") == b"new"
    # Without the old version in the cache, a read pinned to it fails: never the new bytes.
    with pytest.raises(StaleFileError):
        await store["make"](cache=False).read_range_pinned("big.bin", 0, memoryview(bytearray(10)), st.etag)


#: Two 128-byte blocks with one MD5 (Wang et al., 2004): one S3 ETag.
_MD5_A = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
)
_MD5_B = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
)


@pytest.mark.s3
async def test_other_bytes_of_a_cached_etag_are_never_served_the_old_ones(moto: Any, tmp_path: Path) -> None:
    """On S3 an ETag is the MD5 of the bytes: rewritten with a collision, a file keeps it.
    The entry of the old bytes is never served for the new ones, whether the rewrite came
    seconds later (another modification time) or in the same second as the cached version
    was written (too recent then to be cached at all)."""
    assert hashlib.md5(_MD5_A).digest() == hashlib.md5(_MD5_B).digest() and _MD5_A != _MD5_B
    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('ws')}"
    boto = moto.boto3_client()
    key = f"{root.split('/', 1)[1]}/tool.bin"

    def make() -> FsspecFilesystem:
        return FsspecFilesystem(raw, root=root, cache=str(tmp_path / "cache"), metadata_ttl=0)

    boto.put_object(Bucket=S3_BUCKET, Key=key, Body=_MD5_A)
    await asyncio.sleep(SETTLE_SECONDS + 1.1)
    first = make()
    assert await first.read_file("tool.bin") == _MD5_A
    assert first.cache is not None and first.cache.info().entries == 1
    boto.put_object(Bucket=S3_BUCKET, Key=key, Body=_MD5_B)
    assert (await first.stat("tool.bin")).etag == hashlib.md5(_MD5_A).hexdigest()
    for fs in (first, make()):
        assert await fs.read_file("tool.bin") == _MD5_B
        assert await fs.read_many(["tool.bin"]) == {"tool.bin": _MD5_B}
        st = await fs.stat("tool.bin")
        buf = bytearray(len(_MD5_B))
        assert await fs.read_range_pinned("tool.bin", 0, memoryview(buf), st.etag or "") == len(buf)
        assert bytes(buf) == _MD5_B
    # Written, read (and so cached, were it settled) and rewritten within one second.
    other = f"{root.split('/', 1)[1]}/fresh.bin"
    for _ in range(10):
        boto.put_object(Bucket=S3_BUCKET, Key=other, Body=_MD5_A)
        written = boto.head_object(Bucket=S3_BUCKET, Key=other)["LastModified"]
        fs = make()
        assert await fs.read_file("fresh.bin") == _MD5_A
        boto.put_object(Bucket=S3_BUCKET, Key=other, Body=_MD5_B)
        if boto.head_object(Bucket=S3_BUCKET, Key=other)["LastModified"] == written:
            break
    else:
        pytest.fail("no two writes within one second in ten tries")
    assert await fs.read_file("fresh.bin") == _MD5_B
    assert await make().read_file("fresh.bin") == _MD5_B


async def test_cache_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cache_bytes applies only with a cache"):
        FsspecFilesystem("memory://", cache_bytes=10)
    with pytest.raises(TypeError, match="cache must be True, a directory or a ContentCache"):
        FsspecFilesystem("memory://", cache=3)  # type: ignore[arg-type]
    shared = ContentCache(tmp_path)
    with pytest.raises(TypeError, match="not to a ContentCache given"):
        FsspecFilesystem("memory://", cache=shared, cache_bytes=10)
    assert LocalFilesystem(str(tmp_path)) is not None


# -- the conformance suite with a cache, on the stores that are cached --------------------------------


@pytest.mark.s3
class TestS3Cached(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: Any, tmp_path: Path) -> Harness:
        raw = moto.s3fs(use_listings_cache=False)
        return fsspec_harness(
            raw, f"{S3_BUCKET}/{unique('ws')}", name="s3", cache=str(tmp_path / "cache"), metadata_ttl=0.0
        )



def test_records_are_json_naming_the_path_and_version(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path)
    key = cache.key("s3://h", "b/ä.txt", "v9")
    cache.put(key, b"x", describe={"path": "b/ä.txt", "version": "v9"})
    record = json.loads(_entry_files(cache, key)[1].read_text(encoding="utf-8"))
    assert record["path"] == "b/ä.txt" and record["version"] == "v9" and record["size"] == 1


@pytest.mark.s3
async def test_stats_of_listed_versions_are_kept_and_a_metadata_change_is_seen(moto: Any, tmp_path: Path) -> None:
    """A mount stats each file a listing shows (S3 lists no metadata): with a cache, the stat
    of a version seen before is answered from its record, with no HEAD; metadata replaced in
    place (same ETag, new time) is read again."""
    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('ws')}"
    client = moto.boto3_client()
    key = f"{root.split('/', 1)[1]}/tool.sh"
    client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"#!/bin/sh\n", Metadata={"mode": "33261"})
    await asyncio.sleep(SETTLE_SECONDS + 1.1)  # records are kept of settled versions only (S3)

    def make() -> FsspecFilesystem:
        return FsspecFilesystem(raw, root=root, cache=str(tmp_path / "cache"), metadata_ttl=30)

    first = make()
    await first.list_stats("")
    st = await first.stat("tool.sh")
    assert st.metadata is not None and st.metadata.get("mode") == "33261"
    second = make()
    assert second.cache is not None
    one_by_one = _calls(second.cache, "get_stat")
    await second.list_stats("")  # reads the records of what it lists, in one query
    heads = _heads(second)
    again = await second.stat("tool.sh")
    assert heads == [] and again == dataclasses.replace(st)
    assert one_by_one == []  # answered from the records the listing read
    time.sleep(1.1)  # a new modification time, to the second
    client.copy_object(
        Bucket=S3_BUCKET, Key=key, CopySource={"Bucket": S3_BUCKET, "Key": key},
        Metadata={"mode": "33188"}, MetadataDirective="REPLACE",
    )  # fmt: skip
    third = make()
    await third.list_stats("")
    changed = await third.stat("tool.sh")
    assert changed.etag == st.etag and changed.metadata is not None and changed.metadata.get("mode") == "33188"


@pytest.mark.s3
async def test_listings_of_subdirectories_are_fetched_ahead_and_used_once(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentvfs.vfs import _cached_reads

    monkeypatch.setattr(_cached_reads, "_LIST_AHEAD_AGE", 60.0)  # however slow this machine is
    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('ws')}"
    for d in range(3):
        raw.pipe_file(f"{root}/pkg{d}/mod.py", b"x = 1\n")
    fs = FsspecFilesystem(raw, root=root, cache=str(tmp_path / "cache"), metadata_ttl=300)
    listed: list[str] = []
    plain = fs.backend.list_stats_sync

    def counted(rel: str, display: str) -> Any:
        listed.append(rel)
        return plain(rel, display)

    fs.backend.list_stats_sync = counted  # type: ignore[method-assign]
    top = await fs.list_stats("")
    assert sorted(s.name for s in top) == ["pkg0", "pkg1", "pkg2"]
    for _ in range(100):  # the three listings ahead run in the background
        if len(listed) == 4:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    assert sorted(listed) == ["", "pkg0", "pkg1", "pkg2"]
    assert [s.name for s in await fs.list_stats("pkg0")] == ["mod.py"]
    # A change made here below a directory fetched ahead: that listing is not used.
    await fs.write_file("pkg1/new.py", "y = 2\n")
    assert sorted(s.name for s in await fs.list_stats("pkg1")) == ["mod.py", "new.py"]
    assert sorted(listed) == ["", "pkg0", "pkg1", "pkg1", "pkg2"]
    # Used once: the next listing of pkg0 asks storage.
    await fs.list_stats("pkg0")
    assert listed.count("pkg0") == 2


@pytest.mark.s3
async def test_the_stat_of_a_small_file_is_one_get_that_fills_the_cache(moto: Any, tmp_path: Path) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('ws')}"
    moto.boto3_client().put_object(
        Bucket=S3_BUCKET, Key=f"{root.split('/', 1)[1]}/small.txt", Body=b"tiny", Metadata={"mode": "33188"}
    )
    raw.pipe_file(f"{root}/big.bin", b"b" * (128 * 1024))
    await asyncio.sleep(SETTLE_SECONDS + 1.1)  # an S3 version is cached once its time is settled
    fs = FsspecFilesystem(raw, root=root, cache=str(tmp_path / "cache"), metadata_ttl=30)
    await fs.list_stats("")
    heads = _heads(fs)
    small = await fs.stat("small.txt")
    assert small.metadata == {"mode": "33188"} and small.size == 4
    assert heads == []  # answered by the GET, which also filled the cache
    gets = _gets(fs)
    assert await fs.read_file("small.txt") == b"tiny" and gets == []
    await fs.stat("big.bin")  # larger files are not fetched for a stat
    assert heads == ["big.bin"]


def test_a_process_is_alive_until_it_exits_and_a_zombie_counts_as_gone() -> None:
    # The cache's scan, the sandbox's cgroup sweep and `agentvfs unmount` share this check.
    from agentvfs._procs import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert pid_alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; not reaped yet, it is a zombie
        assert wait_until(lambda: not pid_alive(child.pid))
    finally:
        child.wait()
    assert not pid_alive(child.pid)
    assert pid_alive(os.getpid())


def test_a_process_whose_first_thread_exited_is_alive_while_another_runs() -> None:
    # Linux shows the leader as a zombie once its own thread exits; the process runs on.
    from agentvfs._procs import pid_alive

    code = textwrap.dedent("""
        import ctypes, sys, threading
        threading.Thread(target=sys.stdin.read).start()
        ctypes.CDLL(None).syscall(60, 0)  # exit(2): this thread only
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        def leader_state() -> str:
            with open(f"/proc/{child.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        assert wait_until(lambda: leader_state() == "Z")
        assert pid_alive(child.pid)  # its other thread still reads
        assert child.stdin is not None
        child.stdin.close()
        assert wait_until(lambda: not pid_alive(child.pid))
    finally:
        child.wait()
