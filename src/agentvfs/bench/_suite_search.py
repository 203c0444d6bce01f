"""The ``search`` suite: index build, incremental update, query latency and retrieval quality.

Two kinds of measurement, kept apart by their backend name:

- **The product path, per storage backend** (layer ``agentvfs BM25``, backend ``memory``,
  ``local``, ``s3``, ``gcs``): the corpus is written as files under
  ``<backend root>/search-<n>/docs``, and a ``Workspace(filesystem=FsspecFilesystem(...),
  bm25=True, index_dir=<local scratch>)`` indexes them with ``rebuild_search_index`` (listing
  and reading the backend included; files over 4,000 characters become ``path#chunk-N``
  documents, and a query's top-10 chunks are mapped back to their files). An update is what
  an agent's edit causes: the ``write_file`` tool with ``tools={"auto_reindex": True}`` writes
  the file to the backend and re-indexes it.
- **The engine comparison, in this process** (backend ``in-process``): every engine indexes
  the same texts held in memory (nothing is read from a backend), so the comparison is like
  for like: ``agentvfs BM25 (in-process)`` (`BM25Index` on a DuckDB file, the engine behind
  the Workspace), ``SQLite FTS5`` (stdlib, porter unicode61), ``DuckDB fts`` (the fts
  extension, loaded offline from the ``duckdb-extension-fts`` package), ``bm25s`` (with
  PyStemmer) and ``tantivy`` (en_stem). Each uses its own tokenizer. DuckDB fts and bm25s
  cannot update an index in place: their update applies the changes and rebuilds once. An
  engine that is not installed is skipped with a message in ``run.skipped``. The peers run
  when ``ctx.extras["peers"]`` is true or absent (``agentvfs bench --peers``); our in-process
  engine always runs, as it shows what the product path adds to the engine's own cost.

Cases (suite ``search``): ``index_build`` (s, a fresh index each round), ``update`` (s: 10
documents, or 1% of the corpus when that is fewer, each changed by one new word; afterwards
each must be found by that word, else the round is an error), ``query`` (ms: samples are the
per-round medians, ``latencies`` every query's seconds; ``ctx.warmup`` untimed queries first),
and the quality scores (unit ``score``, one sample per round): ``recall@10`` and ``ndcg@10``
on Cranfield (graded judgements), ``recall@10`` and ``mrr@10`` on the Python standard library
with known-item queries (see `_corpus`). The corpus and the judgement are in every
measurement's notes.

A failure of one engine or backend is recorded on its measurements and the suite goes on;
scratch files (index directories, the documents written to a backend) are removed at the end.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _corpus
from ._corpus import Corpus

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from ..workspace import Workspace
    from ._backends import Backend
    from ._context import Context
    from ._model import Measurement

__all__ = ["BM25S", "DUCKDB_FTS", "IN_PROCESS", "OURS", "OURS_IN_PROCESS", "SQLITE", "SUITE", "TANTIVY", "run"]

SUITE = "search"
#: The backend name of the in-process engine comparison.
IN_PROCESS = "in-process"
OURS = "agentvfs BM25"
OURS_IN_PROCESS = "agentvfs BM25 (in-process)"
SQLITE = "SQLite FTS5"
DUCKDB_FTS = "DuckDB fts"
BM25S = "bm25s"
TANTIVY = "tantivy"
TOP_K = 10
#: Documents changed per update round (fewer when 1% of the corpus is fewer).
UPDATED_DOCS = 10
#: The folder below the backend's ``search-<n>`` directory that holds the documents.
DOCS_DIR = "docs"
_WRITE_TOOL = "mastra_workspace_write_file"

#: Modules each in-process engine needs, with what to install: (module, pip requirement).
_REQUIRES: dict[str, list[tuple[str, str]]] = {
    OURS_IN_PROCESS: [("duckdb", "duckdb"), ("numpy", "numpy")],
    SQLITE: [("sqlite3", "a Python built with sqlite3")],
    DUCKDB_FTS: [("duckdb", "duckdb"), ("duckdb_extension_fts", "duckdb-extension-fts")],
    BM25S: [("bm25s", "bm25s"), ("Stemmer", "PyStemmer")],
    TANTIVY: [("tantivy", "tantivy")],
}


def run(ctx: Context) -> None:
    """Run the search suite on every backend of the run, then the in-process comparison."""
    corpus = _corpus.load(ctx.cranfield, ctx.size.search_docs, ctx.size.search_queries)
    ctx.progress.log(f"search: {corpus.description} ({corpus.chars / 1e6:.1f} MB of text)")
    if not corpus.queries:
        ctx.run.problem(f"search: the corpus gave no queries ({corpus.description})")
    for n, backend in enumerate(ctx.backends, start=1):
        _run_backend(ctx, backend, corpus, n)
    _run_in_process(ctx, corpus)


# ------------------------------------------------------------------------------- engines


class _Engine:
    """One index over the corpus: build it, change some documents, query it.

    ``build``, ``update`` and ``queries`` return what they time; ``search`` (for checking an
    update) is untimed. Doc ids are the corpus's.
    """

    layer = ""
    #: The engine cannot update in place: an update is a rebuild.
    rebuilds = False

    def __init__(self, where: Path) -> None:
        self.where = where

    def build(self, docs: Sequence[tuple[str, str]]) -> float:
        t0 = time.perf_counter()
        self._build(docs)
        return time.perf_counter() - t0

    def update(self, changes: Sequence[tuple[str, str]]) -> float:
        t0 = time.perf_counter()
        self._update(changes)
        return time.perf_counter() - t0

    def queries(self, queries: Sequence[str], warmup: int) -> tuple[list[float], list[list[str]]]:
        """Seconds and top-k ids of each query, after ``warmup`` untimed queries."""
        for i in range(warmup if queries else 0):
            self.search(queries[i % len(queries)])
        latencies: list[float] = []
        rankings: list[list[str]] = []
        for q in queries:
            t0 = time.perf_counter()
            ranked = self.search(q)
            latencies.append(time.perf_counter() - t0)
            rankings.append(ranked)
        return latencies, rankings

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        raise NotImplementedError

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        raise NotImplementedError

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (its scratch directory is removed by the caller)."""


