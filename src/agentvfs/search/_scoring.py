"""BM25 scored over several sets of postings as over one index.

A query may run over one index (the postings a `BM25Index` keeps in memory) or over the
segments of a published index plus the local index of changes made since (see
``_shared.py``). Scores depend on the whole collection: N, the average length and each term's
document frequency. Here those are summed over every source first, so each document's score
is computed with exactly the numbers, and the operations in exactly the order, that one index
holding all the documents would use: the scores are the same bits, not merely close.

Ties keep the reference's order within one index (the first query term a document holds, then
insertion order); across sources, earlier sources come first.
"""

from __future__ import annotations

import contextlib
import math
import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["DocumentSource", "PostingSource", "js_log", "positions", "rank"]

#: Above this many query tokens, or this much posting work, duplicates are weighted instead of
#: added one by one (the scores then differ from the reference's in the last bits only).
EXACT_FOLD_TOKENS = 1024
EXACT_FOLD_WORK = 4_000_000


class PostingSource(Protocol):
    """Postings numbered by slot (insertion order), removed documents left out."""

    @property
    def size(self) -> int:
        """Slots: one past the highest slot a posting may name."""
        ...

    def slot_lengths(self) -> npt.NDArray[np.float64]:
        """Each slot's document length in tokens."""
        ...

    def postings(self, term: int) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.integer]]:
        """Slots (ascending) and term frequencies of the live documents holding ``term``."""
        ...


class DocumentSource(PostingSource, Protocol):
    """Postings searched beside an index's own (a published index's segment): what they add to
    the collection's statistics, and their documents."""

    @property
    def live_docs(self) -> int:
        """Documents not removed."""
        ...

    @property
    def live_length(self) -> int:
        """The sum of their lengths in tokens."""
        ...

    def document(self, slot: int) -> tuple[str, str, dict[str, Any] | None, int | None]:
        """``(id, content, metadata, start line)`` of the document in ``slot``."""
        ...


# fdlibm's log (e_log.c), as V8 runs Math.log: the reference's idf is computed with it, and it
# differs from the C library's correctly rounded log in the last bit for a few inputs (ln 1.6).
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01


