"""Agent tools over a workspace (``await workspace.create_tools()``).

Each tool validates its input against a JSON Schema, runs through the reference's wrappers
(per-file write lock, hooks, read tracking) and returns the reference's output strings.
Output is limited with tiktoken's offline ``cl100k_base`` encoding.
"""

from .._exports import fixup_module_metadata
from ._adapters import openai_tools as openai_tools
from ._core import ToolMedia as ToolMedia
from ._core import WorkspaceTool as WorkspaceTool
from ._names import WORKSPACE_TOOLS as WORKSPACE_TOOLS

__all__ = ["WORKSPACE_TOOLS", "ToolMedia", "WorkspaceTool", "openai_tools"]

fixup_module_metadata(__name__, globals())
