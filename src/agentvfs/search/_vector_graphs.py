"""hnswlib graph files of the vector store: loading one (checked against the checksum in its
name and against hnswlib's header, read without copying its records), and making a written one
durable."""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._vector_math import Floats, Labels, Mask

__all__ = ["GraphFile", "check_graph", "fsync_and_crc", "fsync_dir", "hnswlib", "reachable", "read_graph", "stored_vectors"]

# hnswlib's file header (hnswalg.h saveIndex): offsetLevel0, max_elements, cur_element_count,
# size_data_per_element, label_offset, offsetData (size_t), maxlevel (int), enterpoint (uint32),
# maxM, maxM0, M (size_t), mult (double), ef_construction (size_t); then the level-0 records.
_HEADER = struct.Struct("<6QiI3QdQ")


# Bounds of what ``init_index`` makes, and of what a graph of ours can hold: hnswlib's levels are
# geometric with ratio 1/M, so a level above 100 would take more elements than memory holds.
_MIN_M, _MAX_M = 2, 1024
_MAX_LEVEL = 100
_MAX_EF_CONSTRUCTION = 1_000_000
# ``mult`` is 1/ln(M): at most 1/ln(2). A larger one makes ``addPoint`` draw levels that overflow
# hnswlib's int (undefined behaviour) once items are added to the loaded graph.
_MAX_MULT = 1.0 / math.log(_MIN_M)


def check_graph(data: bytes | memoryview, *, count: int, dimension: int) -> None:
    """Refuse hnswlib graph bytes that hnswlib could not load and search safely.

    hnswlib's ``loadIndex`` trusts the file: it takes the record layout from the header, follows
    neighbour ids without bounds checks (the one check it has is off by one) and looks up the
    upper-level lists of the elements it reaches. This checks every fact those reads depend on,
    so that loading the graph and searching or extending it stay within hnswlib's allocations.

    Parameters
    ----------
    data
        The bytes of a file written by hnswlib's ``saveIndex`` (Python ``Index.save_index``).
    count
        The number of elements the graph must hold: it must have been built with
        ``init_index(max_elements=count)`` and labels ``0 .. count-1``, each once.
    dimension
        The dimension of its vectors.

    Raises
    ------
    ValueError
        With a short message saying what is wrong with the graph (the caller adds where it came
        from), or that ``count`` or ``dimension`` are not positive.
    """
    if count < 1 or dimension < 1:
        raise ValueError(f"count {count} and dimension {dimension} must be at least 1")
    buf = memoryview(data).cast("B")
    size = len(buf)
    if size < _HEADER.size:
        raise ValueError(f"only {size} bytes, shorter than hnswlib's {_HEADER.size}-byte header")
    (
        offset_level0,
        max_elements,
        elements,
        record,
        label_offset,
        data_offset,
        max_level,
        enterpoint,
        max_m,
        max_m0,
        m,
        mult,
        ef_construction,
    ) = _HEADER.unpack_from(buf)
    _check_header(
        offset_level0, max_elements, elements, count, max_m, max_m0, m, mult, ef_construction
    )
    # The layout of a level-0 record: hnswlib takes it from the header, but reads the vector with
    # the dimension of its space, and a label as 8 bytes; all must agree.
    if data_offset != 4 * max_m0 + 4:
        raise ValueError(f"offsetData is {data_offset}, not 4*maxM0+4 = {4 * max_m0 + 4}")
    if label_offset != data_offset + 4 * dimension:
        raise ValueError(
            f"label_offset is {label_offset}, not {data_offset + 4 * dimension}"
            f" for vectors of dimension {dimension}"
        )
    if record != label_offset + 8:
        raise ValueError(
            f"size_data_per_element is {record}, not label_offset+8 = {label_offset + 8}"
        )
    if max_level < 0 or max_level > _MAX_LEVEL:
        raise ValueError(f"maxlevel is {max_level}, not between 0 and {_MAX_LEVEL}")
    if enterpoint >= count:
        raise ValueError(f"enterpoint is {enterpoint}, past its {count} elements")
    links_end = _HEADER.size + count * record
    if size < links_end:
        raise ValueError(f"truncated: {size} bytes end within the level-0 records ({links_end})")

    _check_level0(buf, count, record, max_m0, label_offset)
    lists = _walk_upper_lists(buf, links_end, count, max_m, max_level)
    _check_upper_levels(lists, count, max_m)
    # Searches start at the enterpoint's level-maxlevel list, which it must have.
    entry_level = int(lists.levels[enterpoint])
    if entry_level != max_level:
        raise ValueError(
            f"maxlevel is {max_level} but the enterpoint {enterpoint} has level {entry_level}"
        )


