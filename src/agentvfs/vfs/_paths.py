"""Workspace path normalisation: one place that decides what a path may name."""

from __future__ import annotations

from ..errors import InvalidPathError, NameTooLongError, PermissionDenied

__all__ = [
    "MAX_NAME_BYTES",
    "basename",
    "check_name",
    "dirname",
    "join",
    "normalize",
]

MAX_NAME_BYTES = 255


def check_name(path: str) -> None:
    """Refuse what no backend can store: non-text paths, NUL bytes, names over 255 bytes.

    Raises
    ------
    InvalidPathError
        ``EINVAL``: not a ``str`` or contains a NUL byte.
    NameTooLongError
        ``ENAMETOOLONG``: a segment is longer than 255 bytes in UTF-8.
    """
    if not isinstance(path, str):
        raise InvalidPathError(repr(path), f"expected str, got {type(path).__name__}")
    if "\0" in path:
        raise InvalidPathError(path, "contains a NUL byte")
    # UTF-8 spends at most 4 bytes a character, so a path of 63 characters or fewer cannot
    # hold a segment over 255 bytes: skip the encoding on the common short path.
    if len(path) > MAX_NAME_BYTES // 4:
        for segment in path.split("/"):
            if len(segment.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
                raise NameTooLongError(path)


def normalize(path: str) -> str:
    """Turn a workspace path into its canonical root-relative form (``""`` is the root).

    ``/`` separates segments; ``.``, empty segments and a leading ``/`` are dropped (a leading
    ``/`` means the workspace root); ``..`` climbs but never above the root.

    Raises
    ------
    PermissionDenied
        ``EACCES``: ``..`` would leave the root (message ``Permission denied: access on <p>``).
    InvalidPathError, NameTooLongError
        See :func:`check_name`.
    """
    check_name(path)
    # Fast path for the common already-clean relative path: no work beyond the checks.
    if path and path[0] != "/" and path[-1] != "/" and "//" not in path:
        wrapped = f"/{path}/"
        if "/./" not in wrapped and "/../" not in wrapped:
            return path
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise PermissionDenied(path, "access")
            parts.pop()
            continue
        parts.append(segment)
    return "/".join(parts)


def join(base: str, name: str) -> str:
    """Join two normalised paths (either may be the root ``""``)."""
    if not base:
        return name
    if not name:
        return base
    return f"{base}/{name}"


def dirname(path: str) -> str:
    """Return the parent of a normalised path (``""`` for top-level names)."""
    cut = path.rfind("/")
    return path[:cut] if cut >= 0 else ""


def basename(path: str) -> str:
    """Return the last segment of a normalised path."""
    return path[path.rfind("/") + 1 :]