class _OursInProcess(_Engine):
    """`BM25Index` on a DuckDB file, as the Workspace keeps it; one commit per changed doc."""

    layer = OURS_IN_PROCESS

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        from ..search import BM25Index

        path = self.where / "bm25.duckdb"
        index = BM25Index(path)
        for i in range(0, len(docs), 2000):
            index.add_many([(d, t) for d, t in docs[i : i + 2000]])
        index.close()  # checkpoint, as a finished build does
        self.index = BM25Index(path)

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        for doc_id, text in changes:
            self.index.add(doc_id, text)

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        return [h.id for h in self.index.search(query, top_k=k)]

    def close(self) -> None:
        index = getattr(self, "index", None)
        if index is not None:
            index.close()


@functools.cache
def _reference_tokens() -> Callable[[str], list[str]]:
    from ..search import make_tokenizer

    return make_tokenizer(None)


class _Sqlite(_Engine):
    """FTS5 (porter unicode61); a query is the OR of its terms (ours's tokens), ranked by bm25()."""

    layer = SQLITE

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        import sqlite3

        self.db = sqlite3.connect(self.where / "fts.sqlite")
        self.db.execute("CREATE VIRTUAL TABLE fts USING fts5(id UNINDEXED, body, tokenize='porter unicode61')")
        self.db.executemany("INSERT INTO fts(id, body) VALUES (?, ?)", docs)
        self.db.commit()

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        for doc_id, text in changes:
            self.db.execute("DELETE FROM fts WHERE id = ?", (doc_id,))
            self.db.execute("INSERT INTO fts(id, body) VALUES (?, ?)", (doc_id, text))
            self.db.commit()

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        terms = sorted(set(_reference_tokens()(query)))
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        rows = self.db.execute("SELECT id FROM fts WHERE fts MATCH ? ORDER BY bm25(fts) LIMIT ?", (match, k)).fetchall()
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        db = getattr(self, "db", None)
        if db is not None:
            db.close()


