"""Tool names: ``WORKSPACE_TOOLS.FILESYSTEM.READ_FILE == "mastra_workspace_read_file"``."""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ["WORKSPACE_TOOLS", "WORKSPACE_TOOLS_PREFIX", "WRITE_TOOLS"]

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
)

# Tools that change files: dropped on a read-only static filesystem, serialised per path.
WRITE_TOOLS = frozenset(
    {
        WORKSPACE_TOOLS.FILESYSTEM.WRITE_FILE,
        WORKSPACE_TOOLS.FILESYSTEM.EDIT_FILE,
        WORKSPACE_TOOLS.FILESYSTEM.DELETE,
        WORKSPACE_TOOLS.FILESYSTEM.MKDIR,
        WORKSPACE_TOOLS.SEARCH.INDEX,
    }
)
