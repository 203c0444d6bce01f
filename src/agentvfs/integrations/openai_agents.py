"""agentvfs inside the OpenAI Agents SDK (``pip install 'agentvfs[openai-agents]'``).

Three pieces, each usable alone:

- :func:`function_tools`: the workspace's agent tools as the SDK's ``FunctionTool`` objects,
  for a plain ``agents.Agent``.
- :class:`FsspecSnapshotStore`: the store behind the SDK's ``RemoteSnapshotSpec``, keeping
  each workspace snapshot (a tar) as one object under a prefix of any storage agentvfs
  reaches (S3, GCS, memory, a local directory).
- :class:`AgentVFSSandboxClient`: a sandbox backend for ``SandboxAgent``. Each session is an
  agentvfs :class:`~agentvfs.Workspace` on any storage, FUSE-mounted into a
  :class:`~agentvfs.LocalSandbox` (bubblewrap isolation by default), so the SDK's shell
  commands and its file API see the same files. The manifest's ``S3Mount`` and ``GCSMount``
  entries are served the same way (an agentvfs mount of the bucket, no rclone or
  mountpoint-s3); git checkouts and other mount kinds are refused.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import posixpath
import shlex
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, cast

import anyio
import anyio.from_thread
import anyio.to_thread

from agentvfs import (
    FileNotFound,
    FilesystemError,
    FsspecFilesystem,
    IsDirectory,
    LocalSandbox,
    NotRegularFile,
    ToolMedia,
    Workspace,
    WorkspaceFilesystem,
    WorkspaceTool,
)
from agentvfs.integrations import require
from agentvfs.integrations._archives import (
    EXTRACTED_REASON,
    MEMBERS_REASON,
    ArchiveFormatError,
    ArchiveLimitError,
    TarLimits,
    TarMember,
    TarReader,
    check_zip,
)
from agentvfs.mounts import is_mounted
from agentvfs.tools import openai_tools
from agentvfs.vfs import (
    SupportsRangedRead,
    SupportsReadInto,
    download_file,
    read_range_into,
    upload_file,
)

require("agents", "openai-agents", __name__)

from agents import (  # noqa: E402  (the framework is imported only after require() named the extra)
    FunctionTool,
    RunContextWrapper,
    ToolOutputFileContent,
    ToolOutputImage,
    ToolOutputText,
)
from agents.sandbox import Manifest, SandboxArchiveLimits  # noqa: E402
from agents.sandbox.entries import BaseEntry, Dir, GCSMount, Mount, S3Mount  # noqa: E402
from agents.sandbox.errors import (  # noqa: E402
    ExecNonZeroError,
    ExecTimeoutError,
    ExecTransportError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.files import EntryKind, FileEntry  # noqa: E402
from agents.sandbox.session import (  # noqa: E402
    BaseSandboxClient,
    BaseSandboxClientOptions,
    BaseSandboxSession,
    Dependencies,
    Instrumentation,
    SandboxSession,
    SandboxSessionState,
    manifest_ops,
)
from agents.sandbox.session.archive_extraction import (  # noqa: E402
    ArchiveResourceLimitError,
    validate_tar_archive_for_extraction,
)
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot  # noqa: E402
from agents.sandbox.types import ExecResult, Permissions, User  # noqa: E402
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, safe_tar_member_rel_path  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = [
    "SUPPORTED_ENTRY_TYPES",
    "SUPPORTED_MOUNT_TYPES",
    "AgentVFSSandboxClient",
    "AgentVFSSandboxClientOptions",
    "AgentVFSSandboxSession",
    "AgentVFSSandboxSessionState",
    "FsspecSnapshotStore",
    "function_tools",
]

#: Manifest entry kinds a session materialises (through its filesystem). Git checkouts need
#: the network the sandbox does not have: they are refused before anything is written, as
#: are mount kinds other than those in :data:`SUPPORTED_MOUNT_TYPES`.
SUPPORTED_ENTRY_TYPES = frozenset({"file", "dir", "local_file", "local_dir"})

#: Manifest mount kinds a session serves itself: each such entry becomes an agentvfs mount
#: of the bucket (s3fs / gcsfs on the host, never rclone or mountpoint-s3) at the entry's
#: path, read-only when the entry is. The entry's ``mount_strategy`` is not used. Other mount
#: kinds (Azure Blob, R2, Box, S3 Files) are refused before anything is written.
SUPPORTED_MOUNT_TYPES = frozenset({"s3_mount", "gcs_mount"})

_DEFAULT_ROOT = str(Manifest.model_fields["root"].default)
_MOUNT_NAME = "workspace"
_BACKEND_ID = "agentvfs"

FilesystemSource = WorkspaceFilesystem | Callable[[str], WorkspaceFilesystem] | None


# -- function tools ------------------------------------------------------------------------------


def _model_output(tool: WorkspaceTool, result: Any) -> Any:
    """The SDK's output for one tool result: the text as it is, media as typed parts."""
    if isinstance(result, ToolMedia):
        url = f"data:{result.media_type};base64,{result.data}"
        media: ToolOutputImage | ToolOutputFileContent
        if result.media_type.startswith("image/"):
            media = ToolOutputImage(image_url=url)
        else:
            media = ToolOutputFileContent(file_data=url)
        return [ToolOutputText(text=result.text), media]
    return "" if result is None else str(result)


def _function_tool(tool: WorkspaceTool, definition: Mapping[str, Any]) -> FunctionTool:
    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        # Errors go back to the model as text, as the SDK expects of a tool: the model can
        # correct its call; only cancellation (a BaseException) ends the run.
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return f"Error: the arguments of {tool.name} are not valid JSON ({exc.msg}); send a JSON object"
        if not isinstance(args, dict):
            return f"Error: the arguments of {tool.name} must be a JSON object, not {type(args).__name__}"
        try:
            result = await tool.execute(args, tool_call_id=context.tool_call_id)
        except Exception as exc:
            return f"Error: {exc}"
        return _model_output(tool, result)

    approval: bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Any] = False
    if tool.require_approval:
        # Asked per call with the call's arguments: WorkspaceTool.needs_approval answers for a
        # fixed True and for a configured policy function alike.
        async def per_call(
            _ctx: RunContextWrapper[Any], params: dict[str, Any], _call_id: str
        ) -> bool:
            return await tool.needs_approval(params)

        approval = per_call

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=dict(definition["parameters"]),
        on_invoke_tool=invoke,
        strict_json_schema=True,
        needs_approval=approval,
    )


async def function_tools(
    workspace: Workspace | Mapping[str, WorkspaceTool], *, names: Sequence[str] | None = None
) -> list[FunctionTool]:
    """The workspace's agent tools as OpenAI Agents SDK ``FunctionTool`` objects.

    Parameters
    ----------
    workspace : Workspace or mapping of str to WorkspaceTool
        A workspace (its tools are created with ``await workspace.create_tools()``), or the
        mapping that call returned (to reuse tools already configured).
    names : sequence of str, optional
        Keep only these tools (exposed names); all by default.

    Returns
    -------
    list of FunctionTool
        One per tool, with the strict JSON schema of :func:`agentvfs.tools.openai_tools`.
        Invoking one runs the ``WorkspaceTool`` and returns its output string (media as a
        text part plus an image or file part); a failure (bad arguments, a missing file) is
        returned to the model as ``"Error: ..."`` rather than raised. A tool that requires
        approval has ``needs_approval`` set to a per-call function that asks
        ``WorkspaceTool.needs_approval`` (always yes for a fixed ``require_approval``, the
        configured policy otherwise); the others have ``needs_approval=False``.

    Raises
    ------
    KeyError
        ``names`` lists a tool the workspace does not have (the message names it).
    """
    tools = await workspace.create_tools() if isinstance(workspace, Workspace) else dict(workspace)
    if names is not None:
        missing = [name for name in names if name not in tools]
        if missing:
            raise KeyError(
                f"no such workspace tool: {', '.join(missing)}; the tools are {', '.join(tools)}"
            )
        tools = {name: tools[name] for name in names}
    definitions = openai_tools(tools)
    return [
        _function_tool(tool, definition["function"])
        for tool, definition in zip(tools.values(), definitions, strict=True)
    ]


