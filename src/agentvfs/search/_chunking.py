"""Splitting files into chunks for indexing (reference §15.5).

A file of at most 4,000 characters is one document; a longer one becomes documents
``<path>#chunk-<i>`` of whole lines (the joining newlines count). Each chunk takes lines
until the next one would not fit, and the next chunk starts three lines before it ended, so a
match near a boundary is found in full. That rule applies to the last chunk too: after the
chunk that reaches the end, one more chunk repeats the file's last three lines (a chunk of
at most three lines has no successor, as stepping back would not move forward).

A single line longer than the limit is a chunk of its own, cut into pieces that all start on
its line; the chunk after it starts on the next line. The chunk before it still steps back,
so its last three lines come again as a chunk of their own.

Lengths are counted as JavaScript counts them, in UTF-16 code units (a character outside the
Basic Multilingual Plane counts twice), so the cut points match the reference's.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from dataclasses import dataclass

from ..vfs import from_units, to_units, unit_length

__all__ = ["MAX_CHUNK_CHARS", "OVERLAP_LINES", "Chunk", "split_into_chunks"]

MAX_CHUNK_CHARS = 4000
OVERLAP_LINES = 3


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a file: its text and the 1-based number of its first line."""

    content: str
    start_line: int


def _cut(line: str, size: int) -> list[str]:
    """``line`` in pieces of ``size`` UTF-16 code units; a cut through a surrogate pair
    leaves each half as U+FFFD (what a lone half becomes once encoded)."""
    units = to_units(line)
    return [from_units(units[at : at + size]) for at in range(0, len(units), size)]


def split_into_chunks(
    content: str, max_chunk_chars: int = MAX_CHUNK_CHARS, overlap_lines: int = OVERLAP_LINES
) -> list[Chunk]:
    """Split ``content`` into chunks of at most ``max_chunk_chars`` characters.

    Parameters
    ----------
    content : str
        The text of one file.
    max_chunk_chars : int
        The largest chunk in UTF-16 code units, newlines included.
    overlap_lines : int
        Lines each chunk repeats from the end of the one before.

    Returns
    -------
    list of Chunk
        ``[Chunk(content, 1)]`` when the whole text fits (an empty file included).

    Raises
    ------
    ValueError
        ``max_chunk_chars`` is not positive or ``overlap_lines`` is negative.
    """
    if max_chunk_chars < 1:
        raise ValueError(f"max_chunk_chars must be positive, got {max_chunk_chars}")
    if overlap_lines < 0:
        raise ValueError(f"overlap_lines must not be negative, got {overlap_lines}")
    if unit_length(content) <= max_chunk_chars:
        return [Chunk(content, 1)]
    lines = content.split("\n")
    sizes = map(len, lines) if content.isascii() else map(unit_length, lines)
    # ends[i]: the length of lines[:i] joined, plus one (a newline after each line), so the
    # lines start..end-1 joined take ends[end] - ends[start] - 1 units.
    ends = [0, *itertools.accumulate(map(operator.add, sizes, itertools.repeat(1)))]
    chunks: list[Chunk] = []
    start = 0
    while start < len(lines):
        # As many lines as fit, and the first line however long, so every chunk moves on.
        end = max(start + 1, bisect.bisect_right(ends, ends[start] + max_chunk_chars + 1) - 1)
        if ends[end] - ends[start] - 1 <= max_chunk_chars:
            chunks.append(Chunk("\n".join(lines[start:end]), start + 1))
        else:
            # Only a single over-long line gets here: cut it into pieces on its line number.
            chunks.extend(Chunk(piece, start + 1) for piece in _cut(lines[start], max_chunk_chars))
        back = end - overlap_lines
        start = back if back > start else end
    return chunks
