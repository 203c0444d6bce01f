"""A BM25 index's checkpoint: its postings and documents as one segment file beside it.

Loading the postings of a 20k-document index from DuckDB takes a second or more, and each
search then fetches its hits' text from DuckDB (most of a search's time). A checkpoint is the
index written as a segment (the format of published indexes, ``_segments.py``) next to the
DuckDB file, at the index's current version; the segment is mapped, not read, so:

* a reopened index whose version is still the checkpoint's takes its postings from the mapping
  (no load at all);
* the text of a hit comes from the mapping whenever the checkpoint holds its document. Document
  numbers are never reused (a replaced document gets a new one), so a document number found in
  any checkpoint, current or not, names the same text.

The checkpoint is only ever an accelerator: DuckDB stays the record. A missing, stale, damaged
or foreign checkpoint is ignored (and replaced at the next write of one).
"""

from __future__ import annotations

import base64
import contextlib
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SearchIndexError
from ._scoring import positions
from ._segments import Segment, check_postings, encode_segment

__all__ = ["Checkpoint", "open_checkpoint", "write_checkpoint"]



@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A mapped checkpoint: the segment, the index version it was written at, and the
    document number of each slot (ascending)."""

    segment: Segment
    version: int
    docs: npt.NDArray[np.int64]

    def slots_of_docs(self, docs: Sequence[int]) -> list[int]:
        """The slot holding each of the document numbers ``docs``, -1 for one it lacks."""
        at, present = positions(self.docs, np.asarray(docs, dtype=np.int64))
        return np.where(present, at, -1).tolist()  # type: ignore[no-any-return]


def _encode_docs(docs: npt.NDArray[np.int64]) -> str:
    steps = np.diff(docs, prepend=np.int64(0)).astype("<i8")
    return base64.b64encode(zlib.compress(steps.tobytes(), 1)).decode("ascii")


def _decode_docs(text: str, count: int) -> npt.NDArray[np.int64]:
    raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    steps = np.frombuffer(raw, dtype="<i8")
    if len(steps) != count:
        raise ValueError(f"{len(steps)} document numbers for {count} documents")
    return np.cumsum(steps).astype(np.int64)


def write_checkpoint(
    path: str,
    *,
    version: int,
    tokenize: dict[str, Any],
    identity: dict[str, Any],
    keys: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    slots: npt.NDArray[np.integer],
    tfs: npt.NDArray[np.integer],
    docs: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.integer],
    rows: Sequence[tuple[str, bytes, str | None, int | None]],
) -> None:
    """Write the checkpoint ``path`` atomically (a temporary file renamed over it).

    ``identity`` names the index (its instance and BM25 parameters): a reader finding another
    ignores the file. ``keys``/``starts``/``slots``/``tfs`` are the term-sorted postings
    (CSR), slots numbering ``docs`` (ascending document numbers); ``rows`` are each slot's
    ``(id, packed content, metadata JSON, start line offset)``, content as the index stores
    it.
    """
    data = encode_segment(
        tokenize=tokenize,
        terms=keys,
        starts=starts,
        slots=slots,
        tfs=tfs,
        lengths=lengths,
        ids=[row[0].encode("utf-8", "surrogatepass") for row in rows],
        contents=[row[1] for row in rows],
        metadata=[(row[2] or "").encode() for row in rows],
        start_lines=np.array([row[3] or 0 for row in rows], dtype="<i8"),
        has_start_line=np.array([row[3] is not None for row in rows], dtype=np.uint8),
        # (A checkpoint records no source files: the index's own tables do.)
        header={"checkpoint": {"version": int(version), "docs": _encode_docs(docs), "of": identity}},
    )
    temporary = f"{path}.{os.getpid()}.tmp"
    _remove_left_temporaries(path, keep=temporary)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _remove_left_temporaries(path: str, keep: str) -> None:
    """Delete the temporary checkpoints (``<path>.<pid>.tmp``) a writer killed while writing
    left: each is as large as a checkpoint. Only the one process writing the index writes its
    checkpoint (DuckDB lets one process open a file for writing), so any other is left over."""
    directory, name = os.path.split(path)
    try:
        entries = os.listdir(directory or ".")
    except OSError:
        return
    for entry in entries:
        pid = entry[len(name) + 1 : -len(".tmp")]
        if entry.startswith(name + ".") and entry.endswith(".tmp") and pid.isdigit():
            where = os.path.join(directory, entry)
            if where != keep:
                with contextlib.suppress(OSError):
                    os.unlink(where)


def open_checkpoint(
    path: str, tokenize: dict[str, Any], identity: dict[str, Any]
) -> Checkpoint | None:
    """Map the checkpoint ``path``; None when there is none, or it cannot be used (damaged,
    of another index (``identity`` differs: instance, k1, b) or other tokenizer options, not
    a checkpoint)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # none there (or a link someone put there: not followed)
    try:
        segment = Segment.open(f"/proc/self/fd/{fd}")
    except (SearchIndexError, OSError, ValueError):
        return None
    finally:
        os.close(fd)
    info = segment.header.get("checkpoint")
    try:
        if not isinstance(info, dict) or segment.tokenize != tokenize or info.get("of") != identity:
            raise ValueError("not a checkpoint of this index")
        docs = _decode_docs(str(info["docs"]), segment.n_docs)
        version = int(info["version"])
        if len(docs) > 1 and not bool(np.all(docs[1:] > docs[:-1])):
            raise ValueError("its document numbers are not ascending")
        check_postings(segment)
    except (KeyError, TypeError, ValueError, zlib.error, SearchIndexError):
        segment.close()
        return None
    return Checkpoint(segment, version, docs)