# -- snapshot store ------------------------------------------------------------------------------


class FsspecSnapshotStore:
    """Where ``RemoteSnapshotSpec`` keeps workspace snapshots: one tar object per snapshot.

    Bind it under the spec's ``client_dependency_key`` on the ``Dependencies`` given to the
    sandbox client::

        deps = Dependencies().bind_value("snapshots", FsspecSnapshotStore("s3://bucket/snaps"))
        client = AgentVFSSandboxClient(dependencies=deps)
        snapshot = RemoteSnapshotSpec(client_dependency_key="snapshots")

    A snapshot is written in one whole-object write (one PUT, or a staged file renamed on a
    disk), so a reader sees the previous snapshot or the new one, never part of one; an
    upload that fails leaves the previous snapshot as it was and raises (the SDK reports it
    as ``SnapshotPersistError``).

    Parameters
    ----------
    storage : WorkspaceFilesystem or str or fsspec.AbstractFileSystem
        Where the snapshots go: an agentvfs filesystem, a URL (``s3://bucket/prefix``), or
        an fsspec filesystem (with ``root`` naming the prefix).
    root : str
        The prefix inside an fsspec filesystem given as ``storage``.
    storage_options : dict, optional
        Passed to fsspec with a URL (endpoint, credentials).
    """

    def __init__(
        self, storage: Any, *, root: str = "", storage_options: dict[str, Any] | None = None
    ) -> None:
        if isinstance(storage, WorkspaceFilesystem):
            self.filesystem: WorkspaceFilesystem = storage
        else:
            self.filesystem = FsspecFilesystem(storage, root=root, storage_options=storage_options)

    @staticmethod
    def key(snapshot_id: str) -> str:
        """The object name of a snapshot (``<id>.tar``).

        Raises
        ------
        ValueError
            The id is empty or not a single path segment (it would name another place).
        """
        if (
            not isinstance(snapshot_id, str)
            or snapshot_id in ("", ".", "..")
            or "/" in snapshot_id
            or "\\" in snapshot_id
            or "\0" in snapshot_id
        ):
            raise ValueError(
                f"snapshot id {snapshot_id!r} must be one path segment (no '/', not '.' or '..')"
            )
        return f"{snapshot_id}.tar"

    async def upload(self, snapshot_id: str, data: io.IOBase) -> None:
        """Store ``data`` (the workspace tar) as snapshot ``snapshot_id``, replacing it whole."""
        key = self.key(snapshot_id)
        # The whole payload is copied to a local file before the upload begins: a stream that
        # fails half-way raises here, before any byte reaches the storage; and a large tar is
        # uploaded from disk (in parts where the storage can), never held whole in memory.
        descriptor, local_path = tempfile.mkstemp(prefix="agentvfs-snapshot-")
        os.close(descriptor)
        try:
            await anyio.to_thread.run_sync(_copy_stream, data, local_path)
            await upload_file(self.filesystem, local_path, key)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_path)

    async def download(self, snapshot_id: str) -> io.IOBase:
        """The stored tar of snapshot ``snapshot_id``, as a binary stream.

        Raises
        ------
        FileNotFound
            There is no such snapshot.
        """
        key = self.key(snapshot_id)
        # Into an unnamed local file (the name is unlinked at once): a large snapshot streams
        # to disk rather than into memory, and nothing is left behind once it is closed.
        descriptor, local_path = tempfile.mkstemp(prefix="agentvfs-snapshot-")
        os.close(descriptor)
        try:
            await download_file(self.filesystem, key, local_path)
            stream = open(local_path, "rb")  # noqa: ASYNC230, SIM115  (returned open, local disk)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_path)
        return cast(io.IOBase, stream)

    async def exists(self, snapshot_id: str) -> bool:
        """Whether snapshot ``snapshot_id`` is stored."""
        return await self.filesystem.exists(self.key(snapshot_id))

    async def delete(self, snapshot_id: str) -> None:
        """Remove snapshot ``snapshot_id`` (no error when it is not there)."""
        await self.filesystem.delete_file(self.key(snapshot_id), force=True)


# -- the sandbox backend -------------------------------------------------------------------------


class AgentVFSSandboxSessionState(SandboxSessionState):
    """What is kept of a session between processes: the SDK's state plus the host directory
    the session owns (the working directory its storage is mounted in)."""

    type: Literal["agentvfs"] = "agentvfs"
    working_directory: str = ""


class AgentVFSSandboxClientOptions(BaseSandboxClientOptions):
    """Options of :meth:`AgentVFSSandboxClient.create` (none yet; the storage and the
    isolation are chosen by the client, under the application's control)."""

    type: Literal["agentvfs"] = "agentvfs"


def _memory_filesystem(_session_id: str) -> WorkspaceFilesystem:
    from fsspec.implementations.memory import MemoryFileSystem

    return FsspecFilesystem(
        MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/workspace"
    )


def _bucket_root(bucket: str, prefix: str | None) -> str:
    prefix = (prefix or "").strip("/")
    return f"{bucket}/{prefix}" if prefix else bucket


def _bucket_filesystem(entry: Mount) -> WorkspaceFilesystem:
    """An agentvfs filesystem over the bucket (and prefix) a manifest mount entry names.

    The credentials are passed to the s3fs / gcsfs instance only (a fresh one, never taken
    from or put in fsspec's instance cache); without them the library's default chain
    (environment, config files, instance metadata) applies.
    """
    if isinstance(entry, S3Mount):
        import s3fs

        s3_options: dict[str, Any] = {"skip_instance_cache": True}
        if entry.access_key_id is not None:
            s3_options["key"] = entry.access_key_id
        if entry.secret_access_key is not None:
            s3_options["secret"] = entry.secret_access_key
        if entry.session_token is not None:
            s3_options["token"] = entry.session_token
        if entry.endpoint_url is not None:
            s3_options["endpoint_url"] = entry.endpoint_url
        if entry.region is not None:
            s3_options["client_kwargs"] = {"region_name": entry.region}
        raw: Any = s3fs.S3FileSystem(**s3_options)
    elif isinstance(entry, GCSMount):
        if entry.access_id is not None and entry.secret_access_key is not None:
            # HMAC keys: GCS's S3-compatible XML API, as the SDK's rclone pattern does.
            import s3fs

            raw = s3fs.S3FileSystem(
                key=entry.access_id,
                secret=entry.secret_access_key,
                endpoint_url=entry.endpoint_url or "https://storage.googleapis.com",
                client_kwargs={"region_name": entry.region} if entry.region else None,
                skip_instance_cache=True,
            )
        else:
            import gcsfs

            gcs_options: dict[str, Any] = {"skip_instance_cache": True}
            if entry.service_account_credentials is not None:
                gcs_options["token"] = json.loads(entry.service_account_credentials)
            elif entry.service_account_file is not None:
                gcs_options["token"] = entry.service_account_file
            elif entry.access_token is not None:
                from google.oauth2.credentials import Credentials

                gcs_options["token"] = Credentials(token=entry.access_token)  # type: ignore[no-untyped-call]
            if entry.endpoint_url is not None:
                gcs_options["endpoint_url"] = entry.endpoint_url
            raw = gcsfs.GCSFileSystem(**gcs_options)
    else:  # _check_manifest refuses these first
        raise ValueError(f"AgentVFSSandboxClient cannot mount a {entry.type!r} entry")
    return FsspecFilesystem(
        raw, root=_bucket_root(entry.bucket, entry.prefix), read_only=entry.read_only
    )


