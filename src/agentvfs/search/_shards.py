"""Vector shards of segments: a segment's documents embedded into unit vectors and an hnswlib
graph when the segment is built, and searched, with some documents hidden, once attached.

A shard scores as the workspace's vector store (:class:`HnswVectorStore`) does, with the same
arithmetic: vectors are turned to float32 and scaled to unit length, a score is the clipped dot
product. So an exact search over a published shard and the agent's own store together ranks as
one store holding what the agent sees. As that store, an index of at most ``exact_limit``
visible vectors (all its shards together) is searched exactly (a product with the memory-mapped
rows); a larger one through each shard's hnswlib graph, with hidden documents left out after
the search (more neighbours are fetched the more are hidden), and exactly again where too few
visible ones remain among them.

The graph comes from storage that others may write: it is checked in full
(:func:`~._vector_graphs.check_graph`) before hnswlib reads it, and never unpickled.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt

from ..errors import SearchIndexError
from . import _vector_graphs, _vector_math
from ._embedders import embed_texts, embedder_id
from ._segments import MAX_DIMENSION, Segment, VectorColumns
from ._vector_math import Floats, Mask

__all__ = ["EF_SEARCH", "EXACT_LIMIT", "GRAPH_EF_CONSTRUCTION", "GRAPH_M", "VectorShard", "embed_shard"]

#: hnswlib ``M`` and ``ef_construction`` of a shard's graph (the vector store's defaults).
GRAPH_M = 16
GRAPH_EF_CONSTRUCTION = 200
#: The graph's random seed: a rebuilt segment of the same files has the same bytes.
GRAPH_SEED = 100
#: Shards of at most this many visible vectors are searched exactly (the store's default).
EXACT_LIMIT = 5000
#: hnswlib ``ef`` of a graph search (the store's default).
EF_SEARCH = 128

#: ``(score, slot)`` of a shard's hit.
ShardHit = tuple[float, int]
#: How far a row's length may be from 1 (float32 rounding of unit vectors is far below it).
_NORM_TOLERANCE = 1e-3
#: How far the graph's copy of a unit vector may be from the row (hnswlib normalises it
#: again in float32; a few units in the last place).
_COPY_TOLERANCE = 1e-5
#: Rows checked at a time at attach.
_CHECK_ROWS = 4096
#: Filters whose allowed rows a shard keeps.
_FILTERS_KEPT = 16


def embed_shard(embedder: Any, texts: Sequence[str], ids: Sequence[str]) -> tuple[VectorColumns, dict[str, str]]:
    """Embed a segment's documents (``texts``, in slot order) into its vector shard.

    Runs its own event loop: call it from a thread without one (the segment builder's).

    Returns
    -------
    VectorColumns, dict
        The shard, and the documents without a vector (id -> why: the embedder failed, or
        returned an unusable vector).
    """

    async def run() -> tuple[list[list[float] | None], dict[int, str]]:
        return await embed_texts(embedder, texts, names=ids)

    vectors, failed = anyio.run(run)
    failures = {ids[i]: why for i, why in failed.items()}
    rows = [i for i, vector in enumerate(vectors) if vector is not None]
    dimension = len(vectors[rows[0]]) if rows else 0  # type: ignore[arg-type]
    if dimension > MAX_DIMENSION:
        raise ValueError(
            f"the embedder {embedder_id(embedder)} returned vectors of {dimension} dimensions; a "
            f"segment holds at most {MAX_DIMENSION}"
        )
    with np.errstate(over="ignore"):  # too large for float32 becomes inf, refused below
        matrix = np.asarray([vectors[i] for i in rows], dtype=np.float64).reshape(len(rows), dimension)
        matrix32 = matrix.astype(np.float32)
    finite = np.isfinite(matrix32).all(axis=1)
    for i in np.flatnonzero(~finite).tolist():
        failures[ids[rows[i]]] = f"{ids[rows[i]]}: the vector has numbers too large for float32"
    unit = _vector_math.prepare("cosine", matrix32[finite])
    slots = np.asarray(rows, dtype=np.int32)[finite]
    info = {
        "embedder": embedder_id(embedder),
        "metric": "cosine",
        "dimension": dimension,
        "count": len(slots),
        "M": GRAPH_M,
        "ef_construction": GRAPH_EF_CONSTRUCTION,
    }
    return VectorColumns(info, unit, slots, build_graph(unit) if len(slots) else b""), failures


def build_graph(unit: Floats) -> bytes:
    """The hnswlib graph of ``unit`` (rows labelled by their numbers), as hnswlib saves it."""
    count, dimension = unit.shape
    graph = _vector_graphs.hnswlib().Index(space="cosine", dim=dimension)
    graph.init_index(max_elements=count, M=GRAPH_M, ef_construction=GRAPH_EF_CONSTRUCTION, random_seed=GRAPH_SEED)
    # One thread: the same rows give the same graph (and segment name) on every build.
    graph.add_items(unit, np.arange(count, dtype=np.int64), num_threads=1)
    with tempfile.TemporaryDirectory(prefix="agentvfs-graph-") as tmp:
        path = os.path.join(tmp, "graph.hnsw")
        graph.save_index(path)
        with open(path, "rb") as f:
            return f.read()


class VectorShard:
    """The vector side of one segment (see the module documentation).

    Parameters
    ----------
    segment : Segment
        A segment with a vector shard.
    ef_search : int
        hnswlib ``ef`` of a graph search.

    Raises
    ------
    SearchIndexError
        The shard cannot be searched: its rows name documents outside the segment, or hold
        NaN, infinity, or a vector that is neither of unit length nor zero (such a row would
        outscore every true neighbour).
    """

    def __init__(self, segment: Segment, *, ef_search: int = EF_SEARCH) -> None:
        info = segment.vector_info
        if info is None:
            raise ValueError(f"segment {segment.name} has no vectors")
        self.segment = segment
        self.embedder: str = info["embedder"]
        self.dimension: int = info["dimension"]
        self.matrix = segment.vector_matrix
        self.slots = segment.vector_slots
        self.ef_search = ef_search
        self._graph: Any = None
        self._stray = np.zeros(0, dtype=np.int64)  # rows no graph search can reach
        self._lock = threading.Lock()  # hnswlib's ef is one setting per graph
        self._allowed: dict[Any, Mask] = {}  # filter -> rows whose documents pass it
        self._check()

    def __len__(self) -> int:
        return len(self.slots)

    def _check(self) -> None:
        slots, n = self.slots, self.segment.n_docs
        why = None
        if len(slots) and (int(slots[0]) < 0 or int(slots[-1]) >= n or not bool(np.all(slots[1:] > slots[:-1]))):
            why = f"its vectors' documents are not ascending slots among its {n}"
        else:
            for start in range(0, len(slots), _CHECK_ROWS):  # in pieces: no matrix-sized temporaries
                part = self.matrix[start : start + _CHECK_ROWS]
                if not bool(np.isfinite(part).all()):
                    why = "a vector holds NaN or infinity"
                    break
                norms = np.sqrt(_vector_math.rowdot(part, part))
                if not bool(np.all((np.abs(norms - 1.0) <= _NORM_TOLERANCE) | (norms == 0.0))):
                    why = "a vector is neither of unit length nor zero"
                    break
        if why is not None:
            raise SearchIndexError(f"segment {self.segment.name} cannot be searched by vector: {why}")

    def load_graph(self) -> None:
        """Check the graph and load it into hnswlib (once; a search loads it when needed)."""
        with self._lock:
            if self._graph is not None:
                return
            data = self.segment.graph_bytes
            count = len(self.slots)
            try:
                _vector_graphs.check_graph(data.data, count=count, dimension=self.dimension)
            except ValueError as exc:
                raise SearchIndexError(
                    f"segment {self.segment.name} cannot be searched by vector: its graph is not one "
                    f"hnswlib can use safely ({exc})"
                ) from None
            # The graph walks by its own copy of the vectors: it must be the checked one, or a
            # forged copy would lead every search away from the true neighbours.
            labels, stored = _vector_graphs.stored_vectors(data.data, count=count, dimension=self.dimension)
            for start in range(0, count, _CHECK_ROWS):
                part = slice(start, start + _CHECK_ROWS)
                apart = np.abs(stored[part] - self.matrix[labels[part]])
                if not bool(np.all(apart <= _COPY_TOLERANCE)):  # (NaN is never within)
                    raise SearchIndexError(
                        f"segment {self.segment.name} cannot be searched by vector: its graph's copy "
                        "of the vectors differs from its vectors"
                    )
            # Rows the graph leads no search to are scored exactly beside it at every search.
            self._stray = np.flatnonzero(~_vector_graphs.reachable(data.data, count=count, dimension=self.dimension))
            # hnswlib loads from a path only: a file of our own, gone once loaded.
            fd, path = tempfile.mkstemp(prefix="agentvfs-shard-", suffix=".hnsw")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data.data)
                graph = _vector_graphs.hnswlib().Index(space="cosine", dim=self.dimension)
                graph.load_index(path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            graph.set_ef(self.ef_search)
            self._graph = graph

    def allowed(self, key: Any, make: Callable[[], Callable[[int], bool]]) -> Mask:
        """The rows whose documents pass a filter, kept by ``key``: the segment never changes,
        and the engine sends the same filter with every query. ``make()`` gives the filter's
        ``passes(slot)``, made only when the rows are not kept yet."""
        with self._lock:
            found = self._allowed.get(key)
        if found is None:
            found = np.fromiter(map(make(), self.slots.tolist()), dtype=np.bool_, count=len(self.slots))
            found.flags.writeable = False
            with self._lock:
                if len(self._allowed) >= _FILTERS_KEPT:
                    del self._allowed[next(iter(self._allowed))]
                self._allowed[key] = found
        return found

    def search(self, q: Floats, k: int, live: Mask | None, *, exact: bool = True) -> list[ShardHit]:
        """The best ``k`` rows among ``live`` for the unit query ``q``, as ``(score, slot)``,
        best first (ties: lower slot first). Scores are exact either way.

        Parameters
        ----------
        live : ndarray of bool, optional
            Per row, whether its document may be found: visible, and passing the filter
            (None: all may).
        exact : bool
            Score every row; else search the graph (exactly still when too few rows of
            ``live`` are among the neighbours it finds).
        """
        count = len(self.slots)
        visible = count if live is None else int(np.count_nonzero(live))
        if k <= 0 or visible == 0:
            return []
        k = min(k, visible)
        rows: npt.NDArray[np.intp] | None = None
        if not exact:
            rows = self._neighbours(q, k, live, visible)
        if rows is None:
            rows = np.flatnonzero(live) if live is not None else np.arange(count)
        # Scored from the checked rows, never from the graph's own copy of the vectors; many
        # rows at once in one pass over the matrix (cheaper than copying them out).
        if 6 * len(rows) > count:
            scores = _vector_math.score("cosine", self.matrix, q)[rows]
        else:
            scores = _vector_math.score("cosine", self.matrix[rows], q)
        top = np.argpartition(-scores, k - 1)[:k] if len(rows) > k else np.arange(len(rows))
        order = top[np.lexsort((rows[top], -scores[top]))]
        slots = self.slots
        return [(float(scores[i]), int(slots[rows[i]])) for i in order.tolist()]

    def _neighbours(self, q: Floats, k: int, live: Mask | None, visible: int) -> npt.NDArray[np.intp] | None:
        """The rows of ``live`` among the graph's nearest (and the rows it cannot reach); None
        when fewer than ``k`` (the caller then scores every row of ``live``)."""
        self.load_graph()
        count = len(self.slots)
        share = visible / count
        fetch = k if live is None else min(count, math.ceil(4 * k / share))
        ef = min(max(math.ceil(self.ef_search / share), fetch), count)
        with self._lock:
            graph = self._graph
            if ef != self.ef_search:
                graph.set_ef(ef)
            try:
                labels, _ = graph.knn_query(q.reshape(1, -1), k=fetch, num_threads=1)
            except RuntimeError:
                return None  # hnswlib reached fewer than `fetch` items
            finally:
                if ef != self.ef_search:
                    graph.set_ef(self.ef_search)
        rows = labels[0].astype(np.intp)
        if len(self._stray):
            rows = np.union1d(rows, self._stray)
        if live is not None:
            rows = rows[live[rows]]
        return rows if len(rows) >= k else None


def query_vector(vector: Sequence[float], dimension: int) -> Floats:
    """``vector`` as a shard searches with it: float32, unit length.

    Raises
    ------
    ValueError
        Another dimension than the shards', or NaN or infinity.
    """
    q = np.asarray(vector, dtype=np.float64)
    if q.ndim != 1 or len(q) != dimension:
        raise ValueError(
            f"the query vector has {len(q) if q.ndim == 1 else q.shape} dimensions; the published index's "
            f"vectors have {dimension}"
        )
    with np.errstate(over="ignore"):
        q32 = q.astype(np.float32)
    if not bool(np.isfinite(q32).all()):
        raise ValueError("the query vector contains NaN or infinity")
    prepared: Floats = _vector_math.prepare("cosine", q32.reshape(1, -1))[0]
    return prepared
