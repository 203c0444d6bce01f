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
import os
import posixpath
import shlex
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from agentvfs import (
    FileNotFound,
    FilesystemError,
    FsspecFilesystem,
    IsDirectory,
    LocalSandbox,
    ToolMedia,
    Workspace,
    WorkspaceFilesystem,
    WorkspaceTool,
)
from agentvfs.integrations import require
from agentvfs.mounts import is_mounted
from agentvfs.tools import openai_tools

require("agents", "openai-agents", __name__)

from agents import (  # noqa: E402  (the framework is imported only after require() named the extra)
    FunctionTool,
    RunContextWrapper,
    ToolOutputFileContent,
    ToolOutputImage,
    ToolOutputText,
)
from agents.sandbox import Manifest  # noqa: E402
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
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot  # noqa: E402
from agents.sandbox.types import ExecResult, Permissions, User  # noqa: E402
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
        # The whole payload is read before the write begins: a stream that fails half-way
        # raises here, before any byte reaches the storage.
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        await self.filesystem.write_file(
            key, bytes(payload), recursive=True, mime_type="application/x-tar"
        )

    async def download(self, snapshot_id: str) -> io.IOBase:
        """The stored tar of snapshot ``snapshot_id``, as a binary stream.

        Raises
        ------
        FileNotFound
            There is no such snapshot.
        """
        content = await self.filesystem.read_file(self.key(snapshot_id))
        return io.BytesIO(content if isinstance(content, bytes) else content.encode("utf-8"))

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
    ) -> None:
        self.state = state
        self.filesystem = filesystem
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
        try:
            filesystem, inner = self._storage(relative)
            content = await filesystem.read_file(inner)
        except FileNotFound as exc:
            raise WorkspaceReadNotFoundError(path=normalized, cause=exc) from exc
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveReadError(path=normalized, cause=exc) from exc
        return io.BytesIO(content if isinstance(content, bytes) else content.encode("utf-8"))

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._refuse_user(user, "write")
        normalized, relative = await self._relative(path, for_write=True)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        try:
            filesystem, inner = self._storage(relative)
            await filesystem.write_file(inner, bytes(payload), recursive=True)
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
        """The workspace as a tar of its files and directories, read from the storage."""
        skip = {p.as_posix() for p in self._persist_workspace_skip_relpaths()}
        buffer = io.BytesIO()
        try:
            entries = await self.filesystem.readdir("", recursive=True, max_depth=10_000)
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                for entry in entries:
                    if entry.is_symlink or any(
                        entry.name == s or entry.name.startswith(f"{s}/") for s in skip
                    ):
                        continue
                    info = tarfile.TarInfo(entry.name)
                    if entry.type == "directory":
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                        continue
                    content = await self.filesystem.read_file(entry.name)
                    data = content if isinstance(content, bytes) else content.encode("utf-8")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        except (FilesystemError, OSError, tarfile.TarError) as exc:
            raise WorkspaceArchiveReadError(path=self._root(), cause=exc) from exc
        buffer.seek(0)
        return buffer

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Write a tar's files and directories into the storage.

        Every member is checked before the first write, so an archive with a member that
        leaves the workspace, a link or a device changes nothing.
        """
        raw = data.read()
        await self._extract(self._plan(raw if isinstance(raw, bytes) else str(raw).encode("utf-8")))

    async def _extract(self, plan: list[tuple[str, bytes | None]]) -> None:
        try:
            for relative, content in plan:
                if content is None:
                    await self.filesystem.mkdir(relative, recursive=True)
                else:
                    await self.filesystem.write_file(relative, content, recursive=True)
        except (FilesystemError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=self._root(), cause=exc) from exc

    def _plan(self, payload: bytes) -> list[tuple[str, bytes | None]]:
        """The checked members of a tar: (relative path, content, None for a directory)."""
        root = self._root()
        plan: list[tuple[str, bytes | None]] = []
        try:
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
                for member in tar.getmembers():
                    relative = _tar_member_path(member.name)
                    if relative is None:
                        raise WorkspaceArchiveWriteError(
                            path=root,
                            context={"reason": "path_escapes_workspace", "member": member.name},
                        )
                    if member.isdir():
                        if relative:
                            plan.append((relative, None))
                    elif member.isfile() and relative:
                        extracted = tar.extractfile(member)
                        plan.append((relative, extracted.read() if extracted is not None else b""))
                    else:
                        raise WorkspaceArchiveWriteError(
                            path=root,
                            context={"reason": "unsupported_member_type", "member": member.name},
                        )
        except tarfile.TarError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
        return plan

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        # Unlike the default (clear, then fetch), the snapshot is fetched and checked first:
        # a snapshot that cannot be read or restored leaves the live files alone.
        archive = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            raw = archive.read()
        finally:
            with contextlib.suppress(Exception):
                archive.close()
        payload = raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
        plan = self._plan(payload)
        await self._clear_workspace_root_on_resume()
        await self._extract(plan)


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