def _check_header(
    offset_level0: int,
    max_elements: int,
    elements: int,
    count: int,
    max_m: int,
    max_m0: int,
    m: int,
    mult: float,
    ef_construction: int,
) -> None:
    """The header's sizes and parameters, as ``init_index(max_elements=count)`` makes them."""
    if offset_level0 != 0:
        raise ValueError(f"offsetLevel0 is {offset_level0}, not 0")
    if elements != count:
        raise ValueError(f"holds {elements} elements, not the {count} expected")
    # loadIndex allocates max_elements records and ids up to it pass its own (off by one) check.
    if max_elements != count:
        raise ValueError(f"max_elements is {max_elements}, not its {count} elements")
    if not _MIN_M <= m <= _MAX_M:
        raise ValueError(f"M is {m}, not between {_MIN_M} and {_MAX_M}")
    if max_m != m:
        raise ValueError(f"maxM is {max_m}, not M = {m}")
    if max_m0 != 2 * m:
        raise ValueError(f"maxM0 is {max_m0}, not 2*M = {2 * m}")
    if not (math.isfinite(mult) and 0.0 < mult <= _MAX_MULT):
        raise ValueError(f"mult is {mult}, not a finite number in (0, 1/ln 2]")
    if not 1 <= ef_construction <= _MAX_EF_CONSTRUCTION:
        raise ValueError(
            f"ef_construction is {ef_construction}, not between 1 and {_MAX_EF_CONSTRUCTION}"
        )


def _field(buf: Any, count: int, record: int, offset: int, dtype: str, width: int = 0) -> npt.NDArray[Any]:
    """One field of every level-0 record, at ``offset`` in the record: a strided view of the
    buffer (no copy); ``width`` values of it each when given."""
    item = np.dtype(dtype).itemsize
    shape, strides = ((count, width), (record, item)) if width else ((count,), (record,))
    return np.ndarray(shape, dtype=dtype, buffer=buf, offset=_HEADER.size + offset, strides=strides)


def _check_level0(buf: memoryview, count: int, record: int, max_m0: int, label_offset: int) -> None:
    """The level-0 records: link counts, deleted marks, neighbour ids and labels."""
    link_counts = _field(buf, count, record, 0, "<u2").astype(np.intp)
    flags = _field(buf, count, record, 2, "|u1")
    ids: npt.NDArray[np.uint32] = _field(buf, count, record, 4, "<u4", max_m0)
    labels: npt.NDArray[np.uint64] = _field(buf, count, record, label_offset, "<u8")
    # The link header's low 2 bytes are the count; past maxM0, hnswlib would read the record's
    # vector, label and the following records as ids.
    over = np.flatnonzero(link_counts > max_m0)
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"element {i} lists {link_counts[i]} links at level 0, more than maxM0 = {max_m0}"
        )
    # A deleted mark (bit 0 of byte 2) is never in graphs of ours: they are saved compacted.
    marked = np.flatnonzero(flags & 1)
    if marked.size:
        raise ValueError(f"element {int(marked[0])} is marked deleted")
    # Only the first link_counts[i] ids are read; the others may be anything. hnswlib zeroes a
    # record when it adds it, and leaves valid ids behind when it shrinks a list, so rows with
    # an id past the end anywhere are rare: look at which of their ids are listed only for them.
    suspect = np.flatnonzero((ids >= count).any(axis=1))
    if suspect.size:
        listed = np.arange(max_m0) < link_counts[suspect, None]
        bad = listed & (ids[suspect] >= count)
        if bad.any():
            r, j = (int(k) for k in np.argwhere(bad)[0])
            i = int(suspect[r])
            raise ValueError(
                f"element {i} links to {ids[i, j]} at level 0, past its {count} elements"
            )
    out = np.flatnonzero(labels >= count)
    if out.size:
        i = int(out[0])
        raise ValueError(f"element {i} has label {labels[i]}, past its {count} elements")
    # ``count`` labels below ``count`` with none twice are each of 0 .. count-1 once.
    seen = np.bincount(labels.astype(np.intp), minlength=count)
    twice = np.flatnonzero(seen > 1)
    if twice.size:
        label = int(twice[0])
        first, second = (int(k) for k in np.flatnonzero(labels == label)[:2])
        raise ValueError(f"label {label} is on elements {first} and {second}")


@dataclass(frozen=True, slots=True)
class _UpperLists:
    """Where the upper-level lists are: their words, and per element its level and list."""

    words: npt.NDArray[np.uint32]  # the file after the level-0 records, as u32 words
    levels: npt.NDArray[np.intp]  # each element's level
    owners: npt.NDArray[np.intp]  # the elements with a level above 0, ascending
    firsts: npt.NDArray[np.intp]  # the word where each owner's level-1 list starts


