"""``mastra_workspace_grep``: regular-expression search over files (§13.8).

Patterns are written for JavaScript's ``RegExp`` (flags ``g``, or ``gi`` when case is
ignored); :mod:`._jsregex` translates them for the ``regex`` package, which runs them with a
deadline (see :mod:`agentvfs.vfs._grep`). As in JavaScript, text is matched as UTF-16 code
units: columns and the 500-unit cut of a match line count an astral character as two (a cut
through one shows U+FFFD for its first half). Context lines are shown whole.

Files are searched in the order of a depth-first walk that lists each directory's names in
byte order, files and directories together: ``a/x.txt`` comes before ``a-b.txt``.

Every search is bounded, whatever the files hold:

* **time**: matching may take ``match_timeout_ms`` (default 5,000 ms) of wall-clock time over
  the whole call, however many files there are and however busy the machine is; then the
  search stops, what was found is shown, and the summary says where it stopped
  (`` (search stopped after 5 s of matching in <path>: ...)``). Matching runs in a worker
  thread that releases the GIL, so the event loop keeps running meanwhile, and checks the
  budget at every file and every match call; a match call that needs more than a sliver of
  CPU runs in a matcher process killed when the budget is spent (see
  :mod:`agentvfs.vfs._grep`), so nothing is left running after the call. Listing and reading
  are bounded with the whole call by the tool's ``timeout_ms``, as for every tool (a grep
  over a large bucket is slow, not cut short);
* **line length**: only the first 1,048,576 characters of a line are matched; the summary
  counts longer lines (`` (<n> lines longer than 1048576 characters: matched on their first
  1048576)``);
* **memory**: files up to 1 MiB are read whole in batches, larger ones in 1 MiB ranges with
  matches and line numbers carried across the ranges; files larger than ``max_file_bytes``
  (default 256 MiB) are not searched (`` (<n> files skipped: larger than <max> bytes)``).
  Sizes come from the listing, but the 1 MiB of a whole read is enforced on the file read: one
  that grew or was swapped since is sized again and read in ranges, or skipped;
  ``contextLines`` above 1,000 is taken as 1,000; output is built only as far as the token
  limit can show.
* **pattern size**: patterns that would compile to more than 100,000 steps are refused as an
  invalid pattern, although JavaScript takes them (``(?:a{1000}){1000}``); the pattern is
  translated and compiled in a worker thread.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
from regex import error as PatternError  # what the grep engine raises for a bad pattern

from ..errors import FileTooLarge, MatchTimeout
from ..vfs import (
    MATCH_LINE_LIMIT,
    BoundedPattern,
    LineChunker,
    create_glob_matcher,
    extract_glob_base,
    from_units,
    is_glob_pattern,
    is_text_file,
    read_many,
    read_range,
    to_units,
    unit_length,
    walk,
)
from ._core import ToolCall, ToolResult
from ._jsregex import DOT, translate
from ._listing import gitignore_for
from ._output import DEFAULT_MAX_OUTPUT_TOKENS, apply_token_limit, output_char_budget

__all__ = ["DEFAULT_MATCH_TIMEOUT_MS", "DEFAULT_MAX_GREP_FILE_BYTES", "grep"]

MAX_PATTERN_LENGTH = 1000
MAX_TOTAL_MATCHES = 1000
MAX_LINE_LENGTH = 500
#: Milliseconds a grep call may take from its start, listing, reading and matching all its
#: files (option ``match_timeout_ms``).
DEFAULT_MATCH_TIMEOUT_MS = 5_000
#: Files larger than this are not searched (option ``max_file_bytes``).
DEFAULT_MAX_GREP_FILE_BYTES = 256 * 1024 * 1024
#: Context lines shown at most on each side of a match (they are kept in memory).
MAX_CONTEXT_LINES = 1000
#: Files up to this size are read whole; larger ones in ranges of this size.
GREP_CHUNK = 1024 * 1024
#: A batch of whole-file reads holds at most this many listed bytes, or this many files.
BATCH_BYTES = 16 * 1024 * 1024
BATCH_FILES = 256

if TYPE_CHECKING:
    import pathspec

    from ..vfs import FileEntry

T = TypeVar("T")


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _cut(units: str) -> str:
    """A match line (code units) for display: its first 500 units and ``...`` when longer."""
    return from_units(units if len(units) <= MAX_LINE_LENGTH else units[:MAX_LINE_LENGTH] + "...")


def _walk_order(item: tuple[str, int | None]) -> list[str]:
    """Sort key of a path: depth first, each directory's names in byte order (code point
    order is UTF-8 byte order), files and directories together."""
    return item[0].split("/")


# An escape that may stand for a letter (translate() writes punctuation as \uXXXX).
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|[0-9A-Za-z])")


def _compile(pattern: str, ignore_case: bool, timeout: float) -> BoundedPattern:
    exact = translate(pattern)
    if not ignore_case:
        return BoundedPattern(exact, case_sensitive=True, timeout=timeout)
    if _folds_alike(exact):
        # The engine's own case-insensitive search is much faster than the classes that
        # spell JavaScript's folding out ([Tt][Oo]...), and gives the same answer here.
        return BoundedPattern(exact, case_sensitive=False, timeout=timeout)
    return BoundedPattern(translate(pattern, ignore_case=True), case_sensitive=True, timeout=timeout)


def _folds_alike(translated: str) -> bool:
    """Whether ``translated`` matches the same text case-insensitively in the ``regex``
    package as in JavaScript (``i`` without ``u``).

    They differ only where a non-ASCII character matches an ASCII letter: the long s
    (U+017F) ``s``, the Kelvin sign ``k``, the dotted capital I (U+0130) ``i``, and the
    dotless i (U+0131) ``I``, which JavaScript keeps apart. So: ASCII only, none of those
    letters, no class but the dot's, no escape that stands for a letter.
    """
    bare = translated.replace(DOT, "")
    if not bare.isascii() or any(c in bare for c in "sSkKiI["):
        return False
    for escape in _ESCAPE.finditer(bare):
        code = escape.group(1)
        if code is None or int(code, 16) >= 128 or chr(int(code, 16)).isalnum():
            return False
    return True


@dataclass
class _File:
    """Where the search of one file stands (a file may come in several pieces)."""

    path: str
    #: Number of the first line of the next piece.
    next_line: int = 1
    hits: int = 0
    #: Still looking for matches (False once its caps are reached or the search stopped).
    matching: bool = True
    #: Number of the last line put in the output (0: none yet).
    last_printed: int = 0
    #: Context lines still owed after the last match.
    after_left: int = 0
    #: The last context-many lines seen (number, code units kept, length in units): what a
    #: match in the next piece shows before it. Only what the output can show is kept.
    tail: list[tuple[int, str, int]] = field(default_factory=list)

    @property
    def wanted(self) -> bool:
        """More of the file is needed: for matches, or for context after the last one."""
        return self.matching or self.after_left > 0


class _Search:
    """The state of one grep: totals, the output lines and the hunks of context (§13.8).

    Files are fed in walk order as text (whole, or in pieces of whole lines); the output is
    the reference's: ``path:line:col: text`` for a match, ``path:line- text`` for context,
    ``--`` between hunks when there is context. Output lines past ``char_budget``
    characters (more than the token limit can show) are counted but not kept.
    """

    def __init__(self, pattern: BoundedPattern, *, context: int, per_file: int | None, char_budget: int) -> None:
        self.pattern = pattern
        self.context = context
        self.per_file = per_file
        self.char_budget = char_budget
        self.lines: list[str] = []
        self.kept_chars = 0
        self.total_chars = 0
        self.emitted = 0
        self.total = 0
        self.files = 0
        self.truncated = False
        self.read_errors = 0
        self.too_large = 0
        #: The path the matching budget ran out in, if it did.
        self.stopped_in: str | None = None
        #: Nothing more is to be searched (the match cap or the budget was reached).
        self.done = False

    def stop(self, path: str) -> None:
        """The matching budget ran out in ``path``: search nothing more."""
        if self.stopped_in is None:
            self.stopped_in = path
        self.done = True

    def _out(self, line: str, dropped: int = 0) -> None:
        # ``dropped``: characters of the line not kept (a context line longer than the output
        # can show), counted for the estimate of the full output.
        self.emitted += 1
        self.total_chars += len(line) + 1 + dropped
        if self.kept_chars < self.char_budget:
            self.lines.append(line)
            self.kept_chars += len(line) + 1

    def read_error(self, error: object, strict: bool) -> None:
        """Count a file that could not be read, or raise its error under ``strict``."""
        if strict and isinstance(error, Exception):
            raise error
        self.read_errors += 1

    def feed_files(self, paths: list[str], contents: Mapping[str, bytes | OSError], strict: bool) -> None:
        """Search whole files, in order."""
        for path in paths:
            if self.done:
                return
            if self.pattern.expired:
                # Checked per file too: decoding a batch of files costs time of its own.
                self.stop(path)
                return
            data = contents.get(path)
            if not isinstance(data, bytes):
                self.read_error(data, strict)
                continue
            self.feed(_File(path), data.decode("utf-8", errors="replace"), True)

    def feed(self, file: _File, text: str, last: bool = False) -> None:
        """Search the next piece of ``file``: whole lines joined by ``\\n``. The ``last`` piece
        ends with the file's last line (empty when the file ends with a newline)."""
        # Matched as JavaScript does, on UTF-16 code units: columns count them.
        text = to_units(text)
        first = file.next_line
        file.next_line += text.count("\n") + 1
        hits: list[tuple[int, int]] = []
        if file.matching and not self.done:
            # One match more than fits tells that the output is truncated.
            cap = MAX_TOTAL_MATCHES - self.total + 1
            if self.per_file is not None:
                cap = min(cap, self.per_file - file.hits)
            try:
                self.pattern.search_block(text, hits, limit=cap)
            except MatchTimeout:
                self.stop(file.path)
                file.matching = False
        lines = text.split("\n") if hits or file.after_left else None
        for index, column in hits:
            assert lines is not None
            number = first + index
            if self.total >= MAX_TOTAL_MATCHES:
                self.truncated = self.done = True
                file.matching = False
                break
            self._after(file, lines, first, number)
            self._before(file, lines, first, number)
            self._out(f"{file.path}:{number}:{column + 1}: {_cut(lines[index])}")
            file.last_printed, file.after_left = number, self.context
            file.hits += 1
            self.total += 1
            if file.hits == 1:
                self.files += 1
            if self.per_file is not None and file.hits >= self.per_file:
                file.matching = False
        if lines is not None:
            self._after(file, lines, first, first + len(lines))
        if self.context and file.wanted and not last:
            self._keep_tail(file, text, lines)

    def _after(self, file: _File, lines: list[str], first: int, upto: int) -> None:
        """Context owed after the last match, for lines before ``upto`` in this piece."""
        number = file.last_printed + 1
        while file.after_left > 0 and number < upto:
            self._out(f"{file.path}:{number}- {from_units(lines[number - first])}")
            file.last_printed = number
            file.after_left -= 1
            number += 1

    def _before(self, file: _File, lines: list[str], first: int, number: int) -> None:
        """Start or extend a hunk for a match on line ``number``: ``--`` and the context
        before it (lines of earlier pieces come from the file's tail)."""
        if not self.context:
            return
        start = max(number - self.context, 1)
        if file.last_printed == 0 or start > file.last_printed + 1:
            if self.emitted:
                self._out("--")
        else:
            start = file.last_printed + 1
        earlier = {n: (kept, length) for n, kept, length in file.tail} if start < first else {}
        for n in range(start, number):
            text, length = (lines[n - first], 0) if n >= first else earlier.get(n, ("", 0))
            self._out(f"{file.path}:{n}- {from_units(text)}", max(length - len(text), 0))

    def _keep_tail(self, file: _File, text: str, lines: list[str] | None) -> None:
        count = self.context
        last = lines[-count:] if lines is not None else text.rsplit("\n", count)[-count:]
        start = file.next_line - len(last)
        fresh = [(start + i, line[: self.char_budget + 1], len(line)) for i, line in enumerate(last)]
        file.tail = (file.tail + fresh)[-count:] if len(fresh) < count else fresh

    def text(self, summary: str) -> tuple[str, float]:
        """The output, and how much longer the full output would have been (for the token
        limit's estimate of the total)."""
        body = "\n" + "\n".join(self.lines) if self.lines else ""
        text = summary + "\n---" + body
        full = len(summary) + 4 + self.total_chars
        return text, (full / len(text) if len(text) < full else 1.0)


