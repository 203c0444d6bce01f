"""Search through the Workspace: the reference's checks 45-49, the search tools, persistence
and change detection across Workspace instances, auto-reindexing, and bad input; on memory,
local and S3 backends, under asyncio and trio."""

from __future__ import annotations

import errno
import logging
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, LocalSandbox, Workspace, WorkspaceError
from agentvfs.errors import (
    EmbeddingError,
    SearchIndexError,
    SearchNotAvailableError,
    WorkspaceNotReadyError,
)
from agentvfs.search import _workspace as search_workspace
from agentvfs.search._embedders import HashingEmbedder
from agentvfs.search._engine import Document, Fusion, SearchEngine
from agentvfs.testing._attacks_tools import peak_rss_growth
from agentvfs.vfs import WorkspaceFilesystem, WrapperFilesystem
from conftest import BACKENDS, harness_for

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


DOCS = {
    "doc1.txt": "The quick brown fox jumps over the lazy dog",
    "doc2.txt": "A lazy cat sleeps all day\nlazy lazy",
    "doc3.txt": "Line 1 introduction\nLine 2 has machine learning\nLine 3 conclusion",
}


class DotStore:
    """A minimal user vector store: exact dot product over what was upserted (the
    reference's golden uses one), recording every query."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[list[float], dict[str, Any]]] = {}
        self.queries: list[dict[str, Any]] = []
        self.created: list[tuple[str, int]] = []

    async def create_index(self, index_name: str, dimension: int, metric: str = "cosine") -> None:
        self.created.append((index_name, dimension))

    async def upsert(self, index_name: str, vectors: Sequence[Sequence[float]], metadata: Sequence[dict[str, Any]], ids: Sequence[str]) -> list[str]:
        for id, vector, meta in zip(ids, vectors, metadata, strict=True):
            self.rows[id] = (list(vector), dict(meta))
        return list(ids)

    async def query(self, index_name: str, query_vector: Sequence[float], top_k: int = 10, filter: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.queries.append({"index_name": index_name, "top_k": top_k, "filter": filter})
        ranked = sorted(
            ((sum(a * b for a, b in zip(v, query_vector, strict=True)), id, m) for id, (v, m) in self.rows.items()),
            key=lambda row: row[0],
            reverse=True,
        )
        return [{"id": id, "score": score, "metadata": m} for score, id, m in ranked[:top_k]]

    async def delete_vector(self, index_name: str, id: str) -> None:
        self.rows.pop(id, None)

    async def delete_vectors(self, index_name: str, filter: dict[str, Any]) -> int:
        ((key, value),) = filter.items()
        gone = [i for i, (_, m) in self.rows.items() if m.get(key) == value]
        for i in gone:
            del self.rows[i]
        return len(gone)


def animal_embedder(text: str) -> list[float]:
    words = text.lower().split()
    return [float("cat" in words), float("dog" in words), float("fox" in words)]


class CountingEmbedder(HashingEmbedder):
    def __init__(self, model: str = "counting-1") -> None:
        super().__init__(64)
        self.model_id = model
        self.texts: list[str] = []

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return super().__call__(texts)


# -- checks 45-47 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_check_45_bm25_numbers_min_score_and_missing_vector_config(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ws = Workspace(filesystem=harness_for(backend, request, tmp_path).fs, bm25=True)
    async with ws:
        for path, text in DOCS.items():
            await ws.index(path, text)
        lazy = await ws.search("lazy")
        assert [r.id for r in lazy] == ["doc2.txt", "doc1.txt"]
        assert [r.score for r in lazy] == pytest.approx([0.783339382076226, 0.4700036292457356], abs=1e-9)
        assert lazy[1].score == pytest.approx(math.log(1.6), abs=1e-12)
        assert lazy[0].line_range == (1, 2)
        assert lazy[0].score_details == {"bm25": lazy[0].score}
        ml = await ws.search("machine learning")
        assert [(r.id, round(r.score, 12)) for r in ml] == [("doc3.txt", round(1.9616585060234528, 12))]
        assert ml[0].line_range == (2, 2)
        assert await ws.search("lazy", min_score=1) == []
        with pytest.raises(ValueError, match=r"^Vector search requires vector configuration\.$"):
            await ws.search("x", mode="vector")
        with pytest.raises(ValueError, match=r"^Hybrid search requires both vector and BM25 configuration\.$"):
            await ws.search("x", mode="hybrid")
        assert (ws.can_bm25, ws.can_vector, ws.can_hybrid) == (True, False, False)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_check_46_search_and_index_tools_on_a_bm25_workspace(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ws = Workspace(filesystem=harness_for(backend, request, tmp_path).fs, bm25=True)
    async with ws:
        tools = await ws.create_tools()
        names = list(tools)
        assert names.index("mastra_workspace_grep") < names.index("mastra_workspace_search") < names.index("mastra_workspace_index")
        search = tools["mastra_workspace_search"]
        assert search.input_schema["properties"]["mode"]["enum"] == ["bm25"]
        for path, text in DOCS.items():
            assert await tools["mastra_workspace_index"].execute({"path": path, "content": text}) == f"Indexed {path}"
        out = await search.execute({"query": "lazy", "mode": "hybrid"})
        assert out == (
            "doc2.txt:1-2: A lazy cat sleeps all day\nlazy lazy\n"
            "doc1.txt:1-1: The quick brown fox jumps over the lazy dog\n---\n2 results (bm25 search)"
        )
        assert await search.execute({"query": "zebra"}) == "---\n0 results (bm25 search)"
        assert await search.execute({"query": "machine", "topK": 1}) == (
            "doc3.txt:2-2: Line 1 introduction\nLine 2 has machine learning\nLine 3 conclusion\n---\n1 result (bm25 search)"
        )
        await tools["mastra_workspace_index"].execute({"path": "x.md", "content": "zebra stripes", "metadata": {"kind": "note"}})
        (hit,) = await ws.search("zebra")
        assert (hit.id, hit.metadata) == ("x.md", {"kind": "note"})
        with pytest.raises(ValueError, match="mode"):
            await search.execute({"query": "x", "mode": "fuzzy"})


async def test_index_tool_is_dropped_on_a_read_only_filesystem(tmp_path: Path) -> None:
    ws = Workspace(filesystem=LocalFilesystem(tmp_path, read_only=True), bm25=True)
    tools = await ws.create_tools()
    assert "mastra_workspace_search" in tools
    assert "mastra_workspace_index" not in tools
    await ws.destroy()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_check_47_hybrid_fusion_and_the_filter_the_store_receives(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = DotStore()
    fs = harness_for(backend, request, tmp_path).fs
    ws = Workspace(filesystem=fs, bm25=True, vector_store=store, embedder=animal_embedder)
    async with ws:
        await ws.index("d1", "The quick brown fox jumps over the lazy dog")
        await ws.index("d2", "cat sleeps all day long")
        await ws.index("d3", "cat cat cat")
        results = await ws.search("cat")
        assert [r.id for r in results] == ["d3", "d2", "d1"]
        assert [r.score for r in results] == pytest.approx([1.0, 0.5, 0.0])
        assert results[0].score_details["vector"] == 1.0
        assert results[0].score_details["bm25"] == pytest.approx(0.870, abs=1e-3)
        assert results[1].score_details["bm25"] == pytest.approx(0.470, abs=1e-3)
        assert results[2].score_details == {"vector": 0.0}
        assert store.queries[-1] == {"index_name": ws._search_index_name, "top_k": 20, "filter": {"skill_scope": {"$exists": False}}}
        await ws.search("cat", filter={"kind": "x"}, top_k=3)
        assert store.queries[-1]["filter"] == {"$and": [{"kind": "x"}, {"skill_scope": {"$exists": False}}]}
        assert store.queries[-1]["top_k"] == 6
        vector_only = await ws.search("cat", mode="vector", top_k=2)
        assert [(r.id, r.score_details) for r in vector_only] == [("d2", {"vector": 1.0}), ("d3", {"vector": 1.0})] or [
            (r.id, r.score_details) for r in vector_only
        ] == [("d3", {"vector": 1.0}), ("d2", {"vector": 1.0})]


async def test_other_fusions_are_options(tmp_path: Path) -> None:
    from agentvfs.search._bm25 import BM25Index

    fusions: tuple[Fusion, ...] = ("minmax", "rrf")
    for fusion in fusions:
        store = DotStore()
        engine = SearchEngine(bm25=BM25Index(), vector_store=store, embedder=animal_embedder, fusion=fusion)
        for id, text in (("d1", "the dog and the fox"), ("d2", "one cat naps"), ("d3", "cat cat cat")):
            await engine.index(Document(id, text))
        results = {r.id: r.score for r in await engine.search("cat", mode="hybrid")}
        if fusion == "minmax":
            # vectors d2 = d3 = 1 -> 1, d1 0; BM25 d3 -> 1, d2 -> 0
            assert results == pytest.approx({"d3": 1.0, "d2": 0.5, "d1": 0.0})
        else:
            # vector ranks d2, d3, d1; BM25 ranks d3, d2
            assert results == pytest.approx({"d2": 0.5 / 61 + 0.5 / 62, "d3": 0.5 / 62 + 0.5 / 61, "d1": 0.5 / 63})
        await engine.close()
    with pytest.raises(ValueError, match="fusion"):
        SearchEngine(fusion="best")  # type: ignore[arg-type]


# -- check 49 on every backend --------------------------------------------------------------------------


def _big_file() -> str:
    lines = [f"line {i:03d} of the big file, some words here".ljust(38, ".") for i in range(300)]
    lines[250] = "this line has the needle in it".ljust(38, ".")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_check_49_auto_index_chunks_a_long_file(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    harness = harness_for(backend, request, tmp_path)
    fs = harness.fs
    await fs.write_file("big.txt", _big_file())
    await fs.write_file("docs/readme.txt", "a short readme about pandas")
    await fs.write_file("docs/skip.bin", b"\xff\xfe\x00binary")
    ws = Workspace(filesystem=fs, bm25=True, auto_index_paths=["big.txt", "docs"])
    async with ws:
        (hit,) = await ws.search("needle")
        assert hit.id == "big.txt#chunk-2"
        assert hit.line_range == (251, 251)
        assert hit.metadata == {"source_file": "big.txt"}
        (readme,) = await ws.search("pandas")
        assert readme.id == "docs/readme.txt"
        engine = await ws._search.engine()  # type: ignore[union-attr]
        assert "docs/skip.bin" in engine.ids()  # not UTF-8: read with U+FFFD, indexed all the same
        # rebuild_search_index with explicit paths replaces what was indexed
        await ws.rebuild_search_index(["docs/readme.txt"])
        assert await ws.search("needle") == []
        assert [r.id for r in await ws.search("pandas")] == ["docs/readme.txt"]


async def test_glob_patterns_keep_the_given_prefix(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    await fs.write_file("docs/a.md", "alpha topic")
    await fs.write_file("docs/sub/b.md", "beta topic")
    await fs.write_file("docs/c.txt", "gamma topic")
    ws = Workspace(filesystem=fs, bm25=True, auto_index_paths=["./docs/**/*.md"])
    async with ws:
        assert sorted(r.id for r in await ws.search("topic")) == ["./docs/a.md", "./docs/sub/b.md"]


# -- persistence and change detection --------------------------------------------------------------------


async def test_a_new_workspace_on_the_same_index_dir_reindexes_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "files"
    base.mkdir()
    for i in range(20):
        (base / f"f{i:02d}.txt").write_text(f"file number {i} talks about topic{i}\n")
    index_dir = tmp_path / "index"
    reads: list[str] = []
    original = search_workspace.read_many  # type: ignore[attr-defined]

    async def counting_read_many(fs: WorkspaceFilesystem, paths: Sequence[str], **kw: Any) -> Any:
        reads.extend(paths)
        return await original(fs, paths, **kw)

    monkeypatch.setattr(search_workspace, "read_many", counting_read_many)
    embedder = CountingEmbedder()
    store = DotStore()

    def make() -> Workspace:
        return Workspace(
            filesystem=LocalFilesystem(base),
            bm25=True,
            vector_store=store,
            embedder=embedder,
            auto_index_paths=["."],
            index_dir=str(index_dir),
        )

    async with make() as first:
        assert len(await first.search("file", mode="bm25", top_k=50)) == 20
    assert len(reads) == 20
    assert len(embedder.texts) == 20
    assert (index_dir / "search.duckdb").exists()

    # Between the two: one file changed, one removed, one added, one touched without change.
    (base / "f03.txt").write_text("file number 3 now talks about zebras\n")
    (base / "f07.txt").unlink()
    (base / "new.txt").write_text("a new file about giraffes\n")
    os.utime(base / "f09.txt", (1_000_000_000, 1_000_000_000))
    reads.clear()
    embedder.texts.clear()
    async with make() as second:
        assert sorted(reads) == ["f03.txt", "f09.txt", "new.txt"]  # only size/mtime changes are read
        assert sorted(embedder.texts) == ["a new file about giraffes\n", "file number 3 now talks about zebras\n"]
        assert [r.id for r in await second.search("zebras", mode="bm25")] == ["f03.txt"]
        assert [r.id for r in await second.search("giraffes", mode="bm25")] == ["new.txt"]
        assert await second.search("topic7", mode="bm25") == []
        assert len(await second.search("file", mode="bm25", top_k=50)) == 20
        assert "f07.txt" not in store.rows

    # A different embedding model: everything is embedded again.
    embedder2 = CountingEmbedder("counting-2")
    async with Workspace(
        filesystem=LocalFilesystem(base), bm25=True, vector_store=DotStore(), embedder=embedder2,
        auto_index_paths=["."], index_dir=str(index_dir),
    ):  # fmt: skip
        assert len(embedder2.texts) == 20


async def test_the_embedding_cache_keeps_vectors_exactly_and_reads_an_older_index(tmp_path: Path) -> None:
    """Vectors come back bit for bit (kept as float64 bytes, thousands in one statement), and
    an index written when they were kept as DOUBLE[] in agentvfs_embeddings is still read."""
    ws = Workspace(
        filesystem=LocalFilesystem(tmp_path / "f"), bm25=True, vector_store=DotStore(),
        embedder=CountingEmbedder(), index_dir=str(tmp_path / "idx"),
    )  # fmt: skip
    async with ws:
        search = ws._search
        assert search is not None
        await search.engine()
        rng = random.Random(3)
        vectors = {f"d{i}": [rng.uniform(-1, 1), 1 / 3, -0.0, 1e-300, float(i)] for i in range(3000)}
        search.put_embeddings("m", vectors)
        got = search.get_embeddings("m", [*vectors, "missing"])
        assert got == vectors and all(math.copysign(1, v[2]) == -1 for v in got.values())
        assert search.get_embeddings("other-model", ["d1"]) == {}
        store = search._store
        assert store is not None
        with store.transaction() as cur:
            cur.execute(
                "CREATE TABLE agentvfs_embeddings (digest VARCHAR, model VARCHAR, vector DOUBLE[], "
                "PRIMARY KEY (digest, model))"
            )
            cur.execute("INSERT INTO agentvfs_embeddings VALUES ('old', 'm', [0.5, 0.25]), ('d1', 'm', [9.0])")
        assert search.get_embeddings("m", ["old", "d1"]) == {"old": [0.5, 0.25], "d1": vectors["d1"]}


async def test_destroy_keeps_a_persistent_index_and_drops_an_in_memory_one(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path / "f")
    ws = Workspace(filesystem=fs, bm25=True, index_dir=str(tmp_path / "idx"))
    await ws.init()
    await ws.index("a", "persistent words")
    await ws.destroy()
    with pytest.raises(WorkspaceNotReadyError, match=r"Workspace is not ready \(status: destroyed\)"):
        await ws.index("a", "b")
    again = Workspace(filesystem=fs, bm25=True, index_dir=str(tmp_path / "idx"))
    async with again:
        assert [r.id for r in await again.search("persistent")] == ["a"]
    memory = Workspace(filesystem=fs, bm25=True)
    async with memory:
        await memory.index("a", "gone words")
    assert await memory.search("gone") == []


async def test_corrupt_index_file_is_a_clear_error_and_is_kept(tmp_path: Path) -> None:
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    garbage = b"this is not a database" * 100
    (index_dir / "search.duckdb").write_bytes(garbage)
    ws = Workspace(filesystem=LocalFilesystem(tmp_path / "f"), bm25=True, index_dir=str(index_dir), auto_index_paths=["."])
    with pytest.raises(SearchIndexError, match=r"search\.duckdb") as caught:
        await ws.init()
    assert "Move it away or delete it" in str(caught.value)
    assert (index_dir / "search.duckdb").read_bytes() == garbage
    await ws.destroy()


@pytest.mark.s3
async def test_read_only_bucket_is_searchable_with_a_local_index(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    harness = harness_for("s3", request, tmp_path)
    await harness.fs.write_file("notes/a.txt", "kangaroo facts")
    assert isinstance(harness.fs, FsspecFilesystem)
    ro = FsspecFilesystem(harness.fs.fs, root=harness.fs.root, read_only=True)
    ws = Workspace(filesystem=ro, bm25=True, auto_index_paths=["notes"], index_dir=str(tmp_path / "idx"))
    async with ws:
        assert [r.id for r in await ws.search("kangaroo")] == ["notes/a.txt"]
        assert "mastra_workspace_index" not in await ws.create_tools()


async def test_default_index_dir_is_beside_the_sandbox_mounts(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    sandbox = LocalSandbox(working_directory=str(wd))
    ws = Workspace(sandbox=sandbox, mounts={"/data": LocalFilesystem(tmp_path / "data")}, bm25=True)
    assert ws.index_dir == str(wd / ".agentvfs")
    assert Workspace(filesystem=LocalFilesystem(tmp_path), bm25=True).index_dir is None
    await ws.destroy()


# -- auto_reindex ---------------------------------------------------------------------------------------------


async def test_auto_reindex_keeps_indexed_paths_fresh(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    await fs.write_file("n.txt", "old words")
    await fs.write_file("other.txt", "unindexed")
    ws = Workspace(filesystem=fs, bm25=True, auto_index_paths=["n.txt"], tools={"auto_reindex": True})
    async with ws:
        tools = await ws.create_tools()
        await tools["mastra_workspace_write_file"].execute({"path": "n.txt", "content": "fresh words"})
        assert [r.id for r in await ws.search("fresh")] == ["n.txt"]
        assert await ws.search("old") == []
        await tools["mastra_workspace_read_file"].execute({"path": "n.txt"})
        await tools["mastra_workspace_edit_file"].execute({"path": "n.txt", "old_string": "fresh", "new_string": "edited"})
        assert [r.id for r in await ws.search("edited")] == ["n.txt"]
        await tools["mastra_workspace_write_file"].execute({"path": "other.txt", "content": "still unindexed"})
        assert await ws.search("still") == []  # only indexed paths are kept fresh
        await tools["mastra_workspace_delete"].execute({"path": "n.txt"})
        assert await ws.search("edited") == []


async def test_refresh_index_after_a_write_outside_the_tools(tmp_path: Path) -> None:
    """An adapter writes through the filesystem, then asks the workspace to keep search
    current: the indexed path is read again, a removed one dropped, others left out."""
    fs = LocalFilesystem(tmp_path)
    await fs.write_file("n.txt", "old words")
    ws = Workspace(filesystem=fs, bm25=True, auto_index_paths=["n.txt"], tools={"auto_reindex": True})
    async with ws:
        await fs.write_file("n.txt", "fresh words")
        assert [r.id for r in await ws.search("old")] == ["n.txt"]  # not yet told
        await ws.refresh_index("n.txt")
        assert [r.id for r in await ws.search("fresh")] == ["n.txt"]
        assert await ws.search("old") == []
        await fs.write_file("new.txt", "fresh too")
        await ws.refresh_index("new.txt")
        assert [r.id for r in await ws.search("fresh")] == ["n.txt"]
        await fs.delete_file("n.txt")
        await ws.refresh_index("n.txt", removed=True)
        assert await ws.search("fresh") == []
    plain = Workspace(filesystem=fs, bm25=True, auto_index_paths=["new.txt"])
    async with plain:
        await fs.write_file("new.txt", "changed")
        await plain.refresh_index("new.txt")  # no auto_reindex: the index is left alone
        assert [r.id for r in await plain.search("fresh")] == ["new.txt"]


async def test_without_auto_reindex_writes_leave_the_index_alone(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    await fs.write_file("n.txt", "old words")
    ws = Workspace(filesystem=fs, bm25=True, auto_index_paths=["n.txt"])
    async with ws:
        tools = await ws.create_tools()
        await tools["mastra_workspace_write_file"].execute({"path": "n.txt", "content": "fresh words"})
        assert [r.id for r in await ws.search("old")] == ["n.txt"]
    with pytest.raises(ValueError, match="auto_reindex"):
        await Workspace(filesystem=fs, tools={"auto_reindex": "yes"}).create_tools()


# -- bad input ---------------------------------------------------------------------------------------------------


async def test_bad_queries(tmp_path: Path) -> None:
    ws = Workspace(filesystem=LocalFilesystem(tmp_path), bm25=True)
    async with ws:
        await ws.index("a", "some content about the ocean")
        assert await ws.search("") == []
        assert await ws.search("the a an of") == []
        huge = ("ocean " * 200_000)[:1_000_000]
        (hit,) = await ws.search(huge)
        assert hit.id == "a"
        with pytest.raises(ValueError, match="top_k"):
            await ws.search("ocean", top_k=0)
        with pytest.raises(TypeError, match="content"):
            await ws.index("b", b"bytes")  # type: ignore[arg-type]


async def test_embedder_failures_are_reported_and_do_not_stop_others(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def picky(text: str) -> list[float]:
        if "poison" in text:
            raise RuntimeError("cannot embed poison")
        if "nan" in text:
            return [float("nan"), 1.0, 0.0]
        if "short" in text:
            return [1.0]
        return animal_embedder(text)

    fs = LocalFilesystem(tmp_path)
    await fs.write_file("good.txt", "a cat")
    await fs.write_file("bad.txt", "poison cat")
    ws = Workspace(filesystem=fs, bm25=True, vector_store=DotStore(), embedder=picky, auto_index_paths=["."])
    with caplog.at_level(logging.WARNING, logger="agentvfs.search"):
        async with ws:
            assert 'Failed to index file "bad.txt" for search' in caplog.text
            assert "cannot embed poison" in caplog.text
            assert [r.id for r in await ws.search("cat", mode="vector")] == ["good.txt"]
            with pytest.raises(EmbeddingError, match="NaN"):
                await ws.index("n", "nan here")
            with pytest.raises(EmbeddingError, match="1 dimensions, expected 3"):
                await ws.index("s", "short one")


async def test_search_config_errors() -> None:
    with pytest.raises(WorkspaceError, match="vector_store requires an embedder") as caught:
        Workspace(filesystem=LocalFilesystem("/tmp"), vector_store=DotStore())
    assert caught.value.code == "INVALID_SEARCH_CONFIG"
    with pytest.raises(WorkspaceError, match="unknown parameter 'k2'"):
        Workspace(filesystem=LocalFilesystem("/tmp"), bm25={"k2": 1})
    with pytest.raises(WorkspaceError, match="Invalid search_index_name"):
        Workspace(filesystem=LocalFilesystem("/tmp"), vector_store=DotStore(), embedder=animal_embedder, search_index_name="1abc")
    with pytest.raises(SearchNotAvailableError):
        await Workspace(filesystem=LocalFilesystem("/tmp")).search("x")


async def test_hnsw_vectors_persist_beside_the_index(tmp_path: Path) -> None:
    from agentvfs import HnswVectorStore

    base = tmp_path / "files"
    base.mkdir()
    (base / "a.txt").write_text("penguins live in the antarctic")
    (base / "b.txt").write_text("camels cross the desert")
    embedder = CountingEmbedder()

    def make() -> Workspace:
        return Workspace(
            filesystem=LocalFilesystem(base), bm25=True, vector_store=HnswVectorStore(), embedder=embedder,
            auto_index_paths=["."], index_dir=str(tmp_path / "idx"),
        )  # fmt: skip

    async with make():
        pass
    assert embedder.texts and (tmp_path / "idx" / "vectors").is_dir()
    embedder.texts.clear()
    async with make() as again:
        hits = await again.search("penguins antarctic", mode="vector", top_k=1)
        assert [h.id for h in hits] == ["a.txt"]
    assert embedder.texts == ["penguins antarctic"]  # only the query: no file embedded again


# -- a size limit per file, held on the file read ------------------------------------------------------


def sparse(path: Path, size: int, head: bytes) -> Path:
    """A file of ``size`` bytes that takes no disk space but ``head``."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


