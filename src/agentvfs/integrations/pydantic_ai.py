"""Pydantic AI: an agentvfs workspace as a Pydantic AI workspace backend, and its search tools.

:class:`AgentVFSWorkspace` implements the structural protocols of
``pydantic_ai.workspaces`` (``WorkspaceBackend``, ``SupportsFilesystem``, ``SupportsRealpath``,
and ``SupportsCommands`` when the agentvfs workspace has a sandbox), so every Pydantic AI
capability that works through ``ctx.workspace`` (the harness's ``FileSystem``, ``Shell``, ...)
reads and writes the agentvfs storage: memory, a local directory, S3, GCS or any fsspec URL.
:func:`search_toolset` gives an agent agentvfs's search and skills tools.

Install with ``pip install 'agentvfs[pydantic-ai]'``.

Paths
-----
Pydantic AI speaks absolute POSIX paths; agentvfs filesystems speak paths relative to their
root. The root of the agentvfs filesystem appears at one absolute directory, the *root*:

* with a sandbox, the sandbox's working directory (the host path commands see, also inside
  bubblewrap, where it is bound at the same path). A non-local filesystem must then be given as
  ``mounts`` (``Workspace(sandbox=..., mounts={"/data": fs})``), which the sandbox FUSE-mounts
  at ``<working directory>/data``, so commands and file operations meet the same files;
* without a sandbox, a ``LocalFilesystem``'s directory, else ``/workspace`` (a name only: no
  host directory is involved).

The working directory is ``working_dir`` below the root (by default the root itself, or the one
mount of a workspace built from ``mounts``). A path outside the root is refused with
``PermissionError``; so is a symlink that :meth:`AgentVFSWorkspace.realpath` would resolve to
a place outside it.

Reads
-----
``read_bytes`` reads at most ``max_read_bytes`` (64 MiB by default, the harness's own limit for
``read_file``) and refuses a larger file with :class:`FileTooLargeError`, having read no more
than one byte past the limit on local disk and object stores: the harness's ``edit_file`` and
``write_file`` read a file whole, and a sparse file a command makes in seconds can be far larger
than the host's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import operator
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from . import require

_ADAPTER = "agentvfs.integrations.pydantic_ai"
require("pydantic_ai", "pydantic-ai", _ADAPTER)

from pydantic_ai.tools import Tool  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402
from pydantic_ai.workspaces import (  # noqa: E402
    CommandResult,
    FileEntry,
    WorkspaceCommand,
    WorkspaceError,
    WorkspaceOutputLimitError,
    WorkspaceReadOnlyError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

from ..errors import FileTooLarge, SandboxNotReadyError, WorkspaceNotReadyError  # noqa: E402
from ..errors import WorkspaceReadOnlyError as _VfsReadOnlyError  # noqa: E402
from ..sandbox import LocalSandbox, shell_quote  # noqa: E402
from ..vfs import (  # noqa: E402
    CompositeFilesystem,
    FsspecFilesystem,
    LocalFilesystem,
    SupportsReadBeneath,
    WorkspaceFilesystem,
    read_file_beneath,
    read_many,
)
from ..workspace import Workspace  # noqa: E402

if TYPE_CHECKING:
    from ..tools import WorkspaceTool

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "PROVIDER",
    "AgentVFSWorkspace",
    "FileTooLargeError",
    "search_toolset",
]

#: ``WorkspaceRef.provider`` of every ref this adapter makes.
PROVIDER = "agentvfs"

#: The root without a sandbox or a local directory: a name, no host directory.
DEFAULT_VIRTUAL_ROOT = "/workspace"

#: Seconds between checks that a command's workspace directory still exists.
_WATCH_INTERVAL = 0.25

#: The largest file ``read_bytes`` reads by default: the limit of the harness's ``read_file``
#: (``pydantic_ai_harness.filesystem``), so what that tool shows the other tools can read too.
DEFAULT_MAX_READ_BYTES = 64 << 20

#: Symlinks ``realpath`` follows before it reports a loop (Linux's own limit, MAXSYMLINKS).
_MAX_LINK_HOPS = 40


class FileTooLargeError(WorkspaceError, PermissionError):
    """A file larger than the backend's ``max_read_bytes`` was refused; nothing past the limit
    was read.

    A ``WorkspaceError``, so the harness's file tools report the message to the model as a
    failed call instead of ending the run; a ``PermissionError`` (as ``WorkspaceReadOnlyError``
    is), since it is a refusal: the harness then still lets ``write_file`` replace such a file,
    only without showing a diff of the old content.

    Parameters
    ----------
    path : str
        The path as given to ``read_bytes``.
    limit : int
        The ``max_read_bytes`` of the backend.
    """

    def __init__(self, path: str, limit: int) -> None:
        # The message names no path: the harness shows it to the model as it is, and the
        # absolute path would spell out the host directory of the workspace.
        super().__init__(
            f"the file is larger than {limit} bytes, the most this workspace reads whole; "
            "read a part of it with a shell command (head, tail, sed -n) or find lines with a search tool"
        )
        self.path = path
        self.limit = limit


_by_name = operator.attrgetter("name")


def _make_file_entry(name: str, path: str, is_dir: bool, size: int | None) -> FileEntry:
    return FileEntry(name=name, path=path, is_dir=is_dir, size=size)


def _fill_file_entry(name: str, path: str, is_dir: bool, size: int | None) -> FileEntry:
    # The frozen dataclass's __init__ sets each field through object.__setattr__: 1.7 us an
    # entry against 0.4 us here, a tenth of the adapter's cost on a memory listing. Filling
    # __dict__ makes the same object (equal, hashable, frozen), where _fills_file_entry holds.
    entry = object.__new__(FileEntry)
    entry.__dict__.update(name=name, path=path, is_dir=is_dir, size=size)
    return entry


def _fills_file_entry() -> bool:
    """Whether a FileEntry is a plain dataclass whose __dict__ is its four fields."""
    if not dataclasses.is_dataclass(FileEntry) or "__slots__" in vars(FileEntry):
        return False
    if hasattr(FileEntry, "__post_init__"):
        return False
    return [f.name for f in dataclasses.fields(FileEntry)] == ["name", "path", "is_dir", "size"]


#: Builds the FileEntry of a listing: filled directly where FileEntry allows it.
_file_entry = _fill_file_entry if _fills_file_entry() else _make_file_entry

#: The workspace states in which the backend is no longer usable.
_GONE = ("destroying", "destroyed")

# The exposed default names of the agentvfs tools search_toolset hands out.
_SEARCH_TOOLS = ("mastra_workspace_search", "skill", "skill_read", "skill_search")


def _storage_url(fs: WorkspaceFilesystem, sub: str) -> str | None:
    """The fsspec URL of ``sub`` below ``fs``'s root, or None where ``fs`` cannot say."""
    inner = getattr(fs, "inner", None)  # a TimeoutFilesystem (operation_timeout) wraps one
    if isinstance(inner, WorkspaceFilesystem):
        return _storage_url(inner, sub)
    if isinstance(fs, LocalFilesystem):
        return "file://" + posixpath.join(fs.base_path, sub).rstrip("/")
    if isinstance(fs, FsspecFilesystem):
        protocol = fs.fs.protocol if isinstance(fs.fs.protocol, str) else fs.fs.protocol[0]
        path = posixpath.join(fs.root, sub) if sub else fs.root
        if protocol == "file":
            return "file://" + path
        return (
            f"{protocol}://{path.rstrip('/')}"
            if protocol != "memory"
            else f"memory://{path.rstrip('/') or '/'}"
        )
    if isinstance(fs, CompositeFilesystem):
        mount = fs.get_mount_path_for_path("/" + sub) if sub else None
        if mount is None:
            return None
        rest = posixpath.relpath("/" + sub, mount)
        return _storage_url(fs.mounts[mount], "" if rest == "." else rest)
    return None


