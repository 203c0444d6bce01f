"""Index segments: immutable BM25 postings of a set of files in one file, read through mmap.

A segment holds what a workspace's own index would hold for its files (the same documents,
from :func:`file_documents`; the same 63-bit term hashes; the same lengths and term
frequencies) in a form that needs no database: sorted arrays that a reader maps into memory
and searches with ``searchsorted``. Segments are built anywhere (a Dask worker, a laptop), kept
on any storage, and named by the BLAKE2b-256 hash of their bytes, so a name never changes
meaning and a damaged copy is recognised.

Layout (all numbers little-endian)::

    b"AVFSSEG1"  u32 header length  JSON header  zero padding to 64 bytes
    array, zero padding to 64 bytes, array, ...

The header holds ``format`` ("agentvfs-segment"), ``version`` (2; 1 is read too), ``tokenize`` (the
`TokenizeOptions` used, as ``to_dict()``), ``docs``, ``total_len``, ``sources`` and
``arrays``: for each array its absolute ``offset`` (a multiple of 64), ``dtype`` and
``count``. The arrays:

* postings in CSR form: ``terms`` (int64, sorted unique term hashes), ``starts`` (int64,
  ``len(terms) + 1``), ``slots`` (int32, the document slot of each posting, ascending within a
  term) and ``tfs`` (int32);
* per document (slot order = insertion order: files sorted by path, each file's documents in
  order): ``lengths`` (int32, tokens), ``ids`` / ``id_offsets``, ``content`` /
  ``content_offsets`` (each text zstd-compressed; zlib in version 1), ``metadata`` /
  ``metadata_offsets`` (JSON; empty for none), ``start_line`` (int64) and ``has_start_line``
  (uint8);
* per source file, sorted by path: ``src_path`` / ``src_path_offsets``, ``src_size``,
  ``src_mtime_ns``, ``src_etag`` / ``src_etag_offsets`` (empty for none), ``src_digest``
  (SHA-256 hex of the bytes, 64 ASCII bytes each), ``src_chunks`` (int32: its documents) and
  ``src_first_slot`` (int64: its documents are consecutive slots).

Variable-length values are one byte array plus int64 offsets (``n + 1``, from 0).

A segment built with an embedder also holds a vector shard, and its header a ``vectors``
object: ``embedder`` (the embedder's id), ``metric`` ("cosine"), ``dimension``, ``count`` and
the graph's ``M`` and ``ef_construction``. Its arrays: ``vectors`` (float32, ``count`` rows of
``dimension``, each of unit length or zero), ``vector_slots`` (int32, the document of each row,
strictly ascending: a document whose embedding failed has none) and ``hnsw`` (the hnswlib graph
of the rows, as hnswlib saves it, its labels the row numbers; empty when there are no rows).
A reader of a segment without them (or one that ignores them) searches it with BM25 only.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import mmap
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SearchIndexError
from ._bm25 import _pack_many, _term_hashes, _unpack
from ._tokenize import TokenizeOptions, Tokenizer
from ._workspace import _digest, file_documents

__all__ = [
    "FORMAT",
    "MAGIC",
    "VERSION",
    "Segment",
    "SegmentBuilder",
    "SourceColumns",
    "SourceFile",
    "SourceRecord",
    "VectorColumns",
    "build_segment",
    "check_postings",
    "encode_segment",
    "segment_name",
]

MAGIC = b"AVFSSEG1"
FORMAT = "agentvfs-segment"
VERSION = 2
#: Versions this one reads: 1 differs only in its texts being zlib (each text says which).
READABLE_VERSIONS = (1, 2)
#: Every array starts at a multiple of this (a cache line; also what SIMD loads like).
ALIGN = 64
#: Where a segment lives below an index URL, and its file name's suffix.
SEGMENTS_DIR = "segments"
SUFFIX = ".seg"

_PREAMBLE = struct.Struct("<8sI")
#: Each array's name and dtype; a reader refuses a file where one is missing or different.
_DTYPES: dict[str, str] = {
    "terms": "<i8",
    "starts": "<i8",
    "slots": "<i4",
    "tfs": "<i4",
    "lengths": "<i4",
    "ids": "|u1",
    "id_offsets": "<i8",
    "content": "|u1",
    "content_offsets": "<i8",
    "metadata": "|u1",
    "metadata_offsets": "<i8",
    "start_line": "<i8",
    "has_start_line": "|u1",
    "src_path": "|u1",
    "src_path_offsets": "<i8",
    "src_size": "<i8",
    "src_mtime_ns": "<i8",
    "src_etag": "|u1",
    "src_etag_offsets": "<i8",
    "src_digest": "|u1",
    "src_chunks": "<i4",
    "src_first_slot": "<i8",
}
#: The arrays of a vector shard, present when the header has ``vectors``.
_VECTOR_DTYPES: dict[str, str] = {"vectors": "<f4", "vector_slots": "<i4", "hnsw": "|u1"}
_ALL_DTYPES = {**_DTYPES, **_VECTOR_DTYPES}
#: The most dimensions a segment's vectors may have.
MAX_DIMENSION = 1 << 16
_DIGEST_CHARS = 64
#: The bound on a published segment's document texts: each is a file of at most 4,000
#: characters or one chunk of one (``file_documents``), at most 12,000 bytes of UTF-8. A
#: forged text that expands past it is refused instead of allocated.
PUBLISHED_TEXT_LIMIT = 1 << 20
#: Texts compressed per job of the compressing thread.
_PACK_BATCH = 256


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file to index: its path (the document id, ``/`` first, relative to the index's
    source root), its bytes and the version its listing showed.

    Parameters
    ----------
    path : str
        ``/docs/a.md``: the id of its document, or of its chunks ``/docs/a.md#chunk-i``.
    raw : bytes
        The content.
    size, mtime_ns : int
        As listed (``size`` is normally ``len(raw)``).
    etag : str, optional
        The storage's ETag or generation, where it has one.
    """

    path: str
    raw: bytes
    size: int
    mtime_ns: int = 0
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """What a segment records of one source file (as a workspace's index records it).

    Attributes
    ----------
    path : str
        The file's id (``/docs/a.md``).
    size, mtime_ns : int
        As listed when it was indexed.
    etag : str or None
        Its ETag or generation, None where the storage has none.
    digest : str
        SHA-256 hex of its bytes.
    chunks : int
        Its documents (1: the whole file; more: ``path#chunk-i``).
    first_slot : int
        The slot of its first document; the others follow it.
    """

    path: str
    size: int
    mtime_ns: int
    etag: str | None
    digest: str
    chunks: int
    first_slot: int

    @property
    def slots(self) -> range:
        """The slots of its documents."""
        return range(self.first_slot, self.first_slot + self.chunks)


