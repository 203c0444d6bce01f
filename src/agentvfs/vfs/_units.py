"""Text measured as JavaScript measures it: in UTF-16 code units.

The reference counts string lengths, cut points, columns and sort order in UTF-16 code
units, where a character beyond U+FFFF (an emoji) is two. Text is put in that form once
(:func:`to_units`: each such character written as its two surrogates), measured, cut and
compared as ordinary Python strings, and turned back with :func:`from_units`. Comparing two
strings in unit form compares them in JavaScript's order.
"""

from __future__ import annotations

import re

__all__ = ["from_units", "to_units", "unit_length"]

_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _split_pair(match: re.Match[str]) -> str:
    code = ord(match.group()) - 0x10000
    return chr(0xD800 + (code >> 10)) + chr(0xDC00 + (code & 0x3FF))


def to_units(text: str) -> str:
    """``text`` as JavaScript sees it: every astral character as its two surrogates."""
    return text if text.isascii() else _ASTRAL.sub(_split_pair, text)


def from_units(text: str) -> str:
    """Undo :func:`to_units`: surrogate pairs become characters again, and a surrogate left
    alone (a cut through a pair) becomes U+FFFD, as JavaScript's UTF-8 encoder writes it."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def unit_length(text: str) -> int:
    """The length of ``text`` in UTF-16 code units (JavaScript's ``length``)."""
    return len(text) if text.isascii() else len(text) + len(_ASTRAL.findall(text))
