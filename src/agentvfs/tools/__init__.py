"""Agent tools over a workspace (``await workspace.create_tools()``).

Each tool validates its input against a JSON Schema, runs through the reference's wrappers
(per-file write lock, hooks, read tracking) and returns the reference's output strings.
Output is limited with tiktoken's offline ``cl100k_base`` encoding.
"""

from .._exports import fixup_module_metadata
from ._adapters import openai_tools as openai_tools
from ._core import ToolFailure as ToolFailure
from ._core import ToolMedia as ToolMedia
from ._core import WorkspaceTool as WorkspaceTool
from ._core import build_tools as build_tools
from ._host import ToolHost as ToolHost
from ._mcp import NOT_APPROVED as NOT_APPROVED
from ._mcp import create_server as create_server
from ._mcp import serve_stdio as serve_stdio
from ._mcp import serve_stdio_failure as serve_stdio_failure
from ._names import WORKSPACE_TOOLS as WORKSPACE_TOOLS
from ._registry import workspace_tool_specs as workspace_tool_specs

__all__ = [
    "NOT_APPROVED",
    "WORKSPACE_TOOLS",
    "ToolFailure",
    "ToolHost",
    "ToolMedia",
    "WorkspaceTool",
    "build_tools",
    "create_server",
    "openai_tools",
    "serve_stdio",
    "serve_stdio_failure",
    "workspace_tool_specs",
]

fixup_module_metadata(__name__, globals())
