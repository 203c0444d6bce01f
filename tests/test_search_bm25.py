"""BM25 in DuckDB: the reference's tokenizer and scores, incremental writes, persistence."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("numpy")

from agentvfs.errors import BM25FileError  # noqa: E402
from agentvfs.search import _bm25, _postings  # noqa: E402
from agentvfs.search._bm25 import BM25Index, js_log  # noqa: E402
from agentvfs.search._tokenize import (  # noqa: E402
    DEFAULT_STOPWORDS,
    TokenizeOptions,
    Tokenizer,
    find_line_range,
    make_tokenizer,
)

SRC = str(Path(__file__).resolve().parent.parent / "src")
SCORERS = [pytest.param(True, id="cached"), pytest.param(False, id="sql")]

DOC1 = "The quick brown fox jumps over the lazy dog"
DOC2 = "A lazy cat sleeps all day\nlazy lazy"
DOC3 = "Line 1 introduction\nLine 2 has machine learning\nLine 3 conclusion"


@pytest.fixture(params=SCORERS)
def cached(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def index(cached: bool) -> Iterator[BM25Index]:
    ix = BM25Index(cache_postings=cached)
    ix.add("doc1", DOC1)
    ix.add("doc2", DOC2)
    ix.add("doc3", DOC3)
    yield ix
    ix.close()


def reference_search(
    docs: list[tuple[str, str]],
    query: str,
    *,
    k1: float = 1.5,
    b: float = 0.75,
    top_k: int = 10,
    min_score: float = 0.0,
    tokenize: Callable[[str], list[str]] | None = None,
) -> list[tuple[str, float]]:
    """The reference's BM25Index.search, line by line (docs in Map insertion order)."""
    tok = tokenize or make_tokenizer(None)
    tokens = {doc_id: tok(text) for doc_id, text in docs}
    if not docs:
        return []
    freqs = {doc_id: Counter(t) for doc_id, t in tokens.items()}
    avg = sum(len(t) for t in tokens.values()) / len(docs)
    inverted: dict[str, list[str]] = {}
    for doc_id, counts in freqs.items():
        for term in counts:
            inverted.setdefault(term, []).append(doc_id)
    scores: dict[str, float] = {}
    for term in tok(query):
        ids = inverted.get(term)
        if not ids:
            continue
        df = len(ids)
        idf = js_log((len(docs) - df + 0.5) / (df + 0.5) + 1)
        for doc_id in ids:
            tf = freqs[doc_id][term]
            length = len(tokens[doc_id])
            s = idf * ((tf * (k1 + 1)) / (tf + k1 * (1 - b + b * (length / avg))))
            scores[doc_id] = scores.get(doc_id, 0) + s
    results = [(d, s) for d, s in scores.items() if s >= min_score]
    results.sort(key=lambda r: -r[1])
    return results[:top_k]


def assert_same_ranking(got: list[Any], want: list[tuple[str, float]], *, exact: bool) -> None:
    assert len(got) == len(want)
    if exact:
        assert [(h.id, h.score) for h in got] == want
        return
    # One SQL SUM may add a document's terms in another order (last-bit differences), so
    # compare scores to 1e-9 and the order up to such near-ties.
    for hit, (_, score) in zip(got, want, strict=True):
        assert hit.score == pytest.approx(score, abs=1e-9)
    assert sorted((round(h.score, 9), h.id) for h in got) == sorted(
        (round(s, 9), d) for d, s in want
    )


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_reference_examples() -> None:
    tok = make_tokenizer(None)
    assert tok("Hello, World! How are you?") == ["hello", "world", "how", "you"]
    assert tok("the a an") == []
    assert tok("") == []
    words = "a an and are as at be by for from has he in is it its of on or that the to was were"
    assert frozenset([*words.split(), "will", "with"]) == DEFAULT_STOPWORDS


def test_tokenizer_unicode_digits_underscores() -> None:
    tok = make_tokenizer(None)
    assert tok("Café naïve—dash snake_case x 42 v2.0") == [
        "café",
        "naïve",
        "dash",
        "snake_case",
        "42",
        "v2",
    ]
    # One astral letter is 2 UTF-16 code units, as long as min_length 2 in JavaScript.
    assert tok("\U0001d400 \u00e9") == ["\U0001d400"]
    assert tok("ÉCOLE Straße") == ["école", "straße"]


def test_tokenizer_javascript_whitespace_and_options() -> None:
    keep = make_tokenizer({"removePunctuation": False})
    # U+001C is whitespace to Python but not to JavaScript; U+FEFF is the other way round.
    assert keep("ab\x1ccd ef") == ["ab\x1ccd", "ef"]
    assert keep("ab\ufeffcd") == ["ab", "cd"]
    assert keep("Hello, World!") == ["hello,", "world!"]
    assert make_tokenizer({"minLength": 0})(" a b ") == ["", "b", ""]
    assert make_tokenizer({"lowercase": False, "stopwords": []})("The Cat") == ["The", "Cat"]
    assert make_tokenizer({"split_pattern": r"[,;]", "removePunctuation": False})("x1,y2;zz") == [
        "x1",
        "y2",
        "zz",
    ]
    assert make_tokenizer({"stopwords": {"cat"}, "min_length": 1})("a cat b") == ["a", "b"]


def test_tokenize_options_validation() -> None:
    assert TokenizeOptions.from_value({"minLength": 3}).min_length == 3
    assert TokenizeOptions.from_value({"stem": True}).stem == "english"
    with pytest.raises(ValueError, match="'minlen'"):
        TokenizeOptions.from_value({"minlen": 3})
    with pytest.raises(TypeError, match="min_length"):
        TokenizeOptions(min_length="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split_pattern"):
        TokenizeOptions(split_pattern="(")
    with pytest.raises(ValueError, match="klingon"):
        make_tokenizer({"stem": "klingon"})
    custom = str.split
    assert make_tokenizer(custom) is custom


