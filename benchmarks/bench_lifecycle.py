#!/usr/bin/env python
"""Mounts across their lifecycle: what a crash, a second mount and a shell redirect cost.

Three figures, each measured on this tree and, with ``--baseline-src DIR`` (the ``src`` of
another checkout), on that one too, interleaved trial by trial in the same run:

- **PUTs per write**: S3 requests of ``echo hi > f``, of ``cmd > f`` over an existing file and
  of ``{ ... } > f`` whose children each close a copy of the descriptor, through a mount on
  moto S3 (requests counted on the mount's own S3 client, in a process of its own per tree).
- **Crash trials**: an ``agentvfs mount`` process on a local directory or on moto S3; a writer
  (``cp``, ``dd``, a shell redirect, Python on one descriptor, a streamed large file) replaces
  an existing file; the mount is killed with SIGKILL after a random delay (seeded); then the
  object in storage is compared with the old and the new content, and a new mount process
  starts (reporting what it recovered). Target: no object that is neither old nor new.
- **Two mounts, one file**: two mount processes of one storage append 50 lines each to one
  file at once (Python, so that a failed ``close`` is seen); lines whose ``close`` succeeded
  but that are missing from storage afterwards were lost silently. Target: 0.
- **Metadata costs** (``--figures metadata``): through a mount on moto S3, a cold ``ls -l`` of
  ``--files`` files (the HEADs that read each file's metadata), the requests and latency of a
  ``chmod`` of a file already in storage, and whether a new mount shows the mode; with
  ``-o metadata=off`` too.

Usage::

    python benchmarks/bench_lifecycle.py --trials 10 --baseline-src /tmp/base/src --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentvfs.mounts import is_mounted
from agentvfs.testing import MotoServer, appender_command

BUCKET = "agentvfs-bench"
MiB = 1 << 20

_COUNT_PUTS = r"""
import json, os, subprocess, sys, tempfile
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount
import s3fs
endpoint, prefix = sys.argv[1], sys.argv[2]
raw = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True,
                        use_listings_cache=False, client_kwargs={"verify": False},
                        config_kwargs={"region_name": "us-east-1"})
raw.pipe_file(f"{prefix}/old.txt", b"old\n")
mnt = tempfile.mkdtemp()
out = {}
with Mount(FsspecFilesystem(raw, root=prefix), mnt):
    os.listdir(mnt)
    seen = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: seen.append(model.name))
    for name, script in [
        ("echo hi > new", "echo hi > new.txt"),
        ("cmd > existing", "printf 'x%.0s' 1 2 3 > old.txt"),
        ("{ 8 children } > f", "{ for i in 1 2 3 4 5 6 7 8; do echo $i | cat; done; } > kids.txt"),
    ]:
        seen.clear()
        subprocess.run(["bash", "-c", script], cwd=mnt, check=True)
        subprocess.run(["sleep", "0.5"])  # a publish at the last close comes after close
        out[name] = {"puts": seen.count("PutObject"), "ok": True}
    out["{ 8 children } > f"]["ok"] = raw.cat_file(f"{prefix}/kids.txt") == b"1\n2\n3\n4\n5\n6\n7\n8\n"
print(json.dumps(out))
"""

_COUNT_METADATA = r"""
import json, os, stat, statistics, sys, tempfile, time
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, MountOptions
import s3fs
endpoint, prefix, files, rounds, metadata = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
raw = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True,
                        use_listings_cache=False, client_kwargs={"verify": False},
                        config_kwargs={"region_name": "us-east-1"})
options = {"metadata": metadata == "on"} if "metadata" in MountOptions.__dataclass_fields__ else {}
raw.pipe_file(f"{prefix}/f/data.bin", os.urandom(1 << 20))
for i in range(files):
    raw.pipe_file(f"{prefix}/many/file-{i:05d}.txt", b"x" * 100)
seen = []
raw.s3.meta.events.register("before-call.s3", lambda model, **kw: seen.append(model.name))
out = {}
mnt = tempfile.mkdtemp()
with Mount(FsspecFilesystem(raw, root=prefix), mnt, options=options):
    seen.clear()
    started = time.perf_counter()
    count = sum(1 for e in os.scandir(f"{mnt}/many") if e.stat(follow_symlinks=False))
    out["ls -l cold s"] = time.perf_counter() - started
    out["ls -l cold requests"] = len(seen)
    out["ls -l cold HEADs"] = seen.count("HeadObject")
    assert count == files
    os.listdir(f"{mnt}/f")
    times, requests = [], []
    for r in range(rounds):
        seen.clear()
        started = time.perf_counter()
        os.chmod(f"{mnt}/f/data.bin", 0o600 if r % 2 else 0o700)
        times.append(time.perf_counter() - started)
        requests.append(len(seen))
    out["chmod ms"] = statistics.median(times) * 1000
    out["chmod requests"] = statistics.median(requests)
    mode = 0o600 if (rounds - 1) % 2 else 0o700