async def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    # Abandoned on cancellation (the tool's timeout): the caller then cancels the pattern,
    # so the thread stops at its next match call. A limiter of its own: a grep never waits
    # for a thread behind other calls' blocking work.
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))


async def grep(call: ToolCall) -> ToolResult:
    """Search text files for a pattern; summary, ``---``, then ``path:line:col: text`` lines."""
    args = call.args
    pattern: str = args["pattern"]
    length = unit_length(pattern)  # JavaScript's length: UTF-16 code units
    if length > MAX_PATTERN_LENGTH:
        return f"Error: Pattern too long ({length} chars, max {MAX_PATTERN_LENGTH}). Use a shorter pattern."
    match_ms = call.options.get("match_timeout_ms", DEFAULT_MATCH_TIMEOUT_MS)
    try:
        # Translated and compiled in a worker thread: regex parses the pattern in Python, which
        # hands the GIL to the event loop every few milliseconds (its C part, at most
        # MAX_PATTERN_EXPANSION steps, takes some tens of milliseconds).
        regex = await _in_worker(_compile, pattern, not args["caseSensitive"], match_ms / 1000)
    except PatternError as exc:
        return f"Error: Invalid regex pattern: {exc}"
    target: str = args["path"]
    hidden: bool = args["includeHidden"]
    context = min(args["contextLines"], MAX_CONTEXT_LINES)
    strict = bool(call.options.get("strict", False))
    max_bytes = call.options.get("max_file_bytes", DEFAULT_MAX_GREP_FILE_BYTES)
    limit = call.options.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS)
    fs = call.fs
    glob = is_glob_pattern(target)
    root = extract_glob_base(target) if glob else target.rstrip("/") or target
    matcher = create_glob_matcher(target, dot=hidden) if glob else None

    search = _Search(regex, context=context, per_file=args.get("maxCount"), char_budget=output_char_budget(limit))
    skipped = 0
    not_found = False
    try:
        files: list[tuple[str, int | None]] = []
        if posixpath.basename(posixpath.normpath(root)) != ".git":
            try:
                info = await fs.stat(root)
            except FileNotFoundError:
                not_found = True
            else:
                if info.type == "file":
                    if is_text_file(root, fs.text_extensions):
                        files.append((root, info.size))
                    else:
                        skipped = 1
                else:
                    files = await _files_below(call, search, root, hidden, matcher)
        await _search_files(call, search, files, strict=strict, max_bytes=max_bytes)
    except BaseException:
        regex.cancel()  # cancelled: a match call in an abandoned worker thread ends at once
        raise
    regex.close()  # no thread matches any more: the matcher process, if any, is reaped

    total = search.total
    summary = f"{total} {'match' if total == 1 else 'matches'} across {_plural(search.files, 'file', 'files')}"
    if search.truncated:
        summary += f" (truncated at {MAX_TOTAL_MATCHES})"
    if skipped:
        summary += f" ({_plural(skipped, 'file', 'files')} skipped: unsupported extension)"
    if not_found:
        summary += " (target path not found: nothing searched)"
    if search.read_errors:
        summary += f" ({_plural(search.read_errors, 'path', 'paths')} skipped: read error)"
    if search.too_large:
        summary += (
            f" ({_plural(search.too_large, 'file', 'files')} skipped: larger than {max_bytes} bytes; "
            "raise max_file_bytes to search them)"
        )
    if regex.long_lines:
        summary += (
            f" ({_plural(regex.long_lines, 'line', 'lines')} longer than {MATCH_LINE_LIMIT} characters: "
            f"matched on their first {MATCH_LINE_LIMIT})"
        )
    if args["contextLines"] > MAX_CONTEXT_LINES:
        summary += f" (contextLines capped at {MAX_CONTEXT_LINES})"
    if search.stopped_in is not None:
        summary += (
            f" (search stopped after {match_ms / 1000:g} s of matching in {search.stopped_in}: the pattern "
            "is too slow; simplify it, narrow the path, or raise match_timeout_ms)"
        )
    text, scale = search.text(summary)
    return apply_token_limit(text, limit, "end", total_scale=scale)


