"""``Workspace``: a filesystem, a sandbox and search, with one lifecycle.

The reference's constructor order decides which configuration error wins, so the checks in
``Workspace.__init__`` follow it step by step.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio

from ._aio import maybe_await as _maybe_await
from ._context import RequestContext
from ._providers import SandboxView, call_lifecycle
from .errors import (
    MissingExtraError,
    SearchNotAvailableError,
    WorkspaceError,
    WorkspaceNotReadyError,
)
from .vfs import (
    CompositeFilesystem,
    LocalFilesystem,
    TimeoutFilesystem,
    WorkspaceFilesystem,
    new_id,
)

if TYPE_CHECKING:
    from ._blocking import BlockingWorkspace
    from .search import SearchResult, WorkspaceSearch
    from .skills import WorkspaceSkills
    from .snapshots import (
        RestoreResult,
        Snapshot,
        SnapshotDiff,
        SnapshotFilesystem,
        SnapshotInfo,
        SnapshotStore,
    )
    from .tools import WorkspaceTool
    from .vfs import CommitReport, OverlayFilesystem

__all__ = ["Workspace", "WorkspaceStatus"]

logger = logging.getLogger("agentvfs")

WorkspaceStatus = Literal["pending", "initializing", "ready", "paused", "error", "destroying", "destroyed"]

Resolver = Callable[[RequestContext], Any]

_INDEX_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DYNAMIC_SANDBOX_TEXT = (
    "Dynamic sandbox configured. Shell commands execute in a request-scoped sandbox resolved "
    "at tool execution time."
)



def _is_filesystem(value: Any) -> bool:
    return isinstance(value, WorkspaceFilesystem)


def _class_error(role: str, example: str, resolver: str) -> WorkspaceError:
    return WorkspaceError(
        f"{role} received a class constructor instead of an instance or resolver function. "
        f"Pass an instance (e.g., {example}) or a resolver function ({resolver}).",
        "INVALID_CONFIG",
    )


class _Pending:
    """A resolution in flight, shared by concurrent callers of the same key."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


async def _memoised(store: dict[Any, _Pending], key: Any, produce: Callable[[], Awaitable[Any]]) -> Any:
    """Resolve ``key`` once: concurrent callers wait for the first; a failure is not kept."""
    pending = store.get(key)
    if pending is not None:
        await pending.done.wait()
        if pending.error is None:
            return pending.value
        if store.get(key) is pending:  # pragma: no cover - removed by the failing caller
            del store[key]
    pending = store[key] = _Pending()
    try:
        pending.value = await produce()
    except BaseException as exc:
        pending.error = exc
        if store.get(key) is pending:
            del store[key]
        raise
    finally:
        pending.done.set()
    return pending.value


# Initialised workspaces, held until destroyed: one forgotten by a script still gets its
# sandbox processes and mounts torn down at interpreter exit.
_LIVE: set[Workspace] = set()


@atexit.register
def _destroy_live_workspaces() -> None:
    # A script that forgets ``destroy()`` must not leave background processes or mounts
    # behind; tear down what is still alive, each in a fresh event loop, bounded in time.
    for ws in list(_LIVE):
        if ws.status in ("pending", "destroyed"):
            continue
        worker = threading.Thread(target=_destroy_quietly, args=(ws,), daemon=True)
        worker.start()
        worker.join(timeout=15)


def _destroy_quietly(ws: Workspace) -> None:
    async def run() -> None:
        with anyio.move_on_after(10):
            await ws.destroy()

    try:
        anyio.run(run)
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("Failed to destroy workspace %s at exit", ws.id)


