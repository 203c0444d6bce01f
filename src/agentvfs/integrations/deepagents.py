"""A workspace as a deepagents backend: files, shell commands and search for a deep agent.

:class:`AgentVFSBackend` serves a workspace's files to deepagents (LangChain's agent
harness) through its ``BackendProtocol``, so the agent's ``ls``, ``read_file``,
``write_file``, ``edit_file``, ``glob`` and ``grep`` tools, and its skills and memories, work
on any storage agentvfs reaches (a local directory, memory, S3, GCS). It slots into a
``CompositeBackend`` route like deepagents' own backends:

.. code-block:: python

    from deepagents import create_deep_agent
    from deepagents.backends import CompositeBackend, StateBackend

    from agentvfs import FsspecFilesystem
    from agentvfs.integrations.deepagents import AgentVFSBackend

    memories = AgentVFSBackend(FsspecFilesystem("s3://bucket/memories"))
    backend = CompositeBackend(default=StateBackend(), routes={"/memories/": memories})
    agent = create_deep_agent(model=..., backend=backend)

:class:`AgentVFSSandbox` adds ``execute``: commands run in the workspace's sandbox, where
the files the tools write are the files the commands see. :func:`search_tools` gives the
agent the workspace's BM25 and vector search as LangChain tools.

The semantics are those of deepagents 0.7: paths are absolute (``/`` is the backend's root),
``write`` creates or overwrites, ``read`` pages text by lines and returns other files as
base64, ``grep`` matches a literal substring, ``glob`` returns regular files only and both
select files with deepagents' shared include-glob rules; failures are results with an
``error``, never exceptions.

Install with ``pip install 'agentvfs[deepagents]'``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import operator
import posixpath
import re
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator
from contextlib import aclosing
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agentvfs.integrations import require

require("deepagents", "deepagents", "agentvfs.integrations.deepagents")

from deepagents.backends.protocol import (  # noqa: E402  (after the check that names the extra)
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    BackendProtocol,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileOperationError,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)
from deepagents.backends.sandbox import MAX_BINARY_BYTES  # noqa: E402
from deepagents.backends.utils import (  # noqa: E402
    EMPTY_CONTENT_WARNING,
    perform_string_replacement,
)
from wcmatch import glob as wcglob  # noqa: E402

from agentvfs.errors import (  # noqa: E402
    FileTooLarge,
    StaleFileError,
    WorkspaceReadOnlyError,
)
from agentvfs.vfs import (  # noqa: E402
    SupportsRangedRead,
    WorkspaceFilesystem,
    list_stats,
    read_many,
    walk,
)
from agentvfs.workspace import Workspace  # noqa: E402

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = ["DEFAULT_MAX_FILE_BYTES", "AgentVFSBackend", "AgentVFSSandbox", "search_tools"]

T = TypeVar("T")

#: Seconds a command may run when ``execute`` is given no timeout (deepagents' own default).
DEFAULT_EXECUTE_TIMEOUT = 120

#: The largest file ``read`` pages as text, ``edit`` changes, ``grep`` searches and
#: ``download_files`` returns: 16 MiB. Every read stops just past it, so a huge file (a
#: sandboxed command makes a sparse terabyte in no time) never reaches the host's memory.
#: deepagents' ``FilesystemBackend`` greps files up to 10 MiB, and its sandbox test kit reads
#: and downloads text files of a little over 10 MiB whole: this limit leaves room for both.
DEFAULT_MAX_FILE_BYTES = 16 * 1024 * 1024

#: What one ``grep`` reads at a time from storage read through threads (disk, object
#: stores; memory is read file by file): batches of at most this many listed bytes and files,
#: so the memory a search holds stays bounded however many files it selects (a file grown
#: since the listing still costs no more than ``max_file_bytes``). Fewer files a batch cost
#: a thread pool each on object stores: 256 keeps a search of many small files fast.
_GREP_BATCH_BYTES = 32 * 1024 * 1024
_GREP_BATCH_FILES = 256


# -- sync over async ---------------------------------------------------------------------------


class _LoopThread:
    """One event loop in a daemon thread that runs the sync methods' coroutines.

    deepagents calls the sync methods from plain threads and, under langgraph, from a thread
    whose own loop is running, where ``asyncio.run`` is refused; a loop of our own serves
    both. A daemon thread, so a process never waits for it at exit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_until_complete,
                    args=(self._forever(),),
                    name="agentvfs-deepagents",
                    daemon=True,
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    async def _forever() -> None:
        # The loop runs one main task that never ends, as under asyncio.run: anyio takes it
        # for the root task and keeps its worker threads while it lives. Were each call its
        # own root, the workers would stop after each call, and a process started from one
        # (a sandbox's FUSE mount child, which dies with the thread that started it) with it.
        await asyncio.Event().wait()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop or self._start()
        if threading.current_thread() is self._thread:
            coro.close()
            # Blocking here would wait for this very thread: a deadlock, so say so instead.
            raise RuntimeError(
                "a sync method of an agentvfs deepagents backend was called from inside one of "
                "its own coroutines; await the a-method (aread, awrite, ...) there instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


_RUNNER = _LoopThread()


def _blocking(coro: Coroutine[Any, Any, T]) -> T:
    return _RUNNER.run(coro)


# -- paths and errors --------------------------------------------------------------------------


class _BadPath(ValueError):
    """A path deepagents semantics refuse; ``code`` is the ``FileOperationError`` for it."""

    def __init__(self, message: str, code: FileOperationError = INVALID_PATH) -> None:
        super().__init__(message)
        self.code: FileOperationError = code


def _check_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise ValueError(f"root must be an absolute path such as '/' or '/workspace', got {root!r}")
    if ".." in root.split("/"):
        raise ValueError(f"root must not contain '..' segments, got {root!r}")
    normalized = posixpath.normpath(root)
    # normpath keeps a leading '//' (POSIX allows it a meaning); we give it none.
    return "/" + normalized.lstrip("/") if normalized != "/" else "/"


def _error_code(exc: BaseException) -> FileOperationError | None:
    """The deepagents error code of a filesystem exception, or None if none fits."""
    if isinstance(exc, _BadPath):
        return exc.code
    if isinstance(exc, FileNotFoundError):
        return FILE_NOT_FOUND
    if isinstance(exc, (PermissionError, WorkspaceReadOnlyError)):
        return PERMISSION_DENIED
    if isinstance(exc, IsADirectoryError):
        return IS_DIRECTORY
    if isinstance(exc, (NotADirectoryError, FileExistsError, ValueError)):
        return INVALID_PATH
    return None


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _iso(stat: Any) -> str | None:
    modified = getattr(stat, "modified_at", None)
    return modified.isoformat() if modified is not None else None


# -- deepagents' read and glob rules -----------------------------------------------------------
#
# Implemented here rather than taken from deepagents' private helpers: those are no part of its
# API (they may change in any release), and they build a ``PurePosixPath`` per file, which cost
# more than the read or the match itself. The tests check both against deepagents' own.

#: Suffixes (lower case) that deepagents reads as binary, returned whole as base64: its
#: multimodal types (images, video, audio, documents) and ``.mkv``, a video container it never
#: decodes as text. Every other file is read as text.
_BINARY_SUFFIXES = frozenset(
    {
        *(".png", ".jpeg", ".jpg", ".webp", ".gif", ".heic", ".heif"),
        *(".mp4", ".mpeg", ".mov", ".avi", ".flv", ".mpg", ".webm", ".wmv", ".3gpp", ".mkv"),
        *(".wav", ".mp3", ".aiff", ".aac", ".ogg", ".flac"),
        *(".pdf", ".ppt", ".pptx"),
    }
)


def _reads_as_text(path: str) -> bool:
    """Whether deepagents reads ``path`` as text: unless its name's last suffix (as
    ``pathlib`` takes it: a leading or trailing dot is none) is a binary one, in any case."""
    dot = path.rfind(".")
    if path[dot:].lower() in _BINARY_SUFFIXES:
        # The suffix ends the name; a name that is only the suffix ('.png') is a dot file.
        return dot == 0 or path[dot - 1] == "/"
    if not path.endswith(("/", "/.")):
        return True
    # '/dir.png/' or '/dir.png/.': pathlib takes the last real segment for the name.
    name = next((part for part in reversed(path.split("/")) if part not in ("", ".")), "")
    return _reads_as_text(name) if name else True


#: The line breaks of ``str.splitlines`` besides ``\n`` (``\r\n`` counts as one break).
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_ANY_BREAK = re.compile("\r\n|[\n" + _OTHER_BREAKS + "]")
#: Finds any break but ``\n``: one search in C, where a test per character is a loop.
_OTHER_BREAK = re.compile("[" + _OTHER_BREAKS + "]")

#: Characters of text counted at a time when skipping lines: large enough that the loop
#: runs in C, small enough that the break-by-break step through one chunk stays short.
_SKIP_CHUNK = 1 << 16


def _breaks(text: str, start: int, stop: int, only_lf: bool) -> int:
    """The number of line breaks in ``text[start:stop]`` (no copy of it is made)."""
    count = text.count("\n", start, stop)
    if only_lf:
        return count
    count += sum(text.count(char, start, stop) for char in _OTHER_BREAKS)
    return count - text.count("\r\n", start, stop)


def _skip_lines(text: str, pos: int, lines: int, only_lf: bool) -> int:
    """The index just past the ``lines``-th line break at or after ``pos`` (the text's end
    if it has fewer): counted a chunk at a time, so no list of lines is ever built."""
    size = len(text)
    while lines > 0 and pos < size:
        stop = min(pos + _SKIP_CHUNK, size)
        if text[stop - 1] == "\r" and text[stop : stop + 1] == "\n":
            stop += 1  # a chunk never splits a \r\n, which is one break
        found = _breaks(text, pos, stop, only_lf)
        if found < lines:
            lines, pos = lines - found, stop
            continue
        for _ in range(lines):  # the wanted break is in this chunk: step to it
            if only_lf:
                pos = text.index("\n", pos, stop) + 1
            else:
                match = _ANY_BREAK.search(text, pos, stop)
                assert match is not None
                pos = match.end()
        return pos
    return size if lines > 0 else pos


def _text_window(text: str, offset: int, limit: int, *, keep_last_newline: bool) -> ReadResult:
    """``limit`` lines of a non-blank ``text`` from line ``offset`` (0-based), with
    deepagents' paging: negative bounds count as 0, a zero ``limit`` reads nothing
    (``no_lines_requested``), lines end at any of ``str.splitlines``' breaks and come back
    with ``\n`` ends, and an offset past the last line is an error.

    The lines are counted and found in place, never split into a list: a page of a file of
    millions of short lines costs a scan of it, not a string object per line.
    """
    if type(offset) is not int or offset < 0:
        offset = max(int(offset), 0)
    if type(limit) is not int or limit < 0:
        limit = max(int(limit), 0)
    if limit == 0:
        return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True)
    only_lf = _OTHER_BREAK.search(text) is None
    breaks = text.count("\n") if only_lf else _breaks(text, 0, len(text), only_lf)
    # The last line counts unless the text ends with a break (a final "\r\n" ends in "\n").
    total = breaks + int(text[-1] != "\n" and text[-1] not in _OTHER_BREAKS)
    if offset >= total:
        return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
    end = min(offset + limit, total)
    start_at = _skip_lines(text, 0, offset, only_lf) if offset else 0
    stop_at = len(text) if end == total else _skip_lines(text, start_at, end - offset, only_lf)
    # The usual read is of the whole file: its text is the window, with no copy.
    window = text if start_at == 0 and stop_at == len(text) else text[start_at:stop_at]
    if not only_lf and "\r" in window:
        window = window.replace("\r\n", "\n").replace("\r", "\n")
    if not keep_last_newline:
        window = window.removesuffix("\n")
    file_data: FileData = {"content": window, "encoding": "utf-8"}
    return ReadResult(
        file_data=file_data,
        total_lines=total,
        start_line=offset + 1,
        end_line=end,
        next_offset=end if end < total else None,
    )


