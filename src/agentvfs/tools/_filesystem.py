"""The filesystem tools: read_file, write_file, edit_file, delete, file_stat, mkdir (§13).

Memory does not grow with the size of the file read:

* ``read_file`` reads text files over 1 MiB in ranges, keeping only the lines the output can
  show; with ``encoding`` (base64, hex, binary) it reads only the bytes whose encoding the
  token limit can show, and the header then says ``first <n> bytes read``. Media parts are
  read up to ``max_media_bytes``.
* ``edit_file`` refuses files larger than ``max_file_bytes`` (default 8 MiB) with a
  ``ValueError`` before changing anything.
* Every read is a ranged read of at most what is needed, so a file that grows between the
  ``stat`` and the read is not read whole either.
"""

from __future__ import annotations

import base64
import fnmatch
import re
from collections.abc import Callable
from typing import Any

from ..errors import (
    NOT_FOUND_MESSAGE,
    FileExists,
    IsDirectory,
    StringNotFoundError,
    StringNotUniqueError,
)
from ..vfs import FileStat, read_range
from ._core import ToolCall, ToolFailure, ToolMedia, ToolResult, ToolSpec
from ._lines import (
    extract_lines,
    format_with_line_numbers,
    line_numbers,
    replace_string,
)
from ._listing import list_files
from ._names import WORKSPACE_TOOLS
from ._output import DEFAULT_MAX_OUTPUT_TOKENS, apply_token_limit, output_char_budget
from ._schema import field, object_schema
from ._search_files import grep
from ._tracking import iso_ms

__all__ = ["FILESYSTEM_TOOLS"]

FS = WORKSPACE_TOOLS.FILESYSTEM
DEFAULT_MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "application/pdf")
DEFAULT_MAX_MEDIA_BYTES = 10 * 1024 * 1024
#: edit_file refuses files larger than this (option ``max_file_bytes``): it holds the file,
#: its text and the edited text in memory at once.
DEFAULT_MAX_EDIT_BYTES = 8 * 1024 * 1024
# Text files larger than this are read in ranged chunks instead of whole.
STREAM_THRESHOLD = 1024 * 1024
STREAM_CHUNK = 2 * 1024 * 1024
STREAM_KEEP = 8 * 1024 * 1024  # at most this much of the lines asked for is kept
_ENCODINGS = ("base64", "hex", "binary")
_TEXT_LIKE = frozenset(
    {
        "application/octet-stream", "application/json", "application/javascript", "application/typescript",
        "application/xml", "application/graphql", "application/x-sh", "application/x-yaml",
        "application/yaml", "application/ld+json", "application/sql",
    }
)  # fmt: skip
_MEDIA_PATTERN = re.compile(r"^(\*|\*/\*|[\w.+-]+/\*|[\w.+-]+/[\w.+-]+)$")


def _shown(stat: FileStat) -> str:
    """The path read_file's headers name: the filesystem's normalised path (``./a.zip`` is
    ``a.zip``), with a backslash in a name shown as ``/`` as the reference does."""
    return stat.path.replace("\\", "/")


def _text_like(mime: str | None) -> bool:
    if not mime or mime.startswith("text/") or mime in _TEXT_LIKE:
        return True
    return mime.endswith("+json") or mime.endswith("+xml")


def media_matcher(setting: Any) -> Callable[[str], bool]:
    """Turn the ``media_types`` option into a predicate on MIME types.

    ``False`` disables media parts; a function is used as it is; otherwise a list of
    patterns ``*``, ``*/*``, ``type/*`` or exact types.

    Raises
    ------
    ValueError
        A pattern is none of those forms.
    """
    if setting is False:
        return lambda mime: False
    if callable(setting):
        return lambda mime: bool(setting(mime))
    patterns = list(DEFAULT_MEDIA_TYPES if setting in (None, True) else setting)
    for pattern in patterns:
        if not isinstance(pattern, str) or not _MEDIA_PATTERN.match(pattern):
            raise ValueError(f"Invalid `media_types` pattern: {pattern!r}")
    return lambda mime: any(fnmatch.fnmatchcase(mime, p if p != "*" else "*/*") for p in patterns)


