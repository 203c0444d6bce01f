"""The ``io`` suite: sequential and random reads and writes, through every layer.

Per backend, one file of random (incompressible) bytes is written once through the direct
API; each round then mounts every layer afresh and measures, in this order:

============================  ================================================================
case                          how
============================  ================================================================
``seq_read_cold``             page cache, dentries and inodes dropped, then the file read start
                              to end in 1 MiB reads (``readv``, as dd does)
``seq_read_warm``             the same read right away (kernel page cache, mount caches)
``rand_read``                 ``pread`` of ``random_len`` bytes at seeded random offsets; every
                              read's latency is kept
``seq_write``                 a new file of the same size in 1 MiB writes, ``fsync``, ``close``
                              (timed to close, where most mounts upload)
``seq_write_visible``         until the backend has the whole file (some mounts upload later)
``rand_write``                ``pwrite`` of ``random_len`` bytes at random offsets into that new
                              file, ``fsync``, ``close`` (direct API: read, patch, write back)
============================  ================================================================

Every read is checked (byte count; SHA-256 in the first round) and every write verified in
the backend afterwards, untimed. Rounds are interleaved (round i runs every layer), so the
ratios against direct are taken pair by pair. With ``--fio`` the fio job files run too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
from collections.abc import Callable
from typing import Any

from ._context import Context, MiB, Timeout
from ._layers import LayerSpec
from ._model import DIRECT, Measurement
from ._system import drop_caches
from ._targets import FsspecTarget, PathTarget, Target

__all__ = ["run"]

SUITE = "io"
BLOCK = MiB
#: Slowest throughput still treated as "working" before a mount's watchdog gives up, and the
#: fixed allowance on top (mount start-up, first request).
WATCHDOG_MIN_MIB_S = 2.0
WATCHDOG_BASE_S = 60.0
VISIBLE_TIMEOUT_S = 120.0


def _limit(nbytes: int) -> float:
    return WATCHDOG_BASE_S + nbytes / MiB / WATCHDOG_MIN_MIB_S


def _write_source(target: Target, rel: str, size: int, seed: int) -> str:
    """Write ``size`` seeded random (incompressible) bytes to ``rel``, untimed, a block at a
    time; returns their SHA-256."""
    rng = random.Random(seed)
    h = hashlib.sha256()
    if isinstance(target, FsspecTarget):
        opened: Any = target.fs.open(target._p(rel), "wb")
    else:
        opened = open(os.path.join(target.path or "", rel), "wb")  # noqa: SIM115 (closed below)
    with opened as f:
        left = size
        while left:
            chunk = rng.randbytes(min(BLOCK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _wait_visible(direct: FsspecTarget, rel: str, size: int, t0: float) -> float:
    """Seconds from ``t0`` until the backend reports ``rel`` with ``size`` bytes."""
    deadline = time.perf_counter() + VISIBLE_TIMEOUT_S
    path = direct._p(rel)
    while True:
        direct._fresh()
        try:
            if direct.fs.info(path).get("size") == size:
                return time.perf_counter() - t0
        except (FileNotFoundError, OSError):
            pass
        if time.perf_counter() > deadline:
            raise Timeout(f"{rel} not in the backend with {size} bytes {VISIBLE_TIMEOUT_S:.0f} s after close")
        time.sleep(0.02)


def run(ctx: Context) -> None:
    """Run the io suite on every backend of the run."""
    from . import _fio

    for backend in ctx.backends:
        layers = ctx.layers[backend.name]
        size = ctx.size.io_remote_bytes if backend.remote else ctx.size.io_bytes
        size -= size % BLOCK
        count = size // BLOCK
        nrand = ctx.size.random_ops
        rlen = min(ctx.size.random_len, size)
        rng = random.Random(7)
        read_offsets = [rng.randrange(0, size - rlen + 1) for _ in range(nrand)]
        write_offsets = [rng.randrange(0, size - rlen + 1) for _ in range(nrand)]
        label_size = f"{size / MiB:,.0f} MiB"
        ctx.progress.start(f"io on {backend.name} ({label_size})", ctx.repeat * len(layers))
        direct = FsspecTarget(DIRECT, backend.name, backend.filesystem(), backend.root)
        direct.makedirs("io")
        sha = _write_source(direct, "io/source.bin", size, seed=1)
        block = random.Random(2).randbytes(BLOCK)
        # One repeated byte: overlapping random writes then leave every written range equal
        # to the patch, which keeps the check exact.
        patch = b"\xa5" * rlen
        write_sha = hashlib.sha256(block * count).hexdigest()

        for rnd in range(ctx.repeat):
            for spec in layers:
                if (backend.name, spec.name) in ctx.harness.broken:
                    ctx.progress.advance(f"{spec.name}: skipped (did not mount earlier)")
                    continue
                try:
                    with spec.open(ctx.harness) as target:
                        _round(ctx, backend.name, spec, target, direct, rnd, size, count, sha, block, write_sha,
                               read_offsets, write_offsets, patch, label_size, backend.remote)
                except Exception as exc:
                    # A layer that fails outside a timed step fails this round, not the run.
                    ms = ctx.measurement(SUITE, "seq_read_cold", backend.name, spec.name,
                                         f"sequential read, {label_size}, cold", "MiB/s", size)
                    ms.errors.append(f"{type(exc).__name__}: {exc}")
                    ctx.progress.log(f"  error: {backend.name} / {spec.name}: {exc}")
                ctx.progress.advance(f"round {rnd + 1}: {spec.name}")
        if ctx.fio:
            _fio.run_jobs(ctx, backend, layers)
        direct.remove("io")


def _round(ctx: Context, backend: str, spec: LayerSpec, target: Target, direct: FsspecTarget, rnd: int, size: int,
           count: int, sha: str, block: bytes, write_sha: str, read_offsets: list[int], write_offsets: list[int],
           patch: bytes, label_size: str, remote: bool) -> None:
    layer = spec.name
    src = "io/source.bin"
    own_copy = isinstance(target, PathTarget) and not spec.mounted
    if own_copy:
        # Local disk holds its own copy: the physical limit of the same operations.
        target.makedirs("io")
        _write_source(target, src, size, seed=1)
    limit = _limit(size)

    def meas(case: str, label: str, unit: str, amount: float) -> Measurement:
        return ctx.measurement(SUITE, case, backend, layer, label, unit, amount)

    cold = meas("seq_read_cold", f"sequential read, {label_size}, cold", "MiB/s", size)
    if ctx.cold:
        drop_caches()
    elif rnd == 0 and layer == DIRECT:
        cold.notes.append("page cache not dropped (not root): not cold")
    with target.guard(limit, "cold read"):
        ok = ctx.record(cold, lambda: target.read_file(src, size))
    if ok and rnd == 0:
        with target.guard(limit, "verify read"):
            _check(cold, lambda: target.sha256(src) == sha, "content read", "differs from the file written")
    warm = meas("seq_read_warm", f"sequential re-read, {label_size}, warm", "MiB/s", size)
    with target.guard(limit, "warm read"):
        ctx.record(warm, lambda: target.read_file(src, size))
    rlen = len(patch)
    rr = meas("rand_read", f"random reads, {len(read_offsets)} × {rlen >> 10} KiB", "MiB/s",
              len(read_offsets) * rlen)

    def random_reads() -> float:
        times = target.read_ranges(src, read_offsets, rlen)
        rr.latencies.extend(times)
        return sum(times)

    if ctx.cold:
        drop_caches()
    with target.guard(limit, "random reads"):
        ctx.record(rr, random_reads)

    name = f"io/w-{layer.replace(' ', '-').replace('.', '-')}-{rnd}.bin"
    sw = meas("seq_write", f"sequential write, {label_size} (1 MiB writes, fsync, close)", "MiB/s", size)
    t0 = time.perf_counter()
    with target.guard(limit, "write"):
        wrote = ctx.record(sw, lambda: target.write_file(name, block, count, fsync=True))
    # What the write left in the backend is read back directly; local disk reads its own copy.
    checker: Target = direct if spec.mounted else target
    vis = meas("seq_write_visible", f"sequential write, {label_size}: until in the backend", "MiB/s", size)
    if wrote and spec.mounted:
        # Some mounts upload after close (rclone); the time until the backend has the whole
        # file is the figure that matters to the next reader.
        wrote = ctx.record(vis, lambda: _wait_visible(direct, name, size, t0))
    elif wrote:
        # Direct writes and local disk are in place when close returns: the same figure.
        vis.samples.append(sw.samples[-1])
    if wrote:
        _check(sw, lambda: checker.sha256(name) == write_sha, "the file in the backend", "differs from the data written")
    rw = meas("rand_write", f"random writes, {len(write_offsets)} × {rlen >> 10} KiB into it, fsync", "MiB/s",
              len(write_offsets) * rlen)
    if wrote:
        with target.guard(limit, "random writes"):
            ok = ctx.record(rw, lambda: target.write_ranges(name, write_offsets, patch))
        if ok:
            _verify_patch(rw, checker, name, write_offsets, patch, spec.mounted)
        if layer == DIRECT and rnd == 0:
            rw.notes.append("direct API: no in-place write; the whole object is read, patched and written back")
    with contextlib.suppress(OSError):
        target.remove(name)
    if own_copy:
        target.remove("io")


def _check(m: Measurement, fn: Callable[[], bool], subject: str, mismatch: str) -> None:
    """Untimed verification: a mismatch or a failure to check is an error of ``m``."""
    try:
        if not fn():
            m.errors.append(f"{subject} {mismatch}")
    except Exception as exc:
        m.errors.append(f"{subject}: cannot verify: {type(exc).__name__}: {exc}")


def _verify_patch(m: Measurement, checker: Target, name: str, offsets: list[int], patch: bytes, wait: bool) -> None:
    """Every written range must be in the backend once close returned (or, for a mount that
    uploads later, within the visibility timeout)."""
    deadline = time.monotonic() + (VISIBLE_TIMEOUT_S if wait else 0)
    while True:
        try:
            data = checker.read_all(name)
        except Exception as exc:
            m.errors.append(f"cannot read back {name}: {exc}")
            return
        if all(data[o : o + len(patch)] == patch for o in offsets):
            return
        if time.monotonic() > deadline:
            m.errors.append("random writes are not all in the backend after close")
            return
        time.sleep(0.1)