def test_stemming_is_opt_in() -> None:
    pytest.importorskip("Stemmer")
    assert make_tokenizer(None)("running studies") == ["running", "studies"]
    stem = make_tokenizer({"stem": True})
    assert stem("Running studies, happily connected") == ["run", "studi", "happili", "connect"]
    ix = BM25Index(tokenize={"stem": True})
    ix.add("a", "the runner was running")
    ix.add("b", "nothing here")
    assert [h.id for h in ix.search("runs")] == ["a"]
    assert ix.search("runs")[0].line_range == (1, 1)


def test_counts_match_tokens() -> None:
    rng = random.Random(3)
    words = ["Alpha", "beta,", "the", "x", "Ünï", "snake_case", "42", "a-b", "\U0001d400", "é"]
    words += ["ab", "abc", "中", "中文", "\U0001d400\U0001d400", "_", "Q"]
    options: Any
    for options in (
        None,
        {"stem": True},
        {"min_length": 1},
        {"min_length": 3},
        {"min_length": 3, "stopwords": ["beta", "é", "中文"]},
        {"stopwords": []},
        {"lowercase": False},
        {"removePunctuation": False},
    ):
        tok = make_tokenizer(options)
        for _ in range(80):
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(12)))
            tokens = tok(text)
            assert tok.counts(text) == (Counter(tokens), len(tokens))  # type: ignore[attr-defined]


def test_find_line_range() -> None:
    tok = make_tokenizer(None)
    text = "intro\nthe Lazy dog\nnothing\nlazy again\nend"
    assert find_line_range(text, ["lazy"], tok) == (2, 4)
    assert find_line_range(text, ["absent"], tok) is None
    assert find_line_range(text, [], tok) is None
    # Substrings do not count: "lazy" is in "lazybones" but no token is "lazy".
    assert find_line_range("lazybones\nlazy", ["lazy"], tok) == (2, 2)
    assert find_line_range("a\nb", ["b"], str.split) == (2, 2)


@pytest.mark.parametrize(
    "options", [None, {"min_length": 3}, {"lowercase": False}, {"stopwords": ["is", "and"]}]
)
def test_find_line_range_by_whole_words_agrees_with_tokenizing_each_line(options: Any) -> None:
    tok = make_tokenizer(options)
    assert isinstance(tok, Tokenizer) and tok.words_are_ascii_runs
    rng = random.Random(11)
    pieces = ["Lazy", "lazy", "lazybones", "dog_lazy", "x", "is", "and", "42", "a-b", "foo.bar", "_", "é"]
    for _ in range(400):
        lines = [
            "".join(rng.choice([*pieces, " ", " ", "\t", ",", "(", ")"]) for _ in range(rng.randrange(8)))
            for _ in range(rng.randrange(1, 7))
        ]
        content = "\n".join(lines)
        query = tok(" ".join(rng.sample(pieces, rng.randrange(1, 4))))

        def slow(text: str = content, wanted: frozenset[str] = frozenset(query)) -> tuple[int, int] | None:
            hits = [i for i, line in enumerate(text.split("\n")) if wanted & set(tok(line))]
            return (hits[0] + 1, hits[-1] + 1) if hits and wanted else None

        assert find_line_range(content, query, tok) == slow(), (content, query)


# --------------------------------------------------------------------------- scores


def test_reference_numbers(index: BM25Index) -> None:
    lazy = index.search("lazy")
    assert [h.id for h in lazy] == ["doc2", "doc1"]
    assert lazy[0].score == pytest.approx(0.783339382076226, abs=1e-9)
    assert lazy[1].score == pytest.approx(0.4700036292457356, abs=1e-9)
    ml = index.search("machine learning")
    assert [h.id for h in ml] == ["doc3"]
    assert ml[0].score == pytest.approx(1.9616585060234528, abs=1e-9)
    if index._cache_postings:  # bit for bit: V8's log, the reference's operation order
        assert (lazy[0].score, lazy[1].score) == (0.783339382076226, 0.4700036292457356)
        assert ml[0].score == 1.9616585060234528
    assert ml[0].line_range == (2, 2)
    assert lazy[0].line_range == (1, 2)
    assert lazy[0].content == DOC2
    assert lazy[0].metadata is None


def test_js_log_is_v8s() -> None:
    import math

    assert js_log(1.6) == 0.4700036292457356 != math.log(1.6)
    for x in (1.0, 2.0, 0.5, 1e-300, 1e300, 1 + 2**-30, 7.25):
        assert js_log(x) == pytest.approx(math.log(x), rel=1e-15, abs=1e-300)


def test_min_score_on_raw_score(index: BM25Index) -> None:
    assert index.search("lazy", min_score=1) == []
    assert [h.id for h in index.search("lazy", min_score=0.5)] == ["doc2"]
    assert [h.id for h in index.search("lazy", min_score=0.783339382076226)] == ["doc2"]
    assert index.search("lazy", top_k=1)[0].id == "doc2"
    assert index.search("lazy", top_k=0) == []
    with pytest.raises(ValueError, match="top_k"):
        index.search("lazy", top_k=-1)


def test_duplicate_query_terms_count(index: BM25Index) -> None:
    once = index.search("lazy")[0].score
    assert index.search("lazy lazy")[0].score == once + once
    assert index.search("lazy LAZY, lazy")[0].score == once + once + once


def test_empty_and_stopword_queries(index: BM25Index) -> None:
    assert index.search("") == []
    assert index.search("the a an of") == []
    assert index.search("   ,,, !!! ") == []
    assert index.search("zebra") == []
    assert BM25Index().search("lazy") == []


