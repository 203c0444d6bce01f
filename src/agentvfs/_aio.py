"""Small helpers for user callables that may be sync or async."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["maybe_await"]


async def maybe_await(value: Any) -> Any:
    """``value`` itself, or what it resolves to when it is awaitable (a hook, resolver or
    callback may be a plain function or a coroutine function)."""
    return await value if inspect.isawaitable(value) else value
