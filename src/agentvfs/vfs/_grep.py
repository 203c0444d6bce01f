"""Line-oriented regular-expression search shared by the backends' ``grep``."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._records import GrepFileResult, GrepMatch

__all__ = ["compile_pattern", "grep_lines"]


def compile_pattern(pattern: str, *, case_sensitive: bool) -> re.Pattern[str]:
    """Compile a Python regular expression, ignoring case unless ``case_sensitive``."""
    return re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)


def grep_lines(
    path: str,
    data: bytes,
    regex: re.Pattern[str],
    *,
    max_count: int | None,
    context_lines: int,
    budget: int | None,
) -> GrepFileResult | None:
    """Search one file's bytes (decoded as UTF-8, bad bytes replaced) line by line.

    The first match on a line counts; ``max_count`` caps matches in this file and ``budget``
    what is left of the global cap. Returns None when nothing matched.
    """
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    matches: list[GrepMatch] = []
    limit = min(x for x in (max_count, budget, len(lines)) if x is not None)
    for number, line in _numbered(lines):
        found = regex.search(line)
        if found is None:
            continue
        start = number - 1
        matches.append(
            GrepMatch(
                line=number,
                column=found.start(),
                text=line,
                before=tuple(lines[max(0, start - context_lines) : start]) if context_lines else (),
                after=tuple(lines[start + 1 : start + 1 + context_lines]) if context_lines else (),
            )
        )
        if len(matches) >= limit:
            break
    return GrepFileResult(path=path, matches=tuple(matches)) if matches else None


def _numbered(lines: list[str]) -> Iterable[tuple[int, str]]:
    return enumerate(lines, start=1)