def _without_served_mounts(entries: Mapping[Any, BaseEntry]) -> dict[Any, BaseEntry]:
    """Manifest entries minus the bucket mounts the session serves itself (at any depth)."""
    kept: dict[Any, BaseEntry] = {}
    for key, entry in entries.items():
        if isinstance(entry, Mount) and entry.type in SUPPORTED_MOUNT_TYPES:
            continue
        if isinstance(entry, Dir):
            entry = entry.model_copy(update={"children": _without_served_mounts(entry.children)})
        kept[key] = entry
    return kept


def _tar_member_path(name: str) -> str | None:
    """The relative path a tar member names, '' for the root, None when it escapes."""
    path = posixpath.normpath(name.replace("\\", "/"))
    if path in (".", ""):
        return ""
    if path.startswith("/") or path == ".." or path.startswith("../"):
        return None
    return path


_log = logging.getLogger(__name__)

#: The largest read from the storage while a file is copied (into a snapshot, for ``read``):
#: copying a file of any size holds at most this much of it in memory at a time.
_CHUNK_BYTES = 8 * 1024 * 1024
#: The first read of a file is this small, so the many small files of a workspace do not
#: each cost a large buffer.
_FIRST_CHUNK_BYTES = 64 * 1024
#: What a spooled archive or file keeps in memory before it moves to a temporary file.
_SPOOL_BYTES = 16 * 1024 * 1024

# The reasons the SDK's own archive extraction gives (agents.sandbox.session.archive_ops and
# archive_extraction), so callers match one set of strings whichever backend refused.
_MEMBERS_REASON = MEMBERS_REASON
_EXTRACTED_REASON = EXTRACTED_REASON
_INPUT_REASON = "archive input size exceeds limit"
_FILE_REASON = "file size exceeds limit"


class _TooLarge(Exception):
    """A file holds more bytes than the copy was allowed (``actual``: those seen so far)."""

    def __init__(self, actual: int) -> None:
        super().__init__(actual)
        self.actual = actual


def _spooled() -> tempfile.SpooledTemporaryFile[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES, mode="w+b")


#: Where each SDK limit is set, for the message of an archive refused by it.
_SETTINGS = {
    _MEMBERS_REASON: "SandboxArchiveLimits.max_members",
    _EXTRACTED_REASON: "SandboxArchiveLimits.max_extracted_bytes",
    _INPUT_REASON: "SandboxArchiveLimits.max_input_bytes",
    _FILE_REASON: "SandboxArchiveLimits.max_extracted_bytes",
}


def _limit_error(
    error: type[WorkspaceArchiveReadError] | type[WorkspaceArchiveWriteError],
    path: Path,
    *,
    reason: str,
    limit: int,
    actual: int,
    member: str | None = None,
) -> WorkspaceArchiveReadError | WorkspaceArchiveWriteError:
    """The SDK's error for an archive past one of its limits: the context its own extraction
    reports, the SDK's ``ArchiveResourceLimitError`` as the cause, and a message that names
    the limit (and the setting that raises it, for the SDK's)."""
    cause = ArchiveResourceLimitError(reason=reason, limit=limit, actual=actual, member=member)
    context: dict[str, object] = {"reason": reason, "limit": limit, "actual": actual}
    message = f"{reason}: {actual} > {limit}"
    if member is not None:
        context["member"] = member
        message += f" at member {member!r}"
    message += f", in the archive of {path}"
    setting = _SETTINGS.get(reason)
    message += f"; raise {setting} to allow it" if setting else " (a fixed bound of every archive read)"
    made = error(path=path, context=context, cause=cause)
    # The read error takes no message of its own: set as the SDK's __post_init__ sets it.
    made.message, made.args = message, (message,)
    return made


def _archive_error(
    exc: ArchiveLimitError | ArchiveFormatError, path: Path
) -> WorkspaceArchiveWriteError:
    """The SDK's error for an archive the bounded reader refused (see ``_archives``)."""
    if isinstance(exc, ArchiveLimitError):
        error = _limit_error(
            WorkspaceArchiveWriteError, path, reason=exc.reason, limit=exc.limit, actual=exc.actual, member=exc.member
        )
        assert isinstance(error, WorkspaceArchiveWriteError)
        return error
    return WorkspaceArchiveWriteError(
        path=path, context={"reason": "invalid archive"}, cause=exc, message=f"cannot read the archive for {path}: {exc}"
    )


def _tar_limits(limits: SandboxArchiveLimits) -> TarLimits:
    """The bounded reader's limits for the SDK's (the name and header bounds are fixed)."""
    return TarLimits(max_members=limits.max_members, max_extracted_bytes=limits.max_extracted_bytes)


async def _copy_file(
    filesystem: WorkspaceFilesystem, path: str, sink: IO[bytes], *, budget: int | None
) -> int:
    """Copy a stored file into ``sink`` a chunk at a time and return its size.

    Raises
    ------
    _TooLarge
        The file holds more than ``budget`` bytes (found within one chunk of the budget,
        so a file that grows while it is read is stopped too).
    NotRegularFile
        A FIFO, socket or device (never opened).
    """
    if not isinstance(filesystem, (SupportsReadInto, SupportsRangedRead)):
        # Without ranged reads each chunk would fetch the whole file: read it once instead.
        content = await filesystem.read_file(path)
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        if budget is not None and len(data) > budget:
            raise _TooLarge(len(data))
        sink.write(data)
        return len(data)
    buffer = memoryview(bytearray(_FIRST_CHUNK_BYTES))
    offset = 0
    while True:
        count = await read_range_into(filesystem, path, offset, buffer)
        offset += count
        if budget is not None and offset > budget:
            raise _TooLarge(offset)
        if count < len(buffer):
            sink.write(buffer[:count])
            return offset
        # A full chunk: a large file, whose spooled copy may be on disk by now.
        await anyio.to_thread.run_sync(sink.write, buffer)
        if len(buffer) < _CHUNK_BYTES:
            buffer = memoryview(bytearray(_CHUNK_BYTES))


def _spool_input(
    data: io.IOBase, limits: SandboxArchiveLimits, path: Path
) -> tempfile.SpooledTemporaryFile[bytes]:
    """A seekable copy of an archive stream, refused past ``limits.max_input_bytes``."""
    spool = _spooled()
    total = 0
    try:
        while True:
            chunk = data.read(_CHUNK_BYTES)
            if not chunk:
                break
            payload = chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
            total += len(payload)
            if limits.max_input_bytes is not None and total > limits.max_input_bytes:
                raise _limit_error(
                    WorkspaceArchiveWriteError,
                    path,
                    reason=_INPUT_REASON,
                    limit=limits.max_input_bytes,
                    actual=total,
                )
            spool.write(payload)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


