"""Sandbox figures: command overhead, time to a usable bucket mount, and grep over a mounted
bucket against the same grep on a local copy.

* ``execute_command("true")`` through ``LocalSandbox`` (plain, and isolated with bubblewrap)
  against ``subprocess.run(["true"])``, the code of an earlier revision (``--before-rev``,
  e.g. the commit before the sandbox hardening) beside today's, each in a worker process of
  its own, in interleaved rounds of the same run; and the bubblewrap command lines alone
  (the old flags and the hardened ones, with today's read-only /proc and, as root, device
  nodes of the sandbox's own) run with ``subprocess.run``.
* ``Workspace.init()`` until a command inside the sandbox lists the FUSE-mounted moto bucket.
* ``grep -r`` over a 2,000-file tree inside the sandbox, on the mounted bucket (cold: a
  fresh mount; warm: the same mount again) and on a local copy of the same files.

Usage: ``python benchmarks/bench_sandbox.py [--files 2000] [--repeat 20] [--rounds 10]
[--before-rev 78f08b7] [--overhead-only]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

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


# A worker times ``execute_command("true")`` with one version of agentvfs (its ``src`` on
# PYTHONPATH): it reads a count per line and answers the durations as JSON, so the rounds of
# the old and the new code interleave in one run.
_WORKER = r"""
import json, sys, tempfile, time
import anyio, anyio.to_thread
from agentvfs.sandbox import LocalSandbox

async def main():
    sandbox = LocalSandbox(working_directory=tempfile.mkdtemp(prefix="bench-worker-"), isolation=sys.argv[1])
    await sandbox.execute_command("true")
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            break
        samples = []
        for _ in range(int(line)):
            started = time.perf_counter()
            result = await sandbox.execute_command("true")
            samples.append(time.perf_counter() - started)
            assert result.exit_code == 0, result
        print(json.dumps(samples), flush=True)
    await sandbox.destroy()

anyio.run(main)
"""


class _Worker:
    """One worker process (see ``_WORKER``)."""

    def __init__(self, src: str, isolation: str) -> None:
        env = {**os.environ, "PYTHONPATH": src}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, isolation],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def sample(self, count: int) -> list[float]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{count}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a benchmark worker died (is that src importable with this Python?)")
        return [float(x) for x in json.loads(line)]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _old_bwrap_args(workdir: str) -> list[str]:
    """The bubblewrap command line agentvfs built before the hardening (for the raw figure)."""
    args = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"):
        args += ["--ro-bind-try", path, path]
    args += ["--bind", workdir, workdir, "--remount-ro", "/", "--chdir", workdir, "--die-with-parent"]
    return [*args, "--", "true"]


def _new_bwrap_args(workdir: str, seccomp_fd: int, devices: dict[str, str] | None) -> list[str]:
    """The same layout with today's hardening in front, today's covers of /proc after it and,
    as root, the sandbox's own device nodes in /dev."""
    from agentvfs.sandbox._isolation import _hardening, bwrap_support, device_args, proc_args

    old = _old_bwrap_args(workdir)
    dev = old.index("--dev") + 2
    layout = [*old[1 : old.index("--dev")], *proc_args("/proc"), *old[old.index("--dev") : dev], *device_args(devices), *old[dev:]]
    return [old[0], *_hardening(bwrap_support(), run_as_root=False), "--seccomp", str(seccomp_fd), *layout]


def _raw(argv_for: Callable[[], tuple[list[str], list[int]]]) -> Callable[[], None]:
    def run() -> None:
        argv, fds = argv_for()
        try:
            subprocess.run(argv, check=True, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)

    return run


def _seccomp_pipe() -> int:
    from agentvfs.sandbox._seccomp import build_filter

    read_end, write_end = os.pipe()
    os.write(write_end, build_filter())
    os.close(write_end)
    return read_end


