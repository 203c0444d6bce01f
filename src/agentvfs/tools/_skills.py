"""The skill tools: ``skill``, ``skill_search`` and ``skill_read`` (reference §17.6).

They are unprefixed and offered whenever skills are configured. Each works on the skills of
the calling request (``WorkspaceSkills.get_scoped``) and picks up changes on disk first
(``maybe_refresh``, cheap within its cooldown).

``skill_read`` is bounded where the reference is not: its output is cut to
``max_output_tokens`` (default 20,000 tokens, with the reference's truncation marker; page
with ``startLine`` and ``endLine``), and a file larger than ``max_file_bytes`` (default
8 MiB) is not read at all: the answer says so. The limit holds on the file actually read,
not only on an earlier ``stat`` (a file swapped for a larger one in between is refused, and on
local disk no more than a byte past the limit is read).
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from ..errors import FileTooLarge, WorkspaceError
from ._core import ToolCall, ToolResult, ToolSpec
from ._lines import nth_newline
from ._output import apply_token_limit
from ._schema import field, numeric_field, object_schema

if TYPE_CHECKING:
    from ..skills import Skill, WorkspaceSkills

__all__ = [
    "DEFAULT_SKILL_READ_MAX_BYTES",
    "DEFAULT_SKILL_READ_MAX_OUTPUT_TOKENS",
    "SKILL_TOOLS",
    "format_skill_activation",
]

#: Characters of each result shown by ``skill_search``.
PREVIEW_CHARS = 200
#: Leading characters looked at for a NUL byte when telling binary files from text.
BINARY_PROBE = 1000
#: Tokens ``skill_read`` returns at most (option ``max_output_tokens``): larger than the file
#: tools' 2,000, since a skill's reference is meant to be read whole, about 80 KB of prose.
DEFAULT_SKILL_READ_MAX_OUTPUT_TOKENS = 20_000
#: Files larger than this are not read by ``skill_read`` (option ``max_file_bytes``).
DEFAULT_SKILL_READ_MAX_BYTES = 8 * 1024 * 1024


def format_skill_activation(skill: Skill) -> str:
    """The instructions, then the files of ``references/``, ``scripts/`` and ``assets/``."""
    parts = [skill.instructions]
    if skill.references:
        parts.append(
            "\n\n## References\n" + "\n".join(f"- references/{r}" for r in skill.references)
        )
    if skill.scripts:
        parts.append("\n\n## Scripts\n" + "\n".join(f"- scripts/{s}" for s in skill.scripts))
    if skill.assets:
        parts.append("\n\n## Assets\n" + "\n".join(f"- assets/{a}" for a in skill.assets))
    return "".join(parts)


async def _skills(call: ToolCall) -> WorkspaceSkills:
    skills = call.workspace.skills
    if skills is None:
        raise WorkspaceError(
            "Workspace does not have skills configured", "NO_SKILLS", call.workspace.id
        )
    return await skills.get_scoped(call.request_context)


async def _resolve(skills: WorkspaceSkills, identifier: str) -> Skill | str:
    """The skill named (or at the path) ``identifier``, or the not-found message."""
    await skills.maybe_refresh()
    skill = await skills.get(identifier)
    if skill is not None:
        return skill
    available = ", ".join(f"{s.name} ({s.path})" for s in await skills.list())
    return f'Skill "{identifier}" not found. Available skills: {available}'


async def _skill(call: ToolCall) -> ToolResult:
    skills = await _skills(call)
    found = await _resolve(skills, call.args["name"])
    return found if isinstance(found, str) else format_skill_activation(found)


async def _skill_search(call: ToolCall) -> ToolResult:
    args = call.args
    skills = await _skills(call)
    await skills.maybe_refresh()
    top_k = args.get("topK")
    results = await skills.search(
        args["query"],
        top_k=int(top_k) if top_k is not None else 5,
        skill_names=args.get("skillNames"),
    )
    if not results:
        return "No results found."
    blocks = []
    for r in results:
        preview = r.content[:PREVIEW_CHARS] + ("..." if len(r.content) > PREVIEW_CHARS else "")
        location = f" (lines {r.line_range[0]}-{r.line_range[1]})" if r.line_range else ""
        blocks.append(f"[{r.skill_name}]{location} (score: {r.score:.2f})\n{preview}")
    return "\n\n".join(blocks)


def _js(value: int | None) -> str:
    return "undefined" if value is None else str(value)


def _read_range(path: str, content: str, start_line: int | None, end_line: int | None) -> str:
    """The reference's ranged read: a header with the range when one was asked for, a
    message that stops pagination when the range is empty. Lines are found by counting
    newlines, not by splitting the whole content."""
    total = content.count("\n") + 1
    start = max(1, start_line if start_line is not None else 1)
    end = min(total, end_line if end_line is not None else total)
    if start > end:
        if (start_line if start_line is not None else 1) > total:
            reason = (
                f"Requested startLine {_js(start_line)} is past the end of the file. The file has "
                "been fully read; stop paginating."
            )
        else:
            reason = (
                f"Requested range {_js(start_line)}-{_js(end_line)} is empty because startLine is "
                "greater than endLine."
            )
        return f'File "{path}" has {total} lines (valid range 1-{total}). {reason}'
    if start_line is None and end_line is None:
        return content
    begin = 0 if start == 1 else nth_newline(content, start - 1) + 1
    stop = nth_newline(content, end - start + 1, begin)
    body = content[begin : stop if stop >= 0 else len(content)]
    return f"{path} (lines {start}-{end} of {total})\n{body}"


async def _size(skills: WorkspaceSkills, skill: Skill, path: str) -> int | None:
    """The size of a skill's file by the source's ``stat``, or None when that cannot tell.

    Paths the skills would refuse (absolute, with ``..``) are not looked at: reading them
    gives the refusal.
    """
    parts = path.replace("\\", "/").split("/")
    if path.startswith(("/", "\\")) or ".." in parts:
        return None
    base = skill.path.rstrip("/")
    target = posixpath.join(base, path.strip("/")) if base not in ("", ".") else path.strip("/")
    try:
        stat = await skills.source.stat(target)
    except OSError:
        return None  # missing or unreachable: the read answers
    return stat.size if stat.type == "file" else None


def _too_large(path: str, skill_name: str, how: str, cap: int) -> str:
    return (
        f'File "{path}" in skill "{skill_name}" {how} skill_read reads ({cap} bytes, max_file_bytes of '
        "skill_read in the tools config); it was not read."
    )


async def _skill_read(call: ToolCall) -> ToolResult:
    args = call.args
    skill_name, path = args["skillName"], args["path"]
    skills = await _skills(call)
    found = await _resolve(skills, skill_name)
    if isinstance(found, str):
        return found
    cap = call.options.get("max_file_bytes", DEFAULT_SKILL_READ_MAX_BYTES)
    # The stat names the size when it can; the read enforces the limit on the file it opens
    # (one swapped for a larger one after the stat is refused, not read whole).
    size = await _size(skills, found, path)
    if size is not None and size > cap:
        return _too_large(path, skill_name, f"is {size} bytes, more than", cap)
    try:
        data = await skills.read_skill_file(found, path, max_bytes=cap)
    except FileTooLarge:
        return _too_large(path, skill_name, "is larger than", cap)
    if data is None:
        files = [
            *(f"references/{f}" for f in found.references),
            *(f"scripts/{f}" for f in found.scripts),
            *(f"assets/{f}" for f in found.assets),
        ]
        listing = f"\nAvailable files: {', '.join(files)}" if files else ""
        return f'File "{path}" not found in skill "{skill_name}".{listing}'
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text[:BINARY_PROBE]:
        return f"Binary file: {found.path}/{path} ({len(data)} bytes)"
    del data
    limit = call.options.get("max_output_tokens", DEFAULT_SKILL_READ_MAX_OUTPUT_TOKENS)
    return apply_token_limit(_read_range(path, text, args.get("startLine"), args.get("endLine")), limit, "end")


SKILL = ToolSpec(
    "skill",
    "Activate a skill to load its full instructions. You should activate skills proactively "
    "when they are relevant to the user's request without asking for permission first.",
    object_schema(
        {
            "name": field(
                "string",
                "The name or path of the skill to activate. Use the path when multiple skills "
                "share the same name.",
            )
        },
        ["name"],
    ),
    _skill,
    needs="workspace",
)

SKILL_SEARCH = ToolSpec(
    "skill_search",
    "Search across skill content to find relevant information. Useful when you need to find "
    "specific details within skills.",
    object_schema(
        {
            "query": field("string", "The search query"),
            "skillNames": field(
                "array", "Optional list of skill names to search within", items={"type": "string"}
            ),
            "topK": numeric_field(
                "integer", "Maximum number of results to return (default: 5)", minimum=1
            ),
        },
        ["query"],
    ),
    _skill_search,
    needs="workspace",
)

SKILL_READ = ToolSpec(
    "skill_read",
    "Read a file from a skill directory (references, scripts, or assets). The path is "
    "relative to the skill root.",
    object_schema(
        {
            "skillName": field(
                "string",
                "The name or path of the skill. Use the path when multiple skills share the same name.",
            ),
            "path": field(
                "string",
                'Path to the file relative to the skill root (e.g. "references/colors.md", '
                '"scripts/run.sh")',
            ),
            "startLine": numeric_field(
                "integer",
                "Starting line number (1-indexed). If omitted, starts from the beginning.",
            ),
            "endLine": numeric_field(
                "integer",
                "Ending line number (1-indexed, inclusive). If omitted, reads to the end.",
            ),
        },
        ["skillName", "path"],
    ),
    _skill_read,
    needs="workspace",
)

#: The skill tools in registration order.
SKILL_TOOLS = (SKILL, SKILL_SEARCH, SKILL_READ)
