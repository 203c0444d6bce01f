"""Bulk indexing into segments: the planner, builds over moto S3 in this process and on a real
Dask cluster, re-runs, racing and killed builders, damaged indexes, and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from _mountproc import cli_env
from agentvfs.cli import main
from agentvfs.errors import IndexConflictError, SearchIndexError
from agentvfs.search import (
    BuildReport,
    HashingEmbedder,
    Segment,
    TaskReport,
    build_index,
    fetch_segment,
    read_manifest,
)
from agentvfs.search._bulk import _list_task, local_cluster, plan_tasks
from agentvfs.search._workspace import file_documents
from agentvfs.testing import MotoServer
from agentvfs.testing._attacks_tools import peak_rss_growth
from conftest import S3_BUCKET, unique


def _text(name: str, version: int = 0) -> bytes:
    words = ("kernel", "socket", "buffer", "thread", "signal", "memory", "search", "index")
    body = " ".join(words[(len(name) + i) % len(words)] for i in range(30))
    return f"# {name} v{version}\n{body}\n".encode()


#: A tree of 3 top prefixes with subprefixes, and a few files at each level.
LAYOUT = (
    [f"top{t}/sub{s}/f{f}.md" for t in range(3) for s in range(3) for f in range(3)]
    + [f"top{t}/readme{t}.txt" for t in range(3)]
    + ["root.txt", "top1/sub1/deep/more.md"]
)


def _options(moto: MotoServer) -> dict[str, Any]:
    return {"endpoint_url": moto.endpoint_url, "key": "testing", "secret": "testing"}


def _seed(moto: MotoServer, prefix: str, keys: list[str], version: int = 0) -> dict[str, bytes]:
    """Put ``keys`` below ``prefix`` with boto3 (bypassing the code under test)."""
    client = moto.boto3_client()
    written = {}
    for key in keys:
        body = _text(key, version)
        client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{key}", Body=body)
        written[f"/{key}"] = body
    return written


def _s3_keys(moto: MotoServer, prefix: str) -> list[str]:
    client = moto.boto3_client()
    found = client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix + "/").get("Contents", [])
    return sorted(str(item["Key"]) for item in found)


def _expected_ids(files: dict[str, bytes]) -> list[str]:
    return sorted(doc.id for path, raw in files.items() for doc in file_documents(path, raw))


def _all_docs(index_url: str, options: dict[str, Any], cache: Path) -> dict[str, str]:
    docs: dict[str, str] = {}
    for ref in read_manifest(index_url, options).segments:
        segment = fetch_segment(index_url, ref, cache, options)
        for slot in range(segment.n_docs):
            assert segment.doc_id(slot) not in docs
            docs[segment.doc_id(slot)] = segment.content(slot)
    return docs


def _ran(report: BuildReport) -> list[str]:
    return sorted(t.label for t in report.tasks if not t.reused)


# ------------------------------------------------------------------------------------ planner


def _make_tree(root: Path, keys: list[str]) -> None:
    for key in keys:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_text(key))


def test_the_planner_covers_every_file_once_in_bounded_tasks(tmp_path: Path) -> None:
    keys = (
        [f"big/leaf/f{i:03d}.txt" for i in range(23)]  # a leaf too big for one task
        + [f"small/s{s}/f{f}.txt" for s in range(6) for f in range(2)]
        + [f"wide/w{w}/x{x}/f.txt" for w in range(3) for x in range(4)]
        + ["top.txt"]
    )
    _make_tree(tmp_path, keys)
    fs = LocalFileSystem()
    tasks = plan_tasks(fs, str(tmp_path), 5)
    covered = [item.rel for task in tasks for item in _list_task(fs, str(tmp_path), task)]
    assert sorted(covered) == sorted(keys)  # each file in exactly one task
    for task in tasks:
        listed = len(_list_task(fs, str(tmp_path), task))
        assert listed == task.estimate <= 5, task.label  # every child was counted: exact here
    leaf = [t for t in tasks if t.prefix == "big/leaf"]
    assert len(leaf) == 5 and all(t.direct and not t.children for t in leaf)  # split by key range
    assert [t for t in tasks if t.prefix == "small" and len(t.children) == 2]  # siblings grouped
    assert len({t.key for t in tasks}) == len(tasks)
    assert plan_tasks(fs, str(tmp_path), 5) == tasks  # the same plan for the same tree
    with pytest.raises(ValueError, match="objects_per_task"):
        plan_tasks(fs, str(tmp_path), 0)


def test_a_local_build_refuses_other_tokenizer_options_and_collects_garbage(tmp_path: Path) -> None:
    source, index = tmp_path / "src", tmp_path / "index"
    _make_tree(source, LAYOUT)
    first = build_index(str(source), str(index), objects_per_task=6, gc_grace=0)
    assert (first.manifest, first.reused, first.deleted) == (1, 0, 0)
    assert first.docs == len(LAYOUT) and first.objects == len(LAYOUT)
    assert max(t.objects for t in first.tasks) <= 6
    with pytest.raises(ValueError, match=r"stem False \(in the index\) != 'english'"):
        build_index(str(source), str(index), tokenize={"stem": True}, gc_grace=0)
    with pytest.raises(ValueError, match=r"min_length 2 \(in the index\) != 3"):
        build_index(str(source), str(index), tokenize={"min_length": 3}, gc_grace=0)
    assert read_manifest(str(index)).number == 1
    changed = source / "top0" / "sub0" / "f0.md"
    for round in (1, 2):
        changed.write_bytes(_text("changed", round))
        report = build_index(str(source), str(index), objects_per_task=6, gc_grace=0)
        assert report.built == 1 and report.reused == len(first.tasks) - 1
        # The segment replaced in round 1 is still in manifest 1 (the newest two are kept);
        # round 2 collects it.
        assert report.deleted == round - 1
    names = {p.name.removesuffix(".seg") for p in (index / "segments").iterdir()}
    newest = {ref.name for n in (2, 3) for ref in _manifest_refs(index, n)}
    assert names == newest


def test_old_manifests_go_past_the_newest_kept_and_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentvfs.search import _bulk

    monkeypatch.setattr(_bulk, "MANIFESTS_KEPT", 3)
    source, index = tmp_path / "src", tmp_path / "index"
    _make_tree(source, LAYOUT)
    for _ in range(4):  # recent: all kept with a grace period
        assert build_index(str(source), str(index), objects_per_task=6).manifests_deleted == 0
    assert sorted(p.name for p in (index / "manifests").iterdir())[0] == f"{1:010d}.json"
    reports = [build_index(str(source), str(index), objects_per_task=6, gc_grace=0) for _ in range(3)]
    assert [r.manifests_deleted for r in reports] == [2, 1, 1]
    assert sorted(p.name for p in (index / "manifests").iterdir()) == [f"{n:010d}.json" for n in (5, 6, 7)]
    assert read_manifest(str(index)).number == 7
    assert reports[-1].to_dict()["manifests_deleted"] == 1


def _manifest_refs(index: Path, number: int) -> list[Any]:
    from agentvfs.search._bulk import Manifest

    raw = json.loads((index / "manifests" / f"{number:010d}.json").read_text())
    return list(Manifest.from_dict(raw, str(index)).segments)


# ------------------------------------------------------------------------------------ S3


@pytest.mark.s3
def test_build_over_s3_in_process(moto: MotoServer, tmp_path: Path) -> None:
    prefix = unique("bulk")
    files = _seed(moto, f"{prefix}/src", LAYOUT)
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    seen: list[TaskReport] = []
    report = build_index(
        source, index, storage_options=options, index_storage_options=options, objects_per_task=8,
        gc_grace=0, progress=seen.append,
    )  # fmt: skip
    assert report.manifest == 1 and report.built == len(report.tasks) == len(seen) > 3
    assert report.objects == len(LAYOUT) and all(t.objects == t.estimate <= 8 for t in report.tasks)
    manifest = read_manifest(index, options)
    assert manifest.number == 1 and manifest.source == source and manifest.docs == report.docs
    assert manifest.totals["objects"] == len(LAYOUT)
    docs = _all_docs(index, options, tmp_path / "cache")
    assert sorted(docs) == _expected_ids(files)
    assert docs["/root.txt"] == files["/root.txt"].decode()
    # What a workspace records of each file: its S3 ETag and content hash.
    head = moto.boto3_client().head_object(Bucket=S3_BUCKET, Key=f"{prefix}/src/root.txt")
    segment = next(
        fetch_segment(index, ref, tmp_path / "cache", options)
        for ref in manifest.segments
        if "/root.txt" in fetch_segment(index, ref, tmp_path / "cache", options).sources()
    )
    record = segment.sources()["/root.txt"]
    assert record.etag == head["ETag"].strip('"') and record.size == len(files["/root.txt"])
    # A damaged cached copy is fetched again.
    ref = manifest.segments[0]
    cached = tmp_path / "cache" / f"{ref.name}.seg"
    cached.write_bytes(cached.read_bytes()[: ref.bytes // 2])
    assert fetch_segment(index, ref, tmp_path / "cache", options).n_docs == ref.docs
    data = bytearray(cached.read_bytes())
    data[-1] ^= 0xFF  # inside the last array: only the hash shows it
    cached.write_bytes(bytes(data))
    assert fetch_segment(index, ref, tmp_path / "cache", options, verify_cached=True).n_docs == ref.docs
    assert Segment.open(cached).name == ref.name and cached.read_bytes()[-1] != data[-1]


@pytest.mark.s3
def test_a_large_directory_on_s3_is_split_by_key_range(moto: MotoServer, tmp_path: Path) -> None:
    prefix = unique("flat")
    keys = [f"logs/l{i:03d}.txt" for i in range(23)] + ["logs/sub/x.md", "other.md"]
    files = _seed(moto, f"{prefix}/src", keys)
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    report = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=5)
    ranges = sorted(t.label for t in report.tasks if t.label.startswith("logs/ files"))
    assert len(ranges) == 5
    assert [t.objects for t in sorted(report.tasks, key=lambda t: t.label) if t.label in ranges] == [5, 5, 5, 5, 3]
    assert sorted(_all_docs(index, options, tmp_path / "cache")) == _expected_ids(files)
    files.update(_seed(moto, f"{prefix}/src", ["logs/l007.txt"], version=1))
    again = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=5)
    assert _ran(again) == ["logs/ files (l004.txt..l009.txt]"]
    assert _all_docs(index, options, tmp_path / "cache")["/logs/l007.txt"] == files["/logs/l007.txt"].decode()


@pytest.mark.s3
def test_a_rerun_indexes_only_the_prefixes_that_changed(moto: MotoServer, tmp_path: Path) -> None:
    prefix = unique("rerun")
    files = _seed(moto, f"{prefix}/src", LAYOUT)
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"

    def build() -> BuildReport:
        return build_index(
            source, index, storage_options=options, index_storage_options=options, objects_per_task=8, gc_grace=0
        )

    first = build()
    same = build()
    assert _ran(same) == [] and same.reused == first.built and same.manifest == 2
    labels = {t.label: t for t in first.tasks}
    files.update(_seed(moto, f"{prefix}/src", ["top2/sub1/f0.md"], version=1))
    changed = build()
    owner = [label for label in labels if label.startswith("top2/") and ("sub1" in label or "{" in label)]
    assert len(_ran(changed)) == 1 and _ran(changed)[0] in owner
    assert changed.built == 1 and changed.reused == first.built - 1
    docs = _all_docs(index, options, tmp_path / "cache")
    assert docs["/top2/sub1/f0.md"] == files["/top2/sub1/f0.md"].decode()
    assert sorted(docs) == _expected_ids(files)


@pytest.mark.s3
def test_two_builders_racing_one_wins_and_the_other_is_told(moto: MotoServer, tmp_path: Path) -> None:
    prefix = unique("race")
    _seed(moto, f"{prefix}/src", LAYOUT[:12])
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    winner: list[BuildReport] = []

    def meanwhile(_: TaskReport) -> None:
        # The second builder starts and finishes while the first is between its tasks and
        # its manifest: both read "no manifest" and both want to write number 1.
        if not winner:
            winner.append(
                build_index(source, index, storage_options=options, index_storage_options=options,
                            objects_per_task=4, gc_grace=0)
            )  # fmt: skip

    with pytest.raises(IndexConflictError, match="another build wrote manifest 1") as caught:
        build_index(
            source, index, storage_options=options, index_storage_options=options, objects_per_task=4,
            gc_grace=0, progress=meanwhile,
        )  # fmt: skip
    assert caught.value.winner == 1 and isinstance(caught.value, SearchIndexError)
    manifest = read_manifest(index, options)
    assert manifest.number == 1 and manifest.docs == winner[0].docs
    assert {r.name for r in manifest.segments} == {t.segment for t in winner[0].tasks if t.segment}
    assert len(_all_docs(index, options, tmp_path / "cache")) == winner[0].docs
    # Truly at once: threads started together; exactly one writes manifest 2.
    results: list[BaseException | BuildReport] = []
    gate = threading.Barrier(2)

    def racer() -> None:
        gate.wait()
        try:
            results.append(build_index(source, index, storage_options=options, index_storage_options=options,
                                       objects_per_task=4, gc_grace=0))  # fmt: skip
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    won = [r for r in results if isinstance(r, BuildReport)]
    lost = [r for r in results if isinstance(r, IndexConflictError)]
    assert len(results) == 2 and len(won) >= 1 and len(won) + len(lost) == 2, results
    assert read_manifest(index, options).number == 1 + len(won)


@pytest.mark.s3
def test_a_killed_builder_writes_no_manifest_and_its_segments_are_collected(moto: MotoServer) -> None:
    prefix = unique("killed")
    keys = [f"d{i:02d}/f.md" for i in range(24)]
    _seed(moto, f"{prefix}/src", keys)
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    first = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=1)
    before = set(_s3_keys(moto, f"{prefix}/index/segments"))
    assert len(before) == first.built == 24
    _seed(moto, f"{prefix}/src", keys, version=1)  # every task has to build again
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentvfs", "index", source, "--out", index, "-o", f"endpoint_url={moto.endpoint_url}",
         "--objects-per-task", "1"],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(set(_s3_keys(moto, f"{prefix}/index/segments")) - before) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    orphans = set(_s3_keys(moto, f"{prefix}/index/segments")) - before
    assert 3 <= len(orphans) < 24
    assert _s3_keys(moto, f"{prefix}/index/manifests") == [f"{prefix}/index/manifests/{1:010d}.json"]
    assert read_manifest(index, options).number == 1
    _seed(moto, f"{prefix}/src", keys, version=2)  # the orphans are no version of anything now
    kept = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=1,
                       gc_grace=3600)  # fmt: skip
    assert kept.deleted == 0 and orphans <= set(_s3_keys(moto, f"{prefix}/index/segments"))
    again = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=1,
                        gc_grace=0)  # fmt: skip
    left = set(_s3_keys(moto, f"{prefix}/index/segments"))
    assert not orphans & left and not before & left
    assert again.deleted == len(orphans) + len(before)
    assert again.manifest == 3


@pytest.mark.s3
def test_a_missing_or_corrupt_segment_is_named_and_older_manifests_stay_readable(
    moto: MotoServer, tmp_path: Path
) -> None:
    prefix = unique("damaged")
    _seed(moto, f"{prefix}/src", LAYOUT[:10])
    options = _options(moto)
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    report = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=4)
    client = moto.boto3_client()
    refs = read_manifest(index, options).segments
    missing, corrupt = refs[0], refs[1]
    client.delete_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/segments/{missing.name}.seg")
    with pytest.raises(SearchIndexError, match=f"segment {missing.name} of index {index} is missing"):
        fetch_segment(index, missing, tmp_path / "cache", options)
    key = f"{prefix}/index/segments/{corrupt.name}.seg"
    client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"AVFSSEG1 damaged".ljust(corrupt.bytes, b"\0"))
    with pytest.raises(SearchIndexError, match=f"segment {corrupt.name} of index {index} is corrupt"):
        fetch_segment(index, corrupt, tmp_path / "cache", options)
    client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"AVFSSEG1 damaged")
    with pytest.raises(SearchIndexError, match=f"is 16 bytes in storage, and its manifest says {corrupt.bytes}"):
        fetch_segment(index, corrupt, tmp_path / "cache", options)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing kept, nothing staged left
    # A newer manifest that cannot be read leaves the one before it current; the next build
    # writes after it, never over it.
    for number, body in ((2, b'{"format": "agentvfs-index-manifest", "vers'), (3, b'{"format": "other", "version": 1}')):
        client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/manifests/{number:010d}.json", Body=body)
        assert read_manifest(index, options).number == report.manifest
    rebuilt = build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=4)
    assert rebuilt.manifest == 4 and read_manifest(index, options).number == 4
    assert rebuilt.built == 2  # the missing and the corrupt segments were written again
    assert len(_all_docs(index, options, tmp_path / "cache2")) == report.docs


def test_an_index_without_a_manifest_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(SearchIndexError, match="has no manifest; build it with: agentvfs index"):
        read_manifest(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="not a segment name"):
        fetch_segment(str(tmp_path), "abc", tmp_path / "cache")
    with pytest.raises(ValueError, match=r"Dask workers \(other processes\) cannot see"):
        build_index("memory://nowhere", str(tmp_path / "index"), workers=2)
    with pytest.raises(ValueError, match="scheduler or workers, not both"):
        build_index(str(tmp_path), str(tmp_path / "index"), workers=2, scheduler="tcp://127.0.0.1:1")


# ---------------------------------------------------------------------------------- Dask


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    with (
        local_cluster(2) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        assert "MALLOC_TRIM_THRESHOLD_" not in client.run(lambda: dict(os.environ)).popitem()[1]
        yield client


@pytest.mark.s3
def test_a_dask_cluster_builds_the_same_segments(moto: MotoServer, dask_client: Any, tmp_path: Path) -> None:
    prefix = unique("dask")
    files = _seed(moto, f"{prefix}/src", LAYOUT)
    options = _options(moto)
    source = f"s3://{S3_BUCKET}/{prefix}/src"
    here = build_index(source, f"s3://{S3_BUCKET}/{prefix}/here", storage_options=options,
                       index_storage_options=options, objects_per_task=8)  # fmt: skip
    there = build_index(source, f"s3://{S3_BUCKET}/{prefix}/there", storage_options=options,
                        index_storage_options=options, objects_per_task=8, client=dask_client)  # fmt: skip
    assert [t.segment for t in there.tasks] == [t.segment for t in here.tasks]  # byte for byte
    workers = {str(w) for w in dask_client.run(os.getpid).values()}
    assert len(workers) == 2 and str(os.getpid()) not in workers
    index = f"s3://{S3_BUCKET}/{prefix}/there"
    assert sorted(_all_docs(index, options, tmp_path / "cache")) == _expected_ids(files)
    _seed(moto, f"{prefix}/src", ["top0/readme0.txt"], version=1)
    rerun = build_index(source, index, storage_options=options, index_storage_options=options,
                        objects_per_task=8, client=dask_client)  # fmt: skip
    assert len(_ran(rerun)) == 1 and rerun.manifest == 2


@pytest.mark.s3
def test_dask_workers_embed_the_same_vector_shards(moto: MotoServer, dask_client: Any, tmp_path: Path) -> None:
    """The embedder travels to the workers (pickled) and the shards they build are byte for
    byte the ones built in this process."""
    prefix = unique("dask-vectors")
    _seed(moto, f"{prefix}/src", LAYOUT[:12])
    options = _options(moto)
    source = f"s3://{S3_BUCKET}/{prefix}/src"
    reports = [
        build_index(source, f"s3://{S3_BUCKET}/{prefix}/{where}", storage_options=options,
                    index_storage_options=options, objects_per_task=4, embedder=HashingEmbedder(32), client=client)
        for where, client in (("here", None), ("there", dask_client))
    ]  # fmt: skip
    here, there = reports
    assert [t.segment for t in there.tasks] == [t.segment for t in here.tasks] and len(there.tasks) >= 3
    assert there.embedder == "agentvfs-hashing-32" and there.embed_failed == 0
    index = f"s3://{S3_BUCKET}/{prefix}/there"
    for ref in read_manifest(index, options).segments:
        segment = fetch_segment(index, ref, tmp_path / "cache", options)
        assert segment.vector_info is not None and segment.vector_info["count"] == segment.n_docs == ref.docs


@pytest.mark.s3
def test_the_cli_builds_on_a_scheduler_and_reports_json(
    moto: MotoServer, dask_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique("cli")
    _seed(moto, f"{prefix}/src", LAYOUT[:9])
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    endpoint = f"endpoint_url={moto.endpoint_url}"
    address = dask_client.scheduler.address
    code = main(["index", source, "--out", index, "-o", endpoint, "--scheduler", address, "--objects-per-task", "3", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["manifest"] == 1 and report["docs"] == 9 and report["built"] == len(report["tasks"]) == 3
    assert all(t["objects"] <= 3 for t in report["tasks"])
    code = main(["index", source, "--out", index, "-o", endpoint, "--objects-per-task", "3"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "| task | estimate | objects | docs | bytes | segment |" in out.out and "(kept)" in out.out
    assert "manifest 2 of" in out.err and "segments built 0, kept 3" in out.err


def test_the_cli_refuses_bad_input_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.md").write_text("alpha\n")
    out = str(tmp_path / "index")
    cases = [
        (["index", str(tmp_path / "missing"), "--out", out], 2, "does not exist; give the directory"),
        (["index", "nosuch://bucket/x", "--out", out], 2, "Unknown storage protocol 'nosuch'"),
        (["index", str(tmp_path / "src"), "--out", out, "--objects-per-task", "0"], 2, "--objects-per-task must be at least 1"),
        (["index", str(tmp_path / "src"), "--out", out, "--workers", "0"], 2, "--workers must be at least 1"),
        (["index", str(tmp_path / "src"), "--out", out, "--scheduler", "tcp://127.0.0.1:1"], 1,
         "Cannot reach the Dask scheduler at tcp://127.0.0.1:1"),
        (["index", str(tmp_path / "src"), "--out", out, "--scheduler", "127.0.0.1"], 2, "has no port"),
    ]  # fmt: skip
    for args, expected, message in cases:
        code = main(args)
        err = capsys.readouterr().err
        assert code == expected and message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert main(["index", str(tmp_path / "src"), "--out", out]) == 0
    capsys.readouterr()
    assert read_manifest(out).docs == 1


def test_the_cli_without_dask_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.md").write_text("alpha\n")
    # An environment without Dask: its modules cannot be imported.
    script = (
        "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None\n"
        "from agentvfs.cli import main\n"
        f"sys.exit(main(['index', {str(tmp_path / 'src')!r}, '--out', {str(tmp_path / 'index')!r}, '--workers', '2']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env(), timeout=60, check=False)
    assert done.returncode == 1
    assert "pip install 'agentvfs[dask]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_files_are_read_in_order_and_a_file_that_cannot_be_read_is_reported_in_its_place(
    tmp_path: Path,
) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from agentvfs.search._bulk import _read_in_order

    for i in range(30):
        (tmp_path / f"f{i:02d}").write_bytes(b"x" * i)
    names = [f"f{i:02d}" for i in range(30)]
    names.insert(7, "gone")  # listed, then deleted before it was read
    local = list(_read_in_order(LocalFileSystem(), [str(tmp_path / n) for n in names]))
    memory = MemoryFileSystem()
    for i in range(30):
        memory.pipe_file(f"/bulk-read/f{i:02d}", b"x" * i)
    remote = list(_read_in_order(memory, [f"/bulk-read/{n}" for n in names]))  # read by threads
    for got in (local, remote):
        assert isinstance(got[7], FileNotFoundError)
        assert [g for k, g in enumerate(got) if k != 7] == [b"x" * i for i in range(30)]


@pytest.mark.gcs
def test_a_gcs_bucket_is_indexed_and_a_racing_builder_is_told(fake_gcs: Any, tmp_path: Path) -> None:
    """From and to fake-gcs-server: the segments and manifest land in the bucket, a builder
    that read no manifest loses to one that wrote it first (the create-only put is a
    generation precondition there), and a re-run keeps every segment."""
    from conftest import GCS_BUCKET

    raw = fake_gcs.gcsfs()
    prefix = unique("gcs-index")
    files = {f"{prefix}/src/{key}": f"gcs page {key}\nkernel socket {len(key)}\n".encode() for key in LAYOUT[:10]}
    raw.pipe({f"{GCS_BUCKET}/{key}": data for key, data in files.items()})
    options = {"token": "anon", "project": "test", "endpoint_url": fake_gcs.endpoint_url}
    source, index = f"gcs://{GCS_BUCKET}/{prefix}/src", f"gcs://{GCS_BUCKET}/{prefix}/index"
    winner: list[BuildReport] = []

    def meanwhile(_: TaskReport) -> None:
        if not winner:
            winner.append(build_index(source, index, storage_options=options, index_storage_options=options,
                                      objects_per_task=4, embedder=HashingEmbedder(16)))  # fmt: skip

    with pytest.raises(IndexConflictError, match="another build wrote manifest 1"):
        build_index(source, index, storage_options=options, index_storage_options=options, objects_per_task=4,
                    embedder=HashingEmbedder(16), progress=meanwhile)  # fmt: skip
    manifest = read_manifest(index, options)
    assert manifest.number == 1 and manifest.docs == 10 and manifest.embedder == "agentvfs-hashing-16"
    assert sorted(_all_docs(index, options, tmp_path / "cache")) == sorted("/" + k.split("/src/", 1)[1] for k in files)
    rerun = build_index(source, index, storage_options=options, index_storage_options=options,
                        objects_per_task=4, embedder=HashingEmbedder(16))  # fmt: skip
    assert rerun.manifest == 2 and rerun.built == 0 and rerun.reused == len(manifest.segments)


def _published(tmp_path: Path) -> tuple[Path, Any]:
    """A local index of a few files, and its one segment's manifest entry."""
    source, index = tmp_path / "src", tmp_path / "index"
    source.mkdir()
    for name in ("a.txt", "b.txt"):
        (source / name).write_text(f"kernel socket {name}\n")
    build_index(str(source), str(index))
    [ref] = read_manifest(str(index)).segments
    return index, ref


