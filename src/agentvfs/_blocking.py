"""The synchronous facade returned by ``Workspace.blocking()``."""

from __future__ import annotations

import functools
import inspect
import weakref
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from .vfs import WorkspaceFilesystem

if TYPE_CHECKING:
    from .workspace import Workspace

__all__ = ["BlockingProxy", "BlockingWorkspace"]


class BlockingProxy:
    """Expose an async object's coroutine methods as plain blocking methods.

    Calls run on the facade's own event loop in a helper thread, so it works in a plain
    script and inside a notebook whose main thread already runs a loop.
    """

    def __init__(self, target: Any, portal: BlockingPortal) -> None:
        self._target = target
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):

            @functools.wraps(value)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._portal.call(functools.partial(value, *args, **kwargs))

            return call
        if isinstance(value, WorkspaceFilesystem):
            return BlockingProxy(value, self._portal)
        return value

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"


class BlockingWorkspace(BlockingProxy):
    """``Workspace`` with blocking methods: ``ws.filesystem.read_file("a.txt")`` returns bytes.

    Use as ``with Workspace(...).blocking() as ws:`` (init on enter, destroy on exit), or
    call :meth:`close` when done.
    """

    def __init__(self, workspace: Workspace) -> None:
        self._cm: AbstractContextManager[BlockingPortal] = start_blocking_portal()
        portal = self._cm.__enter__()
        super().__init__(workspace, portal)
        # The helper thread must end with the interpreter even if close() is forgotten.
        self._finalizer = weakref.finalize(self, self._cm.__exit__, None, None, None)

    @property
    def workspace(self) -> Workspace:
        """The async workspace behind the facade."""
        return self._target  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the helper event loop (the workspace itself is left as it is)."""
        self._finalizer()

    def __enter__(self) -> BlockingWorkspace:
        self._portal.call(self._target.init)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._portal.call(self._target.destroy)
        finally:
            self.close()