def _in_memory(fs: WorkspaceFilesystem) -> bool:
    """Whether all of ``fs`` is fsspec memory storage, held in this process."""
    inner = getattr(fs, "inner", None)
    if isinstance(inner, WorkspaceFilesystem):
        return _in_memory(inner)
    if isinstance(fs, FsspecFilesystem):
        protocol = fs.fs.protocol
        return "memory" in ((protocol,) if isinstance(protocol, str) else protocol)
    if isinstance(fs, CompositeFilesystem):
        return bool(fs.mounts) and all(_in_memory(mount) for mount in fs.mounts.values())
    return False


def _storage_exists(fs: WorkspaceFilesystem, sub: str) -> bool:
    """Whether the storage below ``fs``'s root at ``sub`` exists (blocking: run in a thread).

    Asked of the storage itself, since a filesystem shows its root as a directory always. On
    an object store a prefix exists while some object lies below it.
    """
    inner = getattr(fs, "inner", None)
    if isinstance(inner, WorkspaceFilesystem):
        return _storage_exists(inner, sub)
    if isinstance(fs, LocalFilesystem):
        return os.path.isdir(os.path.join(fs.base_path, sub))
    if isinstance(fs, FsspecFilesystem):
        return bool(fs.fs.exists(posixpath.join(fs.root, sub) if sub else fs.root))
    if isinstance(fs, CompositeFilesystem):
        mount = fs.get_mount_path_for_path("/" + sub) if sub else None
        if mount is None:
            return True
        rest = posixpath.relpath("/" + sub, mount)
        return _storage_exists(fs.mounts[mount], "" if rest == "." else rest)
    return True


