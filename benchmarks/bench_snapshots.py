"""Snapshots of a 2,000-file workspace on S3: what taking one costs in time, requests and
bytes written, with and without bucket versioning, and what diff and restore cost.

Servers: moto (a bucket without versioning, and one with versioning enabled) and s3rver
(npm; files on disk, no versioning), both on 127.0.0.1. The workspace: ``--files`` files
(default 2,000) in 40 directories, 1-16 KiB each. Measured per server, each step once on a
fresh workspace (``--repeat`` runs, median):

* the first snapshot (every content hashed; without versioning every content stored as a
  blob), a second one with nothing changed, and one after 1% of the files changed;
* ``diff`` from the first snapshot to the live workspace (1% changed);
* ``restore --force`` of the first snapshot (the 1% written back), and a restore with
  nothing to do.

"bytes written" is what the snapshot added below ``.agentvfs/snapshots`` (manifest, listing
record, blobs); "blob bytes" the part of it that is copied file content. Requests are counted
by S3 operation (botocore events of the s3fs client).

With ``--baseline REV`` every round runs twice, in a process of its own each, alternating:
once with agentvfs at git revision REV (a worktree) and once with this checkout.

Usage: ``python benchmarks/bench_snapshots.py [--files 2000] [--repeat 3] [--servers moto,s3rver]
[--baseline REV]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import anyio

from agentvfs import FsspecFilesystem, Workspace
from agentvfs.bench._backends import S3RVER_CREDENTIALS, S3rverServer, find_s3rver
from agentvfs.testing import MotoServer

Step = Callable[[], Awaitable[Any]]


def workload(count: int) -> dict[str, bytes]:
    """``count`` files in 40 directories, 1-16 KiB of text each (deterministic)."""
    out: dict[str, bytes] = {}
    for i in range(count):
        size = 1024 * (1 + (i * 7) % 16)
        line = f"file {i}: the quick brown fox jumps over the lazy dog\n".encode()
        out[f"dir-{i % 40:02d}/sub-{i % 3}/file-{i:05d}.txt"] = (line * (size // len(line) + 1))[:size]
    return out


class Server:
    """One S3 server and a way to make a fresh bucket (versioned or not) on it."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        if name.startswith("moto"):
            self.proc: Any = MotoServer()
            self.proc.start()
            self.key, self.secret = "testing", "testing"
        else:
            exe = find_s3rver()
            if exe is None:
                raise SystemExit("s3rver not found: run scripts/setup.sh bench or set S3RVER (or --servers moto)")
            (workdir / "s3rver-data").mkdir(exist_ok=True)
            self.proc = S3rverServer(exe, str(workdir / "s3rver-data"), "bench-snapshots", log_path=workdir / "s3rver.log")
            self.proc.start()
            self.key, self.secret = S3RVER_CREDENTIALS
        self.endpoint = self.proc.endpoint_url

    def boto3(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.key, aws_secret_access_key=self.secret,
            region_name="us-east-1",
        )  # fmt: skip

    def s3fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            key=self.key, secret=self.secret, endpoint_url=self.endpoint, skip_instance_cache=True,
            use_listings_cache=False,
        )  # fmt: skip

    def bucket(self, versioned: bool) -> str:
        client = self.boto3()
        if self.name == "s3rver":
            return "bench-snapshots"  # configured at start; s3rver keeps no versions
        name = f"snap-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def stop(self) -> None:
        self.proc.stop()


class Requests:
    """S3 operations sent by an s3fs client, counted from its botocore events."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def attach(self, raw: Any) -> None:
        raw.connect()
        raw.s3.meta.events.register("before-call.s3.*", self._seen)

    def _seen(self, event_name: str, **_: Any) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def take(self) -> Counter[str]:
        out, self.counts = self.counts, Counter()
        return out


def store_bytes(client: Any, bucket: str, prefix: str) -> tuple[int, int]:
    """Bytes below the snapshot store, and of them the blobs'."""
    total = blobs = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/.agentvfs/snapshots/"):
        for item in page.get("Contents", []):
            total += item["Size"]
            if "/blobs/" in item["Key"]:
                blobs += item["Size"]
    return total, blobs


