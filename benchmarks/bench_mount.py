#!/usr/bin/env python
"""The agentvfs FUSE mount side by side with direct access and with peer mounters.

Part A, local directory (``--only local``): one directory on local disk, read and written
directly and through ``agentvfs mount file://DIR``:

=====================  ===================================================================
operation              how
=====================  ===================================================================
cold read (1 GiB)      drop the page cache, then read the file sequentially in 1 MiB reads
warm read (1 GiB)      read it again right away
write (1 GiB)          new file, 1 MiB writes, then ``fsync`` and ``close`` (timed to close)
``ls -l`` cold/warm    10,000-entry directory; caches dropped and (mount) freshly mounted;
                       the second run is warm
cached ``stat`` rate   ``os.stat`` over the same 10,000 files, second pass
=====================  ===================================================================

Part B, S3 (``--only s3``): an s3rver (npm ``s3rver@3.7.1``) started here on a free
127.0.0.1 port holds one 256 MiB object and 2,000 small objects. The direct clients
(boto3 single GET, boto3 8 MiB ranged GETs on 4 threads, s3fs ``cat_file``; boto3
``put_object`` and s3fs ``pipe_file``; ``list_objects_v2`` and s3fs ``ls``) give the limit,
the best of them being the reference of every ratio. Each mount layer — agentvfs (CLI in its
own process), ``rclone mount`` (``--vfs-cache-mode writes --vfs-write-back 0s``), s3fs-fuse
and ``fsspec.fuse`` (fusepy, in its own process) — is mounted afresh for every measurement:
a cold single-pass read of the big object (never read through that mount, caches dropped), a
write of a new object of the same size (timed until ``close`` returns, and until the object
is visible in the bucket with the right size: rclone uploads after close), and ``ls -l`` of
the small-object prefix (cold, then warm). Rounds interleave: each round runs the direct
clients, then every mount layer, so that a drift of the machine's speed over minutes touches
all of them alike.

Every mount runs in a separate process so that the reading process here does not share a GIL
with a Python FUSE server. Every read and write is checked afterwards (untimed: SHA-256 of
the data read, of the backing file or of the object written). Every operation on a mount runs
under a watchdog: when it exceeds its time limit the mount's process is killed, the
mountpoint lazily unmounted, and the operation is reported as a timeout. Whatever happens
(errors, Ctrl-C, SIGTERM), every mount is unmounted and s3rver stopped on exit.

Needs root (to drop the page cache and to mount). Peers that are not installed are skipped
with a message: ``apt-get install rclone s3fs libfuse2``, ``pip install fusepy`` (into the
interpreter running this script), ``scripts/setup.sh`` (s3rver into .venv/opt; or put ``s3rver`` on PATH, or point ``S3RVER`` at
its executable).

Usage::

    python benchmarks/bench_mount.py --quick                # smoke run: 64 MiB, 1,000 entries
    python benchmarks/bench_mount.py --json out.json        # 1 GiB / 256 MiB, 10,000 / 2,000 entries
    python benchmarks/bench_mount.py --only s3 --repeat 3
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes.util
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from agentvfs.bench._backends import find_s3rver
from agentvfs.bench._context import Timeout
from agentvfs.bench._system import (
    _first_line,
    free_port,
    stop_process,
    unmount,
)
from agentvfs.bench._system import drop_caches as _drop_caches
from agentvfs.bench._system import machine_description as shared_machine_description
from agentvfs.bench._system import tail as _tail
from agentvfs.bench._targets import ls_long as timed_ls
from agentvfs.bench._targets import read_path as timed_read
from agentvfs.bench._targets import sha256_path as sha256_file
from agentvfs.bench._targets import watchdog as target_watchdog
from agentvfs.bench._targets import write_path
from agentvfs.mounts import is_mounted

MiB = 1 << 20
BLOCK = MiB  # dd-like block size for every read and write
SMALL_FILE = 100  # bytes in each small file / object
BUCKET = "agentvfs-bench"
S3_KEY = S3_SECRET = "S3RVER"  # s3rver's fixed credentials
REPO = Path(__file__).resolve().parent.parent

# Slowest throughput still treated as "working" before the watchdog gives up, and the fixed
# allowance on top (mount start-up, first request): 1 GiB may take 60 s + 512 s.
WATCHDOG_MIN_MIB_S = 2.0
WATCHDOG_BASE_S = 60.0
MOUNT_READY_TIMEOUT_S = 30.0
VISIBLE_TIMEOUT_S = 120.0  # rclone uploads after close: how long to wait for the object


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- machine ---------------------------------------------------------------------------------


def drop_caches() -> None:
    if not _drop_caches():
        raise PermissionError("cannot write /proc/sys/vm/drop_caches (needs root)")


def timed_write(path: str, block: bytes, count: int, fsync: bool) -> float:
    return write_path(path, block, count, fsync=fsync)


def machine_description(s3rver: str | None) -> dict[str, str]:
    s3rver_version = "not installed"
    if s3rver is not None:
        pkg = Path(s3rver).resolve().parent.parent / "package.json"
        with contextlib.suppress(OSError, ValueError):
            s3rver_version = str(json.loads(pkg.read_text())["version"])
    return shared_machine_description({"s3rver": s3rver_version, "node": _first_line(["node", "--version"])})


# -- process, mount and cache helpers --------------------------------------------------------


class MountFailed(RuntimeError):
    """A layer did not come up as a mount (its process exited or never mounted)."""


@dataclass
class RunningMount:
    """One mount served by a process of ours; stopped by ``stop`` (idempotent)."""

    layer: str
    mountpoint: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    sigterm_first: bool  # our CLI stops on SIGTERM; the peers on fusermount3 -u
    ready_seconds: float | None = None  # None: never got mounted
    killed_by_watchdog: bool = False
    problems: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None and self.sigterm_first:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{self.layer}: did not exit within 15 s of SIGTERM")
        if self.proc.poll() is None or is_mounted(self.mountpoint):
            unmount(self.mountpoint)
        if self.proc.poll() is None:
            try:
                self.proc.wait(10)  # a peer exits on its own once unmounted
            except subprocess.TimeoutExpired:
                stop_process(self.proc)
        if (self.sigterm_first and self.ready_seconds is not None and not self.killed_by_watchdog
                and self.proc.returncode not in (0, -signal.SIGTERM)):
            self.problems.append(f"{self.layer}: exit status {self.proc.returncode} after SIGTERM; "
                                 f"log: {_tail(self.log_path)}")
        unmount(self.mountpoint)

    def kill(self) -> None:
        """Watchdog path: a hung server cannot answer, so kill it (the kernel then fails the
        pending requests with ENOTCONN) and detach the mountpoint."""
        self.killed_by_watchdog = True
        if self.proc.poll() is None:
            self.proc.kill()
        unmount(self.mountpoint)


@contextlib.contextmanager
def watchdog(m: RunningMount | None, seconds: float, what: str) -> Iterator[None]:
    """Kill ``m``'s server if the block runs longer than ``seconds``; raise ``Timeout`` then."""
    if m is None:
        yield
        return

    def kill() -> None:
        log(f"  watchdog: {what} on {m.layer} still running after {seconds:.0f} s; killing the mount")
        m.kill()

    with target_watchdog(kill, seconds, what):
        yield


