"""Glob helpers with the reference's semantics (picomatch-like: ``**``, braces, extglob)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wcmatch import glob as _wc

__all__ = ["create_glob_matcher", "extract_glob_base", "is_glob_pattern"]

_GLOB_CHARS = frozenset("*?{}[]")


def is_glob_pattern(value: str) -> bool:
    """Tell whether ``value`` holds any of ``* ? { } [ ]``."""
    return any(c in _GLOB_CHARS for c in value)


def extract_glob_base(pattern: str) -> str:
    """The directory a glob starts from: ``docs/**/*.md`` -> ``docs``, ``**/*.md`` -> ``.``.

    The prefix before the first glob character is cut at its last ``/``; no slash, or only a
    leading one, gives ``.``; a pattern without glob characters is returned as it is.
    """
    first = next((i for i, c in enumerate(pattern) if c in _GLOB_CHARS), -1)
    if first < 0:
        return pattern
    cut = pattern.rfind("/", 0, first)
    if cut <= 0:
        return "."
    return pattern[:cut]


def _strip(path: str) -> str:
    if path.startswith("./"):
        return path[2:]
    return path[1:] if path.startswith("/") else path


def create_glob_matcher(patterns: str | Sequence[str], *, dot: bool = False) -> Callable[[str], bool]:
    """Return ``match(path)`` for one or more globs; a leading ``./`` or ``/`` is ignored on
    both sides, and names starting with ``.`` match only with ``dot``."""
    items = [patterns] if isinstance(patterns, str) else list(patterns)
    cleaned = [_strip(p) for p in items]
    flags = _wc.GLOBSTAR | _wc.BRACE | _wc.EXTGLOB | (_wc.DOTGLOB if dot else 0)

    def match(path: str) -> bool:
        return bool(_wc.globmatch(_strip(path), cleaned, flags=flags))

    return match