async def _search_files(
    call: ToolCall, search: _Search, files: list[tuple[str, int | None]], *, strict: bool, max_bytes: int
) -> None:
    """Feed ``files`` to ``search`` in order: small ones read whole in batches, large ones in
    ranges, those over ``max_bytes`` skipped.

    Sizes come from the listing, which may be stale by the time a file is read (the agent's
    commands can swap files meanwhile): a batch is read with ``max_bytes=GREP_CHUNK``, so a
    file that has grown since is never read whole (on local disk no more than a byte past the
    cap is read from the file opened) but sized again and searched in ranges, or skipped.
    """
    fs = call.fs
    batch: list[str] = []
    batch_bytes = 0

    async def flush() -> None:
        nonlocal batch, batch_bytes
        if not batch or search.done:
            return
        paths, batch, batch_bytes = batch, [], 0
        contents = await read_many(fs, paths, max_bytes=GREP_CHUNK)
        whole: list[str] = []
        for path in paths:
            if not isinstance(contents.get(path), FileTooLarge):
                whole.append(path)
                continue
            # Larger than listed: the files before it first, to keep the output in walk order.
            if whole:
                await _in_worker(search.feed_files, whole, contents, strict)
                whole = []
            if not search.done:
                await _large_file(call, search, path, strict=strict, max_bytes=max_bytes)
        if whole:
            await _in_worker(search.feed_files, whole, contents, strict)

    for path, size in files:
        if search.done:
            break
        if size is not None and size > max_bytes:
            search.too_large += 1
            continue
        if size is not None and size <= GREP_CHUNK:
            batch.append(path)
            batch_bytes += size
            if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                await flush()
            continue
        await flush()
        if not search.done:
            if size is None:
                await _large_file(call, search, path, strict=strict, max_bytes=max_bytes)
            else:
                await _stream_file(call, search, path, strict)
    await flush()