def io_limit(nbytes: int) -> float:
    return WATCHDOG_BASE_S + nbytes / MiB / WATCHDOG_MIN_MIB_S


# -- timed operations --------------------------------------------------------------------------


def timed_stats(paths: list[str]) -> float:
    stat = os.stat
    t0 = time.perf_counter()
    for p in paths:
        stat(p)
    return time.perf_counter() - t0


# -- results ---------------------------------------------------------------------------------


@dataclass
class Series:
    """Repeated timings of one operation on one layer."""

    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # e.g. upload-visible seconds

    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def add_extra(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "median_seconds": self.median(), "errors": self.errors,
                "extra": self.extra}


@dataclass
class Op:
    key: str
    label: str
    amount: float  # bytes for throughput ops, entries for count ops
    unit: str  # "MiB/s", "s" (plain time) or "stat/s"


Results = dict[str, dict[str, Series]]  # layer -> op key -> series


def series(results: Results, layer: str, op: str) -> Series:
    return results.setdefault(layer, {}).setdefault(op, Series())


def record(s: Series, fn: Callable[[], float], what: str) -> bool:
    """Run one timed measurement into ``s``; an error is recorded, logged and not raised."""
    try:
        s.seconds.append(fn())
        return True
    except (OSError, Timeout, subprocess.SubprocessError, RuntimeError) as exc:
        msg = f"{type(exc).__name__}: {exc}"
        s.errors.append(msg)
        log(f"  ERROR {what}: {msg}")
        return False


def fmt_value(op: Op, s: Series | None) -> str:
    if s is None:
        return "—"
    med = s.median()
    if med is None:
        return "error" if s.errors else "—"
    lo, hi = min(s.seconds), max(s.seconds)
    many = len(s.seconds) > 1
    if op.unit == "MiB/s":
        spread = f" [{lo:.2f}–{hi:.2f}]" if many else ""
        text = f"{op.amount / MiB / med:,.0f} MiB/s ({med:.2f} s{spread})"
    elif op.unit == "stat/s":
        spread = f" [{lo * 1e3:.1f}–{hi * 1e3:.1f}]" if many else ""
        text = f"{op.amount / med:,.0f} stat/s ({med * 1e3:.1f} ms{spread})"
    else:
        spread = f" [{lo:.3f}–{hi:.3f}]" if many else ""
        text = f"{med:.3f} s{spread}"
    if s.errors:
        text += f" + {len(s.errors)} error(s)"
    return text


def fmt_ratio(s: Series | None, ref: float | None) -> str:
    med = s.median() if s is not None else None
    if med is None or ref is None or ref <= 0:
        return "—"
    return f"{med / ref:.2f}x"


# -- mount layers ----------------------------------------------------------------------------


@dataclass
class Layer:
    """How to mount one thing: ``command(mountpoint, scratch)`` returns argv and env."""

    name: str
    command: Callable[[str, str], tuple[list[str], dict[str, str]]]
    how: str  # one line for the report: what runs and with which options
    sigterm_first: bool = False
    #: What the server writes to its log once it is fully started (None: being mounted is
    #: enough). The mount point answers a little before ``agentvfs mount`` has raised the
    #: kernel's read-ahead of the connection, and a file opened in between keeps the
    #: kernel's default (128 KiB requests instead of 1 MiB) for its life.
    ready_line: bytes | None = None


