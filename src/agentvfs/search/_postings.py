"""The postings of a BM25 index in memory.

Term-sorted arrays loaded from the index file, plus a delta of recent writes; removed
documents are marked dead, and the arrays are re-sorted (compacted) as the delta grows, at an
amortised constant cost per write. Searches score from these arrays without touching DuckDB.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

__all__ = ["PostingCache"]


#: Numbers for the states of postings in memory: each change takes a new one, so what was
#: derived from one state (per-term scores kept between queries) is known stale.
_GENERATIONS = itertools.count()

#: The in-memory postings are re-sorted once the recent adds and removals reach this many
#: postings, or half the sorted ones, whichever is more (amortised constant cost per write).
_COMPACT_MIN_POSTINGS = 200_000


class _Buffer:
    """A growable 1-d array (amortised O(1) append)."""

    __slots__ = ("data", "size")

    def __init__(self, data: npt.NDArray[Any]) -> None:
        self.data = data
        self.size = len(data)

    def view(self) -> npt.NDArray[Any]:
        return self.data[: self.size]

    def append(self, values: npt.NDArray[Any] | Sequence[Any]) -> None:
        count = len(values)
        if self.size + count > len(self.data):
            grown = np.zeros(max(2 * len(self.data), self.size + count, 1024), self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : self.size + count] = values
        self.size += count


def _slots_of(slot_doc: npt.NDArray[np.int64], docs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each of ``docs`` is in the ascending ``slot_doc``, or a slot whose number differs
    (``len(slot_doc)`` or another) where it is not there: by a table of the numbers' range
    when they are dense enough, a bisection per posting otherwise (3x slower at millions)."""
    if not len(slot_doc):
        return np.zeros(len(docs), dtype=np.int64)
    first, span = int(slot_doc[0]), int(slot_doc[-1]) - int(slot_doc[0]) + 1
    if span > 4 * len(slot_doc) + 4096:
        return np.searchsorted(slot_doc, docs).astype(np.int64)
    table = np.full(span, len(slot_doc), dtype=np.int64)
    table[slot_doc - first] = np.arange(len(slot_doc), dtype=np.int64)
    return table[np.clip(docs - first, 0, span - 1)]