def segment_name(data: bytes | memoryview) -> str:
    """The name of a segment: the BLAKE2b-256 hex digest of its bytes."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def _stable_order(keys: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """The stable sorting permutation of non-negative ``keys`` below 2**32 (NumPy sorts 16-bit
    integers by radix: one pass per half)."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.intp)
    if int(keys.max()) < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    high = np.argsort((keys[low] >> 16).astype(np.uint16), kind="stable")
    return low[high]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _blob(values: Sequence[bytes]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Concatenated bytes and their ``n + 1`` offsets."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    if values:
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    return np.frombuffer(b"".join(values), dtype=np.uint8), offsets


def build_segment(
    files: Iterable[SourceFile],
    tokenize: TokenizeOptions | Mapping[str, Any] | None = None,
    *,
    embedder: Any = None,
) -> bytes:
    """Index ``files`` into the bytes of one segment (see the module documentation).

    Each file becomes the documents :func:`file_documents` makes of it (what a workspace's
    index holds for it), tokenised with ``tokenize`` (default: the reference's options).
    Documents are numbered in order of path, each file's documents in order.

    Parameters
    ----------
    files : iterable of SourceFile
        The files, in any order; their paths must differ.
    tokenize : TokenizeOptions or mapping, optional
        Tokenizer options (not a custom callable: a segment records its options, and a reader
        must be able to tokenise queries the same way).
    embedder : callable, optional
        An embedder (as a workspace takes: ``fn(text)``, sync or async, or a batch function):
        the segment then also holds a vector shard of every document, with the embedder's
        id (:func:`embedder_id`), so a workspace with the same embedder searches it by
        vector too. A document whose embedding fails has no vector (see
        :attr:`SegmentBuilder.embedding_failures`).

    Returns
    -------
    bytes
        The segment; its name is :func:`segment_name` of them.

    Raises
    ------
    ValueError
        Two files with one path, or a path not starting with ``/``.
    """
    with SegmentBuilder(tokenize, embedder=embedder) as builder:
        for source in sorted(files, key=lambda f: f.path):
            builder.add(source)
        return builder.finish()


class SegmentBuilder:
    """Builds one segment from files given one at a time in path order: what
    :func:`build_segment` does, for a caller that reads the files while earlier ones are
    indexed (each file is tokenised as it is added; only the postings' sort waits for the end).

    Parameters
    ----------
    tokenize : TokenizeOptions or mapping, optional
        As :func:`build_segment`.
    embedder : callable, optional
        Embeds every document into the segment's vector shard (see :func:`build_segment`).
    """

    def __init__(
        self, tokenize: TokenizeOptions | Mapping[str, Any] | None = None, *, embedder: Any = None
    ) -> None:
        self.options = TokenizeOptions.from_value(tokenize)
        self.embedder = embedder
        #: Documents whose embedding failed (id -> why), after :meth:`finish`.
        self.embedding_failures: dict[str, str] = {}
        # Every document's text and id, kept for the embedder (None without one).
        self._embed: tuple[list[str], list[str]] | None = ([], []) if embedder is not None else None
        self._tokenizer = Tokenizer(self.options)
        self._ids: list[bytes] = []
        self._metas: list[bytes] = []
        self._start_lines: list[int] = []
        self._has_start: list[int] = []
        self._lengths: list[int] = []
        # Every posting's term (as text) and tf, document after document; the distinct terms
        # per document are what `Tokenizer.counts` gives, so this is the whole per-posting work.
        self._terms: list[str] = []
        self._tfs: list[int] = []
        self._per_doc: list[int] = []
        self._src_paths: list[bytes] = []
        self._src_etags: list[bytes] = []
        self._src_digests: list[bytes] = []
        self._src_size: list[int] = []
        self._src_mtime: list[int] = []
        self._src_chunks: list[int] = []
        self._src_first: list[int] = []
        self._previous: str | None = None
        # zstd releases the GIL: texts are compressed on a second thread while this one
        # tokenises the next ones (a quarter of the build time on a free core).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentvfs-segment")
        self._texts: list[str] = []
        self._packed: list[Future[list[bytes]]] = []

    @property
    def files(self) -> int:
        """Files added so far."""
        return len(self._src_paths)

    def add(self, source: SourceFile) -> None:
        """Index one more file; its path must sort after every path added before.

        Raises
        ------
        ValueError
            The path does not start with ``/``, or does not sort after the previous one
            (given twice, or out of order).
        """
        path = source.path
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"a source file's path must start with '/', got {path!r}")
        if self._previous is not None and path <= self._previous:
            if path == self._previous:
                raise ValueError(f"the file {path} is given twice")
            raise ValueError(f"files must be added in path order: {path} came after {self._previous}")
        self._previous = path
        documents = file_documents(path, source.raw)
        self._src_paths.append(path.encode("utf-8", "surrogatepass"))
        self._src_etags.append((source.etag or "").encode("utf-8", "surrogatepass"))
        self._src_digests.append(_digest(source.raw).encode("ascii"))
        self._src_size.append(int(source.size))
        self._src_mtime.append(int(source.mtime_ns))
        self._src_chunks.append(len(documents))
        self._src_first.append(len(self._ids))
        counts_of = self._tokenizer.counts
        for doc in documents:
            counts, length = counts_of(doc.content)
            self._terms.extend(counts)
            self._tfs.extend(counts.values())
            self._per_doc.append(len(counts))
            self._lengths.append(length)
            self._ids.append(doc.id.encode("utf-8", "surrogatepass"))
            # As the workspace's index shows it: metadata only when it has keys.
            self._metas.append(json.dumps(dict(doc.metadata)).encode() if doc.metadata else b"")
            offset = doc.start_line_offset
            self._start_lines.append(offset if offset is not None else 0)
            self._has_start.append(offset is not None)
            self._texts.append(doc.content)
            if self._embed is not None:
                self._embed[0].append(doc.content)
                self._embed[1].append(doc.id)
        if len(self._texts) >= _PACK_BATCH:
            self._packed.append(self._pool.submit(_pack_many, self._texts))
            self._texts = []

    def finish(self) -> bytes:
        """The segment of the files added (the builder is closed after)."""
        if self._texts:
            self._packed.append(self._pool.submit(_pack_many, self._texts))
            self._texts = []
        shard: Future[tuple[VectorColumns, dict[str, str]]] | None = None
        if self._embed is not None:
            from ._shards import embed_shard  # hnswlib and the embedder only when asked for

            # On the compressing thread: the postings below are sorted meanwhile.
            shard = self._pool.submit(embed_shard, self.embedder, *self._embed)
            self._embed = None
        contents = [blob for future in self._packed for blob in future.result()]
        terms, ids, lengths = self._terms, self._ids, self._lengths
        n_docs = len(ids)
        # Number each distinct term once (a dict keeps first occurrences in order, at C
        # speed) and rank the numbers by hash; mapping every posting to its rank is one pass
        # of C lookups.
        vocabulary = dict.fromkeys(terms)
        number = {term: i for i, term in enumerate(vocabulary)}
        hashes = _term_hashes(vocabulary)
        by_hash = np.argsort(hashes, kind="stable")
        unique_terms = hashes[by_hash]
        rank = np.empty(len(hashes), dtype=np.int64)
        rank[by_hash] = np.arange(len(hashes), dtype=np.int64)
        posting_rank = rank[np.fromiter(map(number.__getitem__, terms), np.int64, len(terms))]
        posting_slots = np.repeat(np.arange(n_docs, dtype=np.int32), self._per_doc)
        posting_tfs = np.fromiter(self._tfs, np.int32, len(self._tfs))
        del number, vocabulary
        self._terms, self._tfs = [], []
        # Postings by (term hash, slot): they are in slot order already, so a stable sort by
        # rank suffices (two 16-bit radix passes, twice as fast as a lexsort of both keys).
        order = _stable_order(posting_rank)
        posting_rank = posting_rank[order]
        posting_slots = posting_slots[order]
        posting_tfs = posting_tfs[order]
        starts = np.searchsorted(posting_rank, np.arange(len(hashes) + 1, dtype=np.int64)).astype(np.int64)
        vectors: VectorColumns | None = None
        if shard is not None:
            vectors, self.embedding_failures = shard.result()
        self.close()
        return encode_segment(
            tokenize=self.options.to_dict(),
            terms=unique_terms,
            starts=starts,
            slots=posting_slots,
            tfs=posting_tfs,
            lengths=np.array(lengths, dtype="<i4"),
            ids=ids,
            contents=contents,
            metadata=self._metas,
            start_lines=np.array(self._start_lines, dtype="<i8"),
            has_start_line=np.array(self._has_start, dtype=np.uint8),
            sources=SourceColumns(
                paths=self._src_paths,
                etags=self._src_etags,
                digests=self._src_digests,
                sizes=self._src_size,
                mtimes_ns=self._src_mtime,
                chunks=self._src_chunks,
                first_slots=self._src_first,
            ),
            vectors=vectors,
        )

    def close(self) -> None:
        """Stop the compressing thread (idempotent)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SegmentBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class SourceColumns:
    """The source files' records of a segment, column by column (paths and ETags encoded,
    digests as 64 ASCII hex bytes each)."""

    paths: Sequence[bytes] = ()
    etags: Sequence[bytes] = ()
    digests: Sequence[bytes] = ()
    sizes: Sequence[int] = ()
    mtimes_ns: Sequence[int] = ()
    chunks: Sequence[int] = ()
    first_slots: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class VectorColumns:
    """A segment's vector shard: the header's ``vectors`` object and the three arrays.

    Attributes
    ----------
    info : dict
        ``embedder``, ``metric``, ``dimension``, ``count``, ``M``, ``ef_construction``.
    matrix : ndarray of float32
        ``count x dimension`` rows, unit length (or zero).
    slots : ndarray of int32
        The document of each row, strictly ascending.
    graph : bytes
        The hnswlib graph of the rows (labels are row numbers); empty for no rows.
    """

    info: dict[str, Any]
    matrix: npt.NDArray[np.float32]
    slots: npt.NDArray[np.int32]
    graph: bytes


def encode_segment(
    *,
    tokenize: dict[str, Any],
    terms: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    slots: npt.NDArray[np.integer],
    tfs: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer],
    ids: Sequence[bytes],
    contents: Sequence[bytes],
    metadata: Sequence[bytes],
    start_lines: npt.NDArray[np.integer],
    has_start_line: npt.NDArray[np.integer],
    sources: SourceColumns = SourceColumns(),
    header: Mapping[str, Any] | None = None,
    vectors: VectorColumns | None = None,
) -> bytes:
    """The bytes of a segment: postings grouped by term (``terms[i]``'s are
    ``starts[i]:starts[i+1]`` of ``slots`` and ``tfs``), each document's length, id, packed
    text, metadata JSON (empty for none) and start line, the source files' records, and the
    vector shard when there is one. ``header`` adds keys to the header (a checkpoint's own)."""
    id_bytes, id_offsets = _blob(ids)
    content_bytes, content_offsets = _blob(contents)
    meta_bytes, meta_offsets = _blob(metadata)
    path_bytes, path_offsets = _blob(sources.paths)
    etag_bytes, etag_offsets = _blob(sources.etags)
    arrays: dict[str, npt.NDArray[Any]] = {
        "terms": terms.astype("<i8"),
        "starts": starts.astype("<i8"),
        "slots": slots.astype("<i4"),
        "tfs": tfs.astype("<i4"),
        "lengths": lengths.astype("<i4"),
        "ids": id_bytes,
        "id_offsets": id_offsets,
        "content": content_bytes,
        "content_offsets": content_offsets,
        "metadata": meta_bytes,
        "metadata_offsets": meta_offsets,
        "start_line": start_lines.astype("<i8"),
        "has_start_line": has_start_line.astype(np.uint8),
        "src_path": path_bytes,
        "src_path_offsets": path_offsets,
        "src_size": np.array(sources.sizes, dtype="<i8"),
        "src_mtime_ns": np.array(sources.mtimes_ns, dtype="<i8"),
        "src_etag": etag_bytes,
        "src_etag_offsets": etag_offsets,
        "src_digest": np.frombuffer(b"".join(sources.digests), dtype=np.uint8),
        "src_chunks": np.array(sources.chunks, dtype="<i4"),
        "src_first_slot": np.array(sources.first_slots, dtype="<i8"),
    }
    head: dict[str, Any] = {
        **(header or {}),
        "format": FORMAT,
        "version": VERSION,
        "tokenize": tokenize,
        "docs": len(ids),
        "total_len": int(lengths.sum(dtype=np.int64)),
        "sources": len(sources.paths),
        "postings": len(slots),
        "arrays": {},
    }
    if vectors is not None:
        head["vectors"] = dict(vectors.info)
        arrays["vectors"] = np.ascontiguousarray(vectors.matrix, dtype="<f4").ravel()
        arrays["vector_slots"] = vectors.slots.astype("<i4")
        arrays["hnsw"] = np.frombuffer(vectors.graph, dtype=np.uint8)
    return _serialise(head, arrays)


def _serialise(header: dict[str, Any], arrays: Mapping[str, npt.NDArray[Any]]) -> bytes:
    # The offsets are absolute, so they depend on the header's length, which depends on the
    # offsets: grow the data start until the header fits before it (two rounds at most in
    # practice; the offsets only grow, so this ends).
    data_start = _align(_PREAMBLE.size + 256)
    while True:
        position = data_start
        table: dict[str, Any] = {}
        for name, array in arrays.items():
            table[name] = {"offset": position, "dtype": _ALL_DTYPES[name], "count": int(array.size)}
            position = _align(position + array.nbytes)
        header["arrays"] = table
        encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        needed = _align(_PREAMBLE.size + len(encoded))
        if needed <= data_start:
            break
        data_start = needed
    # One copy of each array, by one join of views (a buffer filled then turned into bytes
    # copied a 100 MB checkpoint three times).
    head = _PREAMBLE.pack(MAGIC, len(encoded)) + encoded
    parts: list[bytes | memoryview] = [head, bytes(data_start - len(head))]
    for name, array in arrays.items():
        end = table[name]["offset"] + array.nbytes
        parts.append(np.ascontiguousarray(array).data.cast("B"))
        parts.append(bytes(_align(end) - end))
    data = b"".join(parts)
    assert len(data) == position
    return data


_EMPTY_I32: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)


