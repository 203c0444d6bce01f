"""What the tools need of a workspace: a Protocol, so the tools do not import the workspace.

:class:`agentvfs.Workspace` is the one implementation; it builds the tools and hands itself
to them (the tools are below it in the layering, see ``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._context import RequestContext
from ..vfs import WorkspaceFilesystem

if TYPE_CHECKING:
    from ..search import SearchResult
    from ..skills import WorkspaceSkills
    from ._core import WorkspaceTool

__all__ = ["ToolHost"]


class ToolHost(Protocol):
    """The workspace a tool works in: its providers, its configuration, search and a hook
    for what a tool wrote.

    It repeats the members of :class:`agentvfs.skills.SkillsHost` rather than extending it:
    a Protocol's base is imported at run time, and importing the skills package would load
    YAML into every process that imports agentvfs (a mount child, a CLI call) for nothing.
    """

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def filesystem(self) -> WorkspaceFilesystem | None: ...

    @property
    def sandbox(self) -> Any: ...

    @property
    def skills(self) -> WorkspaceSkills | None: ...

    @property
    def can_bm25(self) -> bool: ...

    @property
    def can_vector(self) -> bool: ...

    @property
    def can_hybrid(self) -> bool: ...

    def has_filesystem_config(self) -> bool: ...

    def has_sandbox_config(self) -> bool: ...

    def has_sandbox_resolver(self) -> bool: ...

    def has_sandbox_cache_key(self) -> bool: ...

    def has_skills_config(self) -> bool: ...

    def get_tools_config(self) -> dict[str, Any] | None: ...

    def touch(self) -> None: ...

    async def resolve_filesystem(
        self, *, request_context: RequestContext | None = None
    ) -> WorkspaceFilesystem | None: ...

    async def resolve_sandbox(self, *, request_context: RequestContext | None = None) -> Any: ...

    async def create_tools(
        self, *, request_context: RequestContext | None = None
    ) -> dict[str, WorkspaceTool]: ...

    async def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        mode: str | None = None,
        min_score: float | None = None,
        vector_weight: float = 0.5,
        filter: Mapping[str, Any] | None = None,
    ) -> list[SearchResult]: ...

    async def index(
        self,
        path: str,
        content: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        start_line_offset: int | None = None,
    ) -> None: ...

    # Snapshots for undo checkpoints; the results are duck-typed (``.id``; ``.restored`` and
    # ``.conflicts``; ``.changes``), since the tools sit below the snapshots package.
    async def snapshot(self, name: str | None = None, *, lock_wait: float | None = None) -> Any: ...

    async def restore(self, snapshot: str, paths: Sequence[str] | None = None, *, force: bool = False) -> Any: ...

    async def delete_snapshot(self, snapshot: str) -> str: ...

    async def diff(self, a: str | None = None, b: str | None = None, *, patches: bool = True) -> Any: ...

    #: State the tools keep for the life of the workspace (undo checkpoints), by key.
    _tool_state: dict[str, Any]

    async def _after_tool_write(self, operation: str, path: str, fs: WorkspaceFilesystem) -> None:
        """Re-index what a tool wrote (a hook between the workspace and its own tools)."""
        ...
