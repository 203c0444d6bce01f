"""Tool names: ``WORKSPACE_TOOLS.FILESYSTEM.READ_FILE == "mastra_workspace_read_file"``."""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ["ALL_TOOL_NAMES", "WORKSPACE_TOOLS", "WORKSPACE_TOOLS_PREFIX"]

WORKSPACE_TOOLS_PREFIX = "mastra_workspace"


def _names(**members: str) -> SimpleNamespace:
    return SimpleNamespace(**{key: f"{WORKSPACE_TOOLS_PREFIX}_{value}" for key, value in members.items()})


WORKSPACE_TOOLS = SimpleNamespace(
    FILESYSTEM=_names(
        READ_FILE="read_file",
        WRITE_FILE="write_file",
        EDIT_FILE="edit_file",
        LIST_FILES="list_files",
        DELETE="delete",
        FILE_STAT="file_stat",
        MKDIR="mkdir",
        GREP="grep",
    ),
    SANDBOX=_names(
        EXECUTE_COMMAND="execute_command",
        GET_PROCESS_OUTPUT="get_process_output",
        KILL_PROCESS="kill_process",
    ),
    SEARCH=_names(SEARCH="search", INDEX="index"),
    CHECKPOINTS=_names(UNDO="undo"),
)

#: Every tool name a tools configuration may name (workspace tools and skill tools).
ALL_TOOL_NAMES = frozenset(
    name for group in vars(WORKSPACE_TOOLS).values() for name in vars(group).values()
) | {"skill", "skill_search", "skill_read"}
