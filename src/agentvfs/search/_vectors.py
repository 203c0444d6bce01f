"""``HnswVectorStore``: hnswlib graphs, with ids, metadata and filters in DuckDB beside them.

The store has the vector-store interface the search engine calls (``create_index``, ``upsert``,
``query``, ``delete_vector``, ``delete_vectors``, ...). Every method is async and runs its
blocking hnswlib and DuckDB work in a worker thread (``anyio.to_thread``), so it works under
asyncio and trio alike. One lock per store serialises the work: hnswlib must not add and search
at the same time, and a DuckDB connection serves one thread at a time.

Layout
------
``path=None`` keeps everything in memory (DuckDB ``:memory:``). With a ``path`` (a directory,
created when missing) the store keeps:

* ``vectors.duckdb``: the indexes (dimension, metric, free-form info), every item's id, label and
  metadata (JSON), the metadata again as one typed row per top-level key for filtering
  (``vector_attrs``, keys numbered in ``vector_keys``), and a log of the vectors added since each
  index's last graph checkpoint (``vector_log``).
* ``<index>.<seq>.<crc32>.hnsw``: the last checkpoint of each index's hnswlib graph, where
  ``seq`` is the store's change counter when it was written and ``crc32`` the file's checksum.

When graphs are saved, and what a crash leaves
----------------------------------------------
Each ``upsert``/``delete_*`` call is one DuckDB transaction (ids, metadata, the new vectors in the
log), committed before the call returns; the graph in memory is updated after the commit.
A graph is written to disk as a checkpoint when its index has seen ``checkpoint_every`` changes
(or a tenth of its size, whichever is more) since the last one, and by ``close()``. A checkpoint
is written to a temporary file, fsynced, checksummed and renamed into place (then the directory is
fsynced); only then does DuckDB record it and drop the log entries it covers, and only then are
older graph files removed. Opening an index loads the newest checkpoint, verifies its checksum,
marks the items deleted since then and re-adds the logged vectors. So everything a call
acknowledged is found again by a new process, with or without ``close()``, and a crash at any
point (even in the middle of writing a graph) leaves the previous graph and the log intact.
``close()`` only makes reopening faster (no log to replay).

A graph file that fails its checksum or is not an hnswlib graph of the index raises
``ValueError`` naming the file; the store never deletes such a file. Other files in the directory
are ignored. One process at a time can open a directory (DuckDB locks the database file), and one
store object per directory within a process.

Searching
---------
Scores: ``cosine`` is the cosine similarity, ``dotproduct`` the dot product, ``euclidean``
``1 / (1 + distance)``. A zero vector has cosine 0 with everything.

A filter (``$eq $ne $in $nin $exists $and $or``; ``{"key": value}`` means ``$eq``) is evaluated
in DuckDB into the set of allowed items (one query per condition; the answer is kept until the
index changes, since the search engine sends the same filter with every query). When few items
are allowed (at most ``exact_limit``, or at most 5 % of the index), the query is answered exactly
with numpy over just those vectors (a copy of the vectors is kept in memory for that); otherwise
hnswlib fetches ``4 * top_k / share`` neighbours (``share`` being the fraction of items allowed;
``ef`` is divided by it too) and keeps the allowed ones, falling back to exact search when fewer
than ``top_k`` are among them. So a selective filter still returns ``top_k`` results.
Indexes of at most ``exact_limit`` items are always searched exactly.

Filter semantics follow MongoDB on top-level metadata keys: a value equals a metadata value of
the same JSON type (numbers compare as numbers, ``1 == 1.0``, ``True != 1``), a scalar also matches
a list that contains it, lists and objects compare as whole JSON values; ``$ne`` and ``$nin`` also
match items without the key; ``None`` matches a JSON ``null`` (use ``$exists`` for a missing key).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import duckdb
import numpy as np
import numpy.typing as npt

from . import _vector_graphs, _vector_math
from ._duckdb import connect, table_names, transaction, trouble
from ._vector_filters import FilterNode, attr_rows, metadata_json, parse_filter, values_sql
from ._vector_graphs import GraphFile
from ._vector_math import Floats, Labels, Mask

__all__ = ["HnswVectorStore"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Metric name -> hnswlib space.
METRICS: Final[Mapping[str, str]] = {"cosine": "cosine", "dotproduct": "ip", "euclidean": "l2"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_GRAPH_FILE = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.(?P<seq>\d+)\.(?P<crc>[0-9a-f]{8})\.hnsw"
)
_TMP_FILE = re.compile(r"\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.(?P<seq>\d+)\.hnsw\.tmp")
DB_FILE: Final = "vectors.duckdb"
_FORMAT: Final = "agentvfs.HnswVectorStore"
_VERSION: Final = 1


_SCHEMA = """
CREATE TABLE vector_store (format VARCHAR, version INTEGER, next_label BIGINT, next_seq BIGINT,
    next_kid INTEGER);
CREATE TABLE vector_indexes (name VARCHAR PRIMARY KEY, dimension INTEGER, metric VARCHAR,
    info VARCHAR, created_seq BIGINT, graph_seq BIGINT);
CREATE TABLE vector_items (label BIGINT PRIMARY KEY, idx VARCHAR, id VARCHAR, meta VARCHAR);
CREATE TABLE vector_keys (kid INTEGER PRIMARY KEY, idx VARCHAR, key VARCHAR);
CREATE TABLE vector_attrs (label BIGINT, kid INTEGER, t UTINYINT, s VARCHAR, n DOUBLE,
    elem BOOLEAN);