async def test_files_over_max_file_bytes_are_not_indexed_even_when_swapped_in_after_listing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "small.md").write_text("small words\n")
    (docs / "grown.md").write_text("grown words\n")
    sparse(docs / "listed.md", 32 << 20, b"listed words\n")  # listed larger than the limit: never read
    (docs / "swapped.md").write_text("swapped words\n")
    huge = sparse(tmp_path / "huge.bin", 1 << 30, b"huge words\n")

    class SwapAfterListing(LocalFilesystem):
        """The listing (sizes) shows swapped.md as 14 bytes; the read meets 1 GiB."""

        async def walk_stats(self, path: str = "", *, max_depth: int | None = None) -> Any:
            stats = await super().walk_stats(path, max_depth=max_depth)
            if huge.exists():
                os.replace(huge, docs / "swapped.md")
            return stats

    fs = SwapAfterListing(tmp_path)
    search = search_workspace.WorkspaceSearch(bm25=True)
    assert search.max_file_bytes == search_workspace.MAX_INDEX_FILE_BYTES == 16 << 20
    with caplog.at_level(logging.WARNING, "agentvfs.search"), peak_rss_growth() as growth:
        counts = await search.sync(fs, ["docs"])
    assert counts == {"indexed": 2, "unchanged": 0, "removed": 0, "failed": 0, "too_large": 2, "unlisted": []}
    assert growth[0] < 64 << 20, growth[0]
    assert sorted(r.id for r in await search.search("words", mode="bm25")) == ["docs/grown.md", "docs/small.md"]
    for name in ("listed.md", "swapped.md"):
        assert (
            f'Not indexing "docs/{name}" for search: it is larger than {16 << 20} bytes (max_file_bytes of the '
            "search index); split it, or raise max_file_bytes to index it"
        ) in caplog.text
    # A file indexed before and grown past the limit since leaves the index.
    os.truncate(docs / "grown.md", 32 << 20)
    counts = await search.sync(fs, ["docs"])
    assert counts == {"indexed": 0, "unchanged": 1, "removed": 0, "failed": 0, "too_large": 3, "unlisted": []}
    assert [r.id for r in await search.search("words", mode="bm25")] == ["docs/small.md"]
    # The limit is an option.
    narrow = search_workspace.WorkspaceSearch(bm25=True, max_file_bytes=8)
    assert (await narrow.sync(LocalFilesystem(tmp_path), ["docs"]))["too_large"] == 4
    with pytest.raises(ValueError, match="max_file_bytes must be a positive number of bytes, got 0"):
        search_workspace.WorkspaceSearch(bm25=True, max_file_bytes=0)