def _copy_stream(source: io.IOBase, local_path: str) -> None:
    with open(local_path, "wb") as target:
        while chunk := source.read(_CHUNK_BYTES):
            target.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)


def _read_upto(data: io.IOBase, size: int) -> bytes:
    """The first ``size`` bytes of a stream (fewer only at its end); text is UTF-8."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = data.read(size - got)
        if not chunk:
            break
        payload = chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
        parts.append(payload)
        got += len(payload)
    return b"".join(parts)


def _spill(head: bytes, data: io.IOBase, local_path: str) -> None:
    """``head`` and then the rest of ``data`` into a local file, a chunk at a time."""
    with open(local_path, "wb") as target:
        target.write(head)
        while chunk := data.read(_CHUNK_BYTES):
            target.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)


async def _store(filesystem: WorkspaceFilesystem, path: str, data: io.IOBase) -> None:
    """Write a stream into a stored file: whole when it is at most a chunk, else through a
    local temporary file the storage uploads (in parts where it can, S3 multipart), so that
    no more than a chunk of it is ever in memory. The stream is read in worker threads (it
    may decompress, as an archive member does)."""
    head = await anyio.to_thread.run_sync(_read_upto, data, _CHUNK_BYTES + 1)
    if len(head) <= _CHUNK_BYTES:
        await filesystem.write_file(path, head, recursive=True)
        return
    descriptor, local_path = tempfile.mkstemp(prefix="agentvfs-write-")
    os.close(descriptor)
    try:
        await anyio.to_thread.run_sync(_spill, head, data, local_path)
        del head
        parent = posixpath.dirname(path)
        if parent:
            await filesystem.mkdir(parent, recursive=True)
        await upload_file(filesystem, local_path, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(local_path)


class _MemberStream(io.RawIOBase):
    """The content of the member a :class:`TarReader` last returned, as a binary stream."""

    def __init__(self, reader: TarReader) -> None:
        self._reader = reader

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        return self._reader.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self._reader.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


_TAR_TYPES: dict[str, bytes] = {
    "file": tarfile.REGTYPE,
    "directory": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "other": tarfile.CHRTYPE,  # the SDK refuses it, as it refuses every other kind
}


def _tar_info(member: TarMember) -> tarfile.TarInfo:
    """A member as the SDK's checks take it (a ``TarInfo`` made here, never parsed)."""
    info = tarfile.TarInfo(member.name)
    info.type = _TAR_TYPES[member.kind]
    info.size = member.size
    return info


def _validate_tar(stream: IO[bytes], limits: SandboxArchiveLimits) -> None:
    """The SDK's whole-archive checks of ``extract()``, over the bounded reader's members."""
    reader = TarReader(stream, _tar_limits(limits), check=anyio.from_thread.check_cancelled)
    validate_tar_archive_for_extraction(cast(Any, (_tar_info(member) for member in reader)), archive_limits=limits)


def _record_entry(
    listed: dict[Path, dict[str, EntryKind]], root: Path, relative: Path, directory: bool
) -> None:
    """Note a member just written in the listings already read (what the next member's
    check of links on the way sees)."""
    parent = root
    for index, part in enumerate(relative.parts):
        last = index == len(relative.parts) - 1
        children = listed.get(parent)
        if children is not None:
            children[part] = EntryKind.FILE if last and not directory else EntryKind.DIRECTORY
        parent /= part