CREATE TABLE vector_log (idx VARCHAR, seq BIGINT, labels BLOB, vectors BLOB);
"""

# Directories opened by a live store in this process (DuckDB would share one database between
# two stores, and both would write the same graph files).
_open_dirs: set[str] = set()
_open_dirs_lock = threading.Lock()


class HnswVectorStore:
    """A vector store on hnswlib, with ids, metadata and filters in DuckDB.

    Parameters
    ----------
    path : str or os.PathLike, optional
        Directory of the store (created when missing). ``None`` keeps everything in memory.
    m : int
        hnswlib ``M`` (links per node) of new indexes.
    ef_construction : int
        hnswlib ``ef_construction`` of new indexes.
    ef_search : int
        hnswlib ``ef`` of queries (raised to ``top_k`` when smaller, and widened for filters). The
        default 128 gives recall@10 0.96 against exact search at 100,000 real-text vectors in
        about 1.5 ms (benchmarks/bench_vectors.py).
    exact_limit : int
        Queries over at most this many allowed items are answered exactly with numpy.
    checkpoint_every : int
        Write an index's graph after this many changes (or a tenth of its size, whichever is
        more); ``close()`` writes the rest. Only used with a ``path``.

    Notes
    -----
    See the module documentation for the files, when graphs are saved, crash safety, scores and
    filter semantics. Memory: the hnswlib graph plus a float32 copy of each vector (for exact
    filtered search), about ``2 * 4 * dimension`` bytes per vector plus the graph's links.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        m: int = 16,
        ef_construction: int = 200,
        ef_search: int = 128,
        exact_limit: int = 5000,
        checkpoint_every: int = 5000,
    ) -> None:
        for option, value, low in (
            ("m", m, 2),
            ("ef_construction", ef_construction, 1),
            ("ef_search", ef_search, 1),
            ("exact_limit", exact_limit, 0),
            ("checkpoint_every", checkpoint_every, 1),
        ):
            if not _is_int(value) or value < low:
                raise ValueError(
                    f"HnswVectorStore: {option} must be an integer >= {low}, got {value!r}"
                )
        self._store = _Store(
            None if path is None else Path(os.fspath(path)),
            m=m,
            ef_construction=ef_construction,
            ef_search=ef_search,
            exact_limit=exact_limit,
            checkpoint_every=checkpoint_every,
        )

    @property
    def path(self) -> Path | None:
        """The store's directory, or ``None`` in memory."""
        return self._store.dir

    @property
    def exact_limit(self) -> int:
        """Indexes of at most this many items are searched exactly."""
        return self._store.exact_limit

    @property
    def ef_search(self) -> int:
        """hnswlib ``ef`` of its graph searches."""
        return self._store.ef_search

    def adopt_directory(self, path: str | os.PathLike[str]) -> bool:
        """Give a store made without a ``path`` a directory, before its first use: a
        Workspace with an ``index_dir`` keeps the vectors beside its BM25 index this way.
        Returns False (and changes nothing) if the store has a path or was already used."""
        store = self._store
        if store.dir is not None or store._con is not None:
            return False
        store.dir = Path(os.fspath(path))
        return True

    def __repr__(self) -> str:
        where = "memory" if self._store.dir is None else str(self._store.dir)
        return f"HnswVectorStore({where})"

    async def __aenter__(self) -> HnswVectorStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def create_index(self, index_name: str, dimension: int, metric: str = "cosine") -> None:
        """Create an index; nothing happens if it exists with the same dimension and metric.

        Parameters
        ----------
        index_name : str
            Letters, digits and underscores, starting with a letter or underscore, at most 63
            characters.
        dimension : int
            Length of the vectors.
        metric : {"cosine", "dotproduct", "euclidean"}

        Raises
        ------
        ValueError
            Invalid name, dimension or metric, or the index exists with another dimension or
            metric (the message names both).
        """
        await self._run(self._store.create_index, index_name, dimension, metric)

    async def upsert(
        self,
        index_name: str,
        vectors: Sequence[Sequence[float]],
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Add vectors, replacing those whose id exists; one transaction.

        Parameters
        ----------
        index_name : str
        vectors : sequence of sequences of float
            Finite numbers, each of the index's dimension.
        metadata : sequence of mappings, optional
            JSON-compatible metadata per vector (string keys), returned by ``query``.
        ids : sequence of str, optional
            Distinct ids; random UUIDs when omitted.

        Returns
        -------
        list of str
            The ids, in the order of ``vectors``.

        Raises
        ------
        LookupError
            The index does not exist.
        ValueError
            A vector has the wrong dimension or contains NaN or infinity (the message names the
            index, the id and the dimension), the lengths of ``vectors``, ``metadata`` and ``ids``
            differ, an id repeats, or metadata is not JSON-compatible.
        """
        return await self._run(self._store.upsert, index_name, vectors, metadata, ids)

    async def query(
        self,
        index_name: str,
        query_vector: Sequence[float],
        top_k: int = 10,
        filter: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The ``top_k`` nearest items allowed by ``filter``, best first.

        Parameters
        ----------
        index_name : str
        query_vector : sequence of float
        top_k : int
        filter : mapping, optional
            ``$eq $ne $in $nin $exists $and $or`` on top-level metadata keys;
            ``{"key": value}`` means ``$eq``.

        Returns
        -------
        list of dict
            ``{"id": str, "score": float, "metadata": dict}``; fewer than ``top_k`` only when
            fewer items are allowed.

        Raises
        ------
        LookupError
            The index does not exist.
        ValueError
            Bad query vector, ``top_k`` or filter (unknown operators are named).
        """
        return await self._run(self._store.query, index_name, query_vector, top_k, filter)

    async def delete_vector(self, index_name: str, id: str) -> None:
        """Delete one vector; an unknown id is not an error.

        Raises
        ------
        LookupError
            The index does not exist.
        """
        await self._run(self._store.delete_ids, index_name, [id])

    async def delete_vectors(self, index_name: str, filter: Mapping[str, Any]) -> int:
        """Delete the vectors whose metadata matches ``filter``; returns how many.

        Raises
        ------
        LookupError
            The index does not exist.
        ValueError
            Bad or empty filter (use ``delete_index`` to delete everything).
        """
        return await self._run(self._store.delete_matching, index_name, filter)

    async def list_indexes(self) -> list[str]:
        """Names of the indexes, sorted."""
        return await self._run(self._store.list_indexes)

    async def describe_index(self, index_name: str) -> dict[str, Any]:
        """``{"dimension": int, "metric": str, "count": int}`` of an index.

        Raises
        ------
        LookupError
            The index does not exist.
        """
        return await self._run(self._store.describe_index, index_name)

    async def delete_index(self, index_name: str) -> None:
        """Delete an index, its metadata and its graph files.

        Raises
        ------
        LookupError
            The index does not exist.
        """
        await self._run(self._store.delete_index, index_name)

    async def set_index_info(self, index_name: str, info: Mapping[str, Any]) -> None:
        """Record free-form JSON-compatible information with an index (replaces earlier info).

        Raises
        ------
        LookupError
            The index does not exist.
        ValueError
            ``info`` is not a JSON-compatible mapping.
        """
        await self._run(self._store.set_index_info, index_name, info)

    async def get_index_info(self, index_name: str) -> dict[str, Any]:
        """The information recorded by ``set_index_info`` (``{}`` when none).

        Raises
        ------
        LookupError
            The index does not exist.
        """
        return await self._run(self._store.get_index_info, index_name)

    async def close(self) -> None:
        """Write the graphs changed since their last checkpoint and release the files.

        The store reopens on its next use. Nothing acknowledged is lost without ``close()``;
        it only spares the next process replaying the log.
        """
        await self._run(self._store.close)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))