async def test_indexing_holds_a_bounded_round_of_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} words\n" * 100)
    monkeypatch.setattr(search_workspace, "ROUND_BYTES", 3000)
    committed: list[int] = []
    original = search_workspace.WorkspaceSearch._commit

    async def counting(
        self: Any, engine: Any, docs: list[Document], sources: dict[str, Any], replacing: list[str]
    ) -> int:
        committed.append(len(sources))
        return await original(self, engine, docs, sources, replacing)

    monkeypatch.setattr(search_workspace.WorkspaceSearch, "_commit", counting)
    search = search_workspace.WorkspaceSearch(bm25=True)
    counts = await search.sync(LocalFilesystem(tmp_path), ["."])
    assert counts["indexed"] == 40
    # Each round of reads (8 files of about 1.5 KB) passes 3000 bytes: indexed before the next
    # is, while the next is read (nothing is left for a last round).
    assert committed == [8] * 5
    assert len(await search.search("words", mode="bm25", top_k=50)) == 40


async def test_a_round_is_indexed_while_the_next_is_read_one_at_a_time_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} words\n" * 100)
    monkeypatch.setattr(search_workspace, "ROUND_BYTES", 3000)
    events: list[str] = []
    original = search_workspace.WorkspaceSearch._commit
    running = 0

    async def slow(
        self: Any, engine: Any, docs: list[Document], sources: dict[str, Any], replacing: list[str]
    ) -> int:
        nonlocal running
        running += 1
        assert running == 1, "two rounds indexed at once"
        first = min(sources)
        events.append(f"commit {first}")
        await anyio.sleep(0.05)  # meanwhile the next round is read
        try:
            return await original(self, engine, docs, sources, replacing)
        finally:
            events.append(f"done {first}")
            running -= 1

    real_read_many = search_workspace.read_many  # type: ignore[attr-defined]

    async def reading(fs: Any, paths: list[str], **kwargs: Any) -> Any:
        events.append(f"read {min(paths)}")
        return await real_read_many(fs, paths, **kwargs)

    monkeypatch.setattr(search_workspace.WorkspaceSearch, "_commit", slow)
    monkeypatch.setattr(search_workspace, "read_many", reading)
    search = search_workspace.WorkspaceSearch(bm25=True)
    counts = await search.sync(LocalFilesystem(tmp_path), ["."])
    assert (counts["indexed"], counts["failed"]) == (40, 0)
    commits = [e for e in events if e.startswith("commit")]
    assert commits == sorted(commits) and len(commits) == 5  # in order
    # Each round was read before the one before it was done indexing.
    for before, after in (("f00", "f08"), ("f08", "f16"), ("f16", "f24"), ("f24", "f32")):
        assert events.index(f"read {after}.txt") < events.index(f"done {before}.txt")
    assert len(await search.search("words", mode="bm25", top_k=50)) == 40