def check_postings(segment: Segment) -> None:
    """Refuse a segment whose postings a search could not use: terms not strictly ascending,
    term ranges out of order, a slot outside its documents, a term's slots not strictly
    ascending, a term frequency below 1, lengths
    that do not add up. The name (a hash) proves the bytes are the ones published, not that
    whoever published them wrote them well; an index from a bucket others can write is read
    only after this (linear in the postings, milliseconds at 20k documents).

    Raises
    ------
    SearchIndexError
        Naming the segment and what is wrong.
    """
    arrays = segment.arrays
    terms, starts, slots, tfs = arrays["terms"], arrays["starts"], arrays["slots"], arrays["tfs"]
    lengths = segment.lengths
    why = None
    if len(terms) > 1 and not bool(np.all(terms[1:] > terms[:-1])):
        why = "its terms are not in ascending order"
    elif len(starts) and (int(starts[0]) != 0 or not bool(np.all(starts[1:] >= starts[:-1]))):
        why = "its term ranges are out of order"
    elif len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= segment.n_docs):
        why = f"a posting names a document outside its {segment.n_docs}"
    elif not _ascending_per_term(slots, starts):
        why = "a term's documents are not in ascending order (or one is listed twice)"
    elif len(tfs) and int(tfs.min()) < 1:
        why = "a term frequency is below 1"
    elif len(lengths) and (int(lengths.min()) < 0 or int(lengths.sum(dtype=np.int64)) != segment.total_len):
        why = "its document lengths do not add up to its total length"
    if why is not None:
        raise SearchIndexError(f"segment {segment.name} cannot be searched: {why}")