class Harness:
    """Owns every process, mountpoint and temporary directory this run creates, so that one
    ``close`` (in a ``finally``) undoes all of it whatever went wrong."""

    def __init__(self, workdir: str, keep: bool) -> None:
        self.workdir = workdir
        self.keep = keep
        self.mounts: list[RunningMount] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.problems: list[str] = []  # notable misbehaviour of any layer, for the report
        self.broken: set[str] = set()  # layers that failed to mount once: not retried
        self.ready_times: dict[str, list[float]] = {}  # "part layer" -> seconds from start to mounted
        self.part = ""  # "local" or "s3": which part of the benchmark is running
        self.hows: dict[str, str] = {}  # "part layer" -> how it was mounted, for the report
        self._n = 0

    def scratch(self, name: str) -> str:
        self._n += 1
        path = os.path.join(self.workdir, f"{name}-{self._n}")
        os.makedirs(path)
        return path

    def spawn(self, argv: list[str], env: dict[str, str] | None, log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as logf:
            # Own session: Ctrl-C reaches only this script, which then unmounts cleanly
            # instead of racing the servers' own SIGINT handling.
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def mount(self, layer: Layer) -> RunningMount:
        mnt = self.scratch(f"mnt-{layer.name}")
        scratch = self.scratch(f"state-{layer.name}")
        argv, env = layer.command(mnt, scratch)
        log_path = Path(scratch) / "mount.log"
        t0 = time.perf_counter()
        proc = self.spawn(argv, env, log_path)
        m = RunningMount(layer.name, mnt, proc, log_path, layer.sigterm_first)
        self.mounts.append(m)
        while True:
            if is_mounted(mnt) and os.path.ismount(mnt) and (
                    layer.ready_line is None or layer.ready_line in log_path.read_bytes()):
                break
            if proc.poll() is not None:
                self.broken.add(layer.name)
                raise MountFailed(f"{layer.name} exited with {proc.returncode} before mounting: {_tail(log_path)}")
            if time.perf_counter() - t0 > MOUNT_READY_TIMEOUT_S:
                m.kill()
                self.broken.add(layer.name)
                raise MountFailed(f"{layer.name} not mounted after {MOUNT_READY_TIMEOUT_S:.0f} s: {_tail(log_path)}")
            time.sleep(0.02)
        m.ready_seconds = time.perf_counter() - t0
        self.ready_times.setdefault(f"{self.part} {layer.name}", []).append(m.ready_seconds)
        return m

    @contextlib.contextmanager
    def mounted(self, layer: Layer) -> Iterator[RunningMount]:
        m = self.mount(layer)
        try:
            yield m
        finally:
            m.stop()
            self._collect(m)

    def _collect(self, m: RunningMount) -> None:
        for p in m.problems:
            if p not in self.problems:
                self.problems.append(p)
                log(f"  problem: {p}")
        m.problems.clear()

    def close(self) -> None:
        for m in reversed(self.mounts):
            with contextlib.suppress(Exception):
                m.stop()
                self._collect(m)
        for proc in self.procs:
            with contextlib.suppress(Exception):
                stop_process(proc)
        if self.keep:
            log(f"kept {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


#: What ``agentvfs mount`` writes to its log once started (kernel settings included).
AGENTVFS_READY = b" mounted at "


def baseline_layer(url: str, options: list[str], src: str) -> Layer:
    """The mount of another tree (its ``src`` first on ``PYTHONPATH``), through its CLI."""
    code = "import sys; from agentvfs.cli import main; sys.exit(main())"
    opts = [x for o in options for x in ("-o", o)]

    def command(mnt: str, _scratch: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", code, "mount", url, mnt, *opts], {**os.environ, "PYTHONPATH": src}

    return Layer("agentvfs (before)", command, f"`agentvfs mount {url} MNT` of the tree at {src}", sigterm_first=True,
                 ready_line=AGENTVFS_READY)


def agentvfs_layer(url: str, options: list[str]) -> Layer | str:
    """Our mount in its own process: the ``agentvfs mount`` CLI when it exists, else a
    ``python -c`` wrapper around ``agentvfs.mounts.Mount``. A str is the reason to skip."""
    exe = Path(sys.executable).parent / "agentvfs"
    cli = str(exe) if exe.exists() else shutil.which("agentvfs")
    if cli is not None:
        cli_probe = subprocess.run([cli, "mount", "--help"], capture_output=True, timeout=60, check=False)
        if cli_probe.returncode == 0:
            opts = [x for o in options for x in ("-o", o)]
            public = [x for o in options if not o.startswith(("key=", "secret=")) for x in ("-o", o)]
            shown = " ".join(["agentvfs mount", url, "MNT", *public])
            return Layer("agentvfs", lambda mnt, _s: ([cli, "mount", url, mnt, *opts], dict(os.environ)),
                         f"`{shown}` (CLI, own process)", sigterm_first=True, ready_line=AGENTVFS_READY)
    # A subprocess: the package may be half-written (being developed), and a failed import
    # here must not leave a broken module cached in this process.
    probe = subprocess.run([sys.executable, "-c", "from agentvfs.mounts import Mount"],
                           capture_output=True, text=True, timeout=60, check=False)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"agentvfs: neither `agentvfs mount` nor agentvfs.mounts.Mount is usable ({why})"
    storage = dict(o.split("=", 1) for o in options)
    code = (
        "import json, signal, sys, threading\n"
        "from agentvfs import FsspecFilesystem\n"
        "from agentvfs.mounts import Mount\n"
        "url, mnt, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
        "stop = threading.Event()\n"
        "signal.signal(signal.SIGTERM, lambda *_: stop.set())\n"
        "with Mount(FsspecFilesystem(url, storage_options=opts or None), mnt):\n"
        "    stop.wait()\n"
    )
    return Layer("agentvfs", lambda mnt, _s: ([sys.executable, "-c", code, url, mnt, json.dumps(storage)],
                                              dict(os.environ)),
                 f"`agentvfs.mounts.Mount(FsspecFilesystem({url!r}))` in a `python -c` process (no CLI yet)",
                 sigterm_first=True)


def rclone_layer(endpoint: str) -> Layer | str:
    if shutil.which("rclone") is None:
        return "rclone: not installed (apt-get install rclone)"

    def command(mnt: str, scratch: str) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        # This machine exports AWS_CA_BUNDLE, which makes rclone's S3 client fail on http.
        env.pop("AWS_CA_BUNDLE", None)
        env.update({
            "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": S3_KEY, "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": S3_SECRET,
            "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint, "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
            "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
        })  # fmt: skip
        # A fresh cache dir per mount: a cold read must not find an earlier mount's files.
        return ([
            "rclone", "--config", os.path.join(scratch, "rclone.conf"), "mount", f"bench:{BUCKET}", mnt,
            "--vfs-cache-mode", "writes", "--vfs-write-back", "0s",
            "--cache-dir", os.path.join(scratch, "cache"), "--log-file", os.path.join(scratch, "rclone.log"),
        ], env)  # fmt: skip

    return Layer("rclone", command, "`rclone mount --vfs-cache-mode writes --vfs-write-back 0s` "
                 "(env -u AWS_CA_BUNDLE, fresh cache dir per mount)")


def s3fs_fuse_layer(endpoint: str) -> Layer | str:
    if shutil.which("s3fs") is None:
        return "s3fs-fuse: not installed (apt-get install s3fs)"

    def command(mnt: str, scratch: str) -> tuple[list[str], dict[str, str]]:
        pw = os.path.join(scratch, "passwd")
        with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f"{S3_KEY}:{S3_SECRET}\n")
        # -f: stay in the foreground, so the process we hold is the server.
        return ([
            "s3fs", BUCKET, mnt, "-f", "-o", f"url={endpoint}", "-o", "use_path_request_style",
            "-o", f"passwd_file={pw}", "-o", "endpoint=us-east-1", "-o", "dbglevel=warn",
        ], dict(os.environ))  # fmt: skip

    return Layer("s3fs-fuse", command, "`s3fs BUCKET MNT -f -o use_path_request_style` (defaults otherwise)")


FSSPEC_FUSE_CODE = """\
import sys
import s3fs
from fsspec.fuse import run
endpoint, bucket, key, secret, mnt = sys.argv[1:6]
fs = s3fs.S3FileSystem(key=key, secret=secret, endpoint_url=endpoint, skip_instance_cache=True)
run(fs, bucket + "/", mnt, foreground=True, threads=False)
"""


def fsspec_fuse_layer(endpoint: str) -> Layer | str:
    if importlib.util.find_spec("fuse") is None:
        return f"fsspec.fuse: fusepy not installed ({sys.executable} -m pip install fusepy)"
    if ctypes.util.find_library("fuse") is None:
        return "fsspec.fuse: libfuse2 not installed (apt-get install libfuse2)"
    return Layer("fsspec.fuse", lambda mnt, _s: (
        [sys.executable, "-c", FSSPEC_FUSE_CODE, endpoint, BUCKET, S3_KEY, S3_SECRET, mnt], dict(os.environ)),
        "`fsspec.fuse.run(s3fs, threads=False)` (fusepy) in a `python -c` process; its writes fail "
        "with ESPIPE on s3fs (it seeks the write handle before every write, s3fs refuses)")


# -- data ------------------------------------------------------------------------------------


def write_random_file(path: str, size: int) -> str:
    """Random (incompressible) content, so no layer can take a shortcut; returns its SHA-256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(BLOCK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def repeated_sha256(block: bytes, count: int) -> str:
    h = hashlib.sha256()
    for _ in range(count):
        h.update(block)
    return h.hexdigest()


@dataclass
class Config:
    quick: bool
    repeat_big: int
    repeat_small: int
    local_size: int
    local_entries: int
    s3_size: int
    s3_entries: int
    #: The ``src`` of another tree, mounted as the layer "agentvfs (before)" (S3 part).
    baseline_src: str | None = None
    peers: bool = True
    #: Also mount the local directory without FUSE passthrough (``-o passthrough=false``: what
    #: a pip install gets before ``agentvfs setup-passthrough``), interleaved.
    without_passthrough: bool = False


# -- part A: local directory -----------------------------------------------------------------

NO_PASSTHROUGH = "agentvfs, no passthrough"


def local_ops(cfg: Config) -> list[Op]:
    gib = f"{cfg.local_size / MiB:,.0f} MiB" if cfg.local_size < 1 << 30 else f"{cfg.local_size >> 30} GiB"
    n = cfg.local_entries
    return [
        Op("cold_read", f"cold sequential read, {gib}", cfg.local_size, "MiB/s"),
        Op("warm_read", f"warm re-read, {gib}", cfg.local_size, "MiB/s"),
        Op("write", f"sequential write, {gib} (1 MiB writes, fsync, close)", cfg.local_size, "MiB/s"),
        Op("ls_cold", f"`ls -l`, {n:,} entries, cold", n, "s"),
        Op("ls_warm", f"`ls -l`, {n:,} entries, warm", n, "s"),
        Op("stat_first", f"`os.stat` × {n:,}, first pass (after ls)", n, "stat/s"),
        Op("stat_cached", f"`os.stat` × {n:,}, cached (second pass)", n, "stat/s"),
    ]


def bench_local(h: Harness, cfg: Config, results: Results) -> None:
    h.part = "local"
    data = h.scratch("local-data")
    entries_dir = os.path.join(data, "entries")
    os.makedirs(entries_dir)
    log(f"local: writing a {cfg.local_size / MiB:,.0f} MiB file and {cfg.local_entries:,} small files in {data}")
    big_sha = write_random_file(os.path.join(data, "big.bin"), cfg.local_size)
    names = [f"f{i:05d}.txt" for i in range(cfg.local_entries)]
    for name in names:
        with open(os.path.join(entries_dir, name), "wb") as f:
            f.write(name.encode().ljust(SMALL_FILE, b"."))
    block = os.urandom(BLOCK)
    count = cfg.local_size // BLOCK
    write_sha = repeated_sha256(block, count)

    ours = agentvfs_layer(f"file://{data}", [])
    if isinstance(ours, Layer):
        h.hows[f"local {ours.name}"] = ours.how
    else:
        log(f"local: skipping the mount: {ours}")
        h.problems.append(ours)
    plain: Layer | str = "not asked for (--without-passthrough)"
    if cfg.without_passthrough:
        made = agentvfs_layer(f"file://{data}", ["passthrough=false"])
        plain = replace(made, name=NO_PASSTHROUGH) if isinstance(made, Layer) else made
        if isinstance(plain, Layer):
            h.hows[f"local {plain.name}"] = plain.how

    def big_round(root: str, m: RunningMount | None, layer: str, i: int) -> None:
        drop_caches()
        big = os.path.join(root, "big.bin")
        with watchdog(m, io_limit(cfg.local_size), "cold read"):
            ok = record(series(results, layer, "cold_read"), lambda: timed_read(big, cfg.local_size), f"{layer} cold read")
        if ok:
            with watchdog(m, io_limit(cfg.local_size), "warm read"):
                record(series(results, layer, "warm_read"), lambda: timed_read(big, cfg.local_size), f"{layer} warm read")
            with watchdog(m, io_limit(cfg.local_size), "verify read"):
                if sha256_file(big) != big_sha:
                    series(results, layer, "cold_read").errors.append("content read differs from the file")
                    log(f"  ERROR {layer}: content read differs from the file")
        name = f"w-{layer}-{i}.bin"
        os.sync()
        with watchdog(m, io_limit(cfg.local_size), "write"):
            ok = record(series(results, layer, "write"),
                        lambda: timed_write(os.path.join(root, name), block, count, fsync=True), f"{layer} write")
        backing = os.path.join(data, name)
        if ok and sha256_file(backing) != write_sha:
            series(results, layer, "write").errors.append("backing file differs from the data written")
            log(f"  ERROR {layer}: backing file differs from the data written")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(backing)

    def small_round(root: str, m: RunningMount | None, layer: str) -> None:
        d = os.path.join(root, "entries")
        paths = [os.path.join(d, n) for n in names]
        limit = WATCHDOG_BASE_S + cfg.local_entries / 50  # 50 entries/s is broken already
        drop_caches()
        for op in ("ls_cold", "ls_warm"):
            if not record(series(results, layer, op), lambda: timed_ls(d, cfg.local_entries, limit), f"{layer} {op}"):
                return
        for op in ("stat_first", "stat_cached"):
            with watchdog(m, limit, "stat loop"):
                if not record(series(results, layer, op), lambda: timed_stats(paths), f"{layer} {op}"):
                    return

    for i in range(cfg.repeat_big):
        log(f"local: big-file round {i + 1}/{cfg.repeat_big}")
        big_round(data, None, "direct", i)
        for layer in (ours, plain):
            if isinstance(layer, Layer) and layer.name not in h.broken:
                try:
                    with h.mounted(layer) as m:
                        big_round(m.mountpoint, m, layer.name, i)
                except MountFailed as exc:
                    series(results, layer.name, "cold_read").errors.append(str(exc))
                    log(f"  ERROR {layer.name} mount: {exc}")
    for i in range(cfg.repeat_small):
        log(f"local: directory round {i + 1}/{cfg.repeat_small}")
        small_round(data, None, "direct")
        if isinstance(ours, Layer) and ours.name not in h.broken:
            try:
                with h.mounted(ours) as m:
                    small_round(m.mountpoint, m, "agentvfs")
            except MountFailed as exc:
                series(results, "agentvfs", "ls_cold").errors.append(str(exc))
                log(f"  ERROR agentvfs mount: {exc}")


def local_table(cfg: Config, results: Results) -> str:
    plain = NO_PASSTHROUGH in results
    head = "| operation | direct | agentvfs mount | ratio mount/direct (time) |"
    if plain:
        head += f" {NO_PASSTHROUGH} | its ratio |"
    out = [head, "|---|---:|---:|---:|" + ("---:|---:|" if plain else "")]
    for op in local_ops(cfg):
        d = results.get("direct", {}).get(op.key)
        a = results.get("agentvfs", {}).get(op.key)
        row = f"| {op.label} | {fmt_value(op, d)} | {fmt_value(op, a)} | {fmt_ratio(a, d.median() if d else None)} |"
        if plain:
            n = results.get(NO_PASSTHROUGH, {}).get(op.key)
            row += f" {fmt_value(op, n) if n else '—'} | {fmt_ratio(n, d.median() if d else None) if n else '—'} |"
        out.append(row)
    return "\n".join(out)


# -- part B: S3 through s3rver ---------------------------------------------------------------


# Direct-client rows of table B: what each does for read / write / listing.
DIRECT_BOTO = "direct boto3 (GET / PUT / list_objects_v2)"
DIRECT_RANGED = "direct boto3 (8 MiB ranged GETs, 4 threads)"
DIRECT_S3FS = "direct s3fs (cat_file / open('wb') / ls)"


def start_s3rver(h: Harness, exe: str) -> str:
    """Start s3rver with a fresh data dir on a free port; return its endpoint once it answers."""
    data = h.scratch("s3rver-data")
    port = free_port()
    env = dict(os.environ)
    # s3rver 3.7.1 signs ListObjectsV2 continuation tokens with DES, which the OpenSSL 3 in
    # Node >= 17 refuses (ERR_OSSL_EVP_UNSUPPORTED -> HTTP 500 InternalError): without the
    # legacy provider every truncated listing (more than MaxKeys objects) fails.
    env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} --openssl-legacy-provider".strip()
    proc = h.spawn([exe, "-d", data, "-p", str(port), "-a", "127.0.0.1", "--silent",
                    "--configure-bucket", BUCKET], env, Path(data).parent / f"s3rver-{port}.log")
    endpoint = f"http://127.0.0.1:{port}"
    client = s3_client(endpoint)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.head_bucket(Bucket=BUCKET)
            return endpoint
        except Exception as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"s3rver did not start: {exc}") from exc
            time.sleep(0.1)


def s3_client(endpoint: str) -> Any:
    import boto3
    import botocore.config

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
        config=botocore.config.Config(s3={"addressing_style": "path"}, max_pool_connections=32,
                                      retries={"max_attempts": 1}),
    )  # fmt: skip


def s3fs_instance(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(key=S3_KEY, secret=S3_SECRET, endpoint_url=endpoint,
                             skip_instance_cache=True, use_listings_cache=False)


def s3_ops(cfg: Config) -> list[Op]:
    size = f"{cfg.s3_size / MiB:,.0f} MiB"
    n = cfg.s3_entries
    return [
        Op("cold_read", f"cold read {size}", cfg.s3_size, "MiB/s"),
        Op("write", f"write {size} (until close returns)", cfg.s3_size, "MiB/s"),
        Op("write_visible", "write: until visible in the bucket", cfg.s3_size, "MiB/s"),
        Op("ls_cold", f"`ls -l` {n:,} objects, cold", n, "s"),
        Op("ls_warm", f"`ls -l` {n:,} objects, warm", n, "s"),
    ]


def wait_visible(client: Any, key: str, size: int, t_start: float) -> float:
    """Seconds from ``t_start`` until HEAD of ``key`` reports ``size`` bytes."""
    deadline = time.perf_counter() + VISIBLE_TIMEOUT_S
    while True:
        with contextlib.suppress(Exception):
            if client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == size:
                return time.perf_counter() - t_start
        if time.perf_counter() > deadline:
            raise Timeout(f"{key} not visible with {size} bytes after {VISIBLE_TIMEOUT_S:.0f} s")
        time.sleep(0.02)


def object_sha256(client: Any, key: str) -> str:
    h = hashlib.sha256()
    for chunk in client.get_object(Bucket=BUCKET, Key=key)["Body"].iter_chunks(4 * MiB):
        h.update(chunk)
    return h.hexdigest()


def bench_s3(h: Harness, cfg: Config, results: Results, s3rver: str, skipped: list[str]) -> None:
    h.part = "s3"
    log("s3: starting s3rver")
    endpoint = start_s3rver(h, s3rver)
    client = s3_client(endpoint)
    log(f"s3: s3rver at {endpoint}; uploading a {cfg.s3_size / MiB:,.0f} MiB object and {cfg.s3_entries:,} small objects")
    big = os.urandom(cfg.s3_size)
    big_sha = hashlib.sha256(big).hexdigest()
    client.put_object(Bucket=BUCKET, Key="big.bin", Body=big)
    del big
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=BUCKET, Key=f"small/f{i:05d}.txt",
                                                  Body=f"f{i:05d}".encode().ljust(SMALL_FILE, b".")),
                      range(cfg.s3_entries)))
    block = os.urandom(BLOCK)
    count = cfg.s3_size // BLOCK
    write_sha = repeated_sha256(block, count)
    limit_io = io_limit(cfg.s3_size)
    limit_ls = WATCHDOG_BASE_S + cfg.s3_entries / 20

    # -- direct clients: the limit ------------------------------------------------------------
    def get_single() -> float:
        t0 = time.perf_counter()
        total = sum(len(c) for c in client.get_object(Bucket=BUCKET, Key="big.bin")["Body"].iter_chunks(BLOCK))
        dt = time.perf_counter() - t0
        if total != cfg.s3_size:
            raise OSError(f"GET returned {total} bytes")
        return dt

    def get_ranged() -> float:
        part = 8 * MiB

        def fetch(start: int) -> int:
            end = min(start + part, cfg.s3_size) - 1
            body = client.get_object(Bucket=BUCKET, Key="big.bin", Range=f"bytes={start}-{end}")["Body"]
            return sum(len(c) for c in body.iter_chunks(BLOCK))

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            total = sum(pool.map(fetch, range(0, cfg.s3_size, part)))
        dt = time.perf_counter() - t0
        if total != cfg.s3_size:
            raise OSError(f"ranged GETs returned {total} bytes")
        return dt

    fs = s3fs_instance(endpoint)

    def s3fs_cat() -> float:
        t0 = time.perf_counter()
        n = len(fs.cat_file(f"{BUCKET}/big.bin"))
        dt = time.perf_counter() - t0
        if n != cfg.s3_size:
            raise OSError(f"cat_file returned {n} bytes")
        return dt

    def put_single(key: str) -> float:
        body = block * count  # built before timing: the upload, not the join, is measured
        t0 = time.perf_counter()
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        return time.perf_counter() - t0

    def s3fs_write(key: str) -> float:
        t0 = time.perf_counter()
        with fs.open(f"{BUCKET}/{key}", "wb") as f:  # multipart, like a streaming writer
            for _ in range(count):
                f.write(block)
        return time.perf_counter() - t0

    def list_boto() -> float:
        t0 = time.perf_counter()
        n = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="small/"):
            n += len(page.get("Contents", []))
        dt = time.perf_counter() - t0
        if n != cfg.s3_entries:
            raise OSError(f"listed {n} objects")
        return dt

    def list_s3fs() -> float:
        t0 = time.perf_counter()
        n = len(fs.ls(f"{BUCKET}/small", detail=True, refresh=True))
        dt = time.perf_counter() - t0
        if n != cfg.s3_entries:
            raise OSError(f"listed {n} objects")
        return dt

    def direct_round(i: int) -> None:
        log(f"s3: direct clients, round {i + 1}/{cfg.repeat_big}")
        for layer, fn in ((DIRECT_BOTO, get_single), (DIRECT_RANGED, get_ranged), (DIRECT_S3FS, s3fs_cat)):
            drop_caches()
            record(series(results, layer, "cold_read"), fn, f"{layer} read")
        for layer, wfn in ((DIRECT_BOTO, put_single), (DIRECT_S3FS, s3fs_write)):
            key = f"w-direct-{i}.bin"
            os.sync()
            if (record(series(results, layer, "write"), functools.partial(wfn, key), f"{layer} write")
                    and object_sha256(client, key) != write_sha):
                series(results, layer, "write").errors.append("object differs from the data written")
            with contextlib.suppress(Exception):
                client.delete_object(Bucket=BUCKET, Key=key)

    def direct_listing_round(i: int) -> None:
        log(f"s3: direct listings, round {i + 1}/{cfg.repeat_small}")
        drop_caches()
        record(series(results, DIRECT_BOTO, "ls_cold"), list_boto, "list_objects_v2")
        record(series(results, DIRECT_S3FS, "ls_cold"), list_s3fs, "s3fs ls")

    def layer_round(mount_layer: Layer, i: int) -> None:
        name = mount_layer.name
        if name in h.broken:
            return
        log(f"s3: {name}: read/write round {i + 1}/{cfg.repeat_big}")
        try:
            with h.mounted(mount_layer) as m:
                drop_caches()
                path = os.path.join(m.mountpoint, "big.bin")
                with watchdog(m, limit_io, "cold read"):
                    ok = record(series(results, name, "cold_read"), functools.partial(timed_read, path, cfg.s3_size),
                                f"{name} cold read")
                if ok:
                    with watchdog(m, limit_io, "verify read"):
                        if sha256_file(path) != big_sha:
                            series(results, name, "cold_read").errors.append("content read differs from the object")
                            log(f"  ERROR {name}: content read differs from the object")
            with h.mounted(mount_layer) as m:
                key = f"w-{name}-{i}.bin"
                path = os.path.join(m.mountpoint, key)
                os.sync()
                t0 = time.perf_counter()
                with watchdog(m, limit_io, "write"):
                    ok = record(series(results, name, "write"),
                                functools.partial(timed_write, path, block, count, fsync=False), f"{name} write")
                visible = functools.partial(wait_visible, client, key, cfg.s3_size, t0)
                if (ok and record(series(results, name, "write_visible"), visible, f"{name} upload")
                        and object_sha256(client, key) != write_sha):
                    series(results, name, "write").errors.append("object differs from the data written")
                    log(f"  ERROR {name}: object differs from the data written")
        except MountFailed as exc:
            series(results, name, "cold_read").errors.append(str(exc))
            log(f"  ERROR {name} mount: {exc}")
        finally:
            # Unmounted by now; remove what the mount wrote (it may have flushed late).
            with contextlib.suppress(Exception):
                client.delete_object(Bucket=BUCKET, Key=f"w-{name}-{i}.bin")

    def layer_listing_round(mount_layer: Layer, i: int) -> None:
        name = mount_layer.name
        if name in h.broken:
            return
        log(f"s3: {name}: listing round {i + 1}/{cfg.repeat_small}")
        try:
            with h.mounted(mount_layer) as m:
                drop_caches()
                d = os.path.join(m.mountpoint, "small")
                for op in ("ls_cold", "ls_warm"):
                    if not record(series(results, name, op), functools.partial(timed_ls, d, cfg.s3_entries, limit_ls),
                                  f"{name} {op}"):
                        break
        except MountFailed as exc:
            series(results, name, "ls_cold").errors.append(str(exc))
            log(f"  ERROR {name} mount: {exc}")

    layers: list[Layer] = []
    made: Layer | str
    ours = [f"endpoint_url={endpoint}", f"key={S3_KEY}", f"secret={S3_SECRET}"]
    candidates: list[Layer | str] = [agentvfs_layer(f"s3://{BUCKET}", ours)]
    if cfg.baseline_src:
        candidates.append(baseline_layer(f"s3://{BUCKET}", ours, cfg.baseline_src))
    if cfg.peers:
        candidates += [rclone_layer(endpoint), s3fs_fuse_layer(endpoint), fsspec_fuse_layer(endpoint)]
    for made in candidates:
        if isinstance(made, str):
            log(f"s3: skipping {made}")
            skipped.append(made)
        else:
            layers.append(made)
            h.hows[f"s3 {made.name}"] = made.how

    # Rounds interleave the direct clients and every mount layer: this VM's speed drifts over
    # minutes, and a ratio is only fair between figures taken side by side.
    for i in range(cfg.repeat_big):
        direct_round(i)
        for mount_layer in layers:
            layer_round(mount_layer, i)
    for i in range(cfg.repeat_small):
        direct_listing_round(i)
        for mount_layer in layers:
            layer_listing_round(mount_layer, i)


def s3_table(cfg: Config, results: Results) -> str:
    ops = s3_ops(cfg)
    # The best direct client of each kind of operation is the reference of its ratios.
    refs: dict[str, float | None] = {}
    for op in ops:
        kind = {"write_visible": "write", "ls_warm": "ls_cold"}.get(op.key, op.key)
        meds = [s.median() for layer, d in results.items() if layer.startswith("direct")
                for k, s in d.items() if k == kind]
        vals = [m for m in meds if m is not None]
        refs[op.key] = min(vals) if vals else None
    head = "| layer | " + " | ".join(f"{op.label} | ratio" for op in ops) + " |"
    out = [head, "|---|" + "---:|---:|" * len(ops)]
    for layer, by_op in results.items():
        cells = []
        for op in ops:
            s = by_op.get(op.key)
            cells += [fmt_value(op, s), fmt_ratio(s, refs[op.key])]
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 64 MiB files, 1,000 entries (default: 1 GiB local, 256 MiB S3, "
                        "10,000 local entries, 2,000 objects)")
    p.add_argument("--repeat", type=int, default=None,
                   help="repetitions, median reported (default: 1 for the big reads/writes, 3 for "
                        "listings and stat loops)")
    p.add_argument("--only", choices=["local", "s3"], help="run one part only")
    p.add_argument("--json", metavar="PATH", help="write all raw timings as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    p.add_argument("--baseline-src", metavar="DIR",
                   help="also mount the agentvfs of another tree (its src directory) on S3, interleaved")
    p.add_argument("--no-peers", action="store_true", help="measure no peer mounter (rclone, s3fs, fsspec.fuse)")
    p.add_argument("--without-passthrough", action="store_true",
                   help="local part: also mount without FUSE passthrough (what a pip install gets before "
                        "`agentvfs setup-passthrough`), interleaved")
    args = p.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be positive")
    return args


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM/SIGHUP unwind like Ctrl-C, through every finally that unmounts.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        log("needs root: cold runs drop the page cache and the peers mount as root")
        return 2
    # Also SIGINT: a shell without job control starts background jobs with SIGINT ignored,
    # and Python keeps an inherited SIG_IGN; this run must stay stoppable and clean up.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    cfg = Config(
        quick=args.quick,
        repeat_big=args.repeat or 1,
        repeat_small=args.repeat or 3,
        local_size=64 * MiB if args.quick else 1 << 30,
        local_entries=1000 if args.quick else 10_000,
        s3_size=64 * MiB if args.quick else 256 * MiB,
        s3_entries=1000 if args.quick else 2000,
        baseline_src=args.baseline_src,
        peers=not args.no_peers,
        without_passthrough=args.without_passthrough,
    )
    s3rver = find_s3rver()
    machine = machine_description(s3rver)
    print(f"# agentvfs mount benchmark{' (--quick)' if args.quick else ''}\n")
    print(f"command: `{' '.join([os.path.basename(sys.executable), *sys.argv])}`\n")
    for k, v in machine.items():
        print(f"- {k}: {v}")
    # (the machine description above ends with the load average at start)
    print(f"- repetitions: {cfg.repeat_big} for big reads/writes, {cfg.repeat_small} for listings/stat; "
          "medians, [min–max] when repeated\n")
    sys.stdout.flush()

    local: Results = {}
    s3: Results = {}
    skipped: list[str] = []
    workdir = tempfile.mkdtemp(prefix="agentvfs-bench-mount-")
    h = Harness(workdir, args.keep)
    interrupted = False
    try:
        if args.only in (None, "local"):
            bench_local(h, cfg, local)
        if args.only in (None, "s3"):
            if s3rver is None:
                log("s3: skipped: s3rver not found (scripts/setup.sh installs it, or set S3RVER)")
                h.problems.append("s3 part skipped: s3rver not installed")
            else:
                bench_s3(h, cfg, s3, s3rver, skipped)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: unmounting everything and stopping s3rver")
    finally:
        h.close()

    if local:
        print("## A. Local directory: direct vs agentvfs mount\n")
        print(local_table(cfg, local))
        print()
    if s3:
        print("## B. S3 (s3rver): direct clients vs mounts\n")
        print("Ratios: time / time of the best direct client for that kind of operation "
              "(reads: best GET variant; writes: best PUT variant; listings: best direct listing).\n")
        print(s3_table(cfg, s3))
        if skipped:
            print("\nskipped: " + "; ".join(skipped))
        print()
    errors = [(part, layer, op, e) for part, res in (("local", local), ("s3", s3)) for layer, d in res.items()
              for op, s in d.items() for e in s.errors]
    if errors or h.problems:
        print("## Errors and problems\n")
        for part, layer, op, e in errors:
            print(f"- {part} / {layer} / {op}: {e}")
        for p in h.problems:
            print(f"- {p}")
        print()
    if h.hows:
        print("Mount layers:\n")
        for k, v in h.hows.items():
            print(f"- {k}: {v}")
        print()
    if h.ready_times:
        ready = ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in h.ready_times.items())
        print(f"Mount start-up (process start to mounted, median): {ready}\n")
    print(f"load average at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "args": vars(args), "machine": machine, "config": vars(cfg), "interrupted": interrupted,
                "local": {layer: {op: s.to_json() for op, s in d.items()} for layer, d in local.items()},
                "s3": {layer: {op: s.to_json() for op, s in d.items()} for layer, d in s3.items()},
                "problems": h.problems, "skipped": skipped, "mount_ready_seconds": h.ready_times, "layers": h.hows,
            }, f, indent=2)  # fmt: skip
        log(f"wrote {args.json}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