class AgentVFSWorkspace:
    """An agentvfs :class:`~agentvfs.Workspace` as a Pydantic AI workspace backend.

    Pass it where Pydantic AI takes a workspace (``agent.run(..., workspace=backend)``) or
    wrap it as ``pydantic_ai.workspaces.Workspace(backend)``. The agentvfs workspace is
    initialised on the first operation (``init()``: the storage root is created, the sandbox
    started and its mounts made) and never destroyed by this object: call
    :meth:`aclose` or ``workspace.destroy()`` when done.

    Built with a sandbox, the object is an instance of a subclass that also has ``run``
    (``SupportsCommands``); without one it has no ``run``, so Pydantic AI does not offer
    shell tools on it.

    Parameters
    ----------
    workspace : agentvfs.Workspace
        A workspace with a static filesystem (``filesystem=`` or ``mounts=``); a filesystem
        resolver is refused, since one backend must name one storage.
    working_dir : str, optional
        The working directory as a path of the agentvfs filesystem (default: its root, or the
        mount path of a workspace with a single mount).
    root : str, optional
        The absolute directory the filesystem root appears at, without a sandbox (default
        a ``LocalFilesystem``'s own directory, else ``/workspace``). With a sandbox the root is
        always its working directory, where commands see the files.
    max_read_bytes : int or None, optional
        The largest file :meth:`read_bytes` reads (default :data:`DEFAULT_MAX_READ_BYTES`,
        64 MiB); None reads any size.

    Raises
    ------
    TypeError
        ``workspace`` is not an agentvfs ``Workspace``.
    ValueError
        The workspace has no static filesystem; a sandbox and a filesystem that commands
        would not see (pass ``mounts=`` instead); ``working_dir`` or ``root`` malformed;
        ``max_read_bytes`` not a positive integer or None.
    """

    _attach: bool = False

    def __new__(cls, workspace: Workspace, **kwargs: Any) -> AgentVFSWorkspace:
        # The command protocol is structural: a workspace without a sandbox must not even
        # have ``run``, or Pydantic AI would offer shell tools that cannot work.
        if (
            cls is AgentVFSWorkspace
            and isinstance(workspace, Workspace)
            and workspace.sandbox is not None
        ):
            cls = _AgentVFSCommandWorkspace
        return super().__new__(cls)

    def __init__(
        self,
        workspace: Workspace,
        *,
        working_dir: str | None = None,
        root: str | None = None,
        max_read_bytes: int | None = DEFAULT_MAX_READ_BYTES,
    ) -> None:
        if max_read_bytes is not None and (
            isinstance(max_read_bytes, bool)
            or not isinstance(max_read_bytes, int)
            or max_read_bytes <= 0
        ):
            raise ValueError(
                f"max_read_bytes must be a positive number of bytes or None, not {max_read_bytes!r}"
            )
        if not isinstance(workspace, Workspace):
            raise TypeError(
                f"AgentVFSWorkspace takes an agentvfs.Workspace, not {type(workspace).__name__}; "
                "build one with Workspace(filesystem=FsspecFilesystem(url)) or Workspace(mounts=...)"
            )
        fs = workspace.filesystem
        if fs is None:
            raise ValueError(
                "AgentVFSWorkspace needs a workspace with a static filesystem: this one has "
                + (
                    "a filesystem resolver, which may give a different storage per request"
                    if workspace.has_filesystem_config()
                    else "none"
                )
                + "; pass filesystem=<WorkspaceFilesystem> or mounts={...} to Workspace"
            )
        self._workspace = workspace
        self._fs: WorkspaceFilesystem = fs
        self._sandbox: Any = workspace.sandbox
        inner = getattr(fs, "inner", fs)
        if self._sandbox is not None:
            if root is not None:
                raise ValueError(
                    "root applies only without a sandbox: with one, the root is its working directory"
                )
            if not isinstance(self._sandbox, LocalSandbox):
                raise ValueError(
                    f"AgentVFSWorkspace runs commands only in a LocalSandbox, not {type(self._sandbox).__name__}"
                )
            sandbox_dir = os.path.abspath(os.path.expanduser(str(self._sandbox.working_directory)))
            if isinstance(inner, LocalFilesystem):
                if os.path.realpath(inner.base_path) != os.path.realpath(sandbox_dir):
                    raise ValueError(
                        f"the LocalFilesystem at {inner.base_path!r} is not the sandbox's working directory "
                        f"{sandbox_dir!r}, so commands would not see its files; give both the same directory"
                    )
            elif not isinstance(inner, CompositeFilesystem):
                raise ValueError(
                    "commands in the sandbox would not see this filesystem: pass it as "
                    "Workspace(sandbox=..., mounts={'/data': fs}) so the sandbox mounts it, not as filesystem="
                )
            self._root_spec = sandbox_dir
        elif root is not None:
            if (
                not isinstance(root, str)
                or not root.startswith("/")
                or posixpath.normpath(root) != root
            ):
                raise ValueError(
                    f"root must be an absolute, normalised POSIX path such as '/workspace', not {root!r}"
                )
            self._root_spec = root
        elif isinstance(inner, LocalFilesystem):
            self._root_spec = inner.base_path
        else:
            self._root_spec = DEFAULT_VIRTUAL_ROOT
        if working_dir is None:
            mounts = inner.mount_paths if isinstance(inner, CompositeFilesystem) else []
            working_dir = mounts[0] if len(mounts) == 1 else ""
        if not isinstance(working_dir, str) or ".." in working_dir.split("/"):
            raise ValueError(
                f"working_dir must be a path of the filesystem without '..', not {working_dir!r}"
            )
        self._sub = posixpath.normpath("/" + working_dir).lstrip("/")
        # The root is a host directory shown at its own path: the host can resolve links.
        self._host_paths = isinstance(inner, LocalFilesystem) and root is None
        self._max_read_bytes = max_read_bytes
        # Local disk reads a file beneath the root with a bound and its own precise errors;
        # object stores bound the read with read_many (a ranged GET). Memory storage already
        # holds the file in this process, so its plain read (a tenth of the cost) is only
        # measured afterwards.
        self._reads_beneath = isinstance(inner, SupportsReadBeneath) and not isinstance(
            inner, CompositeFilesystem
        )
        self._in_memory = _in_memory(fs)
        self._root: str | None = None
        # The root with a trailing slash (just "/" for the root "/"): what a path inside it
        # starts with, kept so mapping a path costs one startswith and one slice.
        self._prefix: str | None = None
        self._working_dir: str | None = None
        self._ref: WorkspaceRef | None = None
        self._lock = anyio.Lock()

    # -- identity ----------------------------------------------------------------------------------------

    @property
    def workspace(self) -> Workspace:
        """The agentvfs workspace underneath."""
        return self._workspace

    @property
    def ref(self) -> WorkspaceRef | None:
        """``WorkspaceRef(provider="agentvfs", id=<JSON>)``, None until the first operation.

        The id names the storage at the working directory (an fsspec URL, never
        credentials), the absolute working directory and the sandbox's isolation (None
        without one); :meth:`from_ref` rebuilds a backend on the same storage from it.
        """
        return self._ref

    def _make_ref(self, working_dir: str) -> WorkspaceRef:
        url = _storage_url(self._fs, self._sub)
        isolation = getattr(self._sandbox, "isolation", None)
        body = {"storage": url, "working_dir": working_dir, "sandbox": isolation}
        return WorkspaceRef(
            provider=PROVIDER, id=json.dumps(body, sort_keys=True, separators=(",", ":"))
        )

    @classmethod
    def from_ref(
        cls,
        ref: WorkspaceRef,
        *,
        storage_options: Mapping[str, Any] | None = None,
        sandbox: bool | None = None,
        max_read_bytes: int | None = DEFAULT_MAX_READ_BYTES,
    ) -> AgentVFSWorkspace:
        """A backend attached to the storage ``ref`` names (no I/O until its first operation).

        Parameters
        ----------
        ref : WorkspaceRef
            A ref from :attr:`ref`.
        storage_options : mapping, optional
            The fsspec options of the storage (endpoint, credentials), which a ref never holds.
        sandbox : bool, optional
            Run commands in a :class:`~agentvfs.LocalSandbox` with the isolation the ref
            records; default: when the ref records one.
        max_read_bytes : int or None, optional
            As for the constructor.

        Raises
        ------
        ValueError
            Not an agentvfs ref, or one naming no storage that can be reopened.

        Notes
        -----
        The first operation raises ``WorkspaceUnavailableError`` when the storage is gone,
        rather than creating a new one.
        """
        if not isinstance(ref, WorkspaceRef) or ref.provider != PROVIDER:
            raise ValueError(
                f"not an agentvfs workspace ref: {ref!r} (its provider must be {PROVIDER!r})"
            )
        try:
            body = json.loads(ref.id)
            url, working_dir, isolation = body["storage"], body["working_dir"], body["sandbox"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"malformed agentvfs workspace ref id {ref.id!r}") from None
        if not isinstance(url, str):
            raise ValueError(
                f"the ref {ref.id!r} names no storage that can be reopened by URL "
                "(it came from a filesystem agentvfs cannot describe as one)"
            )
        use_sandbox = isolation is not None if sandbox is None else sandbox
        fs: WorkspaceFilesystem
        if url.startswith("file://"):
            fs = LocalFilesystem(url[len("file://") :])
        else:
            fs = FsspecFilesystem(url, storage_options=dict(storage_options or {}))
        if use_sandbox:
            if isinstance(fs, LocalFilesystem):
                sbx = LocalSandbox(working_directory=working_dir, isolation=isolation or "none")
                ws = Workspace(filesystem=fs, sandbox=sbx)
            else:
                parent, name = posixpath.split(working_dir)
                sbx = LocalSandbox(working_directory=parent, isolation=isolation or "none")
                ws = Workspace(sandbox=sbx, mounts={"/" + name: fs})
            backend = cls(ws, max_read_bytes=max_read_bytes)
        else:
            backend = cls(Workspace(filesystem=fs), root=working_dir, max_read_bytes=max_read_bytes)
        backend._attach = True
        backend._ref = ref
        return backend

    # -- lifecycle ------------------------------------------------------------------------------------

    def _known_root(self) -> str | None:
        return self._root

    async def _ready(self) -> str:
        """Initialise (or attach) once; return the absolute root."""
        if self._root is not None:
            if self._workspace.status in _GONE:
                raise WorkspaceUnavailableError(
                    f"the agentvfs workspace {self._workspace.id} was destroyed"
                )
            return self._root
        async with self._lock:
            known = self._known_root()  # another task may have finished meanwhile
            if known is not None:
                return known
            status = self._workspace.status
            if status in _GONE:
                raise WorkspaceUnavailableError(
                    f"the agentvfs workspace {self._workspace.id} was destroyed"
                )
            # Attaching never creates: a root that is gone is an environment that is gone.
            if self._attach and not await anyio.to_thread.run_sync(
                _storage_exists, self._fs, self._sub
            ):
                raise WorkspaceUnavailableError(
                    f"the storage the workspace ref names no longer exists: {self._ref.id if self._ref else ''}"
                )
            if status == "pending":
                await self._workspace.init()
            if self._sub and not await self._fs.exists(self._sub):
                if self._attach:
                    raise WorkspaceUnavailableError(
                        f"the working directory of workspace ref {self._ref} is gone"
                    )
                await self._fs.mkdir(self._sub, recursive=True)
            root = self._root_spec
            if self._sandbox is not None or self._host_paths:
                # The path commands see: symlinks resolved, as `pwd -P` prints it.
                root = await anyio.to_thread.run_sync(os.path.realpath, root)
            working_dir = posixpath.join(root, self._sub) if self._sub else root
            self._working_dir = working_dir
            if self._ref is None:
                self._ref = self._make_ref(working_dir)
            self._prefix = root if root == "/" else root + "/"
            self._root = root
            return root

    async def aclose(self) -> None:
        """Destroy the agentvfs workspace (sandbox and mounts; stored files stay)."""
        await self._workspace.destroy()

    async def working_dir(self) -> str:
        """The absolute working directory (symlinks resolved)."""
        await self._ready()
        assert self._working_dir is not None
        return self._working_dir

    # -- paths ---------------------------------------------------------------------------------------------

    def _rel_now(self, path: str) -> str | None:
        """``path`` as a path of the filesystem, or None while the backend is not ready.

        The synchronous half of :meth:`_rel`: once initialised, the file operations map a path
        without awaiting anything, which is most of what the adapter adds to each operation.

        Raises
        ------
        PermissionError
            ``path`` is outside the root.
        """
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, not {type(path).__name__}")
        if not path.startswith("/"):
            raise ValueError(f"path must be absolute, got {path!r}")
        prefix = self._prefix
        if prefix is None or self._workspace.status in _GONE:
            return None
        if "/." in path or "//" in path or path[-1] == "/":
            norm = posixpath.normpath(path)
            if norm.startswith("//"):
                norm = "/" + norm.lstrip("/")
        else:
            norm = path  # already normal: the common case, spared normpath's cost
        if norm.startswith(prefix):
            return norm[len(prefix) :]
        if norm == self._root:
            return ""
        raise PermissionError(
            13,
            f"{path!r} is outside the workspace storage, which appears at {self._root!r}; use a path inside it",
            path,
        )

    async def _rel(self, path: str) -> str:
        """``path`` as a path of the filesystem, initialising first if need be."""
        rel = self._rel_now(path)
        if rel is None:
            await self._ready()
            rel = self._rel_now(path)
            if rel is None:  # destroyed the moment it was ready
                raise WorkspaceUnavailableError(
                    f"the agentvfs workspace {self._workspace.id} was destroyed"
                )
        return rel

    def _public(self, rel: str) -> str:
        assert self._root is not None
        if not rel:
            return self._root
        return posixpath.join(self._root, rel)

    # -- SupportsFilesystem ---------------------------------------------------------------------------

    async def read_bytes(self, path: str) -> bytes:
        """Read a file's bytes.

        Raises
        ------
        FileTooLargeError
            The file is larger than ``max_read_bytes``.
        """
        rel = self._rel_now(path)
        if rel is None:
            rel = await self._rel(path)
        limit = self._max_read_bytes
        try:
            if limit is None:
                data = await self._fs.read_file(rel)
            elif self._reads_beneath:
                if not rel:
                    raise IsADirectoryError(21, "Is a directory", path)
                data = await read_file_beneath(self._fs, "", rel, max_bytes=limit)
            elif self._in_memory:
                data = await self._fs.read_file(rel)
                if len(data) > limit:
                    raise FileTooLarge(rel, limit)
            else:
                data = await self._read_bounded(rel, limit)
        except FileTooLarge as exc:
            raise FileTooLargeError(path, limit or exc.limit) from None
        except _TRANSLATED as exc:
            raise _translate(exc) from exc
        return data if isinstance(data, bytes) else data.encode()

    async def _read_bounded(self, rel: str, limit: int) -> str | bytes:
        """``rel``'s content, no more than ``limit`` bytes of it read (``FileTooLarge`` past)."""
        got = (await read_many(self._fs, [rel], max_bytes=limit))[rel]
        if isinstance(got, bytes):
            return got
        if isinstance(got, FileTooLarge):
            raise got
        # read_many reports some failures (a directory, a special file) only as missing: a
        # plain read raises the precise error. Should the file have appeared meanwhile, its
        # length is still checked.
        data = await self._fs.read_file(rel)
        if len(data) > limit:
            raise FileTooLarge(rel, limit)
        return data

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write a file whole, creating missing parents."""
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"data must be bytes, not {type(data).__name__}")
            data = bytes(data)
        rel = self._rel_now(path)
        if rel is None:
            rel = await self._rel(path)
        if not rel:
            raise IsADirectoryError(21, "cannot write over the workspace root", path)
        try:
            await self._fs.write_file(rel, data, recursive=True, overwrite=True)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc
        if self._reindexes():
            await self._workspace.refresh_index(rel)

    async def stat(self, path: str) -> FileEntry:
        """Metadata of a file or directory (a symlink followed to its target)."""
        rel = self._rel_now(path)
        if rel is None:
            rel = await self._rel(path)
        try:
            st = await self._fs.stat(rel)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc
        is_dir = st.type == "directory"
        name = (
            posixpath.basename(path.rstrip("/")) if rel else posixpath.basename(self._public(rel))
        )
        return FileEntry(name=name, path=path, is_dir=is_dir, size=None if is_dir else st.size)

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        """The entries of a directory, by name."""
        rel = self._rel_now(path)
        if rel is None:
            rel = await self._rel(path)
        try:
            entries = await self._fs.readdir(rel)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc
        base = path.rstrip("/")
        head = base + "/" if base else "/"
        out = []
        for entry in sorted(entries, key=_by_name):
            name = entry.name
            is_dir = entry.type == "directory"
            out.append(_file_entry(name, head + name, is_dir, None if is_dir else entry.size))
        return out

    async def make_dir(self, path: str) -> None:
        """Create a directory and its missing parents (``mkdir -p``)."""
        rel = await self._rel(path)
        if not rel:
            return
        try:
            await self._fs.mkdir(rel, recursive=True)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc

    async def remove(self, path: str) -> None:
        """Remove a file, a symlink itself, or a directory tree.

        Raises
        ------
        ValueError
            ``path`` is the working directory or one of its ancestors.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"path must be an absolute path, got {path!r}")
        working_dir = await self.working_dir()
        target = posixpath.normpath(path)
        candidates = [target]
        # Through links too: removing `link/..` must not reach the working directory. Outside
        # the storage the lexical check decides, and _rel refuses the path below.
        with contextlib.suppress(OSError):  # outside the root, or a link loop
            candidates.append(
                posixpath.join(
                    await self.realpath(posixpath.dirname(target)), posixpath.basename(target)
                )
            )
        for candidate in candidates:
            if candidate == working_dir or working_dir.startswith(candidate.rstrip("/") + "/"):
                raise ValueError(
                    f"refusing to remove {path!r}: it is the working directory {working_dir!r} or one of its ancestors"
                )
        rel = await self._rel(path)
        try:
            if await self._is_symlink(rel):
                await self._unlink(rel, path)
            elif (await self._fs.stat(rel)).type == "directory":
                await self._fs.rmdir(rel, recursive=True)
            else:
                await self._fs.delete_file(rel)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc
        if self._reindexes():
            await self._workspace.refresh_index(rel, removed=True)

    def _reindexes(self) -> bool:
        """Whether writes must keep the search index current (``tools={"auto_reindex": True}``).

        Then the adapter's writes and removals refresh the index as agentvfs's own write tools
        do: a path the index already holds is re-read or dropped, any other is left alone.
        """
        if self._fs is not self._workspace.filesystem:
            return False  # storage mounted into the sandbox: the workspace indexes its own
        config = self._workspace.get_tools_config()
        return bool(config and config.get("auto_reindex"))

    async def _unlink(self, rel: str, path: str) -> None:
        """Remove the symlink ``rel`` itself."""
        inner = getattr(self._fs, "inner", self._fs)
        if not isinstance(inner, LocalFilesystem):
            await self._fs.delete_file(rel)
            return
        # delete_file looks through the link first and refuses one that leads out of the root;
        # the disk's unlink removes the name beneath its (contained) parent, never the target.
        if self._fs.read_only or inner.read_only:
            raise WorkspaceReadOnlyError(f"the workspace is read-only: cannot remove {path!r}")
        host = inner.resolve_absolute_path(rel)
        if host is None:
            raise PermissionError(13, "outside the workspace storage", path)
        backend = inner.backend

        def unlink() -> None:
            try:
                backend.disk.unlink(host)
            except Exception as exc:
                raise backend.refuse(exc, host.lstrip("/"), path, "delete_file") from exc

        await anyio.to_thread.run_sync(unlink)

    async def _is_symlink(self, rel: str) -> bool:
        # stat follows links; the parent's listing tells a link from what it points at, so a
        # link to a directory is unlinked, never emptied of its target's files.
        if not self._fs.capabilities.symlinks and not isinstance(
            getattr(self._fs, "inner", self._fs), LocalFilesystem
        ):
            return False
        parent, name = posixpath.split(rel)
        try:
            entries = await self._fs.readdir(parent)
        except OSError:
            return False
        return any(entry.name == name and entry.is_symlink for entry in entries)

    async def exists(self, path: str) -> bool:
        """Whether anything exists at ``path``."""
        rel = self._rel_now(path)
        if rel is None:
            rel = await self._rel(path)
        try:
            return await self._fs.exists(rel)
        except _TRANSLATED as exc:
            raise _translate(exc) from exc

    # -- SupportsRealpath -----------------------------------------------------------------------------

    async def realpath(self, path: str) -> str:
        """Resolve symlinks like ``os.path.realpath(path, strict=False)``, within the root.

        On a local directory shown at its own path the links on disk are followed (missing
        components kept as written) while they stay inside the root; object stores and memory
        hold no links, so there the path is only normalised.

        Raises
        ------
        PermissionError
            ``path``, or what its links resolve to, is outside the storage: a link to ``/etc``,
            ``/proc/self/cwd`` or ``..`` of the root is refused, never followed on the host.
        OSError
            ``ELOOP``: more than 40 links on the way (a loop).
        """
        await self._rel(path)
        if self._host_paths:
            assert self._root is not None
            # Not normalised first: `link/..` climbs from the link's target, as for commands.
            return await anyio.to_thread.run_sync(_resolve_within, self._root, path)
        return self._public(await self._rel(path))


