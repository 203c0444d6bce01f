"""hnswlib graph files of the vector store: loading one (checked against the checksum in its
name and against hnswlib's header, read without copying its records), and making a written one
durable."""

from __future__ import annotations

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

__all__ = ["GraphFile", "fsync_and_crc", "fsync_dir", "hnswlib", "read_graph"]

# hnswlib's file header (hnswalg.h saveIndex): offsetLevel0, max_elements, cur_element_count,
# size_data_per_element, label_offset, offsetData (size_t), maxlevel (int), enterpoint (uint32),
# maxM, maxM0, M (size_t), mult (double), ef_construction (size_t); then the level-0 records.
_HEADER = struct.Struct("<6QiI3QdQ")


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
