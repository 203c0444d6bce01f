"""``agentvfs snapshot``, ``snapshots``, ``diff`` and ``restore``: in processes of their own (a
snapshot taken by one process is found by the next), and through ``main`` in this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from _mountproc import cli_env
from agentvfs.cli import main
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique


def _agentvfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentvfs", *args],
        capture_output=True, text=True, env=cli_env(), timeout=120, check=False,
    )  # fmt: skip


def _here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The command run by ``main`` in this process, its output captured."""
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def test_snapshot_diff_restore_across_processes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "notes \u00e9t\u00e9.txt").write_text("one\ntwo\n", encoding="utf-8")
    (ws / "src" / "app.py").write_text("print('hi')\n")
    (ws / "empty").mkdir()
    taken = _agentvfs("snapshot", str(ws), "--name", "first")
    assert taken.returncode == 0, taken.stderr
    snapshot_id = taken.stdout.strip()
    assert len(snapshot_id) == 64 and "2 files, 2 directories" in taken.stderr
    time.sleep(1.1)  # a later process, a later time
    (ws / "notes \u00e9t\u00e9.txt").write_text("one\nTWO\n", encoding="utf-8")
    (ws / "src" / "app.py").unlink()
    (ws / "added.bin").write_bytes(b"\0\1\2")
    second = _agentvfs("snapshot", str(ws), "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["files"] == 2

    listed = _agentvfs("snapshots", str(ws), "--json")
    records = json.loads(listed.stdout)
    assert [r["name"] for r in records] == ["first", None] and records[0]["id"] == snapshot_id
    assert records[0]["created_at"] < records[1]["created_at"]
    table = _agentvfs("snapshots", str(ws)).stdout.splitlines()
    assert table[0].startswith(snapshot_id[:12]) and table[0].endswith("first")

    diff = _agentvfs("diff", str(ws), "first")
    assert diff.returncode == 0, diff.stderr
    assert "-two\n+TWO\n" in diff.stdout and "--- a/src/app.py\n+++ /dev/null\n" in diff.stdout
    assert "added added.bin (binary or large: no line diff)" in diff.stdout
    names = _agentvfs("diff", str(ws), snapshot_id[:8], records[1]["id"], "--name-only")
    assert names.stdout.splitlines() == ["A added.bin", "C notes \u00e9t\u00e9.txt", "R src/app.py"]

    gentle = _agentvfs("restore", str(ws), "first")
    assert gentle.returncode == 1
    assert gentle.stdout.splitlines() == ["restored src/app.py"]
    assert "kept added.bin (added)" in gentle.stderr and "--force restores them too" in gentle.stderr
    assert (ws / "notes \u00e9t\u00e9.txt").read_text(encoding="utf-8") == "one\nTWO\n"
    forced = _agentvfs("restore", str(ws), "first", "--force", "--path", "notes \u00e9t\u00e9.txt", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["restored"] == ["notes \u00e9t\u00e9.txt"]
    assert (ws / "notes \u00e9t\u00e9.txt").read_text(encoding="utf-8") == "one\ntwo\n"
    assert (ws / "added.bin").exists()

    deleted = _agentvfs("snapshots", str(ws), "--delete", "first")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.split() == [snapshot_id]
    left = json.loads(_agentvfs("snapshots", str(ws), "--json").stdout)
    assert [r["id"] for r in left] == [records[1]["id"]]
    again = _agentvfs("snapshots", str(ws), "--delete", "first")
    assert again.returncode == 2 and "No snapshot 'first'" in again.stderr
    blobs = ws / ".agentvfs" / "snapshots" / "blobs"
    before = sum(len(files) for _, _, files in os.walk(blobs))
    kept = _agentvfs("snapshots", str(ws), "--gc")  # unheld blobs, but written within the grace period
    assert kept.returncode == 0 and "0 unused blobs deleted" in kept.stderr, kept.stderr
    collected = _agentvfs("snapshots", str(ws), "--gc", "--grace", "0", "--json")
    assert collected.returncode == 0, collected.stderr
    garbage = json.loads(collected.stdout)["garbage"]
    after = sum(len(files) for _, _, files in os.walk(blobs))
    assert garbage["blobs_deleted"] == before - after > 0 and garbage["blobs_kept"] == after
    # The snapshot left still restores everything.
    (ws / "added.bin").unlink()
    assert _agentvfs("restore", str(ws), records[1]["id"], "--force").returncode == 0
    assert (ws / "added.bin").read_bytes() == b"\0\1\2"
    for bad in ("-1", "inf", "soon"):
        refused = _agentvfs("snapshots", str(ws), "--gc", "--grace", bad)
        assert refused.returncode == 2 and "--grace" in refused.stderr and "Traceback" not in refused.stderr
    alone = _agentvfs("snapshots", str(ws), "--grace", "10")
    assert alone.returncode == 2 and "--grace applies to --gc only" in alone.stderr


def test_bad_input_is_one_line_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = _here(capsys, "snapshot", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist; give the workspace's directory" in missing.stderr
    unknown = _here(capsys, "restore", str(tmp_path), "no-such-snapshot")
    assert unknown.returncode == 2
    assert "No snapshot 'no-such-snapshot'" in unknown.stderr and f"agentvfs snapshots {tmp_path}" in unknown.stderr
    option = _here(capsys, "snapshots", str(tmp_path), "-o", "endpoint=1")
    assert option.returncode == 2 and "Unknown storage option 'endpoint'" in option.stderr
    name = _here(capsys, "snapshot", str(tmp_path), "--name", " ")
    assert name.returncode == 2 and "snapshot name" in name.stderr
    inside = _here(capsys, "snapshot", str(tmp_path), "--store", str(tmp_path / "snaps"))
    assert inside.returncode == 2 and "is inside the workspace it records" in inside.stderr
    assert not (tmp_path / "snaps").exists()
    for done in (missing, unknown, option, name, inside):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.s3
def test_s3_with_a_store_elsewhere_and_a_tampered_manifest(
    moto: MotoServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique("ws")
    client = moto.boto3_client()
    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/a.txt", Body=b"alpha\n")
    url = f"s3://{S3_BUCKET}/{prefix}"
    store = f"file://{tmp_path}/store"
    endpoint = f"endpoint_url={moto.endpoint_url}"
    taken = _here(capsys, "snapshot", url, "-o", endpoint, "--store", store, "--name", "s3")
    assert taken.returncode == 0, taken.stderr
    assert "contents kept as blobs" in taken.stderr
    assert "Contents" not in client.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/.agentvfs")
    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/a.txt", Body=b"changed in the bucket\n")
    refused = _here(capsys, "restore", url, "s3", "-o", endpoint, "--store", store)
    assert refused.returncode == 1 and "kept a.txt (modified)" in refused.stderr
    manifest = next((tmp_path / "store" / "manifests").iterdir())
    manifest.write_bytes(manifest.read_bytes().replace(b'"s3"', b'"S3"'))
    tampered = _here(capsys, "restore", url, taken.stdout.strip(), "-o", endpoint, "--store", store, "--force")
    assert tampered.returncode == 1 and "does not match its id" in tampered.stderr
    body = client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/a.txt")["Body"].read()
    assert body == b"changed in the bucket\n"
    assert os.path.isdir(tmp_path / "store" / "blobs")


@pytest.mark.s3
def test_sigterm_mid_collection_leaves_no_lock_and_only_whole_blobs(moto: MotoServer) -> None:
    """``agentvfs snapshots --gc`` stopped by SIGTERM half-way: it exits 143 like a stopped
    command, its claim on the store is gone (on S3 nothing could tell that its process died,
    so a claim left behind would hold every snapshot off until it went stale), and every blob
    left is whole."""
    import hashlib
    import signal

    from agentvfs import FsspecFilesystem
    from agentvfs.snapshots import DEFAULT_PREFIX, SnapshotStore, take_snapshot

    prefix = unique("gc")
    raw = moto.s3fs(use_listings_cache=False)
    store_path = f"{S3_BUCKET}/{prefix}/{DEFAULT_PREFIX}"
    contents = [f"unused blob {i}\n".encode() for i in range(1500)]
    digests = [hashlib.sha256(c).hexdigest() for c in contents]
    raw.pipe({f"{store_path}/blobs/{d[:2]}/{d}": c for d, c in zip(digests, contents, strict=True)})
    raw.pipe_file(f"{S3_BUCKET}/{prefix}/a.txt", b"alpha\n")

    def blobs() -> list[str]:
        raw.invalidate_cache()
        return [p for p in raw.find(f"{store_path}/blobs") if not p.endswith("/")]  # no directory markers

    def locks() -> list[str]:
        raw.invalidate_cache()
        return [p for p in raw.find(f"{store_path}/locks") if p.endswith(".json")]

    argv = [sys.executable, "-m", "agentvfs", "snapshots", f"s3://{S3_BUCKET}/{prefix}", "--gc", "--grace", "0"]
    gc = subprocess.Popen([*argv, "-o", f"endpoint_url={moto.endpoint_url}"], env=cli_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(blobs()) > 1400 and gc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert locks(), "the collection holds its claim while it deletes"
        gc.send_signal(signal.SIGTERM)
        _, err = gc.communicate(timeout=60)
    finally:
        if gc.poll() is None:
            gc.kill()
            gc.wait()
    assert gc.returncode == 128 + signal.SIGTERM, err
    left = blobs()
    assert 0 < len(left) < 1500  # stopped half-way
    assert locks() == []
    for path in left:
        assert hashlib.sha256(raw.cat_file(path)).hexdigest() == path.rsplit("/", 1)[-1]
    # Nothing holds the next snapshot off.
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{prefix}")
    started = time.monotonic()
    taken = anyio.run(take_snapshot, fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=5))
    assert set(taken.files) == {"a.txt"} and time.monotonic() - started < 5