class Workspace:
    """An agent's workspace: files, commands and search over one filesystem and sandbox.

    All I/O methods are async and run under asyncio and trio; :meth:`blocking` gives a
    synchronous facade for scripts and notebooks.

    Parameters
    ----------
    id : str, optional
        Default ``ws-<base36 time>-<6 random chars>``.
    name : str, optional
        Default ``workspace-<first 8 chars of id>``.
    filesystem : WorkspaceFilesystem or callable, optional
        An instance, or a resolver ``fn(request_context) -> filesystem`` (may be async).
    sandbox : object or callable, optional
        A sandbox instance, or a resolver ``fn(request_context) -> sandbox``.
    mounts : mapping of str to WorkspaceFilesystem, optional
        Builds a :class:`CompositeFilesystem`; with a static sandbox each mount is also
        mounted into the sandbox when it starts.
    on_mount : callable, optional
        Hook called for each sandbox mount (see the mount manager).
    bm25, vector_store, embedder, auto_index_paths, index_dir, search_index_name
        Search configuration.
    skills, skill_source
        Skill discovery configuration.
    tools : dict, optional
        Tools configuration (see :meth:`get_tools_config`).
    operation_timeout : float, optional
        Milliseconds allowed for each filesystem operation (``TimeoutError`` after).
    sandbox_cache_key : callable, optional
        ``fn(request_context) -> str | None``: memoise resolved sandboxes by key.
    instructions : dict, optional
        ``{"dynamic_sandbox": "placeholder" | "resolve" | fn}``.
    snapshot_store : WorkspaceFilesystem, SnapshotStore, fsspec filesystem or str, optional
        Where :meth:`snapshot` keeps snapshots (a filesystem, an fsspec instance or a URL
        such as ``s3://bucket/snapshots``). Default: ``.agentvfs/snapshots`` of the
        workspace filesystem itself. A store out of the agent's reach keeps snapshots safe
        from the agent's own tools (and is the only way to snapshot a read-only workspace).
    search_index_url : str, optional
        A published search index (``agentvfs index URL --out INDEX_URL``, or
        :func:`agentvfs.search.build_index`) to search with BM25 together with this
        workspace's own index, which then holds only this agent's changes: files it indexes
        or writes hide the published documents of the same files, and removed files stay
        hidden. Needs ``bm25`` with the tokenizer options the index was built with.
    search_index_options : mapping, optional
        For ``search_index_url``: ``storage_options`` (fsspec options of its storage),
        ``cache_dir`` (where its segments are kept, default ``<agentvfs cache>/index-segments``),
        ``refresh_interval`` (seconds between looks for a newer manifest, default 30) and
        ``max_segment_bytes`` (the largest segment fetched, default 1 GiB; a larger one, or
        one not the size its manifest says, is refused unread and an older manifest used).

    Raises
    ------
    WorkspaceError
        ``INVALID_CONFIG``, ``INVALID_SEARCH_CONFIG`` or ``NO_PROVIDERS``, in the reference's
        order of checks.
    """

    def __init__(
        self,
        *,
        id: str | None = None,
        name: str | None = None,
        filesystem: WorkspaceFilesystem | Resolver | None = None,
        sandbox: Any = None,
        mounts: Mapping[str, WorkspaceFilesystem] | None = None,
        on_mount: Callable[..., Any] | None = None,
        bm25: bool | Mapping[str, Any] | None = None,
        vector_store: Any = None,
        embedder: Callable[..., Any] | None = None,
        auto_index_paths: Sequence[str] | None = None,
        index_dir: str | None = None,
        skills: Sequence[str] | Callable[[RequestContext], Any] | None = None,
        skill_source: Any = None,
        search_index_name: str | None = None,
        tools: dict[str, Any] | None = None,
        operation_timeout: float | None = None,
        sandbox_cache_key: Callable[[RequestContext], str | None] | None = None,
        instructions: Mapping[str, Any] | None = None,
        snapshot_store: Any = None,
        search_index_url: str | None = None,
        search_index_options: Mapping[str, Any] | None = None,
    ) -> None:
        # The reference's order of checks: identity, providers, search, something to work with.
        self._configure_identity(id, name, operation_timeout)
        self._configure_providers(sandbox, mounts, filesystem, on_mount)
        self._configure_search(bm25, vector_store, embedder, auto_index_paths, index_dir, search_index_name)
        self._configure_shared_index(search_index_url, search_index_options)
        # Something to work with.
        self._skills_config = skills
        self._skill_source = skill_source
        self._skills: WorkspaceSkills | None = None
        has_skills = callable(skills) or bool(skills)
        if (
            self._filesystem is None
            and self._filesystem_resolver is None
            and self._sandbox is None
            and self._sandbox_resolver is None
            and not has_skills
        ):
            raise WorkspaceError("Workspace requires at least a filesystem, sandbox, or skills", "NO_PROVIDERS")

        self._tools_config = tools
        self._sandbox_cache_key = sandbox_cache_key
        self._sandbox_cache: dict[str, _Pending] = {}
        self._instructions = dict(instructions or {})
        self._configure_snapshots(snapshot_store)
        #: For a fork: its overlay and the filesystem its commit writes into.
        self._fork: tuple[OverlayFilesystem, WorkspaceFilesystem] | None = None
        #: What the tools keep across ``create_tools`` calls (undo checkpoints).
        self._tool_state: dict[str, Any] = {}
        self._teardown_started = False
        self._stopping: anyio.Event | None = None
        self._destroying: anyio.Event | None = None
        self._destroy_error: BaseException | None = None

    def _configure_identity(self, id: str | None, name: str | None, operation_timeout: float | None) -> None:
        """Id, name, times and status; the operation timeout, checked first."""
        self._id = id if id is not None else new_id("ws")
        self._name = name if name is not None else f"workspace-{self._id[:8]}"
        self.created_at = datetime.now(UTC)
        self.last_accessed_at = self.created_at
        self._status: WorkspaceStatus = "pending"
        if operation_timeout is not None and (
            isinstance(operation_timeout, bool) or not isinstance(operation_timeout, (int, float)) or operation_timeout <= 0
        ):
            raise WorkspaceError(
                f"operation_timeout must be a positive number of milliseconds, got {operation_timeout!r}",
                "INVALID_CONFIG",
                self._id,
            )
        self._operation_timeout = operation_timeout

    def _configure_snapshots(self, store: Any) -> None:
        """Where snapshots are kept: checked now, opened on first use."""
        self._snapshot_store_config = store
        self._snapshot_store: SnapshotStore | None = None
        if store is None or isinstance(store, (str, WorkspaceFilesystem)):
            return
        from .snapshots import SnapshotStore

        if isinstance(store, SnapshotStore):
            self._snapshot_store = store
            return
        import fsspec

        if not isinstance(store, fsspec.AbstractFileSystem):
            raise WorkspaceError(
                "snapshot_store must be a WorkspaceFilesystem, a SnapshotStore, an fsspec filesystem or a URL "
                f"(such as 's3://bucket/snapshots'), not {type(store).__name__}",
                "INVALID_CONFIG",
                self._id,
            )

    def _configure_providers(
        self,
        sandbox: Any,
        mounts: Mapping[str, WorkspaceFilesystem] | None,
        filesystem: WorkspaceFilesystem | Resolver | None,
        on_mount: Callable[..., Any] | None,
    ) -> None:
        """The sandbox (an instance or a resolver), then the filesystem: a composite of
        ``mounts``, an instance or a resolver; under ``operation_timeout`` where it is set."""
        # The sandbox: an instance, or a resolver.
        self._sandbox: Any = None
        self._sandbox_resolver: Resolver | None = None
        if inspect.isclass(sandbox):
            raise _class_error("sandbox", "LocalSandbox(...)", "lambda request_context: sandbox")
        if sandbox is not None and callable(sandbox) and not hasattr(sandbox, "execute_command"):
            self._sandbox_resolver = sandbox
        else:
            self._sandbox = sandbox

        # Mounts become one composite filesystem.
        self._filesystem: WorkspaceFilesystem | None = None
        self._filesystem_resolver: Resolver | None = None
        if mounts:
            if filesystem is not None:
                raise WorkspaceError('Cannot use both "filesystem" and "mounts"', "INVALID_CONFIG")
            if self._sandbox_resolver is not None:
                raise WorkspaceError(
                    'Cannot use "mounts" with a dynamic sandbox resolver. Mounts are attached to a '
                    "sandbox instance at construction time. Either pass a static sandbox instance, "
                    "or have your resolver return a sandbox with its mounts already configured.",
                    "INVALID_CONFIG",
                )
            for path, fs in mounts.items():
                if isinstance(fs, LocalFilesystem) and not fs.contained:
                    logger.warning(
                        'LocalFilesystem at mount "%s" has contained: false (contained=False), which is '
                        "incompatible with mounts: absolute paths can reach outside the mount.",
                        path,
                    )
            self._filesystem = CompositeFilesystem(mounts)
            manager = SandboxView(self._sandbox).mounts
            if manager is not None:
                manager.set_context(sandbox=self._sandbox, workspace=self)
                manager.add(dict(mounts))
                manager.set_on_mount(on_mount)
        # Or the filesystem: an instance, or a resolver (a class is a mistake worth naming).
        elif filesystem is not None:
            if inspect.isclass(filesystem):
                raise _class_error("filesystem", "LocalFilesystem(...)", "lambda request_context: fs")
            if _is_filesystem(filesystem):
                self._filesystem = filesystem  # type: ignore[assignment]
            elif callable(filesystem):
                self._filesystem_resolver = filesystem
            else:
                raise WorkspaceError(
                    f"filesystem must be a WorkspaceFilesystem or a resolver function, not {type(filesystem).__name__}",
                    "INVALID_CONFIG",
                )
        if self._filesystem is not None and self._operation_timeout is not None:
            self._filesystem = TimeoutFilesystem(self._filesystem, self._operation_timeout)
        self._on_mount = on_mount

    def _configure_search(
        self,
        bm25: bool | Mapping[str, Any] | None,
        vector_store: Any,
        embedder: Callable[..., Any] | None,
        auto_index_paths: Sequence[str] | None,
        index_dir: str | None,
        search_index_name: str | None,
    ) -> None:
        """BM25 and vector search, their index name and where the index lives."""
        if vector_store is not None and embedder is None:
            raise WorkspaceError("vector_store requires an embedder", "INVALID_SEARCH_CONFIG")
        self._bm25 = bm25
        self._vector_store = vector_store
        self._embedder = embedder
        self._auto_index_paths = list(auto_index_paths or [])
        self._index_dir = index_dir
        self._search_index_name: str | None = None
        # The index name is only needed (and so only checked) for vector search.
        if vector_store is not None and embedder is not None:
            # A persistent index keeps one name across Workspace instances (the id-based
            # default changes with every instance and would orphan the stored vectors).
            persistent = index_dir is not None or self._default_index_dir() is not None
            default = "workspace_search" if persistent else re.sub(r"[^A-Za-z0-9_]", "_", f"{self._id}_search")
            index_name = search_index_name or default
            if not _INDEX_NAME.match(index_name):
                raise WorkspaceError(
                    f'Invalid search_index_name: "{index_name}". Must start with a letter or underscore, '
                    "and contain only letters, numbers, or underscores.",
                    "INVALID_SEARCH_CONFIG",
                    self._id,
                )
            if len(index_name) > 63:
                raise WorkspaceError(
                    f"search_index_name exceeds 63 characters (got {len(index_name)})",
                    "INVALID_SEARCH_CONFIG",
                    self._id,
                )
            self._search_index_name = index_name
        self._search: WorkspaceSearch | None = None
        # The search package (DuckDB, hnswlib, NumPy: the search extra) only where asked for.
        if (bm25 is not None and bm25 is not False) or (vector_store is not None and embedder is not None):
            try:
                from .search import WorkspaceSearch, parse_bm25_config
            except ModuleNotFoundError as exc:
                if exc.name not in ("duckdb", "hnswlib", "numpy", "snowballstemmer"):
                    raise
                raise MissingExtraError("Workspace search (bm25, vector_store)", "search", exc.name) from None
            try:
                parse_bm25_config(bm25)
            except ValueError as exc:
                raise WorkspaceError(str(exc), "INVALID_SEARCH_CONFIG", self._id) from None
        if bm25 or (vector_store is not None and embedder is not None):
            self._search = WorkspaceSearch(
                bm25=bm25,
                vector_store=vector_store,
                embedder=embedder,
                index_name=self._search_index_name,
                index_dir=index_dir if index_dir is not None else self._default_index_dir(),
                # The default lies in the sandbox's working directory, which commands write:
                # it is made and used through a descriptor, never through a planted link.
                private_dir=index_dir is None,
            )

    def _configure_shared_index(self, url: str | None, options: Mapping[str, Any] | None) -> None:
        """A published index searched beside the workspace's own (checked here, fetched at the
        first search or ``init()``)."""
        if url is None:
            if options is not None:
                raise WorkspaceError(
                    "search_index_options needs search_index_url", "INVALID_SEARCH_CONFIG", self._id
                )
            return
        if not isinstance(url, str) or not url:
            raise WorkspaceError(
                f"search_index_url must be a URL string, got {url!r}", "INVALID_SEARCH_CONFIG", self._id
            )
        if self._search is None or not self._search.can_bm25:
            raise WorkspaceError(
                "search_index_url needs bm25: the published index is searched with BM25 (set bm25=True, "
                "with the tokenize options the index was built with)",
                "INVALID_SEARCH_CONFIG",
                self._id,
            )
        from .search import parse_index_options

        try:
            parse_index_options(options)
        except ValueError as exc:
            raise WorkspaceError(str(exc), "INVALID_SEARCH_CONFIG", self._id) from None
        # Published ids are paths from the index's root, "/" first; they are shown in the form
        # this workspace's own ids take (relative unless a pattern starts with "/"), so a hit
        # can be opened (a local directory refuses "/src/app.py").
        relative = not any(str(pattern).startswith("/") for pattern in self._auto_index_paths)
        self._search.attach(url, options, relative_ids=relative)

    def _default_index_dir(self) -> str | None:
        """Next to the mounts when filesystems are mounted into a local sandbox, else None
        (in memory)."""
        view = SandboxView(self._sandbox)
        workdir = view.working_directory
        if workdir is None or not view.mount_entries:
            return None
        import os

        return os.path.join(os.path.abspath(os.path.expanduser(str(workdir))), ".agentvfs")

    # -- identity and providers ------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The workspace id."""
        return self._id

    @property
    def name(self) -> str:
        """The workspace name."""
        return self._name

    @property
    def status(self) -> WorkspaceStatus:
        """``pending initializing ready paused error destroying destroyed``."""
        return self._status

    @property
    def filesystem(self) -> WorkspaceFilesystem | None:
        """The static filesystem (None when a resolver is configured)."""
        return self._filesystem

    @property
    def sandbox(self) -> Any:
        """The static sandbox (None when a resolver is configured)."""
        return self._sandbox

    @property
    def skills(self) -> WorkspaceSkills | None:
        """The workspace's skills (None without a ``skills`` configuration), created on
        first access; discovery runs on first use.

        Skills are read from ``skill_source`` if given, else from the filesystem (the one
        resolved for each request when it is a resolver), else from the current directory.

        Raises
        ------
        WorkspaceNotReadyError
            The workspace is being or has been destroyed.
        """
        if not self.has_skills_config():
            return None
        if self._teardown_started:
            raise WorkspaceNotReadyError(self._id, self._status)
        if self._skills is None:
            from .skills import create_workspace_skills

            self._skills = create_workspace_skills(
                self, self._skills_config or [], self._skill_source,
                search=self._search, torn_down=lambda: self._teardown_started,
            )
        return self._skills

    def has_skills_config(self) -> bool:
        """Skills paths (a non-empty list, or a function of the request) are configured."""
        return callable(self._skills_config) or bool(self._skills_config)

    @property
    def can_bm25(self) -> bool:
        """BM25 keyword search is configured."""
        return bool(self._bm25)

    @property
    def can_vector(self) -> bool:
        """Vector search is configured (store and embedder)."""
        return self._vector_store is not None and self._embedder is not None

    @property
    def can_hybrid(self) -> bool:
        """Both BM25 and vector search are configured."""
        return self.can_bm25 and self.can_vector

    @property
    def operation_timeout(self) -> float | None:
        """Milliseconds allowed per filesystem operation, or None."""
        return self._operation_timeout

    def has_filesystem_config(self) -> bool:
        """A filesystem or filesystem resolver is configured."""
        return self._filesystem is not None or self._filesystem_resolver is not None

    def has_sandbox_config(self) -> bool:
        """A sandbox or sandbox resolver is configured."""
        return self._sandbox is not None or self._sandbox_resolver is not None

    def has_sandbox_resolver(self) -> bool:
        """The sandbox is resolved per request."""
        return self._sandbox_resolver is not None

    def has_sandbox_cache_key(self) -> bool:
        """Resolved sandboxes are memoised by a key function."""
        return self._sandbox_cache_key is not None

    async def resolve_filesystem(self, *, request_context: RequestContext | None = None) -> WorkspaceFilesystem | None:
        """Return the filesystem for a request: the static one, or the resolver's (memoised
        per request context object)."""
        if self._filesystem is not None or self._filesystem_resolver is None:
            return self._filesystem
        ctx = request_context if request_context is not None else RequestContext()
        resolver = self._filesystem_resolver

        async def produce() -> WorkspaceFilesystem | None:
            fs = await _maybe_await(resolver(ctx))
            if fs is not None and not _is_filesystem(fs):
                raise WorkspaceError(
                    f"filesystem resolver returned {type(fs).__name__}, not a WorkspaceFilesystem",
                    "INVALID_CONFIG",
                    self._id,
                )
            if fs is not None and self._operation_timeout is not None:
                fs = TimeoutFilesystem(fs, self._operation_timeout)
            return fs  # type: ignore[no-any-return]

        return await _memoised(ctx._memo, (self._id, "filesystem"), produce)  # type: ignore[no-any-return]

    async def resolve_sandbox(self, *, request_context: RequestContext | None = None) -> Any:
        """Return the sandbox for a request: static, memoised by ``sandbox_cache_key``, or
        memoised per request context. A failed resolution is not cached."""
        if self._sandbox is not None or self._sandbox_resolver is None:
            return self._sandbox
        ctx = request_context if request_context is not None else RequestContext()
        resolver = self._sandbox_resolver

        async def produce() -> Any:
            return await _maybe_await(resolver(ctx))

        cache_key = self._sandbox_cache_key(ctx) if self._sandbox_cache_key else None
        if cache_key is None:
            return await _memoised(ctx._memo, (self._id, "sandbox"), produce)
        return await _memoised(self._sandbox_cache, cache_key, produce)

    def clear_sandbox_cache(self, cache_key: str | None = None) -> None:
        """Forget memoised sandboxes (one key, or all). Never destroys them."""
        if cache_key is None:
            self._sandbox_cache.clear()
        else:
            self._sandbox_cache.pop(cache_key, None)

    # -- tools configuration -------------------------------------------------------------------------------

    def get_tools_config(self) -> dict[str, Any] | None:
        """Return the tools configuration object as given (identity, not a copy)."""
        return self._tools_config

    def set_tools_config(self, config: dict[str, Any] | None) -> None:
        """Replace the tools configuration wholesale; takes effect at the next ``create_tools``."""
        self._tools_config = config

    async def create_tools(self, *, request_context: RequestContext | None = None) -> dict[str, WorkspaceTool]:
        """Build the agent tools for this workspace, keyed by exposed name, in the reference's
        registration order, with the tools configuration applied (see ``set_tools_config``).

        Raises
        ------
        ValueError
            Two tools were configured with the same exposed name.
        """
        from .tools import build_tools, workspace_tool_specs

        return await build_tools(self, workspace_tool_specs(self), request_context)

    # -- search ---------------------------------------------------------------------------------------------------

    @property
    def index_dir(self) -> str | None:
        """Where the search index persists (None: in memory, or no search configured)."""
        return self._search.index_dir if self._search is not None else None

    def _require_search(self) -> WorkspaceSearch:
        if self._teardown_started:
            raise WorkspaceNotReadyError(self._id, self._status)
        if self._search is None:
            raise SearchNotAvailableError()
        return self._search

    async def index(
        self,
        path: str,
        content: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        start_line_offset: int | None = None,
    ) -> None:
        """Index ``content`` under the id ``path`` (replacing a document with that id).

        Raises
        ------
        SearchNotAvailableError
            No search is configured.
        WorkspaceNotReadyError
            The workspace is being or has been destroyed.
        """
        search = self._require_search()
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        if not isinstance(content, str):
            raise TypeError(f"content must be str, not {type(content).__name__}")
        self.touch()
        await self._with_timeout(search.index(path, content, metadata=metadata, start_line_offset=start_line_offset))

    async def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        mode: str | None = None,
        min_score: float | None = None,
        vector_weight: float = 0.5,
        filter: Mapping[str, Any] | None = None,
    ) -> list[SearchResult]:
        """Search the index: ``mode`` ``bm25``, ``vector`` or ``hybrid`` (default: the best
        configured). Request-scoped skill documents are never returned.

        Raises
        ------
        SearchNotAvailableError
            No search is configured.
        ValueError
            The mode is not configured (the reference's message), or a bad argument.
        """
        if self._search is None:
            raise SearchNotAvailableError()
        search = self._search
        self.touch()
        engine = await search.engine()
        scoped = engine.scoped_count()
        hidden = {"skill_scope": {"$exists": False}}
        combined = {"$and": [dict(filter), hidden]} if filter else hidden
        results = await self._with_timeout(
            search.search(
                query,
                top_k=top_k + scoped,
                mode=mode,
                min_score=min_score,
                vector_weight=vector_weight,
                filter=combined,
            )
        )
        visible = [r for r in results if not (r.metadata or {}).get("skill_scope")]
        return visible[:top_k]

    async def rebuild_search_index(self, paths: Sequence[str] | None = None) -> None:
        """Clear the search index and index the files ``paths`` (default ``auto_index_paths``)
        name; files longer than 4,000 characters become ``path#chunk-N`` documents.

        A no-op without search, without a static filesystem or without paths. The sandbox is
        not started.
        """
        search = self._require_search() if self._search is not None else None
        targets = list(paths) if paths is not None else list(self._auto_index_paths)
        if search is None or self._filesystem is None or not targets:
            return
        await search.rebuild(self._filesystem, targets)

    async def _with_timeout(self, awaitable: Awaitable[Any]) -> Any:
        if self._operation_timeout is None:
            return await awaitable
        with anyio.fail_after(self._operation_timeout / 1000):
            return await awaitable

    async def refresh_index(self, path: str, *, removed: bool = False) -> None:
        """Keep search current after ``path`` changed other than through the workspace tools.

        For code that writes through :attr:`filesystem` on an agent's behalf (the framework
        adapters of :mod:`agentvfs.integrations`): with ``tools={"auto_reindex": True}``, an
        indexed path is read again, or dropped when ``removed``, as the tools do after their
        own writes. Without ``auto_reindex`` or search, nothing happens. A failure to
        re-index is logged, never raised: the change itself has happened.

        Parameters
        ----------
        path : str
            The changed path, as the filesystem names it.
        removed : bool, optional
            The path was deleted.
        """
        if self._filesystem is not None:
            await self._after_tool_write("delete" if removed else "write_file", path, self._filesystem)

    async def _after_tool_write(self, operation: str, path: str, fs: WorkspaceFilesystem) -> None:
        """Keep indexed paths fresh after a tool changed them (``tools={"auto_reindex": True}``)."""
        search = self._search
        config = self._tools_config or {}
        if search is None or not config.get("auto_reindex") or fs is not self._filesystem:
            return
        try:
            if operation == "delete":
                await search.forget_path(path)
            else:
                await search.refresh_path(fs, path)
        except Exception:
            logger.warning('Failed to re-index "%s" after %s', path, operation, exc_info=True)

    # -- snapshots ----------------------------------------------------------------------------------------------

    def _snapshot_filesystem(self) -> WorkspaceFilesystem:
        if self._teardown_started:
            raise WorkspaceNotReadyError(self._id, self._status)
        if self._filesystem is None:
            raise WorkspaceError(
                "Snapshots need a static filesystem (this workspace has "
                + ("a filesystem resolver" if self._filesystem_resolver is not None else "no filesystem")
                + "); take them of the resolved filesystem with agentvfs.snapshots.take_snapshot",
                "NO_FILESYSTEM",
                self._id,
            )
        return self._filesystem

    def snapshot_store(self) -> SnapshotStore:
        """Where this workspace's snapshots are kept (``snapshot_store``, else
        ``.agentvfs/snapshots`` of its filesystem).

        Raises
        ------
        WorkspaceError
            ``NO_FILESYSTEM``: no static filesystem.
        """
        if self._snapshot_store is None:
            from .snapshots import DEFAULT_PREFIX, SnapshotStore

            config = self._snapshot_store_config
            self._snapshot_store = (
                SnapshotStore(self._snapshot_filesystem(), prefix=DEFAULT_PREFIX)
                if config is None
                else SnapshotStore(config)
            )
        return self._snapshot_store

    async def snapshot(self, name: str | None = None, *, lock_wait: float | None = None) -> Snapshot:
        """Record the state of the workspace filesystem as a new, immutable snapshot.

        The manifest lists every file (its ETag or generation, size, modification time and
        SHA-256), every directory (empty ones too) and every symbolic link the filesystem
        shows; agentvfs's own ``.agentvfs`` directory is left out. Its id is the SHA-256 of
        the manifest. No file data is copied where the bucket keeps versions (S3 versioning
        enabled: the manifest names each object's ``VersionId``; GCS object versioning: its
        generation) or where a blob of the same content is stored already; other contents
        are stored once each as blobs named by their hash. A file whose version the previous
        snapshot saw is not read again (on storage with real versions).

        Each file's record is of one version even while the workspace is written meanwhile
        (its content is read between two listings that must agree); the snapshot as a whole
        is not one instant of every path (no object store has one).

        Parameters
        ----------
        name : str, optional
            A name to find it by (names need not be unique; the newest wins).
        lock_wait : float, optional
            Seconds to wait for a garbage collection of the store under way (default: the
            store's ``lock_wait``, 300).

        Returns
        -------
        Snapshot
            The snapshot, with its ``id``.

        Raises
        ------
        WorkspaceReadOnlyError
            The snapshots would be kept in a read-only filesystem (the workspace's own, when
            it is read-only and no ``snapshot_store`` is given).
        WorkspaceError
            ``NO_FILESYSTEM``: no static filesystem.
        ValueError
            ``name`` is empty, too long or holds control characters.
        TimeoutError
            A garbage collection of the store was under way for ``lock_wait`` seconds.
        """
        fs = self._snapshot_filesystem()
        store = self.snapshot_store()
        if store.fs.read_only:
            from .errors import WorkspaceReadOnlyError

            where = "the workspace" if store.fs is fs else "the snapshot store"
            raise WorkspaceReadOnlyError(
                f"snapshot ({where} is read-only; give Workspace(snapshot_store=...) a writable filesystem "
                "or URL to keep snapshots elsewhere)"
            )
        from .snapshots import take_snapshot

        self.touch()
        return await take_snapshot(fs, store, name=name, lock_wait=lock_wait)

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """Every snapshot of the store, oldest first (id, name, time, counts).

        Raises
        ------
        WorkspaceError
            ``NO_FILESYSTEM``: no static filesystem.
        """
        self._snapshot_filesystem()
        return await self.snapshot_store().list()

    async def delete_snapshot(self, snapshot: str) -> str:
        """Delete a snapshot (its manifest and listing record) and return its id.

        The contents it kept as blobs stay in the store: other snapshots may hold the same
        content. A snapshot's id deletes it without reading its manifest (one changed in
        storage can be deleted too).

        Parameters
        ----------
        snapshot : str
            The snapshot's id, id prefix or name (the newest of that name).

        Raises
        ------
        SnapshotNotFoundError
            No snapshot goes by that name or id.
        WorkspaceReadOnlyError
            The store is read-only.
        WorkspaceError
            ``NO_FILESYSTEM``: no static filesystem.
        """
        self._snapshot_filesystem()
        return await self.snapshot_store().delete(snapshot)

    async def diff(self, a: str | None = None, b: str | None = None, *, patches: bool = True) -> SnapshotDiff:
        """What changed from state ``a`` to state ``b``: each a snapshot's id, id prefix or
        name, or None for the live workspace (``diff("before")``: from that snapshot to
        now).

        Parameters
        ----------
        a, b : str, optional
            The earlier and later state.
        patches : bool
            Give text files a unified diff (``Change.patch``); False compares contents only.

        Returns
        -------
        SnapshotDiff
            ``added``, ``removed`` and ``changed`` paths (``.agentvfs`` never among them),
            each :class:`~agentvfs.snapshots.Change` with its patch.

        Raises
        ------
        SnapshotNotFoundError
            No snapshot goes by a name or id given.
        BlobIntegrityError
            A manifest or content was changed in storage.
        """
        from .snapshots import diff_snapshots

        fs = self._snapshot_filesystem()
        return await diff_snapshots(fs, a, b, store=self.snapshot_store(), patches=patches)

    async def restore(
        self, snapshot: str, paths: Sequence[str] | None = None, *, force: bool = False
    ) -> RestoreResult:
        """Bring the workspace (or ``paths`` and what is below them) back to a snapshot.

        Without ``force`` a restore only adds back what was deleted since the snapshot
        (files, directories, links); anything that differs from the snapshot (a file
        modified, or added, since; a path whose kind changed) is a change the snapshot does
        not hold, so it is left as it is and reported in ``conflicts``. With ``force`` those
        are replaced, or deleted, too. Either way each write is conditional on the version
        the restore compared: a change made while the restore runs is never overwritten,
        and is reported (``changed during restore``). Every content is checked against the
        snapshot before the first write, and writes come before deletions: a restore that
        fails leaves extra files, never lost ones. ``.agentvfs`` is never touched.

        Parameters
        ----------
        snapshot : str
            The snapshot's id, id prefix or name.
        paths : sequence of str, optional
            Restore only these paths and what is below them.
        force : bool
            Also replace and delete what changed after the snapshot.

        Returns
        -------
        RestoreResult
            ``restored``, ``conflicts`` and ``skipped`` (already as in the snapshot) paths.

        Raises
        ------
        SnapshotNotFoundError
            No snapshot goes by that name or id.
        BlobIntegrityError
            The manifest, or a content to write, was changed in storage (nothing written).
        WorkspaceReadOnlyError
            The workspace is read-only.
        """
        from .snapshots import restore_snapshot

        fs = self._snapshot_filesystem()
        self.touch()
        return await restore_snapshot(fs, snapshot, store=self.snapshot_store(), paths=paths, force=force)

    async def open_snapshot(self, snapshot: str) -> SnapshotFilesystem:
        """A snapshot as a read-only filesystem (see
        :class:`~agentvfs.snapshots.SnapshotFilesystem`), initialised.

        Raises
        ------
        SnapshotNotFoundError
            No snapshot goes by that name or id.
        """
        from .snapshots import SnapshotFilesystem

        fs = SnapshotFilesystem(self._snapshot_filesystem(), snapshot, store=self.snapshot_store())
        await fs.init()
        return fs

    # -- forks ---------------------------------------------------------------------------------------------------

    def fork(
        self,
        snapshot: str | None = None,
        *,
        upper: WorkspaceFilesystem | None = None,
        sandbox: Any = None,
        id: str | None = None,
        name: str | None = None,
    ) -> Workspace:
        """A new workspace whose changes stay private until :meth:`commit`.

        The fork's filesystem is an :class:`~agentvfs.vfs.OverlayFilesystem`: reads fall
        through to this workspace's filesystem (or to a snapshot of it), every change lands
        in ``upper``. Nothing reaches this workspace until ``fork.commit()``, which applies
        the changes with guarded writes; ``fork.discard()`` drops them.

        What the fork shares: the tools configuration (a copy of the mapping), skills
        configuration, instructions and, when this workspace was given one, the
        ``snapshot_store``. What it does not: the search index (a fork has no search), the
        sandbox and its mounts (this workspace's sandbox runs commands against this
        workspace's files; pass ``sandbox=`` and mount ``fork.filesystem`` into it like
        any filesystem to run commands against the fork), undo checkpoints, and, without a
        ``snapshot_store``, the snapshots: the fork keeps its own in memory, so they never
        land in the upper layer (and so in a commit).

        Parameters
        ----------
        snapshot : str, optional
            Fork a snapshot (its id, id prefix or name) rather than the live state. A commit
            is then guarded by the snapshot's versions: a path changed in this workspace
            since the snapshot is a conflict, reported and not overwritten.
        upper : WorkspaceFilesystem, optional
            Where the fork keeps its changes (default: a fresh in-memory filesystem). It
            must be writable, empty or an earlier fork's upper layer, and used by one fork
            only.
        sandbox : object, optional
            A sandbox for the fork (default: none).
        id, name : str, optional
            The fork's id and name (defaults as for any workspace).

        Returns
        -------
        Workspace
            The fork, not yet initialised (``await fork.init()`` or ``async with fork``;
            an unknown ``snapshot`` raises ``SnapshotNotFoundError`` there).

        Raises
        ------
        WorkspaceError
            ``NO_FILESYSTEM``: this workspace has no static filesystem.
        ValueError
            ``upper`` is read-only or is this workspace's filesystem.
        """
        live = self._snapshot_filesystem()
        from .vfs import BackendFilesystem, MemoryBackend, OverlayFilesystem

        base: WorkspaceFilesystem = live
        if snapshot is not None:
            from .snapshots import SnapshotFilesystem

            base = SnapshotFilesystem(live, snapshot, store=self.snapshot_store())
        layer = upper if upper is not None else BackendFilesystem(MemoryBackend())
        overlay = OverlayFilesystem(base, layer, display_name=live.display_name, text_extensions=live.text_extensions)
        store: Any = self._snapshot_store_config
        if store is None:
            from .snapshots import DEFAULT_PREFIX, SnapshotStore

            store = SnapshotStore(BackendFilesystem(MemoryBackend()), prefix=DEFAULT_PREFIX)
        elif self._snapshot_store is not None:
            store = self._snapshot_store
        fork = Workspace(
            id=id,
            name=name,
            filesystem=overlay,
            sandbox=sandbox,
            skills=self._skills_config,
            skill_source=self._skill_source,
            tools=dict(self._tools_config) if self._tools_config is not None else None,
            instructions=self._instructions,
            snapshot_store=store,
        )
        fork._fork = (overlay, live)
        return fork

    @property
    def is_fork(self) -> bool:
        """This workspace was made by :meth:`fork` (so :meth:`commit` and :meth:`discard` apply)."""
        return self._fork is not None

    def _fork_overlay(self, operation: str) -> tuple[OverlayFilesystem, WorkspaceFilesystem]:
        if self._fork is None:
            raise WorkspaceError(
                f"{operation}() applies to a fork, and this workspace is not one: make one with "
                "fork = workspace.fork() (or workspace.fork(snapshot=...)), work in it, then call "
                f"fork.{operation}()",
                "NOT_A_FORK",
                self._id,
            )
        if self._teardown_started:
            raise WorkspaceNotReadyError(self._id, self._status)
        return self._fork

    async def changes(self) -> list[str]:
        """The paths a fork changed and has not committed yet (files, directories and
        deletions), sorted.

        Raises
        ------
        WorkspaceError
            ``NOT_A_FORK``: this workspace is not a fork.
        """
        overlay, _ = self._fork_overlay("changes")
        return await overlay.changes()

    async def commit(self, *, force: bool = False) -> CommitReport:
        """Apply a fork's changes into the workspace it was forked from.

        Each write is guarded by the version the fork started from (the live version when
        the fork read it, or the snapshot's for a fork of a snapshot): a path changed in the
        original since is a conflict, left in the fork and reported, never overwritten. What
        was applied leaves the fork's upper layer; a later commit tries the conflicts again.
        Not atomic across paths.

        Parameters
        ----------
        force : bool
            Apply every change without checking versions.

        Returns
        -------
        CommitReport
            ``applied`` and ``conflicts`` paths, with ``reasons``; ``ok`` without conflicts.

        Raises
        ------
        WorkspaceError
            ``NOT_A_FORK``: this workspace is not a fork.
        ValueError
            The original workspace's filesystem is read-only.
        """
        overlay, live = self._fork_overlay("commit")
        self.touch()
        return await overlay.commit(into=live, force=force)

    async def discard(self) -> None:
        """Drop every change of a fork: it shows the original (or its snapshot) again.

        Raises
        ------
        WorkspaceError
            ``NOT_A_FORK``: this workspace is not a fork.
        """
        overlay, _ = self._fork_overlay("discard")
        self.touch()
        await overlay.discard()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def init(self) -> dict[str, Any]:
        """Initialise the static filesystem, start the static sandbox, index ``auto_index_paths``.

        Resolver-backed providers are never resolved here. Any failure sets ``status`` to
        ``error`` and is raised.

        Returns
        -------
        dict
            ``{"search": counts}`` when ``auto_index_paths`` were indexed, else ``{}``. The
            counts are ``indexed``, ``unchanged``, ``removed``, ``failed``, ``too_large`` and
            ``unlisted``: the paths whose listing failed (storage down, a timeout, a
            permission). Files indexed below those are kept, not taken as removed, and each
            failure is logged as a warning; a later ``init()`` or ``index`` brings them in step.
        """
        result: dict[str, Any] = {}
        self._status = "initializing"
        _LIVE.add(self)
        try:
            if self._filesystem is not None:
                await self._filesystem.init()
            if self._search is not None and self._sandbox is not None:
                # The default index lies in the sandbox's working directory: made before the
                # sandbox runs anything, and bound read-only into its commands.
                private = await anyio.to_thread.run_sync(self._search.prepare_private_dir)
                if private is not None:
                    SandboxView(self._sandbox).protect_path(private)
            if self._sandbox is not None:
                await call_lifecycle(self._sandbox, "start")
            if self._search is not None and self._filesystem is not None and self._auto_index_paths:
                if self._search.index_dir is not None:
                    # A persistent index: only what changed since it was last in step.
                    result["search"] = await self._search.sync(self._filesystem, self._auto_index_paths)
                else:
                    result["search"] = await self._search.rebuild(self._filesystem, self._auto_index_paths)
            self._status = "ready"
        except BaseException:
            self._status = "error"
            raise
        return result

    async def stop(self) -> None:
        """Stop the static sandbox (background processes, mounts); filesystem and index stay.

        Concurrent calls coalesce; a no-op once teardown started.
        """
        if self._teardown_started or self._status == "destroyed":
            return
        await self._stop()

    async def _stop(self) -> None:
        if self._stopping is not None:
            await self._stopping.wait()
            return
        self._stopping = anyio.Event()
        try:
            if self._sandbox is not None:
                await call_lifecycle(self._sandbox, "stop")
        finally:
            self._stopping.set()
            self._stopping = None

    async def destroy(self) -> None:
        """Tear everything down: sandbox, then filesystem; memoised sandboxes are forgotten.

        Idempotent; concurrent calls wait for the one in flight. Stored files and a
        persisted index are never deleted.
        """
        if self._status == "destroyed":
            return
        if self._destroying is not None:
            await self._destroying.wait()
            if self._destroy_error is not None:
                raise self._destroy_error
            return
        self._teardown_started = True
        self._destroying = anyio.Event()
        self._status = "destroying"
        try:
            if self._stopping is not None:
                await self._stopping.wait()
            if self._sandbox is not None:
                await call_lifecycle(self._sandbox, "destroy")
            if self._filesystem is not None:
                await self._filesystem.destroy()
            self.clear_sandbox_cache()
            self._status = "destroyed"
        except BaseException as exc:
            self._status = "error"
            self._destroy_error = exc
            raise
        finally:
            if self._search is not None:
                # The in-memory index is dropped; a persistent one is closed, never deleted.
                with anyio.CancelScope(shield=True):
                    try:
                        await self._search.shutdown()
                    except Exception:
                        logger.warning("Closing the search index failed", exc_info=True)
            self._destroying.set()
            self._destroying = None
            _LIVE.discard(self)

    async def __aenter__(self) -> Workspace:
        await self.init()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    def blocking(self) -> BlockingWorkspace:
        """Return a synchronous facade with the same methods (for scripts and notebooks).

        It runs an event loop in a helper thread; use it as a context manager or call
        ``close()`` when done.
        """
        from ._blocking import BlockingWorkspace

        return BlockingWorkspace(self)

    # -- description -------------------------------------------------------------------------------------

    async def get_info(
        self,
        *,
        include_file_count: bool = False,
        request_context: RequestContext | None = None,
        resolve_dynamic_providers: bool = True,
    ) -> dict[str, Any]:
        """Describe the workspace: ``id, name, status, created_at, last_accessed_at`` and, when
        configured, ``filesystem`` and ``sandbox`` (never credentials).

        Parameters
        ----------
        include_file_count : bool
            Add ``total_files`` (files below the root, ten levels deep at most).
        request_context : RequestContext, optional
            Passed to resolvers.
        resolve_dynamic_providers : bool
            Resolve a filesystem resolver; if False a placeholder is reported instead.
        """
        info: dict[str, Any] = {
            "id": self._id,
            "name": self._name,
            "status": self._status,
            "created_at": self.created_at,
            "last_accessed_at": self.last_accessed_at,
        }
        fs: WorkspaceFilesystem | None = self._filesystem
        if fs is None and self._filesystem_resolver is not None:
            if resolve_dynamic_providers:
                fs = await self.resolve_filesystem(request_context=request_context)
            else:
                info["filesystem"] = {
                    "id": f"{self._id}-dynamic-filesystem",
                    "name": "DynamicFilesystem",
                    "provider": "dynamic",
                    "status": "pending",
                }
        if fs is not None:
            fs_info = await fs.get_info()
            if include_file_count:
                fs_info["total_files"] = await self._count_files(fs)
            info["filesystem"] = fs_info
        if self._sandbox is not None:
            info["sandbox"] = await SandboxView(self._sandbox).info()
        elif self._sandbox_resolver is not None:
            info["sandbox"] = {"provider": "dynamic", "status": "pending"}
        return info

    @staticmethod
    async def _count_files(fs: WorkspaceFilesystem) -> int:
        try:
            entries = await fs.readdir("", recursive=True, max_depth=10)
        except Exception:
            return 0
        return sum(1 for e in entries if e.type == "file")

    def _sandbox_instructions(self, sandbox: Any, ctx: RequestContext | None) -> list[str]:
        parts: list[str] = []
        view = SandboxView(sandbox)
        text = view.instructions(ctx)
        if text:
            parts.append(text)
        entries = view.mount_entries
        if not entries:
            return parts
        accessible: list[str] = []
        workspace_only: list[str] = []
        workdir = view.working_directory
        for mount_path, entry in entries.items():
            fs = entry.filesystem
            label = (fs.display_name or fs.provider) if fs is not None else "unknown"
            mode = "read-only" if fs is not None and fs.read_only else "read-write"
            if entry.state in ("mounted", "pending", "mounting"):
                shown = f"{str(workdir).rstrip('/')}/{mount_path.lstrip('/')}" if workdir else mount_path
                accessible.append(f"  - {shown}: {label} ({mode})")
            else:
                workspace_only.append(f"  - {mount_path}: {label} ({mode})")
        if accessible:
            parts.append("Sandbox-mounted filesystems (accessible in shell commands):\n" + "\n".join(accessible))
        if workspace_only:
            parts.append(
                "Workspace-only filesystems (use file tools, NOT available in shell commands):\n"
                + "\n".join(workspace_only)
            )
        return parts

    def get_instructions(self, *, request_context: RequestContext | None = None) -> str:
        """Return what agents should know about this workspace (static providers only).

        The sandbox's instructions, then its mounts (sandbox-accessible or workspace-only);
        without sandbox mounts, the filesystem's instructions. Parts are joined by a blank line.
        """
        parts: list[str] = []
        if self._sandbox is not None:
            parts = self._sandbox_instructions(self._sandbox, request_context)
        has_mounts = bool(SandboxView(self._sandbox).mount_entries)
        if not has_mounts and self._filesystem is not None:
            text = self._filesystem.get_instructions(request_context=request_context)
            if text:
                parts.append(text)
        return "\n\n".join(parts)

    async def get_instructions_async(self, *, request_context: RequestContext | None = None) -> str:
        """Like :meth:`get_instructions`, but resolves a dynamic filesystem and describes a
        dynamic sandbox (a placeholder sentence, the resolved sandbox, or a custom function)."""
        ctx = request_context if request_context is not None else RequestContext()
        parts: list[str] = []
        sandbox = self._sandbox
        mode = self._instructions.get("dynamic_sandbox", "placeholder")
        if sandbox is None and self._sandbox_resolver is not None:
            if mode == "resolve":
                sandbox = await self.resolve_sandbox(request_context=ctx)
            elif callable(mode):
                text = await _maybe_await(mode(ctx))
                if text:
                    parts.append(str(text))
            else:
                parts.append(_DYNAMIC_SANDBOX_TEXT)
        if sandbox is not None:
            parts.extend(self._sandbox_instructions(sandbox, ctx))
        has_mounts = bool(SandboxView(sandbox).mount_entries)
        if not has_mounts:
            fs = await self.resolve_filesystem(request_context=ctx)
            if fs is not None:
                text = fs.get_instructions(request_context=ctx)
                if text:
                    parts.append(text)
        return "\n\n".join(parts)

    def touch(self) -> None:
        """Record activity (tools and search call this)."""
        self.last_accessed_at = datetime.now(UTC)

    def __repr__(self) -> str:
        return f"Workspace(id={self._id!r}, name={self._name!r}, status={self._status!r})"

