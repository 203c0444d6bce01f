#!/usr/bin/env python
"""The persistent content cache of agentvfs mounts (``-o cache_dir=DIR``), against no cache,
a local copy, and the disk caches of rclone and s3fs-fuse, on s3rver (npm) started here on
127.0.0.1.

Figures, in interleaved rounds of one run (the order of the units rotates each round):

1. ``grep -r -c TODO`` over a tree of 2,000 files of about 800 bytes (every seventh has a
   TODO) in 41 directories, through:

   * a local copy (page cache warm);
   * an agentvfs mount without cache, first pass on a fresh mount;
   * an agentvfs mount with ``cache_dir`` = a fresh empty directory, first pass (cold cache),
     then a new mount (new process) over the now-warm cache, its first pass (second session);
   * ``rclone mount --vfs-cache-mode full``, first pass with an empty cache directory, then a
     new rclone process over the same cache directory (second session);
   * s3fs-fuse without cache; and with ``-o use_cache=DIR``, cold then a second session.

   Every pass is the first one of its mount: the kernel's page cache of a FUSE mount does not
   survive unmounting, so a new mount shows what a new session of an agent gets.

2. Warm re-read of a 256 MiB object after a remount, with a warm cache: agentvfs read-write
   and read-only (read-only mounts serve cached files by FUSE passthrough), against reading a
   local-disk copy whose pages are in the page cache, in the same round.

3. Cold sequential read of the 256 MiB object through a fresh mount with the cache on (empty
   cache directory: what filling it costs) and without cache.

Nothing here drops the page cache unless ``--drop-caches`` is given (then before each cold
agentvfs/peer unit): "cold" means a fresh mount and an empty cache directory, while s3rver's
own files stay in the page cache like a fast network. For every timed pass the run also
records the requests s3rver served (from its log, by method), and the CPU seconds of the
mount's server process and of s3rver. ``--diagnose`` adds, after the rounds, an ``strace -c -w
-f`` of grep and a py-spy profile of the mount process for each agentvfs grep case.

Needs root (FUSE mounts). Writes ``benchmarks/runs/<date>-cache/bench-cache.json`` and prints a
markdown table (median [min–max] of the rounds).

Usage::

    python benchmarks/bench_cache.py [--repeat 3] [--files 2000] [--big-mib 256] [--no-peers]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentvfs import FsspecFilesystem
from agentvfs.bench._backends import BUCKET, S3RVER_CREDENTIALS, S3rverServer, find_s3rver
from agentvfs.bench._system import drop_caches, machine_description, stop_process, unmount
from agentvfs.mounts import ProcessMount, is_mounted
from agentvfs.vfs import ContentCache

MiB = 1 << 20
REPO = Path(__file__).resolve().parent.parent
MOUNT_TIMEOUT = 30.0
#: The figure this cache is meant to beat: grep over the same tree on a fresh mount, no cache
#: (bench_sandbox.py, on moto).
OLD_COLD_GREP_S = 14.7


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- s3rver, with its request log ---------------------------------------------------------------


class LoggedS3rver(S3rverServer):
    """s3rver without ``--silent``: one log line per request, counted per timed pass."""

    def _command(self, port: int) -> list[str]:
        return [a for a in super()._command(port) if a != "--silent"]


#: s3rver 3.7.1 logs ``<target> <status> <ms>ms <bytes>`` with the method and the first
#: characters of the target cut off, one character more for HEAD than for GET and PUT: a HEAD
#: shows the bucket name one character longer. A PUT is also logged as "Stored object".
_REQUEST = re.compile(r"info\S*: (\S+) (\d{3}) \d+ms")


class RequestLog:
    """Requests s3rver logged since the last ``mark``, by kind (GET, ranged GET, HEAD, LIST, PUT)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def take(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
            self.offset = f.tell()
        for line in text.splitlines():
            if "Stored object" in line:
                counts["PUT"] += 1
                counts["GET"] -= 1  # its request line reads like a GET's
                continue
            m = _REQUEST.search(line)
            if m is None:
                continue
            target, status = m.group(1), m.group(2)
            if "list-type" in target or "prefix=" in target:
                kind = "LIST"
            elif target.startswith(BUCKET[-10:]):
                kind = "HEAD"
            elif status == "206":
                kind = "GET range"
            else:
                kind = "GET"
            counts[kind] += 1
            if status.startswith(("4", "5")):
                counts[f"status {status}"] += 1
        return {k: v for k, v in counts.items() if v}


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` and its waited-for children so far (0 if gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / ticks


# -- data -----------------------------------------------------------------------------------


def tree(files: int) -> dict[str, bytes]:
    """``files`` files in 8 packages x 4 modules (41 directories with ``tree/``): modules of
    about 800 bytes, every seventh with a TODO, and a ``README.md`` and ``__init__.py`` in the
    directories above them (s3rver 3.7.1 lists no common prefixes under a prefix whose
    directory holds no object of its own: without them ``tree/`` would look empty)."""
    out: dict[str, bytes] = {"tree/README.md": b"# bench tree\n"}
    for package in range(8):
        out[f"tree/pkg{package:02d}/__init__.py"] = b'"""A package."""\n'
    for i in range(files - len(out)):
        package, module = i % 8, (i // 8) % 4
        body = "".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(25))
        if i % 7 == 0:
            body += "# TODO: tidy this module\n"
        out[f"tree/pkg{package:02d}/mod{module}/file{i:05d}.py"] = body.encode()
    return out


def grep(where: str, expected: int) -> float:
    started = time.perf_counter()
    out = subprocess.run(["grep", "-r", "-c", "TODO", where], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    hits = sum(1 for line in out.stdout.splitlines() if not line.endswith(":0"))
    files = len(out.stdout.splitlines())
    if out.returncode not in (0, 1) or hits != expected:
        raise RuntimeError(f"grep in {where}: exit {out.returncode}, {hits} files with TODO of {files} "
                           f"(expected {expected}); {out.stderr.strip()[:300]}")
    return elapsed


def read_big(path: str, expect_sha: str, size: int) -> float:
    """Sequential 1 MiB reads of the whole file (timed), then its SHA-256 (untimed re-read)."""
    buf = bytearray(MiB)
    view = memoryview(buf)
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.perf_counter()
        while True:
            n = os.readv(fd, [view])
            if n == 0:
                break
            total += n
        elapsed = time.perf_counter() - started
        h = hashlib.sha256()
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 4 * MiB):
            h.update(chunk)
    finally:
        os.close(fd)
    if total != size or h.hexdigest() != expect_sha:
        raise RuntimeError(f"{path}: read {total} bytes of {size}, sha256 {'ok' if h.hexdigest() == expect_sha else 'WRONG'}")
    return elapsed


# -- mounts ---------------------------------------------------------------------------------


@dataclass
class Running:
    """One mount of ours: its server's pid and how to stop it."""

    name: str
    mountpoint: str
    pid: int | None
    stop: Callable[[], None]


class Env:
    """The run's server, data, scratch space and every mount, undone by ``close``."""

    def __init__(self, workdir: Path, peers: bool) -> None:
        self.workdir = workdir
        self.peers = peers
        self._n = 0
        self.mounts: list[Running] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        exe = find_s3rver()
        if exe is None:
            raise SystemExit("s3rver not found: run scripts/setup.sh bench or set S3RVER")
        self.s3log = workdir / "s3rver.log"
        (workdir / "s3rver-data").mkdir()
        self.server = LoggedS3rver(exe, str(workdir / "s3rver-data"), BUCKET, log_path=self.s3log)
        self.server.start()
        self.requests = RequestLog(self.s3log)
        self.endpoint = self.server.endpoint_url
        self.key, self.secret = S3RVER_CREDENTIALS
        self.prefix = "bench-cache"
        self.root = f"{BUCKET}/{self.prefix}"

    @property
    def server_pid(self) -> int | None:
        proc = getattr(self.server, "_proc", None)
        return proc.pid if proc is not None else None

    def s3fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(key=self.key, secret=self.secret, endpoint_url=self.endpoint,
                                 skip_instance_cache=True, use_listings_cache=False)

    def scratch(self, name: str) -> str:
        self._n += 1
        path = self.workdir / f"{name}-{self._n}"
        path.mkdir()
        return str(path)

    @contextlib.contextmanager
    def mounted(self, start: Callable[[str], Running], name: str) -> Iterator[Running]:
        m = start(self.scratch(f"mnt-{name}"))
        self.mounts.append(m)
        try:
            yield m
        finally:
            m.stop()
            self.mounts.remove(m)

    # agentvfs: ProcessMount (a child process serves the mount)
    def agentvfs(
        self, *, cache_dir: str | None, read_only: bool = False, metadata: bool = True, source: str | None = None
    ) -> Callable[[str], Running]:
        """A mount served by a child process; with ``source``, one that imports agentvfs from
        that ``src`` directory (a checkout of the baseline) instead of this one."""

        def start(mnt: str) -> Running:
            fs = FsspecFilesystem(self.s3fs(), root=self.root)
            options: dict[str, Any] = {"cache_dir": cache_dir} if cache_dir else {}
            if not metadata:
                options["metadata"] = False
            saved = os.environ.get("PYTHONPATH")
            if source is not None:
                os.environ["PYTHONPATH"] = source  # the child process inherits it
            try:
                pm = ProcessMount(fs, mnt, read_only=read_only, options=options).start()
            finally:
                if source is not None:
                    if saved is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = saved
            return Running("agentvfs", mnt, pm.pid, pm.close)

        return start

    def _spawn(self, argv: list[str], env: dict[str, str], mnt: str, logname: str) -> Running:
        with open(self.workdir / logname, "ab") as logf:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        t0 = time.perf_counter()
        while not (is_mounted(mnt) and os.path.ismount(mnt)):
            if proc.poll() is not None or time.perf_counter() - t0 > MOUNT_TIMEOUT:
                stop_process(proc)
                unmount(mnt)
                raise RuntimeError(f"{argv[0]} did not mount (exit {proc.returncode}); see {self.workdir / logname}")
            time.sleep(0.02)

        def stop() -> None:
            unmount(mnt)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                stop_process(proc)

        return Running(argv[0], mnt, proc.pid, stop)

    def rclone(self, cache_dir: str) -> Callable[[str], Running]:
        def start(mnt: str) -> Running:
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
            env.update({
                "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
                "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": self.key, "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": self.secret,
                "RCLONE_CONFIG_BENCH_ENDPOINT": self.endpoint, "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
                "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
            })  # fmt: skip
            argv = ["rclone", "--config", os.path.join(cache_dir, "rclone.conf"), "mount", f"bench:{self.root}", mnt,
                    "--vfs-cache-mode", "full", "--cache-dir", cache_dir]  # fmt: skip
            return self._spawn(argv, env, mnt, "rclone.log")

        return start

    def s3fs_fuse(self, cache_dir: str | None) -> Callable[[str], Running]:
        def start(mnt: str) -> Running:
            pw = self.workdir / "s3fs-passwd"
            if not pw.exists():
                with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                    f.write(f"{self.key}:{self.secret}\n")
            argv = ["s3fs", f"{BUCKET}:/{self.prefix}", mnt, "-f", "-o", f"url={self.endpoint}",
                    "-o", "use_path_request_style", "-o", f"passwd_file={pw}", "-o", "endpoint=us-east-1",
                    "-o", "dbglevel=warn"]  # fmt: skip
            if cache_dir:
                argv += ["-o", f"use_cache={cache_dir}"]
            return self._spawn(argv, dict(os.environ), mnt, "s3fs-fuse.log")

        return start

    def bindfs(self, source: str) -> Callable[[str], Running]:
        def start(mnt: str) -> Running:
            return self._spawn(["bindfs", "-f", source, mnt], dict(os.environ), mnt, "bindfs.log")

        return start

    def pyfuse3_floor(self, source: str) -> Callable[[str], Running]:
        def start(mnt: str) -> Running:
            server = str(Path(__file__).with_name("_pyfuse3_floor.py"))
            return self._spawn([sys.executable, server, source, mnt], dict(os.environ), mnt, "pyfloor.log")

        return start

    def close(self) -> None:
        for m in list(self.mounts):
            with contextlib.suppress(Exception):
                m.stop()
        for mnt in self.workdir.glob("mnt-*"):
            if is_mounted(str(mnt)):
                unmount(str(mnt))
        for proc in self.procs:
            with contextlib.suppress(Exception):
                stop_process(proc)
        with contextlib.suppress(Exception):
            self.server.stop()


# -- samples --------------------------------------------------------------------------------


@dataclass
class Series:
    seconds: list[float] = field(default_factory=list)
    requests: list[dict[str, int]] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    s3rver_cpu: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Run:
    def __init__(self, env: Env, drop: bool) -> None:
        self.env = env
        self.drop = drop
        self.results: dict[str, Series] = {}

    def cold(self) -> None:
        if self.drop and not drop_caches():
            raise SystemExit("--drop-caches: cannot write /proc/sys/vm/drop_caches")

    def measure(self, name: str, fn: Callable[[], float], pid: int | None = None) -> bool:
        s = self.results.setdefault(name, Series())
        self.env.requests.mark()
        cpu0, s3cpu0 = cpu_seconds(pid), cpu_seconds(self.env.server_pid)
        try:
            seconds = fn()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            s.errors.append(f"{type(exc).__name__}: {exc}")
            log(f"  ERROR {name}: {exc}")
            return False
        s.seconds.append(seconds)
        time.sleep(0.3)  # the last log lines of s3rver
        s.requests.append(self.env.requests.take())
        s.server_cpu.append(cpu_seconds(pid) - cpu0)
        s.s3rver_cpu.append(cpu_seconds(self.env.server_pid) - s3cpu0)
        log(f"  {name}: {seconds:.3f} s; requests {s.requests[-1]}; server CPU {s.server_cpu[-1]:.2f} s, "
            f"s3rver CPU {s.s3rver_cpu[-1]:.2f} s")
        return True

    def note(self, name: str, text: str) -> None:
        self.results.setdefault(name, Series()).notes.append(text)


def cache_info(directory: str) -> str:
    info = ContentCache(directory).info()
    return f"{info.entries} entries, {info.bytes / MiB:.1f} MiB"


# -- the units of a round -------------------------------------------------------------------

G_LOCAL = "grep, local copy (page cache warm)"
G_NOCACHE = "grep, agentvfs no cache, first pass (fresh mount)"
G_COLD = "grep, agentvfs cache, cold cache (empty dir), first pass"
G_WARM = "grep, agentvfs cache, second session (new mount, warm cache)"
G_COLD_NOMETA = "grep, agentvfs cache -o metadata=off, cold cache (empty dir), first pass"
G_WARM_NOMETA = "grep, agentvfs cache -o metadata=off, second session (new mount, warm cache)"
G_RC_COLD = "grep, rclone vfs-cache-mode full, first pass (empty cache)"
G_RC_WARM = "grep, rclone vfs-cache-mode full, second session (same cache dir)"
G_S3FS = "grep, s3fs-fuse no cache, first pass"
G_S3FS_COLD = "grep, s3fs-fuse use_cache, first pass (empty cache)"
G_S3FS_WARM = "grep, s3fs-fuse use_cache, second session (same cache dir)"
G_COLD_BASE = "grep, baseline agentvfs cache, cold cache (empty dir), first pass"
G_WARM_BASE = "grep, baseline agentvfs cache, second session (new mount, warm cache)"
G_BINDFS = "grep, bindfs (a C FUSE server) over the local copy, fresh mount"
G_PYFLOOR = "grep, the least pyfuse3 server (the tree in memory), fresh mount"
B_LOCAL = "big object read, local disk copy (page cache warm)"
B_RW = "big object re-read, agentvfs cache rw, after remount (warm cache)"
B_RO = "big object re-read, agentvfs cache ro (passthrough), after remount (warm cache)"
B_COLD = "big object cold read, agentvfs cache on (empty cache dir)"
B_NOCACHE = "big object cold read, agentvfs no cache"


def units(
    run: Run, local_tree: str, local_big: str, expected: int, big_sha: str, big_size: int, baseline: str | None = None
) -> dict[str, Callable[[], None]]:
    env = run.env
    big = "big.bin"

    def g_local() -> None:
        grep(local_tree, expected)  # its pages warm whatever ran before
        run.measure(G_LOCAL, lambda: grep(local_tree, expected))

    def g_nocache() -> None:
        run.cold()
        with env.mounted(env.agentvfs(cache_dir=None), "agentvfs") as m:
            run.measure(G_NOCACHE, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)

    def two_sessions(cold: str, warm: str, *, notes: bool = False, **mount: Any) -> None:
        """A first pass over an empty cache directory, then a new mount over it (the second
        session), with the agentvfs mount options ``mount``."""
        cache = env.scratch("agentvfs-cache")
        run.cold()
        with env.mounted(env.agentvfs(cache_dir=cache, **mount), "agentvfs") as m:
            run.measure(cold, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        if notes:
            run.note(cold, f"cache after the pass and unmount: {cache_info(cache)}")
        with env.mounted(env.agentvfs(cache_dir=cache, **mount), "agentvfs") as m:
            run.measure(warm, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        if notes:
            run.note(warm, f"cache after: {cache_info(cache)}")
        shutil.rmtree(cache, ignore_errors=True)

    def g_cache() -> None:
        two_sessions(G_COLD, G_WARM, notes=True)

    def g_cache_base() -> None:
        # The same two sessions with agentvfs as it was at the baseline revision.
        two_sessions(G_COLD_BASE, G_WARM_BASE, source=baseline)

    def g_cache_nometa() -> None:
        # Without the HEAD of every file a listing cannot tell its metadata (mode, owner, times).
        two_sessions(G_COLD_NOMETA, G_WARM_NOMETA, metadata=False)

    def g_rclone() -> None:
        cache = env.scratch("rclone-cache")
        run.cold()
        with env.mounted(env.rclone(cache), "rclone") as m:
            run.measure(G_RC_COLD, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        with env.mounted(env.rclone(cache), "rclone") as m:
            run.measure(G_RC_WARM, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        shutil.rmtree(cache, ignore_errors=True)

    def g_s3fs() -> None:
        run.cold()
        with env.mounted(env.s3fs_fuse(None), "s3fs") as m:
            run.measure(G_S3FS, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        cache = env.scratch("s3fs-cache")
        run.cold()
        with env.mounted(env.s3fs_fuse(cache), "s3fs") as m:
            run.measure(G_S3FS_COLD, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        with env.mounted(env.s3fs_fuse(cache), "s3fs") as m:
            run.measure(G_S3FS_WARM, lambda: grep(os.path.join(m.mountpoint, "tree"), expected), m.pid)
        shutil.rmtree(cache, ignore_errors=True)

    def g_bindfs() -> None:
        # The floor of any FUSE mount on this machine: a server written in C over files on
        # local disk, with nothing to fetch and nothing to check.
        with env.mounted(env.bindfs(local_tree), "bindfs") as m:
            run.measure(G_BINDFS, lambda: grep(m.mountpoint, expected), m.pid)

    def g_pyfloor() -> None:
        # The floor of a Python FUSE server: pyfuse3 on trio answering from memory.
        with env.mounted(env.pyfuse3_floor(local_tree), "pyfloor") as m:
            run.measure(G_PYFLOOR, lambda: grep(m.mountpoint, expected), m.pid)

    def b_cache() -> None:
        cache = env.scratch("agentvfs-cache")
        run.cold()
        with env.mounted(env.agentvfs(cache_dir=cache), "agentvfs") as m:
            run.measure(B_COLD, lambda: read_big(os.path.join(m.mountpoint, big), big_sha, big_size), m.pid)
        run.note(B_COLD, f"cache after the read and unmount: {cache_info(cache)}")
        # The local copy in the same round, next to the warm reads it is compared with; read
        # once untimed first, so its pages are in the page cache whatever ran before.
        read_big(local_big, big_sha, big_size)
        run.measure(B_LOCAL, lambda: read_big(local_big, big_sha, big_size))
        with env.mounted(env.agentvfs(cache_dir=cache), "agentvfs") as m:
            run.measure(B_RW, lambda: read_big(os.path.join(m.mountpoint, big), big_sha, big_size), m.pid)
        with env.mounted(env.agentvfs(cache_dir=cache, read_only=True), "agentvfs-ro") as m:
            run.measure(B_RO, lambda: read_big(os.path.join(m.mountpoint, big), big_sha, big_size), m.pid)
        shutil.rmtree(cache, ignore_errors=True)

    def b_nocache() -> None:
        run.cold()
        with env.mounted(env.agentvfs(cache_dir=None), "agentvfs") as m:
            run.measure(B_NOCACHE, lambda: read_big(os.path.join(m.mountpoint, big), big_sha, big_size), m.pid)

    out = {"local": g_local, "nocache": g_nocache, "cache": g_cache, "nometa": g_cache_nometa}
    if baseline is not None:
        out["cache-base"] = g_cache_base
    out["pyfloor"] = g_pyfloor
    if shutil.which("bindfs"):
        out["bindfs"] = g_bindfs
    if env.peers:
        out.update((tool, u) for u, tool in ((g_rclone, "rclone"), (g_s3fs, "s3fs")) if shutil.which(tool))
    out.update({"big-cache": b_cache, "big-nocache": b_nocache})
    return out


# -- diagnostics ----------------------------------------------------------------------------


def diagnose(run: Run, expected: int, out_dir: Path) -> dict[str, Any]:
    """strace -c -f of grep, and a py-spy profile of the mount process, for each agentvfs grep
    case (not timed in the table: both tracers slow what they watch)."""
    env = run.env
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    found: dict[str, Any] = {}
    cache = env.scratch("agentvfs-cache-diag")
    for label, cache_dir in (("no cache", None), ("cold cache", cache), ("warm cache", cache)):
        with env.mounted(env.agentvfs(cache_dir=cache_dir), "agentvfs-diag") as m:
            where = os.path.join(m.mountpoint, "tree")
            slug = label.replace(" ", "-")
            strace_out = out_dir / f"strace-grep-{slug}.txt"
            profile = out_dir / f"py-spy-{slug}.txt"
            spy = None
            if os.access(pyspy, os.X_OK) and m.pid is not None:
                spy = subprocess.Popen([pyspy, "record", "--pid", str(m.pid), "--format", "raw", "--rate", "200",
                                        "--nonblocking", "--threads", "--output", str(profile)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            env.requests.mark()
            started = time.perf_counter()
            subprocess.run(["strace", "-c", "-w", "-f", "-o", str(strace_out), "grep", "-r", "-c", "TODO", where],
                           capture_output=True, check=False)
            elapsed = time.perf_counter() - started
            time.sleep(0.3)
            found[label] = {"seconds_under_strace": elapsed, "requests": env.requests.take(),
                            "strace": strace_out.read_text() if strace_out.exists() else None}
            if spy is not None:
                spy.send_signal(2)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(30)
                found[label]["py_spy_top"] = top_frames(profile)
            log(f"  diagnose {label}: {elapsed:.2f} s under strace; requests {found[label]['requests']}")
    shutil.rmtree(cache, ignore_errors=True)
    return found


def top_frames(profile: Path, n: int = 25) -> list[tuple[str, int]]:
    """The functions most often on the stack (inclusive samples), from py-spy's raw output."""
    if not profile.exists():
        return []
    inclusive: Counter[str] = Counter()
    for line in profile.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = {re.sub(r" \(.*?:\d+\)$", "", f.split(" (")[0]) + " " + (f.split(" (")[1].split(":")[0] if " (" in f else "")
                  for f in stack.split(";")}
        for f in frames:
            inclusive[f.strip()] += int(count)
    return inclusive.most_common(n)


# -- report ---------------------------------------------------------------------------------


def fmt(s: Series) -> str:
    if not s.seconds:
        return "error" if s.errors else "—"
    med = statistics.median(s.seconds)
    return f"{med:.3f} s [{min(s.seconds):.3f}–{max(s.seconds):.3f}]"


def table(results: dict[str, Series], big_size: int) -> str:
    rows = ["| figure | median [min–max] | vs local | requests to s3rver (median pass) | mount CPU s | s3rver CPU s |",
            "|---|---:|---:|---|---:|---:|"]

    def base(name: str) -> float | None:
        s = results.get(name)
        return statistics.median(s.seconds) if s and s.seconds else None

    for name, s in results.items():
        ref = base(B_LOCAL if name.startswith("big object") else G_LOCAL)
        med = statistics.median(s.seconds) if s.seconds else None
        ratio = f"{med / ref:.2f}x" if med and ref else "—"
        if name.startswith("big object") and med:
            ratio += f" ({big_size / MiB / med:,.0f} MiB/s)"
        reqs = "—"
        if s.requests:
            mid = sorted(s.requests, key=lambda r: sum(r.values()))[len(s.requests) // 2]
            reqs = ", ".join(f"{k} {v}" for k, v in sorted(mid.items())) or "none"
        cpu = f"{statistics.median(s.server_cpu):.2f}" if s.server_cpu and name not in (G_LOCAL, B_LOCAL) else "—"
        s3cpu = f"{statistics.median(s.s3rver_cpu):.2f}" if s.s3rver_cpu and name not in (G_LOCAL, B_LOCAL) else "—"
        text = fmt(s) + (f" + {len(s.errors)} error(s)" if s.errors and s.seconds else "")
        rows.append(f"| {name} | {text} | {ratio} | {reqs} | {cpu} | {s3cpu} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--big-mib", type=int, default=256)
    parser.add_argument("--no-peers", action="store_true", help="skip rclone and s3fs-fuse")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the page cache before each cold unit (slows other work on the machine)")
    parser.add_argument("--only", default=None,
                        help="comma-separated units to run: local, nocache, cache, cache-base (with --baseline), nometa, "
                             "pyfloor, bindfs, rclone, s3fs, "
                             "big-cache, big-nocache (default: all)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time the cache's two sessions with agentvfs at git revision REV (a worktree)")
    parser.add_argument("--diagnose", action="store_true", help="strace and py-spy the agentvfs grep cases after the rounds")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/runs/<date>-cache)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        log("needs root (FUSE mounts)")
        return 2
    out_dir = args.out or REPO / "benchmarks" / "runs" / f"{datetime.date.today():%Y-%m-%d}-cache"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_start = os.getloadavg()
    machine = machine_description()
    log(f"load average at start: {load_start}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    env = Env(workdir, peers=not args.no_peers)
    run = Run(env, args.drop_caches)
    loads: list[tuple[float, float, float]] = [load_start]
    diag: dict[str, Any] = {}
    try:
        data = tree(args.files)
        expected = sum(1 for body in data.values() if b"TODO" in body)
        fs = env.s3fs()
        t0 = time.perf_counter()
        fs.pipe({f"{env.root}/{name}": body for name, body in data.items()})
        big_size = args.big_mib * MiB
        big_local = workdir / "local" / "big.bin"
        big_local.parent.mkdir(parents=True)
        h = hashlib.sha256()
        with open(big_local, "wb") as f:
            for _ in range(args.big_mib):
                block = os.urandom(MiB)
                h.update(block)
                f.write(block)
        big_sha = h.hexdigest()
        fs.put_file(str(big_local), f"{env.root}/big.bin")
        local_tree = workdir / "local"
        for name, body in data.items():
            (local_tree / name).parent.mkdir(parents=True, exist_ok=True)
            (local_tree / name).write_bytes(body)
        log(f"uploaded {len(data)} files and {args.big_mib} MiB in {time.perf_counter() - t0:.1f} s")
        # Warm the local copies' pages.
        grep(str(local_tree / "tree"), expected)
        read_big(str(big_local), big_sha, big_size)
        baseline = None
        if args.baseline:
            checkout = workdir / "baseline"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(checkout), args.baseline],
                           check=True, capture_output=True)
            baseline = str(checkout / "src")
        named = units(run, str(local_tree / "tree"), str(big_local), expected, big_sha, big_size, baseline)
        chosen = args.only.split(",") if args.only else list(named)
        unknown = sorted(set(chosen) - set(named))
        if unknown:
            raise SystemExit(f"--only: unknown or unavailable units {unknown}; choose from {sorted(named)}")
        rounds = [named[name] for name in chosen]
        for index in range(args.repeat):
            order = rounds[index % len(rounds):] + rounds[: index % len(rounds)]
            log(f"round {index + 1}/{args.repeat} (load average {os.getloadavg()[0]:.2f})")
            for unit in order:
                unit()
            loads.append(os.getloadavg())
        if args.diagnose:
            diag = diagnose(run, expected, out_dir)
    finally:
        env.close()
        if args.baseline:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(workdir / "baseline")],
                           check=False, capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
    md = table(run.results, args.big_mib * MiB)
    header = (f"s3rver on 127.0.0.1; {args.files:,} files, {args.big_mib} MiB object; {args.repeat} interleaved rounds; "
              f"load average (1 min) at start {load_start[0]:.2f}, at the end of each round "
              f"{', '.join(f'{x[0]:.2f}' for x in loads[1:])}; page cache dropped: {'before cold units' if args.drop_caches else 'never'}; "
              f"total {time.perf_counter() - started:.0f} s")
    print(header + "\n\n" + md)
    notes = {name: s.notes for name, s in run.results.items() if s.notes}
    for name, texts in notes.items():
        print(f"\n- {name}: " + "; ".join(texts))
    record = {
        "machine": machine,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_average": loads,
        "old_cold_grep_seconds_on_moto": OLD_COLD_GREP_S,
        "results": {name: vars(s) for name, s in run.results.items()},
        "diagnostics": diag,
        "table": md,
        "header": header,
    }
    path = out_dir / "bench-cache.json"
    path.write_text(json.dumps(record, indent=1))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
