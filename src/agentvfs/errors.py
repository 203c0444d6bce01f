"""The exception tree of agentvfs: every public exception, in one place.

Four roots. Three are the behavioural reference's (``WorkspaceError``, ``FilesystemError``,
``SandboxError``); mounting is its own concern, since a filesystem is mounted with or without
a sandbox. Every filesystem error is also the matching builtin, so that
``except FileNotFoundError`` works and ``errno`` is set. The errors of the search index, of
skills and of edits are ordinary builtins (``ValueError``, ``OSError``, ...) with a type of
their own::

    Exception
    ├── WorkspaceError                       code, workspace_id
    │   ├── WorkspaceNotAvailableError       NO_WORKSPACE
    │   ├── FilesystemNotAvailableError      NO_FILESYSTEM
    │   ├── SandboxNotAvailableError         NO_SANDBOX
    │   ├── SandboxFeatureNotSupportedError  FEATURE_NOT_SUPPORTED
    │   ├── SearchNotAvailableError          NO_SEARCH
    │   ├── WorkspaceNotReadyError           NOT_READY
    │   ├── SnapshotNotFoundError            NO_SNAPSHOT; also LookupError
    │   └── WorkspaceReadOnlyError           READ_ONLY; also OSError (EROFS)
    ├── OSError
    │   ├── FilesystemError                  code, path
    │   │   ├── FileNotFound                 ENOENT, also FileNotFoundError
    │   │   ├── DirectoryNotFound            ENOENT, also FileNotFoundError
    │   │   │   └── BucketNotFound           ENOENT: the bucket of the root is missing
    │   │   ├── NoMountError                 ENOENT, also FileNotFoundError
    │   │   ├── FileExists                   EEXIST, also FileExistsError
    │   │   ├── IsDirectory                  EISDIR, also IsADirectoryError
    │   │   ├── NotDirectory                 ENOTDIR, also NotADirectoryError
    │   │   ├── DirectoryNotEmpty            ENOTEMPTY
    │   │   ├── PermissionDenied             EACCES, also PermissionError
    │   │   ├── FileReadRequiredError        EREAD_REQUIRED
    │   │   ├── StaleFileError               ESTALE
    │   │   ├── FilesystemNotReadyError      ENOTREADY
    │   │   ├── UnsupportedGrepPatternError  EUNSUPPORTED_PATTERN, also ValueError
    │   │   ├── InvalidPathError             EINVAL, also ValueError
    │   │   ├── FileDecodeError              EILSEQ, also ValueError
    │   │   ├── NameTooLongError             ENAMETOOLONG
    │   │   ├── NotRegularFile               EINVAL: a FIFO, device or socket
    │   │   ├── FileTooLarge                 EFBIG: larger than a read's max_bytes
    │   │   ├── StorageAccessError           EACCES, also PermissionError: credentials
    │   │   └── StorageUnreachableError      ECONNREFUSED, also ConnectionError
    │   ├── BM25FileError                    the index file cannot be used (filename)
    │   └── BlobIntegrityError               EIO: a stored blob or manifest failed its hash
    ├── SandboxError                         code, details
    │   ├── SandboxExecutionError            EXECUTION_FAILED
    │   ├── SandboxTimeoutError              TIMEOUT, also TimeoutError
    │   ├── SandboxNotReadyError             NOT_READY
    │   ├── SandboxUnsupportedFeatureError   UNSUPPORTED_FEATURE
    │   ├── SandboxAbortError                ABORTED
    │   ├── IsolationUnavailableError        ISOLATION_UNAVAILABLE
    │   ├── MountNotSupportedError           MOUNT_NOT_SUPPORTED (the sandbox cannot mount)
    │   └── FilesystemNotMountableError      FILESYSTEM_NOT_MOUNTABLE
    ├── MountError                           MOUNT_ERROR: a mount failed (code, details)
    ├── MountToolNotFoundError               a missing mount tool (a warning state)
    ├── TimeoutError
    │   └── MatchTimeout                     grep used up its time budget (pattern, seconds)
    ├── ImportError
    │   └── MissingExtraError                an optional part is not installed (extra)
    ├── RuntimeError
    │   └── SearchIndexError                 the index in index_dir cannot be used
    │       └── IndexConflictError           another builder wrote the manifest first
    └── ValueError
        ├── EmbeddingError                   the embedder failed (failures)
        ├── InvalidSkillError                a SKILL.md that cannot be loaded (errors)
        ├── SkillConflictError               two skills of one name and source type
        ├── InvalidSkillPathError            EACCES, also PermissionError
        ├── StringNotFoundError              edit_file: old_string does not occur
        └── StringNotUniqueError             edit_file: old_string occurs more than once

``str(err)`` is exactly the reference message, never prefixed with ``[Errno N]``. Every
exception survives pickling (a mount child process reports errors to its parent).
"""

