"""Splitting files into chunks for indexing (reference §15.5).

A file of at most 4,000 characters is one document; a longer one becomes documents
``<path>#chunk-<i>`` of whole lines (the joining newlines count), each starting three lines
before the previous one ended so a match near a boundary is found in full. A single line
longer than the limit is cut into pieces that share its line number.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_CHUNK_CHARS", "OVERLAP_LINES", "Chunk", "split_into_chunks"]

MAX_CHUNK_CHARS = 4000
OVERLAP_LINES = 3


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a file: its text and the 1-based number of its first line."""

    content: str
    start_line: int


def split_into_chunks(
    content: str, max_chunk_chars: int = MAX_CHUNK_CHARS, overlap_lines: int = OVERLAP_LINES
) -> list[Chunk]:
    """Split ``content`` into chunks of at most ``max_chunk_chars`` characters.

    Parameters
    ----------
    content : str
        The text of one file.
    max_chunk_chars : int
        The largest chunk, newlines included.
    overlap_lines : int
        Lines each chunk repeats from the end of the one before.

    Raises
    ------
    ValueError
        ``max_chunk_chars`` is not positive or ``overlap_lines`` is negative.
    """
    if max_chunk_chars < 1:
        raise ValueError(f"max_chunk_chars must be positive, got {max_chunk_chars}")
    if overlap_lines < 0:
        raise ValueError(f"overlap_lines must not be negative, got {overlap_lines}")
    if len(content) <= max_chunk_chars:
        return [Chunk(content, 1)]
    lines = content.split("\n")
    chunks: list[Chunk] = []
    i = 0
    while i < len(lines):
        start = i
        taken: list[str] = []
        size = 0
        while i < len(lines):
            line = lines[i]
            if not taken and len(line) > max_chunk_chars:
                # One over-long line: pieces of it, all starting on its line.
                for at in range(0, len(line), max_chunk_chars):
                    chunks.append(Chunk(line[at : at + max_chunk_chars], i + 1))
                i += 1
                break
            extra = len(line) + (1 if taken else 0)
            if taken and size + extra > max_chunk_chars:
                break
            taken.append(line)
            size += extra
            i += 1
        if taken:
            chunks.append(Chunk("\n".join(taken), start + 1))
        if i >= len(lines):
            break
        back = i - overlap_lines
        # Step back for the overlap, unless that would not move past this chunk's start.
        if back > start and taken:
            i = back
    return chunks