def test_a_segment_larger_than_its_manifest_says_is_refused_unread(tmp_path: Path) -> None:
    """Its object replaced by 700 MiB (sparse: no disk), a segment used to be read whole
    (793 MiB of peak RSS) and then kept in the cache; its size is now checked first."""
    index, ref = _published(tmp_path)
    stored = index / "segments" / f"{ref.name}.seg"
    os.truncate(stored, 700 << 20)
    cache = tmp_path / "cache"
    with peak_rss_growth() as growth, pytest.raises(SearchIndexError) as caught:
        fetch_segment(str(index), ref, cache)
    assert growth[0] < 32 << 20, f"refusing it grew the peak RSS by {growth[0] >> 20} MiB"
    assert f"is {700 << 20} bytes in storage, and its manifest says {ref.bytes}: replaced or damaged" in str(caught.value)
    assert list(cache.iterdir()) == []


def test_a_segment_past_the_limit_is_refused_and_one_within_it_streams_through_the_cache(tmp_path: Path) -> None:
    """A manifest that names a segment of 400 MiB: past a limit of 256 MiB it is refused
    before any byte is read; within the default 1 GiB it is read a piece at a time (hashed
    as it comes: it was read whole), found not to hash to its name, and never kept."""
    index, ref = _published(tmp_path)
    huge = replace(ref, bytes=400 << 20)
    os.truncate(index / "segments" / f"{ref.name}.seg", huge.bytes)
    cache = tmp_path / "cache"
    with pytest.raises(SearchIndexError, match=f"is {400 << 20} bytes by its manifest, past the limit of {256 << 20} bytes"):
        fetch_segment(str(index), huge, cache, max_bytes=256 << 20)
    with peak_rss_growth() as growth, pytest.raises(SearchIndexError, match=f"segment {ref.name} of index .* is corrupt"):
        fetch_segment(str(index), huge, cache)
    assert growth[0] < 64 << 20, f"streaming it grew the peak RSS by {growth[0] >> 20} MiB"
    assert list(cache.iterdir()) == []  # not kept, and no staged part left
    # A bare name has no manifest size: the limit alone bounds it.
    with pytest.raises(SearchIndexError, match=f"is {400 << 20} bytes, past the limit of {1 << 20} bytes"):
        fetch_segment(str(index), ref.name, cache, max_bytes=1 << 20)


