"""Searching published segments together with a local index: one collection, exact scores."""

from __future__ import annotations

import json
import logging
import os
import random
import struct
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest

pytest.importorskip("duckdb")
pytest.importorskip("numpy")

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceError
from agentvfs.errors import SearchIndexError
from agentvfs.search import build_index
from agentvfs.search._bm25 import BM25Index
from agentvfs.search._ids import shared_path, source_of
from agentvfs.search._segments import Segment, SourceFile, build_segment
from agentvfs.search._shared import SegmentSource
from agentvfs.search._workspace import file_documents
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "copy",
    "move",
    "list",
    "remove",
    "print",
    "shell",
    "network",
    "file",
]


def _corpus(seed: int, files: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    out: dict[str, bytes] = {}
    for i in range(files):
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
            for _ in range(rng.randint(1, 400 if i % 7 == 0 else 20))
        ]
        out[f"/d{i % 5}/f{i:03d}.txt"] = "\n".join(lines).encode()
    return out


def _segment(files: dict[str, bytes]) -> Segment:
    data = build_segment(SourceFile(path, raw, len(raw)) for path, raw in files.items())
    return Segment.from_bytes(data)


def _single(files: dict[str, bytes]) -> BM25Index:
    index = BM25Index()
    for path in sorted(files):
        index.add_many(
            [
                (d.id, d.content, d.metadata, d.start_line_offset)
                for d in file_documents(path, files[path])
            ]
        )
    return index


QUERIES = ["alpha", "copy move", "shell network file", "omega omega pi", "sigma tau zeta list"]


def test_scores_equal_one_index_over_everything() -> None:
    corpus = _corpus(1, 90)
    names = sorted(corpus)
    parts = [dict((n, corpus[n]) for n in names[i::3]) for i in range(3)]
    shared = [SegmentSource(_segment(part)) for part in parts[:2]]
    local = _single(parts[2])
    everything = _single(corpus)
    for query in QUERIES:
        merged = local.search(query, top_k=400, before=shared)
        single = everything.search(query, top_k=400)
        assert {h.id: h.score for h in merged} == {h.id: h.score for h in single}  # bit for bit
        best = merged[:5]
        for hit in best:
            twin = next(h for h in single if h.id == hit.id)
            assert (hit.content, hit.metadata, hit.line_range) == (
                twin.content,
                twin.metadata,
                twin.line_range,
            )


def test_hidden_documents_leave_the_statistics() -> None:
    corpus = _corpus(2, 40)
    names = sorted(corpus)
    changed = names[::4]
    segment = SegmentSource(_segment(corpus))
    # The agent rewrote some files: its index holds the new text, the shared old text hides.
    local = BM25Index()
    rewritten = {name: b"alpha fresh words about copy\n" * 3 for name in changed}
    for name, raw in rewritten.items():
        local.add_many(
            [(d.id, d.content, d.metadata, d.start_line_offset) for d in file_documents(name, raw)]
        )
    segment = segment.hidden(local.ids())
    expected = _single({**corpus, **rewritten})
    for query in [*QUERIES, "fresh"]:
        merged = local.search(query, top_k=500, before=[segment])
        single = expected.search(query, top_k=500)
        assert {h.id: h.score for h in merged} == {h.id: h.score for h in single}
    assert segment.live_docs + len(local) == len(expected)
    # A removed file (a tombstone) hides all its chunks.
    long_file = next(n for n in names if n not in changed and len(file_documents(n, corpus[n])) > 1)
    segment = segment.hidden([long_file])
    assert all(
        source_of(h.id) != long_file for h in local.search("alpha", top_k=1000, before=[segment])
    )


def test_ties_keep_source_order_and_top_k_cuts_across_sources() -> None:
    shared = SegmentSource(_segment({"/a.txt": b"same words", "/b.txt": b"same words"}))
    local = BM25Index()
    local.add("/c.txt", "same words")
    hits = local.search("same", top_k=2, before=[shared])
    assert [h.id for h in hits] == ["/a.txt", "/b.txt"]
    assert len({h.score for h in local.search("same", top_k=3, before=[shared])}) == 1
    # An empty local index still searches the shared segments.
    assert [h.id for h in BM25Index().search("words", before=[shared])] == ["/a.txt", "/b.txt"]