async def _large_file(call: ToolCall, search: _Search, path: str, *, strict: bool, max_bytes: int) -> None:
    """Search a file whose listing gave no size, or a size it no longer has: sized by ``stat``
    (skipped past ``max_bytes``), then read in ranges, which bound memory whatever it holds
    by the time they are read."""
    try:
        info = await call.fs.stat(path)
    except OSError as exc:
        search.read_error(exc, strict)
        return
    if info.size > max_bytes:
        search.too_large += 1
        return
    await _stream_file(call, search, path, strict)


async def _stream_file(call: ToolCall, search: _Search, path: str, strict: bool) -> None:
    """Search a large file (or one of unknown size) a range at a time."""
    file = _File(path)
    chunker = LineChunker(MATCH_LINE_LIMIT)
    position = 0
    while file.wanted:
        try:
            data = await read_range(call.fs, path, position, position + GREP_CHUNK)
        except OSError as exc:
            search.read_error(exc, strict)
            return
        position += len(data)
        text = chunker.feed(data)
        if text is not None:
            await _in_worker(search.feed, file, text)
        if len(data) < GREP_CHUNK:
            await _in_worker(search.feed, file, chunker.finish(), True)
            return


async def _files_below(
    call: ToolCall, search: _Search, root: str, hidden: bool, matcher: object
) -> list[tuple[str, int | None]]:
    """Text files below ``root`` with their listed sizes, in walk order: no ``.git``, no
    ignored paths, not through symlinked dirs.

    Filtered and sorted in a worker thread that a cancelled call stops (the tool's
    ``timeout_ms``): the rules of a large ``.gitignore`` cost milliseconds per path, which on
    the event loop would hold every other task up.
    """
    fs = call.fs
    ignore, base = await gitignore_for(fs, root)
    entries = await walk(fs, root, include_hidden=hidden)
    files = await _in_worker(_text_files, entries, root, base, ignore, matcher, fs.text_extensions, search.pattern)
    return files or []