async def one_run(server: Server, versioned: bool, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    bucket = server.bucket(versioned)
    prefix = f"ws-{uuid.uuid4().hex[:8]}"
    client = server.boto3()
    # Seeded straight into the bucket, with the directory markers agentvfs's mkdir writes:
    # s3rver 3.7 lists no common prefix for keys two or more levels below the prefix listed.
    objects = dict(files)
    for path in files:
        parent = path.rpartition("/")[0]
        while parent:
            objects[parent + "/"] = b""
            parent = parent.rpartition("/")[0]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: client.put_object(Bucket=bucket, Key=f"{prefix}/{item[0]}", Body=item[1]), objects.items()))
    raw = server.s3fs()
    fs = FsspecFilesystem(raw, root=f"{bucket}/{prefix}")
    requests = Requests()
    requests.attach(raw)
    ws = Workspace(filesystem=fs)
    results: dict[str, dict[str, Any]] = {}

    async def measure(label: str, step: Step, *, store: bool = False) -> Any:
        before = store_bytes(client, bucket, prefix) if store else (0, 0)
        requests.take()
        started = time.perf_counter()
        value = await step()
        elapsed = time.perf_counter() - started
        sent = requests.take()
        after = store_bytes(client, bucket, prefix) if store else (0, 0)
        results[label] = {
            "seconds": elapsed, "requests": sum(sent.values()), "by_op": dict(sent.most_common(4)),
            "written": after[0] - before[0], "blob_bytes": after[1] - before[1],
        }  # fmt: skip
        return value

    first = await measure("snapshot (first)", lambda: ws.snapshot("first"), store=True)
    assert len(first.files) == len(files), f"{len(first.files)} of {len(files)} files in the snapshot"
    await measure("snapshot (nothing changed)", ws.snapshot, store=True)
    changed = sorted(files)[:: max(1, len(files) // (len(files) // 100 or 1))][: max(1, len(files) // 100)]
    for path in changed:
        await fs.write_file(path, files[path] + b"changed\n")
    await measure("snapshot (1% changed)", ws.snapshot, store=True)
    diff = await measure("diff first..live (1% changed)", lambda: ws.diff(first.id))
    assert set(diff.changed) == set(changed), (len(diff.changed), len(changed))
    restored = await measure("restore --force (1% back)", lambda: ws.restore(first.id, force=True))
    assert set(restored.restored) == set(changed)
    again = await measure("restore (nothing to do)", lambda: ws.restore(first.id))
    assert not again.restored
    assert not again.conflicts
    if hasattr(ws, "delete_snapshot"):  # not in revisions before it
        from datetime import timedelta

        store = ws.snapshot_store()

        async def delete_and_collect() -> Any:
            for info in await ws.list_snapshots():
                if info.id != first.id:
                    await ws.delete_snapshot(info.id)
            return await store.collect_garbage(grace=timedelta(0))

        report = await measure("delete 2 snapshots, collect garbage", delete_and_collect, store=True)
        assert report.blobs_deleted == (0 if versioned else len(changed)), report
    await fs.destroy()
    return results


REPO = Path(__file__).resolve().parent.parent

Row = tuple[str, str, dict[str, Any]]


def measure_here(servers: list[str], files: dict[str, bytes], repeat: int) -> list[Row]:
    """Every step on every server, ``repeat`` fresh workspaces each, in this process."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp:
        for name in servers:
            server = Server(name, Path(tmp))
            try:
                for versioned in ([False, True] if name == "moto" else [False]):
                    label = f"{name}{' versioned' if versioned else ''}"
                    runs = [anyio.run(one_run, server, versioned, files) for _ in range(repeat)]
                    for step in runs[0]:
                        merged = dict(runs[0][step])
                        merged["all_seconds"] = [r[step]["seconds"] for r in runs]
                        rows.append((label, step, merged))
            finally:
                server.stop()
    return rows


def one_round_in_child(args: argparse.Namespace, source: str | None) -> list[Row]:
    """One round in a new process, importing agentvfs from ``source`` (a ``src`` directory)
    when given."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sys.executable, __file__, "--files", str(args.files), "--repeat", "1", "--servers", args.servers,
             "--json", out.name],
            env=env, check=True, cwd=REPO,
        )  # fmt: skip
        return [(label, step, r) for label, step, r in json.loads(Path(out.name).read_text())]


def print_rows(rows: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    print("| agentvfs | server | step | seconds, median [min-max] | requests | top requests | bytes written | of which blob bytes |")
    print("|---|---|---|---:|---:|---|---:|---:|")
    for rev, label, step, r in rows:
        ops = ", ".join(f"{k} {v}" for k, v in r["by_op"].items())
        times = r["all_seconds"]
        spread = f" [{min(times):.2f}-{max(times):.2f}]" if len(times) > 1 else ""
        print(
            f"| {rev} | {label} | {step} | {statistics.median(times):.2f}{spread} | {r['requests']} | {ops} "
            f"| {r['written']:,} | {r['blob_bytes']:,} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--servers", default="moto,s3rver", help="comma-separated: moto, s3rver")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run every round with agentvfs at git revision REV, alternating")  # fmt: skip
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)  # a child's rows, for --baseline
    args = parser.parse_args(argv)
    files = workload(args.files)
    total = sum(len(d) for d in files.values())
    if args.json:
        Path(args.json).write_text(json.dumps(measure_here(args.servers.split(","), files, args.repeat)))
        return 0
    print(f"# bench_snapshots: {args.files} files, {total / 1e6:.1f} MB; {platform.python_version()} on {platform.machine()}")
    if args.baseline is None:
        print_rows([("this", label, step, r) for label, step, r in measure_here(args.servers.split(","), files, args.repeat)])
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-base-") as tmp:
        checkout = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(checkout), args.baseline],
                       check=True, capture_output=True)  # fmt: skip
        try:
            sides = [(args.baseline, str(checkout / "src")), ("this", None)]
            rounds: dict[str, list[list[Row]]] = {rev: [] for rev, _ in sides}
            for _ in range(args.repeat):
                for rev, source in sides:
                    rounds[rev].append(one_round_in_child(args, source))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=False)
    merged: list[tuple[str, str, str, dict[str, Any]]] = []
    for label, step, _ in rounds["this"][0]:
        for rev, _ in sides:
            found = [[r for lab, st, r in run if (lab, st) == (label, step)] for run in rounds[rev]]
            if not found[0]:
                continue  # a step the baseline cannot take
            row = dict(found[0][0])
            row["all_seconds"] = [f[0]["seconds"] for f in found]
            merged.append((rev, label, step, row))
    print_rows(merged)
    return 0

if __name__ == "__main__":
    sys.exit(main())
