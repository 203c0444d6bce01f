"""One set of timed file operations, done through a directory or through an fsspec API.

Every suite speaks to a `Target`, so the same case runs unchanged on direct fsspec access,
on the agentvfs mount, on a peer mounter and on local disk: the mechanism that makes rows
comparable. Each timed method returns seconds and checks what it did (byte counts, entry
counts), raising `OSError` when the layer returned something else.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._context import Timeout

__all__ = ["Boto3Target", "FsspecTarget", "PathTarget", "Target", "ls_long", "read_path", "sha256_path", "watchdog", "write_path"]

BLOCK = 1 << 20  # dd-like block for sequential reads


@contextlib.contextmanager
def watchdog(kill: Callable[[], None] | None, seconds: float, what: str) -> Iterator[None]:
    """Call ``kill`` (which stops a mount's server, so the pending system calls fail with
    ENOTCONN) if the block runs longer than ``seconds``, and raise `Timeout` then."""
    if kill is None:
        yield
        return
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        kill()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except OSError as exc:
        if fired.is_set():
            raise Timeout(f"{what} still running after {seconds:.0f} s; the mount was killed") from exc
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise Timeout(f"{what} still running after {seconds:.0f} s; the mount was killed")


def write_path(path: str, block: bytes, count: int, *, fsync: bool = True) -> float:
    """Create ``path`` from ``count`` writes of ``block``, optionally ``fsync``; seconds until
    ``close`` returned (close is where many mounts upload).

    Dirty pages of earlier steps are written out first, or the disk is still busy with them and
    whichever layer runs next pays for it."""
    os.sync()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(count):
            if os.write(fd, block) != len(block):
                raise OSError(f"short write to {path}")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def read_path(path: str, expect: int) -> float:
    """Read ``path`` start to end in 1 MiB ``readv`` calls (unbuffered, as dd does); seconds."""
    view = memoryview(bytearray(BLOCK))
    total = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while n := os.readv(fd, [view]):
            total += n
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    if total != expect:
        raise OSError(f"read {total} bytes from {path}, expected {expect}")
    return dt


def ls_long(path: str, expect: int, timeout: float) -> float:
    """``ls -l path`` as a subprocess (output discarded); seconds. Checks the entry count."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(["ls", "-l", path], capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Timeout(f"ls -l still running after {timeout:.0f} s") from exc
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise OSError(f"ls -l {path} exited {out.returncode}: {out.stderr.decode(errors='replace').strip()[:300]}")
    entries = len(out.stdout.splitlines()) - 1  # minus the "total" line
    if entries != expect:
        raise OSError(f"ls -l {path} listed {entries} entries, expected {expect}")
    return dt


def sha256_path(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 * BLOCK):
            h.update(chunk)
    return h.hexdigest()