def _matching_lines(text: str, pattern: str) -> Iterator[tuple[int, str]]:
    """The 1-based number and text of each ``\n``-separated line of ``text`` containing
    ``pattern`` (a trailing ``\r`` dropped), found with ``str.find``: only the matching
    lines are ever copied out of the text."""
    if "\n" in pattern:
        return  # a line holds no newline, so no line contains this pattern
    number, counted = 1, 0
    found = text.find(pattern)
    while found != -1:
        line_start = text.rfind("\n", 0, found) + 1
        number += text.count("\n", counted, line_start)
        counted = line_start
        line_end = text.find("\n", found)
        if line_end == -1:
            line_end = len(text)
        yield number, text[line_start:line_end].removesuffix("\r")
        found = text.find(pattern, line_end + 1)


class _BadGlob(ValueError):
    """A glob pattern deepagents refuses (a ``..`` segment, or one too large to expand)."""


def _no_match(_path: str) -> re.Match[str] | None:
    return None


#: The last part of a ``str.rpartition`` triple.
_NAME_OF = operator.itemgetter(2)


@functools.lru_cache(maxsize=256)
def _glob_matcher(pattern: str) -> Callable[[Iterable[str]], list[str]]:
    """deepagents' include-glob rules for ``pattern``, compiled once into one regular
    expression: a filter of paths relative to the search root, keeping their order.

    Brace expansion and ``**`` (which never enters dot directories); a name starting with
    ``.`` matches only a pattern segment starting with ``.``. A pattern with a ``/`` (a
    leading one anchors it, and is dropped) matches the whole relative path, one without
    it the file's name at any depth.

    Raises
    ------
    _BadGlob
        ``pattern`` has a ``..`` segment, or expands past wcmatch's limit.
    """
    if ".." in pattern.replace("\\", "/").split("/"):
        raise _BadGlob(
            f"Invalid glob pattern {pattern!r}: '..' segments are not allowed (a glob "
            "selects files below the search path)"
        )
    try:
        include, exclude = wcglob.translate(
            pattern.lstrip("/"), flags=wcglob.BRACE | wcglob.GLOBSTAR
        )
    except Exception as exc:  # wcmatch raises only private types (its pattern limit)
        raise _BadGlob(f"Invalid glob pattern {pattern!r}: {exc}") from exc
    # wcmatch's own matcher builds an object per path; one regex match per path is all it
    # does without REALPATH, so the comprehensions below run it with no call of ours.
    wanted = re.compile("|".join(include)).fullmatch if include else _no_match
    unwanted = re.compile("|".join(exclude)).fullmatch if exclude else _no_match
    if "/" in pattern:
        if not exclude:
            return lambda paths: [p for p in paths if wanted(p)]
        return lambda paths: [p for p in paths if wanted(p) and not unwanted(p)]

    def select_by_name(paths: Iterable[str]) -> list[str]:
        # map and compress keep the per-path work in C: a path's name is its last part.
        listed = list(paths)
        names = list(map(_NAME_OF, map(str.rpartition, listed, repeat("/"))))
        if not exclude:
            return list(compress(listed, map(wanted, names)))
        pairs = zip(listed, names, strict=True)
        return [path for path, name in pairs if wanted(name) and not unwanted(name)]

    return select_by_name