async def read_file(call: ToolCall) -> ToolResult:
    """``mastra_workspace_read_file``."""
    path: str = call.args["path"]
    stat = await call.fs.stat(path)
    # Any read that returns counts as a read (also a binary or oversized-media answer).
    call.seen = stat
    mime = stat.mime_type
    encoding: str | None = call.args.get("encoding")
    limit = call.options.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS)
    if stat.type == "file" and mime and media_matcher(call.options.get("media_types"))(mime):
        cap = call.options.get("max_media_bytes", DEFAULT_MAX_MEDIA_BYTES)
        if stat.size <= cap:
            data = await read_range(call.fs, path, 0, cap + 1)
            if len(data) <= cap:
                return ToolMedia(f"{_shown(stat)} ({stat.size} bytes, {mime})", mime, base64.b64encode(data).decode())
            # It grew past the cap since the stat: answered as an oversized file.
        if encoding is None:
            return (
                f"{_shown(stat)} ({stat.size} bytes, {mime}) — exceeds max_media_bytes ({cap}). Returning metadata only; "
                "configure `max_media_bytes` on the read_file tool to raise this cap."
            )
    if encoding is None and stat.type == "file" and not _text_like(mime):
        return (
            f"{_shown(stat)} ({stat.size} bytes, {mime}) — binary file not readable as text. Pass an explicit "
            "`encoding` (e.g. `base64`) to read the raw bytes, or configure `media_types` on the read_file "
            "tool to surface it as a media part."
        )
    if encoding in _ENCODINGS:
        assert encoding is not None
        return await _read_encoded(call, stat, encoding, limit)
    if stat.size > STREAM_THRESHOLD:
        return await _read_large_text(call, stat, limit)
    raw = await read_range(call.fs, path, 0, STREAM_THRESHOLD + 1)
    if len(raw) > STREAM_THRESHOLD:
        return await _read_large_text(call, stat, limit)  # it grew since the stat
    # Like the reference, invalid UTF-8 becomes U+FFFD rather than failing the read.
    content = raw.decode("utf-8", errors="replace")
    offset, count = call.args.get("offset"), call.args.get("limit")
    lines = extract_lines(content, offset, count)
    numbered = call.args.get("showLineNumbers", True)
    body = format_with_line_numbers(lines.lines, lines.start) if numbered and lines.lines else "\n".join(lines.lines)
    if offset is not None or count is not None:
        header = f"{_shown(stat)} (lines {lines.start}-{lines.end} of {lines.total}, {stat.size} bytes)"
    else:
        header = f"{_shown(stat)} ({stat.size} bytes)"
    return apply_token_limit(f"{header}\n{body}", limit, "end")