class AgentVFSSandboxSession(BaseSandboxSession):
    """A sandbox session over an agentvfs workspace (see :class:`AgentVFSSandboxClient`).

    The workspace root (``state.manifest.root``) is a host directory in the session's
    working directory where the storage is FUSE-mounted; bubblewrap binds it at the same
    path, so commands, ``read``/``write`` and snapshots all name files alike. ``read``,
    ``write``, ``mkdir``, ``rm`` and snapshots go to the storage directly; commands and the
    SDK's other file operations (``ls``, ``mv``, patches) go through the mount.

    Attributes
    ----------
    filesystem : WorkspaceFilesystem
        The session's storage.
    workspace : Workspace or None
        The live workspace (None before start and after shutdown): its agent tools work on
        the same files (``await session.workspace.create_tools()``).
    """

    state: AgentVFSSandboxSessionState

    def __init__(
        self,
        *,
        state: AgentVFSSandboxSessionState,
        filesystem: WorkspaceFilesystem,
        isolation: str = "bwrap",
        env: Mapping[str, str] | None = None,
        archive_limits: SandboxArchiveLimits | None = None,
    ) -> None:
        self.state = state
        self.filesystem = filesystem
        self._default_archive_limits = (
            archive_limits if archive_limits is not None else SandboxArchiveLimits()
        )
        self.workspace: Workspace | None = None
        self._sandbox: LocalSandbox | None = None
        self._isolation = isolation
        self._env = dict(env or {})
        self._running = False
        # (workspace-relative path, filesystem) of each bucket mount, deepest first; held in
        # memory only, so their credentials never reach the serialized state.
        self._bucket_mounts: list[tuple[str, WorkspaceFilesystem]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def _root(self) -> Path:
        return Path(self.state.manifest.root)

    def _limits(self) -> SandboxArchiveLimits:
        """The archive limits in force: the run's (``SandboxRunConfig.archive_limits``, which
        the runner sets on the session), else the client's."""
        return self._archive_limits if self._archive_limits is not None else self._default_archive_limits

    async def _ensure_backend_started(self) -> None:
        if self.workspace is not None:
            return
        working_directory = self.state.working_directory
        try:
            os.makedirs(working_directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise WorkspaceStartError(path=Path(working_directory), cause=exc) from exc
        sandbox = LocalSandbox(
            working_directory=working_directory, isolation=self._isolation, env=self._env
        )
        root_mount = f"/{_MOUNT_NAME}"
        workspace = Workspace(sandbox=sandbox, mounts={root_mount: self.filesystem})
        bucket_mounts: list[tuple[str, WorkspaceFilesystem]] = []
        try:
            await workspace.init()
            self._check_mounted(sandbox, root_mount, "the session's storage")
            # The workspace's own mounts cannot nest, so each bucket is mounted on the sandbox
            # directly, below the storage's mount (outermost first; the mount point is a
            # directory of the storage).
            for relative, entry in _bucket_mount_targets(self.state.manifest):
                bucket = _bucket_filesystem(entry)
                outcome = await sandbox.mount(bucket, f"{root_mount}/{relative}")
                if not outcome.get("success"):
                    reason = outcome.get("error") or "the mount did not start"
                    raise WorkspaceStartError(
                        path=self._root(),
                        message=f"cannot mount a bucket at {self._root() / relative}: {reason}",
                    )
                bucket_mounts.append((relative, bucket))
        except BaseException:
            with contextlib.suppress(Exception):
                await workspace.destroy()
            raise
        self.workspace = workspace
        self._sandbox = sandbox
        self._bucket_mounts = sorted(bucket_mounts, key=lambda item: -len(item[0].split("/")))

    def _check_mounted(self, sandbox: LocalSandbox, mount_path: str, what: str) -> None:
        entry = sandbox.mounts.entries.get(mount_path)
        if entry is None or entry.state != "mounted":
            reason = getattr(entry, "error", None) or "the mount did not start"
            raise WorkspaceStartError(
                path=self._root(), message=f"cannot mount {what} at {self._root()}: {reason}"
            )

    async def _validate_manifest_application(
        self,
        *,
        only_ephemeral: bool = False,
        manifest: Manifest | None = None,
        session_running: bool | None = None,
    ) -> None:
        await super()._validate_manifest_application(
            only_ephemeral=only_ephemeral, manifest=manifest, session_running=session_running
        )
        _check_manifest(manifest or self.state.manifest)

    async def _apply_manifest(
        self, *, only_ephemeral: bool = False, provision_accounts: bool = True
    ) -> Any:
        _check_manifest(self.state.manifest)
        # The bucket mounts are live since the backend started: the SDK's own mount entry
        # would run its strategy (rclone, mountpoint-s3), so it is left out here.
        manifest = self.state.manifest.model_copy(
            update={"entries": _without_served_mounts(self.state.manifest.entries)}
        )
        return await manifest_ops.apply_manifest(
            self,
            manifest=manifest,
            only_ephemeral=only_ephemeral,
            provision_accounts=provision_accounts,
        )

    async def provision_manifest_accounts(self) -> None:
        _check_manifest(self.state.manifest)

    async def _after_start(self) -> None:
        self._running = True

    async def _after_start_failed(self) -> None:
        self._running = False

    async def _shutdown_backend(self) -> None:
        workspace, self.workspace, self._sandbox = self.workspace, None, None
        self._bucket_mounts = []
        self._running = False
        if workspace is not None:
            # Kills the commands and unmounts; stored files are never deleted.
            await workspace.destroy()

    async def running(self) -> bool:
        return self._running and self.workspace is not None

    # -- commands --------------------------------------------------------------------------------

    def _prepare_exec_command(
        self, *command: str | Path, shell: bool | list[str], user: str | User | None
    ) -> list[str]:
        if user:
            raise ValueError(
                "AgentVFSSandboxSession runs every command as the sandbox's one user; "
                f"drop user={user!r} (manifest users are not supported)"
            )
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _exec_internal(
        self,
        *command: str | Path,
        timeout: float | None = None,  # noqa: ASYNC109  (the SDK signature: seconds)
    ) -> ExecResult:
        if self._sandbox is None:
            raise ExecTransportError(
                command=command, message="the session is not started (use `async with session`)"
            )
        line = shlex.join(str(part) for part in command)
        env = await self.state.manifest.environment.resolve()
        env.setdefault("HOME", str(self._root()))
        try:
            result = await self._sandbox.execute_command(
                line,
                cwd=_MOUNT_NAME,
                env=env,
                timeout=None if timeout is None else timeout * 1000,
            )
        except Exception as exc:
            raise ExecTransportError(command=command, cause=exc) from exc
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(
            stdout=result.stdout.encode("utf-8", "surrogateescape"),
            stderr=result.stderr.encode("utf-8", "surrogateescape"),
            exit_code=result.exit_code if result.exit_code is not None else 1,
        )

    # -- files -----------------------------------------------------------------------------------
    # The file API goes straight to the storage through the filesystem object that is mounted
    # (a bucket mount's own filesystem below its mount point, see _storage),
    # and commands see it through the mount: the mount drops what it cached about a path
    # before such a write returns, in this process or in a mount process (S3, GCS).

    async def _relative(self, path: Path | str, *, for_write: bool = False) -> tuple[Path, str]:
        """The SDK's path checked against the workspace (escapes raise the SDK's
        ``InvalidManifestPathError``) and the storage path it names.

        While the session runs, symlinks on the way are followed as a command would follow
        them, through the mount: a link a command left pointing out of the workspace
        (``ln -s /etc/passwd x``) is refused like ``../x``, rather than the storage reading
        or replacing the link itself while commands see the outside file.
        """
        normalized = self.normalize_path(path, for_write=for_write)
        root = self._root()
        if self.workspace is not None:
            # In a worker thread: the mount's server may call back into this event loop.
            normalized, root = await anyio.to_thread.run_sync(
                self._resolve_links, normalized, for_write
            )
        try:
            relative = normalized.relative_to(root).as_posix()
        except ValueError as exc:
            # A path grant outside the workspace: the storage does not hold it.
            raise InvalidManifestPathError(rel=str(path), reason="escape_root", cause=exc) from exc
        return normalized, "" if relative == "." else relative

    def _resolve_links(self, normalized: Path, for_write: bool) -> tuple[Path, Path]:
        """``normalized`` with its symlinks followed on the host (escapes raise), and the
        workspace root likewise resolved (its host directory may sit below a link)."""
        resolved = self._workspace_path_policy().normalize_path(
            normalized, for_write=for_write, resolve_symlinks=True
        )
        return resolved, self._root().resolve()

    def _storage(self, relative: str) -> tuple[WorkspaceFilesystem, str]:
        """The filesystem serving a workspace-relative path (a bucket mount's below its mount
        point, else the session's storage) and the path inside it."""
        for mount_relative, filesystem in self._bucket_mounts:
            if relative == mount_relative:
                return filesystem, ""
            if relative.startswith(f"{mount_relative}/"):
                return filesystem, relative[len(mount_relative) + 1 :]
        return self.filesystem, relative

    @staticmethod
    def _refuse_user(user: str | User | None, operation: str) -> None:
        if user:
            raise ValueError(
                f"AgentVFSSandboxSession.{operation} runs as the sandbox's one user; drop user={user!r}"
            )

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._refuse_user(user, "read")
        normalized, relative = await self._relative(path)
        # Spooled a chunk at a time (on disk past a few MiB) and capped: a large or sparse
        # file made in the sandbox never lands whole in the host process's memory.
        limit = self._limits().max_extracted_bytes
        content = _spooled()
        try:
            filesystem, inner = self._storage(relative)
            await _copy_file(filesystem, inner, content, budget=limit)
        except BaseException as exc:
            content.close()
            if isinstance(exc, FileNotFound):
                raise WorkspaceReadNotFoundError(path=normalized, cause=exc) from exc
            if isinstance(exc, _TooLarge) and limit is not None:
                error = _limit_error(
                    WorkspaceArchiveReadError,
                    normalized,
                    reason=_FILE_REASON,
                    limit=limit,
                    actual=exc.actual,
                )
                raise error from error.cause
            if isinstance(exc, (FilesystemError, OSError)):
                raise WorkspaceArchiveReadError(path=normalized, cause=exc) from exc
            raise
        content.seek(0)
        return cast(io.IOBase, content)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._refuse_user(user, "write")
        normalized, relative = await self._relative(path, for_write=True)
        try:
            filesystem, inner = self._storage(relative)
            # A chunk at a time: the stream may be an archive member of gigabytes.
            await _store(filesystem, inner, data)
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def ls(self, path: Path | str, *, user: str | User | None = None) -> list[FileEntry]:
        self._refuse_user(user, "ls")
        normalized, relative = await self._relative(path)
        try:
            filesystem, inner = self._storage(relative)
            entries = await filesystem.readdir(inner)
        except (FilesystemError, OSError) as exc:
            result = ExecResult(stdout=b"", stderr=str(exc).encode("utf-8"), exit_code=1)
            raise ExecNonZeroError(
                result, command=("ls", "-la", "--", str(normalized)), cause=exc
            ) from exc
        listed = []
        for entry in entries:
            kind = EntryKind.DIRECTORY if entry.type == "directory" else EntryKind.FILE
            if entry.is_symlink:
                kind = EntryKind.SYMLINK
            mode = 0o040755 if kind is EntryKind.DIRECTORY else 0o100644
            listed.append(
                FileEntry(
                    path=str(normalized / entry.name),
                    permissions=Permissions.from_mode(mode),
                    owner="",
                    group="",
                    size=entry.size or 0,
                    kind=kind,
                )
            )
        return listed

    async def mkdir(
        self, path: Path | str, *, parents: bool = False, user: str | User | None = None
    ) -> None:
        self._refuse_user(user, "mkdir")
        normalized, relative = await self._relative(path, for_write=True)
        if not relative:
            return
        try:
            filesystem, inner = self._storage(relative)
            if inner:
                await filesystem.mkdir(inner, recursive=parents)
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def rm(
        self, path: Path | str, *, recursive: bool = False, user: str | User | None = None
    ) -> None:
        self._refuse_user(user, "rm")
        normalized, relative = await self._relative(path, for_write=True)
        if not relative:
            raise WorkspaceArchiveWriteError(path=normalized, context={"reason": "workspace_root"})
        try:
            await self._remove(relative, recursive=recursive)
        except FileNotFound as exc:
            if recursive:
                return
            raise WorkspaceArchiveWriteError(
                path=normalized, context={"reason": "not_found"}, cause=exc
            ) from exc
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def _remove(self, relative: str, *, recursive: bool) -> None:
        filesystem, inner = self._storage(relative)
        if not inner:
            raise FilesystemError(f"{relative} is a bucket mount point; it cannot be removed")
        try:
            await filesystem.delete_file(inner)
        except IsDirectory:
            await filesystem.rmdir(inner, recursive=recursive)

    async def _clear_workspace_root_on_resume(self) -> None:
        # Straight through the storage rather than one ``ls`` and ``rm`` command per entry.
        skip = {p.as_posix() for p in self._persist_workspace_skip_relpaths()}
        for entry in await self.filesystem.readdir(""):
            if entry.name not in skip:
                await self._remove(entry.name, recursive=True)

    # -- snapshots -------------------------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar of its files and directories, read from the storage.

        The tar is spooled (on disk past a few MiB) and each file is copied into it a chunk
        at a time, within the archive limits (:meth:`_limits`): a snapshot past
        ``max_members``, ``max_extracted_bytes`` or ``max_input_bytes`` (the size of the tar,
        so that every snapshot written can be hydrated under the same limits) is refused
        with the SDK's ``WorkspaceArchiveReadError``, its context naming the limit. Links are
        left out, and so are FIFOs, sockets and devices (with a warning): reading one could
        block or never end.
        """
        archive = _spooled()
        try:
            await self._write_archive(archive)
        except BaseException:
            archive.close()
            raise
        archive.seek(0)
        return cast(io.IOBase, archive)

    async def _write_archive(self, archive: IO[bytes]) -> None:
        root = self._root()
        limits = self._limits()
        skip = {p.as_posix() for p in self._persist_workspace_skip_relpaths()}
        members = extracted = 0
        try:
            entries = await self.filesystem.readdir("", recursive=True, max_depth=10_000)
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for entry in entries:
                    if entry.is_symlink or any(
                        entry.name == s or entry.name.startswith(f"{s}/") for s in skip
                    ):
                        continue
                    members += 1
                    if limits.max_members is not None and members > limits.max_members:
                        raise _limit_error(
                            WorkspaceArchiveReadError,
                            root,
                            reason=_MEMBERS_REASON,
                            limit=limits.max_members,
                            actual=members,
                            member=entry.name,
                        )
                    info = tarfile.TarInfo(entry.name)
                    if entry.type == "directory":
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                        continue
                    size = await self._archive_file(
                        tar, info, limits, extracted, archive.tell(), entry.size or 0
                    )
                    if size is None:
                        members -= 1
                        continue
                    extracted += size
                    if limits.max_input_bytes is not None and archive.tell() > limits.max_input_bytes:
                        raise _limit_error(
                            WorkspaceArchiveReadError,
                            root,
                            reason=_INPUT_REASON,
                            limit=limits.max_input_bytes,
                            actual=archive.tell(),
                            member=entry.name,
                        )
            if limits.max_input_bytes is not None and archive.tell() > limits.max_input_bytes:
                raise _limit_error(
                    WorkspaceArchiveReadError,
                    root,
                    reason=_INPUT_REASON,
                    limit=limits.max_input_bytes,
                    actual=archive.tell(),
                )
        except (FilesystemError, OSError, tarfile.TarError) as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc

    async def _archive_file(
        self,
        tar: tarfile.TarFile,
        info: tarfile.TarInfo,
        limits: SandboxArchiveLimits,
        extracted: int,
        written: int,
        listed_size: int,
    ) -> int | None:
        """Add one stored file to the tar (``extracted`` file bytes and ``written`` tar bytes
        so far); its size, or None when it is not a regular file."""
        root = self._root()
        # The binding limit for this file: what is left of the snapshot's file bytes, or of
        # the tar's size (less this member's header block).
        budgets: list[tuple[int, int, str, int]] = []
        if limits.max_extracted_bytes is not None:
            budgets.append(
                (limits.max_extracted_bytes - extracted, limits.max_extracted_bytes, _EXTRACTED_REASON, extracted)
            )
        if limits.max_input_bytes is not None:
            budgets.append(
                (limits.max_input_bytes - written - tarfile.BLOCKSIZE, limits.max_input_bytes, _INPUT_REASON, written + tarfile.BLOCKSIZE)
            )
        binding = min(budgets) if budgets else None

        def refused(size: int) -> WorkspaceArchiveReadError | WorkspaceArchiveWriteError:
            assert binding is not None  # no budget, nothing refused
            _, limit, reason, before = binding
            return _limit_error(
                WorkspaceArchiveReadError,
                root,
                reason=reason,
                limit=limit,
                actual=before + size,
                member=info.name,
            )

        # The listed size refuses a file too large before any byte of it is read.
        if binding is not None and listed_size > binding[0]:
            raise refused(listed_size)
        with _spooled() as content:
            try:
                size = await _copy_file(
                    self.filesystem, info.name, content, budget=None if binding is None else binding[0]
                )
            except NotRegularFile:
                # Skipped like links: one FIFO made by a command must not make every later
                # snapshot of the session fail.
                _log.warning(
                    "the snapshot of %s leaves out %s: not a regular file or directory "
                    "(a FIFO, socket or device)",
                    root,
                    info.name,
                )
                return None
            except _TooLarge as exc:
                error = refused(exc.actual)
                raise error from error.cause
            content.seek(0)
            info.size, info.mode = size, 0o644
            await anyio.to_thread.run_sync(tar.addfile, info, content)
        return size

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Write a tar's files and directories into the storage.

        The archive is read twice, never with :mod:`tarfile`: first every header and every
        byte is checked (see ``agentvfs.integrations._archives``), then the files are
        written. So an archive with a member that leaves the workspace, a link or a device,
        one past the archive limits (``max_input_bytes`` of the stream, ``max_members``,
        ``max_extracted_bytes`` declared by its members; see :meth:`_limits`) or past the
        reader's fixed bounds (a name of 4,096 bytes, 1 MiB of extended headers per member,
        64 MiB per archive), a damaged or a truncated one changes nothing. The stream is
        spooled (on disk past a few MiB), decompressed a piece at a time, and each file is
        written a chunk at a time, never whole in memory.
        """
        await self._restore(data, clear_first=False)

    async def _restore(self, data: io.IOBase, *, clear_first: bool) -> None:
        root = self._root()
        limits = self._limits()
        spool = await anyio.to_thread.run_sync(_spool_input, data, limits, root)
        with spool:
            await anyio.to_thread.run_sync(self._check_archive, spool, _tar_limits(limits))
            if clear_first:
                await self._clear_workspace_root_on_resume()
            spool.seek(0)
            await self._extract(spool, _tar_limits(limits))

    def _member_path(self, member: TarMember) -> str:
        """The workspace-relative path of a member to restore ('' for the root), or the
        SDK's error naming the member that cannot be."""
        root = self._root()
        relative = _tar_member_path(member.name)
        if relative is None:
            raise WorkspaceArchiveWriteError(
                path=root, context={"reason": "path_escapes_workspace", "member": member.name}
            )
        if member.kind not in ("file", "directory") or (not relative and member.kind == "file"):
            raise WorkspaceArchiveWriteError(
                path=root, context={"reason": "unsupported_member_type", "member": member.name}
            )
        return relative

    def _check_archive(self, spool: IO[bytes], limits: TarLimits) -> None:
        """Read the whole archive once, writing nothing: every member checked, every byte of
        content there (in a worker thread; a cancelled restore stops at the next piece)."""
        reader = TarReader(spool, limits, check=anyio.from_thread.check_cancelled)
        try:
            for member in reader:
                self._member_path(member)
        except (ArchiveLimitError, ArchiveFormatError) as exc:
            raise _archive_error(exc, self._root()) from exc

    async def _extract(self, spool: IO[bytes], limits: TarLimits) -> None:
        """Write the members of an archive :meth:`_check_archive` passed."""
        reader = TarReader(spool, limits, check=anyio.from_thread.check_cancelled)
        try:
            while (member := await anyio.to_thread.run_sync(reader.next)) is not None:
                relative = self._member_path(member)
                if not relative:
                    continue
                if member.kind == "directory":
                    await self.filesystem.mkdir(relative, recursive=True)
                    continue
                # A large member goes through a local file, which the storage uploads in
                # parts where it can (S3 multipart), rather than whole through memory.
                await _store(self.filesystem, relative, _MemberStream(reader))
        except (ArchiveLimitError, ArchiveFormatError) as exc:
            raise _archive_error(exc, self._root()) from exc
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=self._root(), cause=exc) from exc

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        # Unlike the default (clear, then fetch), the snapshot is fetched and checked first:
        # a snapshot that cannot be read or restored leaves the live files alone.
        archive = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            await self._restore(archive, clear_first=True)
        finally:
            with contextlib.suppress(Exception):
                archive.close()

    # -- archives given to extract() ---------------------------------------------------------------

    async def _extract_tar_archive(
        self,
        *,
        archive_path: Path,
        destination_root: Path,
        data: io.IOBase,
        archive_limits: SandboxArchiveLimits | None = None,
    ) -> None:
        """``extract()`` of a tar: the SDK's checks (safe member paths, no link or device, no
        duplicate, nothing below a file, no link already on the way), read with the bounded
        reader in place of :mod:`tarfile` as :meth:`hydrate_workspace` reads, within the
        call's limits, else the run's or the client's (:meth:`_limits`)."""
        limits = archive_limits if archive_limits is not None else self._limits()
        stream = cast(IO[bytes], data)
        try:
            await anyio.to_thread.run_sync(_validate_tar, stream, limits)
            stream.seek(0)
            reader = TarReader(stream, _tar_limits(limits), check=anyio.from_thread.check_cancelled)
            listed: dict[Path, dict[str, EntryKind]] = {}
            while (member := await anyio.to_thread.run_sync(reader.next)) is not None:
                relative = safe_tar_member_rel_path(_tar_info(member))
                if relative is None:
                    continue
                await self._refuse_links_on_the_way(destination_root, relative, member.name, listed)
                target = destination_root / relative
                if member.kind == "directory":
                    await self.mkdir(target, parents=True)
                else:
                    await self.mkdir(target.parent, parents=True)
                    await self.write(target, _MemberStream(reader))
                _record_entry(listed, destination_root, relative, member.kind == "directory")
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=archive_path, context={"member": exc.member, "reason": exc.reason}, cause=exc
            ) from exc
        except ArchiveResourceLimitError as exc:
            error = _limit_error(
                WorkspaceArchiveWriteError, archive_path, reason=exc.reason, limit=exc.limit, actual=exc.actual, member=exc.member
            )
            raise error from exc
        except (ArchiveLimitError, ArchiveFormatError) as exc:
            raise _archive_error(exc, archive_path) from exc

    async def _refuse_links_on_the_way(
        self, root: Path, relative: Path, name: str, listed: dict[Path, dict[str, EntryKind]]
    ) -> None:
        """As the SDK's extraction: refuse a member whose path meets a symbolic link already
        in the workspace (the member itself, or a directory on its way)."""
        directory, walked = root, Path()
        for part in relative.parts:
            children = listed.get(directory)
            if children is None:
                try:
                    entries = await self.ls(directory)
                except ExecNonZeroError:
                    return  # not there: nothing below it is either
                children = listed[directory] = {Path(entry.path).name: entry.kind for entry in entries}
            kind = children.get(part)
            if kind is None:
                return
            walked /= part
            if kind == EntryKind.SYMLINK:
                raise UnsafeTarMemberError(member=name, reason=f"symlink in parent path: {walked.as_posix()}")
            directory /= part

    async def _extract_zip_archive(
        self,
        *,
        archive_path: Path,
        destination_root: Path,
        data: io.IOBase,
        archive_limits: SandboxArchiveLimits | None = None,
    ) -> None:
        """``extract()`` of a zip: its central directory is walked first, within the limits
        (see ``_archives.check_zip``), then the SDK's extraction reads it, each member
        written a chunk at a time (:meth:`write`)."""
        limits = archive_limits if archive_limits is not None else self._limits()
        try:
            await anyio.to_thread.run_sync(check_zip, cast(IO[bytes], data), _tar_limits(limits))
        except (ArchiveLimitError, ArchiveFormatError) as exc:
            raise _archive_error(exc, archive_path) from exc
        data.seek(0)
        await super()._extract_zip_archive(
            archive_path=archive_path, destination_root=destination_root, data=data, archive_limits=limits
        )