@dataclass(slots=True)
class _Index:
    """One index in memory: its hnswlib graph, id <-> label maps and a copy of its vectors."""

    name: str
    dimension: int
    metric: str
    graph: Any
    file_seq: int  # seq of the graph file loaded or written last (created_seq when none)
    ids: dict[str, int]
    live: Mask  # by label: a vector of this index
    rows: Labels  # by label: its row in `matrix`, -1 when none
    matrix: Floats  # the vectors as hnswlib keeps them (unit length for cosine)
    free_rows: list[int]
    used_rows: int = 0
    count: int = 0
    dirty: int = 0  # changes since the last checkpoint
    # Masks of single conditions, valid while no item changes (the search engine sends the same
    # filter with every query); keyed by the condition's repr.
    masks: dict[str, Mask] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)  # metadata key -> kid of vector_keys

    @property
    def space(self) -> str:
        return METRICS[self.metric]

    def grow_labels(self, size: int) -> None:
        if size > len(self.live):
            size = max(size, 2 * len(self.live), 1024)
            self.live = np.concatenate([self.live, np.zeros(size - len(self.live), np.bool_)])
            self.rows = np.concatenate([self.rows, np.full(size - len(self.rows), -1, np.int64)])

    def take_rows(self, n: int) -> Labels:
        reused = [self.free_rows.pop() for _ in range(min(n, len(self.free_rows)))]
        fresh = n - len(reused)
        if self.used_rows + fresh > len(self.matrix):
            size = max(self.used_rows + fresh, 2 * len(self.matrix), 1024)
            grown = np.empty((size, self.dimension), np.float32)
            grown[: self.used_rows] = self.matrix[: self.used_rows]
            self.matrix = grown
        rows = np.array(reused + list(range(self.used_rows, self.used_rows + fresh)), np.int64)
        self.used_rows += fresh
        return rows

    def add(self, labels: Labels, vectors: Floats, ids: Sequence[str]) -> None:
        """Add vectors under new labels to the graph and the matrix (labels never seen before)."""
        if len(labels) == 0:
            return
        self.grow_labels(int(labels.max()) + 1)
        graph = self.graph
        # Slots of deleted items are reused first (replace_deleted), so the graph only grows by
        # what they cannot hold.
        free_slots = int(graph.element_count) - self.count
        needed = int(graph.element_count) + max(0, len(labels) - free_slots)
        capacity = int(graph.get_max_elements())
        if needed > capacity:
            graph.resize_index(max(needed, 2 * capacity))
        graph.add_items(vectors, labels, replace_deleted=True)
        rows = self.take_rows(len(labels))
        self.matrix[rows] = vectors
        self.rows[labels] = rows
        self.live[labels] = True
        self.ids.update(zip(ids, labels.tolist(), strict=True))
        self.count += len(labels)
        self.masks.clear()

    def delete(self, labels: Sequence[int], ids: Sequence[str]) -> None:
        for label in labels:
            self.graph.mark_deleted(label)
            self.free_rows.append(int(self.rows[label]))
            self.rows[label] = -1
            self.live[label] = False
        for id in ids:
            self.ids.pop(id, None)
        self.count -= len(labels)
        self.masks.clear()