def _duckdb_fts_extension() -> Path | None:
    """The fts extension file that ``duckdb-extension-fts`` ships for this duckdb."""
    import duckdb
    import duckdb_extension_fts

    path = Path(duckdb_extension_fts.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "fts.duckdb_extension"
    return path if path.exists() else None


class _DuckdbFts(_Engine):
    """DuckDB's fts extension (its own stemmer and stop words); an update rebuilds the index."""

    layer = DUCKDB_FTS
    rebuilds = True

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        import duckdb

        ext = _duckdb_fts_extension()
        if ext is None:
            raise RuntimeError(f"duckdb-extension-fts has no extension for duckdb {duckdb.__version__}")
        self.con = duckdb.connect(str(self.where / "fts.duckdb"),
                                  config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})  # fmt: skip
        self.con.execute(f"LOAD '{ext}'")
        self.con.execute("CREATE TABLE docs(id VARCHAR PRIMARY KEY, body VARCHAR)")
        self.con.executemany("INSERT INTO docs VALUES (?, ?)", list(docs))
        self.con.execute("PRAGMA create_fts_index('docs', 'id', 'body')")
        self.con.execute("CHECKPOINT")

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        self.con.executemany("UPDATE docs SET body = ? WHERE id = ?", [(t, d) for d, t in changes])
        self.con.execute("PRAGMA create_fts_index('docs', 'id', 'body', overwrite=1)")
        self.con.execute("CHECKPOINT")

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        rows = self.con.execute(
            "SELECT id FROM (SELECT id, fts_main_docs.match_bm25(id, ?) AS score FROM docs)"
            " WHERE score IS NOT NULL ORDER BY score DESC LIMIT ?", (query, k)).fetchall()  # fmt: skip
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        con = getattr(self, "con", None)
        if con is not None:
            con.close()