def test_source_of() -> None:
    assert source_of("/a.md#chunk-3") == "/a.md"
    assert source_of("/a.md#chunk-") == "/a.md#chunk-"
    assert source_of("/a#chunk-1#chunk-2") == "/a#chunk-1"
    assert source_of("plain") == "plain"
    assert (
        shared_path("docs/a.md")
        == shared_path("./docs/a.md")
        == shared_path("/docs/a.md")
        == "/docs/a.md"
    )
    assert shared_path(".env") == "/.env"


def test_segment_opens_from_a_file_quickly(tmp_path: Path) -> None:
    corpus = _corpus(3, 30)
    data = build_segment(SourceFile(p, r, len(r)) for p, r in corpus.items())
    path = tmp_path / "x.seg"
    path.write_bytes(data)
    source = SegmentSource(Segment.open(path))
    local = BM25Index()
    assert [h.id for h in local.search("alpha", top_k=5, before=[source])] == [
        h.id for h in _single(corpus).search("alpha", top_k=5)
    ]


# -- a workspace attached to a published index (moto S3) ------------------------------------------


def _moto_options(moto: MotoServer | str) -> dict[str, Any]:
    endpoint = moto if isinstance(moto, str) else moto.endpoint_url
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}


def _words(name: str, version: int = 0) -> bytes:
    vocabulary = ("kernel", "socket", "buffer", "thread", "signal", "memory", "search", "index")
    body = " ".join(vocabulary[(len(name) * 7 + i * (1 + len(name) % 3)) % 8] for i in range(40))
    return f"# {name} v{version}\n{body}\n".encode()


def _publish(moto: MotoServer, prefix: str, names: list[str]) -> tuple[str, str]:
    client = moto.boto3_client()
    for name in names:
        client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/src/{name}", Body=_words(name))
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    build_index(
        source,
        index,
        storage_options=_moto_options(moto),
        index_storage_options=_moto_options(moto),
    )
    return source, index


def _workspace(
    moto: MotoServer | str, prefix: str, index: str, where: Path, **extra: Any
) -> Workspace:
    """A workspace on the bucket's files with the published ``index`` attached (``moto``: the
    server, or its endpoint from another process)."""
    raw = fsspec.filesystem(
        "s3", **_moto_options(moto), use_listings_cache=False, skip_instance_cache=True
    )
    fs = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{prefix}/src")
    return Workspace(
        filesystem=fs,
        bm25=extra.pop("bm25", True),
        auto_index_paths=["/"],
        index_dir=str(where / "index"),
        search_index_url=index,
        search_index_options={
            "storage_options": _moto_options(moto),
            "cache_dir": str(where / "segments"),
            "refresh_interval": extra.pop("refresh_interval", 0),
            "cache_grace": extra.pop("cache_grace", 3600),
        },
        **extra,
    )


NAMES = [f"d{d}/f{i}.md" for d in range(3) for i in range(6)] + ["top.txt"]


@pytest.mark.anyio
async def test_a_workspace_searches_the_published_index_with_its_own_changes(
    moto: MotoServer, tmp_path: Path
) -> None:
    prefix = unique("shared")
    _, index = _publish(moto, prefix, NAMES)
    ws = _workspace(moto, prefix, index, tmp_path)
    async with ws:
        engine = await ws._search.engine()  # type: ignore[union-attr]
        assert engine.bm25 is not None and len(engine.bm25) == 0  # nothing indexed here
        hits = await ws.search("kernel socket", top_k=50)
        assert {h.id for h in hits} == {
            f"/{n}" for n in NAMES if b"kernel" in _words(n) or b"socket" in _words(n)
        }
        # The agent changes a file and removes another: its index holds the change, the
        # published versions are hidden, and scores are those of one index of what it sees.
        await ws.filesystem.write_file("/d0/f1.md", "zebra kernel entirely new words\n")  # type: ignore[union-attr]
        await ws.index("/d0/f1.md", "zebra kernel entirely new words\n")
        moto.boto3_client().delete_object(Bucket=S3_BUCKET, Key=f"{prefix}/src/d1/f2.md")
        sync = await ws._search.sync(ws.filesystem, ["/"])  # type: ignore[union-attr,arg-type]
        assert sync["removed"] == 1 and sync["unlisted"] == []
        seen = {
            **{f"/{n}": _words(n) for n in NAMES},
            "/d0/f1.md": b"zebra kernel entirely new words\n",
        }
        del seen["/d1/f2.md"]
        single = BM25Index()
        for path in sorted(seen):
            single.add_many(
                [
                    (d.id, d.content, d.metadata, d.start_line_offset)
                    for d in file_documents(path, seen[path])
                ]
            )
        for query in ("kernel", "zebra kernel", "memory thread index"):
            got = {h.id: h.score for h in await ws.search(query, top_k=100)}
            assert got == {h.id: h.score for h in single.search(query, top_k=100)}, query
    # A new session on the same index_dir: the tombstone and the local change are kept.
    again = _workspace(moto, prefix, index, tmp_path)
    async with again:
        ids = [h.id for h in await again.search("kernel", top_k=100)]
        assert "/d1/f2.md" not in ids and ids.count("/d0/f1.md") == 1
        assert (await again.search("zebra"))[0].id == "/d0/f1.md"