def _text_files(
    entries: list[FileEntry],
    root: str,
    base: str,
    ignore: pathspec.GitIgnoreSpec | None,
    matcher: object,
    extensions: frozenset[str],
    pattern: BoundedPattern,
) -> list[tuple[str, int | None]] | None:
    """The part of :func:`_files_below` after the listing; None once the search was
    cancelled (its caller gave up on it)."""
    linked: list[str] = []
    out: list[tuple[str, int | None]] = []
    for entry in entries:
        if pattern.cancelled:
            return None
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
        if ignore is not None and _ignored(ignore, rel, base, parts, pattern):
            continue
        if not is_text_file(entry.name, extensions):
            continue
        display = f"{root.rstrip('/')}/{entry.name}"
        if callable(matcher) and not matcher(display):
            continue
        out.append((display, entry.size))
    return None if pattern.cancelled else sorted(out, key=_walk_order)


def _ignored(ignore: pathspec.GitIgnoreSpec, rel: str, base: str, parts: list[str], pattern: BoundedPattern) -> bool:
    """Whether the file ``rel`` (its name split in ``parts``) or a directory above it is
    ignored; True also once the search was cancelled (each check may cost milliseconds)."""
    if ignore.match_file(rel):
        return True
    for i in range(len(parts) - 1):
        if pattern.cancelled or ignore.match_file(posixpath.join(base, *parts[: i + 1]) + "/"):
            return True
    return False