async def _read_encoded(call: ToolCall, stat: FileStat, encoding: str, limit: int) -> str:
    """Raw bytes as base64, hex or Latin-1 text: only as many bytes as the token limit can
    show are read; when that is not the whole file, the header says how many were."""
    path = call.args["path"]
    budget = output_char_budget(limit)
    # Bytes whose encoding is longer than the output can show: base64 makes 4 characters of 3
    # bytes, hex 2 of 1, Latin-1 1 of 1.
    need = {"base64": budget * 3 // 4 + 3, "hex": budget // 2 + 1}.get(encoding, budget + 1)
    raw = await read_range(call.fs, path, 0, need + 1)
    whole = len(raw) <= need
    if not whole:
        raw = raw[:need]
    encoded = base64.b64encode(raw).decode() if encoding == "base64" else raw.hex() if encoding == "hex" else raw.decode("latin-1")
    if whole:
        return apply_token_limit(f"{_shown(stat)} ({stat.size} bytes, {encoding})\n{encoded}", limit, "end")
    header = f"{_shown(stat)} ({stat.size} bytes, {encoding}, first {len(raw)} bytes read)"
    scale = max(stat.size, len(raw)) / len(raw)
    return apply_token_limit(f"{header}\n{encoded}", limit, "end", total_scale=scale)


async def _read_large_text(call: ToolCall, stat: FileStat, limit: int) -> str:
    """Read a large text file in ranged chunks, keeping only the lines shown.

    Memory stays at a chunk plus the lines kept (no more than the output can show), whatever
    the file's size. With ``offset`` or ``limit`` the whole file is scanned once to count its
    lines (the header names the total); without them only a prefix is read, enough to fill
    the token budget. The end of the file is where a read comes back short, so a file that
    grew since the stat is read as it is now.
    """
    path = call.args["path"]
    offset, count = call.args.get("offset"), call.args.get("limit")
    ranged = offset is not None or count is not None
    first = max(1, offset or 1)
    last = first + count - 1 if count is not None else None
    budget = output_char_budget(limit)
    # Characters are one to four bytes; each line shown costs at least one character.
    keep_bytes = min(STREAM_KEEP, 4 * budget)
    kept: list[bytes] = []
    kept_bytes = 0
    number = 1
    tail = b""
    position = 0
    complete = False
    while not complete:
        chunk = await read_range(call.fs, path, position, position + STREAM_CHUNK)
        position += len(chunk)
        complete = len(chunk) < STREAM_CHUNK
        data = tail + chunk
        newlines = data.count(b"\n")
        if newlines:
            cut = data.rfind(b"\n")
            # Split into lines only where the chunk holds lines asked for; elsewhere count.
            if number + newlines > first and (last is None or last >= number) and kept_bytes < keep_bytes:
                pieces = data[:cut].split(b"\n")
                low = max(first - number, 0)
                high = len(pieces) if last is None else min(len(pieces), last - number + 1)
                for piece in pieces[low:high]:
                    if kept_bytes >= keep_bytes or len(kept) >= budget:
                        break
                    kept.append(piece)
                    kept_bytes += len(piece) + 1
                del pieces
            number += newlines
            tail = data[cut + 1 :]
        else:
            tail = data
        del data
        if len(tail) > keep_bytes:
            tail = tail[:keep_bytes]  # a giant line is shown cut; the rest still counts
        if not ranged and kept_bytes + len(tail) >= keep_bytes:
            break  # enough to fill the token budget (or a giant first line); the rest is never fetched
    # The last line; or, for a head read stopped early, the start of the next one (a giant
    # line is shown cut rather than not at all).
    if (complete or not ranged) and number >= first and (last is None or number <= last) and kept_bytes < keep_bytes:
        kept.append(tail)
    total = number if complete else None
    lines = [piece.decode("utf-8", errors="replace") for piece in kept]
    numbered = call.args.get("showLineNumbers", True)
    shown_first = first if lines else 0
    shown_last = first + len(lines) - 1 if lines else 0
    body = format_with_line_numbers(lines, first) if numbered and lines else "\n".join(lines)
    if ranged:
        header = f"{_shown(stat)} (lines {shown_first}-{shown_last} of {total}, {stat.size} bytes)"
    else:
        header = f"{_shown(stat)} ({stat.size} bytes)"
    text = f"{header}\n{body}"
    # The budget's "of ~T tokens" is estimated from the part read when the rest was not.
    scale = max(stat.size, position) / position if position and not complete else 1.0
    return apply_token_limit(text, limit, "end", total_scale=scale)


async def write_file(call: ToolCall) -> ToolResult:
    """``mastra_workspace_write_file``."""
    path, content = call.args["path"], call.args["content"]
    overwrite = call.args["overwrite"]
    try:
        await call.fs.write_file(path, content, overwrite=overwrite, expected_mtime=call.expected)
    except IsDirectory:
        if overwrite:
            raise
        # Without overwrite a directory in the way is something that exists already.
        raise FileExists(path) from None
    return f"Wrote {len(content.encode('utf-8'))} bytes to {path}"


async def edit_file(call: ToolCall) -> ToolResult:
    """``mastra_workspace_edit_file``: literal, unique (or all) replacement.

    Raises
    ------
    ValueError
        The file is larger than ``max_file_bytes`` or is not valid UTF-8; nothing is changed.
    """
    path = call.args["path"]
    old, new, every = call.args["old_string"], call.args["new_string"], call.args["replace_all"]
    cap = call.options.get("max_file_bytes", DEFAULT_MAX_EDIT_BYTES)
    # One byte more than the cap tells a file that is too large without reading it all.
    raw = await read_range(call.fs, path, 0, cap + 1)
    if len(raw) > cap:
        raise ValueError(
            f"{path} is larger than edit_file edits ({cap} bytes, max_file_bytes of "
            "mastra_workspace_edit_file in the tools config), so nothing was changed; raise that "
            "option, or make the change with a command (sed -i) through execute_command"
        )
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Writing back a lossy decoding would replace every invalid byte in the file.
        raise ValueError(
            f"{path} is not valid UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "edit_file would corrupt it, so nothing was changed"
        ) from None
    del raw
    try:
        done = replace_string(content, old, new, replace_all=every)
    except StringNotFoundError:
        return ToolFailure(NOT_FOUND_MESSAGE)
    except StringNotUniqueError as exc:
        return ToolFailure(str(exc))
    await call.fs.write_file(path, done.text, expected_mtime=call.expected)
    # An occurrence's range runs from the line of its first character to the line of its
    # last one (a newline ending old_string belongs to the line it ends), or as many lines
    # as new_string has when that is more.
    span = max(new.count("\n"), old.count("\n", 0, len(old) - 1))
    ranges = [f"{start}-{start + span}" if span else str(start) for start in line_numbers(content, done.positions)]
    unlisted = done.count - len(done.positions)
    shown = ", ".join(ranges) + (f", and {unlisted} more" if unlisted else "")
    return f"Replaced {done.count} occurrence{'s' if done.count != 1 else ''} in {path} (lines {shown})"


async def delete(call: ToolCall) -> ToolResult:
    """``mastra_workspace_delete``."""
    path, recursive = call.args["path"], call.args["recursive"]
    stat = await call.fs.stat(path)
    if stat.type == "directory":
        await call.fs.rmdir(path, recursive=recursive, force=recursive)
    else:
        await call.fs.delete_file(path)
    return f"Deleted {path}"


async def file_stat(call: ToolCall) -> ToolResult:
    """``mastra_workspace_file_stat``."""
    path = call.args["path"]
    try:
        stat = await call.fs.stat(path)
    except FileNotFoundError:
        return ToolFailure(f"{path}: not found")
    return f"{path} Type: {stat.type} Size: {stat.size} bytes Modified: {iso_ms(stat)}"


async def mkdir(call: ToolCall) -> ToolResult:
    """``mastra_workspace_mkdir``."""
    path = call.args["path"]
    await call.fs.mkdir(path, recursive=call.args["recursive"])
    return f"Created directory {path}"


_PATH = field("string", 'Path relative to the workspace root, e.g. "data/config.json"')

FILESYSTEM_TOOLS: dict[str, ToolSpec] = {
    FS.READ_FILE: ToolSpec(
        FS.READ_FILE,
        "Read a file from the workspace. Text comes back with line numbers; use offset and limit "
        "to read part of a large file. Images and PDFs come back as media.",
        object_schema(
            {
                "path": _PATH,
                "offset": field("integer", "Line number to start reading from (1-based)", minimum=1),
                "limit": field("integer", "Maximum number of lines to read", minimum=1),
                "showLineNumbers": field("boolean", "Prefix each line with its number", default=True),
                "encoding": field(
                    "string", "Read raw bytes in this encoding instead of text",
                    enum=["utf-8", "utf8", "base64", "hex", "binary"],
                ),
            },
            ["path"],
        ),
        read_file,
        tracking="read",
    ),
    FS.WRITE_FILE: ToolSpec(
        FS.WRITE_FILE,
        "Write a file in the workspace, creating parent directories. Replaces an existing file "
        "unless overwrite is false.",
        object_schema(
            {
                "path": _PATH,
                "content": field("string", "The full content to write"),
                "overwrite": field("boolean", "Replace the file if it exists", default=True),
            },
            ["path", "content"],
        ),
        write_file,
        tracking="write",
        locked=True,
        writes="write_file",
    ),
    FS.EDIT_FILE: ToolSpec(
        FS.EDIT_FILE,
        "Replace an exact string in a file. old_string must match exactly once unless replace_all "
        "is true; include surrounding lines to make it unique.",
        object_schema(
            {
                "path": _PATH,
                "old_string": field("string", "The exact text to replace"),
                "new_string": field("string", "The replacement text"),
                "replace_all": field("boolean", "Replace every occurrence", default=False),
            },
            ["path", "old_string", "new_string"],
        ),
        edit_file,
        tracking="write",
        locked=True,
        writes="edit_file",
    ),
    FS.LIST_FILES: ToolSpec(
        FS.LIST_FILES,
        "List files and directories as a tree (directories first). Hidden entries and .gitignore "
        "matches are left out unless asked for; use pattern, extension and exclude to narrow it.",
        object_schema(
            {
                "path": field("string", 'Directory to list, relative to the workspace root (".")', default="."),
                "maxDepth": field("integer", "How many levels to show", default=2, minimum=1),
                "showHidden": field("boolean", "Include names starting with a dot", default=False),
                "dirsOnly": field("boolean", "Show directories only", default=False),
                "exclude": field("string", "Substrings of names to leave out, separated by |"),
                "extension": field("string", 'Only files with this extension (".ts" or "ts")'),
                "pattern": field(
                    ["string", "array"], "Glob(s) files must match, relative to the listed directory",
                    items={"type": "string"},
                ),
                "respectGitignore": field("boolean", "Leave out what the root .gitignore ignores", default=True),
            },
            [],
        ),
        list_files,
    ),
    FS.DELETE: ToolSpec(
        FS.DELETE,
        "Delete a file, or a directory (recursive deletes a non-empty one).",
        object_schema(
            {"path": _PATH, "recursive": field("boolean", "Delete a directory and everything in it", default=False)},
            ["path"],
        ),
        delete,
        locked=True,
        writes="delete",
    ),
    FS.FILE_STAT: ToolSpec(
        FS.FILE_STAT,
        "Show a file's or directory's type, size and modification time.",
        object_schema({"path": _PATH}, ["path"]),
        file_stat,
    ),
    FS.MKDIR: ToolSpec(
        FS.MKDIR,
        "Create a directory (and its parents unless recursive is false).",
        object_schema(
            {"path": _PATH, "recursive": field("boolean", "Create missing parent directories", default=True)},
            ["path"],
        ),
        mkdir,
        writes="mkdir",
    ),
    FS.GREP: ToolSpec(
        FS.GREP,
        "Search file contents for a regular expression (JavaScript syntax). path may be a file, "
        "a directory or a glob such as src/**/*.ts; results show path:line:column: text.",
        object_schema(
            {
                "pattern": field("string", "The regular expression to search for"),
                "path": field("string", "File, directory or glob to search", default="."),
                "contextLines": field("integer", "Lines of context around each match", default=0, minimum=0),
                "maxCount": field("integer", "Stop after this many matches per file", minimum=1),
                "caseSensitive": field("boolean", "Match case exactly", default=True),
                "includeHidden": field("boolean", "Also search hidden files and directories", default=False),
            },
            ["pattern"],
        ),
        grep,
    ),
}
