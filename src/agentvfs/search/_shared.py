"""A published index attached by URL: many agents search one index, each with its own changes.

``build_index`` publishes an index as immutable segments named in a manifest (``_bulk.py``).
A workspace attaches it read-only (``Workspace(search_index_url=...)``): the segments of the
newest manifest are fetched into a local cache by name (a name is the hash of the bytes, so
a cached segment never goes stale) and mapped into memory, and searches run over them
together with the workspace's own index, which holds only what this agent changed: files it
indexed or wrote since, and the removals it made.

A shared document is hidden once the local index has a document with its id, or of its source
file, or the file was removed locally (a tombstone); the statistics of a search count only the
documents not hidden, so scores are those of one index holding exactly what the agent sees.

With an embedder configured, segments that hold a vector shard of the same embedder are
searched by vector too (``_shards``): each shard's visible vectors, merged with the workspace's
vector store by score. A shard of another embedder is refused (its vectors mean nothing to this
one's queries); a segment without one is found by BM25 only.

A newer manifest is looked for at most every ``refresh_interval`` seconds, in a thread of its
own: searches keep using the segments they have until the new ones are fetched and mapped, then
switch at once.

Whoever can write the index's storage can write a manifest too, so none is trusted to work. A
manifest that cannot be used (unreadable, a segment missing, corrupt, larger than
``max_segment_bytes`` or than it says, other tokenizer options) is passed over with a warning
that names what is wrong, and the next older one is tried, among the newest
:data:`~agentvfs.search._bulk.MANIFESTS_KEPT`: a workspace attaches the newest manifest that
loads, and a refresh keeps the one in use when no newer one loads. A manifest found unusable is
not tried again by the same index (manifests are never rewritten: a build writes a new one).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SearchIndexError
from ._engine import CONTENT_HASH_KEY, store_metadata
from ._ids import relative_names, shared_path, source_of
from ._segments import Segment, check_postings
from ._shards import EF_SEARCH, EXACT_LIMIT, VectorShard, query_vector
from ._vector_filters import FilterNode, compile_filter, filter_keys, parse_filter

__all__ = ["SegmentSource", "SharedIndex"]

_log = logging.getLogger("agentvfs.search")


class SegmentSource:
    """A segment's postings and documents with some documents hidden (a `DocumentSource`).

    Immutable: :meth:`hidden` gives a new source, so a search that took a set of sources
    scores with one consistent mask and the counts that go with it, whatever is hidden
    while it runs.
    """

    def __init__(
        self,
        segment: Segment,
        *,
        shard: VectorShard | None = None,
        _lengths: npt.NDArray[np.float64] | None = None,
        _dead: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        if _lengths is None:
            check_postings(segment)
            _lengths = segment.lengths.astype(np.float64)
        self.segment = segment
        #: Its vector shard, when it has one of the workspace's embedder.
        self.shard = shard
        self._lengths = _lengths
        self._dead = _dead
        self._live_rows: npt.NDArray[np.bool_] | None = None
        if _dead is None:
            self.live_docs = segment.n_docs
            self.live_length = segment.total_len
        else:
            self.live_docs = segment.n_docs - int(_dead.sum())
            self.live_length = segment.total_len - int(segment.lengths[_dead].sum(dtype=np.int64))

    @property
    def size(self) -> int:
        return self.segment.n_docs

    def slot_lengths(self) -> npt.NDArray[np.float64]:
        return self._lengths

    def postings(self, term: int) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.integer]]:
        slots, tfs = self.segment.postings(term)
        dead = self._dead
        if dead is not None and len(slots):
            keep = ~dead[slots]
            if not keep.all():
                return slots[keep], tfs[keep]
        return slots, tfs

    def document(self, slot: int) -> tuple[str, str, dict[str, Any] | None, int | None]:
        return self.segment.document(slot)

    def hidden(self, ids: Iterable[str]) -> SegmentSource:
        """This source with the documents ``ids`` and every document of their source files
        hidden too (itself when none of them is here)."""
        segment = self.segment
        dead: npt.NDArray[np.bool_] | None = None
        for id in ids:
            ranges = [segment.slots_of_source(source) for source in {id, source_of(id)}]
            slot = segment.slot_of(id)
            if slot is not None:
                ranges.append(range(slot, slot + 1))
            for slots in ranges:
                if len(slots):
                    if dead is None:
                        dead = (
                            self._dead.copy()
                            if self._dead is not None
                            else np.zeros(segment.n_docs, dtype=np.bool_)
                        )
                    dead[slots.start : slots.stop] = True
        if dead is None:
            return self
        return SegmentSource(segment, shard=self.shard, _lengths=self._lengths, _dead=dead)

    def shown(self) -> SegmentSource:
        """This source with nothing hidden."""
        return SegmentSource(self.segment, shard=self.shard, _lengths=self._lengths)

    def is_hidden(self, slot: int) -> bool:
        return self._dead is not None and bool(self._dead[slot])

    def live_rows(self) -> npt.NDArray[np.bool_] | None:
        """Per row of its vector shard, whether the document is visible (None: all are)."""
        if self._dead is None or self.shard is None:
            return None
        if self._live_rows is None:
            self._live_rows = ~self._dead[self.shard.slots]
        return self._live_rows

    @property
    def live_vectors(self) -> int:
        """Visible documents with a vector."""
        if self.shard is None:
            return 0
        live = self.live_rows()
        return len(self.shard) if live is None else int(np.count_nonzero(live))


class SharedIndex:
    """The segments of a published index, fetched and kept current (see the module notes).

    Parameters
    ----------
    url : str
        The index's location (what ``build_index`` was given as ``index_url``).
    cache_dir : str
        Where fetched segments are kept (shared safely by several workspaces and processes:
        files are named by their hash and written atomically).
    tokenize : mapping
        The tokenizer options of the local index; segments built with others are refused.
    storage_options : mapping, optional
        For the storage of ``url`` (fsspec options).
    refresh_interval : float
        Seconds between looks for a newer manifest (0: at every search, in the background).
    cache_grace : float
        Cached segments no manifest in use names are deleted once unmodified this long
        (default a day).
    embedder : str, optional
        The id of the workspace's embedder (:func:`embedder_id`): segments with vectors of
        this embedder are searched by vector too, those with another's are refused. None:
        vectors are not searched.
    relative_ids : bool
        Vector hits and the metadata filters see are named without the leading ``/``
        (``docs/a.md``, chunks' ``source_file`` too), as the workspace names its own.
    exact_limit : int, optional
        With more visible vectors than this in all its shards together, the index is searched
        through each shard's hnswlib graph; else exactly (default 5,000, as the vector store).
    ef_search : int, optional
        hnswlib ``ef`` of those graph searches (default 128, as the vector store).
    max_segment_bytes : int, optional
        The largest segment fetched (default :data:`~agentvfs.search._bulk.MAX_SEGMENT_BYTES`,
        1 GiB): one its manifest names larger, or larger in storage than its manifest says, is
        refused unread.

    Attributes
    ----------
    last_error : SearchIndexError or None
        Why the newest manifest is not the one in use (None when it is).

    Raises
    ------
    SearchIndexError
        At `load`: no manifest, or none among the newest that loads (a segment missing,
        corrupt or too large, other tokenizer options, vectors of another embedder); the
        message names each manifest tried and what was wrong with it.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str,
        tokenize: Mapping[str, Any],
        storage_options: Mapping[str, Any] | None = None,
        refresh_interval: float = 30.0,
        cache_grace: float = 24 * 3600.0,
        embedder: str | None = None,
        exact_limit: int | None = None,
        relative_ids: bool = False,
        ef_search: int | None = None,
        max_segment_bytes: int | None = None,
    ) -> None:
        from ._bulk import MAX_SEGMENT_BYTES

        self.url = url
        self.max_segment_bytes = MAX_SEGMENT_BYTES if max_segment_bytes is None else max_segment_bytes
        self.ef_search = EF_SEARCH if ef_search is None else ef_search
        self.embedder = embedder
        self.relative_ids = relative_ids
        self.exact_limit = EXACT_LIMIT if exact_limit is None else exact_limit
        self.cache_grace = cache_grace
        self.cache_dir = cache_dir
        self._tokenize = dict(tokenize)
        self._storage_options = dict(storage_options or {})
        self.refresh_interval = refresh_interval
        self._sources: tuple[SegmentSource, ...] = ()
        self._manifest: Any = None
        self._records: tuple[Any, dict[str, Any]] = (None, {})
        self._hidden: set[str] = set()
        self._resets = 0  # bumped by reset(): a load in flight then hides from scratch
        self._lock = threading.Lock()  # guards _hidden, _resets and the swap of _sources
        self._refreshing = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._checked = 0.0
        self.last_error: BaseException | None = None
        #: Manifests found unusable, by number, and why (not tried again).
        self._broken: dict[int, SearchIndexError] = {}

    # -- loading ----------------------------------------------------------------------------------

    def load(self) -> None:
        """Use the newest manifest whose segments all load (see the module notes); keep the
        one in use when none newer does.

        Raises
        ------
        SearchIndexError
            Nothing is in use yet and no manifest loads (the message names each one tried
            and what was wrong with it), or the index has none.
        """
        from ._bulk import manifests_newest_first

        current = self._manifest
        in_use = None if current is None else _manifest_number(current)
        tried: list[SearchIndexError] = []
        # Only those newer than the manifest in use: when none of them loads, it stays.
        for number, found in manifests_newest_first(self.url, self._storage_options, newer_than=in_use):
            broken = self._broken.get(number)
            if broken is None:
                if isinstance(found, SearchIndexError):
                    broken = found
                else:
                    try:
                        sources = self._open(found)
                    except SearchIndexError as exc:
                        broken = exc
                    else:
                        self._use(found, sources)
                        self.last_error = tried[0] if tried else None
                        if tried:
                            _log.warning("search index %s: using manifest %d, the newest that loads", self.url, number)
                        return
                self._broken[number] = broken
                _log.warning("search index %s: manifest %d cannot be used, an older one is tried: %s", self.url, number, broken)
            tried.append(broken)
        self._checked = time.monotonic()
        if current is not None:
            self.last_error = tried[0] if tried else None
            return
        if not tried:
            raise SearchIndexError(
                f"index {self.url} has no manifest; build it with: agentvfs index SOURCE --out {self.url}"
            )
        raise SearchIndexError(
            f"index {self.url} has no manifest that can be used among the newest {len(tried)}: "
            + "; ".join(str(error) for error in tried)
        )

    def _open(self, manifest: Any) -> list[SegmentSource]:
        """The checked sources of a manifest's segments, fetched into the cache.

        Raises
        ------
        SearchIndexError
            A segment missing, corrupt, too large or of other tokenizer options, vectors of
            another embedder or of several dimensions.
        """
        from ._bulk import fetch_segment

        os.makedirs(self.cache_dir, exist_ok=True)
        sources = []
        for ref in manifest.segments:
            segment = fetch_segment(
                self.url, ref, self.cache_dir, storage_options=self._storage_options,
                max_bytes=self.max_segment_bytes,
            )  # fmt: skip
            differences = _differences(segment.tokenize, self._tokenize)
            if differences:
                raise SearchIndexError(
                    f"segment {segment.name} of the index {self.url} was built with other "
                    f"tokenizer options ({'; '.join(differences)}); attach it to a workspace "
                    "with the same bm25 tokenize options, or rebuild it with these"
                )
            sources.append(SegmentSource(segment, shard=self._shard(segment)))
        shards = [source.shard for source in sources if source.shard is not None and len(source.shard)]
        dimensions = {shard.dimension for shard in shards}
        if len(dimensions) > 1:
            raise SearchIndexError(
                f"the segments of the index {self.url} hold vectors of different dimensions "
                f"({', '.join(map(str, sorted(dimensions)))}) from one embedder; rebuild the index"
            )
        if sum(map(len, shards)) > self.exact_limit:
            # Searched through their graphs: checked and loaded here, not at a search.
            for shard in shards:
                shard.load_graph()
        return sources

    def _use(self, manifest: Any, fresh: list[SegmentSource]) -> None:
        """Switch searches to ``manifest``'s segments, with what is hidden now hidden."""
        with self._lock:
            hidden, resets = set(self._hidden), self._resets
        sources = [source.hidden(hidden) for source in fresh]
        with self._lock:
            # Ids hidden while the segments were fetched are hidden now, before the swap; after
            # a reset in the meantime, only what is hidden now.
            if self._resets != resets:
                sources, hidden = fresh, set()
            late = self._hidden - hidden
            self._sources = tuple(source.hidden(late) for source in sources)
            self._manifest = manifest
        self._checked = time.monotonic()
        self._prune_cache({source.segment.name for source in sources})

    def _shard(self, segment: Segment) -> VectorShard | None:
        """The segment's vector shard, checked, when it has one and this index searches
        vectors."""
        info = segment.vector_info
        if self.embedder is None or info is None:
            return None
        if info["embedder"] != self.embedder:
            raise SearchIndexError(
                f"segment {segment.name} of the index {self.url} holds vectors of the embedder "
                f"{info['embedder']!r}, and this workspace embeds with {self.embedder!r}: its queries "
                "would be compared with vectors of another model. Attach it with that embedder, or "
                "rebuild the index with this one (build_index(..., embedder=...))"
            )
        return VectorShard(segment, ef_search=self.ef_search)

    def _prune_cache(self, keep: set[str]) -> None:
        """Delete cached segments of other manifests not used for ``cache_grace`` seconds.

        The cache may be shared by other workspaces and processes: one still searching an
        older manifest keeps its mapping (an unlinked file stays readable to who has it
        mapped), and one opening it anew fetches it again.
        """
        cutoff = time.time() - self.cache_grace
        try:
            names = os.listdir(self.cache_dir)
        except OSError:
            return
        for name in names:
            if not name.endswith(".seg") or name.removesuffix(".seg") in keep:
                continue
            path = os.path.join(self.cache_dir, name)
            with contextlib.suppress(OSError):
                if os.stat(path, follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(path)

    def maybe_refresh(self) -> None:
        """Look for a newer manifest in the background when ``refresh_interval`` has passed."""
        if self._closed or self._refreshing or time.monotonic() - self._checked < self.refresh_interval:
            return
        self._refreshing = True
        thread = threading.Thread(target=self._refresh, name="agentvfs-index-refresh", daemon=True)
        self._thread = thread
        thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Start no more refreshes, and wait up to ``timeout`` seconds for one under way (a
        workspace's ``destroy()`` does not leave it fetching behind its back)."""
        self._closed = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _refresh(self) -> None:
        try:
            self.load()
        except Exception as exc:
            # Keep answering from the segments in use; say why the newer ones are not used.
            self.last_error = exc
            self._checked = time.monotonic()
            _log.warning("search index %s: keeping the segments in use: %s", self.url, exc)
        finally:
            self._refreshing = False

    # -- local changes ------------------------------------------------------------------------------

    def hide(self, ids: Iterable[str]) -> None:
        """Hide the shared documents ``ids`` and all documents of their source files (the
        local index has them now, or they were removed locally); ids in a workspace's form
        (``docs/a.md``) name the published ``/docs/a.md``."""
        wanted = [key for key in {shared_path(id) for id in ids} if key not in self._hidden]
        if not wanted:
            return
        with self._lock:
            self._hidden.update(wanted)
            self._sources = tuple(source.hidden(wanted) for source in self._sources)

    def reset(self) -> None:
        """Show every shared document again (the local index was cleared)."""
        with self._lock:
            self._hidden.clear()
            self._resets += 1
            self._sources = tuple(source.shown() for source in self._sources)

    # -- reading ------------------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[SegmentSource, ...]:
        """The segments in use, with the hidden documents left out."""
        return self._sources

    @property
    def has_vectors(self) -> bool:
        """Whether a segment in use has a vector shard of the embedder."""
        return any(source.shard is not None for source in self._sources)

    def vector_search(
        self, vector: Sequence[float], top_k: int, filter: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The ``top_k`` visible shared documents nearest to ``vector``, as a vector store's
        ``query`` answers: ``{"id", "score", "metadata"}`` with the store's metadata (id,
        text, the document's metadata, content hash, start line), best first.

        Raises
        ------
        ValueError
            A bad filter, or a query vector of another dimension than the shards'.
        """
        sources = self._sources  # one set of segments for the whole search
        searched = [(i, source) for i, source in enumerate(sources) if source.shard is not None and len(source.shard)]
        if not searched or top_k < 1:
            return []
        node = parse_filter(filter) if filter is not None else None
        q = query_vector(vector, searched[0][1].shard.dimension)  # type: ignore[union-attr]
        # As one store of them all: exact up to exact_limit visible vectors, else the graphs.
        exact = sum(source.live_vectors for _, source in searched) <= self.exact_limit
        found: list[tuple[float, int, int]] = []
        for i, source in searched:
            shard = source.shard
            assert shard is not None
            live = source.live_rows()
            if node is not None:
                key = (repr(node), self.relative_ids)
                allowed = shard.allowed(key, functools.partial(_filter_of, source, node, self.relative_ids))
                live = allowed if live is None else live & allowed
            hits = shard.search(q, top_k, live, exact=exact)
            found.extend((-score, i, slot) for score, slot in hits)
        found.sort()
        out = []
        for negative, i, slot in found[:top_k]:
            # Named as published ("/docs/a.md"), as BM25 hits are: hybrid search fuses the two
            # by id, and the workspace renames both alike afterwards.
            meta = _item_metadata(sources[i], slot, relative=False)
            out.append({"id": meta["id"], "score": -negative, "metadata": meta})
        return out

    @property
    def manifest(self) -> Any:
        """The manifest in use (None before `load`)."""
        return self._manifest

    def records(self) -> dict[str, Any]:
        """Each shared source file's record (size, mtime, ETag, digest, chunks), by its path
        in the index (``/`` first, see :func:`shared_path`)."""
        with self._lock:
            manifest, sources = self._manifest, self._sources
        made_for, found = self._records
        if made_for is not manifest:
            # Made once per manifest: a write through the tools asks it of every path.
            found = {}
            for source in sources:
                found.update(source.segment.sources())
            self._records = (manifest, found)
        return found

    def describe(self) -> dict[str, Any]:
        """What is attached: the URL, manifest number, segments and live documents."""
        return {
            "url": self.url,
            "manifest": _manifest_number(self._manifest) if self._manifest is not None else None,
            "segments": len(self._sources),
            "documents": sum(source.live_docs for source in self._sources),
            "vectors": sum(source.live_vectors for source in self._sources),
            "hidden": len(self._hidden),
        }


def _item_metadata(source: SegmentSource, slot: int, *, relative: bool, text: bool = True) -> dict[str, Any]:
    """A shared document's metadata as the vector store keeps its items' (what filters test
    and hits carry), named as the workspace names files when ``relative``; without ``text``
    (and the content hash) when a filter does not look at them, which spares expanding it."""
    segment = source.segment
    content: str | None
    if text:
        id, content, metadata, start = segment.document(slot)
    else:
        id, content, metadata, start = segment.doc_id(slot), None, segment.metadata(slot), segment.start_line(slot)
    if relative:
        id, metadata = relative_names(id, metadata)
    return store_metadata(id, content, metadata, start)


def _filter_of(source: SegmentSource, node: FilterNode, relative: bool) -> Callable[[int], bool]:
    """``passes(slot)``: whether a document of ``source`` passes the filter ``node``."""
    passes = compile_filter(node)
    text = not {"text", CONTENT_HASH_KEY}.isdisjoint(filter_keys(node))

    def accept(slot: int) -> bool:
        return bool(passes(_item_metadata(source, slot, relative=relative, text=text)))

    return accept


def _manifest_number(manifest: Any) -> Any:
    return getattr(manifest, "number", None)


def _differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    return [
        f"{key}: {recorded.get(key)!r} in the index, {wanted.get(key)!r} here"
        for key in sorted(set(recorded) | set(wanted))
        if recorded.get(key) != wanted.get(key)
    ]