from __future__ import annotations

import errno as _errno
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "NOT_FOUND_MESSAGE",
    "BM25FileError",
    "BlobIntegrityError",
    "BucketNotFound",
    "DirectoryNotEmpty",
    "DirectoryNotFound",
    "EmbeddingError",
    "FileDecodeError",
    "FileExists",
    "FileNotFound",
    "FileReadRequiredError",
    "FileTooLarge",
    "FilesystemError",
    "FilesystemNotAvailableError",
    "FilesystemNotMountableError",
    "FilesystemNotReadyError",
    "IndexConflictError",
    "InvalidPathError",
    "InvalidSkillError",
    "InvalidSkillPathError",
    "IsDirectory",
    "IsolationUnavailableError",
    "MatchTimeout",
    "MissingExtraError",
    "MountError",
    "MountNotSupportedError",
    "MountToolNotFoundError",
    "NameTooLongError",
    "NoMountError",
    "NotDirectory",
    "NotRegularFile",
    "PermissionDenied",
    "SandboxAbortError",
    "SandboxError",
    "SandboxExecutionError",
    "SandboxFeatureNotSupportedError",
    "SandboxNotAvailableError",
    "SandboxNotReadyError",
    "SandboxTimeoutError",
    "SandboxUnsupportedFeatureError",
    "SearchIndexError",
    "SearchNotAvailableError",
    "SkillConflictError",
    "SnapshotNotFoundError",
    "StaleFileError",
    "StorageAccessError",
    "StorageUnreachableError",
    "StringNotFoundError",
    "StringNotUniqueError",
    "UnsupportedGrepPatternError",
    "WorkspaceError",
    "WorkspaceNotAvailableError",
    "WorkspaceNotReadyError",
    "WorkspaceReadOnlyError",
]


def _iso(value: datetime | None) -> str:
    """Render a timestamp the way JavaScript's ``Date.toISOString`` does (ms, ``Z``)."""
    if value is None:
        return "unknown"
    value = value.astimezone(UTC) if value.tzinfo is not None else value
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"

# --------------------------------------------------------------------------------------------
# Workspace errors
# --------------------------------------------------------------------------------------------


class _Rebuilt(Exception):
    """Pickles by state, not by calling the constructor again with ``args`` (which the
    default does, and which fails for constructors that take other arguments): every error
    here survives a trip to another process (a mount child reports errors to its parent)."""

    def __reduce__(self) -> tuple[Any, ...]:
        os_state = (self.errno, self.strerror, self.filename) if isinstance(self, OSError) else None
        return (_restore, (type(self), self.args, os_state, self.__dict__))


def _restore(
    cls: type[BaseException], args: tuple[Any, ...], os_state: tuple[Any, Any, Any] | None, state: dict[str, Any]
) -> BaseException:
    # A class with two builtin bases (ValueError and PermissionError) must be made by the
    # one whose memory layout it has.
    err = OSError.__new__(cls) if issubclass(cls, OSError) else cls.__new__(cls)
    BaseException.__init__(err, *args)
    if isinstance(err, OSError) and os_state is not None:
        err.errno, err.strerror, err.filename = os_state
    err.__dict__.update(state)
    return err


