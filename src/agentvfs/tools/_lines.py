"""Line utilities of the reference's tools: ranges, numbering and literal replacement."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StringNotFoundError, StringNotUniqueError

__all__ = [
    "MAX_REPORTED_OCCURRENCES",
    "LineRange",
    "Replacement",
    "extract_lines",
    "format_with_line_numbers",
    "line_numbers",
    "nth_newline",
    "replace_string",
]

#: Offsets of replaced occurrences :func:`replace_string` reports (edit_file names their
#: lines); further occurrences are replaced and counted, not listed.
MAX_REPORTED_OCCURRENCES = 1000

@dataclass(frozen=True, slots=True)
class LineRange:
    """The lines ``start``..``end`` (1-based, inclusive) of ``total``; ``0-0`` when empty."""

    lines: list[str]
    start: int
    end: int
    total: int


def extract_lines(content: str, offset: int | None = None, limit: int | None = None) -> LineRange:
    """Cut ``content`` (split on ``\\n``; a trailing newline makes a last empty line) to a range.

    ``start = max(1, offset or 1)``, ``end = min(total, start + limit - 1)``; a start past the
    end gives no lines and the range ``0-0``.
    """
    lines = content.split("\n")
    total = len(lines)
    start = max(1, offset or 1)
    end = total if limit is None else min(total, start + limit - 1)
    if start > end:
        return LineRange([], 0, 0, total)
    return LineRange(lines[start - 1 : end], start, end, total)


def format_with_line_numbers(lines: list[str], start: int) -> str:
    """Number lines as ``     1→text``: right-aligned to ``max(6, digits of the last + 1)``."""
    if not lines:
        return ""
    width = max(6, len(str(start + len(lines) - 1)) + 1)
    return "\n".join(f"{str(start + i).rjust(width)}→{line}" for i, line in enumerate(lines))


@dataclass(frozen=True, slots=True)
class Replacement:
    """What :func:`replace_string` did."""

    #: The new content.
    text: str
    #: Offsets (in the old content, ascending) of the first
    #: :data:`MAX_REPORTED_OCCURRENCES` occurrences replaced.
    positions: list[int]
    #: How many occurrences were replaced.
    count: int


def replace_string(content: str, old: str, new: str, *, replace_all: bool = False) -> Replacement:
    """Replace ``old`` literally (no pattern expansion) and say where.

    Occurrences do not overlap. The work is linear in the content whatever the number of
    occurrences (only the first :data:`MAX_REPORTED_OCCURRENCES` offsets are kept).

    Raises
    ------
    StringNotFoundError
        ``old`` is empty or absent.
    StringNotUniqueError
        ``old`` occurs more than once and ``replace_all`` is False.
    """
    if not old:
        raise StringNotFoundError
    count = content.count(old)
    if not count:
        raise StringNotFoundError
    if count > 1 and not replace_all:
        raise StringNotUniqueError(count)
    first = content.find(old)
    if not replace_all:
        return Replacement(content[:first] + new + content[first + len(old) :], [first], 1)
    positions: list[int] = []
    at = first
    while at >= 0 and len(positions) < MAX_REPORTED_OCCURRENCES:
        positions.append(at)
        at = content.find(old, at + len(old))
    return Replacement(content.replace(old, new), positions, count)


def line_numbers(content: str, offsets: list[int]) -> list[int]:
    """The 1-based line of each of ``offsets`` (ascending), counting each newline once."""
    out: list[int] = []
    line, last = 1, 0
    for at in offsets:
        line += content.count("\n", last, at)
        last = at
        out.append(line)
    return out


def nth_newline(text: str, n: int, start: int = 0) -> int:
    """The offset of the ``n``-th ``\\n`` (``n >= 1``) at or after ``start``, or -1 when there
    are fewer; without splitting ``text`` into lines (slices are counted in C)."""
    step = 1 << 16
    pos = start
    while pos < len(text):
        stop = min(len(text), pos + step)
        here = text.count("\n", pos, stop)
        if here >= n:
            at = pos - 1
            for _ in range(n):
                at = text.find("\n", at + 1, stop)
            return at
        n -= here
        pos = stop
    return -1
