"""``mastra_workspace_grep``: regular-expression search over files (§13.8).

Patterns are written for JavaScript's ``RegExp``; Python's ``re`` runs them. Named groups
(``(?<name>...)``, ``\\k<name>``) are translated; other differences stay: ``\\d``, ``\\w`` and
``\\s`` also match non-ASCII digits, letters and spaces, and JavaScript-only syntax such as the
``v`` flag's set operations is reported as an invalid pattern.
"""

from __future__ import annotations

import posixpath
import re

from ..vfs import is_text_file, read_many, walk
from ._core import ToolCall, ToolResult
from ._glob import create_glob_matcher, extract_glob_base, is_glob_pattern
from ._listing import gitignore_for
from ._output import DEFAULT_MAX_OUTPUT_TOKENS, apply_token_limit

__all__ = ["grep", "translate_js_regex"]

MAX_PATTERN_LENGTH = 1000
MAX_TOTAL_MATCHES = 1000
MAX_LINE_LENGTH = 500

_NAMED_GROUP = re.compile(r"\(\?<(?![=!])([A-Za-z_$][\w$]*)>")
_NAMED_BACKREF = re.compile(r"\\k<([A-Za-z_$][\w$]*)>")


def translate_js_regex(source: str) -> str:
    """Rewrite JavaScript-only regex syntax that Python spells differently (named groups)."""
    return _NAMED_BACKREF.sub(r"(?P=\1)", _NAMED_GROUP.sub(r"(?P<\1>", source))


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_LENGTH else text[:MAX_LINE_LENGTH] + "..."


async def grep(call: ToolCall) -> ToolResult:
    """Search text files for a pattern; summary, ``---``, then ``path:line:col: text`` lines."""
    args = call.args
    pattern: str = args["pattern"]
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"Error: Pattern too long ({len(pattern)} chars, max {MAX_PATTERN_LENGTH}). Use a shorter pattern."
    try:
        regex = re.compile(translate_js_regex(pattern), 0 if args["caseSensitive"] else re.IGNORECASE)
    except re.error as exc:
        return f"Error: Invalid regex pattern: {exc}"
    target: str = args["path"]
    hidden: bool = args["includeHidden"]
    context: int = args["contextLines"]
    per_file: int | None = args.get("maxCount")
    strict = bool(call.options.get("strict", False))
    fs = call.fs
    glob = is_glob_pattern(target)
    root = extract_glob_base(target) if glob else target.rstrip("/") or target
    matcher = create_glob_matcher(target, dot=hidden) if glob else None

    files: list[str] = []
    skipped = 0
    not_found = False
    if posixpath.basename(posixpath.normpath(root)) != ".git":
        try:
            info = await fs.stat(root)
        except FileNotFoundError:
            not_found = True
        else:
            if info.type == "file":
                if is_text_file(root, fs.text_extensions):
                    files.append(root)
                else:
                    skipped = 1
            else:
                files = await _files_below(call, root, hidden, matcher)

    contents = await read_many(fs, files) if files else {}
    found: list[tuple[str, list[str], dict[int, int]]] = []
    read_errors = 0
    total = 0
    truncated = False
    for path in sorted(files):
        data = contents.get(path)
        if not isinstance(data, bytes):
            if strict and isinstance(data, Exception):
                raise data
            read_errors += 1
            continue
        lines = data.decode("utf-8", errors="replace").split("\n")
        hits: dict[int, int] = {}  # line index -> 1-based column of the line's first match
        for index, line in enumerate(lines):
            match = regex.search(line)
            if match is None:
                continue
            if total >= MAX_TOTAL_MATCHES:
                truncated = True
                break
            hits[index] = match.start() + 1
            total += 1
            if per_file is not None and len(hits) >= per_file:
                break
        if hits:
            found.append((path, lines, hits))
        if truncated:
            break

    summary = f"{total} {'match' if total == 1 else 'matches'} across {_plural(len(found), 'file', 'files')}"
    if truncated:
        summary += f" (truncated at {MAX_TOTAL_MATCHES})"
    if skipped:
        summary += f" ({_plural(skipped, 'file', 'files')} skipped: unsupported extension)"
    if not_found:
        summary += " (target path not found: nothing searched)"
    if read_errors:
        summary += f" ({_plural(read_errors, 'path', 'paths')} skipped: read error)"
    body = _render(found, context)
    text = summary + "\n---" + ("\n" + "\n".join(body) if body else "")
    return apply_token_limit(text, call.options.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS), "end")


async def _files_below(call: ToolCall, root: str, hidden: bool, matcher: object) -> list[str]:
    """Text files below ``root``: no ``.git``, no ignored paths, not through symlinked dirs."""
    fs = call.fs
    ignore, base = await gitignore_for(fs, root)
    linked: list[str] = []
    out: list[str] = []
    for entry in await walk(fs, root, include_hidden=hidden):
        parts = entry.name.split("/")
        if ".git" in parts:
            continue
        if any(entry.name.startswith(link + "/") for link in linked):
            continue
        rel = posixpath.join(base, entry.name) if base else entry.name
        if entry.type == "directory":
            if entry.is_symlink:
                linked.append(entry.name)
            continue
        if ignore is not None and (
            ignore.match_file(rel)
            or any(ignore.match_file(posixpath.join(base, *parts[: i + 1]) + "/") for i in range(len(parts) - 1))
        ):
            continue
        if not is_text_file(entry.name, fs.text_extensions):
            continue
        display = f"{root.rstrip('/')}/{entry.name}"
        if callable(matcher) and not matcher(display):
            continue
        out.append(display)
    return out


def _render(found: list[tuple[str, list[str], dict[int, int]]], context: int) -> list[str]:
    body: list[str] = []
    for path, lines, hits in found:
        if context <= 0:
            body.extend(f"{path}:{i + 1}:{column}: {_cut(lines[i])}" for i, column in hits.items())
            continue
        # Merge overlapping or adjacent windows into hunks; "--" separates hunks and files.
        hunks: list[list[int]] = []
        for index in hits:
            start, end = max(0, index - context), min(len(lines) - 1, index + context)
            if hunks and start <= hunks[-1][1] + 1:
                hunks[-1][1] = max(hunks[-1][1], end)
            else:
                hunks.append([start, end])
        for start, end in hunks:
            if body:
                body.append("--")
            for index in range(start, end + 1):
                if index in hits:
                    body.append(f"{path}:{index + 1}:{hits[index]}: {_cut(lines[index])}")
                else:
                    body.append(f"{path}:{index + 1}- {_cut(lines[index])}")
    return body
