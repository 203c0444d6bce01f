"""Public namespaces name themselves as the home of what they export."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, MutableMapping
from typing import Any

__all__ = ["fixup_module_metadata"]


def fixup_module_metadata(
    module_name: str, namespace: MutableMapping[str, Any], names: Iterable[str] | None = None
) -> None:
    """Set ``__module__`` of a namespace's public objects to the namespace itself.

    Implementation modules are private (``agentvfs.vfs._fsspec``); the documented home of a
    name is the public package that exports it (``agentvfs.vfs``), and reprs, tracebacks,
    pickles and documentation should say so. Objects a namespace only re-exports from another
    public module (the errors every subpackage re-exports from :mod:`agentvfs.errors`) keep
    their module.

    Parameters
    ----------
    module_name : str
        The public package, its ``__name__``.
    namespace : mapping
        Its ``globals()``.
    names : iterable of str, optional
        The names to fix: by default those of ``__all__`` that a private module of this
        package defines; names given explicitly are fixed wherever in the package they are
        defined.
    """
    explicit = names is not None
    private = module_name + "._"
    inside = module_name + "."
    for name in namespace["__all__"] if names is None else names:
        obj = namespace[name]
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or hasattr(obj, "__wrapped__")):
            # A constant or an instance: its module is its class's, fixed there. (A function
            # behind a caching decorator has ``__wrapped__`` and a module of its own.)
            continue
        home = obj.__module__
        if home.startswith(private) or (explicit and home.startswith(inside)):
            obj.__module__ = module_name
