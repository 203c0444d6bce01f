"""The search tools: ``mastra_workspace_search`` and ``mastra_workspace_index`` (§13.12-§13.13)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core import ToolCall, ToolResult, ToolSpec
from ._names import WORKSPACE_TOOLS
from ._schema import field, object_schema

if TYPE_CHECKING:
    from ._host import ToolHost

__all__ = ["index_spec", "search_spec"]

SEARCH = WORKSPACE_TOOLS.SEARCH

#: The search tool's default number of results (the API's default is 10).
DEFAULT_TOP_K = 5


def available_modes(workspace: ToolHost) -> list[str]:
    """The modes a search can run in here, for the tool's ``mode`` enum."""
    if workspace.can_bm25 and workspace.can_vector:
        return ["bm25", "vector", "hybrid"]
    if workspace.can_vector:
        return ["vector"]
    return ["bm25"]


def effective_mode(workspace: ToolHost, requested: str | None) -> str:
    """Fall back instead of failing: hybrid -> vector -> bm25; no request -> the best."""
    if requested == "hybrid" and not workspace.can_hybrid:
        requested = "vector" if workspace.can_vector else "bm25"
    if requested == "vector" and not workspace.can_vector:
        requested = "bm25"
    if requested is None:
        requested = "hybrid" if workspace.can_hybrid else "vector" if workspace.can_vector else "bm25"
    return requested


async def _search(call: ToolCall) -> ToolResult:
    args = call.args
    mode = effective_mode(call.workspace, args.get("mode"))
    results = await call.workspace.search(
        args["query"],
        top_k=int(args.get("topK") or DEFAULT_TOP_K),
        mode=mode,
        min_score=args.get("minScore"),
    )
    blocks = []
    for r in results:
        span = f":{r.line_range[0]}-{r.line_range[1]}" if r.line_range else ""
        blocks.append(f"{r.id}{span}: {r.content}")
    count = len(results)
    summary = f"{count} result{'' if count == 1 else 's'} ({mode} search)"
    # Never cut: the result count (topK) is what bounds this output.
    return "\n".join([*blocks, "---", summary])


async def _index(call: ToolCall) -> ToolResult:
    args = call.args
    metadata = args.get("metadata")
    await call.workspace.index(args["path"], args["content"], metadata=metadata)
    return f"Indexed {args['path']}"


def _search_schema(modes: list[str]) -> dict[str, object]:
    return object_schema(
        {
            "query": field("string", "What to look for"),
            "topK": field("integer", "Maximum number of results", default=DEFAULT_TOP_K, minimum=1),
            "mode": field("string", "Search mode (default: the best available)", enum=modes),
            "minScore": field("number", "Leave out results scoring below this"),
        },
        ["query"],
    )


def search_spec(workspace: ToolHost) -> ToolSpec:
    """``mastra_workspace_search``: ``mode`` lists the modes available here; any mode is
    accepted and falls back to an available one."""
    return ToolSpec(
        SEARCH.SEARCH,
        "Search the indexed content of the workspace by keywords (BM25), meaning (vectors) or "
        "both (hybrid). Returns matching documents with the lines that match.",
        _search_schema(available_modes(workspace)),
        _search,
        needs="workspace",
        accepts=_search_schema(["bm25", "vector", "hybrid"]),
    )


def index_spec() -> ToolSpec:
    """``mastra_workspace_index``."""
    return ToolSpec(
        SEARCH.INDEX,
        "Add content to the workspace search index under a path, so later searches find it.",
        object_schema(
            {
                "path": field("string", "The id to index the content under (usually a file path)"),
                "content": field("string", "The text to index"),
                "metadata": field("object", "Extra data stored with the document"),
            },
            ["path", "content"],
        ),
        _index,
        writes="index",
        needs="workspace",
    )