class _AgentVFSCommandWorkspace(AgentVFSWorkspace):
    """:class:`AgentVFSWorkspace` over a workspace with a sandbox: also ``SupportsCommands``."""

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the protocol's signature)
    ) -> CommandResult:
        """Run a command in the sandbox, in the working directory, with stdin at EOF.

        Raises
        ------
        TypeError
            A string without ``shell=True``, or an argv sequence with it.
        ValueError
            An empty argv, or a timeout that is not a positive finite number.
        WorkspaceTimeoutError
            The command ran past ``timeout`` seconds (it was killed).
        WorkspaceOutputLimitError
            The output was larger than the sandbox keeps (8 MiB a stream).
        WorkspaceUnavailableError
            The workspace was destroyed, or its directory removed while the command ran.
        """
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(
                f"timeout must be a positive finite number of seconds or None, not {timeout!r}"
            )
        if isinstance(command, str):
            if not shell:
                raise TypeError(
                    "a string command needs shell=True; pass an argv sequence otherwise"
                )
            line = command
        else:
            if shell:
                raise TypeError(
                    "an argv sequence cannot be combined with shell=True; pass one command string"
                )
            argv = list(command)
            if not argv or not all(isinstance(arg, str) for arg in argv):
                raise ValueError(
                    f"command must be a non-empty sequence of strings, got {command!r}"
                )
            line = " ".join(shell_quote(arg) for arg in argv)
        working_dir = await self.working_dir()
        root = self._root
        assert root is not None
        result: Any = None
        gone = False

        async def watch(scope: anyio.CancelScope) -> None:
            # A removed directory does not end a command already inside it (bubblewrap keeps
            # its bind): stop the command and report the environment gone.
            nonlocal gone
            while True:
                await anyio.sleep(_WATCH_INTERVAL)
                if await anyio.to_thread.run_sync(_removed, root):
                    gone = True
                    scope.cancel()
                    return

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch, group.cancel_scope)
                result = await self._sandbox.execute_command(
                    line,
                    cwd=working_dir,
                    env=dict(env) if env else None,
                    timeout=None if timeout is None else timeout * 1000,
                )
                group.cancel_scope.cancel()
        except (SandboxNotReadyError, WorkspaceNotReadyError) as exc:
            raise WorkspaceUnavailableError(str(exc)) from exc
        if gone or await anyio.to_thread.run_sync(_removed, working_dir):
            raise WorkspaceUnavailableError(
                f"the workspace directory {root} was removed while the command ran"
            )
        assert result is not None
        if result.timed_out:
            raise WorkspaceTimeoutError(
                f"command timed out after {timeout:g}s and was killed",
                stdout=result.stdout,
                stderr=result.stderr,
            )
        if result.stdout_truncated or result.stderr_truncated:
            raise WorkspaceOutputLimitError(
                "the command's output was larger than the sandbox keeps; redirect it to a file and read that",
                limit=len(result.stdout.encode()) + len(result.stderr.encode()),
                stdout=result.stdout[: 64 * 1024],
                stderr=result.stderr[: 64 * 1024],
            )
        return CommandResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)