with Mount(FsspecFilesystem(raw, root=prefix), mnt, options=options):
    out["mode kept"] = stat.S_IMODE(os.stat(f"{mnt}/f/data.bin").st_mode) == mode
print(json.dumps(out))
"""

_WRITER = r"""
import os, subprocess, sys
kind, source, target = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "cp":
    subprocess.run(["cp", source, target])
elif kind == "dd":
    subprocess.run(["dd", f"if={source}", f"of={target}", "bs=64k", "status=none"])
elif kind == "redirect":
    loop = " ".join(str(i) for i in range(24))
    subprocess.run(["bash", "-c", f"for i in {loop}; do head -c 1048576 {source}; done > {target}"])
else:  # python, stream: one descriptor, 1 MiB writes
    data = open(source, "rb").read()
    with open(target, "wb") as f:
        for i in range(0, len(data), 1 << 20):
            f.write(data[i : i + (1 << 20)])
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Tree:
    """One version of the code: ``src`` None is the one this script belongs to."""

    def __init__(self, name: str, src: str | None) -> None:
        self.name = name
        self.src = src

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        env.pop("AWS_CA_BUNDLE", None)
        if self.src is not None:
            env["PYTHONPATH"] = self.src
        return env

    def supports(self, option: str) -> bool:
        code = f"from agentvfs.mounts import MountOptions as M; import sys; sys.exit({option!r} not in M.__dataclass_fields__)"
        return subprocess.run([sys.executable, "-c", code], env=self.env(), check=False).returncode == 0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from agentvfs.cli import main; sys.exit(main())", *args]


def start_mount(tree: Tree, url: str, mnt: str, options: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    args = _cli("mount", url, mnt, *[x for o in options for x in ("-o", o)])
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env=tree.env())
    deadline = time.monotonic() + 30
    while not is_mounted(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{tree.name}: mount did not start: {log_file.read_text()[-2000:]}")
        time.sleep(0.02)
    return proc


def stop_mount(proc: subprocess.Popen[bytes], mnt: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], check=False)


