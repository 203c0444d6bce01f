"""BM25 benchmark: agentvfs's DuckDB index beside SQLite FTS5, tantivy, bm25s and DuckDB fts.

On a corpus of real text files available offline (man pages by default: every page under
/usr/share/man, gunzipped, roff stripped crudely; or Python sources), each engine runs in its
own process and reports: full build time and docs/s, one-document update (replace the text of
an existing document and make it searchable, commit included; p50), query latency p50/p95
over 200 queries (the NAME-line descriptions of 200 sampled pages, after 10 warm-up queries),
index size on disk and peak RSS. Cranfield (1,400 abstracts, 225 queries, graded qrels) gives
nDCG@10 and recall@10 for the reference tokenizer and the stemming one.

Engines that rebuild on change (bm25s, DuckDB fts) are updated 3 times; a peer that is not
installed is skipped with a message (``pip install tantivy bm25s duckdb-extension-fts==1.5.5``).

    python benchmarks/bench_search.py                 # man pages, all engines, Markdown
    python benchmarks/bench_search.py --json          # the same as JSON
    python benchmarks/bench_search.py --corpus py --max-docs 30000 --engines agentvfs,sqlite
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import importlib.metadata
import json
import os
import pickle
import platform
import random
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _cranfield
from _cranfield import CRANFIELD, ndcg_recall

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


ENGINES = {
    "agentvfs": "agentvfs BM25Index (DuckDB, postings cached in NumPy)",
    "agentvfs-sql": "agentvfs BM25Index (DuckDB, one SQL statement per query)",
    "sqlite": "SQLite FTS5 (stdlib, porter unicode61)",
    "tantivy": "tantivy (en_stem)",
    "bm25s": "bm25s (rebuild on change)",
    "duckdb-fts": "DuckDB fts extension (rebuild on change)",
}
REBUILDS = {"bm25s", "duckdb-fts"}

# ------------------------------------------------------------------------------- corpora

_ROFF_ESCAPE = re.compile(
    r"\\f(?:\[[^\]]*\]|\(..|.)|\\\(..|\\\[[^\]]*\]|\\\*(?:\[[^\]]*\]|\(..|.)|\\[sS][-+]?\d+"
    r"|\\[&|^%c]|\\e"
)


def strip_roff(text: str) -> str:
    """Crude roff to text: drop comments, keep macro arguments, drop font/char escapes."""
    out = []
    for line in text.split("\n"):
        if line.startswith(('.\\"', "'\\\"", ".\\}")):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            line = parts[1].replace('"', "") if len(parts) > 1 else ""
        out.append(_ROFF_ESCAPE.sub("", line).replace("\\-", "-").replace("\\\\", "\\"))
    return "\n".join(out)


def man_pages(root: str = "/usr/share/man") -> list[tuple[str, str]]:
    docs = []
    for path in sorted(Path(root).rglob("*.gz")):
        try:
            raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        except (OSError, EOFError):
            continue
        if raw.startswith(".so ") and raw.count("\n") <= 2:
            continue  # a redirect to another page
        docs.append((str(path.relative_to(root)), strip_roff(raw)))
    return docs


def python_sources() -> list[tuple[str, str]]:
    roots = [
        Path(p) for p in ("/usr/lib/google-cloud-sdk", str(Path.home() / ".pyenv"), "/usr/lib")
    ]
    seen: set[str] = set()
    docs = []
    for root in roots:
        if not root.exists():
            continue
        for path in sorted(root.rglob("*.py")):
            key = str(path)
            if key in seen or not path.is_file():
                continue
            seen.add(key)
            try:
                docs.append((key, path.read_text("utf-8", "replace")))
            except OSError:
                continue
    return docs


def name_queries(docs: Sequence[tuple[str, str]], n: int, seed: int = 42) -> list[str]:
    """The descriptions of NAME lines (``foo - do something``) of ``n`` sampled man pages."""
    found = []
    for _, text in docs:
        at = text.find("NAME\n")
        if at < 0:
            continue
        line = text[at + 5 : at + 600].strip().split("\n")[0]
        if " - " in line:
            description = line.split(" - ", 1)[1].strip()
            if len(description.split()) >= 2:
                found.append(description)
    rng = random.Random(seed)
    rng.shuffle(found)
    if len(found) < n:  # Python sources: lines of code as queries
        rng2 = random.Random(seed)
        while len(found) < n:
            _, text = docs[rng2.randrange(len(docs))]
            lines = [x.strip() for x in text.split("\n") if len(x.split()) >= 3]
            if lines:
                found.append(lines[rng2.randrange(len(lines))][:120])
    return found[:n]



def cranfield() -> tuple[list[tuple[str, str]], list[str], dict[int, dict[str, int]]]:
    return _cranfield.cranfield(with_title=True)


# ------------------------------------------------------------------------------- engines


class Engine:
    """Build once, update one document, query; ``disk`` is the bytes its files take."""

    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        raise NotImplementedError

    def update(self, doc_id: str, text: str) -> None:
        raise NotImplementedError

    def search(self, query: str, k: int = 10) -> list[str]:
        raise NotImplementedError

    def reopen(self, where: Path) -> None:
        """Drop what is open and open the index in ``where`` again, as a new process would
        (the next search answers from what that opening found)."""
        raise NotImplementedError


def _disk(where: Path) -> int:
    if where.is_file():
        return where.stat().st_size
    return sum(p.stat().st_size for p in where.rglob("*") if p.is_file())


@functools.cache
def _reference_tokenizer() -> Callable[[str], list[str]]:
    from agentvfs.search._tokenize import make_tokenizer

    return make_tokenizer(None)


def _ref_tokens(text: str) -> list[str]:
    """The reference tokenizer, to turn queries into plain term lists for query parsers."""
    return _reference_tokenizer()(text)


class AgentvfsEngine(Engine):
    def __init__(self, *, cache: bool, stem: bool = False) -> None:
        self.cache = cache
        self.stem = stem

    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        from agentvfs.search._bm25 import BM25Index

        self.index = BM25Index(
            where / "bm25.duckdb",
            cache_postings=self.cache,
            tokenize={"stem": True} if self.stem else None,
        )
        batch = 2000
        for i in range(0, len(docs), batch):
            self.index.add_many([(d, t, None, None) for d, t in docs[i : i + batch]])
        # As a workspace's index ends a build: its checkpoint written, the file closed.
        self.index.write_checkpoint()
        self.index.close()
        self.reopen(where)

    def reopen(self, where: Path) -> None:
        from agentvfs.search._bm25 import BM25Index

        if getattr(self, "index", None) is not None:
            self.index.close()
        self.index = BM25Index(
            where / "bm25.duckdb",
            cache_postings=self.cache,
            tokenize={"stem": True} if self.stem else None,
        )

    def update(self, doc_id: str, text: str) -> None:
        self.index.add(doc_id, text)

    def search(self, query: str, k: int = 10) -> list[str]:
        return [h.id for h in self.index.search(query, top_k=k)]


class SqliteEngine(Engine):
    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        import sqlite3

        self.db = sqlite3.connect(where / "fts.sqlite")
        self.db.execute(
            "CREATE VIRTUAL TABLE fts USING fts5(id UNINDEXED, body, tokenize='porter unicode61')"
        )
        self.db.executemany("INSERT INTO fts(id, body) VALUES (?, ?)", docs)
        self.db.commit()

    def reopen(self, where: Path) -> None:
        import sqlite3

        self.db.close()
        self.db = sqlite3.connect(where / "fts.sqlite")

    def update(self, doc_id: str, text: str) -> None:
        self.db.execute("DELETE FROM fts WHERE id = ?", (doc_id,))
        self.db.execute("INSERT INTO fts(id, body) VALUES (?, ?)", (doc_id, text))
        self.db.commit()

    def search(self, query: str, k: int = 10) -> list[str]:
        terms = sorted(set(_ref_tokens(query)))
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        rows = self.db.execute(
            "SELECT id FROM fts WHERE fts MATCH ? ORDER BY bm25(fts) LIMIT ?", (match, k)
        ).fetchall()
        return [r[0] for r in rows]


class TantivyEngine(Engine):
    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", stored=True, tokenizer_name="raw")
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        schema = builder.build()
        (where / "tantivy").mkdir()
        self.index = tantivy.Index(schema, path=str(where / "tantivy"))
        self.writer = self.index.writer(heap_size=200_000_000, num_threads=1)
        for doc_id, text in docs:
            self.writer.add_document(tantivy.Document(id=doc_id, body=text))
        self.writer.commit()
        self.writer.wait_merging_threads()
        self.writer = self.index.writer(heap_size=50_000_000, num_threads=1)
        self.index.reload()
        self.searcher = self.index.searcher()

    def reopen(self, where: Path) -> None:
        import tantivy

        del self.writer, self.searcher, self.index
        self.index = tantivy.Index.open(str(where / "tantivy"))
        self.writer = self.index.writer(heap_size=50_000_000, num_threads=1)
        self.searcher = self.index.searcher()

    def update(self, doc_id: str, text: str) -> None:
        import tantivy

        self.writer.delete_documents_by_term("id", doc_id)
        self.writer.add_document(tantivy.Document(id=doc_id, body=text))
        self.writer.commit()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query: str, k: int = 10) -> list[str]:
        terms = _ref_tokens(query)
        if not terms:
            return []
        parsed, _ = self.index.parse_query_lenient(" ".join(terms), ["body"])
        hits = self.searcher.search(parsed, k).hits
        return [self.searcher.doc(address)["id"][0] for _, address in hits]


class Bm25sEngine(Engine):
    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        self.docs = dict(docs)
        self._index()

    def _index(self) -> None:
        import bm25s
        import Stemmer

        self.stemmer = Stemmer.Stemmer("english")
        self.ids = list(self.docs)
        tokens = bm25s.tokenize(
            list(self.docs.values()), stopwords="en", stemmer=self.stemmer, show_progress=False
        )
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)

    def update(self, doc_id: str, text: str) -> None:
        self.docs[doc_id] = text
        self._index()

    def reopen(self, where: Path) -> None:
        import bm25s

        # Saved once (not timed), then loaded: what a new process does with a saved index.
        saved = where / "bm25s"
        if not saved.exists():
            self.retriever.save(str(saved))
        del self.retriever
        self.retriever = bm25s.BM25.load(str(saved))

    def search(self, query: str, k: int = 10) -> list[str]:
        import bm25s

        tokens = bm25s.tokenize(
            [query], stopwords="en", stemmer=self.stemmer, show_progress=False, return_ids=False
        )
        if not tokens or not tokens[0]:
            return []
        results, _ = self.retriever.retrieve(
            [tokens[0]], k=min(k, len(self.ids)), show_progress=False
        )
        return [self.ids[int(i)] for i in results[0]]


class DuckdbFtsEngine(Engine):
    def build(self, docs: Sequence[tuple[str, str]], where: Path) -> None:
        import duckdb
        import duckdb_extension_fts

        ext = (
            Path(duckdb_extension_fts.__file__).parent
            / "extensions"
            / f"v{duckdb.__version__}"
            / "fts.duckdb_extension"
        )
        self.con = duckdb.connect(
            str(where / "fts.duckdb"),
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
        )
        self.con.execute(f"LOAD '{ext}'")
        self.con.execute("CREATE TABLE docs(id VARCHAR PRIMARY KEY, body VARCHAR)")
        self.con.executemany("INSERT INTO docs VALUES (?, ?)", docs)
        self.con.execute("PRAGMA create_fts_index('docs', 'id', 'body')")
        self.con.execute("CHECKPOINT")
        self._ext = ext

    def reopen(self, where: Path) -> None:
        import duckdb

        self.con.close()
        self.con = duckdb.connect(
            str(where / "fts.duckdb"),
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
        )
        self.con.execute(f"LOAD '{self._ext}'")

    def update(self, doc_id: str, text: str) -> None:
        self.con.execute("UPDATE docs SET body = ? WHERE id = ?", (text, doc_id))
        self.con.execute("PRAGMA create_fts_index('docs', 'id', 'body', overwrite=1)")

    def search(self, query: str, k: int = 10) -> list[str]:
        rows = self.con.execute(
            "SELECT id FROM (SELECT id, fts_main_docs.match_bm25(id, ?) AS score FROM docs)"
            " WHERE score IS NOT NULL ORDER BY score DESC LIMIT ?",
            (query, k),
        ).fetchall()
        return [r[0] for r in rows]


def make_engine(name: str, *, stem: bool = False) -> Engine:
    if name == "agentvfs":
        return AgentvfsEngine(cache=True, stem=stem)
    if name == "agentvfs-sql":
        return AgentvfsEngine(cache=False, stem=stem)
    return {
        "sqlite": SqliteEngine,
        "tantivy": TantivyEngine,
        "bm25s": Bm25sEngine,
        "duckdb-fts": DuckdbFtsEngine,
    }[name]()


def missing_dependency(name: str) -> str | None:
    """Why ``name`` cannot run here, or None."""
    modules = {
        "agentvfs": ["duckdb", "numpy"],
        "agentvfs-sql": ["duckdb", "numpy"],
        "sqlite": ["sqlite3"],
        "tantivy": ["tantivy"],
        "bm25s": ["bm25s", "Stemmer"],
        "duckdb-fts": ["duckdb", "duckdb_extension_fts"],
    }[name]
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            return f"skipped: {module} is not installed (pip install {_PIP.get(module, module)})"
    if name == "sqlite":
        import sqlite3

        try:
            sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        except sqlite3.OperationalError:
            return "skipped: this sqlite3 has no FTS5"
    return None


_PIP = {
    "Stemmer": "PyStemmer",
    "duckdb_extension_fts": "duckdb-extension-fts==1.5.5",
}

# ------------------------------------------------------------------------------- one engine


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_engine(name: str, corpus_file: Path, n_queries: int, n_updates: int) -> dict[str, Any]:
    """Measure one engine (in this process) and return its figures."""
    with corpus_file.open("rb") as fh:
        docs, queries = pickle.load(fh)
    queries = queries[:n_queries]
    where = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        engine = make_engine(name)
        t0 = time.perf_counter()
        engine.build(docs, where)
        build = time.perf_counter() - t0
        # The first query loads what a lazy engine loads (agentvfs: the posting cache).
        t0 = time.perf_counter()
        engine.search(queries[0])
        first_query = time.perf_counter() - t0
        if isinstance(engine, Bm25sEngine):
            engine.reopen(where)  # its save, untimed (it keeps nothing on disk by itself)
        # Reopening the built index, as a new session does, and its first answer.
        t0 = time.perf_counter()
        engine.reopen(where)
        engine.search(queries[1])
        reopen = time.perf_counter() - t0
        for q in queries[:10]:
            engine.search(q)
        latencies = []
        for q in queries:
            t0 = time.perf_counter()
            engine.search(q)
            latencies.append((time.perf_counter() - t0) * 1000)
        rng = random.Random(7)
        updates = []
        missed = 0
        for i in range(3 if name in REBUILDS else n_updates):
            doc_id, text = docs[rng.randrange(len(docs))]
            marker = f"zqxupdate{i}marker"
            t0 = time.perf_counter()
            engine.update(doc_id, text + "\n" + marker)
            updates.append((time.perf_counter() - t0) * 1000)
            if doc_id not in engine.search(marker, 3):
                missed += 1
        # Queries again, now that updates left their traces (deltas, segments).
        after = []
        for q in queries:
            t0 = time.perf_counter()
            engine.search(q)
            after.append((time.perf_counter() - t0) * 1000)
        del engine
        disk = _disk(where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return {
        "engine": name,
        "docs": len(docs),
        "build_s": build,
        "docs_per_s": len(docs) / build,
        "first_query_ms": first_query * 1000,
        "reopen_ms": reopen * 1000,
        "query_p50_ms": percentile(latencies, 0.5),
        "query_p95_ms": percentile(latencies, 0.95),
        "query_after_updates_p50_ms": percentile(after, 0.5),
        "query_after_updates_p95_ms": percentile(after, 0.95),
        "update_p50_ms": statistics.median(updates),
        "update_max_ms": max(updates),
        "updates": len(updates),
        "updates_not_found": missed,
        "disk_mb": disk / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_cranfield(name: str, stem: bool) -> dict[str, Any]:
    docs, queries, qrels = cranfield()
    where = Path(tempfile.mkdtemp(prefix=f"cran-{name}-"))
    try:
        engine = make_engine(name, stem=stem)
        engine.build(docs, where)
        ndcgs, recalls = [], []
        for number, query in enumerate(queries, start=1):
            gains = qrels.get(number)
            if not gains:
                continue
            nd, rc = ndcg_recall(engine.search(query, 10), gains)
            ndcgs.append(nd)
            recalls.append(rc)
        del engine
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return {
        "engine": name,
        "stem": stem,
        "queries": len(ndcgs),
        "ndcg10": statistics.fmean(ndcgs),
        "recall10": statistics.fmean(recalls),
    }


# ------------------------------------------------------------------------------- reporting


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1]) / 1024**2
    except (OSError, ValueError, IndexError):
        mem = float("nan")
    versions = {}
    for dist in ("duckdb", "numpy", "tantivy", "bm25s", "PyStemmer", "duckdb-extension-fts"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    import sqlite3

    versions["sqlite"] = sqlite3.sqlite_version
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "versions": versions,
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, {m['os']}, "
        f"Python {m['python']}; load average at start {', '.join(f'{x:.2f}' for x in m['load_average'])}"
        + (
            f", at end {', '.join(f'{x:.2f}' for x in report['load_average_at_end'])}. "
            if report.get("load_average_at_end")
            else ". "
        )
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "",
        f"Corpus: {report['corpus']} ({report['docs']} documents, {report['corpus_mb']:.1f} MB of "
        f"text); {report['queries']} queries.",
        "",
        "| engine | build s | docs/s | update 1 doc p50 ms (max) | query p50 ms | query p95 ms "
        "| p50 / p95 after updates | first query ms (loads, compacts) | reopen + first query ms "
        "| disk MB | peak RSS MB |",
        "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for r in report["engines"]:
        if "skipped" in r:
            lines.append(f"| {ENGINES[r['engine']]} | {r['skipped']} | | | | | | | | | |")
            continue
        missed = f", {r['updates_not_found']} not found" if r["updates_not_found"] else ""
        lines.append(
            f"| {ENGINES[r['engine']]} | {r['build_s']:.1f} | {r['docs_per_s']:,.0f} "
            f"| {r['update_p50_ms']:,.1f} ({r['update_max_ms']:,.0f}; n={r['updates']}{missed}) "
            f"| {r['query_p50_ms']:.2f} | {r['query_p95_ms']:.2f} "
            f"| {r['query_after_updates_p50_ms']:.2f} / {r['query_after_updates_p95_ms']:.2f} "
            f"| {r['first_query_ms']:,.0f} | {r.get('reopen_ms', float('nan')):,.0f} "
            f"| {r['disk_mb']:.1f} | {r['peak_rss_mb']:.0f} |"
        )
    if report.get("cranfield"):
        lines += [
            "",
            "Cranfield (1,400 docs, 225 queries, gain 5 - code):",
            "",
            "| engine | tokenizer | nDCG@10 | recall@10 |",
            "| --- | --- | --: | --: |",
        ]
        for r in report["cranfield"]:
            if "skipped" in r:
                lines.append(f"| {ENGINES[r['engine']]} | {r['skipped']} | | |")
                continue
            tokenizer = "reference + Snowball English" if r["stem"] else "reference"
            if not r["engine"].startswith("agentvfs"):
                tokenizer = "its own"
            lines.append(
                f"| {ENGINES[r['engine']]} | {tokenizer} | {r['ndcg10']:.3f} | {r['recall10']:.3f} |"
            )
    return "\n".join(lines)


def _worker(args: list[str]) -> dict[str, Any]:
    """Run in a child process: ``--_worker KIND NAME ...`` (one engine, fresh memory)."""
    kind, name = args[0], args[1]
    if kind == "corpus":
        return run_engine(name, Path(args[2]), int(args[3]), int(args[4]))
    return run_cranfield(name, args[2] == "stem")


def _child(argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--_worker", *argv], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().split("\n") or ["?"])[-1]
        return {"engine": argv[1], "skipped": f"failed: {tail[:200]}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().split("\n")[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_worker":
        print(json.dumps(_worker(argv[1:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", choices=["man", "py"], default="man")
    parser.add_argument("--max-docs", type=int, default=0, help="use at most this many (0: all)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--updates", type=int, default=50, help="updates for incremental engines")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    parser.add_argument("--no-cranfield", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        parser.error(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")

    report: dict[str, Any] = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *argv]),
        "machine": machine(),
    }
    docs = man_pages() if args.corpus == "man" else python_sources()
    if args.max_docs:
        docs = random.Random(1).sample(docs, min(args.max_docs, len(docs)))
    man = docs if args.corpus == "man" else man_pages()
    queries = name_queries(man, args.queries)
    report.update(
        corpus="man pages (/usr/share/man, roff stripped)"
        if args.corpus == "man"
        else "Python sources",
        docs=len(docs),
        corpus_mb=sum(len(t) for _, t in docs) / 1e6,
        queries=len(queries),
        corpus_sha=hashlib.sha256("".join(d for d, _ in docs).encode()).hexdigest()[:12],
    )
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        corpus_file = Path(tmp) / "corpus.pickle"
        with corpus_file.open("wb") as fh:
            pickle.dump((docs, queries), fh)
        results = []
        for name in names:
            why = missing_dependency(name)
            if why:
                results.append({"engine": name, "skipped": why})
                continue
            print(f"... {name}", file=sys.stderr, flush=True)
            results.append(
                _child(["corpus", name, str(corpus_file), str(args.queries), str(args.updates)])
            )
        report["engines"] = results
    cran: list[dict[str, Any]] = []
    if not args.no_cranfield and CRANFIELD.exists():
        for name in names:
            if name == "agentvfs-sql":
                continue  # same scores as agentvfs
            why = missing_dependency(name)
            if why:
                cran.append({"engine": name, "skipped": why})
                continue
            stems = [False, True] if name == "agentvfs" else [False]
            for stem in stems:
                print(f"... cranfield {name}{' stem' if stem else ''}", file=sys.stderr, flush=True)
                cran.append(_child(["cranfield", name, "stem" if stem else "plain"]))
    report["cranfield"] = cran
    report["load_average_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