def _ascending_per_term(slots: npt.NDArray[np.integer], starts: npt.NDArray[np.integer]) -> bool:
    """Whether each term's slots rise strictly (searches find a document in a term's postings
    by bisection and add its score once)."""
    if len(slots) < 2:
        return True
    rising = slots[1:] > slots[:-1]
    cuts = starts[1:-1].astype(np.int64) - 1  # where one term's range ends and the next starts
    rising[cuts[(cuts >= 0) & (cuts < len(rising))]] = True
    return bool(rising.all())


class Segment:
    """A segment opened for reading: its arrays are views of the mapped file (or bytes).

    Opening reads the header and checks it (magic, format, version, every array's dtype and
    bounds, the CSR and offset arrays' ends); it reads no array, so a segment of any size opens
    in a fraction of a millisecond. The whole-file check is the name: :func:`segment_name`
    of the bytes (``fetch_segment`` verifies it on download).

    Attributes
    ----------
    name : str
        Its BLAKE2b-256 hex name (for :meth:`open`, taken from the file name
        ``<name>.seg``; else computed).
    path : str or None
        The file, for a segment opened from one.
    n_docs, total_len : int
        Documents and the sum of their lengths in tokens.
    tokenize : dict
        The tokenizer options it was built with (``TokenizeOptions.to_dict()``).
    lengths : ndarray of int32
        Each document's length in tokens, by slot.
    """

    def __init__(self, buffer: Any, name: str, where: str, *, keep: Any = None) -> None:
        self.name = name
        self.path: str | None = None
        self._where = where
        self._keep = keep  # the mmap (or bytes) the views below point into
        view = memoryview(buffer)
        self._size = len(view)
        header = self._header(view)
        self.header = header
        self.n_docs: int = header["docs"]
        self.total_len: int = header["total_len"]
        self.tokenize: dict[str, Any] = header["tokenize"]
        arrays = self._arrays(view, header)
        arrays.update(self._vector_arrays(view, header))
        #: The vector shard's header (``embedder``, ``dimension``, ``count``...), None without one.
        self.vector_info: dict[str, Any] | None = header.get("vectors")
        self._terms = arrays["terms"]
        self._starts = arrays["starts"]
        self._slots = arrays["slots"]
        self._tfs = arrays["tfs"]
        self.lengths: npt.NDArray[np.int32] = arrays["lengths"]
        self._a = arrays
        self._slot_of: dict[str, int] | None = None
        self._sources: dict[str, SourceRecord] | None = None
        #: The most bytes a document's text may expand to (None: no bound; see
        #: :data:`PUBLISHED_TEXT_LIMIT`).
        self.text_limit: int | None = None

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Segment:
        """Map the segment file ``path`` into memory; its name is ``name``, else taken from
        the file's (``<name>.seg``).

        Raises
        ------
        SearchIndexError
            The file is not a segment this version reads, or is truncated (the message names
            the file and what is wrong).
        FileNotFoundError
            No file is there.
        """
        path = os.fspath(path)
        if name is None:
            name = os.path.basename(path).removesuffix(SUFFIX)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise SearchIndexError(f"segment {path} is empty (0 bytes): not a segment")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        segment = cls(mapped, name, path, keep=mapped)
        segment.path = path
        return segment

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str | None = None) -> Segment:
        """A segment over ``data`` (its name is computed unless given).

        Raises
        ------
        SearchIndexError
            ``data`` is not a segment this version reads.
        """
        name = name if name is not None else segment_name(data)
        return cls(data, name, f"segment {name}", keep=data)

    def _bad(self, why: str) -> SearchIndexError:
        where = self._where if self._where.startswith("segment ") else f"segment {self._where}"
        return SearchIndexError(f"{where} cannot be read: {why}")

    def _header(self, view: memoryview) -> dict[str, Any]:
        if len(view) < _PREAMBLE.size:
            raise self._bad(f"{len(view)} bytes, shorter than the {_PREAMBLE.size}-byte preamble")
        magic, length = _PREAMBLE.unpack_from(view, 0)
        if magic != MAGIC:
            raise self._bad(f"it does not start with {MAGIC!r} (found {bytes(magic)!r})")
        if _PREAMBLE.size + length > len(view):
            raise self._bad(f"its header ({length} bytes) runs past the end ({len(view)} bytes): truncated")
        try:
            header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + length]))
        except ValueError as exc:
            raise self._bad(f"its header is not JSON ({exc})") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise self._bad(f"format {found!r}, expected {FORMAT!r}")
        if header.get("version") not in READABLE_VERSIONS:
            raise self._bad(
                f"format version {header.get('version')!r}; this version reads "
                + " and ".join(map(str, READABLE_VERSIONS))
            )
        for key, kind in (("docs", int), ("total_len", int), ("sources", int), ("tokenize", dict), ("arrays", dict)):
            if not isinstance(header.get(key), kind):
                raise self._bad(f"its header has no valid {key!r}")
        return header

    def _array(self, view: memoryview, table: Mapping[str, Any], name: str, dtype: str) -> npt.NDArray[Any]:
        """The array ``name`` as the header's table places it, checked to lie in the file."""
        entry = table.get(name)
        if not isinstance(entry, dict):
            raise self._bad(f"the array {name!r} is missing")
        offset, count = entry.get("offset"), entry.get("count")
        if entry.get("dtype") != dtype or not isinstance(offset, int) or not isinstance(count, int):
            raise self._bad(f"the array {name!r} is described wrongly ({entry})")
        item = np.dtype(dtype).itemsize
        if offset % ALIGN or offset < _PREAMBLE.size or count < 0 or offset + count * item > len(view):
            raise self._bad(
                f"the array {name!r} ({count} x {dtype} at {offset}) lies outside the file "
                f"({len(view)} bytes): truncated or damaged"
            )
        return np.frombuffer(view, dtype=dtype, count=count, offset=offset)

    def _vector_arrays(self, view: memoryview, header: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
        """The vector shard's arrays, when the header describes one, checked against it."""
        info = header.get("vectors")
        if info is None:
            return {}
        if not isinstance(info, dict):
            raise self._bad("its 'vectors' header is not an object")
        for key, kind in (("embedder", str), ("metric", str), ("dimension", int), ("count", int)):
            if not isinstance(info.get(key), kind) or isinstance(info.get(key), bool):
                raise self._bad(f"its 'vectors' header has no valid {key!r}")
        if info["metric"] != "cosine":
            raise self._bad(f"its vectors use the metric {info['metric']!r}; this version reads 'cosine'")
        dimension, count = info["dimension"], info["count"]
        if not (1 <= dimension <= MAX_DIMENSION or dimension == count == 0) or not 0 <= count <= header["docs"]:
            raise self._bad(f"its vectors ({count} of dimension {dimension}) do not fit its {header['docs']} documents")
        out = {name: self._array(view, header["arrays"], name, dtype) for name, dtype in _VECTOR_DTYPES.items()}
        if len(out["vectors"]) != count * dimension or len(out["vector_slots"]) != count:
            raise self._bad(f"its vector arrays do not hold {count} vectors of dimension {dimension}")
        if (len(out["hnsw"]) == 0) != (count == 0):
            raise self._bad("its vector graph is missing" if count else "it has a vector graph of no vectors")
        return out

    def _arrays(self, view: memoryview, header: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
        table = header["arrays"]
        out = {name: self._array(view, table, name, dtype) for name, dtype in _DTYPES.items()}
        n = header["docs"]
        n_src = header.get("sources")
        expect = {
            "starts": len(out["terms"]) + 1,
            "tfs": len(out["slots"]),
            "lengths": n,
            "id_offsets": n + 1,
            "content_offsets": n + 1,
            "metadata_offsets": n + 1,
            "start_line": n,
            "has_start_line": n,
            "src_path_offsets": (n_src or 0) + 1,
            "src_etag_offsets": (n_src or 0) + 1,
            "src_size": n_src,
            "src_mtime_ns": n_src,
            "src_chunks": n_src,
            "src_first_slot": n_src,
            "src_digest": (n_src or 0) * _DIGEST_CHARS,
        }
        for name, count in expect.items():
            if len(out[name]) != count:
                raise self._bad(f"the array {name!r} has {len(out[name])} entries, expected {count}")
        # The ends of each CSR and offset array (O(1)): a damaged file rarely passes these, and
        # the name (a hash of every byte) catches the rest.
        ends = {
            "starts": len(out["slots"]),
            "id_offsets": len(out["ids"]),
            "content_offsets": len(out["content"]),
            "metadata_offsets": len(out["metadata"]),
            "src_path_offsets": len(out["src_path"]),
            "src_etag_offsets": len(out["src_etag"]),
        }
        for name, end in ends.items():
            array = out[name]
            if array[0] != 0 or array[-1] != end:
                raise self._bad(f"the offsets {name!r} run from {array[0]} to {array[-1]}, expected 0 to {end}")
        return out

    # -- postings --------------------------------------------------------------------------

    def postings(self, term: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """The slots (ascending) and term frequencies of the documents holding ``term``
        (a 63-bit term hash); empty arrays when none does."""
        terms = self._terms
        i = int(np.searchsorted(terms, term))
        if i == len(terms) or int(terms[i]) != term:
            return _EMPTY_I32, _EMPTY_I32
        start, end = int(self._starts[i]), int(self._starts[i + 1])
        return self._slots[start:end], self._tfs[start:end]

    @property
    def n_terms(self) -> int:
        """Distinct terms."""
        return len(self._terms)

    @property
    def terms(self) -> npt.NDArray[np.int64]:
        """The sorted term hashes."""
        return self._terms

    @property
    def arrays(self) -> Mapping[str, npt.NDArray[Any]]:
        """Every array of the segment by name (read-only views of the mapping), for code that
        works on the postings as a whole: ``starts`` (the CSR offsets of ``terms``),
        ``slots``, ``tfs``, ``lengths`` and the rest of the format's arrays."""
        return MappingProxyType(self._a)

    # -- vectors ---------------------------------------------------------------------------

    @property
    def vector_matrix(self) -> npt.NDArray[np.float32]:
        """The shard's vectors, one row per vector (``count x dimension``; empty without a shard)."""
        info = self.vector_info
        if info is None:
            return np.zeros((0, 0), dtype=np.float32)
        matrix: npt.NDArray[np.float32] = self._a["vectors"].reshape(info["count"], info["dimension"])
        return matrix

    @property
    def vector_slots(self) -> npt.NDArray[np.int32]:
        """The document slot of each vector row (ascending; empty without a shard)."""
        return self._a.get("vector_slots", _EMPTY_I32)

    @property
    def graph_bytes(self) -> npt.NDArray[np.uint8]:
        """The hnswlib graph of the vector rows, as saved (empty without vectors)."""
        return self._a.get("hnsw", np.zeros(0, dtype=np.uint8))

    # -- documents -------------------------------------------------------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_docs:
            raise IndexError(f"slot {slot} out of range (0 to {self.n_docs - 1}) in segment {self.name}")

    # (Unchecked reads of one document's fields: the public readers check the slot first,
    # `document` once for all four, as it runs for every hit of every search.)

    def _bytes(self, data: str, offsets: str, slot: int) -> bytes:
        lo, hi = self._a[offsets][slot : slot + 2].tolist()
        return self._a[data][lo:hi].tobytes()

    def _id_at(self, slot: int) -> str:
        return self._bytes("ids", "id_offsets", slot).decode("utf-8", "surrogatepass")

    def _metadata_at(self, slot: int) -> dict[str, Any] | None:
        raw = self._bytes("metadata", "metadata_offsets", slot)
        return json.loads(raw) if raw else None

    def _start_line_at(self, slot: int) -> int | None:
        return int(self._a["start_line"][slot]) if self._a["has_start_line"][slot] else None

    def doc_id(self, slot: int) -> str:
        """The id of the document in ``slot``."""
        self._check_slot(slot)
        return self._id_at(slot)

    def _text_at(self, slot: int) -> str:
        try:
            return _unpack(self._bytes("content", "content_offsets", slot), self.text_limit)
        except ValueError as exc:
            raise SearchIndexError(f"segment {self.name}: the text of document {slot} cannot be read: {exc}") from None

    def content(self, slot: int) -> str:
        """The text of the document in ``slot``."""
        self._check_slot(slot)
        return self._text_at(slot)

    def metadata(self, slot: int) -> dict[str, Any] | None:
        """The metadata of the document in ``slot`` (None when it has none)."""
        self._check_slot(slot)
        return self._metadata_at(slot)

    def start_line(self, slot: int) -> int | None:
        """The line of its file the document in ``slot`` starts at (chunks), else None."""
        self._check_slot(slot)
        return self._start_line_at(slot)

    def document(self, slot: int) -> tuple[str, str, dict[str, Any] | None, int | None]:
        """``(id, text, metadata, start line)`` of the document in ``slot``."""
        self._check_slot(slot)
        text = self._text_at(slot)
        return self._id_at(slot), text, self._metadata_at(slot), self._start_line_at(slot)

    def ids(self) -> list[str]:
        """Every document id, by slot."""
        blob = self._a["ids"].tobytes()
        off = self._a["id_offsets"].tolist()
        return [blob[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(off)]

    def slot_of(self, id: str) -> int | None:
        """The slot of the document ``id``, or None (the table is made at the first call)."""
        table = self._slot_of
        if table is None:
            table = self._slot_of = {doc: slot for slot, doc in enumerate(self.ids())}
        return table.get(id)

    # -- sources ---------------------------------------------------------------------------

    def sources(self) -> dict[str, SourceRecord]:
        """Each source file's record, by path (in path order)."""
        found = self._sources
        if found is None:
            a = self._a
            paths = a["src_path"].tobytes()
            path_off = a["src_path_offsets"].tolist()
            etags = a["src_etag"].tobytes()
            etag_off = a["src_etag_offsets"].tolist()
            digests = a["src_digest"].tobytes().decode("ascii")
            found = {}
            for i, (size, mtime, chunks, first) in enumerate(
                zip(
                    a["src_size"].tolist(), a["src_mtime_ns"].tolist(),
                    a["src_chunks"].tolist(), a["src_first_slot"].tolist(), strict=True,
                )
            ):
                path = paths[path_off[i] : path_off[i + 1]].decode("utf-8", "surrogatepass")
                etag = etags[etag_off[i] : etag_off[i + 1]].decode("utf-8", "surrogatepass")
                digest = digests[i * _DIGEST_CHARS : (i + 1) * _DIGEST_CHARS]
                found[path] = SourceRecord(path, size, mtime, etag or None, digest, chunks, first)
            self._sources = found
        return found

    def slots_of_source(self, path: str) -> range:
        """The slots of the documents of the file ``path`` (empty when it is not here)."""
        record = self.sources().get(path)
        return record.slots if record is not None else range(0)

    # -- life ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the arrays and unmap the file (views handed out keep it mapped until they go)."""
        self._a = {}
        self._terms = self._starts = np.zeros(0, dtype=np.int64)
        self._slots = self._tfs = self.lengths = _EMPTY_I32
        keep, self._keep = self._keep, None
        if isinstance(keep, mmap.mmap):
            # A caller may still hold a view: then the mapping goes with the last of them.
            with contextlib.suppress(BufferError):
                keep.close()

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.n_docs

    def __repr__(self) -> str:
        return f"Segment({self.name[:16]}, docs={self.n_docs}, terms={len(self._terms)})"
