"""Sandbox figures: command overhead, time to a usable bucket mount, and grep over a mounted
bucket against the same grep on a local copy.

* ``execute_command("true")`` through ``LocalSandbox`` (plain, and isolated with bubblewrap)
  against ``subprocess.run(["sh", "-c", "true"])``, alternated in each repetition.
* ``Workspace.init()`` until a command inside the sandbox lists the FUSE-mounted moto bucket.
* ``grep -r`` over a 2,000-file tree inside the sandbox, on the mounted bucket (cold: a
  fresh mount; warm: the same mount again) and on a local copy of the same files.

Usage: ``python benchmarks/bench_sandbox.py [--files 2000] [--repeat 20]``
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import anyio

from agentvfs import FsspecFilesystem, Workspace
from agentvfs.sandbox import LocalSandbox
from agentvfs.testing import MotoServer

BUCKET = "bench-sandbox"


def tree(files: int) -> dict[str, bytes]:
    """A repository-shaped tree: 20 packages x 10 modules, some lines with TODO."""
    out: dict[str, bytes] = {}
    for i in range(files):
        package, module = i % 20, (i // 20) % 10
        body = "".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(20))
        if i % 7 == 0:
            body += "# TODO: tidy this module\n"
        out[f"pkg{package:02d}/mod{module}/file{i:05d}.py"] = body.encode()
    return out


def stats(samples: list[float]) -> str:
    med = statistics.median(samples)
    return f"{med * 1000:,.2f} ms [{min(samples) * 1000:,.2f}–{max(samples) * 1000:,.2f}]"


async def sample(fn: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    await fn()  # warm-up
    out: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - started)
    return out


async def overhead(repeat: int, workdir: str) -> list[str]:
    rows: list[str] = []
    plain = LocalSandbox(working_directory=os.path.join(workdir, "plain"))
    sandboxes: dict[str, LocalSandbox] = {"LocalSandbox": plain}
    if LocalSandbox.detect_isolation()["available"]:
        sandboxes["LocalSandbox, bwrap"] = LocalSandbox(
            working_directory=os.path.join(workdir, "bwrap"), isolation="bwrap"
        )

    def direct() -> None:
        subprocess.run(["sh", "-c", "true"], check=True)

    baseline = await sample(lambda: anyio.to_thread.run_sync(direct), repeat)
    rows.append(f"| `subprocess.run(['sh', '-c', 'true'])` | {stats(baseline)} | 1.00x |")
    for label, sandbox in sandboxes.items():
        samples = await sample(lambda s=sandbox: s.execute_command("true"), repeat)  # type: ignore[misc]
        ratio = statistics.median(samples) / statistics.median(baseline)
        rows.append(f"| `execute_command('true')`, {label} | {stats(samples)} | {ratio:.2f}x |")
        await sandbox.destroy()
    return rows


async def mount_and_grep(moto: MotoServer, files: int, repeat: int, workdir: str) -> list[str]:
    rows: list[str] = []
    data = tree(files)
    raw = moto.s3fs(use_listings_cache=False)
    raw.mkdir(BUCKET)
    raw.pipe({f"{BUCKET}/repo/{name}": body for name, body in data.items()})
    local_copy = os.path.join(workdir, "local-copy")
    for name, body in data.items():
        os.makedirs(os.path.dirname(os.path.join(local_copy, name)), exist_ok=True)
        with open(os.path.join(local_copy, name), "wb") as f:
            f.write(body)
    command = "grep -r -c TODO {where} | grep -v ':0$' | wc -l"
    expected = str(sum(1 for body in data.values() if b"TODO" in body))

    starts: list[float] = []
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(repeat):
        wd = os.path.join(workdir, "wd")
        sandbox = LocalSandbox(working_directory=wd)
        bucket = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{BUCKET}/repo")
        ws = Workspace(sandbox=sandbox, mounts={"/repo": bucket})
        started = time.perf_counter()
        await ws.init()
        listed = await sandbox.execute_command("ls repo | head -1")
        starts.append(time.perf_counter() - started)
        assert listed.stdout.strip() == "pkg00", listed
        for bucket_samples in (cold, warm):
            started = time.perf_counter()
            result = await sandbox.execute_command(command.format(where="repo"))
            bucket_samples.append(time.perf_counter() - started)
            assert result.stdout.strip() == expected, result
        await ws.destroy()
    rows.append(f"| `init()` until `ls` in the sandbox lists the mounted bucket | {stats(starts)} | — |")

    sandbox = LocalSandbox(working_directory=workdir)
    shutil.rmtree(os.path.join(workdir, "wd"), ignore_errors=True)
    local: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = await sandbox.execute_command(command.format(where="local-copy"))
        local.append(time.perf_counter() - started)
        assert result.stdout.strip() == expected, result
    await sandbox.destroy()
    base = statistics.median(local)
    rows.append(f"| `grep -r` {files:,} files, local copy (page cache warm) | {stats(local)} | 1.00x |")
    rows.append(
        f"| `grep -r` {files:,} files, mounted moto bucket, first pass | {stats(cold)} | "
        f"{statistics.median(cold) / base:.1f}x |"
    )
    rows.append(
        f"| `grep -r` {files:,} files, mounted moto bucket, second pass | {stats(warm)} | "
        f"{statistics.median(warm) / base:.1f}x |"
    )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=20, help="repetitions of the overhead figures")
    parser.add_argument("--mount-repeat", type=int, default=3, help="repetitions of mount and grep figures")
    args = parser.parse_args()
    print(
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as workdir:
        rows = ["| figure | median [min–max] | ratio |", "|---|---:|---:|"]
        rows += await overhead(args.repeat, workdir)
        with MotoServer() as moto:
            rows += await mount_and_grep(moto, args.files, args.mount_repeat, workdir)
    print("\n".join(rows))


if __name__ == "__main__":
    anyio.run(main)
