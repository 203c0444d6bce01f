"""``mastra_workspace_list_files``: a tab-indented tree with the reference's filters (§13.4)."""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

import pathspec

from ..vfs import FileEntry, WorkspaceFilesystem, create_glob_matcher, read_range, to_units, walk
from ._core import ToolCall, ToolResult, run_stoppable
from ._jsregex import canonical_unit
from ._output import LIST_FILES_MAX_OUTPUT_TOKENS, apply_token_limit

__all__ = [
    "MAX_GITIGNORE_BYTES",
    "CaselessGitIgnoreSpec",
    "fold_case",
    "gitignore_spec",
    "list_files",
    "load_gitignore",
]

logger = logging.getLogger("agentvfs")

#: Bytes of the root ``.gitignore`` that are read; the rules past them are not applied.
MAX_GITIGNORE_BYTES = 1024 * 1024


class _CaseFold(dict[int, str]):
    """A ``str.translate`` table folding each character to the one a case-insensitive
    JavaScript regular expression (``i`` without ``u``) compares it as, filled on demand.

    Such a regular expression upper-cases each UTF-16 code unit alone and keeps it as it is
    when that gives more than one unit, or maps a non-ASCII unit to an ASCII one (the Kelvin
    sign does not match ``k``); characters beyond U+FFFF are two units and never fold.
    """

    def __missing__(self, code: int) -> str:
        folded = chr(canonical_unit(code)) if code <= 0xFFFF else chr(code)
        self[code] = folded
        return folded


_FOLD = _CaseFold()


class CaselessGitIgnoreSpec(pathspec.GitIgnoreSpec):
    """Gitignore rules that match regardless of case, as the reference's matcher does by
    default (``Build/`` ignores ``build``); :func:`gitignore_spec` builds one.

    Only :meth:`match_file` folds the path it is given.
    """

    def match_file(self, file: str | os.PathLike[str], separators: Collection[str] | None = None) -> bool:
        """Tell whether ``file`` (root-relative; a directory with a trailing ``/``) is ignored."""
        return super().match_file(fold_case(os.fspath(file)), separators)


def fold_case(text: str) -> str:
    """``text`` with each character folded as :class:`CaselessGitIgnoreSpec` compares it."""
    return text.translate(_FOLD)


async def load_gitignore(fs: WorkspaceFilesystem) -> pathspec.GitIgnoreSpec | None:
    """The root ``.gitignore`` as a matcher, or None when it is missing, empty or unreadable.

    Patterns match regardless of case (:class:`CaselessGitIgnoreSpec`).

    Only its first :data:`MAX_GITIGNORE_BYTES` are read (up to the last whole line there),
    so a huge or sparse file the agent put there costs no more than that.
    """
    try:
        raw = await read_range(fs, ".gitignore", 0, MAX_GITIGNORE_BYTES + 1)
    except TimeoutError:
        raise
    except OSError as exc:
        # Missing, a directory, out of reach, or not a regular file: no rules, as with none.
        if not isinstance(exc, FileNotFoundError):
            logger.info("not using .gitignore: %s", exc)
        return None
    if len(raw) > MAX_GITIGNORE_BYTES:
        logger.warning(".gitignore is larger than %d bytes; the rules after that are not applied", MAX_GITIGNORE_BYTES)
        raw = raw[: raw.rfind(b"\n", 0, MAX_GITIGNORE_BYTES) + 1]
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if not any(line.strip() and not line.startswith("#") for line in lines):
        return None
    # In a worker thread: each rule compiles to a regular expression, seconds for a
    # megabyte of them, which would hold the event loop (and every deadline) up.
    return await run_stoppable(_spec_until, lines)


class _Stopped(Exception):
    """Leaves pathspec's loop over the rules once the call was stopped."""


def _spec_until(lines: list[str], stop: Callable[[], bool]) -> CaselessGitIgnoreSpec | None:
    """:func:`gitignore_spec`, or None once ``stop()`` (checked between rules) is true."""

    def rules() -> Iterator[str]:
        for line in lines:
            if stop():
                raise _Stopped
            yield _rule(line)

    try:
        return CaselessGitIgnoreSpec.from_lines(rules())
    except _Stopped:
        return None


def gitignore_spec(lines: Iterable[str]) -> CaselessGitIgnoreSpec:
    """Match ``.gitignore`` ``lines`` as the reference does: regardless of case, and a
    ``dir/**`` rule ignores what is inside ``dir`` but not ``dir``."""
    return CaselessGitIgnoreSpec.from_lines([_rule(line) for line in lines])


def _rule(line: str) -> str:
    """A ``.gitignore`` line as the matcher takes it: case-folded, and ``dir/**`` as
    ``dir/**/*``: the reference's matcher (like git) ignores everything inside ``dir`` but
    not ``dir`` itself, so a negation can bring back a directory inside it."""
    folded = fold_case(line)
    # Trailing spaces are not part of a pattern.
    bare = folded.rstrip(" ")
    return bare + "/*" if bare.endswith("/**") and not bare.startswith("#") else folded


