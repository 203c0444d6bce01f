"""Which tools a workspace offers, in the reference's registration order (§12.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core import ToolSpec, checkpoints_enabled
from ._filesystem import FILESYSTEM_TOOLS
from ._names import WORKSPACE_TOOLS
from ._sandbox import EXECUTE_COMMAND, EXECUTE_COMMAND_BACKGROUND, GET_PROCESS_OUTPUT, KILL_PROCESS
from ._search import index_spec, search_spec
from ._skills import SKILL_TOOLS

if TYPE_CHECKING:
    from ._host import ToolHost

__all__ = ["workspace_tool_specs"]

FS = WORKSPACE_TOOLS.FILESYSTEM
_FILESYSTEM_ORDER = (
    FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP,
)  # fmt: skip


def workspace_tool_specs(workspace: ToolHost) -> list[ToolSpec]:
    """The tool definitions a workspace offers before configuration is applied: filesystem
    tools, then search tools, then sandbox tools, then the skill tools when skills are
    configured.

    With ``checkpoints`` in the tools configuration, ``mastra_workspace_undo`` follows the
    filesystem tools (offered only where its own ``enabled`` turns it on).

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
        if not read_only and checkpoints_enabled(workspace.get_tools_config() or {}):
            from ._checkpoints import UNDO

            specs.append(UNDO)
    if workspace.can_bm25 or workspace.can_vector:
        specs.append(search_spec(workspace))
        static = workspace.filesystem
        if static is None or not static.read_only:
            specs.append(index_spec())
    specs.extend(_sandbox_specs(workspace))
    if workspace.has_skills_config():
        specs.extend(SKILL_TOOLS)
    return specs


def _sandbox_specs(workspace: ToolHost) -> list[ToolSpec]:
    """execute_command when the sandbox runs commands (its background variant when it manages
    processes), get_process_output and kill_process when it manages processes. A sandbox
    resolver is not called to find out: it gets all three."""
    if not workspace.has_sandbox_config():
        return []
    sandbox = workspace.sandbox
    if sandbox is None:
        return [EXECUTE_COMMAND_BACKGROUND, GET_PROCESS_OUTPUT, KILL_PROCESS]
    processes = getattr(sandbox, "processes", None) is not None
    specs: list[ToolSpec] = []
    if callable(getattr(sandbox, "execute_command", None)):
        specs.append(EXECUTE_COMMAND_BACKGROUND if processes else EXECUTE_COMMAND)
    if processes:
        specs += [GET_PROCESS_OUTPUT, KILL_PROCESS]
    return specs
