"""Document ids: which file a chunk belongs to, and a path as a published index names it.

A long file is indexed as chunks ``<path>#chunk-<i>`` (``_chunking.py``); removing or
replacing a file means every document whose id is the path or one of its chunk ids. A
published index names files from its source root, ``/`` first; a workspace names them as its
patterns do (``docs/a.md``, ``./docs/a.md`` or ``/docs/a.md``): :func:`shared_path` is the
one form both are compared in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["CHUNK_ID", "relative_names", "shared_path", "source_of"]

#: ``<source>#chunk-<digits>``: the id of a chunk of the file ``<source>``.
CHUNK_ID = re.compile(r"(.*)#chunk-[0-9]+", re.DOTALL)


def source_of(id: str) -> str:
    """The file a document id belongs to: ``a.md`` for ``a.md#chunk-3``, else the id."""
    match = CHUNK_ID.fullmatch(id)
    return match.group(1) if match is not None else id


def relative_names(id: str, metadata: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """A published document's id and metadata (``/docs/a.md``, chunks' ``source_file`` too) as
    a workspace of relative paths names its own: without the leading ``/``."""
    source = (metadata or {}).get("source_file")
    if isinstance(source, str) and source.startswith("/"):
        metadata = {**(metadata or {}), "source_file": source.lstrip("/")}
    return id.lstrip("/"), dict(metadata) if metadata is not None else None


def shared_path(path: str) -> str:
    """A workspace path as a published index names it: ``/`` first (``docs/a.md``,
    ``./docs/a.md`` and ``/docs/a.md`` are one file)."""
    if path.startswith("./"):
        path = path[2:]
    return "/" + path.lstrip("/")
