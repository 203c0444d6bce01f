"""``RequestContext``: per-request values that resolvers and tools receive."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

__all__ = ["RequestContext"]


class RequestContext(MutableMapping[str, Any]):
    """A mutable mapping of request-scoped values (user id, tenant, ...).

    Resolved filesystems and sandboxes are memoised per context object, so one request
    resolves each provider once. Contexts compare and hash by identity for that reason.

    Parameters
    ----------
    items : mapping or iterable of pairs, optional
        Initial values: ``RequestContext([("user-id", "alice")])``.
    """

    __slots__ = ("__weakref__", "_data", "_memo")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        self._data: dict[str, Any] = dict(items)
        self._memo: dict[Any, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value for ``key`` or ``default``."""
        return self._data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value``."""
        self._data[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._data[key] = value

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"RequestContext({list(self._data.items())!r})"