class Target(ABC):
    """Timed operations on one layer; paths are relative to the layer's root.

    Parameters
    ----------
    layer, backend : str
        Names for messages.
    kill : callable, optional
        Stops the layer's server when an operation hangs (a mount's watchdog); the pending
        system calls then fail with ENOTCONN and the operation reports `Timeout`.
    """

    #: A directory where shell commands see the layer's files, or None (API access only).
    path: str | None = None

    def __init__(self, layer: str, backend: str, kill: Callable[[], None] | None = None) -> None:
        self.layer = layer
        self.backend = backend
        self._kill = kill

    def guard(self, seconds: float, what: str) -> contextlib.AbstractContextManager[None]:
        """Kill the layer if the block runs longer than ``seconds``; raise `Timeout` then."""
        return watchdog(self._kill, seconds, what)

    @abstractmethod
    def makedirs(self, rel: str) -> None: ...

    @abstractmethod
    def write_file(self, rel: str, block: bytes, count: int, *, fsync: bool = True) -> float:
        """Create ``rel`` from ``count`` writes of ``block``; seconds until close returned."""

    @abstractmethod
    def read_file(self, rel: str, expect: int) -> float:
        """Read ``rel`` from start to end; seconds."""

    @abstractmethod
    def read_ranges(self, rel: str, offsets: Sequence[int], length: int) -> list[float]:
        """Read ``length`` bytes at each offset, in order; seconds of each read."""

    @abstractmethod
    def write_ranges(self, rel: str, offsets: Sequence[int], block: bytes) -> float:
        """Overwrite ``block`` at each offset of the existing ``rel``, then make it durable."""

    @abstractmethod
    def create_files(self, rel_dir: str, names: Sequence[str], payload: bytes) -> float: ...

    @abstractmethod
    def stat_files(self, rel_dir: str, names: Sequence[str]) -> float: ...

    @abstractmethod
    def list_long(self, rel_dir: str, expect: int, timeout: float) -> float:
        """List ``rel_dir`` with sizes and times (``ls -l``); checks the entry count."""

    @abstractmethod
    def unlink_files(self, rel_dir: str, names: Sequence[str]) -> float: ...

    @abstractmethod
    def sha256(self, rel: str) -> str:
        """Digest of ``rel`` (untimed, to verify what a timed operation did)."""

    @abstractmethod
    def remove(self, rel: str) -> None:
        """Remove a file or a whole tree; missing is fine."""

    @abstractmethod
    def read_all(self, rel: str) -> bytes:
        """The whole content of ``rel`` (untimed, to verify)."""


