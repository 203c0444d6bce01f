"""Access layers: direct fsspec, local disk, the agentvfs mount and the peer mounters.

Every mount but the memory backend's runs in a process of its own, so the process measuring
does not share a GIL with a Python FUSE server, and each is mounted afresh where a figure
claims "cold". The `Harness` owns every process, mount point and scratch directory, so one
``close`` (in a ``finally``, also on Ctrl-C) undoes all of it.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..mounts import is_mounted
from ._backends import Backend
from ._model import DIRECT
from ._system import stop_process, tail, unmount
from ._targets import Boto3Target, FsspecTarget, PathTarget, Target

__all__ = ["AGENTVFS", "LOCAL_DISK", "PEERS", "Harness", "LayerSpec", "MountFailed", "layers_for"]

AGENTVFS = "agentvfs"
LOCAL_DISK = "local disk"
FSSPEC_FUSE = "fsspec.fuse"
RCLONE = "rclone"
S3FS_FUSE = "s3fs-fuse"
PEERS = (LOCAL_DISK, FSSPEC_FUSE, RCLONE, S3FS_FUSE)
MOUNT_READY_TIMEOUT_S = 30.0


class MountFailed(RuntimeError):
    """A layer did not come up as a mount (its process exited or never mounted)."""


@dataclass
class RunningMount:
    """One mount served by a process of ours (or by a thread, for the memory backend)."""

    layer: str
    mountpoint: str
    proc: subprocess.Popen[bytes] | None
    log_path: Path
    #: Our CLI stops on SIGTERM (and drains uploads); the peers stop on ``fusermount3 -u``.
    sigterm_first: bool
    handle: Any = None  # an in-process agentvfs Mount
    problems: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.handle is not None:
            try:
                self.handle.close()
            except Exception as exc:
                self.problems.append(f"{self.layer}: unmount failed: {exc}")
            unmount(self.mountpoint)
            return
        proc = self.proc
        assert proc is not None
        if proc.poll() is None and self.sigterm_first and not stop_process(proc, grace=30):
            self.problems.append(f"{self.layer}: did not exit within 30 s of SIGTERM")
        if not unmount(self.mountpoint):
            self.problems.append(f"{self.layer}: {self.mountpoint} still mounted after fusermount3 -uz")
        if proc.poll() is None:
            try:
                proc.wait(10)  # a peer exits on its own once unmounted
            except subprocess.TimeoutExpired:
                stop_process(proc)

    def kill(self) -> None:
        """Watchdog path: a hung server cannot answer, so kill it (pending requests then fail
        with ENOTCONN) and detach the mount point."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        unmount(self.mountpoint)


