"""The ``search`` suite of ``agentvfs bench``: its corpora, judgements and a tiny run."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.bench import _corpus
from agentvfs.bench import _suite_search as suite
from agentvfs.bench._backends import Backend, BackendSet
from agentvfs.bench._context import SIZES, Context, Progress, SizeProfile
from agentvfs.bench._layers import Harness
from agentvfs.bench._model import Measurement, RunResult

CRANFIELD = Path(os.environ.get("CRANFIELD_DIR", "/work/shared/data/cranfield"))
TIME_CASES = ("index_build", "update", "query")


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[BackendSet]:
    bs = BackendSet(tmp_path)
    yield bs
    bs.close()


def make_ctx(tmp_path: Path, backends: list[Backend], *, size: SizeProfile | None = None, repeat: int = 2,
             warmup: int = 1, cranfield: Path | None = None) -> Context:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return Context(run=RunResult(command="test", started="now", machine={}, config={}), backends=backends,
                   layers={}, size=size or SIZES["tiny"], repeat=repeat, warmup=warmup, harness=Harness(work),
                   progress=Progress(enabled=False), workdir=work, budget=60, cranfield=cranfield)  # fmt: skip


def get(ctx: Context, case: str, backend: str, layer: str) -> Measurement:
    found = [m for m in ctx.run.measurements if (m.case, m.backend, m.layer) == (case, backend, layer)]
    assert len(found) == 1, (case, backend, layer, [(m.case, m.backend, m.layer) for m in ctx.run.measurements])
    return found[0]


def installed_engines() -> list[str]:
    return [layer for layer in suite._ENGINES if suite._missing(layer) is None]


# ------------------------------------------------------------------------------- judging


def test_ndcg_recall_and_reciprocal_rank() -> None:
    gains = {"a": 3, "b": 1}
    assert _corpus.ndcg_recall(["a", "b", "x"], gains) == (1.0, 1.0)
    ndcg, recall = _corpus.ndcg_recall(["x", "b"], gains)
    assert recall == 0.5
    assert ndcg == pytest.approx((1 / 1.584962500721156) / (3 + 1 / 1.584962500721156))
    assert _corpus.ndcg_recall([], gains) == (0.0, 0.0)
    assert _corpus.ndcg_recall(["a"] + ["x"] * 10 + ["b"], gains)[1] == 0.5  # b is at rank 12
    assert _corpus.reciprocal_rank(["x", "y", "a"], {"a": 1}) == pytest.approx(1 / 3)
    assert _corpus.reciprocal_rank(["x"] * 10 + ["a"], {"a": 1}) == 0.0


def test_scores_of_rankings() -> None:
    known = _corpus.Corpus("k", [("a", ""), ("b", "")], ["q1", "q2"], [{"a": 1}, {"b": 1}], False, "")
    assert suite._scores(known, [["a", "b"], ["a"]]) == {"recall@10": 0.5, "mrr@10": 0.5}
    graded = _corpus.Corpus("g", [("a", ""), ("b", "")], ["q"], [{"a": 2}], True, "")
    assert suite._scores(graded, [["a"]]) == {"ndcg@10": 1.0, "recall@10": 1.0}
    with pytest.raises(ValueError, match="no queries"):
        suite._scores(known, [])


# ------------------------------------------------------------------------------- corpora


def test_stdlib_known_item_corpus_is_deterministic() -> None:
    a = _corpus.python_stdlib(40, 15)
    b = _corpus.python_stdlib(40, 15)
    assert a.docs == b.docs and a.queries == b.queries and a.judgements == b.judgements
    assert len(a.docs) == 40 and len(a.queries) == 15 and not a.graded
    assert all(len(t.encode()) <= _corpus.SAMPLE_MAX_BYTES for _, t in a.docs)
    texts = dict(a.docs)
    for query, judged in zip(a.queries, a.judgements, strict=True):
        (doc,) = judged
        assert query in texts[doc]
        # The line identifies its file: no other file of the corpus holds it.
        assert [d for d, t in a.docs if query in {x.strip() for x in t.split("\n")}] == [doc]
    assert "known-item" in a.description and "40" in a.description


@pytest.mark.skipif(not CRANFIELD.exists(), reason=f"the Cranfield collection is not at {CRANFIELD} (set CRANFIELD_DIR)")
def test_cranfield_corpus_and_its_samples() -> None:
    docs, queries, qrels = _corpus.cranfield(CRANFIELD)
    assert len(docs) == 1400 and len(queries) == 225 and set(qrels) <= set(range(1, 226))
    whole = _corpus.load(CRANFIELD)
    assert whole.graded and len(whole.docs) == 1400 and len(whole.queries) == len(qrels)
    part = _corpus.load(CRANFIELD, 200, 10)
    kept = {d for d, _ in part.docs}
    assert len(part.docs) == 200 and len(part.queries) == 10
    assert all(judged and set(judged) <= kept for judged in part.judgements)
    assert "sample" in part.description


# ------------------------------------------------------------------------------- runs


def test_tiny_run_measures_every_engine_on_every_backend(tmp_path: Path, backends: BackendSet) -> None:
    memory, local = backends.open("memory"), backends.open("local")
    ctx = make_ctx(tmp_path, [memory, local])
    suite.run(ctx)
    run = ctx.run
    assert run.problems == []
    corpus = _corpus.python_stdlib(ctx.size.search_docs, ctx.size.search_queries)
    queries = len(corpus.queries)
    assert queries == ctx.size.search_queries
    engines = installed_engines()
    assert suite.OURS_IN_PROCESS in engines and suite.SQLITE in engines
    targets = [(b.name, suite.OURS) for b in (memory, local)] + [(suite.IN_PROCESS, e) for e in engines]
    for backend, layer in targets:
        for case in (*TIME_CASES, "recall@10", "mrr@10"):
            m = get(ctx, case, backend, layer)
            assert m.errors == [], (backend, layer, case, m.errors)
            assert len(m.samples) == ctx.repeat, (backend, layer, case)
            assert m.params == {"corpus": "python-stdlib", "docs": ctx.size.search_docs}
            assert any("known-item" in n for n in m.notes)
            if case in TIME_CASES:
                assert all(s > 0 for s in m.samples)
            else:
                assert all(0.0 <= s <= 1.0 for s in m.samples)
        query = get(ctx, "query", backend, layer)
        assert query.unit == "ms" and len(query.latencies) == ctx.repeat * queries
        assert get(ctx, "index_build", backend, layer).unit == "s"
        assert get(ctx, "recall@10", backend, layer).unit == "score"
        # A known line of a file finds that file: a real bar for the BM25 engines.
        assert (get(ctx, "recall@10", backend, layer).median() or 0) > 0.3, (backend, layer)
    for b in (memory, local):
        assert (get(ctx, "recall@10", b.name, suite.OURS).median() or 0) > 0.6
        update = get(ctx, "update", b.name, suite.OURS)
        assert any("write_file" in n for n in update.notes)
        assert not b.filesystem().exists(f"{b.root}/search-1") and not b.filesystem().exists(f"{b.root}/search-2")
    assert {m.backend for m in run.measurements} == {"memory", "local", suite.IN_PROCESS}
    assert not list(ctx.workdir.glob("search-*")), "scratch index directories left behind"
    if suite.DUCKDB_FTS in engines:
        assert any("rebuild" in n for n in get(ctx, "update", suite.IN_PROCESS, suite.DUCKDB_FTS).notes)


def test_a_missing_engine_is_reported_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = suite._importable
    monkeypatch.setattr(suite, "_importable", lambda module: module != "bm25s" and real(module))
    monkeypatch.setattr(suite, "_ENGINES", {suite.SQLITE: suite._Sqlite, suite.BM25S: suite._Bm25s})
    size = dataclasses.replace(SIZES["tiny"], search_docs=40, search_queries=5)
    ctx = make_ctx(tmp_path, [], size=size)
    suite.run(ctx)
    assert ctx.run.skipped == ["search: bm25s not installed (pip install bm25s)"]
    assert {m.layer for m in ctx.run.measurements} == {suite.SQLITE}
    assert len(get(ctx, "query", suite.IN_PROCESS, suite.SQLITE).samples) == 2


def test_a_failing_engine_is_recorded_and_the_suite_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: suite._Engine, docs: object) -> None:
        raise sqlite3.DatabaseError("disk image is malformed")

    monkeypatch.setattr(suite._Sqlite, "_build", broken)
    monkeypatch.setattr(suite, "_ENGINES", {suite.SQLITE: suite._Sqlite, suite.OURS_IN_PROCESS: suite._OursInProcess})
    size = dataclasses.replace(SIZES["tiny"], search_docs=40, search_queries=5)
    ctx = make_ctx(tmp_path, [], size=size)
    suite.run(ctx)
    build = get(ctx, "index_build", suite.IN_PROCESS, suite.SQLITE)
    assert build.samples == [] and len(build.errors) == 2
    assert "DatabaseError: disk image is malformed" in build.errors[0]
    ours = get(ctx, "query", suite.IN_PROCESS, suite.OURS_IN_PROCESS)
    assert ours.errors == [] and len(ours.samples) == 2
    assert not list(ctx.workdir.glob("search-*"))


def test_keyboard_interrupt_propagates_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(self: suite._Engine, query: str, k: int = 10) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(suite._Sqlite, "search", interrupted)
    monkeypatch.setattr(suite, "_ENGINES", {suite.SQLITE: suite._Sqlite})
    size = dataclasses.replace(SIZES["tiny"], search_docs=40, search_queries=5)
    ctx = make_ctx(tmp_path, [], size=size)
    with pytest.raises(KeyboardInterrupt):
        suite.run(ctx)
    assert not list(ctx.workdir.glob("search-*"))


@pytest.mark.skipif(not CRANFIELD.exists(), reason=f"the Cranfield collection is not at {CRANFIELD} (set CRANFIELD_DIR)")
def test_cranfield_ndcg_of_ours_matches_the_reference(tmp_path: Path, backends: BackendSet,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Only our engine, once, on one backend: the whole collection stays within seconds.
    monkeypatch.setattr(suite, "_ENGINES", {suite.OURS_IN_PROCESS: suite._OursInProcess})
    size = dataclasses.replace(SIZES["tiny"], search_docs=0, search_queries=0)
    ctx = make_ctx(tmp_path, [backends.open("memory")], size=size, repeat=1, warmup=0, cranfield=CRANFIELD)
    suite.run(ctx)
    for backend, layer in (("memory", suite.OURS), (suite.IN_PROCESS, suite.OURS_IN_PROCESS)):
        ndcg = get(ctx, "ndcg@10", backend, layer)
        recall = get(ctx, "recall@10", backend, layer)
        assert ndcg.errors == [] and recall.errors == []
        assert ndcg.params == {"corpus": "cranfield", "docs": 1400}
        # Published BM25 figures on Cranfield (title + text) are near 0.37.
        assert 0.34 <= (ndcg.median() or 0) <= 0.40, (backend, ndcg.samples)
        assert 0.3 <= (recall.median() or 0) <= 0.5
        assert any("Cranfield" in n and "nDCG@10" in n for n in ndcg.notes)
        assert len(get(ctx, "query", backend, layer).latencies) == 225
        assert get(ctx, "update", backend, layer).errors == []
    assert not any(m.case == "mrr@10" for m in ctx.run.measurements)


def test_without_peers_only_our_engines_run(tmp_path: Path, backends: BackendSet) -> None:
    size = dataclasses.replace(SIZES["tiny"], search_docs=40, search_queries=5)
    ctx = make_ctx(tmp_path, [backends.open("memory")], size=size, repeat=1)
    ctx.extras["peers"] = False
    suite.run(ctx)
    assert {(m.backend, m.layer) for m in ctx.run.measurements} == {
        ("memory", suite.OURS), (suite.IN_PROCESS, suite.OURS_IN_PROCESS)}  # fmt: skip
    assert ctx.run.skipped == []
    assert all(m.errors == [] and len(m.samples) == 1 for m in ctx.run.measurements)
