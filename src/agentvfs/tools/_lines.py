"""Line utilities of the reference's tools: ranges, numbering and literal replacement."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LineRange",
    "StringNotFoundError",
    "StringNotUniqueError",
    "extract_lines",
    "format_with_line_numbers",
    "replace_string",
]

NOT_FOUND_MESSAGE = "The specified text was not found. Make sure you use the exact text from the file."


class StringNotFoundError(ValueError):
    """``old_string`` does not occur (edit_file returns this message rather than raising)."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND_MESSAGE)


class StringNotUniqueError(ValueError):
    """``old_string`` occurs more than once and ``replace_all`` is False."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"The specified text appears {count} times. Provide more surrounding context to make "
            "the match unique, or use replace_all to replace all occurrences."
        )
        self.count = count


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


def replace_string(content: str, old: str, new: str, *, replace_all: bool = False) -> tuple[str, list[int]]:
    """Replace ``old`` literally (no pattern expansion); return the text and the match offsets.

    Raises
    ------
    StringNotFoundError
        ``old`` is empty or absent.
    StringNotUniqueError
        ``old`` occurs more than once and ``replace_all`` is False.
    """
    if not old:
        raise StringNotFoundError
    positions: list[int] = []
    at = content.find(old)
    while at >= 0:
        positions.append(at)
        at = content.find(old, at + len(old))
    if not positions:
        raise StringNotFoundError
    if len(positions) > 1 and not replace_all:
        raise StringNotUniqueError(len(positions))
    if not replace_all:
        return content[: positions[0]] + new + content[positions[0] + len(old) :], positions[:1]
    return content.replace(old, new), positions