class _Store:
    """The blocking implementation; every public method takes the store's lock."""

    def __init__(
        self,
        directory: Path | None,
        *,
        m: int,
        ef_construction: int,
        ef_search: int,
        exact_limit: int,
        checkpoint_every: int,
    ) -> None:
        self.dir = directory
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.exact_limit = exact_limit
        self.checkpoint_every = checkpoint_every
        self._lock = threading.RLock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._dir_key: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._indexes: dict[str, _Index] = {}
        self._absent: set[str] = set()  # names looked up and not found
        self._next_label = 0
        self._next_kid = 0
        self._attrs_sorted = 0  # rows of vector_attrs in (kid, value) order, and appended since
        self._attrs_unsorted = 0
        self._next_seq = 0

    # -- opening and closing ---------------------------------------------------------------

    @property
    def _db_file(self) -> str:
        return ":memory:" if self.dir is None else str(self.dir / DB_FILE)

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self._con is not None:
            return self._con
        if self.dir is not None:
            if self.dir.exists() and not self.dir.is_dir():
                raise ValueError(f"{self.dir}: is a file; an HnswVectorStore path is a directory")
            self.dir.mkdir(parents=True, exist_ok=True)
            key = os.path.realpath(self.dir)
            with _open_dirs_lock:
                if key in _open_dirs:
                    raise RuntimeError(
                        f"{self.dir}: already open by another HnswVectorStore in this process"
                    )
                _open_dirs.add(key)
            self._dir_key = key
        try:
            con = self._open_database()
        except BaseException:
            self._release_dir()
            raise
        self._con = con
        self._finalizer = weakref.finalize(self, _finalize, con, self._dir_key)
        return con

    def _open_database(self) -> duckdb.DuckDBPyConnection:
        db = self._db_file
        try:
            con = connect(db)
        except duckdb.Error as exc:
            kind, why = trouble(exc)
            if kind == "locked":
                raise OSError(f"{db}: in use by another process ({exc})") from exc
            raise ValueError(f"{db}: not a DuckDB database of an HnswVectorStore: it {why} ({exc})") from exc
        try:
            # Metadata goes in as NumPy object arrays; without this DuckDB inspects 1,000
            # values of each column before every insert.
            con.execute("SET pandas_analyze_sample = 0")
            tables = table_names(con)
            if not tables:
                with transaction(con):
                    con.execute(_SCHEMA)
                    con.execute("INSERT INTO vector_store VALUES (?, ?, 0, 0, 0)", [_FORMAT, _VERSION])
            elif "vector_store" not in tables:
                raise ValueError(
                    f"{db}: a DuckDB database of something else (tables: {', '.join(sorted(tables))}), "
                    "not an HnswVectorStore"
                )
            row = con.execute(
                "SELECT format, version, next_label, next_seq, next_kid FROM vector_store"
            ).fetchone()
            if row is None or row[0] != _FORMAT:
                raise ValueError(f"{db}: not an HnswVectorStore database")
            if row[1] != _VERSION:
                raise ValueError(
                    f"{db}: HnswVectorStore format version {row[1]}, this version reads {_VERSION}"
                )
            self._next_label, self._next_seq, self._next_kid = int(row[2]), int(row[3]), int(row[4])
            (rows,) = con.execute("SELECT count(*) FROM vector_attrs").fetchone() or (0,)
            self._attrs_sorted, self._attrs_unsorted = int(rows), 0
        except BaseException:
            con.close()
            raise
        return con

    def _release_dir(self) -> None:
        if self._dir_key is not None:
            with _open_dirs_lock:
                _open_dirs.discard(self._dir_key)
            self._dir_key = None

    def close(self) -> None:
        with self._lock:
            if self._con is None:
                return
            failure: Exception | None = None
            for ix in self._indexes.values():
                try:
                    self._checkpoint(ix)
                except Exception as exc:  # the log still holds the changes; keep closing
                    failure = failure or exc
            self._indexes.clear()
            self._absent.clear()
            if self._finalizer is not None:
                self._finalizer.detach()
            self._con.close()
            self._con = None
            self._release_dir()
            if failure is not None:
                raise failure

    # -- indexes ---------------------------------------------------------------------------

    def create_index(self, name: str, dimension: int, metric: str) -> None:
        _check_name(name)
        if not _is_int(dimension) or dimension < 1:
            raise ValueError(
                f"Vector index {name!r}: dimension must be a positive integer, got {dimension!r}"
            )
        if metric not in METRICS:
            raise ValueError(
                f"Vector index {name!r}: unsupported metric {metric!r} (supported: cosine, dotproduct, euclidean)"
            )
        with self._lock:
            con = self._connect()
            row = con.execute(
                "SELECT dimension, metric FROM vector_indexes WHERE name = ?", [name]
            ).fetchone()
            if row is not None:
                if row[0] != dimension:
                    raise ValueError(
                        f"Vector index {name!r} exists with dimension {row[0]}, not {dimension}"
                    )
                if row[1] != metric:
                    raise ValueError(
                        f"Vector index {name!r} exists with metric {row[1]!r}, not {metric!r}"
                    )
                return
            seq = self._next_seq
            with self._transaction() as cur:
                cur.execute(
                    "INSERT INTO vector_indexes VALUES (?, ?, ?, '{}', ?, ?)",
                    [name, dimension, metric, seq, seq],
                )
                cur.execute("UPDATE vector_store SET next_seq = ?", [seq + 1])
            self._next_seq = seq + 1
            self._absent.discard(name)

    def list_indexes(self) -> list[str]:
        with self._lock:
            rows = (
                self._connect().execute("SELECT name FROM vector_indexes ORDER BY name").fetchall()
            )
            return [row[0] for row in rows]

    def describe_index(self, name: str) -> dict[str, Any]:
        with self._lock:
            dimension, metric, _, _, _ = self._index_row(name)
            (count,) = self._one("SELECT count(*) FROM vector_items WHERE idx = ?", [name])
            return {"dimension": dimension, "metric": metric, "count": int(count)}

    def set_index_info(self, name: str, info: Mapping[str, Any]) -> None:
        if not isinstance(info, Mapping):
            raise ValueError(
                f"Vector index {name!r}: info must be a mapping, got {type(info).__name__}"
            )
        try:
            text = json.dumps(dict(info), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Vector index {name!r}: info is not JSON-compatible ({exc})") from exc
        with self._lock:
            self._index_row(name)
            with self._transaction() as cur:
                cur.execute("UPDATE vector_indexes SET info = ? WHERE name = ?", [text, name])

    def get_index_info(self, name: str) -> dict[str, Any]:
        with self._lock:
            info: dict[str, Any] = json.loads(self._index_row(name)[4])
            return info

    def delete_index(self, name: str) -> None:
        with self._lock:
            self._index_row(name)
            with self._transaction() as cur:
                cur.execute(
                    "DELETE FROM vector_attrs WHERE kid IN (SELECT kid FROM vector_keys WHERE idx = ?)",
                    [name],
                )
                for table in ("vector_items", "vector_keys", "vector_log"):
                    cur.execute(f"DELETE FROM {table} WHERE idx = ?", [name])
                cur.execute("DELETE FROM vector_indexes WHERE name = ?", [name])
            self._indexes.pop(name, None)
            if self.dir is not None:
                # Graph files of a deleted index are ours by name; a crash before this point
                # leaves them behind, and they are ignored (older than any new index's seq).
                for file, _, _ in self._graph_files(name):
                    file.unlink(missing_ok=True)

    def _index_row(self, name: str) -> tuple[int, str, int, int, str]:
        _check_name(name)
        row = (
            self._connect()
            .execute(
                "SELECT dimension, metric, created_seq, graph_seq, info FROM vector_indexes WHERE name = ?",
                [name],
            )
            .fetchone()
        )
        if row is None:
            raise LookupError(f"Vector index {name!r} does not exist")
        return int(row[0]), str(row[1]), int(row[2]), int(row[3]), str(row[4])

    def _index(self, name: str) -> _Index:
        """The index in memory, loaded on first use."""
        ix = self._indexes.get(name)
        if ix is None:
            if name in self._absent:
                # Known missing: this store is its database's only writer, and only
                # create_index makes one. (A search engine queries before its first upsert.)
                raise LookupError(f"Vector index {name!r} does not exist")
            try:
                ix = self._load(name)
            except LookupError:
                self._absent.add(name)
                raise
            self._indexes[name] = ix
        return ix

    # -- writes ----------------------------------------------------------------------------

    def upsert(
        self,
        name: str,
        vectors: Sequence[Sequence[float]],
        metadata: Sequence[Mapping[str, Any] | None] | None,
        ids: Sequence[str] | None,
    ) -> list[str]:
        n = len(vectors)
        if ids is None:
            ids = [str(uuid.uuid4()) for _ in range(n)]
        elif isinstance(ids, str) or len(ids) != n:
            raise ValueError(f"Vector index {name!r}: {n} vectors but {_length(ids)} ids")
        id_list = list(ids)
        for id in id_list:
            if not isinstance(id, str):
                raise ValueError(f"Vector index {name!r}: ids must be strings, got {id!r}")
        if len(set(id_list)) != n:
            repeated = next(i for i in id_list if id_list.count(i) > 1)
            raise ValueError(
                f"Vector index {name!r}: id {repeated!r} appears more than once in one upsert"
            )
        if metadata is None:
            metas: list[Mapping[str, Any]] = [{}] * n
        elif isinstance(metadata, Mapping | str) or len(metadata) != n:
            raise ValueError(
                f"Vector index {name!r}: {n} vectors but {_length(metadata)} metadata entries"
            )
        else:
            metas = [{} if m is None else m for m in metadata]
        with self._lock:
            ix = self._index(name)
            matrix = _vectors(ix, vectors, id_list)
            texts = [
                metadata_json(ix.name, id, meta) for id, meta in zip(id_list, metas, strict=True)
            ]
            if n == 0:
                return id_list
            old = [(ix.ids[id], id) for id in id_list if id in ix.ids]
            labels = np.arange(self._next_label, self._next_label + n, dtype=np.int64)
            seq = self._next_seq
            attrs = attr_rows(labels, metas)
            keys = attrs.pop("key")
            fresh = dict.fromkeys(k for k in keys if k not in ix.keys)
            new_keys = {key: self._next_kid + i for i, key in enumerate(fresh)}
            kids = {**ix.keys, **new_keys}
            attrs["kid"] = np.array([kids[k] for k in keys], np.int32)
            items = {
                "label": labels,
                "id": np.array(id_list, dtype=object),
                "meta": np.array(texts, dtype=object),
            }
            with self._transaction() as cur:
                if old:
                    self._delete_rows(cur, name, np.array([label for label, _ in old], np.int64))
                cur.register("batch_items", items)
                cur.execute(
                    "INSERT INTO vector_items SELECT label, ?, id, meta FROM batch_items", [name]
                )
                cur.unregister("batch_items")
                for key, kid in new_keys.items():
                    cur.execute("INSERT INTO vector_keys VALUES (?, ?, ?)", [kid, name, key])
                cur.register("batch_attrs", attrs)
                cur.execute(
                    "INSERT INTO vector_attrs SELECT label, kid, t, CAST(s AS VARCHAR),"
                    " CASE WHEN t IN (1, 2) THEN n END, elem FROM batch_attrs"
                )
                cur.unregister("batch_attrs")
                if self.dir is not None:
                    cur.execute(
                        "INSERT INTO vector_log VALUES (?, ?, ?, ?)",
                        [name, seq, labels.tobytes(), matrix.tobytes()],
                    )
                cur.execute(
                    "UPDATE vector_store SET next_label = ?, next_seq = ?, next_kid = ?",
                    [int(labels[-1]) + 1, seq + 1, self._next_kid + len(new_keys)],
                )
            self._next_label = int(labels[-1]) + 1
            self._next_seq = seq + 1
            self._next_kid += len(new_keys)
            ix.keys.update(new_keys)

            def change() -> None:
                ix.delete([label for label, _ in old], [id for _, id in old])
                ix.add(labels, matrix, id_list)

            self._apply(ix, change)
            ix.dirty += n + len(old)
            self._attrs_unsorted += len(keys)
            self._maybe_sort_attrs()
            self._maybe_checkpoint(ix)
            return id_list

    def delete_ids(self, name: str, ids: Sequence[str]) -> int:
        with self._lock:
            ix = self._index(name)
            found = [(ix.ids[id], id) for id in dict.fromkeys(ids) if id in ix.ids]
            return self._delete(ix, found)

    def delete_matching(self, name: str, filter: Mapping[str, Any]) -> int:
        node = parse_filter(filter)
        if node == ("all",):
            raise ValueError(
                f"Vector index {name!r}: delete_vectors needs a non-empty filter (delete_index deletes everything)"
            )
        with self._lock:
            ix = self._index(name)
            labels = np.flatnonzero(self._evaluate(ix, node))
            if len(labels) == 0:
                return 0
            found = self._one_column(
                "SELECT label, id FROM vector_items WHERE label IN (SELECT label FROM batch_labels)",
                {"label": labels.astype(np.int64)},
            )
            return self._delete(ix, found)

    def _delete(self, ix: _Index, found: list[tuple[int, str]]) -> int:
        if not found:
            return 0
        seq = self._next_seq
        with self._transaction() as cur:
            self._delete_rows(cur, ix.name, np.array([label for label, _ in found], np.int64))
            cur.execute("UPDATE vector_store SET next_seq = ?", [seq + 1])
        self._next_seq = seq + 1
        self._apply(ix, lambda: ix.delete([label for label, _ in found], [id for _, id in found]))
        ix.dirty += len(found)
        self._maybe_checkpoint(ix)
        return len(found)

    def _maybe_sort_attrs(self) -> None:
        """Rewrite vector_attrs in (kid, value) order once the unsorted rows are as many as the
        sorted ones: DuckDB's zone maps then skip the rows of other keys and values, which
        makes an uncached filter several times faster. Amortised, each row is rewritten a
        constant number of times."""
        if self._attrs_unsorted < max(20_000, self._attrs_sorted):
            return
        try:
            with self._transaction() as cur:
                cur.execute(
                    "CREATE TABLE vector_attrs_sorted AS"
                    " SELECT * FROM vector_attrs ORDER BY kid, t, s, n"
                )
                cur.execute("DROP TABLE vector_attrs")
                cur.execute("ALTER TABLE vector_attrs_sorted RENAME TO vector_attrs")
        except duckdb.Error as exc:  # only speed is at stake; the next upsert tries again
            _log.warning("sorting the vector metadata failed: %s", exc)
            return
        self._attrs_sorted += self._attrs_unsorted
        self._attrs_unsorted = 0

    @staticmethod
    def _delete_rows(cur: duckdb.DuckDBPyConnection, name: str, labels: Labels) -> None:
        cur.register("batch_deleted", {"label": labels})
        cur.execute("DELETE FROM vector_items WHERE label IN (SELECT label FROM batch_deleted)")
        cur.execute("DELETE FROM vector_attrs WHERE label IN (SELECT label FROM batch_deleted)")
        cur.unregister("batch_deleted")

    def _apply(self, ix: _Index, change: Callable[[], object]) -> None:
        """Apply a committed change to the index in memory."""
        try:
            change()
        except BaseException:
            # DuckDB has the change; the graph may be half-changed. Reload it from disk (the
            # log replays the change) on next use; in memory there is nothing to reload from.
            self._indexes.pop(ix.name, None)
            if self.dir is None:
                _log.error(
                    "vector index %r in memory may be inconsistent after a failed change", ix.name
                )
            raise

    # -- search ----------------------------------------------------------------------------

    def query(
        self, name: str, vector: Sequence[float], top_k: int, filter: Mapping[str, Any] | None
    ) -> list[dict[str, Any]]:
        if not _is_int(top_k) or top_k < 0:
            raise ValueError(
                f"Vector index {name!r}: top_k must be a non-negative integer, got {top_k!r}"
            )
        node = ("all",) if filter is None else parse_filter(filter)
        with self._lock:
            ix = self._index(name)
            q = _query_vector(ix, vector)
            if top_k == 0 or ix.count == 0:
                return []
            allowed = None if node == ("all",) else self._evaluate(ix, node)
            n_allowed = ix.count if allowed is None else int(np.count_nonzero(allowed))
            if n_allowed == 0:
                return []
            k = min(top_k, n_allowed)
            if n_allowed <= self.exact_limit or (
                allowed is not None and n_allowed * 20 <= ix.count
            ):
                labels = np.flatnonzero(ix.live if allowed is None else allowed)
                hits = _exact(ix, q, labels, k)
            else:
                hits = self._approximate(
                    ix, q, k, None if n_allowed == ix.count else allowed, n_allowed
                )
            return self._results(hits)

    def _approximate(
        self, ix: _Index, q: Floats, k: int, allowed: Mask | None, n_allowed: int
    ) -> list[tuple[int, float]]:
        """hnswlib's nearest items, those ``allowed`` kept; exact search when they are too few.

        A filter is applied after the search rather than through hnswlib's ``filter=``, which
        calls back into Python for every item visited: fetching ``4 * k / share`` items with
        ``ef`` divided by the share allowed measured 5-15 times faster for the same recall.
        """
        share = n_allowed / ix.count
        fetch = k if allowed is None else min(ix.count, math.ceil(4 * k / share))
        graph = ix.graph
        graph.set_ef(min(max(math.ceil(self.ef_search / share), fetch), ix.count))
        try:
            labels, distances = graph.knn_query(q.reshape(1, -1), k=fetch)
        except RuntimeError as exc:
            # hnswlib raises when it reaches fewer than `fetch` items (many deleted slots)
            if "contiguous 2D array" not in str(exc):
                raise
            return _exact(ix, q, np.flatnonzero(ix.live if allowed is None else allowed), k)
        finally:
            graph.set_ef(self.ef_search)
        found, dist = labels[0].astype(np.int64), distances[0]
        if allowed is not None:
            keep = allowed[found]
            found, dist = found[keep][:k], dist[keep][:k]
            if len(found) < k:  # the allowed items lie far from the query
                return _exact(ix, q, np.flatnonzero(allowed), k)
        scores = _vector_math.scores_from_distances(ix.metric, dist)
        return [(int(label), float(score)) for label, score in zip(found, scores, strict=True)]

    def _results(self, hits: list[tuple[int, float]]) -> list[dict[str, Any]]:
        if not hits:
            return []
        # Labels are integers we made, so they can go into the SQL text; an IN list of
        # constants lets DuckDB use the primary key (a parameter list scans the table).
        listed = ", ".join(str(label) for label, _ in hits)
        rows = (
            self._connect()
            .execute(f"SELECT label, id, meta FROM vector_items WHERE label IN ({listed})")
            .fetchall()
        )
        by_label = {int(label): (id, meta) for label, id, meta in rows}
        results: list[dict[str, Any]] = []
        for label, score in hits:
            found = by_label.get(label)
            if found is not None:
                results.append({"id": found[0], "score": score, "metadata": json.loads(found[1])})
        return results

    # -- filters ---------------------------------------------------------------------------

    def _evaluate(self, ix: _Index, node: FilterNode) -> Mask:
        """The items of ``ix`` that ``node`` allows, as a mask over labels."""
        kind = node[0]
        if kind == "all":
            return ix.live.copy()
        if kind == "and":
            masks = [self._evaluate(ix, child) for child in node[1]]
            return functools.reduce(np.logical_and, masks)
        if kind == "or":
            masks = [self._evaluate(ix, child) for child in node[1]]
            return functools.reduce(np.logical_or, masks)
        if kind == "not":
            return ix.live & ~self._evaluate(ix, node[1])
        cache_key = repr(node)
        cached = ix.masks.get(cache_key)
        if cached is not None:
            return cached
        mask = np.zeros(len(ix.live), np.bool_)
        kid = ix.keys.get(node[1])  # None: no item ever had the key
        if kind == "exists":
            sql, params = "NOT elem", list[Any]()
        else:
            sql, params = values_sql(node[2])
        if sql and kid is not None:
            found = (
                self._connect()
                .execute(
                    f"SELECT label FROM vector_attrs WHERE kid = ? AND ({sql})", [kid, *params]
                )
                .fetchnumpy()["label"]
            )
            mask[np.asarray(found, np.int64)] = True
            mask &= ix.live
        mask.flags.writeable = False  # shared by later queries
        if len(ix.masks) >= 16:
            del ix.masks[next(iter(ix.masks))]
        ix.masks[cache_key] = mask
        return mask

    # -- loading and checkpoints -----------------------------------------------------------

    def _graph_files(self, name: str) -> list[tuple[Path, int, int | None]]:
        """Our files of index ``name``: (path, seq, crc), crc None for temporary files."""
        assert self.dir is not None
        found: list[tuple[Path, int, int | None]] = []
        for entry in os.listdir(self.dir):
            graph = _GRAPH_FILE.fullmatch(entry)
            if graph and graph["name"] == name:
                found.append((self.dir / entry, int(graph["seq"]), int(graph["crc"], 16)))
            tmp = _TMP_FILE.fullmatch(entry)
            if tmp and tmp["name"] == name:
                found.append((self.dir / entry, int(tmp["seq"]), None))
        return found

    def _new_graph(self, space: str, dimension: int, capacity: int) -> Any:
        hnswlib = _vector_graphs.hnswlib()
        graph = hnswlib.Index(space=space, dim=dimension)
        graph.init_index(
            max_elements=max(capacity, 1024),
            M=self.m,
            ef_construction=self.ef_construction,
            random_seed=100,
            allow_replace_deleted=True,
        )
        graph.set_ef(self.ef_search)
        return graph

    def _load(self, name: str) -> _Index:
        dimension, metric, created_seq, graph_seq, _ = self._index_row(name)
        con = self._connect()
        items = con.execute(
            "SELECT label, id FROM vector_items WHERE idx = ? ORDER BY label", [name]
        ).fetchnumpy()
        live_labels = np.asarray(items["label"], np.int64)
        live_ids = [str(id) for id in items["id"]]
        checkpoint = (
            self._pick_checkpoint(name, created_seq, graph_seq) if self.dir is not None else None
        )
        file_seq = graph_seq if checkpoint is None else checkpoint.seq
        # Vectors added since the checkpoint, in the order they were added.
        logged_labels: list[Labels] = []
        logged_vectors: list[Floats] = []
        for labels_blob, vectors_blob in con.execute(
            "SELECT labels, vectors FROM vector_log WHERE idx = ? AND seq > ? ORDER BY seq",
            [name, file_seq],
        ).fetchall():
            logged_labels.append(np.frombuffer(labels_blob, np.int64))
            logged_vectors.append(np.frombuffer(vectors_blob, np.float32).reshape(-1, dimension))
        log_labels = np.concatenate(logged_labels) if logged_labels else np.zeros(0, np.int64)
        log_vectors = (
            np.concatenate(logged_vectors)
            if logged_vectors
            else np.zeros((0, dimension), np.float32)
        )

        space = METRICS[metric]
        ix = _Index(
            name=name,
            dimension=dimension,
            metric=metric,
            graph=None,
            file_seq=file_seq,
            ids={},
            live=np.zeros(0, np.bool_),
            rows=np.zeros(0, np.int64),
            matrix=np.zeros((0, dimension), np.float32),
            free_rows=[],
        )
        ix.grow_labels(self._next_label)
        ix.keys = dict(
            con.execute("SELECT key, kid FROM vector_keys WHERE idx = ?", [name]).fetchall()
        )
        if checkpoint is None:
            ix.graph = self._new_graph(space, dimension, len(live_labels))
            file_live = np.zeros(0, np.int64)
        else:
            ix.graph, file_labels, file_deleted, file_vectors = _vector_graphs.read_graph(
                checkpoint, space, dimension
            )
            file_live = file_labels[~file_deleted]
            # Items deleted since the checkpoint.
            for label in np.setdiff1d(file_live, live_labels).tolist():
                ix.graph.mark_deleted(label)
                ix.dirty += 1
            kept = np.isin(live_labels, file_live)
            keep_labels = live_labels[kept]
            order = np.argsort(file_labels, kind="stable")
            position = order[np.searchsorted(file_labels, keep_labels, sorter=order)]
            vectors = file_vectors(position)
            rows = ix.take_rows(len(keep_labels))
            ix.matrix[rows] = vectors
            ix.rows[keep_labels] = rows
            ix.live[keep_labels] = True
            ix.count = len(keep_labels)
            del file_vectors
        # Items added since the checkpoint (and still there) come from the log.
        needed = np.setdiff1d(live_labels, file_live)
        from_log = np.isin(log_labels, needed)
        missing = np.setdiff1d(needed, log_labels[from_log])
        if len(missing):
            id_of = dict(zip(live_labels.tolist(), live_ids, strict=True))
            where = f"graph file {checkpoint.path}" if checkpoint else f"the log in {self._db_file}"
            raise ValueError(
                f"Vector index {name!r}: {len(missing)} vectors are neither in {where} nor logged "
                f"(e.g. id {id_of[int(missing[0])]!r}); the files do not belong together"
            )
        id_of_label = dict(zip(live_labels.tolist(), live_ids, strict=True))
        add_labels = log_labels[from_log]
        ix.add(
            add_labels,
            np.ascontiguousarray(log_vectors[from_log]),
            [id_of_label[int(lb)] for lb in add_labels],
        )
        ix.ids = dict(zip(live_ids, live_labels.tolist(), strict=True))
        ix.dirty += len(add_labels)
        if checkpoint is not None:
            if checkpoint.seq > graph_seq:
                # A checkpoint was renamed into place but not yet recorded: record it now.
                self._record_checkpoint(name, checkpoint.seq)
            self._remove_older(name, checkpoint.seq)
        self._maybe_checkpoint(ix)
        return ix

    def _pick_checkpoint(self, name: str, created_seq: int, graph_seq: int) -> GraphFile | None:
        graphs = [
            GraphFile(path, seq, crc)
            for path, seq, crc in self._graph_files(name)
            if crc is not None and seq >= graph_seq
        ]
        if not graphs:
            if graph_seq > created_seq:
                raise ValueError(
                    f"Vector index {name!r}: its graph file {self.dir}/{name}.{graph_seq}.<crc>.hnsw is missing"
                )
            return None
        return max(graphs, key=lambda g: g.seq)

    def _maybe_checkpoint(self, ix: _Index) -> None:
        if self.dir is None or ix.dirty < max(self.checkpoint_every, ix.count // 10):
            return
        try:
            self._checkpoint(ix)
        except Exception as exc:
            # The change is committed (the log holds it); the next checkpoint tries again.
            _log.warning("writing the graph of vector index %r failed: %s", ix.name, exc)

    def _checkpoint(self, ix: _Index) -> None:
        """Write ``ix``'s graph: temporary file, fsync, checksum, rename, fsync the directory;
        then record it in DuckDB and drop the log it covers; then remove older graphs."""
        if self.dir is None or ix.dirty == 0:
            return
        seq = self._next_seq - 1
        if seq <= ix.file_seq:  # every change takes a seq, so this cannot happen; be safe
            seq = self._take_seq()
        tmp = self.dir / f".{ix.name}.{seq}.hnsw.tmp"
        try:
            ix.graph.save_index(str(tmp))
            crc = _vector_graphs.fsync_and_crc(tmp)
            final = self.dir / f"{ix.name}.{seq}.{crc:08x}.hnsw"
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _vector_graphs.fsync_dir(self.dir)
        self._record_checkpoint(ix.name, seq)
        ix.file_seq = seq
        ix.dirty = 0
        self._remove_older(ix.name, seq)

    def _record_checkpoint(self, name: str, seq: int) -> None:
        with self._transaction() as cur:
            cur.execute("UPDATE vector_indexes SET graph_seq = ? WHERE name = ?", [seq, name])
            cur.execute("DELETE FROM vector_log WHERE idx = ? AND seq <= ?", [name, seq])
        if seq >= self._next_seq:
            self._take_seq(seq + 1)

    def _take_seq(self, at_least: int = 0) -> int:
        seq = max(self._next_seq, at_least)
        with self._transaction() as cur:
            cur.execute("UPDATE vector_store SET next_seq = ?", [seq + 1])
        self._next_seq = seq + 1
        return seq

    def _remove_older(self, name: str, seq: int) -> None:
        for path, file_seq, crc in self._graph_files(name):
            if file_seq < seq or crc is None:
                path.unlink(missing_ok=True)

    # -- DuckDB helpers --------------------------------------------------------------------

    def _transaction(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        return transaction(self._connect())

    def _one(self, sql: str, params: list[Any]) -> tuple[Any, ...]:
        row = self._connect().execute(sql, params).fetchone()
        assert row is not None
        return row

    def _one_column(self, sql: str, labels: dict[str, Any]) -> list[tuple[int, str]]:
        con = self._connect()
        con.register("batch_labels", labels)
        try:
            return [(int(label), str(id)) for label, id in con.execute(sql).fetchall()]
        finally:
            con.unregister("batch_labels")


def _finalize(con: duckdb.DuckDBPyConnection, dir_key: str | None) -> None:
    # A store dropped without close(): release the database; its changes are already committed.
    con.close()
    if dir_key is not None:
        with _open_dirs_lock:
            _open_dirs.discard(dir_key)


# -- values, vectors and scores ------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _length(value: object) -> str:
    try:
        return str(len(value))  # type: ignore[arg-type]
    except TypeError:
        return f"a {type(value).__name__} instead of a list of"


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"Invalid vector index name {name!r}: use letters, digits and underscores, starting with a "
            "letter or underscore, at most 63 characters"
        )


def _vectors(ix: _Index, vectors: Sequence[Sequence[float]], ids: Sequence[str]) -> Floats:
    """The vectors as a float32 matrix (unit length for cosine), or ValueError naming the id."""
    d = ix.dimension
    try:
        array = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 2 or array.shape[1] != d:
        if array is not None and array.size == 0 and len(vectors) == 0:
            return np.zeros((0, d), np.float32)
        for id, vector in zip(ids, vectors, strict=True):
            try:
                row = np.asarray(vector, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(
                    f"Vector index {ix.name!r}: the vector of id {id!r} is not a list of numbers "
                    f"(dimension {d})"
                ) from None
            if row.ndim != 1 or len(row) != d:
                got = len(row) if row.ndim == 1 else f"shape {row.shape}"
                raise ValueError(
                    f"Vector index {ix.name!r}: the vector of id {id!r} has dimension {got}, expected {d}"
                )
        raise ValueError(f"Vector index {ix.name!r}: vectors must be a list of dimension-{d} lists")
    with np.errstate(over="ignore"):  # too large for float32 becomes inf, reported below
        matrix = array.astype(np.float32)
    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise ValueError(
            f"Vector index {ix.name!r}: the vector of id {ids[bad]!r} (dimension {d}) contains NaN or "
            "infinity (or numbers too large for float32)"
        )
    return _vector_math.prepare(ix.metric, matrix)


def _query_vector(ix: _Index, vector: Sequence[float]) -> Floats:
    try:
        q = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"Vector index {ix.name!r}: the query vector is not a list of numbers"
        ) from None
    if q.ndim != 1 or len(q) != ix.dimension:
        got = len(q) if q.ndim == 1 else f"shape {q.shape}"
        raise ValueError(
            f"Vector index {ix.name!r}: the query vector has dimension {got}, expected {ix.dimension}"
        )
    with np.errstate(over="ignore"):
        q32 = q.astype(np.float32)
    if not np.isfinite(q32).all():
        raise ValueError(
            f"Vector index {ix.name!r}: the query vector (dimension {ix.dimension}) contains NaN or infinity"
        )
    prepared: Floats = _vector_math.prepare(ix.metric, q32.reshape(1, -1))[0]
    return prepared


def _exact(ix: _Index, q: Floats, labels: npt.NDArray[np.intp], k: int) -> list[tuple[int, float]]:
    """Top ``k`` of ``labels`` by exact score; ties go to the older item."""
    rows = ix.rows[labels]
    if 6 * len(rows) > ix.used_rows:
        # Many of the rows: one pass over the whole matrix costs less than copying them.
        scores = _vector_math.score(ix.metric, ix.matrix[: ix.used_rows], q)[rows]
    else:
        scores = _vector_math.score(ix.metric, ix.matrix[rows], q)
    top = np.argpartition(-scores, k - 1)[:k] if len(labels) > k else np.arange(len(labels))
    order = top[np.lexsort((labels[top], -scores[top]))]
    return [(int(labels[i]), float(scores[i])) for i in order]