async def gitignore_for(fs: WorkspaceFilesystem, path: str) -> tuple[pathspec.GitIgnoreSpec | None, str]:
    """The root ``.gitignore`` for a listing or search of ``path``, and ``path`` as the
    root-relative prefix entries are matched under (``.`` -> ``""``).

    Asking for an ignored directory by name lists or searches it: then no matcher is given.
    """
    norm = posixpath.normpath(path.strip() or ".").lstrip("/")
    base = "" if norm == "." else norm
    ignore = await load_gitignore(fs)
    if ignore is not None and base and await run_stoppable(_matches, ignore, base + "/"):
        ignore = None
    return ignore, base


def _matches(ignore: pathspec.GitIgnoreSpec, path: str, stop: Callable[[], bool]) -> bool:
    """``ignore.match_file(path)``, in a worker thread (``stop`` is not needed: one path)."""
    return ignore.match_file(path)


@dataclass
class _Node:
    entry: FileEntry
    children: dict[str, _Node] = field(default_factory=dict)


async def list_files(call: ToolCall) -> ToolResult:
    """List a directory as a tree: directories first, names in code-unit order."""
    args = call.args
    path: str = args["path"]
    max_depth: int = args["maxDepth"]
    show_hidden: bool = args["showHidden"]
    # Each |-separated part is trimmed: "node_modules | dist" leaves out both.
    excludes = [part.strip() for part in (args.get("exclude") or "").split("|") if part.strip()]
    extension = args.get("extension")
    # Compared case-sensitively: ".ts" does not pick "a.TS".
    wanted = (extension if extension.startswith(".") else "." + extension) if extension else None
    patterns = args.get("pattern")
    if isinstance(patterns, str):
        patterns = [patterns] if patterns.strip() else []
    matcher = create_glob_matcher(patterns, dot=show_hidden) if patterns else None
    limit = call.options.get("max_output_tokens", LIST_FILES_MAX_OUTPUT_TOKENS)
    # A repository's .git is never listed, also when asked for by name (one trailing slash
    # allowed); the path is then not looked at, so it need not exist.
    target = path[:-1] if path.endswith("/") else path
    if target == ".git" or target.endswith("/.git"):
        return apply_token_limit(".\n\n0 directories, 0 files", limit, "end")
    ignore, base = await gitignore_for(call.fs, path)
    if not args["respectGitignore"]:
        ignore = None

    entries = await walk(call.fs, path, max_depth=max_depth, include_hidden=show_hidden)

    def draw(stop: Callable[[], bool]) -> str:
        """The tree and its summary line; an empty string once ``stop()`` is true."""
        root = _Node(FileEntry(".", "directory"))
        truncated = False
        for entry in entries:
            if stop():
                return ""
            parts = entry.name.split("/")
            if len(parts) > max_depth:
                continue
            if ".git" in parts[:-1] or (parts[-1] == ".git" and entry.type == "directory"):
                continue
            if not show_hidden and any(p.startswith(".") for p in parts):
                continue
            if any(sub in part for part in parts for sub in excludes):
                continue
            if ignore is not None:
                # Root-relative, directories with a trailing slash; entries below an ignored
                # directory never find their parent in the tree and drop out below.
                rel = posixpath.join(base, entry.name) if base else entry.name
                if ignore.match_file(rel + ("/" if entry.type == "directory" else "")):
                    continue
            node = root
            for part in parts[:-1]:
                child = node.children.get(part)
                if child is None:
                    break  # a parent was filtered out
                node = child
            else:
                if entry.type == "directory" and not entry.is_symlink and len(parts) == max_depth:
                    truncated = True  # shown, not expanded
                node.children[parts[-1]] = _Node(entry)

        lines = ["."]
        counts = {"directory": 0, "file": 0}

        def keep(node: _Node, rel: str) -> bool:
            entry = node.entry
            if entry.type == "directory":
                return True
            if args["dirsOnly"]:
                return False
            if wanted and not entry.name.endswith(wanted):
                return False
            return matcher is None or matcher(rel)

        def render(node: _Node, depth: int, prefix: str) -> None:
            # Names in UTF-16 code unit order, as JavaScript compares strings.
            ordered = sorted(node.children.items(), key=lambda kv: (kv[1].entry.type != "directory", to_units(kv[0])))
            for name, child in ordered:
                if stop():
                    return
                rel = f"{prefix}{name}"
                if not keep(child, rel):
                    continue
                counts[child.entry.type] += 1
                link = f" -> {child.entry.symlink_target}" if child.entry.is_symlink and child.entry.symlink_target else ""
                lines.append("\t" * depth + name + link)
                if child.entry.type == "directory" and not child.entry.is_symlink:
                    render(child, depth + 1, rel + "/")

        render(root, 0, "")
        if stop():
            return ""
        dirs, files = counts["directory"], counts["file"]
        summary = f"{dirs} director{'y' if dirs == 1 else 'ies'}, {files} file{'' if files == 1 else 's'}"
        if truncated:
            summary += f" (truncated at depth {max_depth})"
        return "\n".join(lines) + "\n\n" + summary

    # Built and drawn in a worker thread: with a large .gitignore each path costs
    # milliseconds, and the call's timeout must be able to stop it.
    return apply_token_limit(await run_stoppable(draw), limit, "end")
