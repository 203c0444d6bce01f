"""Vector shards of published segments: built with the segment, searched with the agent's own
vector store as one store of what it sees, refused when they cannot be searched safely."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("duckdb")
pytest.importorskip("hnswlib")

from agentvfs import LocalFilesystem, Workspace
from agentvfs.cli import main
from agentvfs.errors import SearchIndexError
from agentvfs.search import HashingEmbedder, HnswVectorStore, build_index, read_manifest
from agentvfs.search._engine import store_metadata
from agentvfs.search._segments import Segment, SourceFile, build_segment
from agentvfs.search._shards import VectorShard, query_vector
from agentvfs.search._shared import SegmentSource, SharedIndex
from agentvfs.search._tokenize import TokenizeOptions
from agentvfs.search._workspace import file_documents
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique

WORDS = [
    "kernel", "socket", "buffer", "thread", "signal", "memory", "search", "index", "copy", "move",
    "list", "remove", "print", "shell", "network", "file", "alpha", "beta", "gamma", "delta",
    "omega", "sigma", "tau", "quokka", "zebra",
]  # fmt: skip
DIM = 64


def _text(rng: random.Random, lines: int) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(lines)) + "\n"


def _corpus(seed: int, files: int) -> dict[str, bytes]:
    """Files of random words; every seventh long enough to be chunked."""
    rng = random.Random(seed)
    return {
        f"d{i % 4}/f{i:03d}.txt": _text(rng, rng.randint(150, 300) if i % 7 == 0 else rng.randint(1, 12)).encode()
        for i in range(files)
    }


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, raw in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(raw)


async def _reference(files: dict[str, bytes], embedder: Any, query: str, top_k: int, filter: Any = None) -> list[tuple[str, float]]:
    """What one vector store holding every document of ``files`` answers."""
    store = HnswVectorStore()
    docs = [d for rel in sorted(files) for d in file_documents(rel, files[rel])]
    await store.create_index("ref", DIM)
    vectors = embedder([d.content for d in docs])
    metadata = [store_metadata(d.id, d.content, d.metadata, d.start_line_offset) for d in docs]
    await store.upsert("ref", vectors, metadata, [d.id for d in docs])
    hits = await store.query("ref", embedder([query])[0], top_k, filter)
    return [(str(h["id"]), float(h["score"])) for h in hits]


def _agent(tmp_path: Path, bucket: Path, index: Path, embedder: Any, **extra: Any) -> Workspace:
    return Workspace(
        filesystem=LocalFilesystem(bucket),
        bm25=True,
        vector_store=HnswVectorStore(),
        embedder=embedder,
        auto_index_paths=["."],
        index_dir=str(tmp_path / "agent"),
        search_index_url=str(index),
        search_index_options={"cache_dir": str(tmp_path / "segments"), "refresh_interval": 3600},
        **extra,
    )


def _same_ranking(got: Sequence[tuple[str, float]], want: Sequence[tuple[str, float]]) -> None:
    """Equal scores in the same order, and the same documents at each score (ties may list
    them in another order)."""
    assert [round(s, 6) for _, s in got] == [round(s, 6) for _, s in want]
    assert dict(got) == pytest.approx(dict(want), abs=1e-6)


# -- the format -----------------------------------------------------------------------------


def test_a_segment_built_with_an_embedder_holds_its_shard() -> None:
    """Unit rows for every document, their slots, an hnswlib graph, and the embedder's id;
    the same files give the same bytes (the graph is built on one thread, seeded)."""
    files = [SourceFile(f"/{rel}", raw, len(raw)) for rel, raw in _corpus(3, 40).items()]
    data = build_segment(files, embedder=HashingEmbedder(DIM))
    assert data == build_segment(reversed(files), embedder=HashingEmbedder(DIM))
    segment = Segment.from_bytes(data)
    info = segment.vector_info
    assert info is not None
    assert (info["embedder"], info["dimension"], info["count"], info["metric"]) == (
        f"agentvfs-hashing-{DIM}", DIM, segment.n_docs, "cosine",
    )
    assert segment.vector_slots.tolist() == list(range(segment.n_docs))
    norms = np.linalg.norm(segment.vector_matrix, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6)
    assert len(segment.graph_bytes) > 0
    # Without an embedder: no shard, and the BM25 part is byte for byte what it was.
    plain = Segment.from_bytes(build_segment(files))
    assert plain.vector_info is None and len(plain.vector_slots) == 0
    assert plain.arrays["terms"].tobytes() == segment.arrays["terms"].tobytes()


class _Picky:
    """An embedder that fails on texts holding "omega" (as a model may on odd input)."""

    model_id = "picky-16"
    batch = False

    def __init__(self, fail: bool = True) -> None:
        self.fail = fail
        self.inner = HashingEmbedder(16)

    def __call__(self, text: str) -> list[float]:
        if self.fail and "omega" in text:
            raise RuntimeError("cannot embed omega")
        return self.inner([text])[0]


def test_documents_whose_embedding_fails_have_no_vector_and_are_named() -> None:
    files = [SourceFile(f"/f{i}.txt", raw, len(raw)) for i, raw in enumerate([b"alpha beta", b"omega tau", b"gamma"])]
    from agentvfs.search._segments import SegmentBuilder

    with SegmentBuilder(embedder=_Picky()) as builder:
        for source in files:
            builder.add(source)
        segment = Segment.from_bytes(builder.finish())
    assert list(builder.embedding_failures) == ["/f1.txt"]
    assert "cannot embed omega" in builder.embedding_failures["/f1.txt"]
    assert segment.vector_slots.tolist() == [0, 2]
    # All failing: a shard of no vectors, which reads and searches as empty.
    with SegmentBuilder(embedder=_Picky()) as builder:
        builder.add(SourceFile("/o.txt", b"omega", 5))
        empty = Segment.from_bytes(builder.finish())
    assert empty.vector_info is not None and empty.vector_info["count"] == 0
    assert VectorShard(empty).search(np.full(16, 0.25, dtype=np.float32), 3, None) == []


def _patched(data: bytes, array: str, change: Any) -> bytes:
    raw = bytearray(data)
    entry = Segment.from_bytes(data).header["arrays"][array]
    dtype = {"vectors": "<f4", "vector_slots": "<i4", "hnsw": "|u1"}[array]
    view = np.frombuffer(raw, dtype=dtype, count=entry["count"], offset=entry["offset"])
    change(view)
    return bytes(raw)


def test_a_hostile_shard_is_refused_before_it_is_searched() -> None:
    """Slots out of order or out of range, NaN rows, a metric this version does not read, a
    graph hnswlib would read out of bounds: each refused with a message naming it."""
    files = [SourceFile(f"/{rel}", raw, len(raw)) for rel, raw in _corpus(5, 60).items()]
    good = build_segment(files, embedder=HashingEmbedder(DIM))

    def swap(v: Any) -> None:
        v[[0, 1]] = v[[1, 0]]

    def past(v: Any) -> None:
        v[-1] = 10_000

    def nan(v: Any) -> None:
        v[5] = np.nan

    for array, change, why in (
        ("vector_slots", swap, "not ascending slots"),
        ("vector_slots", past, "not ascending slots"),
        ("vectors", nan, "NaN or infinity"),
    ):
        with pytest.raises(SearchIndexError, match=why):
            VectorShard(Segment.from_bytes(_patched(good, array, change)))
    other = good.replace(b'"metric":"cosine"', b'"metric":"cosinf"')
    with pytest.raises(SearchIndexError, match="metric 'cosinf'"):
        Segment.from_bytes(other)
    # A level-0 link of the first element pointing past the graph's elements.
    header = 8 * 6 + 4 + 4 + 8 * 3 + 8 + 8

    def bad_link(v: Any) -> None:
        v[header : header + 2] = np.frombuffer(np.uint16(1).tobytes(), np.uint8)
        v[header + 4 : header + 8] = np.frombuffer(np.uint32(1_000_000).tobytes(), np.uint8)

    shard = VectorShard(Segment.from_bytes(_patched(good, "hnsw", bad_link)))
    assert shard.search(query_vector(HashingEmbedder(DIM)(["kernel"])[0], DIM), 3, None)  # exact: fine
    with pytest.raises(SearchIndexError, match="its graph is not one hnswlib can use safely"):
        shard.search(query_vector(HashingEmbedder(DIM)(["kernel"])[0], DIM), 3, None, exact=False)


def _graph_parts(graph: bytes) -> tuple[tuple[Any, ...], int, list[int]]:
    """An hnswlib graph's header, record size, and each element's level."""
    head = struct.Struct("<6QiI3QdQ")
    header = head.unpack_from(graph, 0)
    count, record = header[2], header[3]
    at, levels = head.size + count * record, []
    for _ in range(count):
        (size,) = struct.unpack_from("<I", graph, at)
        levels.append(size // (4 * header[8] + 4))
        at += 4 + size
    return header, head.size, levels


@pytest.mark.parametrize("poison", [False, True])
def test_a_forged_graph_neither_misleads_nor_hides(poison: bool) -> None:
    """A graph that no link leads to the best documents in passes the memory checks: the
    graph path still finds them, as the exact search does. One whose copy of the vectors
    differs from the checked vectors (negated, a NaN) is refused."""
    embedder = HashingEmbedder(DIM)
    files = [SourceFile(f"/{rel}", raw, len(raw)) for rel, raw in _corpus(5, 200).items()]
    good = build_segment(files, embedder=embedder)
    segment = Segment.from_bytes(good)
    graph = bytearray(segment.graph_bytes.tobytes())
    header, start, levels = _graph_parts(bytes(graph))
    record, data_at = header[3], header[5]
    q = query_vector(embedder(["kernel socket network"])[0], DIM)
    exact = VectorShard(segment).search(q, 8, None)
    # No level-0 link to the best five documents that live on level 0 only (no upper level
    # names them); with poison, also every stored vector negated, one NaN.
    best = [slot for _, slot in exact if levels[slot] == 0 and slot != header[7]][:5]
    assert best
    for element in range(header[2]):
        at = start + element * record
        values = np.frombuffer(graph, "<f4", DIM, at + data_at).copy()
        if poison:
            values = -values if element != 1 else np.full(DIM, np.nan, np.float32)
            graph[at + data_at : at + data_at + 4 * DIM] = values.tobytes()
        listed = int.from_bytes(graph[at : at + 2], "little")
        links = [i for i in np.frombuffer(graph, "<u4", listed, at + 4).tolist() if i not in best]
        graph[at : at + 2] = len(links).to_bytes(2, "little")
        graph[at + 4 : at + 4 + 4 * len(links)] = np.array(links, "<u4").tobytes()
    entry = segment.header["arrays"]["hnsw"]
    forged = bytearray(good)
    forged[entry["offset"] : entry["offset"] + entry["count"]] = graph
    shard = VectorShard(Segment.from_bytes(bytes(forged)))
    if poison:
        with pytest.raises(SearchIndexError, match="graph's copy of the vectors differs"):
            shard.search(q, 8, None, exact=False)
    else:
        assert shard.search(q, 8, None, exact=False) == exact


def test_a_shard_of_rows_not_of_unit_length_is_refused() -> None:
    """A row scaled up would outscore every true neighbour (scores are clipped dot products)."""
    files = [SourceFile(f"/{rel}", raw, len(raw)) for rel, raw in _corpus(5, 60).items()]
    good = build_segment(files, embedder=HashingEmbedder(DIM))

    def scale(v: Any) -> None:
        v[40 * DIM : 41 * DIM] *= 1000

    with pytest.raises(SearchIndexError, match="neither of unit length nor zero"):
        VectorShard(Segment.from_bytes(_patched(good, "vectors", scale)))


def _attached(tmp_path: Path, files: dict[str, bytes], embedder: Any) -> tuple[Path, Path, SharedIndex]:
    """``files`` written to a bucket directory, published with vectors, and attached."""
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    _write(bucket, files)
    build_index(str(bucket), str(index), embedder=embedder)
    shared = SharedIndex(str(index), cache_dir=str(tmp_path / "cache"),
                         tokenize=TokenizeOptions.from_value(None).to_dict(), embedder=embedder.model_id)  # fmt: skip
    shared.load()
    return bucket, index, shared


def test_a_reset_while_a_new_manifest_loads_is_kept(tmp_path: Path) -> None:
    """The agent clears its index while the refresh thread maps a newer manifest: what was
    hidden is shown again in the new segments too."""
    embedder = HashingEmbedder(DIM)
    bucket, index, shared = _attached(tmp_path, _corpus(3, 12), embedder)
    shared.hide(["d0/f004.txt"])
    (bucket / "d1" / "new.txt").write_bytes(b"kernel new\n")
    build_index(str(bucket), str(index), embedder=embedder)
    original = SegmentSource.hidden
    calls: list[int] = []

    def hidden(self: SegmentSource, ids: Any) -> SegmentSource:
        if not calls:
            calls.append(1)
            shared.reset()  # between the load's look at what is hidden and its swap
        return original(self, ids)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SegmentSource, "hidden", hidden)
        shared.load()
    assert calls and shared.describe()["hidden"] == 0
    text = (bucket / "d0" / "f004.txt").read_text()
    assert "/d0/f004.txt" in {h["id"] for h in shared.vector_search(embedder([text])[0], 100)}


def test_a_filter_on_published_documents_reads_their_text_only_when_it_names_it(tmp_path: Path) -> None:
    """The rows a filter allows are worked out once per segment and filter (segments never
    change), from ids and metadata; the text is expanded only for a filter on it."""
    embedder = HashingEmbedder(DIM)
    _, _, shared = _attached(tmp_path, _corpus(6, 40), embedder)
    q = embedder(["kernel socket"])[0]
    expanded: list[int] = []
    original = Segment._text_at

    def counting(self: Segment, slot: int) -> str:
        expanded.append(slot)
        return original(self, slot)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Segment, "_text_at", counting)
        for _ in range(3):
            hits = shared.vector_search(q, 5, {"source_file": {"$exists": False}})
        assert len(hits) == 5 and len(expanded) == 3 * 5  # only the hits' own texts
        expanded.clear()
        first = shared.vector_search(q, 5, {"text": {"$ne": ""}})
        assert len(expanded) > 5
        expanded.clear()
        assert shared.vector_search(q, 5, {"text": {"$ne": ""}}) == first and len(expanded) == 5


# -- searching --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_vector_search_ranks_published_and_own_documents_as_one_store(tmp_path: Path) -> None:
    """An agent attaches an index published with vectors, rewrites a file, writes a new one and
    deletes one: its vector (and filtered) searches equal those of one store holding exactly
    the documents it sees, and hybrid search finds published documents by vector too."""
    embedder = HashingEmbedder(DIM)
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    files = _corpus(11, 70)
    _write(bucket, files)
    report = build_index(str(bucket), str(index), embedder=embedder, objects_per_task=25)
    assert report.embedder == f"agentvfs-hashing-{DIM}" and report.embed_failed == 0
    assert report.built >= 2 and read_manifest(str(index)).embedder == report.embedder
    ws = _agent(tmp_path, bucket, index, embedder)
    async with ws:
        shared = ws._search.shared  # type: ignore[union-attr]
        assert shared is not None and shared.has_vectors
        assert shared.describe()["vectors"] == sum(len(file_documents(r, files[r])) for r in files)
        seen = dict(files)
        rng = random.Random(2)
        changed, gone = "d1/f005.txt", "d2/f010.txt"
        seen[changed] = _text(rng, 200).encode()  # long: chunks of its own
        seen["d3/new.txt"] = b"quokka zebra kernel\n"
        for rel in (changed, "d3/new.txt"):
            await ws.filesystem.write_file(rel, seen[rel])  # type: ignore[union-attr]
            await ws.index(rel, seen[rel].decode())
        await ws.filesystem.delete_file(gone)  # type: ignore[union-attr]
        del seen[gone]
        await ws._search.sync(ws.filesystem, ["."])  # type: ignore[union-attr,arg-type]
        total = sum(len(file_documents(r, seen[r])) for r in seen)
        for query in ("kernel socket", "quokka zebra", "omega sigma tau", "print shell network file"):
            got = [(r.id, r.score) for r in await ws.search(query, mode="vector", top_k=total + 10)]
            assert len(got) == total
            _same_ranking(got, await _reference(seen, embedder, query, total + 10))
            top = [(r.id, r.score) for r in await ws.search(query, mode="vector", top_k=7)]
            want = await _reference(seen, embedder, query, 7)
            assert [round(s, 6) for _, s in top] == [round(s, 6) for _, s in want]
        for filter in (
            {"source_file": changed},
            {"source_file": {"$in": ["d0/f000.txt", "d1/f014.txt"]}},
            {"id": {"$nin": ["d3/new.txt"]}, "source_file": {"$exists": False}},
        ):
            got = [(r.id, r.score) for r in await ws.search("kernel", mode="vector", top_k=500, filter=filter)]
            want = await _reference(seen, embedder, "kernel", 500, filter)
            assert got and len(got) == len(want), filter
            _same_ranking(got, want)
        assert all(r.id != gone for r in await ws.search("kernel", mode="vector", top_k=500))
        for mode in ("vector", "hybrid"):  # a bad filter is the store's ValueError, not a group
            with pytest.raises(ValueError, match="Unsupported filter operator"):
                await ws.search("kernel", mode=mode, filter={"$bad": 1})
        hybrid = {r.id: r for r in await ws.search("quokka zebra kernel", top_k=5)}
        assert hybrid["d3/new.txt"].score_details["vector"] == pytest.approx(1.0)
        # A published document found both ways is one result with both scores.
        fused = await ws.search("kernel socket", top_k=25)
        assert len({r.id for r in fused}) == len(fused)
        assert any(set(r.score_details) == {"bm25", "vector"} and r.id.split("#")[0] in files for r in fused)
        published = [r for r in await ws.search("omega sigma", top_k=10) if r.id.split("#")[0] not in (changed, "d3/new.txt")]
        assert any("vector" in r.score_details for r in published)
        for result in await ws.search("kernel", mode="vector", top_k=20):
            assert not result.id.startswith("/")
            assert await ws.filesystem.exists((result.metadata or {}).get("source_file") or result.id)  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_shard_of_another_embedder_is_refused_and_none_is_bm25_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    _write(bucket, _corpus(4, 12))
    build_index(str(bucket), str(index), embedder=HashingEmbedder(DIM))
    with pytest.raises(SearchIndexError, match=f"vectors of the embedder 'agentvfs-hashing-{DIM}'.*'agentvfs-hashing-32'"):
        async with _agent(tmp_path / "a", bucket, index, HashingEmbedder(32)) as ws:
            await ws.search("kernel", mode="vector")
    # A workspace without vectors attaches it and searches its BM25 part.
    plain = Workspace(
        filesystem=LocalFilesystem(bucket), bm25=True, auto_index_paths=["."], index_dir=str(tmp_path / "b"),
        search_index_url=str(index), search_index_options={"cache_dir": str(tmp_path / "b-cache")},
    )  # fmt: skip
    async with plain:
        assert await plain.search("kernel", top_k=3)
    # An index without vectors: a vector workspace says so, and finds its documents by BM25.
    bare = tmp_path / "bare"
    build_index(str(bucket), str(bare))
    async with _agent(tmp_path / "c", bucket, bare, HashingEmbedder(DIM)) as ws:
        assert "has no vectors of the embedder" in caplog.text
        assert await ws.search("kernel", mode="vector") == []
        assert await ws.search("kernel", mode="bm25", top_k=3)


def test_large_shards_are_searched_through_their_graph_with_hidden_documents_left_out(tmp_path: Path) -> None:
    """Past ``exact_limit`` the graph answers: nearly what exact search answers (recall@10 at
    least 0.9), never a hidden document, and exact search takes over under a selective filter."""
    embedder = HashingEmbedder(32)
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    rng = random.Random(7)
    _write(bucket, {f"p{i // 500}/f{i:04d}.txt": _text(rng, rng.randint(1, 4)).encode() for i in range(2000)})
    build_index(str(bucket), str(index), embedder=embedder, objects_per_task=1000)
    tokenize = TokenizeOptions.from_value(None).to_dict()

    def attach(limit: int) -> SharedIndex:
        shared = SharedIndex(str(index), cache_dir=str(tmp_path / "cache"), tokenize=tokenize,
                             embedder=embedder.model_id, exact_limit=limit)  # fmt: skip
        shared.load()
        return shared

    graph, exact = attach(100), attach(10**9)
    hidden = [f"/p{i // 500}/f{i:04d}.txt" for i in range(0, 2000, 3)]
    graph.hide(hidden)
    exact.hide(hidden)
    assert all(s.shard is not None and s.shard._graph is not None for s in graph.sources)
    recalls = []
    for query in ("kernel socket", "memory thread signal", "omega", "quokka zebra tau", "copy move list"):
        q = embedder([query])[0]
        got = graph.vector_search(q, 10)
        want = exact.vector_search(q, 10)
        assert not {h["id"] for h in got} & set(hidden)
        recalls.append(len({h["id"] for h in got} & {h["id"] for h in want}) / 10)
        one = [h["id"] for h in exact.vector_search(q, 10, {"id": want[3]["id"]})]
        assert one == [want[3]["id"]] and graph.vector_search(q, 10, {"id": want[3]["id"]})[0]["id"] == one[0]
    assert sum(recalls) / len(recalls) >= 0.9, recalls


# -- building ---------------------------------------------------------------------------------


def test_rebuilds_keep_or_remake_shards_as_the_embedder_asks(tmp_path: Path) -> None:
    """Same embedder: every segment kept. Another embedder, or none: every segment built
    again. Failed embeddings are reported, and their task is built again next time."""
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    _write(bucket, _corpus(8, 30))
    first = build_index(str(bucket), str(index), embedder=HashingEmbedder(DIM), objects_per_task=10)
    again = build_index(str(bucket), str(index), embedder=HashingEmbedder(DIM), objects_per_task=10)
    assert again.built == 0 and again.reused == first.built
    other = build_index(str(bucket), str(index), embedder=HashingEmbedder(32), objects_per_task=10)
    assert other.reused == 0 and other.embedder == "agentvfs-hashing-32"
    none = build_index(str(bucket), str(index), objects_per_task=10)
    assert none.reused == 0 and none.embedder is None
    cache = tmp_path / "cache"
    from agentvfs.search._bulk import fetch_segment

    assert all(fetch_segment(str(index), ref, cache).vector_info is None for ref in read_manifest(str(index)).segments)
    (bucket / "d0" / "omega.txt").write_bytes(b"omega omega\n")
    picky = build_index(str(bucket), str(index), embedder=_Picky(), objects_per_task=10)
    assert picky.embed_failed >= 1 and sum(t.embed_failed for t in picky.tasks) == picky.embed_failed
    healed = build_index(str(bucket), str(index), embedder=_Picky(fail=False), objects_per_task=10)
    failed_before = {t.label for t in picky.tasks if t.embed_failed}
    rebuilt = {t.label for t in healed.tasks if not t.reused}
    assert rebuilt == failed_before and healed.embed_failed == 0


def test_the_cli_builds_vectors_and_refuses_a_bad_embedder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bucket, index = tmp_path / "bucket", str(tmp_path / "index")
    _write(bucket, _corpus(9, 6))
    assert main(["index", str(bucket), "--out", index, "--embedder", "hashing:32", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["embedder"] == "agentvfs-hashing-32"
    assert read_manifest(index).embedder == "agentvfs-hashing-32"
    for spec, why in (
        ("hashing:x", "is not a number"),
        ("nomodule", "expected 'hashing'"),
        ("agentvfs_no_such_module:f", "No module named"),
        ("json:nothing_here", "has no attribute"),
        ("json:__doc__", "not an embedder"),
    ):
        assert main(["index", str(bucket), "--out", index, "--embedder", spec]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.s3
@pytest.mark.anyio
async def test_a_bucket_index_with_vectors_serves_a_workspace_on_s3(moto: MotoServer, tmp_path: Path) -> None:
    """Published to moto S3, fetched into the agent's cache: its vector hits come from the
    shards (the agent indexed nothing itself)."""
    import fsspec

    from agentvfs import FsspecFilesystem

    prefix = unique("shards")
    client = moto.boto3_client()
    files = _corpus(12, 20)
    for rel, raw in files.items():
        client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/src/{rel}", Body=raw)
    options = {"endpoint_url": moto.endpoint_url, "key": "testing", "secret": "testing"}
    source, index = f"s3://{S3_BUCKET}/{prefix}/src", f"s3://{S3_BUCKET}/{prefix}/index"
    embedder = HashingEmbedder(DIM)
    build_index(source, index, storage_options=options, index_storage_options=options, embedder=embedder)
    raw_fs = fsspec.filesystem("s3", **options, use_listings_cache=False, skip_instance_cache=True)
    ws = Workspace(
        filesystem=FsspecFilesystem(raw_fs, root=f"{S3_BUCKET}/{prefix}/src"),
        bm25=True, vector_store=HnswVectorStore(), embedder=embedder, auto_index_paths=["/"],
        index_dir=str(tmp_path / "agent"), search_index_url=index,
        search_index_options={"storage_options": options, "cache_dir": str(tmp_path / "segments")},
    )  # fmt: skip
    async with ws:
        got = [(r.id, r.score) for r in await ws.search("kernel socket", mode="vector", top_k=200)]
        want = await _reference({f"/{rel}": raw for rel, raw in files.items()}, embedder, "kernel socket", 200)
        _same_ranking(got, want)


def test_an_embedder_of_too_many_dimensions_is_refused_when_the_segment_is_built() -> None:
    def huge(text: str) -> list[float]:
        return [1.0] * ((1 << 16) + 1)

    with pytest.raises(ValueError, match="65537 dimensions; a segment holds at most 65536"):
        build_segment([SourceFile("/a.txt", b"alpha", 5)], embedder=huge)


@pytest.mark.anyio
async def test_destroy_waits_for_a_refresh_under_way_and_starts_no_more(tmp_path: Path) -> None:
    bucket, index = tmp_path / "bucket", tmp_path / "index"
    _write(bucket, _corpus(2, 8))
    build_index(str(bucket), str(index))
    ws = Workspace(
        filesystem=LocalFilesystem(bucket), bm25=True, auto_index_paths=["."], index_dir=str(tmp_path / "a"),
        search_index_url=str(index), search_index_options={"cache_dir": str(tmp_path / "c"), "refresh_interval": 0},
    )  # fmt: skip
    await ws.init()
    shared = ws._search.shared  # type: ignore[union-attr]
    assert shared is not None
    await ws.search("kernel", top_k=3)  # starts a look for a newer manifest in the background
    thread = shared._thread
    assert thread is not None
    await ws.destroy()
    assert not thread.is_alive()
    shared.maybe_refresh()
    assert shared._thread is thread  # closed: no new refresh