def _remove_working_directory(working_directory: str, root: str) -> None:
    """Remove a session's host directory once nothing is mounted there: empty directories
    and the mount manager's marker files only, never anything recursively."""
    with contextlib.suppress(OSError):
        os.rmdir(root)
    with contextlib.suppress(OSError):
        for name in os.listdir(working_directory):
            candidate = os.path.join(working_directory, name)
            if name.startswith(".") and os.path.isfile(candidate) and not os.path.islink(candidate):
                os.unlink(candidate)
    with contextlib.suppress(OSError):
        os.rmdir(working_directory)


def _bucket_mount_targets(manifest: Manifest) -> list[tuple[str, Mount]]:
    """(workspace-relative mount point, entry) of each bucket mount the session serves,
    outermost first."""
    root = Path(manifest.root)
    targets: list[tuple[str, Mount]] = []
    for entry, mount_path in manifest.mount_targets():
        if entry.type not in SUPPORTED_MOUNT_TYPES:
            continue
        try:
            relative = Path(mount_path).relative_to(root).as_posix()
        except ValueError:
            relative = ""
        if relative in ("", "."):
            raise ValueError(
                f"AgentVFSSandboxClient mounts a bucket only below the workspace root, not at "
                f"{Path(mount_path).as_posix()!r}; leave mount_path unset or name a directory inside the workspace"
            )
        targets.append((relative, entry))
    targets.sort(key=lambda item: len(item[0].split("/")))
    return targets