def test_ties_follow_the_reference_order(cached: bool) -> None:
    ix = BM25Index(cache_postings=cached)
    for name in ("x1", "x2", "x3"):
        ix.add(name, "alpha beta")
    ix.add("other", "gamma delta")
    assert [h.id for h in ix.search("alpha")] == ["x1", "x2", "x3"]
    ix.add("x1", "alpha beta")  # a re-add moves to the end
    assert [h.id for h in ix.search("beta")] == ["x2", "x3", "x1"]
    # Equal scores: the document met through the first query term comes first.
    ix2 = BM25Index(cache_postings=cached)
    ix2.add("cat", "cat zz")
    ix2.add("dog", "dog zz")
    ix2.add("pad", "yy ww")
    hits = ix2.search("dog cat")
    assert hits[0].score == hits[1].score
    assert [h.id for h in hits] == ["dog", "cat"]
    assert [h.id for h in ix2.search("cat dog")] == ["cat", "dog"]


@pytest.mark.parametrize("seed", range(3))
def test_random_corpora_match_the_reference(cached: bool, seed: int) -> None:
    rng = random.Random(seed)
    vocab = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "the", "x"]
    ix = BM25Index(cache_postings=cached, k1=rng.choice([1.5, 1.2, 2.0]), b=rng.choice([0.75, 0.3]))
    docs: dict[str, str] = {}
    for _step in range(60):
        op = rng.random()
        doc_id = f"d{rng.randrange(25)}"
        if op < 0.7:
            text = " ".join(rng.choice(vocab) for _ in range(rng.randrange(9)))
            if rng.random() < 0.3:
                text += "\n" + " ".join(rng.choice(vocab) for _ in range(3))
            docs.pop(doc_id, None)
            docs[doc_id] = text
            ix.add(doc_id, text)
        elif op < 0.85:
            assert ix.remove(doc_id) == (docs.pop(doc_id, None) is not None)
        else:
            batch = [(f"b{rng.randrange(30)}", rng.choice(vocab) + " " + rng.choice(vocab))]
            batch.append((batch[0][0], "alpha " + rng.choice(vocab)))  # same id twice: last wins
            for doc_id2, text in batch:
                docs.pop(doc_id2, None)
                docs[doc_id2] = text
            ix.add_many([(d, t, None, None) for d, t in batch])
        query = " ".join(rng.choice(vocab) for _ in range(rng.randrange(1, 6)))
        top_k = rng.choice([3, 10])
        want = reference_search(list(docs.items()), query, k1=ix.k1, b=ix.b, top_k=top_k)
        assert_same_ranking(ix.search(query, top_k=top_k), want, exact=cached)
    assert ix.ids() == list(docs)
    assert len(ix) == len(docs)