#: The agentvfs errors that have no builtin meaning, which the file operations translate.
_TRANSLATED = (_VfsReadOnlyError, WorkspaceNotReadyError, SandboxNotReadyError)


def _translate(exc: BaseException) -> Exception:
    """The Pydantic AI error for an agentvfs error of ``_TRANSLATED``."""
    if isinstance(exc, _VfsReadOnlyError):
        return WorkspaceReadOnlyError(str(exc))
    return WorkspaceUnavailableError(str(exc))


# -- search and skills ----------------------------------------------------------------------------------


def _model_text(tool: WorkspaceTool, result: Any) -> str:
    parts = tool.to_model_output(result)
    return "\n".join(part["text"] for part in parts if part.get("type") == "text")


def _as_pydantic_tool(tool: WorkspaceTool) -> Tool[Any]:
    async def call(**kwargs: Any) -> str:
        try:
            result = await tool.execute(kwargs)
        except Exception as exc:  # the model gets the error as text and can adapt
            return f"Error: {type(exc).__name__}: {exc}"
        return _model_text(tool, result)

    call.__name__ = tool.name
    return Tool.from_schema(
        call, name=tool.name, description=tool.description, json_schema=tool.input_schema
    )


async def search_toolset(
    workspace: Workspace, *, tools: Sequence[str] = _SEARCH_TOOLS
) -> FunctionToolset[Any]:
    """A Pydantic AI toolset with the workspace's search and skills tools.

    The tools are agentvfs's own (``mastra_workspace_search``, ``skill``, ``skill_read``,
    ``skill_search``, or their configured names), with their JSON schemas; those the workspace
    does not offer (no search or no skills configured) are left out. A failing call returns
    ``"Error: ..."`` to the model instead of ending the run.

    Parameters
    ----------
    workspace : agentvfs.Workspace
        The workspace (with ``bm25``/``vector_store`` and/or ``skills`` configured).
    tools : sequence of str
        The default names of the tools to take.

    Raises
    ------
    TypeError
        ``workspace`` is not an agentvfs ``Workspace``.
    ValueError
        The workspace offers none of ``tools``.
    """
    if not isinstance(workspace, Workspace):
        raise TypeError(
            f"search_toolset takes an agentvfs.Workspace, not {type(workspace).__name__}"
        )
    available = await workspace.create_tools()
    chosen = [tool for tool in available.values() if tool.workspace_tool_name in tools]
    if not chosen:
        raise ValueError(
            f"the workspace offers none of {list(tools)}: configure search (bm25=True or a vector_store) "
            "or skills=[...] on the Workspace"
        )
    return FunctionToolset([_as_pydantic_tool(tool) for tool in chosen])