def metadata_costs(moto: MotoServer, trees: list[Tree], rounds: int, files: int) -> dict[str, Any]:
    """Through a mount on moto S3: a cold ``ls -l`` of ``files`` files (the HEADs that read
    their metadata), a ``chmod`` of a file in storage (requests, latency), and whether a new
    mount shows the mode; with metadata on and off where the tree has the option."""
    out: dict[str, Any] = {}
    for r in range(rounds):
        for tree in trees:
            for metadata in ("on", "off") if tree.supports("metadata") else ("on",):
                prefix = f"{BUCKET}/meta-{tree.name}-{metadata}-{r}"
                done = subprocess.run(
                    [sys.executable, "-c", _COUNT_METADATA, moto.endpoint_url, prefix, str(files), "9", metadata],
                    capture_output=True, text=True, env=tree.env(), timeout=600, check=True,
                )  # fmt: skip
                key = tree.name if metadata == "on" else f"{tree.name}, metadata=off"
                out.setdefault(key, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def puts_per_write(moto: MotoServer, trees: list[Tree], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in range(rounds):
        for tree in trees:
            prefix = f"{BUCKET}/puts-{tree.name}-{r}"
            done = subprocess.run(
                [sys.executable, "-c", _COUNT_PUTS, moto.endpoint_url, prefix],
                capture_output=True, text=True, env=tree.env(), timeout=120, check=True,
            )  # fmt: skip
            out.setdefault(tree.name, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


class Storage:
    def __init__(self, kind: str, work: Path, moto: MotoServer) -> None:
        self.kind = kind
        self.moto = moto
        self.raw = moto.s3fs(use_listings_cache=False)
        self.work = work

    def location(self, name: str) -> tuple[str, list[str], Callable[[str], bytes | None], Callable[[str, bytes], None]]:
        if self.kind == "local":
            root = self.work / f"store-{name}"
            root.mkdir(parents=True, exist_ok=True)

            def get_local(path: str) -> bytes | None:
                try:
                    return (root / path).read_bytes()
                except FileNotFoundError:
                    return None

            def put_local(path: str, data: bytes) -> None:
                (root / path).write_bytes(data)

            return os.fspath(root), ["passthrough=false"], get_local, put_local
        prefix = f"{BUCKET}/{name}"

        def get_s3(path: str) -> bytes | None:
            try:
                return bytes(self.raw.cat_file(f"{prefix}/{path}"))
            except FileNotFoundError:
                return None

        def put_s3(path: str, data: bytes) -> None:
            self.raw.pipe_file(f"{prefix}/{path}", data)

        return f"s3://{prefix}", [f"endpoint_url={self.moto.endpoint_url}"], get_s3, put_s3


def crash_trial(
    tree: Tree, storage: Storage, writer: str, rng: random.Random, work: Path, n: int
) -> dict[str, Any]:
    name = f"crash-{tree.name}-{storage.kind}-{writer}-{n}"
    url, options, get, put = storage.location(name)
    big = writer == "stream"
    old = b"old version\n" * 100_000
    # 24 MiB, a 1 MiB block repeated: what the shell redirect writes (the block six times
    # over, four times) is the same content as what the others copy.
    new = os.urandom(MiB) * 24
    source = work / f"{name}.src"
    source.write_bytes(new)
    put("f.bin", old)
    mnt = work / f"{name}.mnt"
    mnt.mkdir()
    extra = ["metadata_ttl=0.5"]
    state = work / f"{name}.state"
    if tree.supports("state_dir"):
        extra.append(f"state_dir={state}")
    if big:
        extra += [f"stream_threshold={5 * MiB}", f"stream_part_size={5 * MiB}"]
    log_file = work / f"{name}.log"
    proc = start_mount(tree, url, os.fspath(mnt), [*options, *extra], log_file)
    writer_proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, writer, os.fspath(source), os.fspath(mnt / "f.bin")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    delay = rng.uniform(0.03, 0.5)
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        writer_proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        writer_proc.kill()
        writer_proc.wait()
    deadline = time.monotonic() + 30
    while is_mounted(os.fspath(mnt)) and time.monotonic() < deadline:
        time.sleep(0.05)
    dead_mount = is_mounted(os.fspath(mnt))
    if dead_mount:
        # auto_unmount did not remove it: what a user then does by hand.
        subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], check=False)
    got = get("f.bin")
    outcome = "old" if got == old else "new" if got == new else "missing" if got is None else f"other ({len(got)} bytes)"
    # A writer that opened the file only after the mount was gone wrote into the bare mount
    # point: nothing of that reached storage, and the next mount needs the directory empty.
    bare = sorted(p.name for p in mnt.iterdir())
    if bare:
        shutil.rmtree(mnt)
        mnt.mkdir()
    again = start_mount(tree, url, os.fspath(mnt), [*options, *extra], log_file)
    time.sleep(0.2)
    stop_mount(again, os.fspath(mnt))
    recovered = log_file.read_text(errors="replace").count("was not published")
    shutil.rmtree(mnt, ignore_errors=True)
    source.unlink()
    return {"tree": tree.name, "kind": storage.kind, "writer": writer, "delay": round(delay, 3),
            "outcome": outcome, "recovered": recovered, "wrote_beside_the_mount": bool(bare),
            "dead_mount_left": dead_mount}  # fmt: skip


def two_mounts(tree: Tree, storage: Storage, work: Path, n: int) -> dict[str, Any]:
    name = f"pair-{tree.name}-{storage.kind}-{n}"
    url, options, get, put = storage.location(name)
    put("log.txt", b"")
    points = [work / f"{name}.a", work / f"{name}.b"]
    procs = []
    for i, point in enumerate(points):
        point.mkdir()
        extra = ["metadata_ttl=0.3"]
        if tree.supports("state_dir"):
            extra.append(f"state_dir={work / f'{name}.state{i}'}")
        procs.append(start_mount(tree, url, os.fspath(point), [*options, *extra], work / f"{name}.log"))
    try:
        writers = [
            subprocess.Popen(appender_command(os.fspath(p / "log.txt"), tag, 50), stdout=subprocess.PIPE, text=True)
            for p, tag in zip(points, "ab", strict=True)
        ]  # fmt: skip
        outcomes: dict[str, str] = {}
        for w in writers:
            out, _ = w.communicate(timeout=600)
            outcomes.update(json.loads(out))
    finally:
        for proc, point in zip(procs, points, strict=True):
            stop_mount(proc, os.fspath(point))
    final = set((get("log.txt") or b"").decode().splitlines(keepends=True))
    ok = {line for line, how in outcomes.items() if how == "ok"}
    return {"tree": tree.name, "kind": storage.kind, "closed_ok": len(ok), "told_failed": len(outcomes) - len(ok),
            "in_storage": len(final), "lost_silently": len(ok - final)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="crash trials per writer, storage and tree")
    p.add_argument("--pairs", type=int, default=3, help="two-mount append runs per storage and tree")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--baseline-src", metavar="DIR", help="the src directory of the code to compare with")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--figures", nargs="+", default=["puts", "crashes", "pairs", "metadata"],
                   choices=["puts", "crashes", "pairs", "metadata"], help="which figures to measure")
    p.add_argument("--files", type=int, default=2000, help="files of the cold `ls -l` (metadata figure)")
    args = p.parse_args()
    if os.geteuid() != 0:
        log("needs root (FUSE mounts with kill -9 and auto_unmount)")
        return 2
    trees = [Tree("this", None)] + ([Tree("baseline", args.baseline_src)] if args.baseline_src else [])
    rng = random.Random(args.seed)
    results: dict[str, Any] = {"seed": args.seed, "trees": {t.name: t.src for t in trees}}
    work = Path(tempfile.mkdtemp(prefix="agentvfs-bench-lifecycle-"))
    with MotoServer() as moto:
        moto.create_bucket(BUCKET)
        if "metadata" in args.figures:
            log("metadata costs")
            results["metadata"] = metadata_costs(moto, trees, rounds=3, files=args.files)
        if "puts" in args.figures:
            log("PUTs per write")
            results["puts"] = puts_per_write(moto, trees, rounds=3)
        crashes: list[dict[str, Any]] = []
        for kind in ("local", "s3") if "crashes" in args.figures else ():
            storage = Storage(kind, work, moto)
            for writer in ("cp", "dd", "redirect", "python", "stream"):
                for n in range(args.trials):
                    for tree in trees:  # interleaved: the same seed stream, side by side
                        crashes.append(crash_trial(tree, storage, writer, rng, work, n))
                log(f"crash trials: {kind} {writer} done")
        results["crashes"] = crashes
        pairs = []
        for kind in ("local", "s3") if "pairs" in args.figures else ():
            storage = Storage(kind, work, moto)
            for n in range(args.pairs):
                for tree in trees:
                    pairs.append(two_mounts(tree, storage, work, n))
            log(f"two mounts: {kind} done")
        results["pairs"] = pairs
    shutil.rmtree(work, ignore_errors=True)
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def report(results: dict[str, Any]) -> str:
    lines = ["| figure | " + " | ".join(results["trees"]) + " |", "|---|" + "---:|" * len(results["trees"])]
    names = list(results["trees"])
    if "metadata" in results:
        lines.append("")
        lines.append("| metadata figure (moto S3) | " + " | ".join(results["metadata"]) + " |")
        lines.append("|---|" + "---:|" * len(results["metadata"]))
        for figure in ("ls -l cold s", "ls -l cold requests", "ls -l cold HEADs", "chmod ms", "chmod requests", "mode kept"):
            cells = []
            for runs in results["metadata"].values():
                values = [r[figure] for r in runs]
                cells.append(str(all(values)) if isinstance(values[0], bool) else f"{statistics.median(values):.3g}")
            lines.append(f"| {figure} | " + " | ".join(cells) + " |")
        lines.append("")
    for figure in ("echo hi > new", "cmd > existing", "{ 8 children } > f") if "puts" in results else ():
        cells = []
        for tree in names:
            runs = results["puts"][tree]
            puts = statistics.median(r[figure]["puts"] for r in runs)
            whole = all(r[figure]["ok"] for r in runs)
            cells.append(f"{puts:g} PUTs" + ("" if whole else " (wrong content)"))
        lines.append(f"| PUTs per `{figure}` | " + " | ".join(cells) + " |")
    for kind in ("local", "s3") if results.get("crashes") else ():
        cells = []
        for tree in names:
            rows = [c for c in results["crashes"] if c["tree"] == tree and c["kind"] == kind]
            bad = [c for c in rows if c["outcome"] not in ("old", "new")]
            cells.append(f"{len(bad)} of {len(rows)} neither old nor new")
        lines.append(f"| crash trials, {kind} | " + " | ".join(cells) + " |")
    for kind in ("local", "s3") if results.get("pairs") else ():
        cells = []
        for tree in names:
            rows = [r for r in results["pairs"] if r["tree"] == tree and r["kind"] == kind]
            lost = sum(r["lost_silently"] for r in rows)
            told = sum(r["told_failed"] for r in rows)
            cells.append(f"{lost} lost silently, {told} told (of {100 * len(rows)})")
        lines.append(f"| two mounts append 2 x 50 lines, {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