def js_log(x: float) -> float:
    """Natural logarithm with V8's ``Math.log`` rounding (fdlibm), for normal positive ``x``."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    hx = bits >> 32
    if hx < 0x00100000 or hx >= 0x7FF00000:  # zero, subnormal, negative, inf, NaN
        return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    k = (hx >> 20) - 1023
    hx &= 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    bits = ((hx | (i ^ 0x3FF00000)) << 32) | (bits & 0xFFFFFFFF)
    x = struct.unpack("<d", struct.pack("<q", bits))[0]  # x or x/2 normalised
    k += i >> 20
    f = x - 1.0
    dk = float(k)
    if (0x000FFFFF & (2 + hx)) < 3:  # -2**-20 <= f < 2**-20
        if f == 0.0:
            return 0.0 if k == 0 else dk * _LN2_HI + dk * _LN2_LO
        r = f * f * (0.5 - 0.33333333333333333 * f)
        return f - r if k == 0 else dk * _LN2_HI - ((r - dk * _LN2_LO) - f)
    s = f / (2.0 + f)
    z = s * s
    i = hx - 0x6147A
    w = z * z
    j = 0x6B851 - hx
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    i |= j
    r = t2 + t1
    if i > 0:
        hfsq = 0.5 * f * f
        if k == 0:
            return f - (hfsq - s * (hfsq + r))
        return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    if k == 0:
        return f - s * (f - r)
    return dk * _LN2_HI - ((s * (f - r) - dk * _LN2_LO) - f)


_IDF_MEMO: dict[tuple[int, int], float] = {}
_IDF_MEMO_SIZE = 65_536


def _idf(n: int, df: int) -> float:
    """``ln((n - df + 0.5) / (df + 0.5) + 1)`` as the reference rounds it, remembered: the
    fdlibm log is a few microseconds of Python, and an index's common terms come back in
    query after query with the same ``n`` and ``df``."""
    key = (n, df)
    found = _IDF_MEMO.get(key)
    if found is None:
        if len(_IDF_MEMO) >= _IDF_MEMO_SIZE:
            _IDF_MEMO.clear()  # (dict operations are atomic: other threads see old or none)
        found = _IDF_MEMO[key] = js_log((n - df + 0.5) / (df + 0.5) + 1)
    return found


def _norms(source: PostingSource, avgdl: float, k1: float, b: float) -> npt.NDArray[np.float64]:
    """``k1 * (1 - b + b * (len / avgdl))`` of every slot of ``source``: the same operations in
    the same order as per posting (so the same bits), done once per collection state instead
    of once per query term. Kept on the source until the average length, its size or its
    ``generation`` (see `_term_cache`) changes."""
    lengths = source.slot_lengths()
    key = (avgdl, k1, b, len(lengths), getattr(source, "generation", None))
    cached = getattr(source, "_bm25_norms", None)
    if cached is not None and cached[0] == key:
        norms: npt.NDArray[np.float64] = cached[1]
        return norms
    norms = k1 * ((1 - b) + b * (lengths / avgdl))
    # (A source that takes no attributes gets them computed every time.)
    with contextlib.suppress(AttributeError):
        source._bm25_norms = (key, norms)  # type: ignore[attr-defined]
    return norms


#: A query term's postings in one source: the slots holding it and its score in each.
_Terms = dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]]
#: A term's postings in one source: the slots holding it, and ``tf * (k1 + 1) / (tf + norm)``
#: of each (its score before the idf, which depends on the whole collection).
_Part = tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]

_NO_PART: _Part = (np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float64))

#: Term parts a source keeps between queries, in postings per document it holds (at least
#: ``_TERM_CACHE_MIN``): about a quarter of a typical index's postings, 16 bytes each at most.
_TERM_CACHE_PER_DOC = 32
_TERM_CACHE_MIN = 65_536


def _tf_part(
    slots: npt.NDArray[np.integer], tfs: npt.NDArray[np.integer], norms: npt.NDArray[np.float64], k1_plus_1: float
) -> _Part:
    """A term's :data:`_Part` from its postings, with the reference's operands in its order."""
    # (intp indexes: numpy gathers and scatters with them twice as fast.)
    at = slots.astype(np.intp, copy=False)
    divisor = norms.take(at)
    divisor += tfs
    part = tfs * k1_plus_1
    part /= divisor
    return at, part.astype(np.float64, copy=False)


class _TermCache:
    """The :data:`_Part` of recent query terms of one source, least recently used dropped
    first past the budget. One source's postings and one average length: a change to either
    makes a new cache (see `_term_cache`)."""

    __slots__ = ("_budget", "_entries", "_held", "_lock", "key")

    def __init__(self, key: tuple[Any, ...], budget: int) -> None:
        self.key = key
        self._budget = budget
        self._entries: OrderedDict[int, _Part] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, term: int) -> _Part | None:
        with self._lock:
            part = self._entries.get(term)
            if part is not None:
                self._entries.move_to_end(term)
            return part

    def put(self, term: int, part: _Part) -> None:
        size = _cost(part)
        if size > self._budget:
            return
        with self._lock:
            if term in self._entries:
                return
            self._entries[term] = part
            self._held += size
            while self._held > self._budget:
                _, old = self._entries.popitem(last=False)
                self._held -= _cost(old)


def _cost(part: _Part) -> int:
    """What a kept part counts against the budget: its postings, and at least one (a term
    the source lacks is kept too, and a session may ask for unboundedly many of those)."""
    return max(1, len(part[0]))


def _term_cache(source: PostingSource, avgdl: float, k1: float, b: float) -> _TermCache | None:
    """The term cache of ``source`` for this average length and these parameters (None for a
    source that takes no attributes). A source whose postings change (`PostingCache`) has a
    ``generation`` that changes with them; others are taken as immutable."""
    key = (avgdl, k1, b, source.size, getattr(source, "generation", None))
    cache: _TermCache | None = getattr(source, "_bm25_terms", None)
    if cache is None or cache.key != key:
        cache = _TermCache(key, max(_TERM_CACHE_MIN, _TERM_CACHE_PER_DOC * source.size))
        try:
            source._bm25_terms = cache  # type: ignore[attr-defined]
        except AttributeError:
            return None
    return cache


_SCRATCH = threading.local()


def _scratch_scores(size: int) -> npt.NDArray[np.float64]:
    """``size`` zeros in this thread's scratch array (grown as needed, kept): a new array
    per query would be fresh memory from the system each time, and its first touches cost
    more than the arithmetic done in it."""
    scratch: npt.NDArray[np.float64] | None = getattr(_SCRATCH, "scores", None)
    if scratch is None or len(scratch) < size:
        scratch = _SCRATCH.scores = np.empty(size, dtype=np.float64)
    scores = scratch[:size]
    scores.fill(0.0)
    return scores


def _candidates(
    scores: npt.NDArray[np.float64],
    here: _Terms,
    positive: bool,
    top_k: int,
    min_score: float,
) -> npt.NDArray[np.int64]:
    """The slots that may be among the ``top_k`` of ``scores``: those holding a query term
    (``here``) and scoring at least ``min_score``, less those surely below the cut.

    Any subset's ``top_k``-th best score is at most the whole's, so the ``top_k``-th best
    among the documents of the rarest term that has that many is a floor: every document at
    or above the real cut (ties included) is at or above it. Typically it leaves a few dozen
    candidates of thousands, and the full-length arrays are compared once instead of sorted.
    """
    floor = min_score
    rare = min((slots for slots, _ in here.values() if len(slots) >= top_k), key=len, default=None)
    if rare is not None:
        sub = scores[rare]
        floor = max(floor, float(np.partition(sub, len(sub) - top_k)[len(sub) - top_k]))
    if positive:
        # (0 scores only documents holding no term: a floor <= 0 only needs to exclude them.)
        return np.flatnonzero(scores >= floor) if floor > 0 else np.flatnonzero(scores > 0)
    holding = np.zeros(len(scores), dtype=np.bool_)
    for slots, _ in here.values():
        holding[slots] = True
    return np.flatnonzero(holding & (scores >= floor))


def _first_terms(here: _Terms, distinct: list[str], candidates: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The position in ``distinct`` of the first query term each of ``candidates`` holds."""
    first = np.full(len(candidates), len(distinct), dtype=np.int64)
    for pos in range(len(distinct) - 1, -1, -1):
        entry = here.get(distinct[pos])
        if entry is not None:
            first[positions(entry[0], candidates)[1]] = pos
    return first