def test_compaction_keeps_results(cached: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Compact the in-memory postings and the table on disk after nearly every write.
    monkeypatch.setattr(_postings, "_COMPACT_MIN_POSTINGS", 5)
    monkeypatch.setattr(_bm25, "_DEAD_MIN_ROWS", 3)
    monkeypatch.setattr(_bm25, "_TAIL_MIN_ROWS", 4)
    rng = random.Random(11)
    vocab = [f"w{i}" for i in range(15)]
    ix = BM25Index(cache_postings=cached)
    docs: dict[str, str] = {}
    for step in range(120):
        doc_id = f"d{rng.randrange(30)}"
        if rng.random() < 0.75:
            text = " ".join(rng.choice(vocab) for _ in range(rng.randrange(1, 8)))
            docs.pop(doc_id, None)
            docs[doc_id] = text
            ix.add(doc_id, text)
        else:
            ix.remove(doc_id)
            docs.pop(doc_id, None)
        if step % 3 == 0:
            query = " ".join(rng.choice(vocab) for _ in range(3))
            want = reference_search(list(docs.items()), query)
            assert_same_ranking(ix.search(query), want, exact=cached)
    if cached:
        assert ix._cache is not None and ix._cache.delta_size < 60
    ix.optimize()
    stats = ix._stats(ix._con)
    assert stats.dead_rows == stats.tail_rows == 0
    assert stats.sorted_rows == sum(len(set(t.split())) for t in docs.values())
    rows = ix._con.execute("SELECT term, doc FROM bm25_postings").fetchall()
    assert rows == sorted(rows)
    assert_same_ranking(
        ix.search("w1 w2"), reference_search(list(docs.items()), "w1 w2"), exact=cached
    )


def test_removed_documents_leave_postings_until_compaction(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    with BM25Index(path) as ix:
        ix.add_many([(f"d{i}", f"alpha beta{i}", None, None) for i in range(10)])
        ix.remove("d3")
        ix.add("d4", "gamma")
    with BM25Index(path) as ix:  # a fresh cache skips the dead postings
        assert [h.id for h in ix.search("alpha")] == [f"d{i}" for i in (0, 1, 2, 5, 6, 7, 8, 9)]
        assert ix.search("beta3 beta4") == []
        stats = ix._stats(ix._con)
        assert (stats.sorted_rows, stats.tail_rows, stats.dead_rows) == (0, 21, 4)
        ix.optimize()
        assert ix._con.execute("SELECT count(*) FROM bm25_postings").fetchone() == (17,)
        assert [h.id for h in ix.search("gamma")] == ["d4"]


# --------------------------------------------------------------------------- documents


def test_replace_remove_and_accessors(index: BM25Index) -> None:
    assert len(index) == 3 and "doc1" in index and "nope" not in index and 3 not in index
    index.add("doc1", "now about cats", {"type": "txt"})
    assert index.ids() == ["doc2", "doc3", "doc1"]
    assert index.get("doc1") == ("now about cats", {"type": "txt"})
    assert [h.id for h in index.search("lazy")] == ["doc2"]
    assert [h.id for h in index.search("cats")] == ["doc1"]
    assert index.remove("doc2") is True
    assert index.remove("doc2") is False
    assert index.search("lazy") == []
    assert index.get("doc2") is None
    index.clear()
    assert len(index) == 0 and index.ids() == [] and index.search("cats") == []
    index.add("again", "cats again")
    assert [h.id for h in index.search("cats")] == ["again"]


def test_remove_source(cached: bool) -> None:
    ix = BM25Index(cache_postings=cached)
    names = ["f", "f#chunk-0", "f#chunk-12", "f#chunk-x", "f#chunk-1a", "f#chunk-", "fx", "g"]
    for name in names:
        ix.add(name, "needle")
    assert ix.remove_source("f") == ["f", "f#chunk-0", "f#chunk-12"]
    assert ix.ids() == ["f#chunk-x", "f#chunk-1a", "f#chunk-", "fx", "g"]
    assert {h.id for h in ix.search("needle")} == set(ix.ids())
    assert ix.remove_source("f") == []


def test_replace_sources_in_one_transaction(cached: bool, tmp_path: Path) -> None:
    path = tmp_path / "ix.duckdb"
    ix = BM25Index(path, cache_postings=cached)
    ix.add_many([(f"f#chunk-{i}", f"old text {i}") for i in range(5)] + [("g", "old g")])
    ix.add_many([("f#chunk-0", "new text"), ("f#chunk-1", "new text")], replace_sources=["f", "g"])
    assert ix.ids() == ["f#chunk-0", "f#chunk-1"]
    assert ix.search("old") == [] and len(ix.search("new")) == 2
    # Removing many sources at once; the directory of ids follows every write, and a second
    # index on the same file sees the same documents.
    ix.add_many([(f"s{i}#chunk-{j}", "shared words") for i in range(30) for j in range(3)])
    assert ix.remove_sources([f"s{i}" for i in range(0, 30, 2)]) == [
        f"s{i}#chunk-{j}" for i in range(0, 30, 2) for j in range(3)
    ]
    other = BM25Index(path, cache_postings=cached)
    held = ix.contains_many(["s1#chunk-2", "s0#chunk-0", "f#chunk-1"])
    assert held == {"s1#chunk-2", "f#chunk-1"}
    assert "s2#chunk-0" not in other and "s3#chunk-0" in other
    other.remove_source("s3")
    assert "s3#chunk-1" not in ix and len(ix.search("shared", top_k=100)) == 14 * 3
    ix.clear()
    assert "f#chunk-0" not in other and other.remove_sources(["f"]) == []
    other.close()
    ix.close()
    # A new process sees the same: nothing of a removed source comes back.
    reopened = BM25Index(path, cache_postings=cached)
    assert reopened.ids() == [] and reopened.search("shared") == []


def test_line_ranges_offsets_and_metadata(cached: bool) -> None:
    ix = BM25Index(cache_postings=cached)
    ix.add("big#chunk-2", "aaa\nbbb needle\nccc", {"sourceFile": "big"}, start_line_offset=250)
    ix.add("old", "x\nneedle", {"_startLineOffset": 10, "k": 1})
    ix.add("empty", "needle y", {"_startLineOffset": 3})
    ix.add("plain", "needle z", {})
    hits = {h.id: h for h in ix.search("needle")}
    assert hits["big#chunk-2"].line_range == (251, 251)
    assert hits["big#chunk-2"].metadata == {"sourceFile": "big"}
    assert hits["old"].line_range == (11, 11)
    assert hits["old"].metadata == {"k": 1}
    assert hits["empty"].metadata is None and hits["empty"].line_range == (3, 3)
    assert hits["plain"].metadata is None


def test_bad_input(index: BM25Index) -> None:
    with pytest.raises(TypeError, match="content of 'x' must be str, not bytes"):
        index.add("x", b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="document id must be str"):
        index.add(5, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata of 'x'"):
        index.add("x", "text", {"bad": object()})
    with pytest.raises(TypeError, match="start_line_offset"):
        index.add("x", "text", None, start_line_offset="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="query must be str"):
        index.search(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="add_many takes"):
        index.add_many(["just a string"])  # type: ignore[list-item]
    # A bad document in a batch adds nothing.
    with pytest.raises(TypeError, match="content of 'bad'"):
        index.add_many([("ok", "fine text", None, None), ("bad", 3, None, None)])  # type: ignore[list-item]
    assert "ok" not in index and len(index) == 3
    index.add("surrogate", "caf\udce9 lazy")
    assert index.get("surrogate") == ("caf\udce9 lazy", None)


def test_huge_query_and_document(cached: bool) -> None:
    ix = BM25Index(cache_postings=cached)
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(3000)]
    docs = [(f"d{i}", " ".join(rng.choice(vocab) for _ in range(30))) for i in range(300)]
    ix.add_many([(d, t, None, None) for d, t in docs])
    big_lines = ["filler words here"] * 120_000
    big_lines[90_000] = "the needle line"
    ix.add("huge", "\n".join(big_lines))  # about 2 MB
    t0 = time.perf_counter()
    hits = ix.search("needle")
    assert [h.id for h in hits] == ["huge"] and hits[0].line_range == (90_001, 90_001)
    query = " ".join(rng.choice(vocab) for _ in range(150_000))  # about 1 MB
    t0 = time.perf_counter()
    hits = ix.search(query)
    assert time.perf_counter() - t0 < 20
    want = reference_search([*docs, ("huge", "\n".join(big_lines))], query)
    assert [h.id for h in hits] == [d for d, _ in want]
    for hit, (_, score) in zip(hits, want, strict=True):
        assert hit.score == pytest.approx(score, rel=1e-12)


def test_transaction_for_other_tables(index: BM25Index) -> None:
    with index.transaction() as cur:
        cur.execute("CREATE TABLE engine_state(path VARCHAR, size BIGINT)")
        cur.execute("INSERT INTO engine_state VALUES ('a', 1)")

    def fail() -> None:
        with index.transaction() as cur:
            cur.execute("INSERT INTO engine_state VALUES ('b', 2)")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    with index.transaction() as cur:
        assert cur.execute("SELECT path FROM engine_state").fetchall() == [("a",)]


def test_failed_write_rolls_back(cached: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = BM25Index(cache_postings=cached)
    ix.add("a", "alpha beta")
    ix.add("b", "beta gamma")
    before = [(h.id, h.score) for h in ix.search("beta")]

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(BM25Index, "_insert", staticmethod(fail))
    with pytest.raises(OSError, match="disk full"):
        ix.add("a", "replaced alpha")  # the old "a" was deleted inside the transaction
    monkeypatch.undo()
    assert ix.get("a") == ("alpha beta", None) and len(ix) == 2
    assert [(h.id, h.score) for h in ix.search("beta")] == before


def test_threads(cached: bool) -> None:
    ix = BM25Index(cache_postings=cached)
    ix.add_many([(f"d{i}", f"common word{i % 7}", None, None) for i in range(50)])
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(25):
                if rng.random() < 0.5:
                    ix.add(f"d{rng.randrange(60)}", f"common word{rng.randrange(7)}")
                else:
                    ix.search(f"common word{rng.randrange(7)}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ix.search("common", top_k=100)) == len(ix)


# --------------------------------------------------------------------------- persistence


def test_persistence_and_read_only(tmp_path: Path, cached: bool) -> None:
    path = tmp_path / "bm25.duckdb"
    with BM25Index(path, cache_postings=cached) as ix:
        ix.add("doc1", DOC1)
        ix.add("doc2", DOC2, {"a": 1})
        ix.add("doc3", DOC3, None, start_line_offset=5)
        ix.add("doc1", DOC1)
    with BM25Index(path, cache_postings=cached) as ix:
        assert ix.ids() == ["doc2", "doc3", "doc1"]
        hits = {h.id: h for h in ix.search("lazy machine")}
        assert set(hits) == {"doc1", "doc2", "doc3"}
        assert hits["doc2"].metadata == {"a": 1} and hits["doc1"].metadata is None
        assert hits["doc3"].line_range == (6, 6)
    ro = BM25Index(path, read_only=True, cache_postings=cached)
    assert [h.id for h in ro.search("lazy")] == ["doc2", "doc1"]
    with pytest.raises(PermissionError, match="read-only"):
        ro.add("x", "y")
    with pytest.raises(PermissionError):
        ro.clear()
    ro.close()
    ro.close()
    with pytest.raises(ValueError, match="closed"):
        ro.search("lazy")
    with pytest.raises(FileNotFoundError, match=r"missing\.duckdb"):
        BM25Index(tmp_path / "missing.duckdb", read_only=True)


def test_two_connections_in_one_process_stay_consistent(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    a = BM25Index(path)
    b = BM25Index(path)  # DuckDB shares the database between connections of one process
    a.add("x", "alpha")
    assert [h.id for h in b.search("alpha")] == ["x"]
    b.add("y", "alpha alpha")
    a.remove("x")
    assert [h.id for h in a.search("alpha")] == ["y"]
    assert [h.id for h in b.search("alpha")] == ["y"]
    a.close()
    b.close()


def test_option_mismatch_names_the_difference(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    BM25Index(path).close()
    with pytest.raises(ValueError, match=r"k1 1\.5 \(in the file\) != 1\.2") as info:
        BM25Index(path, k1=1.2, b=0.5)
    assert "b 0.75" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(ValueError, match="tokenize stem False"):
        BM25Index(path, tokenize={"stem": True})
    with pytest.raises(ValueError, match="stopwords differ"):
        BM25Index(path, tokenize={"stopwords": ["foo"]})
    with pytest.raises(ValueError, match="custom"):
        BM25Index(path, tokenize=str.split)
    BM25Index(path, k1=1.5, b=0.75, tokenize={"minLength": 2}).close()  # same options


def test_a_version_1_index_with_zlib_texts_is_read_and_marked_version_2_when_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bm25.duckdb"
    with BM25Index(path) as ix:
        ix.add("old", "an old zlib text about lazy foxes\nsecond line")
        ix.add("new", "a text stored as zstd")
    # Make it a file as version 1 wrote it: zlib texts, format_version 1.
    con = duckdb.connect(str(path))
    con.execute(
        "UPDATE bm25_docs SET content = ? WHERE id = 'old'",
        [zlib.compress(b"an old zlib text about lazy foxes\nsecond line", 1)],
    )
    con.execute("UPDATE bm25_meta SET value = '1' WHERE key = 'format_version'")
    con.close()

    def version() -> str:
        con = duckdb.connect(str(path), read_only=True)
        try:
            row = con.execute("SELECT value FROM bm25_meta WHERE key = 'format_version'").fetchone()
        finally:
            con.close()
        assert row is not None
        return str(row[0])

    with BM25Index(path, read_only=True) as ro:
        (hit,) = ro.search("lazy")
        assert hit.content == "an old zlib text about lazy foxes\nsecond line"
        assert hit.line_range == (1, 1)
        assert ro.get("new") == ("a text stored as zstd", None)
    assert version() == "1"  # a reader changes nothing
    BM25Index(path).close()
    assert version() == "2"  # an older agentvfs would misread zstd texts: it refuses the file
    with BM25Index(path) as ix:
        ix.add("newer", "lazy again")
        assert [h.id for h in ix.search("lazy")] == ["newer", "old"]
        assert ix.get("old") == ("an old zlib text about lazy foxes\nsecond line", None)
    con = duckdb.connect(str(path), read_only=True)
    blob = con.execute("SELECT content FROM bm25_docs WHERE id = 'newer'").fetchone()
    con.close()
    assert blob is not None and bytes(blob[0])[:4] == b"\x28\xb5\x2f\xfd"  # zstd


def test_an_index_of_a_newer_format_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    with BM25Index(path) as ix:
        ix.add("a", "alpha")
    con = duckdb.connect(str(path))
    con.execute("UPDATE bm25_meta SET value = '3' WHERE key = 'format_version'")
    con.close()
    before = path.read_bytes()
    with pytest.raises(BM25FileError, match=r"format version 3, this version reads 1 and 2; it was left untouched"):
        BM25Index(path)
    assert path.read_bytes() == before


def test_corrupt_and_foreign_files_are_left_alone(tmp_path: Path) -> None:
    text = tmp_path / "notes.duckdb"
    text.write_text("these are my notes, not a database\n" * 50)
    before = text.read_bytes()
    with pytest.raises(BM25FileError, match="not a DuckDB database") as info:
        BM25Index(text)
    assert info.value.filename == str(text) and str(text) in str(info.value)
    assert text.read_bytes() == before

    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE users(name VARCHAR)")
    con.close()
    before = foreign.read_bytes()
    with pytest.raises(BM25FileError, match=r"without a BM25 index.*users"):
        BM25Index(foreign)
    assert foreign.read_bytes() == before

    good = tmp_path / "good.duckdb"
    with BM25Index(good) as ix:
        ix.add_many([(f"d{i}", f"word{i} " * 50, None, None) for i in range(500)])
    data = bytearray(good.read_bytes())
    # Garble the start of every 256 KiB block (after the three 4 KiB file headers).
    for start in range(3 * 4096 + 64, len(data), 256 * 1024):
        data[start : start + 512] = os.urandom(len(data[start : start + 512]))
    broken = tmp_path / "broken.duckdb"
    broken.write_bytes(bytes(data))

    def open_and_search() -> None:
        with BM25Index(broken) as ix:
            ix.search("word1 word7 word300")  # corruption may only show when blocks are read

    with pytest.raises(BM25FileError, match=re.escape(str(broken)) + " is corrupt"):
        open_and_search()
    assert broken.read_bytes() == bytes(data)

    empty = tmp_path / "empty.duckdb"
    empty.write_bytes(b"")
    with BM25Index(empty) as ix:  # nothing to lose: used as a new index
        ix.add("a", "alpha")
    with BM25Index(empty) as ix:
        assert ix.ids() == ["a"]


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_two_processes_read_one_index(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    with BM25Index(path) as ix:
        ix.add_many([(f"d{i}", f"shared words number{i}", None, None) for i in range(100)])
    reader = """
        import json, sys, time
        from agentvfs.search._bm25 import BM25Index
        ix = BM25Index(sys.argv[1], read_only=True)
        first = [h.id for h in ix.search("number7 shared")][:3]
        print("ready", flush=True)
        time.sleep(1.5)  # both hold the file at once
        print(json.dumps({"first": first, "n": len(ix)}), flush=True)
    """
    procs = [_python(reader, str(path)) for _ in range(2)]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr
    # While readers hold it, a writer is refused with a clear error.
    with pytest.raises(BM25FileError, match="held by another process"):
        BM25Index(path)
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result == {"first": ["d7", "d0", "d1"], "n": 100}


def test_reopening_after_another_process_wrote(tmp_path: Path) -> None:
    import gc

    path = tmp_path / "bm25.duckdb"
    first = BM25Index(path)
    first.add("a", "alpha")
    assert len(first.search("alpha")) == 1
    kept = BM25Index(path)  # shares the lock and stats of ``first``
    kept.close()
    del first  # collected without close: the stats it shared must be forgotten too
    gc.collect()
    writer = """
        import sys
        from agentvfs.search._bm25 import BM25Index
        with BM25Index(sys.argv[1]) as ix:
            ix.add("b", "alpha beta")
    """
    proc = _python(writer, str(path))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with BM25Index(path) as ix:
        assert len(ix) == 2
        want = reference_search([("a", "alpha"), ("b", "alpha beta")], "alpha beta")
        assert [(h.id, h.score) for h in ix.search("alpha beta")] == want


def test_killed_writer_leaves_a_usable_index(tmp_path: Path) -> None:
    path = tmp_path / "bm25.duckdb"
    writer = """
        import sys
        from agentvfs.search._bm25 import BM25Index
        ix = BM25Index(sys.argv[1])
        batch = 0
        while True:
            docs = [(f"b{batch}-{i}", f"crash test words batch{batch} item{i} " * 20, None, None)
                    for i in range(200)]
            ix.add_many(docs)
            batch += 1
            print(batch, flush=True)
    """
    proc = _python(writer, str(path))
    assert proc.stdout is not None
    done = 0
    while done < 3:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        done = int(line)
    time.sleep(0.05 * random.Random(1).random())  # kill it somewhere inside a batch
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with BM25Index(path) as ix:
        count = len(ix)
        assert count >= 600 and count % 200 == 0  # whole batches only
        assert len(ix.ids()) == count
        hits = ix.search("batch0 item5")
        assert hits[0].id == "b0-5"
        ix.add("after", "crash recovery works")
        assert [h.id for h in ix.search("recovery")] == ["after"]


# --------------------------------------------------------------------------- cost


def _update_ms(ix: BM25Index, ids: list[str], rng: random.Random) -> float:
    times = []
    for i in range(15):
        doc_id = rng.choice(ids)
        t0 = time.perf_counter()
        ix.add(doc_id, f"updated text number{i} with some words")
        times.append(time.perf_counter() - t0)
        assert ix.search(f"number{i}")[0].id == doc_id
    return sorted(times)[len(times) // 2] * 1000


def test_update_cost_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    rng = random.Random(2)
    vocab = [f"v{i}" for i in range(5000)]

    def build(n: int, name: str) -> tuple[BM25Index, list[str]]:
        ix = BM25Index(tmp_path / name)
        docs = [(f"d{i}", " ".join(rng.choice(vocab) for _ in range(40))) for i in range(n)]
        for start in range(0, n, 5000):
            ix.add_many([(d, t, None, None) for d, t in docs[start : start + 5000]])
        ix.search("v1")  # load the cache
        return ix, [d for d, _ in docs]

    small, small_ids = build(1_000, "small.duckdb")
    large, large_ids = build(20_000, "large.duckdb")
    t_small = _update_ms(small, small_ids, rng)
    t_large = _update_ms(large, large_ids, rng)
    # Generous: a rebuild or a scan of the corpus would be 20x; noise on a shared machine is 2x.
    assert t_large < 4 * t_small + 10, (t_small, t_large)


# -- checkpoints ---------------------------------------------------------------------------------


def _fill(index: BM25Index, count: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    words = ["red", "green", "blue", "cyan", "plum", "teal", "gold", "jade", "ruby", "onyx"]
    index.add_many(
        [
            (f"doc{i}", " ".join(rng.choice(words) for _ in range(rng.randint(3, 30))), {"n": i}, i)
            for i in range(count)
        ]
    )


def _answers(index: BM25Index) -> list[list[tuple[str, float, str, Any, Any]]]:
    return [
        [(h.id, h.score, h.content, h.metadata, h.line_range) for h in index.search(q, top_k=20)]
        for q in ("red", "green blue", "plum plum teal", "onyx gold jade ruby")
    ]


def test_a_checkpoint_serves_postings_and_text_of_the_version_it_was_written_at(tmp_path: Path) -> None:
    path = tmp_path / "ix.duckdb"
    index = BM25Index(path)
    _fill(index, 300)
    index.remove("doc7")
    expected = _answers(index)
    assert index.write_checkpoint()
    assert index.checkpoint_version == index.version
    index.close()
    reopened = BM25Index(path)
    assert _answers(reopened) == expected
    assert reopened._cache is not None and reopened._cache.slot_doc.size == 299
    # Writes after it: postings come from the index, the text of unchanged documents still
    # from the checkpoint (document numbers are never reused), the new ones' from DuckDB.
    reopened.add("doc3", "red red red replaced")
    reopened.add("fresh", "green novel words")
    after = _answers(reopened)
    reopened.close()
    again = BM25Index(path)
    assert again.checkpoint_version is not None and again.checkpoint_version != again.version
    assert _answers(again) == after
    assert [h.content for h in again.search("replaced")] == ["red red red replaced"]
    # Without the checkpoint: the same answers from DuckDB alone.
    again.close()
    os.unlink(str(path) + _bm25.CHECKPOINT_SUFFIX)
    assert _answers(BM25Index(path)) == after


def test_a_writer_killed_while_writing_its_checkpoint_leaves_a_usable_index_and_no_litter(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ix.duckdb"
    checkpoint = str(path) + _bm25.CHECKPOINT_SUFFIX
    writer = """
        import sys
        from agentvfs.search._bm25 import BM25Index
        ix = BM25Index(sys.argv[1])
        ix.add_many([(f"doc{i}", f"steady words item{i} " * 200, None, None) for i in range(3000)])
        n = 0
        while True:
            ix.add(f"extra{n}", f"extra words number{n}")
            ix.write_checkpoint()
            n += 1
            print(n, flush=True)
    """
    rng = random.Random(4)
    for _ in range(3):
        proc = _python(writer, str(path))
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.random() * 0.4)  # somewhere in a write, often
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # One more left over for certain, as a writer killed mid-write leaves it.
    Path(f"{checkpoint}.4000000.tmp").write_bytes(b"AVFSSEG1 half a checkpoint")
    with BM25Index(path) as ix:
        want = [(h.id, h.score, h.content) for h in ix.search("steady item7 number1")]
        assert want and want[0][0] == "doc7"
        assert ix.write_checkpoint()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    with BM25Index(path) as ix:
        assert ix.checkpoint_version == ix.version  # the new checkpoint is used...
        assert [(h.id, h.score, h.content) for h in ix.search("steady item7 number1")] == want
    os.unlink(checkpoint)
    with BM25Index(path) as ix:  # ...and answers as the index alone does
        assert [(h.id, h.score, h.content) for h in ix.search("steady item7 number1")] == want


def test_a_foreign_damaged_or_planted_checkpoint_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "ix.duckdb"
    index = BM25Index(path)
    _fill(index, 120, seed=1)
    index.write_checkpoint()
    index.close()
    checkpoint = str(path) + _bm25.CHECKPOINT_SUFFIX
    kept = Path(checkpoint).read_bytes()
    # The index deleted and made again at the same path: document numbers start over, so the
    # old checkpoint's text would be wrong; it belongs to another instance and is not used.
    for name in os.listdir(tmp_path):
        if name.startswith("ix.duckdb") and not name.endswith(_bm25.CHECKPOINT_SUFFIX):
            os.unlink(tmp_path / name)
    other = BM25Index(path)
    _fill(other, 120, seed=2)
    fresh = BM25Index()
    _fill(fresh, 120, seed=2)
    assert _answers(other) == _answers(fresh)
    assert other.checkpoint_version is None
    other.close()
    # Damaged (truncated, or bytes flipped in the header): ignored, answers from DuckDB.
    expected = _answers(fresh)
    Path(checkpoint).write_bytes(kept[: len(kept) // 2])
    assert _answers(BM25Index(path)) == expected
    Path(checkpoint).write_bytes(b"AVFSSEG1" + b"\xff" * 200)
    assert _answers(BM25Index(path)) == expected
    # A symlink planted at its name is not followed.
    os.unlink(checkpoint)
    (tmp_path / "elsewhere.seg").write_bytes(kept)
    os.symlink(tmp_path / "elsewhere.seg", checkpoint)
    planted = BM25Index(path)
    assert planted.checkpoint_version is None and _answers(planted) == expected


def test_registered_columns_take_the_first_values_type_and_leave_the_setting_as_it_was() -> None:
    import numpy as np

    from agentvfs.search._duckdb import registered

    con = duckdb.connect()
    con.execute("SET pandas_analyze_sample = 777")
    con.execute("CREATE TABLE t(id VARCHAR, body BLOB, n BIGINT)")
    ids = ["a", "b", "ü"] + [f"d{i}" for i in range(200)]  # many: the setting is changed
    bodies = [b"\x00\x01", b"", b"\xff"] + [bytes([i]) * i for i in range(200)]
    columns = {
        "id": np.array(ids, dtype=object),
        "body": np.array(bodies, dtype=object),
        "n": np.arange(len(ids), dtype=np.int64),
    }
    seen: list[Any] = []
    with registered(con, "new_rows", columns):
        seen.append(con.execute("SELECT current_setting('pandas_analyze_sample')").fetchone())
        con.execute("INSERT INTO t SELECT * FROM new_rows")
    assert seen == [(1,)]
    assert con.execute("SELECT * FROM t ORDER BY n").fetchall() == list(zip(ids, bodies, range(len(ids)), strict=True))
    few = {"id": np.array(["x"], dtype=object), "body": np.array([b"y"], dtype=object), "n": np.array([-1])}
    with registered(con, "new_rows", few):  # few rows: DuckDB's own look costs less
        seen.append(con.execute("SELECT current_setting('pandas_analyze_sample')").fetchone())
        con.execute("INSERT INTO t SELECT * FROM new_rows")
    assert seen[-1] == (777,) and con.execute("SELECT id FROM t WHERE n = -1").fetchone() == ("x",)
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM new_rows")  # unregistered
    with pytest.raises(duckdb.Error), registered(con, "new_rows", columns):
        con.execute("INSERT INTO t SELECT * FROM no_such_view")
    assert con.execute("SELECT current_setting('pandas_analyze_sample')").fetchone() == (777,)
    con.close()


def test_texts_are_packed_as_zstd_and_unpacked_whatever_they_hold() -> None:
    for texts in ([], [""], ["", ""], ["a", "", "é\ud800 lone surrogate", "x" * 100_000]):
        packed = _bm25._pack_many(texts)
        assert len(packed) == len(texts)
        assert all(blob[:4] == b"\x28\xb5\x2f\xfd" for blob in packed)
        assert [_bm25._unpack(blob) for blob in packed] == texts
    assert _bm25._unpack(zlib.compress(b"old text", 1)) == "old text"


def test_posting_documents_are_found_by_table_or_bisection_alike() -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    for universe, count in ((60, 50), (100_000, 40), (10, 0)):
        slot_doc = np.sort(rng.choice(universe, count, replace=False)).astype(np.int64)
        docs = rng.integers(-3, universe + 3, 500).astype(np.int64)
        slots = _postings._slots_of(slot_doc, docs)
        present = np.isin(docs, slot_doc)
        found = (slots < len(slot_doc)) & (slot_doc[np.minimum(slots, max(len(slot_doc) - 1, 0))] == docs) if count else np.zeros(500, bool)
        assert np.array_equal(found, present)
        if count:
            assert np.array_equal(slots[present], np.searchsorted(slot_doc, docs[present]))


def test_term_scores_kept_between_queries_follow_every_change_of_the_postings() -> None:
    # Same size and average length before and after: only the postings' generation tells
    # the kept term scores are stale.
    ix = BM25Index()
    ix.add_many([("a", "alpha beta"), ("b", "alpha gamma"), ("c", "delta delta")])
    first = [(h.id, h.score) for h in ix.search("alpha delta")]
    assert first == [(h.id, h.score) for h in ix.search("alpha delta")]  # kept, same answer
    ix.remove("c")
    assert ix._cache is not None
    ix._cache.compact()
    ix.add("d", "alpha alpha")  # three documents of total length 6 again
    want = reference_search([("a", "alpha beta"), ("b", "alpha gamma"), ("d", "alpha alpha")], "alpha delta")
    assert_same_ranking(ix.search("alpha delta"), want, exact=True)
    ix.close()


def test_the_term_cache_keeps_the_most_recent_terms_within_its_budget() -> None:
    import numpy as np

    from agentvfs.search._scoring import _TermCache

    cache = _TermCache(("key",), budget=10)

    def part(size: int) -> tuple[Any, Any]:
        return np.arange(size, dtype=np.intp), np.ones(size)

    cache.put(1, part(4))
    cache.put(2, part(4))
    assert cache.get(1) is not None  # 1 is now the most recent
    cache.put(3, part(4))  # 12 > 10: the least recent (2) goes
    assert cache.get(2) is None and cache.get(1) is not None and cache.get(3) is not None
    cache.put(4, part(11))  # larger than the whole budget: not kept
    assert cache.get(4) is None and cache.get(1) is not None
    for term in range(100, 120):  # terms the source lacks count too: they cannot pile up
        cache.put(term, part(0))
    assert cache.get(1) is None and cache.get(3) is None
    assert sum(cache.get(term) is not None for term in range(100, 120)) == 10


def test_an_index_of_documents_without_tokens_answers_nothing_without_arithmetic_errors(
    cached: bool,
) -> None:
    import warnings

    import numpy as np

    ix = BM25Index(cache_postings=cached)
    ix.add_many([("a", "!!! ..."), ("b", "")])  # every length 0: the average length is 0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        assert ix.search("日本語") == [] and ix.search("gamma alpha", top_k=2) == []
    ix.add("c", "alpha")
    assert [h.id for h in ix.search("gamma alpha")] == ["c"]
    ix.close()