def _walk_upper_lists(
    buf: memoryview, start: int, count: int, max_m: int, max_level: int
) -> _UpperLists:
    """Find each element's level and upper-level lists, refusing a wrong length or list size.

    Each element's ``linkListSize`` follows the previous element's lists, so the sizes have to be
    read one after another. Most are 0 (an element reaches level 1 with probability 1/M), and the
    zero sizes of consecutive elements are consecutive zero words: the walk jumps over each run of
    them at once, with the next nonzero word precomputed, and loops only over elements with
    lists.
    """
    block = 4 * max_m + 4
    size = len(buf)
    tail = size - start
    # No element has more than ``max_level`` lists: this bounds the work on a padded file.
    longest = count * (4 + max_level * block)
    if tail > longest:
        raise ValueError(
            f"{tail - longest} trailing bytes at least, past the longest lists"
            f" {count} elements of level up to {max_level} can have"
        )
    words: npt.NDArray[np.uint32] = np.frombuffer(buf, dtype="<u4", count=tail // 4, offset=start)
    n_words = len(words)
    positions = np.arange(n_words, dtype=np.int64)
    # next_set[p]: the first nonzero word at or after word p (n_words if there is none)
    next_set = np.minimum.accumulate(np.where(words != 0, positions, n_words)[::-1])[::-1]
    owners: list[int] = []
    sizes: list[int] = []
    firsts: list[int] = []
    i = p = 0  # element i's linkListSize is word p
    while i < count:
        if p >= n_words:
            raise ValueError(f"truncated: ends before the upper-level links of element {i}")
        q = int(next_set[p])
        if q - p >= count - i:  # the remaining elements are all of level 0
            p += count - i
            break
        if q == n_words:
            raise ValueError(f"truncated: ends before the upper-level links of element {i + q - p}")
        i += q - p
        list_size = int(words[q])
        # Checked before the jump, which would misalign the following words otherwise.
        if list_size % block:
            raise ValueError(
                f"element {i} has {list_size} bytes of upper-level links,"
                f" not a multiple of {block} (4*maxM+4)"
            )
        if list_size // block > max_level:
            raise ValueError(
                f"element {i} has level {list_size // block}, above maxlevel {max_level}"
            )
        owners.append(i)
        sizes.append(list_size)
        firsts.append(q + 1)
        i += 1
        p = q + 1 + list_size // 4
    end = start + 4 * p
    if end > size:
        raise ValueError(f"truncated: ends within the upper-level links of element {count - 1}")
    if end < size:
        raise ValueError(f"{size - end} trailing bytes after the last element's links")
    owner_ids = np.array(owners, dtype=np.intp)
    levels = np.zeros(count, dtype=np.intp)
    levels[owner_ids] = np.array(sizes, dtype=np.intp) // block
    return _UpperLists(words, levels, owner_ids, np.array(firsts, dtype=np.intp))


def _check_upper_levels(lists: _UpperLists, count: int, max_m: int) -> None:
    """The upper-level lists: link counts, neighbour ids and the levels of the neighbours."""
    if not lists.owners.size:
        return
    levels = lists.levels
    # One row per (element, level >= 1): the element, the level, and the list's first word.
    per_owner = levels[lists.owners]
    element = np.repeat(lists.owners, per_owner)
    first_row = np.cumsum(per_owner) - per_owner
    level = np.arange(element.size) - np.repeat(first_row, per_owner) + 1
    row_starts = np.repeat(lists.firsts, per_owner) + (level - 1) * (max_m + 1)
    rows = lists.words[row_starts[:, None] + np.arange(max_m + 1)]
    # Upper-level headers are just the count (2 bytes; the other two are unused).
    link_counts = (rows[:, 0] & 0xFFFF).astype(np.intp)
    over = np.flatnonzero(link_counts > max_m)
    if over.size:
        r = int(over[0])
        raise ValueError(
            f"element {element[r]} lists {link_counts[r]} links at level {level[r]},"
            f" more than maxM = {max_m}"
        )
    ids = rows[:, 1:]
    listed = np.arange(max_m) < link_counts[:, None]
    bad = listed & (ids >= count)
    if bad.any():
        r, j = (int(k) for k in np.argwhere(bad)[0])
        raise ValueError(
            f"element {element[r]} links to {ids[r, j]} at level {level[r]},"
            f" past its {count} elements"
        )
    # hnswlib follows a level-L link into the target's level-L list: the target must have one.
    targets = np.where(listed, ids, 0).astype(np.intp)
    low = listed & (levels[targets] < level[:, None])
    if low.any():
        r, j = (int(k) for k in np.argwhere(low)[0])
        target = int(targets[r, j])
        raise ValueError(
            f"element {element[r]} links to {target} at level {level[r]},"
            f" which has only level {levels[target]}"
        )


@dataclass(frozen=True, slots=True)
class GraphFile:
    """A checkpoint of an index's graph: its file, sequence number and checksum."""

    path: Path
    seq: int
    crc: int


def hnswlib() -> Any:
    """The hnswlib module, or an ImportError that says how to install it."""
    try:
        import hnswlib  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "HnswVectorStore needs hnswlib: pip install hnswlib (it builds with a C++ compiler)"
        ) from exc
    return hnswlib


