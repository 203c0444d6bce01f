"""A sandbox provider as the workspace sees it.

Providers are duck-typed, as in the behavioural reference: a ``LocalSandbox``, or any object
with ``execute_command`` and whichever optional abilities it has (lifecycle methods, a mount
manager, a working directory, instructions, information). Every optional ability is looked
up here, once per question, and comes back typed; the workspace never calls ``getattr`` on a
provider itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from ._aio import maybe_await
from ._context import RequestContext
from .vfs import WorkspaceFilesystem

__all__ = ["MountEntryView", "MountManagerView", "SandboxView", "call_lifecycle"]


async def call_lifecycle(provider: Any, method: str) -> None:
    """Call ``provider.<method>()`` if it exists (plain objects without lifecycle are fine)."""
    fn = getattr(provider, method, None)
    if callable(fn):
        await maybe_await(fn())


class MountEntryView(Protocol):
    """One mount of a sandbox's mount manager: what instructions say about it."""

    filesystem: WorkspaceFilesystem | None
    state: str


class MountManagerView(Protocol):
    """A sandbox's mount manager (``sandbox.mounts``): the filesystems it mounts into the
    sandbox when it starts, by mount path."""

    @property
    def entries(self) -> Mapping[str, Any]: ...

    def set_context(self, *, sandbox: Any, workspace: Any) -> None: ...

    def add(self, mounts: Mapping[str, WorkspaceFilesystem]) -> None: ...

    def set_on_mount(self, hook: Callable[..., Any] | None) -> None: ...


class SandboxView:
    """The optional abilities of one sandbox provider.

    Parameters
    ----------
    sandbox : object
        The provider.
    """

    __slots__ = ("sandbox",)

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    @property
    def mounts(self) -> MountManagerView | None:
        """Its mount manager, if it has one (a provider's own manager is taken as it is: one
        that cannot add mounts fails loudly when mounts are configured, never silently)."""
        return cast("MountManagerView | None", getattr(self.sandbox, "mounts", None))

    @property
    def mount_entries(self) -> Mapping[str, MountEntryView]:
        """Its mounts by mount path (empty without a manager; a manager that only lists
        its mounts is enough here)."""
        entries = getattr(getattr(self.sandbox, "mounts", None), "entries", None)
        return entries or {}

    @property
    def working_directory(self) -> str | None:
        """Where its commands run, if it says."""
        value = getattr(self.sandbox, "working_directory", None)
        return None if value is None else str(value)

    def protect_path(self, path: str) -> None:
        """Bind ``path`` read-only into its commands, where it can."""
        protect = getattr(self.sandbox, "protect_path", None)
        if callable(protect):
            protect(path)

    def instructions(self, request_context: RequestContext | None) -> str:
        """What it tells agents about itself (``""`` if nothing)."""
        get = getattr(self.sandbox, "get_instructions", None)
        return str(get(request_context=request_context) or "") if callable(get) else ""

    async def info(self) -> dict[str, Any]:
        """``provider``, ``status`` and ``resources``, from ``get_info()`` where it has one,
        else from its attributes."""
        get = getattr(self.sandbox, "get_info", None)
        raw = await maybe_await(get()) if callable(get) else {}
        return {
            "provider": raw.get("provider", getattr(self.sandbox, "provider", None)),
            "status": raw.get("status", getattr(self.sandbox, "status", None)),
            "resources": raw.get("resources"),
        }