class AgentVFSBackend(BackendProtocol):
    """A deepagents backend over an agentvfs workspace or filesystem, on any storage.

    Every operation has a native async form (``aread``, ``awrite``, ...) that awaits the
    filesystem directly, and a sync form that runs it on an event loop of this module's own
    (so it may be called from any thread, also one whose event loop is running).

    Parameters
    ----------
    workspace : Workspace or WorkspaceFilesystem
        Where the files are. A ``Workspace`` must have a static filesystem (not a resolver).
        It is initialised on first use; closing it stays with its owner.
    root : str
        The absolute path at which the filesystem's root appears to the agent (default
        ``/``). A path outside it is refused with ``invalid_path``.
    max_binary_bytes : int
        The largest non-text file ``read`` returns (as base64); a larger one is an error
        naming the limit, as in deepagents' sandboxes (500 KiB).
    max_file_bytes : int
        The largest file ``read`` pages as text, ``edit`` changes (before and after the
        edit), ``grep`` searches and ``download_files`` returns (default
        :data:`DEFAULT_MAX_FILE_BYTES`, 16 MiB). No read goes past it: a larger file is an
        error naming its size and the limit, and ``grep`` skips it, as deepagents'
        ``FilesystemBackend`` skips files past its own limit.

    Raises
    ------
    TypeError
        ``workspace`` is neither a ``Workspace`` nor a ``WorkspaceFilesystem``.
    ValueError
        The workspace has no static filesystem, or ``root`` is not an absolute path.
    """

    #: A page of ``read`` keeps its last line's newline, as deepagents' ``StateBackend`` and
    #: ``FilesystemBackend`` do; its sandboxes (and :class:`AgentVFSSandbox`) drop it.
    _page_line_ends = True

    def __init__(
        self,
        workspace: Workspace | WorkspaceFilesystem,
        *,
        root: str = "/",
        max_binary_bytes: int = MAX_BINARY_BYTES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        if isinstance(workspace, Workspace):
            filesystem = workspace.filesystem
            if filesystem is None:
                raise ValueError(
                    f"{type(self).__name__} needs a workspace with a filesystem: pass "
                    "Workspace(filesystem=...) or Workspace(mounts=...) (a filesystem resolver "
                    "is per request and cannot back one deepagents backend)"
                )
            self._workspace: Workspace | None = workspace
        elif isinstance(workspace, WorkspaceFilesystem):
            filesystem = workspace
            self._workspace = None
        else:
            raise TypeError(
                f"{type(self).__name__} takes an agentvfs Workspace or WorkspaceFilesystem, "
                f"not {type(workspace).__name__}"
            )
        for name, value in (
            ("max_binary_bytes", max_binary_bytes),
            ("max_file_bytes", max_file_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self._fs: WorkspaceFilesystem = filesystem
        # Checked once here: a runtime protocol check walks the protocol's members, which
        # costs more than a small read from memory storage itself.
        self._ranged: SupportsRangedRead | None = (
            filesystem if isinstance(filesystem, SupportsRangedRead) else None
        )
        # Storage held in this process (memory) answers inline, with no thread: grep reads
        # its files one by one there, where a batch would start a thread pool per call.
        self._inline = not filesystem.capabilities.blocking
        self._root = _check_root(root)
        self._max_binary = max_binary_bytes
        self._max_file = max_file_bytes

    @property
    def filesystem(self) -> WorkspaceFilesystem:
        """The agentvfs filesystem behind this backend."""
        return self._fs

    @property
    def root(self) -> str:
        """The absolute path at which the filesystem's root appears."""
        return self._root

    # -- paths ---------------------------------------------------------------------------

    def _relative(self, path: object) -> str:
        """The filesystem path (relative, ``""`` for the root) of an absolute agent path.

        Raises
        ------
        _BadPath
            Not a string, not absolute, with ``..`` or ``~``, or outside the root.
        """
        if (
            isinstance(path, str)
            and path.startswith("/")
            and "/." not in path
            and "//" not in path
            and "\\" not in path
            and "\x00" not in path
            and not path.endswith("/")
        ):
            # The common, already clean path (no '.', '..' or empty segment is possible
            # without '/.' or '//'): only its place under the root to check.
            if self._root == "/":
                return path[1:]
            if path == self._root:
                return ""
            if path.startswith(self._root + "/"):
                return path[len(self._root) + 1 :]
        if not isinstance(path, str) or not path:
            raise _BadPath(
                f"Invalid path {path!r}: expected an absolute path such as '/notes/todo.md'"
            )
        posix = path.replace("\\", "/")
        if not posix.startswith("/"):
            raise _BadPath(
                f"Invalid path {path!r}: paths must be absolute (start with '/'), "
                f"e.g. {posixpath.join(self._root, path)!r}"
            )
        if ".." in posix.split("/") or posix.startswith("~"):
            raise _BadPath(f"Invalid path {path!r}: '..' is not allowed; write the path without it")
        if "\x00" in posix:
            raise _BadPath(f"Invalid path {path!r}: NUL bytes are not allowed in a path")
        parts = [p for p in posix.split("/") if p not in ("", ".")]
        normalized = "/" + "/".join(parts)
        if self._root == "/":
            return "/".join(parts)
        if normalized == self._root:
            return ""
        if not normalized.startswith(self._root + "/"):
            raise _BadPath(
                f"Invalid path {path!r}: it lies outside the workspace root {self._root!r}; "
                f"use a path below it, e.g. {self._root + '/' + parts[-1] if parts else self._root!r}"
            )
        return normalized[len(self._root) + 1 :]

    def _absolute(self, relative: str) -> str:
        relative = relative.strip("/")
        if not relative:
            return self._root
        return ("" if self._root == "/" else self._root) + "/" + relative

    # -- ls -------------------------------------------------------------------------------

    async def als(self, path: str) -> LsResult:
        """List a directory's direct children (directories end with ``/``, ``is_dir`` set).

        A missing path is ``error="Path '<path>': path_not_found"``, a file
        ``not_a_directory``, as deepagents' ``FilesystemBackend`` says.
        """
        try:
            rel = self._relative(path)
            stats = await list_stats(self._fs, rel)
        except _BadPath as exc:
            return LsResult(error=str(exc))
        except FileNotFoundError:
            return LsResult(error=f"Path '{path}': path_not_found")
        except NotADirectoryError:
            return LsResult(error=f"Path '{path}': not_a_directory")
        except OSError as exc:
            return LsResult(error=f"Cannot list '{path}': {_describe(exc)}")
        entries: list[FileInfo] = []
        for stat in stats:
            child = self._absolute(posixpath.join(rel, stat.name))
            info: FileInfo
            if stat.type == "directory":
                info = {"path": child + "/", "is_dir": True, "size": 0}
            else:
                info = {"path": child, "is_dir": False, "size": int(stat.size)}
            modified = _iso(stat)
            if modified is not None:
                info["modified_at"] = modified
            entries.append(info)
        entries.sort(key=lambda item: item["path"])
        return LsResult(entries=entries)

    def ls(self, path: str) -> LsResult:
        """Sync :meth:`als`."""
        return _blocking(self.als(path))

    # -- read -----------------------------------------------------------------------------

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Read a file: a text window of ``limit`` lines from line ``offset`` (0-based), or
        the whole of a non-text file as base64 (images, PDFs, undecodable bytes).

        The content is raw; deepagents' middleware adds the line numbers. An empty file
        returns deepagents' empty-file reminder; an offset past the end is an error.
        """
        try:
            rel = self._relative(file_path)
            is_text = _reads_as_text(file_path)
            data = await self._read_bounded(rel, self._max_file if is_text else self._max_binary)
        except FileTooLarge:
            if not is_text:
                return self._too_large(file_path)
            return ReadResult(error=await self._too_large_text(file_path, rel, "read"))
        except _BadPath as exc:
            return ReadResult(error=str(exc))
        except FileNotFoundError:
            return ReadResult(error=f"File '{file_path}' not found")
        except IsADirectoryError:
            return ReadResult(error=f"File '{file_path}' is a directory; use ls to list it")
        except OSError as exc:
            return ReadResult(error=f"Error reading file '{file_path}': {_describe(exc)}")
        if is_text:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass  # bytes that are not text: returned as base64 below, as the sandboxes do
            else:
                if not text or text.isspace():
                    return ReadResult(
                        file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8")
                    )
                return _text_window(text, offset, limit, keep_last_newline=self._page_line_ends)
        if len(data) > self._max_binary:
            return self._too_large(file_path)
        return ReadResult(
            file_data=FileData(
                content=base64.standard_b64encode(data).decode("ascii"), encoding="base64"
            )
        )

    async def _read_bounded(self, rel: str, max_bytes: int) -> bytes:
        """The bytes of the file ``rel``, read no further than one byte past ``max_bytes``.

        Raises
        ------
        FileTooLarge
            The file holds more than ``max_bytes`` bytes.
        OSError
            Any other failure to read it (``FileNotFoundError`` if nothing is there,
            ``IsADirectoryError`` for a directory).
        """
        if self._ranged is not None:
            # One ranged request (a seek and read on disk) of a byte more than the limit: a
            # file of any size, or grown since it was listed, costs at most that much.
            data = await self._ranged.read_range(rel, 0, max_bytes + 1)
        else:
            # Without ranges a file is read whole: refuse what its size already shows to be
            # too large first (read_many's length check comes only after the read).
            if (await self._fs.stat(rel)).size > max_bytes:
                raise FileTooLarge(rel, max_bytes)
            got = (await read_many(self._fs, [rel], max_bytes=max_bytes)).get(rel)
            if not isinstance(got, bytes):
                raise got if got is not None else FileNotFoundError(rel)
            data = got
        if len(data) > max_bytes:
            raise FileTooLarge(rel, max_bytes)
        return data

    async def _size_of(self, rel: str) -> str:
        """The size of the file ``rel`` in words, for an error: "N bytes", or "more than
        the limit" if it cannot be found out."""
        try:
            return f"{(await self._fs.stat(rel)).size} bytes"
        except OSError:
            return "larger than the limit"

    def _large_file_hint(self) -> str:
        """How the agent can look into a file too large for the file tools."""
        return (
            "offset and limit cannot help, since the whole file is loaded before a page of it "
            "is cut; ask for it to be split into smaller files, or for the backend's "
            "max_file_bytes to be raised"
        )

    async def _too_large_text(self, file_path: str, rel: str, action: str) -> str:
        size = await self._size_of(rel)
        return (
            f"Error: File '{file_path}' is too large to {action}: it is {size}, over the limit "
            f"of {self._max_file} bytes; {self._large_file_hint()}"
        )

    def _too_large(self, file_path: str) -> ReadResult:
        return ReadResult(
            error=f"File '{file_path}': Binary file exceeds maximum preview size of {self._max_binary} bytes"
        )

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Sync :meth:`aread`."""
        return _blocking(self.aread(file_path, offset, limit))

    # -- write, edit, delete --------------------------------------------------------------

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        """Create or overwrite a text file (UTF-8), creating its parent directories."""
        # Typed str, but a model's tool call can carry anything: refuse it by name.
        if not isinstance(content, str):
            return WriteResult(  # type: ignore[unreachable]
                error=f"Error writing file '{file_path}': content must be str, not {type(content).__name__}; "
                "use upload_files for bytes"
            )
        try:
            rel = self._relative(file_path)
            if not rel:
                raise IsADirectoryError(file_path)
            await self._fs.write_file(rel, content, recursive=True, overwrite=True)
        except _BadPath as exc:
            return WriteResult(error=str(exc))
        except IsADirectoryError:
            return WriteResult(error=f"Error writing file '{file_path}': it is a directory")
        except OSError as exc:
            return WriteResult(error=f"Error writing file '{file_path}': {_describe(exc)}")
        return WriteResult(path=file_path)

    def write(self, file_path: str, content: str) -> WriteResult:
        """Sync :meth:`awrite`."""
        return _blocking(self.awrite(file_path, content))

    async def aedit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        """Replace ``old_string`` by ``new_string``: it must occur exactly once unless
        ``replace_all``. The file is written back only if nobody changed it meanwhile
        (a version-guarded write), so a concurrent writer's data is never overwritten.
        """
        try:
            rel = self._relative(file_path)
            before = await self._fs.stat(rel)
            if before.type == "directory":
                raise IsADirectoryError(file_path)
            data = await self._read_bounded(rel, self._max_file)
        except FileTooLarge:
            return EditResult(error=await self._too_large_text(file_path, rel, "edit"))
        except _BadPath as exc:
            return EditResult(error=str(exc))
        except FileNotFoundError:
            return EditResult(error=f"Error: File '{file_path}' not found")
        except IsADirectoryError:
            return EditResult(error=f"Error: '{file_path}' is a directory, not a file")
        except OSError as exc:
            return EditResult(error=f"Error editing file '{file_path}': {_describe(exc)}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return EditResult(
                error=f"Error: File '{file_path}' is not a UTF-8 text file and cannot be edited"
            )
        if old_string and isinstance(old_string, str) and isinstance(new_string, str):
            count = text.count(old_string)
            if count > 1 and not replace_all:
                return EditResult(
                    error=f"Error: String '{old_string}' appears multiple times ({count} occurrences) in "
                    f"'{file_path}'. Use replace_all=True to replace all of them, or include more "
                    "surrounding text so the string is unique."
                )
            # The edited size, known before it is built: replace_all of a short string by a
            # long one could otherwise make a text many times the limit in memory.
            growth = len(new_string.encode("utf-8")) - len(old_string.encode("utf-8"))
            edited = len(data) + (count if replace_all else min(count, 1)) * growth
            if edited > self._max_file:
                return EditResult(
                    error=f"Error: Editing '{file_path}' would make it {edited} bytes, over the "
                    f"limit of {self._max_file} bytes for a file the file tools handle; nothing "
                    "was written. Replace fewer occurrences or a shorter string."
                )
        outcome = perform_string_replacement(text, old_string, new_string, replace_all)
        if isinstance(outcome, str):
            return EditResult(error=outcome)
        new_text, occurrences = outcome
        try:
            await self._fs.write_file(rel, new_text, expected_mtime=before)
        except StaleFileError:
            return EditResult(
                error=f"Error: '{file_path}' changed while it was being edited; nothing was written. "
                "Read it again and retry the edit."
            )
        except OSError as exc:
            return EditResult(error=f"Error editing file '{file_path}': {_describe(exc)}")
        return EditResult(path=file_path, occurrences=int(occurrences))

    def edit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        """Sync :meth:`aedit`."""
        return _blocking(self.aedit(file_path, old_string, new_string, replace_all))

    async def adelete(self, file_path: str) -> DeleteResult:
        """Delete a file, or a directory with everything below it. The root is refused."""
        try:
            rel = self._relative(file_path)
            if not rel:
                return DeleteResult(
                    error=f"Error: refusing to delete the root '{file_path}' of the workspace"
                )
            stat = await self._fs.stat(rel)
            if stat.type == "directory":
                await self._fs.rmdir(rel, recursive=True)
            else:
                await self._fs.delete_file(rel)
        except _BadPath as exc:
            return DeleteResult(error=str(exc))
        except FileNotFoundError:
            return DeleteResult(error=f"Error: '{file_path}' not found")
        except OSError as exc:
            return DeleteResult(error=f"Error deleting '{file_path}': {_describe(exc)}")
        return DeleteResult(path=file_path)

    def delete(self, file_path: str) -> DeleteResult:
        """Sync :meth:`adelete`."""
        return _blocking(self.adelete(file_path))

    # -- grep and glob ----------------------------------------------------------------------

    async def _files_below(self, rel: str) -> tuple[list[tuple[str, int | None]], str] | None:
        """The regular files at or below ``rel`` as ``(path, size)`` with the directory the
        include glob is relative to; None if nothing is there."""
        try:
            stat = await self._fs.stat(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.type != "directory":
            # A file as the search root: globs match its name, as in deepagents.
            return [(rel, stat.size)], posixpath.dirname(rel)
        try:
            entries = await walk(self._fs, rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return [(posixpath.join(rel, e.name), e.size) for e in entries if e.type == "file"], rel

    async def agrep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        """Find lines containing ``pattern`` literally (no regex) in the files below ``path``
        (default ``/``) whose path relative to it matches ``glob`` (deepagents' include-glob
        rules). Files that are not UTF-8 text are skipped. At most ``max_count`` matches,
        with ``truncated`` set when more exist.
        """
        if not isinstance(pattern, str) or not pattern:
            return GrepResult(error="Error: grep needs a non-empty literal pattern to search for")
        if max_count is not None and max_count < 0:
            return GrepResult(error=f"Error: max_count must be non-negative, got {max_count}")
        matcher: Callable[[Iterable[str]], list[str]] | None = None
        if glob:
            try:
                matcher = _glob_matcher(glob)
            except _BadGlob as exc:
                return GrepResult(error=str(exc), matches=[])
        try:
            rel = self._relative(path or self._root)
            found = await self._files_below(rel)
        except _BadPath as exc:
            return GrepResult(error=str(exc))
        except OSError as exc:
            return GrepResult(error=f"Error searching path '{path}': {_describe(exc)}")
        if found is None:
            return GrepResult(matches=[])
        files, base = found
        sizes = dict(files)
        if matcher is None:
            selected = sorted(sizes)
        else:
            below = {_below(p, base): p for p in sizes}
            selected = sorted(below[name] for name in matcher(below))
        matches: list[GrepMatch] = []
        unreadable: list[str] = []
        # Closed on the way out, also when max_count ends the search early: the reads stop
        # there, not whenever the garbage collector gets to the generator.
        async with aclosing(self._contents(selected, sizes)) as contents:
            async for file, data in contents:
                if isinstance(data, FileTooLarge):
                    continue  # past max_file_bytes: skipped, as FilesystemBackend does
                if isinstance(data, BaseException):
                    unreadable.append(self._absolute(file))
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # binary: skipped, as ripgrep does
                del data
                shown = self._absolute(file)
                for number, line in _matching_lines(text, pattern):
                    if max_count is not None and len(matches) >= max_count:
                        return GrepResult(matches=matches, truncated=True)
                    matches.append({"path": shown, "line": number, "text": line})
        error = (
            f"Error: could not read {len(unreadable)} file(s): {', '.join(unreadable)}"
            if unreadable
            else None
        )
        return GrepResult(error=error, matches=matches)

    async def _contents(
        self, paths: list[str], sizes: dict[str, int | None]
    ) -> AsyncGenerator[tuple[str, bytes | OSError], None]:
        """Each of ``paths`` (in order) with its bytes, capped at ``max_file_bytes``, or the
        error reading it raised (``FileTooLarge`` past the cap). A file listed past the cap
        is left out, as it would be refused unread."""
        if self._inline:
            # In-process storage: the bytes are in memory already, and each capped read is a
            # call with no thread, so one file at a time costs least and holds least.
            for path in paths:
                size = sizes.get(path)
                if size is not None and size > self._max_file:
                    continue
                try:
                    yield path, await self._read_bounded(path, self._max_file)
                except OSError as exc:
                    yield path, exc
            return
        for batch in _batches(paths, sizes, self._max_file):
            contents = await read_many(self._fs, batch, max_bytes=self._max_file)
            for path in batch:
                data = contents.pop(path, None)
                yield path, FileNotFoundError(path) if data is None else data

    def grep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        """Sync :meth:`agrep`."""
        return _blocking(self.agrep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Regular files below ``path`` (default ``/``) matching ``pattern`` with
        deepagents' rules: a pattern without ``/`` matches the name at any depth, one with
        ``/`` the path relative to ``path`` (``**`` for any depth, never into dot
        directories); a leading ``/`` anchors it. Paths returned are absolute, sorted.
        """
        try:
            matcher = _glob_matcher(pattern)
        except _BadGlob as exc:
            return GlobResult(error=str(exc), matches=None)
        try:
            rel = self._relative(path or self._root)
            stat = await self._fs.stat(rel)
            if stat.type != "directory":
                return GlobResult(matches=[])
            entries = await walk(self._fs, rel)
        except _BadPath as exc:
            return GlobResult(error=str(exc), matches=None)
        except (FileNotFoundError, NotADirectoryError):
            return GlobResult(matches=[])
        except OSError as exc:
            return GlobResult(error=f"Error globbing path '{path}': {_describe(exc)}", matches=[])
        # Entry names are relative to ``rel``: matched as they are, and shown below one
        # prefix, so sorting the names sorts the paths.
        sizes = {entry.name: entry.size for entry in entries if entry.type == "file"}
        prefix = self._absolute(rel).rstrip("/") + "/"
        out: list[FileInfo] = []
        for name in sorted(matcher(sizes)):
            info: FileInfo = {"path": prefix + name, "is_dir": False}
            size = sizes[name]
            if size is not None:
                info["size"] = int(size)
            out.append(info)
        return GlobResult(matches=out)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Sync :meth:`aglob`."""
        return _blocking(self.aglob(pattern, path))

    # -- upload and download --------------------------------------------------------------

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each ``(path, bytes)``, creating parents; one response per file, in order,
        with a ``FileOperationError`` code (or a message) where one failed."""
        responses: list[FileUploadResponse] = []
        for path, content in files:
            try:
                rel = self._relative(path)
                if not rel:
                    raise IsADirectoryError(path)
                if not isinstance(content, (bytes, bytearray, memoryview)):
                    raise _BadPath(
                        f"content for {path!r} must be bytes, not {type(content).__name__}"
                    )
                await self._fs.write_file(rel, bytes(content), recursive=True, overwrite=True)
            except OSError as exc:
                responses.append(
                    FileUploadResponse(path=path, error=_error_code(exc) or _describe(exc))
                )
            except _BadPath as exc:
                responses.append(FileUploadResponse(path=path, error=exc.code))
            else:
                responses.append(FileUploadResponse(path=path))
        return responses

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Sync :meth:`aupload_files`."""
        return _blocking(self.aupload_files(files))

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each path whole; one response per path, in order, with a
        ``FileOperationError`` code where one failed (a directory is ``is_directory``), or a
        message (a file larger than ``max_file_bytes`` is refused without reading it)."""
        responses: list[FileDownloadResponse] = []
        for path in paths:
            try:
                rel = self._relative(path)
                data = await self._read_bounded(rel, self._max_file)
            except FileTooLarge:
                size = await self._size_of(rel)
                message = (
                    f"File '{path}' is too large to download: it is {size}, over the limit of "
                    f"{self._max_file} bytes (max_file_bytes)"
                )
                # A message, not one of deepagents' codes (none means "too large"), as for
                # the OSErrors below that no code fits.
                responses.append(FileDownloadResponse(path=path, error=message))
            except OSError as exc:
                responses.append(
                    FileDownloadResponse(path=path, error=_error_code(exc) or _describe(exc))
                )
            except _BadPath as exc:
                responses.append(FileDownloadResponse(path=path, error=exc.code))
            else:
                responses.append(FileDownloadResponse(path=path, content=data))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Sync :meth:`adownload_files`."""
        return _blocking(self.adownload_files(paths))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._fs!r}, root={self._root!r})"


def _batches(paths: list[str], sizes: dict[str, int | None], max_file: int) -> Iterator[list[str]]:
    """``paths`` in order, in batches of at most ``_GREP_BATCH_FILES`` files and
    ``_GREP_BATCH_BYTES`` listed bytes (a file listed past ``max_file`` is left out: it
    would be refused unread; one of unknown size counts as ``max_file``)."""
    batch: list[str] = []
    held = 0
    for path in paths:
        size = sizes.get(path)
        cost = max_file if size is None else int(size)
        if cost > max_file:
            continue
        if batch and (len(batch) >= _GREP_BATCH_FILES or held + cost > _GREP_BATCH_BYTES):
            yield batch
            batch, held = [], 0
        batch.append(path)
        held += cost
    if batch:
        yield batch


def _below(path: str, base: str) -> str:
    """``path`` relative to ``base`` (both filesystem-relative)."""
    if not base:
        return path
    return path[len(base) + 1 :] if path.startswith(base + "/") else posixpath.basename(path)


# -- the sandbox -------------------------------------------------------------------------------


class AgentVFSSandbox(AgentVFSBackend, SandboxBackendProtocol):
    """:class:`AgentVFSBackend` with ``execute``: shell commands in the workspace's sandbox.

    The paths the file operations take are the paths the commands see, so a file the
    agent writes with ``write_file`` is the one ``cat`` prints. By default that is the
    sandbox's working directory, where the workspace's filesystem lies (a local directory
    there, or the ``mounts`` of ``Workspace(mounts=..., sandbox=...)`` mounted into it).

    Parameters
    ----------
    workspace : Workspace
        A workspace with a static filesystem and a static sandbox (such as
        ``LocalSandbox``). It is started on the first command; closing it stays with its
        owner.
    root : str, optional
        The absolute path where the commands see the filesystem's root; default the
        sandbox's working directory.
    timeout : int
        Seconds a command may run when ``execute`` is given none (0: no limit).
    max_binary_bytes, max_file_bytes : int
        As for :class:`AgentVFSBackend`.

    Raises
    ------
    TypeError
        ``workspace`` is not a ``Workspace``.
    ValueError
        The workspace has no static sandbox or filesystem, or no root can be found.
    """

    def __init__(
        self,
        workspace: Workspace,
        *,
        root: str | None = None,
        timeout: int = DEFAULT_EXECUTE_TIMEOUT,
        max_binary_bytes: int = MAX_BINARY_BYTES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        if not isinstance(workspace, Workspace):
            raise TypeError(
                f"AgentVFSSandbox takes an agentvfs Workspace with a sandbox, not {type(workspace).__name__}; "
                "for files alone use AgentVFSBackend"
            )
        sandbox = workspace.sandbox
        if sandbox is None or not hasattr(sandbox, "execute_command"):
            raise ValueError(
                "AgentVFSSandbox needs a Workspace with a sandbox, e.g. "
                "Workspace(filesystem=LocalFilesystem(base_path=d), sandbox=LocalSandbox(working_directory=d)); "
                "for files alone use AgentVFSBackend"
            )
        if root is None:
            working = getattr(sandbox, "working_directory", None)
            if not working:
                raise ValueError(
                    "the sandbox has no working_directory to take as the root: pass root= (the "
                    "absolute path where its commands see the workspace's files)"
                )
            root = posixpath.abspath(str(working))
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        super().__init__(
            workspace, root=root, max_binary_bytes=max_binary_bytes, max_file_bytes=max_file_bytes
        )
        self._sandbox: Any = sandbox
        self._timeout = timeout

    # A page is its lines joined by newlines, as deepagents' BaseSandbox returns it.
    _page_line_ends = False

    def _large_file_hint(self) -> str:
        # Commands stream a file, so they reach into one of any size.
        return (
            "offset and limit cannot help, since the whole file is loaded before a page of it "
            "is cut; look into it with execute instead (head -n, tail -n, sed -n '100,200p', "
            "grep -n)"
        )

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return str(self._sandbox.id)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        """Run a shell command in the sandbox; stdout then stderr (each line of it marked
        ``[stderr]``) in ``output``, with the exit code. A command past its timeout (in
        seconds; 0 for none) is killed and reported with exit code 124."""
        if not isinstance(command, str) or not command.strip():
            return ExecuteResponse(
                output="Error: execute needs a non-empty shell command", exit_code=1
            )
        seconds = self._timeout if timeout is None else timeout
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            return ExecuteResponse(
                output=f"Error: timeout must be a non-negative number of seconds, got {timeout!r}",
                exit_code=1,
            )
        result = await self._sandbox.execute_command(
            command, timeout=seconds * 1000 if seconds else None
        )
        parts = [result.stdout] if result.stdout else []
        if result.stderr:
            parts.append(
                "\n".join(f"[stderr] {line}" for line in result.stderr.rstrip("\n").split("\n"))
            )
        output = "\n".join(p.rstrip("\n") if i < len(parts) - 1 else p for i, p in enumerate(parts))
        if result.timed_out:
            output += f"\nError: command timed out after {seconds} seconds and was killed"
        truncated = bool(result.stdout_truncated or result.stderr_truncated)
        return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=truncated)

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Sync :meth:`aexecute`."""
        return _blocking(self.aexecute(command, timeout=timeout))


# -- search as LangChain tools -------------------------------------------------------------------


def search_tools(workspace: Workspace, *, top_k: int = 5, root: str = "/") -> list[BaseTool]:
    """LangChain tools that search the workspace's index (BM25, vectors or both), for
    ``create_deep_agent(tools=...)``.

    Parameters
    ----------
    workspace : Workspace
        A workspace configured with search (``bm25=True`` and/or a vector store with an
        embedder), initialised before the agent runs so its index is filled.
    top_k : int
        How many results the tool returns when the model does not say.
    root : str
        The absolute path at which the agent's backend shows the workspace's root, so the
        paths in the results are the ones its file tools take (``/`` for
        :class:`AgentVFSBackend`'s default).

    Returns
    -------
    list of BaseTool
        ``workspace_search``: a query (and optionally ``mode`` and ``top_k``) in, the
        matching files with their scores and matching lines out.

    Raises
    ------
    TypeError
        ``workspace`` is not a ``Workspace``.
    ValueError
        The workspace has no search configured.
    """
    require("langchain_core", "deepagents", "agentvfs.integrations.deepagents")
    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel, Field

    if not isinstance(workspace, Workspace):
        raise TypeError(f"search_tools takes an agentvfs Workspace, not {type(workspace).__name__}")
    modes = [m for m, ok in (("bm25", workspace.can_bm25), ("vector", workspace.can_vector)) if ok]
    if workspace.can_hybrid:
        modes.append("hybrid")
    if not modes:
        raise ValueError(
            "search_tools needs a workspace with search: Workspace(..., bm25=True) and/or "
            "vector_store=... with embedder=..., and auto_index_paths=[...] to fill the index"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    default_k = top_k
    prefix = _check_root(root).rstrip("/")

    class SearchArgs(BaseModel):
        query: str = Field(description="What to look for, in words.")
        mode: Literal["bm25", "vector", "hybrid"] | None = Field(
            default=None,
            description=f"Search mode: one of {', '.join(modes)}; default the best configured.",
        )
        top_k: int = Field(
            default=default_k, ge=1, le=50, description="How many results to return."
        )

    async def search(query: str, mode: str | None = None, top_k: int = default_k) -> str:
        if mode is not None and mode not in modes:
            return (
                f"Error: search mode {mode!r} is not configured here; use one of {', '.join(modes)}"
            )
        hits = await workspace.search(query, top_k=top_k, mode=mode)
        if not hits:
            return f"No results for {query!r}."
        lines = []
        for hit in hits:
            where = f" lines {hit.line_range[0]}-{hit.line_range[1]}" if hit.line_range else ""
            snippet = " ".join(hit.content.split())[:200]
            lines.append(f"{prefix}/{hit.id.lstrip('/')} (score {hit.score:.3f}{where}): {snippet}")
        return "\n".join(lines)

    def search_sync(query: str, mode: str | None = None, top_k: int = default_k) -> str:
        return _blocking(search(query, mode, top_k))

    tool = StructuredTool.from_function(
        func=search_sync,
        coroutine=search,
        name="workspace_search",
        description=(
            "Search the workspace's files by meaning or keywords (not a literal grep). Returns "
            "the best matching files with scores and a snippet; read a file for more."
        ),
        args_schema=SearchArgs,
    )
    return [tool]
