"""The search engine: BM25 and vectors behind one ``index``/``search``, with the reference's
modes, fallbacks and hybrid fusion (§15.4), plus an embedding cache.

BM25 lives in DuckDB (``BM25Index``) and answers synchronously; vectors go through any object
with the vector-store interface. Hybrid search runs both, min-max normalises the BM25 scores
and mixes them with the vector scores by ``vector_weight`` (the reference's fusion, default);
``fusion="minmax"`` normalises both lists, ``fusion="rrf"`` uses reciprocal ranks (k = 60).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.to_thread

from ..errors import EmbeddingError
from ._bm25 import BM25Hit, BM25Index
from ._embedders import embed_texts, embedder_id
from ._tokenize import line_finder, make_tokenizer

if TYPE_CHECKING:
    from ._shared import SegmentSource, SharedIndex

__all__ = [
    "Document",
    "EmbeddingCache",
    "Fusion",
    "SearchEngine",
    "SearchMode",
    "SearchResult",
    "store_metadata",
]

_log = logging.getLogger("agentvfs.search")

SearchMode = Literal["bm25", "vector", "hybrid"]
Fusion = Literal["linear", "minmax", "rrf"]

#: Reciprocal-rank constant of ``fusion="rrf"`` (the common default).
RRF_K = 60
#: Id prefix of request-scoped skill documents (never returned by workspace search).
SCOPED_PREFIX = "skill-scope:"
#: Vectors per upsert call.
UPSERT_GROUP = 100
#: Metadata key recording where a chunk starts in its file (stripped from results).
START_LINE_KEY = "_start_line_offset"
#: Metadata key recording the content hash of an embedded document (stripped from results).
CONTENT_HASH_KEY = "_content_hash"
_HIDDEN = frozenset({"id", "text", START_LINE_KEY, CONTENT_HASH_KEY})


class EmbeddingCache(Protocol):
    """Vectors kept by content digest and model, so unchanged text is never embedded twice."""

    def get_embeddings(self, model: str, digests: Sequence[str]) -> dict[str, list[float]]: ...

    def put_embeddings(self, model: str, vectors: Mapping[str, Sequence[float]]) -> None: ...


@dataclass(frozen=True)
class SearchResult:
    """One search hit.

    Attributes
    ----------
    id : str
        The document id (a path, or ``path#chunk-N`` for a chunk of a long file).
    content : str
        The document's text.
    score : float
        BM25 score, cosine similarity, or the fused score, by mode.
    line_range : tuple of int or None
        First and last 1-based line containing a query term, in the file's numbering.
    metadata : dict or None
        The document's metadata.
    score_details : dict
        The scores that went into ``score`` (``bm25``, ``vector``).
    """

    id: str
    content: str
    score: float
    line_range: tuple[int, int] | None = None
    metadata: dict[str, Any] | None = None
    score_details: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Document:
    """A document to index."""

    id: str
    content: str
    metadata: Mapping[str, Any] | None = None
    start_line_offset: int | None = None


def _content_hash(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


def store_metadata(
    id: str, content: str | None, metadata: Mapping[str, Any] | None, start_line_offset: int | None
) -> dict[str, Any]:
    """A document's metadata as the vector store keeps it (and as filters see it): its id,
    text, own metadata, content hash and, for a chunk, the line it starts at. Without
    ``content`` (None), without the text and its hash: all a filter that names neither needs."""
    meta: dict[str, Any] = {"id": id}
    if content is not None:
        meta["text"] = content
    meta.update(metadata or {})
    if content is not None:
        meta[CONTENT_HASH_KEY] = _content_hash(content)
    if start_line_offset is not None:
        meta[START_LINE_KEY] = start_line_offset
    return meta


class SearchEngine:
    """BM25 and vector search over one set of documents.

    Parameters
    ----------
    bm25 : BM25Index, optional
        The keyword index (None: no BM25).
    vector_store : object, optional
        A vector store (``create_index``, ``upsert``, ``query``, ``delete_vector``,
        ``delete_vectors``); needs ``embedder``.
    embedder : callable, optional
        ``fn(text) -> vector`` (sync or async) or a batch function (``fn.batch = True``).
    index_name : str, optional
        The vector index to use.
    fusion : {"linear", "minmax", "rrf"}
        How hybrid search mixes the two result lists (see the module documentation).
    shared : SharedIndex, optional
        A published index: BM25 searches run over its segments and ``bm25`` together (vector
        searches over its vector shards and the vector store together, when it has shards of
        this embedder), and whatever ``bm25`` indexes or removes hides the shared documents of
        the same ids and source files.
    """

    def __init__(
        self,
        *,
        bm25: BM25Index | None = None,
        vector_store: Any = None,
        embedder: Callable[..., Any] | None = None,
        index_name: str | None = None,
        fusion: Fusion = "linear",
        cache: EmbeddingCache | None = None,
        shared: SharedIndex | None = None,
    ) -> None:
        if vector_store is not None and embedder is None:
            raise ValueError("vector_store requires an embedder")
        if fusion not in ("linear", "minmax", "rrf"):
            raise ValueError(f"fusion must be 'linear', 'minmax' or 'rrf', got {fusion!r}")
        self.bm25 = bm25
        self.vector_store = vector_store
        self.embedder = embedder
        self.index_name = index_name or "workspace_search"
        self.fusion: Fusion = fusion
        self._tokenize = bm25.tokenize if bm25 is not None else make_tokenizer(None)
        self._index_ready = False
        self._dimension: int | None = None
        self._vector_ids: set[str] = set()
        self._lock = anyio.Lock()
        self._cache = cache
        # A published index searched with ``bm25``, which then holds this agent's changes.
        self.shared = shared
        # Ids of request-scoped skill documents, counted at every search: kept here rather
        # than listing every id per query.
        self._scoped: set[str] | None = None
        self.model_id = embedder_id(embedder) if embedder is not None else None

    # -- capabilities --------------------------------------------------------------------------------

    @property
    def can_bm25(self) -> bool:
        return self.bm25 is not None

    @property
    def can_vector(self) -> bool:
        return self.vector_store is not None and self.embedder is not None

    @property
    def can_hybrid(self) -> bool:
        return self.can_bm25 and self.can_vector

    def scoped_count(self, prefix: str = SCOPED_PREFIX) -> int:
        """How many documents have ids starting with ``skill-scope:``."""
        if self._scoped is None:
            self._scoped = {i for i in self.ids() if i.startswith(prefix)}
        return len(self._scoped)

    def _note_ids(self, added: Iterable[str] = (), removed: Iterable[str] = ()) -> None:
        if self._scoped is None:
            return
        self._scoped.update(i for i in added if i.startswith(SCOPED_PREFIX))
        self._scoped.difference_update(removed)

    def ids(self) -> list[str]:
        """Ids of the documents indexed (BM25's, else the vectors written by this engine)."""
        if self.bm25 is not None:
            return self.bm25.ids()
        return sorted(self._vector_ids)

    # -- indexing ------------------------------------------------------------------------------------

    async def index(self, doc: Document) -> None:
        """Index one document (replacing one with the same id).

        Raises
        ------
        EmbeddingError
            The embedder failed or returned an unusable vector (BM25 has the document).
        """
        await self.index_many([doc])

    async def index_many(
        self,
        docs: Sequence[Document],
        *,
        stop_on_error: bool = True,
        replace_sources: Sequence[str] = (),
    ) -> dict[str, str]:
        """Index ``docs``: BM25 in one transaction, then vectors in batches.

        ``replace_sources`` are removed first, each with its chunks (as `remove_source`); for
        BM25 in the same transaction as the additions.

        Returns the documents whose vectors failed (id -> why) when ``stop_on_error`` is
        False; raises :class:`EmbeddingError` naming them otherwise. BM25 holds every
        document either way.
        """
        for doc in docs:
            if not isinstance(doc.content, str):
                raise TypeError(
                    f"content of {doc.id!r} must be str, not {type(doc.content).__name__}"
                )
        if not docs:
            await self.remove_sources(replace_sources)
            return {}
        if replace_sources:
            await self._remove_vectors_of(replace_sources)
        if self.bm25 is not None:
            bm25 = self.bm25
            rows = [(d.id, d.content, dict(d.metadata or {}), d.start_line_offset) for d in docs]
            await anyio.to_thread.run_sync(
                lambda: bm25.add_many(rows, replace_sources=replace_sources)
            )
        if self.shared is not None:
            self.shared.hide([*replace_sources, *(d.id for d in docs)])
        self._note_ids(added=[d.id for d in docs])
        if not self.can_vector:
            return {}
        failures = await self._embed_and_upsert(docs)
        if failures and stop_on_error:
            listed = "; ".join(f"{why}" for why in list(failures.values())[:5])
            more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
            raise EmbeddingError(
                f"Embedding failed for {len(failures)} of {len(docs)} documents: {listed}{more}",
                {i: why for i, why in enumerate(failures.values())},
            )
        return failures

    async def _embed_and_upsert(self, docs: Sequence[Document]) -> dict[str, str]:
        assert self.embedder is not None
        assert self.model_id is not None
        model = self.model_id
        digests = [_content_hash(d.content) for d in docs]
        cache = self._cache
        known: dict[str, list[float]] = {}
        if cache is not None:
            known = await anyio.to_thread.run_sync(lambda: cache.get_embeddings(model, digests))
        missing = [i for i, digest in enumerate(digests) if digest not in known]
        fresh, failed = await embed_texts(
            self.embedder,
            [docs[i].content for i in missing],
            dimension=self._dimension or _dimension_of(known),
            names=[docs[i].id for i in missing],
        )
        failures = {docs[missing[j]].id: why for j, why in failed.items()}
        new: dict[str, list[float]] = {}
        for j, vector in enumerate(fresh):
            if vector is not None:
                new[digests[missing[j]]] = vector
        if cache is not None and new:
            await anyio.to_thread.run_sync(lambda: cache.put_embeddings(model, new))
        known.update(new)
        vectors = [known.get(digest) for digest in digests]
        ready = [(d, v) for d, v in zip(docs, vectors, strict=True) if v is not None]
        for start in range(0, len(ready), UPSERT_GROUP):
            group = ready[start : start + UPSERT_GROUP]
            await self._upsert([d for d, _ in group], [v for _, v in group])
        return failures

    async def _upsert(self, docs: Sequence[Document], vectors: Sequence[Sequence[float]]) -> None:
        store = self.vector_store
        metadata = [store_metadata(d.id, d.content, d.metadata, d.start_line_offset) for d in docs]
        ids = [d.id for d in docs]
        async with self._lock:
            if not self._index_ready:
                # As the reference: create the index before the first upsert (errors ignored;
                # an existing index is fine) until an upsert has succeeded.
                try:
                    await store.create_index(self.index_name, len(vectors[0]))
                except Exception as exc:
                    _log.debug("create_index(%s) failed: %s", self.index_name, exc)
            await store.upsert(self.index_name, [list(v) for v in vectors], metadata, ids)
            self._index_ready = True
            self._dimension = len(vectors[0])
        self._vector_ids.update(ids)

    async def remove(self, id: str) -> None:
        """Remove one document from BM25 and the vector store."""
        if self.bm25 is not None:
            bm25 = self.bm25
            await anyio.to_thread.run_sync(bm25.remove, id)
        if self.can_vector:
            try:
                await self.vector_store.delete_vector(self.index_name, id)
            except Exception as exc:
                _log.debug("delete_vector(%s) failed: %s", id, exc)
        self._vector_ids.discard(id)
        self._note_ids(removed=[id])
        if self.shared is not None:
            self.shared.hide([id])

    async def remove_source(self, source: str) -> None:
        """Remove a file's document and its chunks (``source#chunk-N``)."""
        await self.remove_sources([source])

    async def remove_sources(self, sources: Sequence[str]) -> None:
        """Remove files' documents and their chunks; BM25 in one transaction."""
        if not sources:
            return
        if self.bm25 is not None:
            bm25 = self.bm25
            await anyio.to_thread.run_sync(lambda: bm25.remove_sources(sources))
        await self._remove_vectors_of(sources)
        if self.shared is not None:
            self.shared.hide(sources)

    async def _remove_vectors_of(self, sources: Sequence[str]) -> None:
        if self.can_vector:
            for source in sources:
                try:
                    await self.vector_store.delete_vector(self.index_name, source)
                except Exception as exc:
                    _log.debug("delete_vector(%s) failed: %s", source, exc)
                try:
                    await self.vector_store.delete_vectors(self.index_name, {"source_file": source})
                except Exception as exc:
                    _log.debug("delete_vectors(source_file=%s) failed: %s", source, exc)
        gone = set(sources)
        prefixes = tuple(source + "#chunk-" for source in sources)
        self._vector_ids = {
            i for i in self._vector_ids if i not in gone and not i.startswith(prefixes)
        }
        if self._scoped is not None:
            self._scoped = {i for i in self._scoped if i not in gone and not i.startswith(prefixes)}

    async def clear(self) -> None:
        """Empty BM25 and forget the ids (the vector store is shared and left intact)."""
        if self.bm25 is not None:
            bm25 = self.bm25
            await anyio.to_thread.run_sync(bm25.clear)
        self._vector_ids.clear()
        self._scoped = set()
        if self.shared is not None:
            self.shared.reset()  # nothing is changed locally any more

    # -- searching -----------------------------------------------------------------------------------

    def resolve_mode(self, mode: str | None) -> SearchMode:
        """The mode a search runs in.

        Raises
        ------
        ValueError
            The requested mode is not configured (the reference's message), or unknown.
        """
        if mode is None:
            if self.can_hybrid:
                return "hybrid"
            if self.can_vector:
                return "vector"
            return "bm25"
        if mode == "vector" and not self.can_vector:
            raise ValueError("Vector search requires vector configuration.")
        if mode == "bm25" and not self.can_bm25:
            raise ValueError("BM25 search requires BM25 configuration.")
        if mode == "hybrid" and not self.can_hybrid:
            raise ValueError("Hybrid search requires both vector and BM25 configuration.")
        if mode not in ("bm25", "vector", "hybrid"):
            raise ValueError(f"Unknown search mode {mode!r}: expected 'bm25', 'vector' or 'hybrid'")
        return mode  # type: ignore[return-value]

    async def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        mode: str | None = None,
        min_score: float | None = None,
        vector_weight: float = 0.5,
        filter: Mapping[str, Any] | None = None,
    ) -> list[SearchResult]:
        """Search; see the module documentation for the modes.

        Raises
        ------
        ValueError
            Bad arguments (``top_k`` < 1, a weight outside [0, 1]) or an unavailable mode.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be str, not {type(query).__name__}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        if not 0.0 <= float(vector_weight) <= 1.0:
            raise ValueError(f"vector_weight must be between 0 and 1, got {vector_weight!r}")
        if min_score is not None and not math.isfinite(float(min_score)):
            raise ValueError(f"min_score must be a finite number, got {min_score!r}")
        resolved = self.resolve_mode(mode)
        if resolved == "bm25":
            hits = await self._bm25(query, top_k, min_score or 0.0)
            return [self._from_bm25(hit) for hit in hits]
        if resolved == "vector":
            return await self._vector(query, top_k, min_score, filter)
        return await self._hybrid(query, top_k, min_score, float(vector_weight), filter)

    async def _bm25(self, query: str, top_k: int, min_score: float) -> list[BM25Hit]:
        bm25 = self.bm25
        assert bm25 is not None
        before: Sequence[SegmentSource] = ()
        if self.shared is not None:
            self.shared.maybe_refresh()
            before = self.shared.sources  # one set of segments for the whole search
        return await anyio.to_thread.run_sync(
            lambda: bm25.search(query, top_k=top_k, min_score=min_score, before=before)
        )

    @staticmethod
    def _from_bm25(hit: BM25Hit) -> SearchResult:
        return SearchResult(
            id=hit.id,
            content=hit.content,
            score=hit.score,
            line_range=hit.line_range,
            metadata=hit.metadata,
            score_details={"bm25": hit.score},
        )

    async def _embed_query(self, query: str) -> list[float]:
        assert self.embedder is not None
        vectors, failed = await embed_texts(
            self.embedder, [query], dimension=self._dimension, names=["the query"]
        )
        if failed or vectors[0] is None:
            raise EmbeddingError(f"Embedding the query failed: {failed.get(0, 'no vector')}")
        return vectors[0]

    async def _vector(
        self, query: str, top_k: int, min_score: float | None, filter: Mapping[str, Any] | None
    ) -> list[SearchResult]:
        vector = await self._embed_query(query)
        raw: list[dict[str, Any]] = []
        published: list[dict[str, Any]] = []

        async def own() -> None:
            nonlocal raw
            try:
                raw = list(await self.vector_store.query(self.index_name, vector, top_k, filter))
            except Exception as exc:
                if self._index_ready or not _looks_missing(exc):
                    raise
                # Nothing was ever indexed in this store.

        async def shared_part(shared: SharedIndex) -> None:
            nonlocal published
            shared.maybe_refresh()
            published = await anyio.to_thread.run_sync(lambda: shared.vector_search(vector, top_k, filter))

        shared = self.shared
        if shared is not None and shared.has_vectors:
            await _together(own, functools.partial(shared_part, shared))
            # One ranking of both, as one store would rank them (ties: the agent's own first).
            raw = sorted([*raw, *published], key=lambda item: -float(item["score"]))[:top_k]
        else:
            await own()
        tokens = self._tokenize(query)
        lines = line_finder(tokens, self._tokenize)
        results: list[SearchResult] = []
        for item in raw:
            score = float(item["score"])
            if min_score is not None and score < min_score:
                continue
            meta = dict(item.get("metadata") or {})
            doc_id = str(meta.get("id") or item["id"])
            content = str(meta.get("text") or "")
            offset = meta.get(START_LINE_KEY)
            span = lines(content)
            if span is not None and isinstance(offset, int):
                span = (span[0] + offset - 1, span[1] + offset - 1)
            visible = {k: v for k, v in meta.items() if k not in _HIDDEN}
            results.append(
                SearchResult(
                    id=doc_id,
                    content=content,
                    score=score,
                    line_range=span,
                    metadata=visible,
                    score_details={"vector": score},
                )
            )
        return results

    async def _hybrid(
        self,
        query: str,
        top_k: int,
        min_score: float | None,
        weight: float,
        filter: Mapping[str, Any] | None,
    ) -> list[SearchResult]:
        k = min(top_k * 2, 50)
        vector_hits: list[SearchResult] = []
        bm25_hits: list[BM25Hit] = []

        async def run_vector() -> None:
            nonlocal vector_hits
            vector_hits = await self._vector(query, k, None, filter)

        async def run_bm25() -> None:
            nonlocal bm25_hits
            bm25_hits = await self._bm25(query, k, 0.0)

        await _together(run_vector, run_bm25)
        combined = self._fuse(vector_hits, bm25_hits, weight)
        ranked = sorted(combined, key=lambda r: r.score, reverse=True)  # stable: ties keep order
        if min_score is not None:
            ranked = [r for r in ranked if r.score >= min_score]
        return ranked[:top_k]

    def _fuse(
        self, vectors: list[SearchResult], bm25: list[BM25Hit], weight: float
    ) -> list[SearchResult]:
        vector_scores = {r.id: r.score for r in vectors}
        bm25_scores = {h.id: h.score for h in bm25}
        if self.fusion == "rrf":
            v_part = {r.id: 1.0 / (RRF_K + rank) for rank, r in enumerate(vectors, 1)}
            b_part = {h.id: 1.0 / (RRF_K + rank) for rank, h in enumerate(bm25, 1)}
        else:
            b_part = _minmax(bm25_scores)
            v_part = _minmax(vector_scores) if self.fusion == "minmax" else vector_scores
        by_id: dict[str, SearchResult] = {}
        order: list[str] = []
        for r in vectors:
            if r.id not in by_id:
                by_id[r.id] = r
                order.append(r.id)
        bm25_by_id = {h.id: h for h in bm25}
        for h in bm25:
            if h.id not in by_id:
                by_id[h.id] = self._from_bm25(h)
                order.append(h.id)
        out: list[SearchResult] = []
        for id in order:
            base = by_id[id]
            hit = bm25_by_id.get(id)
            score = weight * v_part.get(id, 0.0) + (1.0 - weight) * b_part.get(id, 0.0)
            details: dict[str, float] = {}
            if id in vector_scores:
                details["vector"] = vector_scores[id]
            if id in bm25_scores:
                details["bm25"] = bm25_scores[id]
            out.append(
                SearchResult(
                    id=id,
                    content=base.content,
                    score=score,
                    line_range=hit.line_range if hit is not None else base.line_range,
                    metadata=base.metadata,
                    score_details=details,
                )
            )
        return out

    async def close(self) -> None:
        """Release the BM25 index and the published one (the vector store is the caller's)."""
        shared = self.shared
        if shared is not None:
            await anyio.to_thread.run_sync(shared.close)
        if self.bm25 is not None:
            bm25 = self.bm25
            await anyio.to_thread.run_sync(bm25.close)


async def _together(*calls: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` at once; one that fails fails the whole as its own exception (the first,
    when several do), not as a group: callers expect the search's ``ValueError`` itself."""
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(call)
    except BaseExceptionGroup as group:
        error = group
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
    if error is not None:
        raise error  # (outside the handler: its context stays its own)


def _dimension_of(vectors: Mapping[str, Sequence[float]]) -> int | None:
    for vector in vectors.values():
        return len(vector)
    return None


def _minmax(scores: Mapping[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return dict.fromkeys(scores, 1.0)
    return {k: (v - low) / (high - low) for k, v in scores.items()}


def _looks_missing(exc: BaseException) -> bool:
    text = str(exc).lower()
    return (
        "not found" in text
        or "does not exist" in text
        or "no such index" in text
        or "unknown index" in text
    )

