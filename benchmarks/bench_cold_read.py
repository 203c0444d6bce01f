#!/usr/bin/env python
"""Cold sequential read of one S3 object through the agentvfs mount, against the best direct
client of the same round.

An s3rver (npm ``s3rver@3.7.1``) started here on a free 127.0.0.1 port holds one object of
``--size`` MiB (256 by default, random bytes). Each round measures, with the page cache
dropped before each (s3rver's file included, so every reader starts from the same cold
disk):

* ``boto3 GET``: one ``get_object`` streamed in 1 MiB chunks;
* ``boto3 4x8 MiB``: 8 MiB ranged ``get_object`` calls on 4 threads;
* ``mount``: ``agentvfs mount s3://BUCKET`` in a process of its own, mounted afresh for the
  round (so its read-ahead holds nothing), then the file read start to end in 1 MiB
  ``readv`` calls, as ``dd bs=1M`` does; the bytes are checked by SHA-256 afterwards,
  outside the timing.

The ratio of a round is the mount's throughput over the better of the two direct clients in
that round; the summary gives the median and the range of the ratios. The order of the three
rotates from round to round, so that a drift of the machine's speed touches all of them
alike. CPU seconds spent by the mount's process, by s3rver and by this process (the reader)
are recorded for every read.

``--baseline-src DIR`` also mounts the agentvfs of another tree (its ``src``) in every round,
for a before/after comparison side by side; ``-o key=value`` passes mount options.

Needs root (to drop the page cache and to mount).

Usage::

    python benchmarks/bench_cold_read.py --rounds 7
    python benchmarks/bench_cold_read.py --rounds 5 --baseline-src /tmp/before/src --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bench_mount import (
    BUCKET,
    Harness,
    Layer,
    RunningMount,
    agentvfs_layer,
    baseline_layer,
    drop_caches,
    io_limit,
    log,
    machine_description,
    s3_client,
    start_s3rver,
    watchdog,
)

from agentvfs.bench._backends import find_s3rver
from agentvfs.bench._targets import read_path, sha256_path

MiB = 1 << 20
KEY = "cold.bin"
BOTO = "boto3 GET"
RANGED = "boto3 4x8 MiB"


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (its own threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Reading:
    """One timed read: seconds, and CPU seconds of the reader, the mount and s3rver."""

    seconds: float
    reader_cpu: float
    mount_cpu: float | None
    server_cpu: float

    def mib_s(self, size: int) -> float:
        return size / MiB / self.seconds


@dataclass
class Round:
    readings: dict[str, Reading] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


#: Drop the page cache before each read (s3rver's file too); off with ``--server-cache``.
DROP = True


def timed(fn: Callable[[], float], server_pid: int, mount_pid: int | None) -> Reading:
    if DROP:
        drop_caches()
    s0, m0, r0 = cpu_seconds(server_pid), cpu_seconds(mount_pid) if mount_pid else 0.0, own_cpu()
    seconds = fn()
    r1, s1 = own_cpu(), cpu_seconds(server_pid)
    m1 = cpu_seconds(mount_pid) if mount_pid else None
    return Reading(seconds, r1 - r0, None if m1 is None else m1 - m0, s1 - s0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=256, help="object size in MiB (default 256)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="KEY=VALUE",
                   help="a mount option of the agentvfs mount (repeatable)")
    p.add_argument("--src", metavar="DIR", help="mount the agentvfs of this tree (its src; default: the one installed)")
    p.add_argument("--baseline-src", metavar="DIR", help="also mount the agentvfs of another tree (its src)")
    p.add_argument("--server-cache", action="store_true",
                   help="keep s3rver's file in the page cache (no cache dropped: each mount is fresh, "
                        "so its reads are still cold)")
    p.add_argument("--json", metavar="PATH", help="write every reading as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        log("needs root: every read starts with the page cache dropped")
        return 2
    exe = find_s3rver()
    if exe is None:
        log("s3rver not found (scripts/setup.sh installs it, or set S3RVER)")
        return 2
    size = args.size * MiB
    global DROP
    DROP = not args.server_cache
    machine = machine_description(exe)
    load_start = os.getloadavg()

    h = Harness(tempfile.mkdtemp(prefix="agentvfs-bench-cold-"), args.keep)
    h.part = "s3"
    rounds: list[Round] = []
    layers: list[Layer] = []
    try:
        endpoint = start_s3rver(h, exe)
        server_pid = h.procs[-1].pid
        client = s3_client(endpoint)
        data = os.urandom(size)
        digest = hashlib.sha256(data).hexdigest()
        client.put_object(Bucket=BUCKET, Key=KEY, Body=data)
        del data
        storage = [f"endpoint_url={endpoint}", "key=S3RVER", "secret=S3RVER"]
        ours: Layer | str
        if args.src:
            ours = replace(baseline_layer(f"s3://{BUCKET}", storage + list(args.options), args.src),
                           name="agentvfs", how=f"`agentvfs mount` of the tree at {args.src}")
        else:
            ours = agentvfs_layer(f"s3://{BUCKET}", storage + list(args.options))
        if isinstance(ours, str):
            log(ours)
            return 1
        layers.append(ours)
        if args.baseline_src:
            layers.append(baseline_layer(f"s3://{BUCKET}", storage + list(args.options), args.baseline_src))

        def get_single() -> float:
            t0 = time.perf_counter()
            body = client.get_object(Bucket=BUCKET, Key=KEY)["Body"]
            total = sum(len(c) for c in body.iter_chunks(MiB))
            dt = time.perf_counter() - t0
            if total != size:
                raise OSError(f"GET returned {total} bytes")
            return dt

        def get_ranged() -> float:
            part = 8 * MiB

            def fetch(start: int) -> int:
                end = min(start + part, size) - 1
                body = client.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={start}-{end}")["Body"]
                return sum(len(c) for c in body.iter_chunks(MiB))

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                total = sum(pool.map(fetch, range(0, size, part)))
            dt = time.perf_counter() - t0
            if total != size:
                raise OSError(f"ranged GETs returned {total} bytes")
            return dt

        def through(layer: Layer, result: Round) -> None:
            m: RunningMount
            with h.mounted(layer) as m:  # once started: its kernel read-ahead is set
                path = os.path.join(m.mountpoint, KEY)
                os.stat(path)  # the lookup is not part of the read
                with watchdog(m, io_limit(size), "cold read"):
                    result.readings[layer.name] = timed(lambda: read_path(path, size), server_pid, m.proc.pid)
                    if sha256_path(path) != digest:
                        result.errors[layer.name] = "content read differs from the object"

        def direct(name: str, fn: Callable[[], float]) -> Callable[[Round], None]:
            def step(result: Round) -> None:
                result.readings[name] = timed(fn, server_pid, None)

            return step

        def mounted(layer: Layer) -> Callable[[Round], None]:
            return lambda result: through(layer, result)

        steps = [(BOTO, direct(BOTO, get_single)), (RANGED, direct(RANGED, get_ranged))]
        steps += [(layer.name, mounted(layer)) for layer in layers]
        for i in range(args.rounds):
            result = Round()
            order = steps[i % len(steps):] + steps[: i % len(steps)]
            for name, step in order:
                try:
                    step(result)
                except Exception as exc:
                    result.errors[name] = f"{type(exc).__name__}: {exc}"
                    log(f"  ERROR {name}: {exc}")
            rounds.append(result)
            log(f"round {i + 1}/{args.rounds}: " + ", ".join(
                f"{name} {r.mib_s(size):.0f} MiB/s" for name, r in result.readings.items()))
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        h.close()

    print(report(rounds, [layer.name for layer in layers], size, machine, load_start, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "args": vars(args), "machine": machine, "size": size,
                "rounds": [{"readings": {k: vars(v) for k, v in r.readings.items()}, "errors": r.errors}
                           for r in rounds],
            }, f, indent=2)  # fmt: skip
    return 0


def report(rounds: list[Round], mounts: list[str], size: int, machine: dict[str, str],
           load_start: tuple[float, float, float], args: argparse.Namespace) -> str:
    out = [f"# Cold sequential read of {size // MiB} MiB from s3rver: mount vs best direct client\n"]
    out.append(f"command: `{' '.join([os.path.basename(sys.executable), *sys.argv])}`\n")
    out += [f"- {k}: {v}" for k, v in machine.items()]
    load_end = os.getloadavg()
    out.append(f"- load average at start / end: {' / '.join(f'{x:.2f}' for x in load_start)}; "
               f"{' / '.join(f'{x:.2f}' for x in load_end)}\n")
    names = [BOTO, RANGED, *mounts]
    head = "| round | " + " | ".join(f"{n} MiB/s" for n in names) + " | " + " | ".join(
        f"{m} / best direct" for m in mounts) + " |"
    out += [head, "|---:|" + "---:|" * (len(names) + len(mounts))]
    ratios: dict[str, list[float]] = {m: [] for m in mounts}
    speeds: dict[str, list[float]] = {n: [] for n in names}
    for i, r in enumerate(rounds):
        cells = []
        for n in names:
            reading = r.readings.get(n)
            if reading is None:
                cells.append("error" if n in r.errors else "—")
            else:
                speeds[n].append(reading.mib_s(size))
                cells.append(f"{reading.mib_s(size):.0f}")
        direct = [r.readings[n].mib_s(size) for n in (BOTO, RANGED) if n in r.readings]
        best = max(direct) if direct else None
        for m in mounts:
            reading = r.readings.get(m)
            if reading is None or best is None or m in r.errors:
                cells.append("—")
            else:
                ratios[m].append(reading.mib_s(size) / best)
                cells.append(f"{reading.mib_s(size) / best:.2f}")
        out.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    out.append("")
    for n in names:
        if speeds[n]:
            s = speeds[n]
            out.append(f"- {n}: median {statistics.median(s):.0f} MiB/s [{min(s):.0f}–{max(s):.0f}]")
    for m in mounts:
        if ratios[m]:
            s = ratios[m]
            out.append(f"- **{m} / best direct: median {statistics.median(s):.2f} [{min(s):.2f}–{max(s):.2f}]**")
    out.append("\nCPU seconds per read (median): reader (this process) / mount process / s3rver\n")
    for n in names:
        rs = [r.readings[n] for r in rounds if n in r.readings]
        if rs:
            mount_cpu = [x.mount_cpu for x in rs if x.mount_cpu is not None]
            mcell = f"{statistics.median(mount_cpu):.2f}" if mount_cpu else "—"
            out.append(f"- {n}: {statistics.median(x.reader_cpu for x in rs):.2f} / {mcell} / "
                       f"{statistics.median(x.server_cpu for x in rs):.2f}")
    errors = [(i + 1, n, e) for i, r in enumerate(rounds) for n, e in r.errors.items()]
    if errors:
        out.append("\nErrors:\n")
        out += [f"- round {i} / {n}: {e}" for i, n, e in errors]
    return "\n".join(out)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