def _check_manifest(manifest: Manifest) -> None:
    """Refuse what a session cannot materialise, naming it, before anything is written."""
    if manifest.users or manifest.groups:
        raise ValueError(
            "AgentVFSSandboxClient does not provision manifest users or groups (commands run as the "
            "sandbox's one user); remove Manifest.users and Manifest.groups"
        )
    for grant in manifest.extra_path_grants:
        if grant.host_path is not None:
            raise ValueError(
                f"AgentVFSSandboxClient does not support host_path on the path grant {grant.path!r}; "
                "omit host_path"
            )
    for path, entry in manifest.iter_entries():
        if entry.type in SUPPORTED_MOUNT_TYPES and isinstance(entry, (S3Mount, GCSMount)):
            continue
        if entry.type not in SUPPORTED_ENTRY_TYPES:
            supported = sorted(SUPPORTED_ENTRY_TYPES | SUPPORTED_MOUNT_TYPES)
            raise ValueError(
                f"AgentVFSSandboxClient cannot materialise the manifest entry {path.as_posix()!r} of type "
                f"{entry.type!r}; it supports {', '.join(supported)}. Give other storage to the client "
                "(filesystem=) or mount it as an agentvfs FsspecFilesystem instead"
            )
    _bucket_mount_targets(manifest)