def spread(samples: list[float]) -> str:
    """Median, the 10th-90th percentile and the extremes, in milliseconds."""
    ordered = sorted(samples)
    deciles = statistics.quantiles(ordered, n=10) if len(ordered) >= 10 else [ordered[0]] * 9
    return (
        f"{statistics.median(ordered) * 1000:,.2f} ms (p10–p90 {deciles[0] * 1000:,.2f}–{deciles[-1] * 1000:,.2f}, "
        f"min–max {ordered[0] * 1000:,.2f}–{ordered[-1] * 1000:,.2f}; n={len(ordered)})"
    )


async def overhead(repeat: int, workdir: str, before: str | None, rounds: int = 10) -> list[str]:
    """``execute_command("true")`` before and after, against ``subprocess.run(["true"])``, in
    ``rounds`` interleaved rounds of ``repeat`` samples each (the order rotates per round)."""
    bwrap = LocalSandbox.detect_isolation()["available"]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src")
    here = os.path.normpath(here)
    os.makedirs(os.path.join(workdir, "raw"), exist_ok=True)
    raw_dir = os.path.join(workdir, "raw")
    variants: dict[str, Callable[[int], list[float]]] = {}

    def timed(fn: Callable[[], object]) -> Callable[[int], list[float]]:
        def sample(count: int) -> list[float]:
            out = []
            for _ in range(count):
                started = time.perf_counter()
                fn()
                out.append(time.perf_counter() - started)
            return out

        return sample

    variants["`subprocess.run(['true'])`"] = timed(lambda: subprocess.run(["true"], check=True))
    workers: list[_Worker] = []
    nodes = None
    if bwrap:
        variants["`bwrap <old flags> -- true`, raw"] = timed(_raw(lambda: (_old_bwrap_args(raw_dir), [])))

        from agentvfs.sandbox._devices import DeviceNodes

        nodes = DeviceNodes.make() if os.geteuid() == 0 else None
        devices = nodes.paths if nodes is not None else None

        def hardened() -> tuple[list[str], list[int]]:
            fd = _seccomp_pipe()
            return _new_bwrap_args(raw_dir, fd, devices), [fd]

        variants["`bwrap <hardened flags> -- true`, raw"] = timed(_raw(hardened))
    for isolation in ("none", "bwrap") if bwrap else ("none",):
        for label, src in (("before", before), ("after", here)):
            if src is None:
                continue
            worker = _Worker(src, isolation)
            workers.append(worker)
            variants[f"`execute_command('true')`, {isolation}, {label}"] = worker.sample
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for index in range(rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                samples[name] += await anyio.to_thread.run_sync(variants[name], repeat)
    finally:
        for worker in workers:
            worker.close()
        if nodes is not None:
            nodes.close()
    base = statistics.median(samples[names[0]])
    return [
        f"| {name} | {spread(values)} | {statistics.median(values) / base:.2f}x |" for name, values in samples.items()
    ]


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
    parser.add_argument("--repeat", type=int, default=20, help="samples per round of the overhead figures")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of the overhead figures")
    parser.add_argument("--before-rev", help="a git revision whose code to measure beside today's")
    parser.add_argument("--before", help="the src directory of an earlier agentvfs (instead of --before-rev)")
    parser.add_argument("--overhead-only", action="store_true", help="skip the mount and grep figures")
    parser.add_argument("--mount-repeat", type=int, default=3, help="repetitions of mount and grep figures")
    args = parser.parse_args()
    print(
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as workdir:
        before = args.before
        if args.before_rev:
            before = _checkout(args.before_rev, os.path.join(workdir, "before"))
        rows = ["| figure | median (spread) | ratio |", "|---|---:|---:|"]
        rows += await overhead(args.repeat, workdir, before, rounds=args.rounds)
        if not args.overhead_only:
            rows += ["", "| figure | median [min–max] | ratio |", "|---|---:|---:|"]
            with MotoServer() as moto:
                rows += await mount_and_grep(moto, args.files, args.mount_repeat, workdir)
    print("\n".join(rows))


def _checkout(revision: str, where: str) -> str:
    """``src`` of ``revision`` (``git archive``) under ``where``; returns its path."""
    os.makedirs(where)
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", root, "archive", revision, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    return os.path.join(where, "src")


if __name__ == "__main__":
    anyio.run(main)