def fsync_and_crc(path: Path) -> int:
    """Flush ``path`` to disk and return the CRC-32 of its bytes."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
        os.fsync(f.fileno())
    return crc


def fsync_dir(path: Path) -> None:
    """Flush the directory ``path`` (a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_graph(
    checkpoint: GraphFile, space: str, dimension: int
) -> tuple[Any, Labels, Mask, Callable[[npt.NDArray[np.intp]], Floats]]:
    """Load a checkpoint: the hnswlib graph, and from its level-0 records the labels, the
    deleted marks and a function returning the vectors of given records."""
    path = checkpoint.path
    with open(path, "rb") as f:
        crc = 0
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    if crc != checkpoint.crc:
        raise ValueError(
            f"{path}: checksum {crc:08x} does not match its name: the graph file is corrupt"
        )
    size = path.stat().st_size
    if size < _HEADER.size:
        raise ValueError(f"{path}: too short for an hnswlib graph")
    with open(path, "rb") as f:
        header = _HEADER.unpack(f.read(_HEADER.size))
    offset_level0, max_elements, count, record, label_offset, data_offset = header[:6]
    max_m0 = header[9]
    if (
        offset_level0 != 0
        or count > max_elements
        or data_offset != 4 * max_m0 + 4
        or label_offset != data_offset + 4 * dimension
        or record != label_offset + 8
        or size < _HEADER.size + count * record
    ):
        raise ValueError(f"{path}: not an hnswlib graph of dimension {dimension}")
    graph = hnswlib().Index(space=space, dim=dimension)
    try:
        graph.load_index(str(path), allow_replace_deleted=True)
    except RuntimeError as exc:
        raise ValueError(f"{path}: hnswlib cannot load it ({exc})") from exc
    records = np.memmap(path, dtype=np.uint8, mode="r", offset=_HEADER.size, shape=(count, record))
    labels = (
        np.ascontiguousarray(records[:, label_offset : label_offset + 8])
        .view("<u8")
        .ravel()
        .astype(np.int64)
    )
    # The deleted mark is bit 0 of the third byte of a record's level-0 link header.
    deleted = (records[:, 2] & 1).astype(np.bool_)

    def vectors(positions: npt.NDArray[np.intp]) -> Floats:
        raw = np.ascontiguousarray(records[positions, data_offset:label_offset])
        return raw.view("<f4").reshape(len(positions), dimension).astype(np.float32)

    return graph, labels, deleted, vectors


def reachable(data: bytes | memoryview, *, count: int, dimension: int) -> Mask:
    """Which labels a walk over level 0 from the entry point reaches, for a graph that
    :func:`check_graph` accepted.

    A search goes down the levels and then spreads over level 0 from where it landed: an
    element no level-0 link leads to from the entry point is found by no search. hnswlib's
    own graphs rarely have such elements; a forged one can hide any it likes this way.
    """
    header = _HEADER.unpack_from(data, 0)
    record, label_offset = header[3], header[4]
    enterpoint, max_m0 = header[7], header[9]
    listed = _field(data, count, record, 0, "<u2")
    links = _field(data, count, record, 4, "<u4", max_m0)
    valid = np.arange(max_m0) < listed[:, None]
    seen = np.zeros(count, dtype=np.bool_)
    seen[enterpoint] = True
    frontier = np.array([enterpoint], dtype=np.int64)
    while len(frontier):
        found = np.unique(links[frontier][valid[frontier]])
        frontier = found[~seen[found]].astype(np.int64)
        seen[frontier] = True
    labels = _field(data, count, record, label_offset, "<u8")
    out = np.zeros(count, dtype=np.bool_)
    out[labels[seen].astype(np.int64)] = True
    return out


def stored_vectors(data: bytes | memoryview, *, count: int, dimension: int) -> tuple[Labels, Floats]:
    """The labels and the vectors of a graph's elements, by element (the vectors a view of
    ``data``), for a graph that :func:`check_graph` accepted."""
    header = _HEADER.unpack_from(data, 0)
    record, label_offset, data_offset = header[3], header[4], header[5]
    labels = _field(data, count, record, label_offset, "<u8").astype(np.int64)
    return labels, _field(data, count, record, data_offset, "<f4", dimension)