class AgentVFSSandboxClient(BaseSandboxClient[AgentVFSSandboxClientOptions | None]):
    """Sandbox sessions whose workspace is agentvfs storage, commands run in bubblewrap.

    Parameters
    ----------
    filesystem : WorkspaceFilesystem or callable, optional
        The storage of every session (one filesystem, shared), or ``fn(session_id) ->
        WorkspaceFilesystem`` giving each session its own (called again with the same id on
        :meth:`resume`, so a resumed session finds its files). Default: a fresh in-memory
        filesystem per session (its files live as long as the session; use a snapshot to
        keep them).
    isolation : str
        ``"bwrap"`` (default: bubblewrap, no network, the workspace the only writable place)
        or ``"none"`` (commands run on the host, for machines without bubblewrap).
    env : mapping, optional
        Variables given to every command (the manifest's environment is added).
    dependencies : Dependencies, optional
        The SDK's per-session dependencies (bind a :class:`FsspecSnapshotStore` here for
        ``RemoteSnapshotSpec``).
    instrumentation : Instrumentation, optional
        The SDK's session event instrumentation.
    archive_limits : SandboxArchiveLimits, optional
        The limits of snapshots (``persist_workspace``, ``hydrate_workspace``, resume) and of
        ``read`` (one file up to ``max_extracted_bytes``) when the run sets none
        (``SandboxRunConfig.archive_limits`` wins). Default: the SDK's defaults.

    Notes
    -----
    The manifest's ``root`` is chosen by the client (a directory it creates, where the
    storage is mounted); a manifest with another root is refused. Entries of the types in
    :data:`SUPPORTED_ENTRY_TYPES` are written through the storage; ``S3Mount`` and
    ``GCSMount`` entries (:data:`SUPPORTED_MOUNT_TYPES`) become agentvfs mounts of their
    bucket at their path (s3fs / gcsfs on the host, whatever the entry's
    ``mount_strategy``; read-only when the entry is, which is the SDK's default). Their
    credentials stay on the host, out of the sandbox; the SDK still asks for its
    credential-exposure acknowledgement when the entry carries credentials. Other entries
    are refused.
    """

    backend_id = _BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        filesystem: FilesystemSource = None,
        *,
        isolation: str = "bwrap",
        env: Mapping[str, str] | None = None,
        dependencies: Dependencies | None = None,
        instrumentation: Instrumentation | None = None,
        archive_limits: SandboxArchiveLimits | None = None,
    ) -> None:
        if isinstance(filesystem, type):
            raise TypeError(
                "filesystem must be a filesystem instance or a function of the session id, not a class"
            )
        self._filesystem = filesystem
        self._isolation = LocalSandbox(
            working_directory=tempfile.gettempdir(), isolation=isolation
        ).isolation
        self._env = dict(env or {})
        self._dependencies = dependencies
        if archive_limits is not None:
            archive_limits.validate()
        self._archive_limits = archive_limits
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )

    def _filesystem_for(self, session_id: str) -> WorkspaceFilesystem:
        source = self._filesystem
        if source is None:
            return _memory_filesystem(session_id)
        if isinstance(source, WorkspaceFilesystem):
            return source
        made = source(session_id)
        if not isinstance(made, WorkspaceFilesystem):
            raise TypeError(
                f"the filesystem function returned {type(made).__name__}, not a WorkspaceFilesystem"
            )
        return made

    def _session(self, state: AgentVFSSandboxSessionState) -> SandboxSession:
        inner = AgentVFSSandboxSession(
            state=state,
            filesystem=self._filesystem_for(str(state.session_id)),
            isolation=self._isolation,
            env=self._env,
            archive_limits=self._archive_limits,
        )
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: AgentVFSSandboxClientOptions | None = None,
    ) -> SandboxSession:
        """A new session (not started: enter it with ``async with``).

        Raises
        ------
        ValueError
            The manifest sets a root of its own, or has entries, users or grants the
            session cannot materialise (the message names them).
        """
        manifest = manifest if manifest is not None else Manifest()
        if manifest.root != _DEFAULT_ROOT:
            raise ValueError(
                f"AgentVFSSandboxClient chooses the workspace root itself (where the storage is mounted); "
                f"leave Manifest.root at its default instead of {manifest.root!r}"
            )
        _check_manifest(manifest)
        self._validate_manifest_for_create(manifest)
        working_directory = tempfile.mkdtemp(prefix="agentvfs-openai-")
        root = os.path.join(working_directory, _MOUNT_NAME)
        session_id = uuid.uuid4()
        state = AgentVFSSandboxSessionState(
            session_id=session_id,
            manifest=manifest.model_copy(update={"root": root}, deep=True),
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            working_directory=working_directory,
        )
        return self._session(state)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Stop the session's commands, unmount, and remove its (then empty) host directory.

        Stored files are never deleted; the host directory is removed only when nothing is
        mounted on it, and only as empty directories (``rmdir``), never recursively.
        """
        inner = session._inner
        if not isinstance(inner, AgentVFSSandboxSession):
            raise TypeError("AgentVFSSandboxClient.delete expects a session it created")
        await inner._shutdown_backend()
        working_directory = inner.state.working_directory
        root = os.path.join(working_directory, _MOUNT_NAME)
        if working_directory and not is_mounted(root):
            await anyio.to_thread.run_sync(_remove_working_directory, working_directory, root)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session for a state kept earlier (``serialize_session_state``): the same storage
        (the filesystem function is called with the same session id) and host directory."""
        if not isinstance(state, AgentVFSSandboxSessionState):
            raise TypeError(
                f"AgentVFSSandboxClient.resume expects an AgentVFSSandboxSessionState, not {type(state).__name__}"
            )
        state.assert_path_grants_rebound()
        expected = os.path.join(state.working_directory, _MOUNT_NAME)
        if not state.working_directory or state.manifest.root != expected:
            raise ValueError(
                "the session state's manifest root is not the one an AgentVFSSandboxClient made; "
                "resume only states it serialised"
            )
        return self._session(state)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        """The state :meth:`serialize_session_state` wrote."""
        return self._deserialize_session_state_payload(payload, AgentVFSSandboxSessionState)