def test_a_segment_that_is_no_segment_is_not_kept_in_the_cache(tmp_path: Path) -> None:
    """Bytes that hash to their name but are no segment (anyone can name bytes by their hash)
    are refused before they are put in the cache."""
    index, _ = _published(tmp_path)
    junk = b"AVFSSEG1" + bytes(1000)
    name = hashlib.blake2b(junk, digest_size=32).hexdigest()
    (index / "segments" / f"{name}.seg").write_bytes(junk)
    cache = tmp_path / "cache"
    with pytest.raises(SearchIndexError, match="cannot be read"):
        fetch_segment(str(index), name, cache)
    assert list(cache.iterdir()) == []


def test_a_manifest_past_its_bound_is_skipped_unread(tmp_path: Path) -> None:
    index, _ = _published(tmp_path)
    with open(index / "manifests" / "0000000002.json", "wb") as forged:
        forged.truncate(100 << 20)  # sparse: no disk
    with peak_rss_growth() as growth:
        assert read_manifest(str(index)).number == 1
    assert growth[0] < 32 << 20, f"skipping it grew the peak RSS by {growth[0] >> 20} MiB"
    from agentvfs.search._bulk import Manifest, manifests_newest_first

    [(number, error), (older, manifest)] = list(manifests_newest_first(str(index)))
    assert (number, older) == (2, 1) and isinstance(manifest, Manifest)
    assert isinstance(error, SearchIndexError) and "is larger than a manifest may be" in str(error)
