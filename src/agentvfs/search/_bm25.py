"""BM25 kept in DuckDB: incremental postings, the reference's scores, persistence.

Storage (tables prefixed ``bm25_`` so other tables can share the file):

* ``bm25_docs(doc, id, len, terms, content, metadata, start_line_offset)``: one row per
  document (content as zstd-compressed UTF-8, or zlib in files from format version 1;
  metadata as JSON). ``doc`` is a number that only
  grows, so the order of ``doc`` is the order documents were (last) added, the reference's tie
  order, and a ``doc`` is never reused.
* ``bm25_postings(term, doc, tf)``: one row per distinct term of a document. ``term`` is a 63-bit
  BLAKE2b hash of the token (cheaper to compare and store than text), so two tokens with the
  same hash would count as one term; at a million distinct terms that happens with odds of
  about 3 in 10^8. A removed document only loses its ``bm25_docs`` row: every reader joins
  postings with it, and its postings are garbage until a compaction (`BM25Index.optimize`)
  rewrites the table sorted by term.
* ``bm25_stats``: the running sums N (documents) and total length, the next ``doc``, a version
  that every write bumps, and the sorted/appended/dead posting counts that decide when to
  compact; ``bm25_meta``: format, version and the k1/b/tokenizer options.

Adding, replacing or removing a document is one transaction of a few statements whose cost does
not depend on the corpus (document frequencies are counted at query time from the postings of
the query terms); compactions run when the garbage or the unsorted tail has grown in proportion
to the index, so their cost per write is an amortised constant.

Queries are scored either by default with NumPy over an in-memory copy of the postings
(term-sorted arrays plus a delta of recent additions) loaded from DuckDB at the first search and
kept up to date by every write, or with ``cache_postings=False`` in one SQL statement. The
cached path adds the per-term contributions in the reference's order (query tokens in order,
duplicates included) and takes logarithms as V8 does, so scores and ties are the reference's bit
for bit; the SQL path agrees to about 1e-15 (see ``_SEARCH_SQL``). On ~24k man pages the cached
path answers in a few milliseconds and the SQL one in 10-40 ms (it scans the row groups of the
query terms and the unsorted tail); ``benchmarks/bench_search.py`` measures both.

Concurrency: all methods are thread-safe (one lock per index). DuckDB lets one process open a
file for writing, or any number of processes read-only (``read_only=True``); opening a file that
another process holds for writing (or reading, to write) raises `BM25FileError` at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import threading
import uuid
import weakref
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import numpy.typing as npt
import zstandard

from ..errors import BM25FileError
from ._duckdb import connect, no_pandas_lookups, registered, table_names, transaction, trouble
from ._ids import CHUNK_ID
from ._postings import PostingCache
from ._scoring import DocumentSource, rank
from ._scoring import js_log as js_log  # re-exported: tests and benchmarks use it here
from ._tokenize import TokenizeOptions, Tokenizer, line_finder, make_tokenizer

if TYPE_CHECKING:
    from ._checkpoint import Checkpoint

__all__ = ["BM25Hit", "BM25Index"]

#: The checkpoint of ``search.duckdb`` is ``search.duckdb.checkpoint.seg`` (``_checkpoint.py``).
CHECKPOINT_SUFFIX = ".checkpoint.seg"

FORMAT = "agentvfs-bm25"
FORMAT_VERSION = 2
#: Versions this one opens. Version 2 stores texts as zstd; a version 1 file is read as it is
#: and marked version 2 when opened for writing (its new texts are zstd, its old ones stay
#: zlib; each says which it is), so an older agentvfs refuses it instead of misreading it.
_READABLE_VERSIONS = ("1", "2")
START_LINE_KEY = "_startLineOffset"

_HASH_CACHE_SIZE = 250_000
#: A batch of at least this many documents is compressed on a thread of its own.
_PACK_ON_THREAD = 64
#: On disk: postings of removed documents are dropped once they are as many as the live ones
#: (and at least this many); SQL scoring also re-sorts once the unsorted tail is an eighth of
#: the sorted postings (and at least this many). See `BM25Index.optimize`.
_DEAD_MIN_ROWS = 1_000_000
_TAIL_MIN_ROWS = 200_000

_POSTINGS_TABLE = (
    "CREATE TABLE {name}(term BIGINT NOT NULL, doc BIGINT NOT NULL, tf INTEGER NOT NULL)"
)
_SCHEMA = (
    "CREATE TABLE bm25_meta(key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    "CREATE TABLE bm25_stats(n BIGINT NOT NULL, total_len BIGINT NOT NULL,"
    " next_doc BIGINT NOT NULL, version BIGINT NOT NULL, sorted_rows BIGINT NOT NULL,"
    " tail_rows BIGINT NOT NULL, dead_rows BIGINT NOT NULL)",
    "CREATE TABLE bm25_docs(doc BIGINT PRIMARY KEY, id VARCHAR NOT NULL UNIQUE,"
    " len INTEGER NOT NULL, terms INTEGER NOT NULL, content BLOB NOT NULL, metadata VARCHAR,"
    " start_line_offset BIGINT)",
    _POSTINGS_TABLE.format(name="bm25_postings"),
    "INSERT INTO bm25_stats VALUES (0, 0, 0, 0, 0, 0, 0)",
)
_TABLES = frozenset({"bm25_meta", "bm25_stats", "bm25_docs", "bm25_postings"})

# One statement per query: document frequencies from the matching postings, the reference's
# arithmetic in the reference's order, ties by first query position then insertion order. Two
# differences in the last bits remain: DuckDB's ln is the C library's (V8's log differs by one
# unit in the last place for about 3 % of inputs) and SUM may add a document's terms in another
# order. (A Python UDF for V8's log would fix the first, but a UDF registered on one connection
# crashes the process once that connection is closed while another still uses the database.)
_SEARCH_SQL = """
WITH q AS (SELECT unnest($terms::BIGINT[]) AS term, unnest($pos::INTEGER[]) AS pos,
                  unnest($weights::DOUBLE[]) AS w),
hits AS MATERIALIZED (
    SELECT p.term, p.doc, p.tf, d.len FROM bm25_postings p JOIN bm25_docs d ON d.doc = p.doc
         WHERE p.term IN ({terms})),
df AS (SELECT term, count(*) AS df FROM hits GROUP BY term),
qi AS (SELECT q.term, q.pos, q.w, ln(($n - df.df + 0.5) / (df.df + 0.5) + 1) AS idf
       FROM q JOIN df USING (term)),
scored AS (
    SELECT h.doc,
           sum(qi.w * (qi.idf * ((h.tf * $k1_plus_1)
               / (h.tf + $k1 * ($one_minus_b + $b * (h.len / $avgdl)))))) AS score,
           min(qi.pos) AS first_pos
    FROM hits h JOIN qi USING (term)
    GROUP BY h.doc),