class PostingCache:
    """The postings of one index in memory: term-sorted arrays plus a delta of recent adds.

    Documents are numbered by *slots* in insertion order (slot order = ``doc`` order), so the
    per-query arrays stay as small as the number of documents, not of ``doc`` numbers ever used.
    Removed documents are only marked dead; their postings go at the next compaction.
    """

    def __init__(
        self,
        version: int,
        terms: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        tfs: npt.NDArray[np.int32],
        slot_doc: npt.NDArray[np.int64],
        slot_len: npt.NDArray[np.int64],
    ) -> None:
        self._set_main(terms, slots, tfs)
        self._set_documents(version, slot_doc, slot_len)

    def _set_documents(
        self, version: int, slot_doc: npt.NDArray[np.int64], slot_len: npt.NDArray[np.integer]
    ) -> None:
        """The documents by slot, all alive, and no delta yet."""
        self.version = version
        self.generation = next(_GENERATIONS)
        self.slot_doc = _Buffer(slot_doc)
        self.slot_len = _Buffer(slot_len.astype(np.float64))
        self.alive = _Buffer(np.ones(len(slot_doc), dtype=np.bool_))
        self.delta: dict[int, tuple[list[int], list[int]]] = {}
        self.delta_size = 0
        self.dead = 0

    def _set_main(
        self,
        terms: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        tfs: npt.NDArray[np.int32],
    ) -> None:
        if len(terms):
            bounds = np.flatnonzero(terms[1:] != terms[:-1]) + 1
            starts = np.concatenate(([0], bounds, [len(terms)]))
            self.keys = terms[starts[:-1]]
        else:
            starts = np.zeros(1, dtype=np.int64)
            self.keys = np.zeros(0, dtype=np.int64)
        self.starts = starts.astype(np.int64)
        self.slots = slots
        self.tfs = tfs

    @classmethod
    def from_csr(
        cls,
        version: int,
        *,
        keys: npt.NDArray[np.int64],
        starts: npt.NDArray[np.int64],
        slots: npt.NDArray[np.integer],
        tfs: npt.NDArray[np.integer],
        slot_doc: npt.NDArray[np.int64],
        slot_len: npt.NDArray[np.integer],
    ) -> PostingCache:
        """Postings already grouped by term (``keys[i]``'s are ``starts[i]:starts[i+1]``), as
        a checkpoint maps them: used as they are, not copied."""
        cache = cls.__new__(cls)
        cache.keys, cache.starts = keys, starts
        cache.slots, cache.tfs = slots, tfs  # type: ignore[assignment]
        cache._set_documents(version, slot_doc, slot_len)
        return cache

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection, version: int) -> PostingCache:
        docs = cur.execute("SELECT doc, len FROM bm25_docs ORDER BY doc").fetchnumpy()
        slot_doc = np.asarray(docs["doc"], dtype=np.int64)
        postings = cur.execute(
            "SELECT term, doc, tf FROM bm25_postings ORDER BY term, doc"
        ).fetchnumpy()
        terms = np.asarray(postings["term"], dtype=np.int64)
        tfs = np.asarray(postings["tf"], dtype=np.int32)
        doc_of = np.asarray(postings["doc"], dtype=np.int64)
        slots = _slots_of(slot_doc, doc_of)
        # Postings of removed documents stay on disk until a compaction: leave them out.
        live = slots < len(slot_doc)
        live[live] = slot_doc[slots[live]] == doc_of[live]
        if not live.all():
            terms, slots, tfs = terms[live], slots[live], tfs[live]
        return cls(version, terms, slots, tfs, slot_doc, np.asarray(docs["len"], dtype=np.int64))

    def add(
        self, doc: int, length: int, terms: npt.NDArray[np.int64], tfs: npt.NDArray[np.int32]
    ) -> None:
        slot = self.slot_doc.size
        self.generation = next(_GENERATIONS)
        self.slot_doc.append([doc])
        self.slot_len.append([float(length)])
        self.alive.append([True])
        delta = self.delta
        for term, tf in zip(terms.tolist(), tfs.tolist(), strict=True):
            entry = delta.get(term)
            if entry is None:
                delta[term] = ([slot], [tf])
            else:
                entry[0].append(slot)
                entry[1].append(tf)
        self.delta_size += len(terms)

    def remove(self, doc: int) -> None:
        slot = int(np.searchsorted(self.slot_doc.view(), doc))
        if slot < self.slot_doc.size and self.slot_doc.data[slot] == doc:
            self.generation = next(_GENERATIONS)
            self.alive.data[slot] = False
            self.dead += 1

    @property
    def size(self) -> int:
        """Slots, removed documents' included (`PostingSource`)."""
        return self.slot_doc.size

    def slot_lengths(self) -> npt.NDArray[np.float64]:
        """Each slot's document length (`PostingSource`)."""
        return self.slot_len.view()

    def postings(self, term: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """Slots (ascending) and term frequencies of the live documents holding ``term``."""
        keys = self.keys
        i = int(keys.searchsorted(term))
        if i < len(keys) and int(keys[i]) == term:
            lo, hi = self.starts[i : i + 2].tolist()
            slots, tfs = self.slots[lo:hi], self.tfs[lo:hi]
        else:
            slots, tfs = self.slots[:0], self.tfs[:0]
        extra = self.delta.get(term)
        if extra is not None:
            slots = np.concatenate((slots, np.array(extra[0], dtype=np.int64)))
            tfs = np.concatenate((tfs, np.array(extra[1], dtype=np.int32)))
        if self.dead:
            keep = self.alive.data[slots]
            if not keep.all():
                slots, tfs = slots[keep], tfs[keep]
        return slots, tfs

    def maybe_compact(self) -> None:
        """Fold the delta into the sorted arrays and drop dead postings, when they have grown.

        Amortised: it runs after at least half as many new or dead postings as there are in
        the sorted arrays (and at least ``_COMPACT_MIN_POSTINGS``), so each write pays a
        constant share.
        """
        threshold = max(_COMPACT_MIN_POSTINGS, len(self.slots) // 2)
        dead_postings = self.dead * (len(self.slots) / max(1, self.slot_doc.size))
        if self.delta_size + dead_postings < threshold:
            return
        self.compact()

    def compact(self) -> None:
        """Fold the delta into the sorted arrays and drop dead postings now: afterwards the
        slots number the live documents densely, in insertion order."""
        if not self.delta_size and not self.dead:
            return
        self.generation = next(_GENERATIONS)
        delta_terms = np.fromiter(
            (t for t, (s, _) in self.delta.items() for _ in s), np.int64, self.delta_size
        )
        delta_slots = np.fromiter(
            (x for s, _ in self.delta.values() for x in s), np.int64, self.delta_size
        )
        delta_tfs = np.fromiter(
            (x for _, f in self.delta.values() for x in f), np.int32, self.delta_size
        )
        terms = np.concatenate((np.repeat(self.keys, np.diff(self.starts)), delta_terms))
        slots = np.concatenate((self.slots, delta_slots))
        tfs = np.concatenate((self.tfs, delta_tfs))
        alive = self.alive.view()
        keep = alive[slots]
        terms, slots, tfs = terms[keep], slots[keep], tfs[keep]
        # Renumber the live documents densely; slot order (= insertion order) is kept.
        new_slot = np.cumsum(alive) - 1
        slots = new_slot[slots]
        order = np.lexsort((slots, terms))
        self._set_main(terms[order], slots[order], tfs[order])
        self.slot_doc = _Buffer(self.slot_doc.view()[alive].copy())
        self.slot_len = _Buffer(self.slot_len.view()[alive].copy())
        self.alive = _Buffer(np.ones(self.slot_doc.size, dtype=np.bool_))
        self.delta = {}
        self.delta_size = 0
        self.dead = 0
