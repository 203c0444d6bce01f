"""Which tools a workspace offers, in the reference's registration order (§12.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core import ToolSpec
from ._filesystem import FILESYSTEM_TOOLS
from ._names import WORKSPACE_TOOLS

if TYPE_CHECKING:
    from ..workspace import Workspace

__all__ = ["workspace_tool_specs"]

FS = WORKSPACE_TOOLS.FILESYSTEM
_FILESYSTEM_ORDER = (
    FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP,
)  # fmt: skip


def workspace_tool_specs(workspace: Workspace) -> list[ToolSpec]:
    """The tool definitions a workspace offers before configuration is applied.

    Write tools are left out on a read-only static filesystem; with a filesystem resolver they
    are always offered, and a read-only resolved filesystem refuses them when they run.
    """
    specs: list[ToolSpec] = []
    if workspace.has_filesystem_config():
        static = workspace.filesystem
        read_only = static is not None and static.read_only
        for name in _FILESYSTEM_ORDER:
            spec = FILESYSTEM_TOOLS[name]
            if spec.writes and read_only:
                continue
            specs.append(spec)
    return specs