top AS (SELECT * FROM scored WHERE score >= $min_score
        ORDER BY score DESC, first_pos, doc LIMIT $top_k)
SELECT top.doc, top.score FROM top ORDER BY top.score DESC, top.first_pos, top.doc
"""





@dataclass(frozen=True, slots=True)
class BM25Hit:
    """One search result: the document, its raw BM25 score and where the query terms are.

    ``line_range`` is 1-based and inclusive, shifted by the document's start line offset;
    ``metadata`` is what was indexed without ``_startLineOffset``, None when empty.
    """

    id: str
    score: float
    content: str
    metadata: dict[str, Any] | None
    line_range: tuple[int, int] | None


@dataclass(slots=True)
class _Stats:
    """The row of ``bm25_stats``: running sums and the state of the postings table."""

    n: int  # documents
    total_len: int  # their tokens
    next_doc: int
    version: int  # bumped by every write
    sorted_rows: int  # postings sorted by (term, doc) at the last compaction
    tail_rows: int  # postings appended since, in document order
    dead_rows: int  # postings of removed documents, dropped at the next compaction

    COLUMNS = "n, total_len, next_doc, version, sorted_rows, tail_rows, dead_rows"


@dataclass(slots=True)
class _Prepared:
    id: str
    content: bytes
    metadata: str | None
    start_line_offset: int | None
    terms: npt.NDArray[np.int64]
    tfs: npt.NDArray[np.int32]
    length: int


class _HashTable(dict[str, int]):
    """Term -> 63-bit hash, computed on first lookup (from C: ``map(table.__getitem__, ...)``
    hashes a batch's terms without a Python loop over the known ones)."""

    def __missing__(self, term: str) -> int:
        digest = hashlib.blake2b(term.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        value = self[term] = int.from_bytes(digest, "little") >> 1
        return value


_HASHES = _HashTable()


def _hash_table() -> _HashTable:
    """The table of known term hashes, emptied first when it has grown past its bound (at
    most one batch's new terms over it: callers take it once per batch)."""
    if len(_HASHES) > _HASH_CACHE_SIZE:
        _HASHES.clear()  # (atomic: another thread's lookups then compute again)
    return _HASHES


def _term_hashes(terms: Iterable[str]) -> npt.NDArray[np.int64]:
    """63-bit BLAKE2b hashes of ``terms`` as int64 (stable across processes and versions)."""
    return np.fromiter(map(_hash_table().__getitem__, terms), np.int64)


class BM25Index:
    """A BM25 index of text documents in DuckDB, scored exactly as the reference scores.

    Parameters
    ----------
    path
        The DuckDB file; None keeps the index in memory. With a path the index persists and
        reopening finds its documents. A 0-byte file counts as absent.
    k1, b
        BM25 parameters (reference defaults 1.5 and 0.75).
    tokenize
        `TokenizeOptions`, a mapping of them (snake_case or camelCase keys), or a callable
        ``text -> list[str]`` that replaces the whole pipeline.
    read_only
        Open an existing index for reading only; many processes may do so at once.
    cache_postings
        Score with NumPy over an in-memory copy of the postings (default, fast) instead of one
        SQL statement in DuckDB (no memory beyond DuckDB's own).

    Raises
    ------
    ValueError
        The file holds an index built with other k1, b or tokenizer options (the message names
        each difference), or an option is invalid.
    BM25FileError
        The file is not a DuckDB database, is corrupt, holds other tables and no index, or
        another process holds it; nothing is changed or deleted.
    FileNotFoundError
        ``read_only`` and the file does not exist.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        tokenize: TokenizeOptions | Mapping[str, Any] | Callable[[str], list[str]] | None = None,
        read_only: bool = False,
        cache_postings: bool = True,
    ) -> None:
        self._k1 = _finite("k1", k1)
        self._b = _finite("b", b)
        self._tokenizer = make_tokenizer(tokenize)
        self._path = os.fspath(path) if path is not None else None
        self._read_only = read_only
        self._cache_postings = cache_postings
        self._cache: PostingCache | None = None
        # The checkpoint beside the file (see ``_checkpoint.py``), mapped at the first search.
        self._checkpoint: Checkpoint | None = None
        self._checkpoint_looked = False
        self._instance: str | None = None
        self._shared = _shared_state(self._path)
        self._lock = self._shared.lock
        self._closed = False
        self._options = {"k1": self._k1, "b": self._b, "tokenize": self._tokenizer_record()}
        self._con = self._connect()
        with self._lock:
            self._shared.open += 1
        # Runs once: at close, or when the index is collected without being closed.
        self._forget = weakref.finalize(self, self._shared.release)
        try:
            self._open_schema()
        except BaseException:
            self._release()
            raise

    # ----------------------------------------------------------------------------- opening

    def tokenizer_options(self) -> dict[str, Any]:
        """The tokenizer's options as recorded (``TokenizeOptions.to_dict()``, or the name of
        a custom tokenizer): indexes built with the same ones tokenize alike."""
        return self._tokenizer_record()

    def _tokenizer_record(self) -> dict[str, Any]:
        if isinstance(self._tokenizer, Tokenizer):
            return self._tokenizer.options.to_dict()
        fn = self._tokenizer
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return {"custom": f"{getattr(fn, '__module__', '?')}.{name}"}

    def _connect(self) -> duckdb.DuckDBPyConnection:
        path = self._path
        if path is None:
            if self._read_only:
                raise ValueError("read_only needs a path: an in-memory index starts empty")
            return connect(":memory:")
        exists = os.path.exists(path)
        if self._read_only and not exists:
            raise FileNotFoundError(f"BM25 index file {path} does not exist")
        if exists and not self._read_only and os.path.isfile(path) and os.path.getsize(path) == 0:
            # An empty file (e.g. from mkstemp) holds nothing to lose; DuckDB refuses it.
            os.unlink(path)
        try:
            con = connect(path, read_only=self._read_only)
        except duckdb.Error as exc:
            raise _file_error(path, exc) from exc
        return con

    def _open_schema(self) -> None:
        con = self._con
        where = self._path or ":memory:"
        try:
            tables = table_names(con)
        except duckdb.Error as exc:
            raise _file_error(where, exc) from exc
        if "bm25_meta" not in tables:
            if tables:
                listed = ", ".join(sorted(tables)[:5])
                raise BM25FileError(
                    f"{where} is a DuckDB database without a BM25 index (it has tables {listed}); "
                    "it was left untouched",
                    where,
                )
            if self._read_only:
                raise BM25FileError(f"{where} holds no BM25 index (opened read-only)", where)
            with self._transaction() as cur:
                for statement in _SCHEMA:
                    cur.execute(statement)
                cur.executemany(
                    "INSERT INTO bm25_meta VALUES (?, ?)",
                    [
                        ("format", FORMAT),
                        ("format_version", str(FORMAT_VERSION)),
                        ("options", json.dumps(self._options, sort_keys=True)),
                        # Tells this index's checkpoint from one left by an index deleted and
                        # made again at the same path (whose document numbers start over).
                        ("instance", uuid.uuid4().hex),
                    ],
                )
                row = cur.execute("SELECT value FROM bm25_meta WHERE key = 'instance'").fetchone()
                self._instance = str(row[0]) if row is not None else None
            return
        try:
            meta = dict(con.execute("SELECT key, value FROM bm25_meta").fetchall())
            missing = _TABLES - tables
            if meta.get("format") != FORMAT or missing:
                raise BM25FileError(
                    f"{where} is not an agentvfs BM25 index (format {meta.get('format')!r}"
                    + (f", missing tables {', '.join(sorted(missing))}" if missing else "")
                    + "); it was left untouched",
                    where,
                )
            if meta.get("format_version") not in _READABLE_VERSIONS:
                raise BM25FileError(
                    f"{where} holds a BM25 index of format version {meta.get('format_version')}, "
                    f"this version reads {' and '.join(_READABLE_VERSIONS)}; it was left untouched",
                    where,
                )
            recorded = json.loads(meta.get("options", "{}"))
            self._instance = meta.get("instance")
            stats = con.execute("SELECT n FROM bm25_stats").fetchall()
            count = con.execute("SELECT count(*) FROM bm25_docs").fetchone()
        except duckdb.Error as exc:
            raise _file_error(where, exc) from exc
        if len(stats) != 1 or count is None or stats[0][0] != count[0]:
            raise BM25FileError(
                f"{where}: the BM25 index is inconsistent (stats {stats}, {count} documents); "
                "it was left untouched",
                where,
            )
        differences = _differences(recorded, self._options)
        if differences:
            raise ValueError(
                f"BM25 index {where} was built with other options: {'; '.join(differences)}. "
                "Open it with the recorded options, or rebuild it"
            )
        if meta.get("format_version") != str(FORMAT_VERSION) and not self._read_only:
            with self._transaction() as cur:
                cur.execute(
                    "UPDATE bm25_meta SET value = ? WHERE key = 'format_version'", [str(FORMAT_VERSION)]
                )

    # ----------------------------------------------------------------------- transactions

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the index lock on an open index, with fast-failing pandas lookups (see below).

        An I/O error from DuckDB (a corrupt block found only now, a full disk) becomes a
        `BM25FileError` naming the file.
        """
        with self._lock, no_pandas_lookups():
            self._check_open()
            try:
                yield
            except duckdb.IOException as exc:
                raise _file_error(self._path or ":memory:", exc) from exc

    @contextlib.contextmanager
    def _transaction(self, *, cursor: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._locked():
            con = self._con.cursor() if cursor else self._con
            try:
                with transaction(con):
                    yield con
            finally:
                if cursor:
                    con.close()

    def transaction(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN/COMMIT under the index lock, for other tables in the same file.

        An exception inside the block rolls the transaction back and propagates.
        """
        return self._transaction(cursor=True)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"BM25 index {self._path or ':memory:'} is closed")

    def _check_writable(self) -> None:
        if self._read_only:
            raise PermissionError(f"BM25 index {self._path} is open read-only")

    # ----------------------------------------------------------------------------- writing

    def add(
        self,
        id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        start_line_offset: int | None = None,
    ) -> None:
        """Index one document, replacing any document with the same id.

        Raises
        ------
        TypeError
            ``id`` or ``content`` not a str, ``metadata`` not a mapping or not JSON-serialisable.
        """
        self.add_many([(id, content, metadata, start_line_offset)])

    def add_many(
        self,
        docs: Iterable[
            tuple[str, str]
            | tuple[str, str, Mapping[str, Any] | None]
            | tuple[str, str, Mapping[str, Any] | None, int | None]
        ],
        *,
        replace_sources: Iterable[str] = (),
    ) -> None:
        """Index several documents in one transaction (all or none), as successive `add` calls.

        Each item is ``(id, content, metadata, start_line_offset)``; the last two may be
        omitted. An id given twice keeps its last content, at its last position.
        ``replace_sources`` are removed first in the same transaction, each with its chunks
        (as `remove_source`), so a file re-indexed with fewer chunks leaves none behind.
        """
        self._check_writable()
        checked: dict[str, tuple[str, str | None, int | None]] = {}
        for item in docs:
            if not isinstance(item, tuple | list) or not 2 <= len(item) <= 4:
                raise TypeError(
                    "add_many takes (id, content, metadata, start_line_offset) tuples, "
                    f"got {item!r:.80}"
                )
            id, content, meta_json, offset = self._checked(*item)
            checked.pop(id, None)  # a repeated id moves to the end, as a re-add does
            checked[id] = (content, meta_json, offset)
        sources = list(replace_sources)
        if not checked and not sources:
            return
        items = self._prepare_many(checked)
        with self._locked():
            directory = self._directory()
            gone = {id for source in sources for id in directory.of_source(source)}
            gone.update(id for id in checked if id in directory.docs)
            replaced = sorted((*directory.docs[id], id) for id in gone)
            with self._transaction() as cur:
                stats = self._stats(cur)
                version = stats.version
                if replaced:
                    self._delete_docs(cur, [doc for doc, _, _, _ in replaced])
                doc_numbers = np.arange(stats.next_doc, stats.next_doc + len(items), dtype=np.int64)
                if items:
                    self._insert(cur, doc_numbers, items)
                stats.n += len(items) - len(replaced)
                stats.total_len += sum(p.length for p in items)
                stats.total_len -= sum(length for _, length, _, _ in replaced)
                stats.next_doc += len(items)
                stats.version += 1
                stats.tail_rows += sum(len(p.terms) for p in items)
                stats.dead_rows += sum(terms for _, _, terms, _ in replaced)
                self._set_stats(cur, stats)
            # Committed: bring the caches along (still under the lock, so no search sees them
            # stale).
            self._shared.stats = stats
            self._directory_after_write(
                version, [id for _, _, _, id in replaced],
                [(p.id, doc, p.length, len(p.terms)) for doc, p in zip(doc_numbers.tolist(), items, strict=True)],
            )  # fmt: skip
            cache = self._cache_after_write(version)
            if cache is not None:
                for doc, _, _, _ in replaced:
                    cache.remove(doc)
                for doc, p in zip(doc_numbers.tolist(), items, strict=True):
                    cache.add(doc, p.length, p.terms, p.tfs)
            self._compact_if_due(stats, for_queries=False)

    def _directory(self) -> _Directory:
        """The in-memory directory of documents (see `_Directory`), loaded on first use; call
        with the lock held."""
        shared = self._shared
        stats = self._current_stats()
        directory = shared.directory
        if directory is None or directory.version != stats.version:
            columns = self._con.execute("SELECT id, doc, len, terms FROM bm25_docs").fetchnumpy()
            numbers = zip(
                columns["doc"].tolist(), columns["len"].tolist(), columns["terms"].tolist(), strict=True
            )
            directory = shared.directory = _Directory.of_rows(
                stats.version, columns["id"].tolist(), list(numbers)
            )
        return directory

    def _directory_after_write(
        self,
        version_before: int,
        removed: Iterable[str],
        added: Iterable[tuple[str, int, int, int]],
    ) -> None:
        """Patch the directory for a committed write (or drop it, if it had missed one)."""
        directory = self._shared.directory
        if directory is None:
            return
        if directory.version != version_before:
            self._shared.directory = None
            return
        for id in removed:
            directory.discard(id)
        for row in added:
            directory.add(*row)
        directory.version = version_before + 1

    @staticmethod
    def _insert(
        cur: duckdb.DuckDBPyConnection, doc_numbers: npt.NDArray[np.int64], items: list[_Prepared]
    ) -> None:
        if len(items) == 1:
            p = items[0]
            cur.execute(
                "INSERT INTO bm25_docs VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    int(doc_numbers[0]),
                    p.id,
                    p.length,
                    len(p.terms),
                    p.content,
                    p.metadata,
                    p.start_line_offset,
                ],
            )
        else:
            # No column of Python objects may be all None: DuckDB's type sniffing of such a
            # column needs pandas. Hence "" for no metadata and a flag beside the offsets.
            offsets = [p.start_line_offset for p in items]
            new_docs = {
                "doc": doc_numbers,
                "id": np.array([p.id for p in items], dtype=object),
                "len": np.array([p.length for p in items], dtype=np.int32),
                "terms": np.array([len(p.terms) for p in items], dtype=np.int32),
                "content": np.array([p.content for p in items], dtype=object),
                "metadata": np.array([p.metadata or "" for p in items], dtype=object),
                "start_line_offset": np.array([o or 0 for o in offsets], dtype=np.int64),
                "has_offset": np.array([o is not None for o in offsets], dtype=np.bool_),
            }
            with registered(cur, "bm25_new_docs", new_docs):
                cur.execute(
                    "INSERT INTO bm25_docs SELECT doc, id, len, terms, content,"
                    " nullif(metadata, ''),"
                    " CASE WHEN has_offset THEN start_line_offset END FROM bm25_new_docs"
                )
        new_postings = {
            "term": np.concatenate([p.terms for p in items]),
            "doc": np.repeat(doc_numbers, [len(p.terms) for p in items]),
            "tf": np.concatenate([p.tfs for p in items]),
        }
        if not len(new_postings["term"]):
            return
        with registered(cur, "bm25_new_postings", new_postings):
            cur.execute("INSERT INTO bm25_postings SELECT * FROM bm25_new_postings")

    def _checked(
        self,
        id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
        start_line_offset: int | None = None,
    ) -> tuple[str, str, str | None, int | None]:
        """One document's fields checked: ``(id, content, metadata JSON, start line)``."""
        if not isinstance(id, str):
            raise TypeError(f"document id must be str, not {type(id).__name__}")
        if not isinstance(content, str):
            raise TypeError(f"content of {id!r} must be str, not {type(content).__name__}")
        try:
            id.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"document id {id!r} is not valid Unicode (lone surrogate)") from None
        meta_json: str | None = None
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise TypeError(
                    f"metadata of {id!r} must be a mapping or None, not {type(metadata).__name__}"
                )
            try:
                meta_json = json.dumps(dict(metadata), allow_nan=True)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"metadata of {id!r} is not JSON-serialisable: {exc}") from exc
        if start_line_offset is not None and (
            isinstance(start_line_offset, bool) or not isinstance(start_line_offset, int)
        ):
            raise TypeError(
                f"start_line_offset of {id!r} must be an int or None, "
                f"not {type(start_line_offset).__name__}"
            )
        return id, content, meta_json, start_line_offset

    def _prepare_many(self, checked: Mapping[str, tuple[str, str | None, int | None]]) -> list[_Prepared]:
        """Tokenise, hash and compress a batch of checked documents.

        The batch's distinct terms are hashed once (not once per document holding them) and
        each document's terms mapped to them at C speed; the texts are compressed on a second
        thread meanwhile (zstd lets go of the GIL), which on two cores hides most of it.
        """
        texts = [content for content, _, _ in checked.values()]
        with contextlib.ExitStack() as stack:
            packed_later = None
            if len(texts) >= _PACK_ON_THREAD:
                pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="agentvfs-pack"))
                packed_later = pool.submit(_pack_many, texts)
            tokenizer = self._tokenizer
            counted: list[tuple[Mapping[str, int], int]] = []
            for text in texts:
                if isinstance(tokenizer, Tokenizer):
                    counted.append(tokenizer.counts(text))
                else:
                    tokens = self._tokens(text)
                    counted.append((Counter(tokens), len(tokens)))
            # Every document's terms and frequencies in two arrays (one pass each from C),
            # then a view of them per document.
            sizes = [len(counts) for counts, _ in counted]
            total = sum(sizes)
            terms = np.fromiter(
                map(_hash_table().__getitem__, itertools.chain.from_iterable(c for c, _ in counted)),
                np.int64,
                total,
            )
            tfs = np.fromiter(
                itertools.chain.from_iterable(c.values() for c, _ in counted), np.int32, total
            )
            bounds = np.cumsum(sizes).tolist()
            packed = packed_later.result() if packed_later is not None else _pack_many(texts)
        out: list[_Prepared] = []
        start = 0
        for (id, (_, meta_json, offset)), (_, length), blob, end in zip(
            checked.items(), counted, packed, bounds, strict=True
        ):
            out.append(
                _Prepared(
                    id=id,
                    content=blob,
                    metadata=meta_json,
                    start_line_offset=offset,
                    terms=terms[start:end],
                    tfs=tfs[start:end],
                    length=length,
                )
            )
            start = end
        return out

    def remove(self, id: str) -> bool:
        """Remove a document; return whether it was there."""
        return bool(self._remove_ids(lambda directory: [id] if id in directory.docs else []))

    def remove_source(self, source: str) -> list[str]:
        """Remove ``source`` and its chunks ``source#chunk-N``; return the removed ids in order."""
        return self.remove_sources([source])

    def remove_sources(self, sources: Iterable[str]) -> list[str]:
        """Remove every source of ``sources`` with its chunks, in one transaction; return the
        removed ids in insertion order."""
        wanted = list(sources)
        return self._remove_ids(
            lambda directory: [id for source in wanted for id in directory.of_source(source)]
        )

    def _remove_ids(self, pick: Callable[[_Directory], list[str]]) -> list[str]:
        self._check_writable()
        with self._locked():
            directory = self._directory()
            rows = sorted((*directory.docs[id], id) for id in set(pick(directory)))
            if not rows:
                return []
            with self._transaction() as cur:
                stats = self._stats(cur)
                version = stats.version
                self._delete_docs(cur, [doc for doc, _, _, _ in rows])
                stats.n -= len(rows)
                stats.total_len -= sum(length for _, length, _, _ in rows)
                stats.dead_rows += sum(terms for _, _, terms, _ in rows)
                stats.version += 1
                self._set_stats(cur, stats)
            self._shared.stats = stats
            self._directory_after_write(version, [id for _, _, _, id in rows], ())
            cache = self._cache_after_write(version)
            if cache is not None:
                for doc, _, _, _ in rows:
                    cache.remove(doc)
            self._compact_if_due(stats, for_queries=False)
        return [id for _, _, _, id in rows]

    def clear(self) -> None:
        """Remove every document (the file and its other tables stay)."""
        self._check_writable()
        with self._transaction() as cur:
            stats = self._stats(cur)
            cur.execute("DELETE FROM bm25_postings")
            cur.execute("DELETE FROM bm25_docs")
            stats = _Stats(0, 0, stats.next_doc, stats.version + 1, 0, 0, 0)
            self._set_stats(cur, stats)
            self._cache = None
            self._shared.directory = _Directory(stats.version, {})
        self._shared.stats = stats

    @staticmethod
    def _delete_docs(cur: duckdb.DuckDBPyConnection, docs: list[int]) -> None:
        """Delete document rows; their postings stay as garbage until the next compaction.

        Every reader joins postings with ``bm25_docs`` (and ``doc`` numbers are never reused),
        so a posting without its document is invisible.
        """
        if len(docs) == 1:
            cur.execute("DELETE FROM bm25_docs WHERE doc = ?", docs)
        else:
            cur.execute(
                "DELETE FROM bm25_docs WHERE doc IN (SELECT unnest($docs::BIGINT[]))",
                {"docs": docs},
            )

    @staticmethod
    def _stats(cur: duckdb.DuckDBPyConnection) -> _Stats:
        row = cur.execute(f"SELECT {_Stats.COLUMNS} FROM bm25_stats").fetchone()
        assert row is not None
        return _Stats(*(int(x) for x in row))

    @staticmethod
    def _set_stats(cur: duckdb.DuckDBPyConnection, stats: _Stats) -> None:
        cur.execute(
            "UPDATE bm25_stats SET n = ?, total_len = ?, next_doc = ?, version = ?,"
            " sorted_rows = ?, tail_rows = ?, dead_rows = ?",
            [
                stats.n,
                stats.total_len,
                stats.next_doc,
                stats.version,
                stats.sorted_rows,
                stats.tail_rows,
                stats.dead_rows,
            ],
        )

    def optimize(self) -> None:
        """Rewrite the postings sorted by term, without those of removed documents.

        Runs by itself when removed documents hold as many postings as live ones (and at least
        ``_DEAD_MIN_ROWS``), and, for SQL scoring, when the unsorted tail reaches an eighth of
        the sorted postings (at least ``_TAIL_MIN_ROWS``); a rewrite costs about a second per
        million postings, so each write pays an amortised constant share. Sorted postings let
        DuckDB's zone maps skip most of the table for a query's terms.
        """
        self._check_writable()
        with self._locked():
            self._compact()

    def _compact(self) -> None:
        with self._transaction() as cur:
            stats = self._stats(cur)
            cur.execute(_POSTINGS_TABLE.format(name="bm25_postings_next"))
            cur.execute(
                "INSERT INTO bm25_postings_next SELECT p.term, p.doc, p.tf FROM bm25_postings p"
                " WHERE p.doc IN (SELECT doc FROM bm25_docs) ORDER BY p.term, p.doc"
            )
            cur.execute("DROP TABLE bm25_postings")
            cur.execute("ALTER TABLE bm25_postings_next RENAME TO bm25_postings")
            row = cur.execute("SELECT count(*) FROM bm25_postings").fetchone()
            assert row is not None
            stats.sorted_rows, stats.tail_rows, stats.dead_rows = int(row[0]), 0, 0
            self._set_stats(cur, stats)
        self._shared.stats = stats

    def _compact_if_due(self, stats: _Stats, *, for_queries: bool) -> bool:
        if self._read_only:
            return False
        live = stats.sorted_rows + stats.tail_rows - stats.dead_rows
        due = stats.dead_rows >= max(_DEAD_MIN_ROWS, live)
        if for_queries:
            due = due or stats.tail_rows >= max(_TAIL_MIN_ROWS, stats.sorted_rows // 8)
        if due:
            self._compact()
        return due

    def _cache_after_write(self, version_before: int) -> PostingCache | None:
        """The cache to patch after a committed write, now at ``version_before + 1``.

        None when there is no cache, or it had missed a write made through another connection
        to the same file (then it is dropped and the next search reloads it).
        """
        cache = self._cache
        if cache is None:
            return None
        if cache.version != version_before:
            self._cache = None
            return None
        cache.version = version_before + 1
        return cache

    # ----------------------------------------------------------------------------- reading

    @property
    def tokenize(self) -> Callable[[str], list[str]]:
        """The tokenizer: ``index.tokenize(text) -> list[str]``.

        A `Tokenizer` for options (so `find_line_range` can skip lines cheaply), else the custom
        callable with its output checked.
        """
        return self._tokenizer if isinstance(self._tokenizer, Tokenizer) else self._tokens

    def _tokens(self, text: str) -> list[str]:
        tokens = self._tokenizer(text)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            tokens = list(tokens)
            if not all(isinstance(t, str) for t in tokens):
                raise TypeError("the custom tokenizer must return a list of str")
        return tokens

    def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        min_score: float = 0.0,
        before: Sequence[DocumentSource] = (),
    ) -> list[BM25Hit]:
        """Return the ``top_k`` best documents for ``query``, as the reference ranks them.

        Query tokens count with their duplicates; documents with no query term are left out;
        ``min_score`` applies to the raw score; equal scores keep the reference's order (the
        first query term a document holds, then insertion order). An empty query, a query of
        stopwords only or an empty index give ``[]``.

        ``before`` are other postings searched as part of the same collection (the segments of
        a published index this one holds the local changes of): their documents count in the
        statistics and rank before this index's own on equal scores.

        Raises
        ------
        TypeError
            ``query`` not a str.
        ValueError
            ``top_k`` negative.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be str, not {type(query).__name__}")
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be an int, not {type(top_k).__name__}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        tokens = self._tokens(query)
        if not tokens or top_k == 0:
            return []
        weights = Counter(tokens)
        distinct = list(weights)  # first-occurrence order
        hashes = list(map(_hash_table().__getitem__, distinct))
        with self._locked():
            cur = self._con
            stats = self._current_stats()
            n, total = stats.n, stats.total_len
            if n == 0 and not before:
                return []
            # (source, slot of a source of ``before`` or this index's doc number, score)
            order: list[tuple[int, int, float]]
            if self._cache_postings or before:
                order = self._rank_cached(
                    cur, stats.version, tokens, distinct, hashes, n, total, top_k, min_score, before
                )
            else:
                self._compact_if_due(stats, for_queries=True)
                ranked = self._rank_sql(cur, distinct, weights, hashes, n, total, top_k, min_score)
                order = [(0, doc, score) for doc, score in ranked]
            mine = len(before)
            by_doc = self._documents([doc for owner, doc, _ in order if owner == mine])
        hits: list[BM25Hit] = []
        lines = line_finder(tokens, self.tokenize)
        for owner, key, score in order:
            id, content, metadata, offset = by_doc[key] if owner == mine else before[owner].document(key)
            hits.append(self._hit(id, score, content, metadata, offset, lines))
        return hits

    def _documents(
        self, docs: list[int]
    ) -> dict[int, tuple[str, str, dict[str, Any] | None, int | None]]:
        """``(id, content, metadata, start line offset)`` of the documents numbered ``docs``:
        from the checkpoint's mapping where it holds them, else from DuckDB (lock held)."""
        found: dict[int, tuple[str, str, dict[str, Any] | None, int | None]] = {}
        checkpoint = self._checkpoint
        missing = docs
        if checkpoint is not None:
            missing = []
            segment = checkpoint.segment
            for doc, slot in zip(docs, checkpoint.slots_of_docs(docs), strict=True):
                if slot < 0:
                    missing.append(doc)
                else:
                    found[doc] = segment.document(slot)
        if missing:
            # Literal numbers (ours, so safe to inline) let DuckDB use the primary-key index.
            rows = self._con.execute(
                "SELECT doc, id, content, metadata, start_line_offset FROM bm25_docs"
                f" WHERE doc IN ({','.join(str(int(doc)) for doc in missing)})"
            ).fetchall()
            for doc, id, blob, meta_json, offset in rows:
                metadata = json.loads(meta_json) if meta_json is not None else None
                found[doc] = (id, _unpack(blob), metadata, offset)
        return found

    # ----------------------------------------------------------------------- checkpoints

    @property
    def checkpoint_path(self) -> str | None:
        """The checkpoint file beside the index file (None in memory)."""
        return self._path + CHECKPOINT_SUFFIX if self._path is not None else None

    def _open_checkpoint(self) -> Checkpoint | None:
        """The checkpoint of this index, mapped once (lock held); None when there is none or
        it belongs to another index (its instance differs) or other options."""
        if not self._checkpoint_looked:
            self._checkpoint_looked = True
            where = self.checkpoint_path
            instance = self._instance
            if where is not None and instance is not None:
                # (Imported here: the segment format builds on modules that build on this one.)
                from ._checkpoint import open_checkpoint

                found = open_checkpoint(where, self._tokenizer_record(), self._identity(instance))
                self._checkpoint = found
        return self._checkpoint

    def _load_cache(self, cur: duckdb.DuckDBPyConnection, version: int) -> PostingCache:
        """The postings in memory at ``version``: mapped from a checkpoint of that version,
        else loaded from DuckDB (lock held)."""
        checkpoint = self._open_checkpoint()
        if checkpoint is not None and checkpoint.version == version:
            segment = checkpoint.segment
            arrays = segment.arrays
            return PostingCache.from_csr(
                version,
                keys=arrays["terms"],
                starts=arrays["starts"],
                slots=arrays["slots"],
                tfs=arrays["tfs"],
                slot_doc=checkpoint.docs,
                slot_len=segment.lengths,
            )
        return PostingCache.load(cur, version)

    def write_checkpoint(self) -> bool:
        """Write the checkpoint beside the file: the postings and documents as they are now,
        mapped by the next process to open the index (instant postings, hits' text without
        queries). Returns False for an in-memory or read-only index.

        Costs about as much as loading the postings once (a second or two at 20k documents).
        """
        from ._checkpoint import write_checkpoint

        where = self.checkpoint_path
        if where is None or self._read_only:
            return False
        with self._locked():
            cur = self._con
            stats = self._stats(cur)
            instance = self._ensure_instance()
            cache = self._posting_cache(cur, stats.version)
            cache.compact()
            rows = cur.execute(
                "SELECT doc, id, content, metadata, start_line_offset FROM bm25_docs ORDER BY doc"
            ).fetchall()
            docs = np.fromiter((row[0] for row in rows), np.int64, len(rows))
            if not np.array_equal(docs, cache.slot_doc.view()):
                raise RuntimeError("the postings in memory do not match the documents")
            write_checkpoint(
                where,
                version=stats.version,
                tokenize=self._tokenizer_record(),
                identity=self._identity(instance),
                keys=cache.keys,
                starts=cache.starts,
                slots=cache.slots,
                tfs=cache.tfs,
                docs=docs,
                lengths=cache.slot_len.view().astype(np.int32),
                rows=[(row[1], row[2], row[3], row[4]) for row in rows],
            )
            old, self._checkpoint = self._checkpoint, None
            self._checkpoint_looked = False
            del old  # its mapping goes when the last view of it does
            self._open_checkpoint()
        return True

    @property
    def checkpoint_version(self) -> int | None:
        """The index version the mapped checkpoint was written at (None: no checkpoint)."""
        with self._locked():
            checkpoint = self._open_checkpoint()
            return checkpoint.version if checkpoint is not None else None

    @property
    def version(self) -> int:
        """Bumped by every write."""
        with self._locked():
            return self._current_stats().version

    def _identity(self, instance: str) -> dict[str, Any]:
        return {"instance": instance, "k1": self._k1, "b": self._b}

    def _ensure_instance(self) -> str:
        """This index's instance id (made now for an index from before they existed)."""
        if self._instance is None:
            self._instance = uuid.uuid4().hex
            with self._transaction() as cur:
                cur.execute("INSERT OR REPLACE INTO bm25_meta VALUES ('instance', ?)", [self._instance])
        return self._instance

    def _hit(
        self,
        id: str,
        score: float,
        content: str,
        metadata: dict[str, Any] | None,
        offset: int | None,
        lines: Callable[[str], tuple[int, int] | None],
    ) -> BM25Hit:
        if metadata is not None and START_LINE_KEY in metadata:
            recorded = metadata.pop(START_LINE_KEY)
            if offset is None and isinstance(recorded, int) and not isinstance(recorded, bool):
                offset = recorded
        span = lines(content)
        if span is not None and offset is not None:
            span = (span[0] + offset - 1, span[1] + offset - 1)
        return BM25Hit(
            id=id, score=score, content=content, metadata=metadata or None, line_range=span
        )

    def _rank_sql(
        self,
        cur: duckdb.DuckDBPyConnection,
        distinct: list[str],
        weights: Counter[str],
        hashes: list[int],
        n: int,
        total: int,
        top_k: int,
        min_score: float,
    ) -> list[tuple[int, float]]:
        params = {
            "terms": hashes,
            "pos": list(range(len(distinct))),
            "weights": [float(weights[t]) for t in distinct],
            "n": float(n),
            "k1": self._k1,
            "k1_plus_1": self._k1 + 1,
            "b": self._b,
            "one_minus_b": 1 - self._b,
            "avgdl": total / n,
            "min_score": float(min_score),
            "top_k": top_k,
        }
        # Literal term numbers let DuckDB prune row groups by their zone maps (a subquery would
        # not); past a few thousand terms the subquery is cheaper to plan.
        terms = (
            ",".join(map(str, hashes)) if len(distinct) <= 2000 else "SELECT term FROM q"
        )
        sql = _SEARCH_SQL.format(terms=terms)
        return [(int(doc), float(score)) for doc, score in cur.execute(sql, params).fetchall()]

    def _rank_cached(
        self,
        cur: duckdb.DuckDBPyConnection,
        version: int,
        tokens: list[str],
        distinct: list[str],
        hashes: list[int],
        n: int,
        total: int,
        top_k: int,
        min_score: float,
        before: Sequence[DocumentSource] = (),
    ) -> list[tuple[int, int, float]]:
        """Rank with the postings in memory, after the sources ``before`` when given: one
        collection, whose documents all count in N, the average length and every document
        frequency, so scores are those of one index of them all. Returns ``(source, key,
        score)``, the key a slot of a source of ``before`` or a document number of this index
        (source ``len(before)``)."""
        cache = self._posting_cache(cur, version)
        ranked = rank(
            [*before, cache],
            tokens,
            dict(zip(distinct, hashes, strict=True)),
            n=n + sum(source.live_docs for source in before),
            total_len=total + sum(source.live_length for source in before),
            k1=self._k1,
            b=self._b,
            top_k=top_k,
            min_score=min_score,
        )
        mine = len(before)
        docs = cache.slot_doc.view()
        return [
            (owner, int(docs[slot]) if owner == mine else slot, score) for owner, slot, score in ranked
        ]

    def _posting_cache(self, cur: duckdb.DuckDBPyConnection, version: int) -> PostingCache:
        """The postings in memory at ``version``, loaded (or mapped) when they are not, with
        any compaction due done (lock held)."""
        cache = self._cache
        if cache is None or cache.version != version:
            cache = self._cache = self._load_cache(cur, version)
        cache.maybe_compact()
        return cache

    def _current_stats(self) -> _Stats:
        """The file's stats: those the last write in this process left, else read (lock
        held)."""
        stats = self._shared.stats
        if stats is None:
            stats = self._shared.stats = self._stats(self._con)
        return stats

    def get(self, id: str) -> tuple[str, dict[str, Any] | None] | None:
        """Return ``(content, metadata)`` of a document, or None."""
        row = self._fetchone("SELECT content, metadata FROM bm25_docs WHERE id = ?", [id])
        if row is None:
            return None
        return _unpack(row[0]), (json.loads(row[1]) if row[1] is not None else None)

    def ids(self) -> list[str]:
        """Document ids in insertion order (a replaced document moves to the end)."""
        with self._locked():
            docs = self._directory().docs
            return sorted(docs, key=lambda id: docs[id][0])

    def __len__(self) -> int:
        row = self._fetchone("SELECT n FROM bm25_stats", [])
        return int(row[0]) if row is not None else 0

    def __contains__(self, id: object) -> bool:
        if not isinstance(id, str):
            return False
        with self._locked():
            return id in self._directory().docs

    def contains_many(self, ids: Iterable[str]) -> set[str]:
        """The ids of ``ids`` that are indexed (one lookup each, no query)."""
        with self._locked():
            docs = self._directory().docs
            return {id for id in ids if id in docs}

    def _fetchone(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        with self._locked():
            return self._con.execute(sql, params).fetchone()

    # ------------------------------------------------------------------------------ others

    @property
    def path(self) -> str | None:
        """The DuckDB file, or None in memory."""
        return self._path

    @property
    def k1(self) -> float:
        return self._k1

    @property
    def b(self) -> float:
        return self._b

    @property
    def read_only(self) -> bool:
        return self._read_only

    def close(self) -> None:
        """Close the file (idempotent); later calls raise ValueError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._cache = None
                self._checkpoint = None
                self._release()

    def _release(self) -> None:
        with self._lock:
            self._con.close()
            self._forget()

    def __enter__(self) -> BM25Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"k1={self._k1}, b={self._b}"
        return f"BM25Index({self._path or ':memory:'!r}, {state})"


class _Directory:
    """Every document's number, length and term count by id, and the chunk ids of each source.

    Kept in memory beside the file (loaded by one scan of ``bm25_docs``, then patched by every
    write) so that replacing, removing and "is it indexed" cost a dictionary lookup: done in
    DuckDB they cost 0.4 ms to 50 ms each, which made re-checking 24k files take 10 s. The
    chunks of each source are grouped only when first asked for (a reopen that only checks
    what is indexed never needs them).
    """

    __slots__ = ("_chunks", "docs", "version")

    def __init__(self, version: int, docs: dict[str, tuple[int, int, int]]) -> None:
        self.version = version
        self.docs = docs
        self._chunks: dict[str, set[str]] | None = None

    @classmethod
    def of_rows(
        cls, version: int, ids: Sequence[str], numbers: Sequence[tuple[int, int, int]]
    ) -> _Directory:
        return cls(version, dict(zip(ids, numbers, strict=True)))

    @property
    def chunks(self) -> dict[str, set[str]]:
        found = self._chunks
        if found is None:
            found = {}
            for id in self.docs:
                match = CHUNK_ID.fullmatch(id)
                if match is not None:
                    found.setdefault(match.group(1), set()).add(id)
            self._chunks = found
        return found

    def add(self, id: str, doc: int, length: int, terms: int) -> None:
        self.docs[id] = (doc, length, terms)
        if self._chunks is not None:
            match = CHUNK_ID.fullmatch(id)
            if match is not None:
                self._chunks.setdefault(match.group(1), set()).add(id)

    def discard(self, id: str) -> None:
        if self.docs.pop(id, None) is None or self._chunks is None:
            return
        match = CHUNK_ID.fullmatch(id)
        if match is not None:
            members = self._chunks.get(match.group(1))
            if members is not None:
                members.discard(id)
                if not members:
                    del self._chunks[match.group(1)]

    def of_source(self, source: str) -> list[str]:
        """``source`` itself and its chunks ``source#chunk-N``, those indexed."""
        found = [source] if source in self.docs else []
        found.extend(self.chunks.get(source, ()))
        return found


class _SharedState:
    """What every `BM25Index` on one file in this process shares: the lock and the stats.

    DuckDB serves all connections of a process to a file from one database, and no other
    process can write while this one has it open, so the last stats written here are the
    file's: searches need no query to learn N, the total length and the version.
    """

    __slots__ = ("__weakref__", "directory", "lock", "open", "stats")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.stats: _Stats | None = None
        self.directory: _Directory | None = None
        self.open = 0  # connections; at 0 another process may write, so stats are forgotten

    def release(self) -> None:
        """One connection to the file fewer (at close, or when an index is collected)."""
        with self.lock:
            self.open -= 1
            if self.open == 0:
                self.stats = None
                self.directory = None


_SHARED: weakref.WeakValueDictionary[str, _SharedState] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def _shared_state(path: str | None) -> _SharedState:
    if path is None:
        return _SharedState()
    key = os.path.realpath(path)
    with _SHARED_LOCK:
        state = _SHARED.get(key)
        if state is None:
            state = _SHARED[key] = _SharedState()
        return state


#: The first bytes of a zstd frame. A zlib stream never starts with them (its first two
#: bytes, read as a big-endian number, are a multiple of 31; 0x28B5 is not), so a stored text
#: says itself how it was compressed.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CODECS = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_CODECS, "compressor", None)
    if compressor is None:  # (a context per thread: they are not thread-safe, and costly to make)
        compressor = _CODECS.compressor = zstandard.ZstdCompressor(level=1)
    return compressor


def _pack_many(texts: Sequence[str]) -> list[bytes]:
    """Documents' texts as stored: UTF-8 (lone surrogates kept), zstd level 1 with the size
    in each frame (2.6x smaller on text, about 3x faster to compress and 2x faster to expand
    than zlib; DuckDB does not compress long strings itself).

    Compressed in one call that holds no GIL throughout. Run on a second thread beside
    tokenising, one call per text would hardly run at all: a thread that gives the GIL up for
    each text waits for it back behind a busy one (a switch interval each time), so the work
    would not overlap."""
    data: list[bytes | bytearray | memoryview[int]]
    data = [text.encode("utf-8", "surrogatepass") for text in texts]
    compressor = _compressor()
    if not any(data):  # (the batch call refuses to have nothing at all to compress)
        return [compressor.compress(item) for item in data]
    try:
        frames = compressor.multi_compress_to_buffer(data, threads=1)
    except NotImplementedError:  # (a backend without the batch call: CFFI)
        return [compressor.compress(item) for item in data]
    return [frames[i].tobytes() for i in range(len(data))]


def _unpack(blob: bytes, limit: int | None = None) -> str:
    """The text of a stored ``blob``: zstd, or zlib as format version 1 stored it.

    ``limit`` bounds the bytes it may expand to (a frame can declare, or expand to, any size:
    bytes from someone else's storage must not make each search allocate gigabytes).

    Raises
    ------
    ValueError
        The blob expands past ``limit``, or is not a valid frame or UTF-8.
    """
    if blob[:4] != _ZSTD_MAGIC:
        if limit is None:
            return zlib.decompress(blob).decode("utf-8", "surrogatepass")
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(blob, limit)
        except zlib.error as exc:
            raise ValueError(f"a stored text is not valid zlib ({exc})") from None
        if inflater.unconsumed_tail:
            raise ValueError(f"a stored text expands past {limit} bytes")
        return raw.decode("utf-8", "surrogatepass")
    decompressor = getattr(_CODECS, "decompressor", None)
    if decompressor is None:
        decompressor = _CODECS.decompressor = zstandard.ZstdDecompressor()
    try:
        if limit is not None:
            declared = zstandard.frame_content_size(blob)
            if declared > limit:
                raise ValueError(f"a stored text declares {declared} bytes, past {limit}")
            data: bytes = decompressor.decompress(blob, max_output_size=limit if declared < 0 else 0)
        elif zstandard.frame_content_size(blob) >= 0:
            data = decompressor.decompress(blob)
        else:  # (every frame written here has its size; one without it expands by streaming)
            data = decompressor.decompressobj().decompress(blob)
    except zstandard.ZstdError as exc:
        bound = f", or expands past {limit} bytes" if limit is not None else ""
        raise ValueError(f"a stored text is not a valid zstd frame{bound} ({exc})") from None
    return data.decode("utf-8", "surrogatepass")


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Name each option that differs: ``k1 1.2 (in the file) != 1.5``."""
    out: list[str] = []
    for key in ("k1", "b"):
        if recorded.get(key) != wanted.get(key):
            out.append(f"{key} {recorded.get(key)!r} (in the file) != {wanted.get(key)!r}")
    old_tok = recorded.get("tokenize") or {}
    new_tok = wanted.get("tokenize") or {}
    for key in sorted(set(old_tok) | set(new_tok)):
        if old_tok.get(key) != new_tok.get(key):
            before, after = old_tok.get(key), new_tok.get(key)
            if key == "stopwords" and isinstance(before, list) and isinstance(after, list):
                added = sorted(set(after) - set(before))
                dropped = sorted(set(before) - set(after))
                out.append(f"tokenize stopwords differ (added {added[:5]}, removed {dropped[:5]})")
            else:
                out.append(f"tokenize {key} {before!r} (in the file) != {after!r}")
    return out


def _file_error(path: str, exc: duckdb.Error) -> BM25FileError:
    kind, why = trouble(exc)
    if kind == "other":
        why = "cannot be read as a BM25 index"
    return BM25FileError(f"BM25 index file {path} {why}; it was left untouched. DuckDB: {exc}", path)