class _Bm25s(_Engine):
    """bm25s (English stop words, Snowball stemmer); an update re-indexes every document."""

    layer = BM25S
    rebuilds = True

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        self.texts = dict(docs)
        self._index()

    def _index(self) -> None:
        import bm25s
        import Stemmer

        self.stemmer = Stemmer.Stemmer("english")
        self.ids = list(self.texts)
        tokens = bm25s.tokenize(list(self.texts.values()), stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        self.texts.update(changes)
        self._index()

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        import bm25s

        tokens = bm25s.tokenize([query], stopwords="en", stemmer=self.stemmer, show_progress=False, return_ids=False)
        if not tokens or not tokens[0]:
            return []
        results, _ = self.retriever.retrieve([tokens[0]], k=min(k, len(self.ids)), show_progress=False)
        return [self.ids[int(i)] for i in results[0]]


class _Tantivy(_Engine):
    """tantivy (en_stem), one writer thread; one commit per changed doc."""

    layer = TANTIVY

    def _build(self, docs: Sequence[tuple[str, str]]) -> None:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", stored=True, tokenizer_name="raw")
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        (self.where / "tantivy").mkdir()
        self.index = tantivy.Index(builder.build(), path=str(self.where / "tantivy"))
        writer = self.index.writer(heap_size=200_000_000, num_threads=1)
        for doc_id, text in docs:
            writer.add_document(tantivy.Document(id=doc_id, body=text))
        writer.commit()
        writer.wait_merging_threads()
        self.writer = self.index.writer(heap_size=50_000_000, num_threads=1)
        self.index.reload()
        self.searcher = self.index.searcher()

    def _update(self, changes: Sequence[tuple[str, str]]) -> None:
        import tantivy

        for doc_id, text in changes:
            self.writer.delete_documents_by_term("id", doc_id)
            self.writer.add_document(tantivy.Document(id=doc_id, body=text))
            self.writer.commit()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        terms = _reference_tokens()(query)
        if not terms:
            return []
        parsed, _ = self.index.parse_query_lenient(" ".join(terms), ["body"])
        return [str(self.searcher.doc(address)["id"][0]) for _, address in self.searcher.search(parsed, k).hits]

    def close(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.wait_merging_threads()


_ENGINES: dict[str, type[_Engine]] = {
    OURS_IN_PROCESS: _OursInProcess,
    SQLITE: _Sqlite,
    DUCKDB_FTS: _DuckdbFts,
    BM25S: _Bm25s,
    TANTIVY: _Tantivy,
}


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported here (the tests replace this to simulate a missing one)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing(layer: str) -> str | None:
    """Why the engine ``layer`` cannot run here, or None."""
    for module, pip in _REQUIRES[layer]:
        if not _importable(module):
            if module == "sqlite3":
                return f"search: {layer} skipped: this Python has no sqlite3"
            return f"search: {layer} not installed (pip install {pip})"
    if layer == SQLITE:
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(":memory:")) as db:
                db.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        except sqlite3.OperationalError:
            return f"search: {layer} skipped: this sqlite3 has no FTS5"
    if layer == DUCKDB_FTS:
        try:
            ext = _duckdb_fts_extension()
        except ImportError as exc:
            return f"search: {layer} skipped: {exc}"
        if ext is None:
            import duckdb

            return (f"search: {layer} skipped: duckdb-extension-fts has no extension for duckdb "
                    f"{duckdb.__version__} (pip install duckdb-extension-fts=={duckdb.__version__})")  # fmt: skip
    return None


# ------------------------------------------------------------------------------- the product path


def _file_path(doc_id: str) -> str:
    """Where a document lives below the workspace root: ``docs/<id>`` (``.txt`` added when the
    id has no extension, as Cranfield's numbers)."""
    name = doc_id if "." in doc_id.rsplit("/", 1)[-1] else f"{doc_id}.txt"
    return f"{DOCS_DIR}/{name}"


async def _open_workspace(fs: Any, root: str, index_dir: str) -> Workspace:
    from ..vfs import FsspecFilesystem
    from ..workspace import Workspace

    ws = Workspace(filesystem=FsspecFilesystem(fs, root=root), bm25=True, index_dir=index_dir,
                   tools={"auto_reindex": True})  # fmt: skip
    await ws.init()
    return ws


class _WorkspaceEngine(_Engine):
    """The Workspace over a backend; every timed step runs (and is timed) on the portal's loop."""

    layer = OURS

    def __init__(self, where: Path, portal: BlockingPortal, backend: Backend, root: str) -> None:
        super().__init__(where)
        self.portal = portal
        self.backend = backend
        self.root = root
        self.ws: Workspace | None = None
        self.ids: dict[str, str] = {}  # file path -> doc id
        self.texts: dict[str, str] = {}
        self.originals: dict[str, str] = {}  # doc id -> text before the update

    def _doc_ids(self, results: Sequence[Any]) -> list[str]:
        out: list[str] = []
        for r in results:
            doc = self.ids.get(str(r.id).split("#chunk-", 1)[0])
            if doc is not None and doc not in out:
                out.append(doc)
        return out

    def build(self, docs: Sequence[tuple[str, str]]) -> float:
        self.ids = {_file_path(d): d for d, _ in docs}
        self.texts = dict(docs)
        self.ws = self.portal.call(_open_workspace, self.backend.filesystem(), self.root, str(self.where / "index"))
        ws = self.ws

        async def timed() -> float:
            t0 = time.perf_counter()
            await ws.rebuild_search_index([DOCS_DIR])
            return time.perf_counter() - t0

        return self.portal.call(timed)

    def update(self, changes: Sequence[tuple[str, str]]) -> float:
        ws = self._workspace()

        async def timed() -> float:
            tools = await ws.create_tools()
            write = tools[_WRITE_TOOL]
            t0 = time.perf_counter()
            for doc_id, text in changes:
                self.originals.setdefault(doc_id, self.texts[doc_id])
                await write.execute({"path": _file_path(doc_id), "content": text})
            return time.perf_counter() - t0

        return self.portal.call(timed)

    def queries(self, queries: Sequence[str], warmup: int) -> tuple[list[float], list[list[str]]]:
        ws = self._workspace()

        async def timed() -> tuple[list[float], list[list[str]]]:
            for i in range(warmup if queries else 0):
                await ws.search(queries[i % len(queries)], top_k=TOP_K, mode="bm25")
            latencies: list[float] = []
            rankings: list[list[str]] = []
            for q in queries:
                t0 = time.perf_counter()
                results = await ws.search(q, top_k=TOP_K, mode="bm25")
                latencies.append(time.perf_counter() - t0)
                rankings.append(self._doc_ids(results))
            return latencies, rankings

        return self.portal.call(timed)

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        ws = self._workspace()
        return self._doc_ids(self.portal.call(functools.partial(ws.search, query, top_k=k, mode="bm25")))

    def _workspace(self) -> Workspace:
        if self.ws is None:
            raise RuntimeError("the workspace did not open")
        return self.ws

    def close(self) -> None:
        """Destroy the workspace (closing its index) and put the changed files back."""
        ws, self.ws = self.ws, None
        try:
            if ws is not None:
                self.portal.call(ws.destroy)
        finally:
            if self.originals:
                fs = self.backend.filesystem()
                fs.pipe({f"{self.root}/{_file_path(d)}": t.encode() for d, t in self.originals.items()})
                self.originals.clear()


def _put_documents(backend: Backend, root: str, docs: Sequence[tuple[str, str]]) -> None:
    fs = backend.filesystem()
    files = {f"{root}/{_file_path(d)}": t.encode() for d, t in docs}
    if backend.protocol == "file":  # a local directory must exist before a file is put in it
        for parent in sorted({p.rsplit("/", 1)[0] for p in files}):
            fs.makedirs(parent, exist_ok=True)
    fs.pipe(files)


def _run_backend(ctx: Context, backend: Backend, corpus: Corpus, n: int) -> None:
    from anyio.from_thread import start_blocking_portal

    root = f"{backend.root.rstrip('/')}/search-{n}"
    cases = _Cases.of(ctx, backend.name, OURS, corpus)
    cases.note(corpus.description)
    cases.build.notes.append(
        f"documents written as files to {backend.url.rstrip('/')}/search-{n}/{DOCS_DIR}; Workspace(filesystem="
        "FsspecFilesystem(...), bm25=True, index_dir on local disk).rebuild_search_index lists, reads and "
        "indexes them; files over 4,000 characters are indexed as chunks")
    cases.update.notes.append(
        "each changed file is written through the agent's write_file tool with tools={'auto_reindex': True}: "
        "the write to the backend and the re-index of that file")
    cases.query.notes.append("Workspace.search(mode='bm25', top_k=10); chunks are mapped to their files")
    ctx.progress.start(f"search on {backend.name}", 2 + 3 * ctx.repeat)
    try:
        try:
            _put_documents(backend, root, corpus.docs)
        except Exception as exc:
            cases.fail(f"writing the documents to {backend.url} failed: {type(exc).__name__}: {exc}", ctx)
            return
        finally:
            ctx.progress.advance(f"{len(corpus.docs)} documents written to {backend.name}")
        with start_blocking_portal() as portal:
            _rounds(ctx, cases, corpus, lambda where: _WorkspaceEngine(where, portal, backend, root))
    finally:
        try:
            backend.filesystem().rm(root, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            ctx.run.problem(f"search: could not remove {root} from {backend.name}: {type(exc).__name__}: {exc}")
        ctx.progress.advance(f"cleaned up {backend.name}")


# ------------------------------------------------------------------------------- the comparison


def _run_in_process(ctx: Context, corpus: Corpus) -> None:
    peers = bool(ctx.extras.get("peers", True))
    layers: list[str] = []
    for layer in _ENGINES:
        if layer != OURS_IN_PROCESS and not peers:
            continue
        why = _missing(layer)
        if why is None:
            layers.append(layer)
        else:
            ctx.run.skip_once(why)
    all_cases = {layer: _Cases.of(ctx, IN_PROCESS, layer, corpus) for layer in layers}
    for layer, cases in all_cases.items():
        cases.note(corpus.description)
        cases.note("in this process on the same texts as every other engine (no backend), with its own tokenizer")
        if _ENGINES[layer].rebuilds:
            cases.update.notes.append("cannot update an index in place: the changes are applied, then one rebuild")
        else:
            cases.update.notes.append("each changed document replaced and committed on its own")
    ctx.progress.start(f"search engines {IN_PROCESS}", 3 * ctx.repeat * len(layers))
    # Round-robin, so every engine sees each stretch of the machine's load.
    for r in range(ctx.repeat):
        for layer, cases in all_cases.items():
            if cases.stopped:
                for _ in range(3):
                    ctx.progress.advance(f"{layer}: skipped")
                continue
            _round(ctx, cases, corpus, _ENGINES[layer], r)


# ------------------------------------------------------------------------------- rounds


@dataclass
class _Cases:
    """The measurements of one engine on one backend."""

    build: Measurement
    update: Measurement
    query: Measurement
    scores: dict[str, Measurement]
    changed: int
    stopped: bool = False
    rounds: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, ctx: Context, backend: str, layer: str, corpus: Corpus) -> _Cases:
        docs = len(corpus.docs)
        changed = max(1, min(UPDATED_DOCS, docs // 100)) if docs else 0
        params: dict[str, Any] = {"corpus": corpus.name, "docs": docs}

        def m(case: str, label: str, unit: str) -> Measurement:
            return ctx.measurement(SUITE, case, backend, layer, label, unit, **params)

        scores = {"recall@10": m("recall@10", "recall@10", "score")}
        if corpus.graded:
            scores["ndcg@10"] = m("ndcg@10", "nDCG@10", "score")
        else:
            scores["mrr@10"] = m("mrr@10", "MRR@10 (known item)", "score")
        return cls(m("index_build", f"index build, {docs:,} documents", "s"),
                   m("update", f"update {changed} changed documents", "s"),
                   m("query", f"query latency, top {TOP_K} ({len(corpus.queries)} queries)", "ms"),
                   scores, changed)  # fmt: skip

    @property
    def all(self) -> list[Measurement]:
        return [self.build, self.update, self.query, *self.scores.values()]

    def note(self, text: str) -> None:
        for m in self.all:
            if text not in m.notes:
                m.notes.append(text)

    def fail(self, message: str, ctx: Context) -> None:
        for m in self.all:
            m.errors.append(message)
        ctx.progress.log(f"  error: {self.build.backend} / {self.build.layer}: {message}")
        self.stopped = True


def _guarded(fn: Callable[[], float]) -> Callable[[], float]:
    """``fn`` with any error turned into one that `Context.record` records (a DuckDB or tool
    error must not end the suite); KeyboardInterrupt passes."""

    def call() -> float:
        try:
            return fn()
        except (OSError, RuntimeError, ValueError, TimeoutError):
            raise
        except Exception as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc

    return call


def _marker(r: int, i: int) -> str:
    """A word in no corpus that every engine's tokenizer keeps whole (letters only)."""
    return "zqxmark" + "".join(chr(ord("a") + int(c)) for c in f"{r}{i:04d}")


def _scores(corpus: Corpus, rankings: Sequence[Sequence[str]]) -> dict[str, float]:
    if not rankings:
        raise ValueError("no queries to judge")
    if corpus.graded:
        pairs = [_corpus.ndcg_recall(ranked, gains, TOP_K) for ranked, gains in zip(rankings, corpus.judgements, strict=True)]
        return {"ndcg@10": statistics.fmean(p[0] for p in pairs), "recall@10": statistics.fmean(p[1] for p in pairs)}
    hits = [_corpus.reciprocal_rank(ranked, gains, TOP_K) for ranked, gains in zip(rankings, corpus.judgements, strict=True)]
    return {"recall@10": statistics.fmean(1.0 if h > 0 else 0.0 for h in hits), "mrr@10": statistics.fmean(hits)}


def _rounds(ctx: Context, cases: _Cases, corpus: Corpus, make: Callable[[Path], _Engine]) -> None:
    for r in range(ctx.repeat):
        if cases.stopped:
            for _ in range(3):
                ctx.progress.advance(f"{cases.build.layer}: skipped")
            continue
        _round(ctx, cases, corpus, make, r)


def _round(ctx: Context, cases: _Cases, corpus: Corpus, make: Callable[[Path], _Engine], r: int) -> None:
    """One round: a fresh index (timed), the queries (timed, then judged), an update (timed,
    then checked); the engine is closed and its scratch directory removed afterwards."""
    layer = cases.build.layer
    where = Path(tempfile.mkdtemp(prefix="search-", dir=ctx.workdir))
    engine: _Engine | None = None
    steps = 3
    try:
        try:
            engine = make(where)
        except Exception as exc:
            cases.fail(f"{type(exc).__name__}: {exc}", ctx)
            return
        eng = engine
        built = ctx.record(cases.build, _guarded(lambda: eng.build(corpus.docs)))
        steps -= 1
        ctx.progress.advance(f"{layer}: index build, round {r + 1}")
        if not built:
            return
        seconds = cases.build.samples[-1]
        if seconds > ctx.budget and r + 1 < ctx.repeat:
            cases.stopped = True
            cases.build.notes.append(f"rounds after {r + 1} skipped: one build took {seconds:.1f} s, over the "
                                     f"budget of {ctx.budget:.0f} s")  # fmt: skip

        rankings: list[list[str]] = []

        def queries() -> float:
            latencies, ranked = eng.queries(corpus.queries, ctx.warmup)
            cases.query.latencies.extend(latencies)
            rankings.extend(ranked)
            return statistics.median(latencies)

        queried = ctx.record(cases.query, _guarded(queries))
        steps -= 1
        ctx.progress.advance(f"{layer}: {len(corpus.queries)} queries, round {r + 1}")
        if queried:
            scores = _scores(corpus, rankings)
            for name, m in cases.scores.items():
                ctx.record(m, functools.partial(scores.__getitem__, name))

        picked = sorted(random.Random(_corpus.SEED + r).sample(range(len(corpus.docs)), cases.changed))
        changes = [(corpus.docs[i][0], f"{corpus.docs[i][1]}\n{_marker(r, j)}\n") for j, i in enumerate(picked)]

        def update() -> float:
            seconds = eng.update(changes)
            lost = [d for j, (d, _) in enumerate(changes) if d not in eng.search(_marker(r, j))]
            if lost:
                raise RuntimeError(f"{len(lost)} of {len(changes)} changed documents not found by their new word "
                                   f"after the update (first: {lost[0]})")  # fmt: skip
            return seconds

        ctx.record(cases.update, _guarded(update))
        steps -= 1
        ctx.progress.advance(f"{layer}: update {len(changes)} documents, round {r + 1}")
    finally:
        for _ in range(steps):
            ctx.progress.advance(f"{layer}: skipped")
        if engine is not None:
            try:
                engine.close()
            except Exception as exc:
                ctx.run.problem(f"search: closing {layer} on {cases.build.backend} failed: {type(exc).__name__}: {exc}")
        shutil.rmtree(where, ignore_errors=True)