async def test_an_error_recording_a_round_is_raised_as_itself_after_the_round_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} words\n" * 100)
    monkeypatch.setattr(search_workspace, "ROUND_BYTES", 3000)
    search = search_workspace.WorkspaceSearch(bm25=True, index_dir=str(tmp_path / "index"))
    original = search.__class__._save_sources
    saved: list[int] = []

    def failing(self: Any, sources: dict[str, Any]) -> None:
        if len(saved) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        saved.append(len(sources))
        original(self, sources)

    monkeypatch.setattr(search.__class__, "_save_sources", failing)
    with pytest.raises(OSError, match="No space left") as caught:
        await search.sync(LocalFilesystem(tmp_path), ["."])
    assert type(caught.value) is OSError  # not wrapped in an exception group
    assert saved == [8]  # the first round was recorded, the second failed, no third began
    await search.close()


# -- a storage outage during the sync at init() ---------------------------------------------------------


class ListingOutage(WrapperFilesystem):
    """Storage whose listings fail (as in an outage) while ``down`` is set; reads still work."""

    down = False

    async def _wrap(self, operation: str, call: Any) -> Any:
        if self.down and operation in ("readdir", "walk", "walk_stats", "list_stats", "stat", "exists"):
            raise OSError(errno.EIO, "storage unavailable")
        return await call()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("patterns", [["docs", "notes"], ["**/*.md"]])