class WorkspaceError(_Rebuilt):
    """Base of configuration and lifecycle errors raised by :class:`agentvfs.Workspace`.

    Parameters
    ----------
    message : str
        The message; ``str(err)`` returns it unchanged.
    code : str
        A stable machine-readable code such as ``INVALID_CONFIG``.
    workspace_id : str, optional
        The id of the workspace that raised it.
    """

    code: str

    def __init__(self, message: str, code: str = "WORKSPACE_ERROR", workspace_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.workspace_id = workspace_id

    def __str__(self) -> str:
        return self.message


class WorkspaceNotAvailableError(WorkspaceError):
    """No workspace was configured where one is needed (``NO_WORKSPACE``)."""

    def __init__(self) -> None:
        super().__init__(
            "Workspace not available. Ensure the agent has a workspace configured.", "NO_WORKSPACE"
        )


class FilesystemNotAvailableError(WorkspaceError):
    """The workspace has no filesystem (``NO_FILESYSTEM``)."""

    def __init__(self) -> None:
        super().__init__("Workspace does not have a filesystem configured", "NO_FILESYSTEM")


class SandboxNotAvailableError(WorkspaceError):
    """The workspace has no sandbox (``NO_SANDBOX``)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or "Workspace does not have a sandbox configured", "NO_SANDBOX")


class SandboxFeatureNotSupportedError(WorkspaceError):
    """The sandbox lacks a feature a tool needs (``FEATURE_NOT_SUPPORTED``)."""

    def __init__(self, feature: str) -> None:
        super().__init__(f"Sandbox does not support {feature}", "FEATURE_NOT_SUPPORTED")
        self.feature = feature


class SearchNotAvailableError(WorkspaceError):
    """Search was used on a workspace without BM25 or vector search (``NO_SEARCH``)."""

    def __init__(self) -> None:
        super().__init__(
            "Workspace does not have search configured (enable bm25 or provide vectorStore + embedder)",
            "NO_SEARCH",
        )


class WorkspaceNotReadyError(WorkspaceError):
    """The workspace is being or has been torn down (``NOT_READY``)."""

    def __init__(self, workspace_id: str, status: str) -> None:
        super().__init__(f"Workspace is not ready (status: {status})", "NOT_READY", workspace_id)
        self.status = status


class SnapshotNotFoundError(WorkspaceError, LookupError):
    """No snapshot goes by the id or name given (``NO_SNAPSHOT``).

    Parameters
    ----------
    ref : str
        The id, id prefix or name asked for.
    where : str
        The snapshot store looked in.
    """

    def __init__(self, ref: str, where: str) -> None:
        super().__init__(f"No snapshot {ref!r} in {where}", "NO_SNAPSHOT")
        self.ref = ref
        self.where = where


class WorkspaceReadOnlyError(WorkspaceError, OSError):
    """A write was attempted on a read-only filesystem (``READ_ONLY``, ``errno.EROFS``).

    Raised before any request reaches the storage backend.
    """

    def __init__(self, operation: str) -> None:
        OSError.__init__(self, _errno.EROFS, f"Workspace is in read-only mode. Cannot perform: {operation}")
        self.message = f"Workspace is in read-only mode. Cannot perform: {operation}"
        self.code = "READ_ONLY"
        self.workspace_id = None
        self.operation = operation
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------------------------
# Filesystem errors
# --------------------------------------------------------------------------------------------


class FilesystemError(_Rebuilt, OSError):
    """Base of filesystem errors; also an :class:`OSError` with ``errno`` set.

    Parameters
    ----------
    message : str
        The message; ``str(err)`` returns it unchanged.
    code : str
        The reference code (``ENOENT``, ``EACCES``, ...).
    path : str, optional
        The path as the caller gave it.
    """

    default_errno: int | None = _errno.EIO

    def __init__(self, message: str, code: str = "EIO", path: str | None = None) -> None:
        super().__init__(self.default_errno, message)
        self.message = message
        self.code = code
        self.path = path
        self.args = (message,)

    def __str__(self) -> str:
        return self.message


class FileNotFound(FilesystemError, FileNotFoundError):
    """The file does not exist (``ENOENT``)."""

    default_errno = _errno.ENOENT

    def __init__(self, path: str) -> None:
        super().__init__(f"File not found: {path}", "ENOENT", path)


class DirectoryNotFound(FilesystemError, FileNotFoundError):
    """The directory does not exist (``ENOENT``)."""

    default_errno = _errno.ENOENT

    def __init__(self, path: str) -> None:
        super().__init__(f"Directory not found: {path}", "ENOENT", path)


class BucketNotFound(DirectoryNotFound):
    """The bucket (or container) of an object-store root does not exist (``ENOENT``).

    Parameters
    ----------
    url : str
        The bucket as a URL (``s3://name``).
    """

    def __init__(self, url: str) -> None:
        FilesystemError.__init__(
            self,
            f"Bucket not found: {url} (check the name, the endpoint_url and the region, or create the bucket first)",
            "ENOENT",
            url,
        )


class FileExists(FilesystemError, FileExistsError):
    """Something already exists at the path (``EEXIST``)."""

    default_errno = _errno.EEXIST

    def __init__(self, path: str) -> None:
        super().__init__(f"File already exists: {path}", "EEXIST", path)


class IsDirectory(FilesystemError, IsADirectoryError):
    """A file operation was given a directory (``EISDIR``)."""

    default_errno = _errno.EISDIR

    def __init__(self, path: str) -> None:
        super().__init__(f"Path is a directory: {path}", "EISDIR", path)


class NotDirectory(FilesystemError, NotADirectoryError):
    """A directory operation was given a file (``ENOTDIR``)."""

    default_errno = _errno.ENOTDIR

    def __init__(self, path: str) -> None:
        super().__init__(f"Path is not a directory: {path}", "ENOTDIR", path)


class DirectoryNotEmpty(FilesystemError):
    """A non-recursive ``rmdir`` found entries (``ENOTEMPTY``)."""

    default_errno = _errno.ENOTEMPTY

    def __init__(self, path: str) -> None:
        super().__init__(f"Directory not empty: {path}", "ENOTEMPTY", path)


class PermissionDenied(FilesystemError, PermissionError):
    """Access refused: outside the workspace root, or a read-only mount (``EACCES``).

    Parameters
    ----------
    path : str
        The path as given (or resolved, for symlink escapes).
    operation : str
        What was attempted, e.g. ``access`` or ``writeFile (filesystem is read-only)``.
    """

    default_errno = _errno.EACCES

    def __init__(self, path: str, operation: str) -> None:
        super().__init__(f"Permission denied: {operation} on {path}", "EACCES", path)
        self.operation = operation


class FileReadRequiredError(FilesystemError):
    """A write needs a fresh read first (``EREAD_REQUIRED``); the message is the reason."""

    default_errno = _errno.EPERM

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(reason, "EREAD_REQUIRED", path)
        self.reason = reason


class StaleFileError(FilesystemError):
    """The file changed since the caller last saw it (``ESTALE``).

    Parameters
    ----------
    path : str
        The path as given.
    expected : datetime, optional
        The modification time the caller expected.
    actual : datetime, optional
        The modification time found.
    """

    default_errno = _errno.ESTALE

    def __init__(self, path: str, expected: datetime | None, actual: datetime | None) -> None:
        super().__init__(
            f"File was modified externally: {path} (expected mtime {_iso(expected)}, actual {_iso(actual)})",
            "ESTALE",
            path,
        )
        self.expected_mtime = expected
        self.actual_mtime = actual


class FilesystemNotReadyError(FilesystemError):
    """The filesystem could not be initialised (``ENOTREADY``)."""

    default_errno = _errno.EIO

    def __init__(self, filesystem_id: str) -> None:
        super().__init__(
            f'Filesystem "{filesystem_id}" is not ready. Call init() first or use ensureReady().',
            "ENOTREADY",
        )
        self.filesystem_id = filesystem_id


class UnsupportedGrepPatternError(FilesystemError, ValueError):
    """A native grep cannot run the pattern (``EUNSUPPORTED_PATTERN``)."""

    default_errno = _errno.EINVAL

    def __init__(self, pattern: str, reason: str | None = None) -> None:
        suffix = f" ({reason})" if reason else ""
        super().__init__(f"Unsupported grep pattern: {pattern}{suffix}", "EUNSUPPORTED_PATTERN")
        self.pattern = pattern


class InvalidPathError(FilesystemError, ValueError):
    """The path cannot name anything: a NUL byte, or not text (``EINVAL``)."""

    default_errno = _errno.EINVAL

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"Invalid path: {path!r} ({reason})", "EINVAL", path)
        self.reason = reason


class FileDecodeError(FilesystemError, ValueError):
    """A file read as text is not valid in the requested encoding (``EILSEQ``)."""

    default_errno = _errno.EILSEQ

    def __init__(self, path: str, encoding: str, detail: str) -> None:
        super().__init__(
            f"File is not valid {encoding} text: {path} ({detail}); read it without an encoding to get bytes",
            "EILSEQ",
            path,
        )
        self.encoding = encoding


class NoMountError(FilesystemError, FileNotFoundError):
    """A composite filesystem has no mount for the path (``ENOENT``)."""

    default_errno = _errno.ENOENT

    def __init__(self, path: str, kind: str = "path") -> None:
        super().__init__(f"No mount for {kind}: {path}", "ENOENT", path)


class NameTooLongError(FilesystemError):
    """A path segment is longer than 255 bytes in UTF-8 (``ENAMETOOLONG``)."""

    default_errno = _errno.ENAMETOOLONG

    def __init__(self, path: str) -> None:
        super().__init__(f"File name too long: {path}", "ENAMETOOLONG", path)


class NotRegularFile(FilesystemError):
    """A FIFO, device or socket was met where file contents were expected (``EINVAL``).

    Reading one could block forever (a FIFO) or never end (``/dev/zero``), so no tool opens
    them; they still show in listings and ``stat``.

    Parameters
    ----------
    path : str
        The path as given.
    kind : str
        ``FIFO``, ``character device``, ``block device`` or ``socket``.
    """

    default_errno = _errno.EINVAL

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(
            f"Not a regular file: {path} (a {kind}; only regular files can be read or written)",
            "EINVAL",
            path,
        )
        self.kind = kind


class FileTooLarge(FilesystemError):
    """A file is larger than the ``max_bytes`` a read was given (``EFBIG``); nothing past the
    limit was read.

    Parameters
    ----------
    path : str
        The path as given.
    limit : int
        The ``max_bytes`` of the read.
    """

    default_errno = _errno.EFBIG

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"File too large: {path} (more than {limit} bytes)", "EFBIG", path)
        self.limit = limit


class StorageAccessError(FilesystemError, PermissionError):
    """Storage refused the credentials, or none were found (``EACCES``): raised when a
    filesystem first reaches its storage (``probe``, before a mount), not by each call.

    Parameters
    ----------
    url : str
        The storage, as a URL without credentials.
    cause : str
        What storage said, in words (``"the access key ID is not known (InvalidAccessKeyId)"``).
    fix : str
        What to change.
    """

    default_errno = _errno.EACCES

    def __init__(self, url: str, cause: str, fix: str) -> None:
        super().__init__(f"Cannot use {url}: {cause}; {fix}", "EACCES", url)
        self.cause = cause
        self.fix = fix


class StorageUnreachableError(FilesystemError, ConnectionError):
    """The storage's endpoint does not answer (``ECONNREFUSED``, ``ETIMEDOUT``, ...).

    Parameters
    ----------
    url : str
        The storage, as a URL without credentials.
    endpoint : str
        The address that was tried.
    cause : str
        The failure (``"connection refused"``, ``"no answer within 5 s"``).
    error_number : int
        The errno of the failure.
    """

    default_errno = _errno.ECONNREFUSED

    def __init__(self, url: str, endpoint: str, cause: str, error_number: int = _errno.ECONNREFUSED) -> None:
        super().__init__(
            f"Cannot reach {endpoint} for {url}: {cause}; check endpoint_url (storage option) and that the "
            "server runs and is reachable from here",
            "EUNREACHABLE",
            url,
        )
        self.errno = error_number
        self.endpoint = endpoint
        self.cause = cause


# --------------------------------------------------------------------------------------------
# Sandbox errors
# --------------------------------------------------------------------------------------------


class SandboxError(_Rebuilt):
    """Base of command-execution errors.

    Parameters
    ----------
    message : str
        The message; ``str(err)`` returns it unchanged.
    code : str
        A stable code such as ``TIMEOUT``.
    details : dict, optional
        Extra data for callers.
    """

    def __init__(self, message: str, code: str = "SANDBOX_ERROR", details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or {}

    def __str__(self) -> str:
        return self.message


class SandboxExecutionError(SandboxError):
    """A command could not be executed (``EXECUTION_FAILED``)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, "EXECUTION_FAILED", details)


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A command ran past its timeout (``TIMEOUT``)."""

    def __init__(self, timeout_ms: int, details: dict[str, Any] | None = None) -> None:
        TimeoutError.__init__(self, f"Execution timed out after {timeout_ms}ms")
        self.message = f"Execution timed out after {timeout_ms}ms"
        self.code = "TIMEOUT"
        self.details = details or {}
        self.timeout_ms = timeout_ms
        self.args = (self.message,)


class SandboxNotReadyError(SandboxError):
    """The sandbox was destroyed or is not running (``NOT_READY``)."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"Sandbox is not ready: {sandbox_id}", "NOT_READY", {"id": sandbox_id})


class SandboxUnsupportedFeatureError(SandboxError):
    """The sandbox provider does not support an operation (``UNSUPPORTED_FEATURE``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "UNSUPPORTED_FEATURE")


class SandboxAbortError(SandboxError):
    """An operation was aborted (``ABORTED``)."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"Sandbox operation aborted: {operation}", "ABORTED", {"operation": operation})


class IsolationUnavailableError(SandboxError):
    """The requested isolation backend cannot run here (``ISOLATION_UNAVAILABLE``)."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(
            f"Isolation backend '{backend}' is not available: {reason}",
            "ISOLATION_UNAVAILABLE",
            {"backend": backend},
        )




class MountNotSupportedError(SandboxError):
    """The sandbox provider cannot mount filesystems (``MOUNT_NOT_SUPPORTED``)."""

    def __init__(self, provider: str) -> None:
        super().__init__(f"Sandbox provider '{provider}' does not support mounting", "MOUNT_NOT_SUPPORTED")


class FilesystemNotMountableError(SandboxError):
    """The filesystem has no mount configuration (``FILESYSTEM_NOT_MOUNTABLE``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "FILESYSTEM_NOT_MOUNTABLE")

# --------------------------------------------------------------------------------------------
# Mount errors
# --------------------------------------------------------------------------------------------


class MountError(_Rebuilt):
    """Mounting a filesystem failed (``MOUNT_ERROR``), into a sandbox or on its own.

    Parameters
    ----------
    message : str
        The message; ``str(err)`` returns it unchanged.
    details : dict, optional
        Extra data for callers.
    """

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = "MOUNT_ERROR"
        self.details = details or {}

    def __str__(self) -> str:
        return self.message


class MountToolNotFoundError(Exception):
    """The FUSE tool a mount needs is not installed; the mount becomes ``unavailable``."""


# --------------------------------------------------------------------------------------------
# Search errors
# --------------------------------------------------------------------------------------------


class MatchTimeout(_Rebuilt, TimeoutError):
    """A search used up its time budget (or was cancelled) before it finished.

    Attributes
    ----------
    pattern : str
        The pattern's source.
    seconds : float
        The budget that ran out.
    path : str or None
        The file being searched when it ran out, once a caller knows it.
    """

    def __init__(self, pattern: str, seconds: float, path: str | None = None) -> None:
        self.pattern = pattern
        self.seconds = seconds
        self.path = path
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        where = f" (stopped in {path})" if path else ""
        super().__init__(
            f"grep: matching {shown!r} took longer than {seconds:g} s{where}; simplify the pattern "
            "(nested quantifiers such as (a+)+ can take exponential time) or search fewer files"
        )

    def at(self, path: str) -> MatchTimeout:
        """The same timeout, naming the file it happened in."""
        return MatchTimeout(self.pattern, self.seconds, path)


class MissingExtraError(_Rebuilt, ModuleNotFoundError):
    """A feature needs an optional part of agentvfs that is not installed; the message names
    the ``pip install`` that brings it. Also a :class:`ModuleNotFoundError`.

    Parameters
    ----------
    feature : str
        What was asked for (``"FUSE mounts"``).
    extra : str
        The extra that brings it (``fuse``).
    module : str
        The module that is missing (``pyfuse3``).
    """

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature}: the module {module!r} is not installed; pip install 'agentvfs[{extra}]'",
            name=module,
        )
        self.feature = feature
        self.extra = extra
        self.module = module