def positions(
    ascending: npt.NDArray[np.integer], values: npt.NDArray[np.integer]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """Where each of ``values`` is in ``ascending`` (by bisection), and whether it is there
    (where it is not, its position is any valid one)."""
    if not len(ascending):
        return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=np.bool_)
    at = np.searchsorted(ascending, values)
    np.minimum(at, len(ascending) - 1, out=at)
    return at, np.asarray(ascending[at] == values)


def rank(
    sources: Sequence[PostingSource],
    tokens: Sequence[str],
    hashes: dict[str, int],
    *,
    n: int,
    total_len: int,
    k1: float,
    b: float,
    top_k: int,
    min_score: float,
) -> list[tuple[int, int, float]]:
    """The ``top_k`` documents of ``sources`` for the query ``tokens``, best first.

    Parameters
    ----------
    sources
        The postings, in tie order.
    tokens
        The query's tokens in order, duplicates included.
    hashes
        Each distinct token's term hash.
    n, total_len
        Live documents and the sum of their lengths over all ``sources``.

    Returns
    -------
    list of (source, slot, score)
    """
    if n <= 0 or top_k <= 0:
        return []
    distinct = list(dict.fromkeys(tokens))
    k1_plus_1 = k1 + 1
    avgdl = total_len / n
    # With these parameters every term score is > 0 (idf > 0 as df <= N, tf >= 1 and the
    # length norm >= 0), so the documents holding a query term are those scoring above 0.
    positive = k1 >= 0 and 0 <= b <= 1
    # Each distinct term's postings in every source with their scores less the idf (kept by
    # the source between queries while its postings and the average length stay), and its
    # document frequency over all.
    # (Norms only once a source holds a query term: with no term found the average length may
    # be 0, every document empty of tokens.)
    norms: list[npt.NDArray[np.float64] | None] = [None] * len(sources)
    caches = [_term_cache(source, avgdl, k1, b) for source in sources]
    found: dict[str, list[_Part]] = {}
    idf: dict[str, float] = {}
    weights = Counter(tokens)
    work = 0  # postings added up, duplicates counted
    for term in distinct:
        key = hashes[term]
        per_source: list[_Part] = []
        df = 0
        for index, source in enumerate(sources):
            cache = caches[index]
            part = cache.get(key) if cache is not None else None
            if part is None:
                slots, tfs = source.postings(key)
                if not len(slots):
                    part = _NO_PART
                else:
                    source_norms = norms[index]
                    if source_norms is None:
                        source_norms = norms[index] = _norms(source, avgdl, k1, b)
                    part = _tf_part(slots, tfs, source_norms, k1_plus_1)
                if cache is not None:
                    cache.put(key, part)
            per_source.append(part)
            df += len(part[0])
        if df == 0:
            continue
        found[term] = per_source
        idf[term] = _idf(n, df)
        work += df * weights[term]
    if not found:
        return []
    exact = len(tokens) <= EXACT_FOLD_TOKENS and work <= EXACT_FOLD_WORK
    picked: list[tuple[npt.NDArray[np.float64], _Terms, int, npt.NDArray[np.int64]]]
    picked = []
    for index, source in enumerate(sources):
        # idf * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * (len / avgdl)))), the reference's
        # arithmetic, per distinct term present here.
        here: _Terms = {}
        for term, per_source in found.items():
            at, before_idf = per_source[index]
            if len(at):
                here[term] = (at, before_idf * idf[term])
        if not here:
            continue
        size = source.size
        scores = _scratch_scores(size)
        if exact:
            # The reference adds one term score per query token, in query order.
            for token in tokens:
                entry = here.get(token)
                if entry is not None:
                    scores[entry[0]] += entry[1]
        else:
            for term, (slots, contributions) in here.items():
                w = weights[term]
                scores[slots] += contributions if w == 1 else w * contributions
        candidates = _candidates(scores, here, positive, top_k, min_score)
        values = scores[candidates]
        if len(candidates) > top_k:
            kth = np.partition(values, len(values) - top_k)[len(values) - top_k]
            keep = values >= kth  # ties at the cut stay in, the sort below settles them
            candidates, values = candidates[keep], values[keep]
        picked.append((values, here, index, candidates))
    if not picked:
        return []
    values = np.concatenate([p[0] for p in picked])
    owners = np.concatenate([np.full(len(p[3]), p[2], dtype=np.int64) for p in picked])
    slots_all = np.concatenate([p[3] for p in picked])
    ordered = np.sort(values)
    if not (ordered[1:] == ordered[:-1]).any():
        order = np.argsort(-values, kind="stable")[:top_k]  # no equal scores: no tie to settle
    else:
        # The reference's order before its stable sort: by the first query term a document
        # holds, then by the term's posting order (= insertion order = slot order).
        firsts = np.concatenate([_first_terms(p[1], distinct, p[3]) for p in picked])
        order = np.lexsort((slots_all, owners, firsts, -values))[:top_k]
    return list(
        zip(owners[order].tolist(), slots_all[order].tolist(), values[order].tolist(), strict=True)
    )