async def test_a_listing_outage_at_init_keeps_the_persistent_index(
    backend: str, patterns: list[str], request: pytest.FixtureRequest, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = ListingOutage(harness_for(backend, request, tmp_path).fs)
    await storage.write_file("docs/a.md", "alpha appears in the docs")
    await storage.write_file("notes/b.md", "beta appears in the notes")
    index_dir = str(tmp_path / "index")

    def make() -> Workspace:
        return Workspace(filesystem=storage, bm25=True, auto_index_paths=patterns, index_dir=index_dir)

    first = make()
    assert (await first.init())["search"]["indexed"] == 2
    await first.destroy()

    storage.down = True
    caplog.set_level(logging.WARNING, logger="agentvfs.search")
    second = make()
    report = (await second.init())["search"]
    assert report["removed"] == 0
    assert report["unlisted"] == (["docs", "notes"] if patterns == ["docs", "notes"] else ["."])
    assert any("the files indexed below it are kept" in r.getMessage() for r in caplog.records)
    assert [r.id for r in await second.search("alpha", mode="bm25")] == ["docs/a.md"]
    assert [r.id for r in await second.search("beta", mode="bm25")] == ["notes/b.md"]
    await second.destroy()

    # Storage back, and one directory really gone: only a listing that proves it removes files.
    storage.down = False
    await storage.rmdir("notes", recursive=True)
    third = make()
    report = (await third.init())["search"]
    assert (report["removed"], report["unlisted"]) == (1, [])
    assert await third.search("beta", mode="bm25") == []
    assert [r.id for r in await third.search("alpha", mode="bm25")] == ["docs/a.md"]
    await third.destroy()


async def test_init_without_auto_indexing_reports_nothing() -> None:
    async with Workspace(filesystem=FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/w")) as ws:
        assert await ws.init() == {}


async def test_closing_a_changed_index_writes_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search_workspace, "CHECKPOINT_MIN_DOCS", 10)
    base = tmp_path / "files"
    base.mkdir()
    for i in range(30):
        (base / f"f{i:02d}.txt").write_text(f"file {i} has words about topic{i % 3}\n")
    index_dir = tmp_path / "index"
    checkpoint = index_dir / (search_workspace.INDEX_FILE + ".checkpoint.seg")

    def make() -> Workspace:
        return Workspace(
            filesystem=LocalFilesystem(base), bm25=True, auto_index_paths=["."], index_dir=str(index_dir)
        )

    ws = make()
    await ws.init()
    first = [(r.id, r.score) for r in await ws.search("topic1 words", top_k=30)]
    await ws.destroy()
    assert checkpoint.exists()
    written = checkpoint.stat().st_mtime_ns
    # Unchanged: reopened, searched from the checkpoint, and closed without writing another.
    ws = make()
    assert (await ws.init())["search"]["unchanged"] == 30
    assert [(r.id, r.score) for r in await ws.search("topic1 words", top_k=30)] == first
    await ws.destroy()
    assert checkpoint.stat().st_mtime_ns == written
    # Changed: a new checkpoint at close.
    (base / "f00.txt").write_text("file zero now talks about topic1 only\n")
    ws = make()
    assert (await ws.init())["search"]["indexed"] == 1
    await ws.destroy()
    assert checkpoint.stat().st_mtime_ns != written
    # A bulk index writes it at the end of the sync, before any close.
    monkeypatch.setattr(search_workspace, "CHECKPOINT_AFTER_FILES", 20)
    checkpoint.unlink()
    ws = make()
    await ws.init()
    await ws.rebuild_search_index()
    assert checkpoint.exists()
    await ws.destroy()