class SearchIndexError(_Rebuilt, RuntimeError):
    """The index in ``index_dir`` cannot be used as it is (nothing was changed or deleted)."""


class IndexConflictError(SearchIndexError):
    """Another builder wrote the index's next manifest first; this build's manifest was not
    written (the winner's is intact).

    Attributes
    ----------
    winner : int
        The number of the manifest the other builder wrote.
    """

    def __init__(self, message: str, winner: int) -> None:
        super().__init__(message)
        self.winner = winner


class BM25FileError(_Rebuilt, OSError):
    """The index file cannot be used: not a DuckDB file, corrupt, foreign, or locked.

    The file is never modified or deleted when this is raised; ``filename`` names it.
    """

    def __init__(self, message: str, filename: str) -> None:
        super().__init__(message)
        self.filename = filename

    def __str__(self) -> str:
        return str(self.args[0])


class EmbeddingError(_Rebuilt, ValueError):
    """The embedder failed or returned something that is not a usable vector.

    Attributes
    ----------
    failures : dict
        Index of each text that failed -> why.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or {}


# --------------------------------------------------------------------------------------------
# Skill errors
# --------------------------------------------------------------------------------------------


class InvalidSkillError(_Rebuilt, ValueError):
    """A SKILL.md that cannot be loaded: unreadable front matter, or metadata that breaks the
    Agent Skills rules (the message lists every problem, one a line)."""

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])


class SkillConflictError(_Rebuilt, ValueError):
    """Two distinct skills of the same name and the same source type: neither wins."""


class InvalidSkillPathError(_Rebuilt, ValueError, PermissionError):
    """A path inside a skill that is absolute, climbs out with ``..``, or resolves outside the
    skill directory (``EACCES``); nothing outside the skill is ever read."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.errno = _errno.EACCES
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror or ""


class BlobIntegrityError(_Rebuilt, OSError):
    """A stored blob or manifest whose content does not hash to its name (``EIO``): it is
    never served, and a restore does not write it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = _errno.EIO
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror or ""


# --------------------------------------------------------------------------------------------
# Edit errors (edit_file returns their messages rather than raising them)
# --------------------------------------------------------------------------------------------

NOT_FOUND_MESSAGE = "The specified text was not found. Make sure you use the exact text from the file."


class StringNotFoundError(_Rebuilt, ValueError):
    """``old_string`` does not occur (edit_file returns this message rather than raising)."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND_MESSAGE)


class StringNotUniqueError(_Rebuilt, ValueError):
    """``old_string`` occurs more than once and ``replace_all`` is False."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"The specified text appears {count} times. Provide more surrounding context to make "
            "the match unique, or use replace_all to replace all occurrences."
        )
        self.count = count