class PathTarget(Target):
    """Plain ``os`` calls on a directory: a mount point, or local disk as the physical limit."""

    def __init__(self, layer: str, backend: str, root: str, kill: Callable[[], None] | None = None) -> None:
        super().__init__(layer, backend, kill)
        self.path = root

    def _p(self, rel: str) -> str:
        return os.path.join(self.path or "", rel)

    def makedirs(self, rel: str) -> None:
        os.makedirs(self._p(rel), exist_ok=True)

    def write_file(self, rel: str, block: bytes, count: int, *, fsync: bool = True) -> float:
        return write_path(self._p(rel), block, count, fsync=fsync)

    def read_file(self, rel: str, expect: int) -> float:
        return read_path(self._p(rel), expect)

    def read_ranges(self, rel: str, offsets: Sequence[int], length: int) -> list[float]:
        path = self._p(rel)
        times: list[float] = []
        fd = os.open(path, os.O_RDONLY)
        try:
            for off in offsets:
                t0 = time.perf_counter()
                n = len(os.pread(fd, length, off))
                times.append(time.perf_counter() - t0)
                if n != length:
                    raise OSError(f"pread of {length} bytes at {off} in {path} returned {n}")
        finally:
            os.close(fd)
        return times

    def write_ranges(self, rel: str, offsets: Sequence[int], block: bytes) -> float:
        path = self._p(rel)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY)
        try:
            for off in offsets:
                if os.pwrite(fd, block, off) != len(block):
                    raise OSError(f"short pwrite to {path} at {off}")
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.perf_counter() - t0

    def create_files(self, rel_dir: str, names: Sequence[str], payload: bytes) -> float:
        d = self._p(rel_dir)
        t0 = time.perf_counter()
        for name in names:
            fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
        return time.perf_counter() - t0

    def stat_files(self, rel_dir: str, names: Sequence[str]) -> float:
        d = self._p(rel_dir)
        stat, join = os.stat, os.path.join
        t0 = time.perf_counter()
        for name in names:
            stat(join(d, name))
        return time.perf_counter() - t0

    def list_long(self, rel_dir: str, expect: int, timeout: float) -> float:
        return ls_long(self._p(rel_dir), expect, timeout)

    def unlink_files(self, rel_dir: str, names: Sequence[str]) -> float:
        d = self._p(rel_dir)
        t0 = time.perf_counter()
        for name in names:
            os.unlink(os.path.join(d, name))
        return time.perf_counter() - t0

    def sha256(self, rel: str) -> str:
        return sha256_path(self._p(rel))

    def read_all(self, rel: str) -> bytes:
        with open(self._p(rel), "rb") as f:
            return f.read()

    def remove(self, rel: str) -> None:
        import shutil

        path = self._p(rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


class FsspecTarget(Target):
    """The backend's own fsspec API, in this process: the baseline of every ratio.

    Object stores have no in-place write, so `write_ranges` does what an API user must: read
    the whole object, patch it, write it back.
    """

    def __init__(self, layer: str, backend: str, fs: Any, root: str) -> None:
        super().__init__(layer, backend)
        self.fs = fs
        self.root = root.rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self._local = "file" in protocols  # paths are local paths: writes can be fsynced

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _fresh(self) -> None:
        # A listing cache would make every second call free; the mounts are measured cold too.
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()

    def makedirs(self, rel: str) -> None:
        self.fs.makedirs(self._p(rel), exist_ok=True)

    def write_file(self, rel: str, block: bytes, count: int, *, fsync: bool = True) -> float:
        path = self._p(rel)
        t0 = time.perf_counter()
        with self.fs.open(path, "wb") as f:
            for _ in range(count):
                f.write(block)
        if fsync and self._local:
            # Local files are durable only once synced; the other layers' writes include it.
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return time.perf_counter() - t0

    def read_file(self, rel: str, expect: int) -> float:
        t0 = time.perf_counter()
        n = len(self.fs.cat_file(self._p(rel)))
        dt = time.perf_counter() - t0
        if n != expect:
            raise OSError(f"cat_file returned {n} bytes, expected {expect}")
        return dt

    def read_ranges(self, rel: str, offsets: Sequence[int], length: int) -> list[float]:
        path = self._p(rel)
        times: list[float] = []
        for off in offsets:
            t0 = time.perf_counter()
            n = len(self.fs.cat_file(path, start=off, end=off + length))
            times.append(time.perf_counter() - t0)
            if n != length:
                raise OSError(f"ranged read of {length} bytes at {off} returned {n}")
        return times

    def write_ranges(self, rel: str, offsets: Sequence[int], block: bytes) -> float:
        path = self._p(rel)
        t0 = time.perf_counter()
        data = bytearray(self.fs.cat_file(path))
        for off in offsets:
            data[off : off + len(block)] = block
        self.fs.pipe_file(path, bytes(data))
        return time.perf_counter() - t0

    def create_files(self, rel_dir: str, names: Sequence[str], payload: bytes) -> float:
        d = self._p(rel_dir)
        t0 = time.perf_counter()
        for name in names:
            self.fs.pipe_file(f"{d}/{name}", payload)
        return time.perf_counter() - t0

    def stat_files(self, rel_dir: str, names: Sequence[str]) -> float:
        d = self._p(rel_dir)
        self._fresh()
        t0 = time.perf_counter()
        for name in names:
            self.fs.info(f"{d}/{name}")
        return time.perf_counter() - t0

    def list_long(self, rel_dir: str, expect: int, timeout: float) -> float:
        d = self._p(rel_dir)
        self._fresh()
        t0 = time.perf_counter()
        n = len(self.fs.ls(d, detail=True))
        dt = time.perf_counter() - t0
        if n != expect:
            raise OSError(f"ls {d} listed {n} entries, expected {expect}")
        return dt

    def unlink_files(self, rel_dir: str, names: Sequence[str]) -> float:
        d = self._p(rel_dir)
        t0 = time.perf_counter()
        for name in names:
            self.fs.rm_file(f"{d}/{name}")
        return time.perf_counter() - t0

    def sha256(self, rel: str) -> str:
        return hashlib.sha256(self.fs.cat_file(self._p(rel))).hexdigest()

    def read_all(self, rel: str) -> bytes:
        self._fresh()
        data: bytes = self.fs.cat_file(self._p(rel))
        return data

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.rm(self._p(rel), recursive=True)
        self._fresh()


class Boto3Target(Target):
    """S3 through boto3, the AWS SDK: the limit of what a client of the same server gets.

    Reads are single streamed GETs (the fastest read of a whole object measured on s3rver and
    moto), writes go through boto3's managed transfer (multipart with parallel parts above
    8 MiB), listings are ``list_objects_v2`` pages. Random writes read, patch and put back,
    as any object-store client must.
    """

    def __init__(self, layer: str, backend: str, client: Any, bucket: str, prefix: str) -> None:
        super().__init__(layer, backend)
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _k(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def makedirs(self, rel: str) -> None:
        return None  # prefixes exist through their keys

    def write_file(self, rel: str, block: bytes, count: int, *, fsync: bool = True) -> float:
        import io

        body = io.BytesIO(block * count)  # built before the clock: the upload is measured
        t0 = time.perf_counter()
        self.client.upload_fileobj(body, self.bucket, self._k(rel))
        return time.perf_counter() - t0

    def read_file(self, rel: str, expect: int) -> float:
        t0 = time.perf_counter()
        body = self.client.get_object(Bucket=self.bucket, Key=self._k(rel))["Body"]
        total = sum(len(c) for c in body.iter_chunks(BLOCK))
        dt = time.perf_counter() - t0
        if total != expect:
            raise OSError(f"GET returned {total} bytes, expected {expect}")
        return dt

    def read_ranges(self, rel: str, offsets: Sequence[int], length: int) -> list[float]:
        times: list[float] = []
        for off in offsets:
            t0 = time.perf_counter()
            got = self.client.get_object(Bucket=self.bucket, Key=self._k(rel), Range=f"bytes={off}-{off + length - 1}")
            n = len(got["Body"].read())
            times.append(time.perf_counter() - t0)
            if n != length:
                raise OSError(f"ranged GET of {length} bytes at {off} returned {n}")
        return times

    def write_ranges(self, rel: str, offsets: Sequence[int], block: bytes) -> float:
        t0 = time.perf_counter()
        data = bytearray(self.client.get_object(Bucket=self.bucket, Key=self._k(rel))["Body"].read())
        for off in offsets:
            data[off : off + len(block)] = block
        self.client.put_object(Bucket=self.bucket, Key=self._k(rel), Body=bytes(data))
        return time.perf_counter() - t0

    def create_files(self, rel_dir: str, names: Sequence[str], payload: bytes) -> float:
        t0 = time.perf_counter()
        for name in names:
            self.client.put_object(Bucket=self.bucket, Key=self._k(f"{rel_dir}/{name}"), Body=payload)
        return time.perf_counter() - t0

    def stat_files(self, rel_dir: str, names: Sequence[str]) -> float:
        t0 = time.perf_counter()
        for name in names:
            self.client.head_object(Bucket=self.bucket, Key=self._k(f"{rel_dir}/{name}"))
        return time.perf_counter() - t0

    def list_long(self, rel_dir: str, expect: int, timeout: float) -> float:
        t0 = time.perf_counter()
        n = 0
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._k(rel_dir) + "/", Delimiter="/")
        for page in pages:
            n += len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
        dt = time.perf_counter() - t0
        if n != expect:
            raise OSError(f"list_objects_v2 listed {n} entries, expected {expect}")
        return dt

    def unlink_files(self, rel_dir: str, names: Sequence[str]) -> float:
        t0 = time.perf_counter()
        for name in names:
            self.client.delete_object(Bucket=self.bucket, Key=self._k(f"{rel_dir}/{name}"))
        return time.perf_counter() - t0

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        for chunk in self.client.get_object(Bucket=self.bucket, Key=self._k(rel))["Body"].iter_chunks(4 * BLOCK):
            h.update(chunk)
        return h.hexdigest()

    def read_all(self, rel: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=self.bucket, Key=self._k(rel))["Body"].read()
        return data

    def remove(self, rel: str) -> None:
        key = self._k(rel)
        with contextlib.suppress(Exception):
            self.client.delete_object(Bucket=self.bucket, Key=key)
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key + "/"):
                for obj in page.get("Contents", []):
                    self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