class Harness:
    """Owns the processes, mounts and scratch directories of a run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.mounts: list[RunningMount] = []
        self.problems: list[str] = []
        self.broken: set[tuple[str, str]] = set()  # (backend, layer) that failed to mount once
        self.ready_times: dict[str, list[float]] = {}
        self._n = 0

    def scratch(self, name: str) -> str:
        self._n += 1
        path = self.workdir / f"{name.replace(' ', '-')}-{self._n}"
        path.mkdir(parents=True)
        return str(path)

    def _wait_mounted(self, m: RunningMount, t0: float, backend: str) -> None:
        while not (is_mounted(m.mountpoint) and os.path.ismount(m.mountpoint)):
            if m.proc is not None and m.proc.poll() is not None:
                self.broken.add((backend, m.layer))
                raise MountFailed(f"{m.layer} exited with {m.proc.returncode} before mounting: {tail(m.log_path)}")
            if time.perf_counter() - t0 > MOUNT_READY_TIMEOUT_S:
                m.kill()
                self.broken.add((backend, m.layer))
                raise MountFailed(f"{m.layer} not mounted after {MOUNT_READY_TIMEOUT_S:.0f} s: {tail(m.log_path)}")
            time.sleep(0.02)
        self.ready_times.setdefault(f"{backend} {m.layer}", []).append(time.perf_counter() - t0)

    def spawn_mount(self, layer: str, backend: str, argv: list[str], env: dict[str, str], mountpoint: str,
                    state: str, sigterm_first: bool) -> RunningMount:
        log_path = Path(state) / "mount.log"
        t0 = time.perf_counter()
        with open(log_path, "ab") as logf:
            # Own session: Ctrl-C reaches only the benchmark, which then unmounts cleanly
            # instead of racing the servers' own SIGINT handling.
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        m = RunningMount(layer, mountpoint, proc, log_path, sigterm_first)
        self.mounts.append(m)
        self._wait_mounted(m, t0, backend)
        return m

    def thread_mount(self, layer: str, backend: str, make: Callable[[], Any], mountpoint: str) -> RunningMount:
        t0 = time.perf_counter()
        m = RunningMount(layer, mountpoint, None, Path(mountpoint + ".log"), True)
        m.handle = make()
        self.mounts.append(m)
        self._wait_mounted(m, t0, backend)
        return m

    def release(self, m: RunningMount) -> None:
        m.stop()
        with contextlib.suppress(ValueError):
            self.mounts.remove(m)
        for p in m.problems:
            if p not in self.problems:
                self.problems.append(p)
        m.problems.clear()

    def close(self) -> None:
        """Unmount everything still mounted and stop its processes; never raises."""
        for m in reversed(list(self.mounts)):
            with contextlib.suppress(Exception):
                self.release(m)


@dataclass
class LayerSpec:
    """How to reach a backend through one layer; ``open`` yields a ready `Target`."""

    name: str
    how: str
    open: Callable[[Harness], AbstractContextManager[Target]]
    #: True for layers that reach the backend through a kernel mount (a directory).
    mounted: bool = True
    #: The suites that run this layer (None: every suite that runs layers).
    suites: tuple[str, ...] | None = None


def _direct(b: Backend) -> LayerSpec:
    @contextlib.contextmanager
    def open_(h: Harness) -> Iterator[Target]:
        yield FsspecTarget(DIRECT, b.name, b.filesystem(), b.root)

    how = f"fsspec.filesystem({b.protocol!r}) calls in the measuring process (cat_file, open('wb'), ls, info)"
    return LayerSpec(DIRECT, how, open_, mounted=False)


BOTO3 = "boto3"


def _boto3(b: Backend) -> LayerSpec | str:
    """The AWS SDK against the same S3 server: the limit of the io and metadata figures."""
    if b.name != "s3":
        return f"{BOTO3}: S3 only"
    try:
        import boto3
        import botocore.config
    except ImportError:
        return f"{BOTO3}: not installed (pip install boto3)"
    bucket, _, prefix = b.root.partition("/")

    @contextlib.contextmanager
    def open_(h: Harness) -> Iterator[Target]:
        client = boto3.client(
            "s3", endpoint_url=b.endpoint, aws_access_key_id=b.key, aws_secret_access_key=b.secret,
            region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}, max_pool_connections=16),
        )  # fmt: skip
        yield Boto3Target(BOTO3, b.name, client, bucket, prefix)

    return LayerSpec(BOTO3, "boto3 in the measuring process: streamed GET, managed (multipart) upload, "
                     "list_objects_v2: the server's limit for a client", open_, mounted=False,
                     suites=("io", "metadata"))


def _local_disk(b: Backend) -> LayerSpec:
    roots: list[str] = []

    @contextlib.contextmanager
    def open_(h: Harness) -> Iterator[Target]:
        # One directory for the whole run: a suite that reopens the layer (to measure cold)
        # finds its files again, as it does on a mount. The harness's workdir goes at the end.
        if not roots:
            roots.append(h.scratch(f"disk-{b.name}"))
        yield PathTarget(LOCAL_DISK, b.name, roots[0])

    return LayerSpec(LOCAL_DISK, "plain os calls on a directory of the local disk (the physical limit)", open_,
                     mounted=False)


@contextlib.contextmanager
def _mounted(h: Harness, b: Backend, layer: str, start: Callable[[str, str], RunningMount]) -> Iterator[Target]:
    mnt = h.scratch(f"mnt-{b.name}-{layer}")
    state = h.scratch(f"state-{b.name}-{layer}")
    m = start(mnt, state)
    try:
        yield PathTarget(layer, b.name, mnt, kill=m.kill)
    finally:
        h.release(m)
        shutil.rmtree(state, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def _agentvfs_exe() -> list[str]:
    exe = Path(sys.executable).parent / "agentvfs"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "agentvfs.cli"]


def _agentvfs(b: Backend) -> LayerSpec:
    if b.name == "memory":
        def open_mem(h: Harness) -> AbstractContextManager[Target]:
            from .. import FsspecFilesystem
            from ..mounts import Mount

            def start(mnt: str, state: str) -> RunningMount:
                return h.thread_mount(AGENTVFS, b.name, lambda: Mount(FsspecFilesystem(b.url), mnt).start(), mnt)

            return _mounted(h, b, AGENTVFS, start)

        return LayerSpec(AGENTVFS, "agentvfs.mounts.Mount(FsspecFilesystem('memory://...')) on a thread of the "
                         "measuring process (a memory filesystem lives in one process)", open_mem)

    url = b.url
    # Credentials are not shown: each "-o key=value" pair goes whole, or not at all.
    pairs = b.cli_options()
    kept = [f"-o {value}" for value in pairs[1::2] if not value.startswith(("key=", "secret="))]
    shown = " ".join(["agentvfs mount", url, "MNT", *kept])

    def open_cli(h: Harness) -> AbstractContextManager[Target]:
        def start(mnt: str, state: str) -> RunningMount:
            argv = [*_agentvfs_exe(), "mount", url, mnt, *b.cli_options()]
            return h.spawn_mount(AGENTVFS, b.name, argv, dict(os.environ), mnt, state, sigterm_first=True)

        return _mounted(h, b, AGENTVFS, start)

    return LayerSpec(AGENTVFS, f"{shown} (own process)", open_cli)


_FSSPEC_FUSE_CODE = """\
import json, sys
import fsspec
from fsspec.fuse import run
protocol, options, root, mnt = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
run(fs, root.rstrip("/") + "/", mnt, foreground=True, threads=False)
"""


def _fsspec_fuse(b: Backend) -> LayerSpec | str:
    if importlib.util.find_spec("fuse") is None:
        return f"{FSSPEC_FUSE}: fusepy not installed (pip install fusepy)"
    if ctypes.util.find_library("fuse") is None:
        return f"{FSSPEC_FUSE}: libfuse2 not installed (apt-get install libfuse2)"
    if b.name == "memory":
        return f"{FSSPEC_FUSE}: not run on memory (it serves only from a blocking call in its own process)"

    def open_(h: Harness) -> AbstractContextManager[Target]:
        def start(mnt: str, state: str) -> RunningMount:
            argv = [sys.executable, "-c", _FSSPEC_FUSE_CODE, b.protocol, json.dumps(b.options), b.root, mnt]
            return h.spawn_mount(FSSPEC_FUSE, b.name, argv, dict(os.environ), mnt, state, sigterm_first=False)

        return _mounted(h, b, FSSPEC_FUSE, start)

    return LayerSpec(FSSPEC_FUSE, "fsspec.fuse.run(fs, threads=False) (fusepy) in its own process", open_)


def _rclone(b: Backend) -> LayerSpec | str:
    if shutil.which("rclone") is None:
        return f"{RCLONE}: not installed (apt-get install rclone)"
    if b.name not in ("local", "s3"):
        return f"{RCLONE}: not run on {b.name} (no remote of it configured for this server)"

    def command(mnt: str, state: str) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        # An exported AWS_CA_BUNDLE makes rclone's S3 client fail even on plain http.
        env.pop("AWS_CA_BUNDLE", None)
        if b.name == "s3":
            env.update({
                "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
                "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": b.key or "", "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": b.secret or "",
                "RCLONE_CONFIG_BENCH_ENDPOINT": b.endpoint or "", "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
                "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
            })  # fmt: skip
            remote = f"bench:{b.root}"
        else:
            remote = b.root
        # A fresh cache directory per mount: a cold read must not find an earlier mount's files.
        return ([
            "rclone", "--config", os.path.join(state, "rclone.conf"), "mount", remote, mnt,
            "--vfs-cache-mode", "writes", "--vfs-write-back", "0s",
            "--cache-dir", os.path.join(state, "cache"), "--log-file", os.path.join(state, "rclone.log"),
        ], env)  # fmt: skip

    def open_(h: Harness) -> AbstractContextManager[Target]:
        def start(mnt: str, state: str) -> RunningMount:
            argv, env = command(mnt, state)
            return h.spawn_mount(RCLONE, b.name, argv, env, mnt, state, sigterm_first=False)

        return _mounted(h, b, RCLONE, start)

    return LayerSpec(RCLONE, "rclone mount --vfs-cache-mode writes --vfs-write-back 0s (fresh cache per mount)", open_)


def _s3fs_fuse(b: Backend) -> LayerSpec | str:
    if shutil.which("s3fs") is None:
        return f"{S3FS_FUSE}: not installed (apt-get install s3fs)"
    if b.name != "s3":
        return f"{S3FS_FUSE}: S3 only, not run on {b.name}"
    bucket, _, prefix = b.root.partition("/")

    def open_(h: Harness) -> AbstractContextManager[Target]:
        def start(mnt: str, state: str) -> RunningMount:
            pw = os.path.join(state, "passwd")
            with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(f"{b.key}:{b.secret}\n")
            # -f: stay in the foreground, so the process held here is the server.
            argv = ["s3fs", f"{bucket}:/{prefix}" if prefix else bucket, mnt, "-f", "-o", f"url={b.endpoint}",
                    "-o", "use_path_request_style", "-o", f"passwd_file={pw}", "-o", "endpoint=us-east-1",
                    "-o", "dbglevel=warn"]  # fmt: skip
            return h.spawn_mount(S3FS_FUSE, b.name, argv, dict(os.environ), mnt, state, sigterm_first=False)

        return _mounted(h, b, S3FS_FUSE, start)

    return LayerSpec(S3FS_FUSE, "s3fs BUCKET:/PREFIX MNT -f -o use_path_request_style (defaults otherwise)", open_)


def layers_for(b: Backend, *, peers: bool) -> tuple[list[LayerSpec], list[str]]:
    """The layers to run on ``b`` (direct first: it is every ratio's baseline) and the reasons
    peers were left out."""
    layers = [_direct(b), _agentvfs(b)]
    skipped: list[str] = []
    if peers:
        layers.insert(1, _local_disk(b))
        limit = _boto3(b)
        if isinstance(limit, LayerSpec):
            layers.insert(1, limit)
        for make in (_fsspec_fuse, _rclone, _s3fs_fuse):
            made = make(b)
            if isinstance(made, str):
                skipped.append(made)
            else:
                layers.append(made)
    return layers, skipped