@pytest.mark.anyio
async def test_two_processes_share_one_index_and_follow_a_new_manifest(
    moto: MotoServer, tmp_path: Path
) -> None:
    prefix = unique("shared2")
    source, index = _publish(moto, prefix, NAMES)
    # Another "machine": a process of its own, with its own segment cache and index_dir.
    script = textwrap.dedent(
        f"""
        import anyio, json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from test_search_shared import _workspace

        async def main():
            ws = _workspace({moto.endpoint_url!r}, {prefix!r}, {index!r}, Path({str(tmp_path / "other")!r}))
            async with ws:
                hits = await ws.search("kernel socket", top_k=50)
                print(json.dumps([[h.id, h.score] for h in hits]))
        anyio.run(main)
        """
    )
    done = await anyio.run_process([sys.executable, "-c", script], check=False)
    assert done.returncode == 0, done.stderr[-2000:].decode(errors="replace")
    remote = [tuple(x) for x in json.loads(done.stdout.decode().strip().splitlines()[-1])]
    ws = _workspace(moto, prefix, index, tmp_path / "here", cache_grace=0)
    async with ws:
        local = [(h.id, h.score) for h in await ws.search("kernel socket", top_k=50)]
        assert local == remote
        before = ws._search.shared.describe()  # type: ignore[union-attr]
        # A rebuild publishes a new manifest: searches go on from the old segments while the
        # new ones are fetched, then use them.
        moto.boto3_client().put_object(
            Bucket=S3_BUCKET, Key=f"{prefix}/src/d2/new.md", Body=b"quokka kernel\n"
        )
        build_index(
            source,
            index,
            storage_options=_moto_options(moto),
            index_storage_options=_moto_options(moto),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(h.id == "/d2/new.md" for h in await ws.search("quokka")):
                break
            await anyio.sleep(0.05)
        else:
            raise AssertionError("the new manifest was never used")
        after = ws._search.shared.describe()  # type: ignore[union-attr]
        assert after["manifest"] == before["manifest"] + 1
        # The segments of the old manifest left the cache (grace 0); the new ones are there.
        current = {ref.name + ".seg" for ref in ws._search.shared.manifest.segments}  # type: ignore[union-attr]
        assert set(os.listdir(tmp_path / "here" / "segments")) == current


@pytest.mark.anyio
async def test_attaching_refuses_what_cannot_be_searched_alike(
    moto: MotoServer, tmp_path: Path
) -> None:
    prefix = unique("shared3")
    _, index = _publish(moto, prefix, NAMES[:4])
    # Other tokenizer options: refused, naming the segment and the difference.
    stemmed = _workspace(moto, prefix, index, tmp_path / "a", bm25={"tokenize": {"stem": True}})
    with pytest.raises(
        SearchIndexError, match=r"segment [0-9a-f]{64} .*other tokenizer options.*stem"
    ):
        async with stemmed:
            await stemmed.search("kernel")
    # No index there.
    missing = _workspace(moto, prefix, f"s3://{S3_BUCKET}/{prefix}/nothing", tmp_path / "b")
    with pytest.raises(SearchIndexError, match="no manifest"):
        async with missing:
            await missing.search("kernel")
    # Bad configuration.
    with pytest.raises(WorkspaceError, match="search_index_url needs bm25"):
        Workspace(filesystem=LocalFilesystem(tmp_path), search_index_url=index)
    with pytest.raises(WorkspaceError, match="unknown key 'cache'"):
        Workspace(
            filesystem=LocalFilesystem(tmp_path),
            bm25=True,
            search_index_url=index,
            search_index_options={"cache": 1},
        )
    # A newer manifest naming a corrupt segment: the attached workspace keeps the old ones.
    ws = _workspace(moto, prefix, index, tmp_path / "c")
    async with ws:
        first = [h.id for h in await ws.search("kernel")]
        shared = ws._search.shared  # type: ignore[union-attr]
        assert shared is not None
        manifest = shared.manifest
        client = moto.boto3_client()
        ref = manifest.segments[0]
        client.put_object(
            Bucket=S3_BUCKET,
            Key=f"{prefix}/index/segments/{'0' * 64}.seg",
            Body=b"AVFSSEG1 not really",
        )
        body = json.loads(
            client.get_object(
                Bucket=S3_BUCKET, Key=f"{prefix}/index/manifests/{manifest.number:010d}.json"
            )["Body"].read()
        )
        body["number"] = manifest.number + 1
        body["segments"][0]["name"] = "0" * 64
        client.put_object(
            Bucket=S3_BUCKET,
            Key=f"{prefix}/index/manifests/{manifest.number + 1:010d}.json",
            Body=json.dumps(body).encode(),
        )
        del ref
        deadline = time.monotonic() + 20
        while shared.last_error is None and time.monotonic() < deadline:
            assert [h.id for h in await ws.search("kernel")] == first
            await anyio.sleep(0.05)
        assert shared.last_error is not None and "0" * 64 in str(shared.last_error)
        assert [h.id for h in await ws.search("kernel")] == first


@pytest.mark.parametrize(
    ("array", "value", "why"),
    [
        ("slots", 10_000, "names a document outside"),
        ("slots", -1, "names a document outside"),
        ("tfs", 0, "term frequency is below 1"),
        ("lengths", 999, "lengths do not add up"),
    ],
)
def test_a_segment_with_unusable_postings_is_refused(array: str, value: int, why: str) -> None:
    data = bytearray(build_segment(SourceFile(p, r, len(r)) for p, r in _corpus(4, 12).items()))
    entry = Segment.from_bytes(bytes(data)).header["arrays"][array]
    data[entry["offset"] : entry["offset"] + 4] = value.to_bytes(4, "little", signed=True)
    forged = Segment.from_bytes(bytes(data))  # well-formed, named by its own bytes
    with pytest.raises(SearchIndexError, match=f"segment {forged.name} cannot be searched: .*{why}"):
        SegmentSource(forged)


def test_a_segment_whose_term_lists_a_document_twice_or_out_of_order_is_refused() -> None:
    data = bytearray(build_segment(SourceFile(p, r, len(r)) for p, r in _corpus(4, 12).items()))
    segment = Segment.from_bytes(bytes(data))
    starts = segment.arrays["starts"]
    term = next(i for i in range(len(starts) - 1) if starts[i + 1] - starts[i] >= 2)
    at = segment.header["arrays"]["slots"]["offset"] + 4 * int(starts[term])
    first, second = struct.unpack_from("<ii", data, at)
    for forged_slots in ((second, first), (first, first)):
        forged = bytearray(data)
        struct.pack_into("<ii", forged, at, *forged_slots)
        bad = Segment.from_bytes(bytes(forged))
        with pytest.raises(SearchIndexError, match=f"segment {bad.name} cannot be searched: .*not in ascending order"):
            SegmentSource(bad)
    SegmentSource(segment)  # the original passes


@pytest.mark.anyio
async def test_on_a_local_directory_published_hits_are_named_as_the_workspace_names_files(
    tmp_path: Path,
) -> None:
    files = tmp_path / "files"
    long_text = "".join(f"line {i} about kernels and sockets\n" for i in range(400))
    for name, text in {"d0/a.md": "kernel notes\n", "d1/long.txt": long_text}.items():
        (files / name).parent.mkdir(parents=True, exist_ok=True)
        (files / name).write_text(text)
    index = str(tmp_path / "index")
    build_index(str(files), index)

    def workspace(patterns: list[str]) -> Workspace:
        return Workspace(
            filesystem=LocalFilesystem(files),
            bm25=True,
            auto_index_paths=patterns,
            index_dir=str(tmp_path / "own"),
            search_index_url=index,
            search_index_options={"cache_dir": str(tmp_path / "segments")},
        )

    async with workspace(["."]) as ws:
        hits = await ws.search("kernel kernels", top_k=20)
        assert hits and all(not h.id.startswith("/") for h in hits)
        assert "d0/a.md" in {h.id for h in hits}
        chunk = next(h for h in hits if "#chunk-" in h.id)
        assert chunk.id.startswith("d1/long.txt#chunk-") and (chunk.metadata or {})["source_file"] == "d1/long.txt"
        for hit in hits:  # every hit names a file the workspace can open
            path = (hit.metadata or {}).get("source_file", hit.id)
            assert await ws.filesystem.read_file(path)  # type: ignore[union-attr]
        await ws.filesystem.write_file("d0/a.md", "nothing left here\n")  # type: ignore[union-attr]
        await ws.index("d0/a.md", "nothing left here\n")
        assert "d0/a.md" not in {h.id for h in await ws.search("kernel kernels", top_k=20)}  # hidden


def _forge(moto: MotoServer, prefix: str, number: int, change: Any) -> None:
    """Write manifest ``number`` as a copy of manifest 1 changed by ``change`` (anyone who
    can write the bucket can)."""
    client = moto.boto3_client()
    key = f"{prefix}/index/manifests/{{:010d}}.json"
    body = json.loads(client.get_object(Bucket=S3_BUCKET, Key=key.format(1))["Body"].read())
    body["number"] = number
    change(body)
    client.put_object(Bucket=S3_BUCKET, Key=key.format(number), Body=json.dumps(body).encode())


@pytest.mark.anyio
async def test_a_newer_manifest_that_cannot_be_used_leaves_a_workspace_on_the_last_that_loads(
    moto: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manifest naming a missing segment stopped every workspace from starting; now each
    manifest that cannot be used is passed over with a warning naming what is wrong, and the
    newest that loads is searched. One found unusable is not fetched again."""
    prefix = unique("fallback")
    _, index = _publish(moto, prefix, NAMES)
    client = moto.boto3_client()
    missing = "f" * 64
    huge = "e" * 64
    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/segments/{huge}.seg", Body=b"x" * 4096)

    def name_missing(body: dict[str, Any]) -> None:
        body["segments"][0]["name"] = missing

    def name_larger(body: dict[str, Any]) -> None:
        body["segments"][0].update(name=huge, bytes=2 << 30)

    _forge(moto, prefix, 2, name_missing)
    _forge(moto, prefix, 3, name_larger)
    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/manifests/0000000004.json", Body=b'{"format": "agentvfs-index-manif')
    ws = _workspace(moto, prefix, index, tmp_path, refresh_interval=0)
    with caplog.at_level(logging.WARNING, "agentvfs.search"):
        async with ws:
            hits = await ws.search("kernel socket", top_k=50)
            assert {h.id for h in hits} == {f"/{n}" for n in NAMES if b"kernel" in _words(n) or b"socket" in _words(n)}
            shared = ws._search.shared  # type: ignore[union-attr]
            assert shared is not None and shared.manifest.number == 1
            said = caplog.text
            assert "manifest 4 cannot be used, an older one is tried: manifest" in said and "not JSON" in said
            assert f"manifest 3 cannot be used, an older one is tried: segment {huge} of index {index} is {2 << 30} bytes by its manifest, past the limit of {1 << 30} bytes" in said
            assert f"manifest 2 cannot be used, an older one is tried: segment {missing} of index {index} is missing" in said
            assert "using manifest 1, the newest that loads" in said
            assert shared.last_error is not None and "not JSON" in str(shared.last_error)
            # Refreshes (one a search here) try none of them again, and say nothing more.
            caplog.clear()
            for _ in range(3):
                await ws.search("kernel")
                refresh = shared._thread
                if refresh is not None:
                    await anyio.to_thread.run_sync(refresh.join, 20.0)
            assert "cannot be used" not in caplog.text and shared.manifest.number == 1
            # A good manifest after them is taken up.
            build_index(
                f"s3://{S3_BUCKET}/{prefix}/src", index,
                storage_options=_moto_options(moto), index_storage_options=_moto_options(moto),
            )  # fmt: skip
            deadline = time.monotonic() + 20
            while shared.manifest.number != 5 and time.monotonic() < deadline:
                await ws.search("kernel")
                await anyio.sleep(0.05)
            assert shared.manifest.number == 5 and shared.last_error is None
    # Nothing that loads at all: the error names every manifest tried.
    client.delete_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/manifests/0000000005.json")
    client.delete_object(Bucket=S3_BUCKET, Key=f"{prefix}/index/manifests/0000000001.json")
    again = _workspace(moto, prefix, index, tmp_path / "again")
    with pytest.raises(SearchIndexError, match=r"has no manifest that can be used among the newest 3: .*not JSON.*past the limit.*is missing"):
        async with again:
            await again.search("kernel")