def _resolve_within(root: str, path: str) -> str:
    """``path`` with its links resolved, like ``os.path.realpath(path, strict=False)``, where only
    links inside the directory ``root`` (a real path) are read (blocking: run in a thread).

    Each directory is opened beneath a descriptor of ``root`` without following links, so no
    lookup reaches the host outside it, not even when a command swaps a directory for a link
    during the call. Outside ``root`` (after ``..`` above it, or an absolute link target) the
    components are taken as written until they come back inside.

    Raises
    ------
    PermissionError
        The result is outside ``root``.
    OSError
        ``ELOOP``: more than ``_MAX_LINK_HOPS`` links.
    """
    top = [part for part in root.split("/") if part]
    parts: list[str] = []  # the resolved path so far, as components
    fds = [os.open(root, os.O_PATH | os.O_DIRECTORY)]  # fds[i]: parts[: len(top) + i], no links
    todo = path.split("/")[::-1]
    hops = 0

    def truncate(depth: int) -> None:
        while len(fds) > depth + 1:
            os.close(fds.pop())

    def current_dir() -> int | None:
        """A descriptor of the directory ``parts`` names below the root, or None (not one)."""
        for name in parts[len(top) + len(fds) - 1 :]:
            try:
                fds.append(
                    os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1])
                )
            except OSError:
                return None  # missing, a file, or a link swapped in: the rest as written
        return fds[-1]

    try:
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if parts:
                    parts.pop()
                truncate(max(0, len(parts) - len(top)))
                continue
            if len(parts) < len(top) or parts[: len(top)] != top:
                parts.append(name)  # outside the root: no lookup on the host
                continue
            truncate(len(parts) - len(top))
            directory = current_dir()
            try:
                if directory is None:
                    raise FileNotFoundError
                target = os.readlink(name, dir_fd=directory)
            except OSError:  # not a link, or nothing there: kept as written
                parts.append(name)
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if target.startswith("/"):
                parts.clear()
                truncate(0)
            todo.extend(target.split("/")[::-1])
    finally:
        truncate(-1)
    resolved = "/" + "/".join(parts)
    if parts[: len(top)] != top:
        raise PermissionError(
            errno.EACCES,
            f"{path!r} resolves through a symlink to a place outside the workspace storage, which "
            f"appears at {root!r}",
            path,
        )
    return resolved


def _removed(path: str) -> bool:
    """Whether the directory ``path`` is gone. Only a missing path counts: a mount point that
    is slow to answer a ``stat`` under load (EIO, EINTR) has not been removed."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
