"""A workspace's search index: which files are indexed, and keeping the index in step with
them across restarts.

``WorkspaceSearch`` owns the engine (BM25 in DuckDB, vectors in the configured store) and a
record of every auto-indexed file (size, modification time, ETag, content hash, number of
chunks). With an ``index_dir`` the DuckDB file lives there and a new Workspace on the same
directory reuses it: ``sync`` re-reads only files whose size, time or ETag changed, re-indexes
only those whose content changed, and drops files that are gone. Embeddings are cached by
content hash and model, so a restart, or the same text under another name, costs no new
embedding calls; a change of embedding model forces re-embedding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import posixpath
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ..errors import BM25FileError, FileTooLarge, SearchIndexError
from ..vfs import (
    FileStat,
    WorkspaceFilesystem,
    create_glob_matcher,
    extract_glob_base,
    is_glob_pattern,
    list_stats,
    read_many,
    walk,
    walk_stats,
)
from ._bm25 import CHECKPOINT_SUFFIX, BM25Index
from ._chunking import split_into_chunks
from ._duckdb import no_pandas_lookups, registered, table_names
from ._embedders import embedder_id
from ._engine import Document, Fusion, SearchEngine, SearchResult
from ._ids import relative_names, shared_path
from ._tokenize import TokenizeOptions

if TYPE_CHECKING:
    from ._shared import SharedIndex

__all__ = ["INDEX_FILE", "MAX_INDEX_FILE_BYTES", "WorkspaceSearch", "parse_bm25_config"]

_log = logging.getLogger("agentvfs.search")

#: The DuckDB file of a persistent index, inside ``index_dir``.
INDEX_FILE = "search.duckdb"
#: Directory depth walked below an auto-indexed directory (as the reference).
MAX_DEPTH = 10
#: Files read at once while indexing.
READ_CONCURRENCY = 8
#: Files indexed (and embedded) per round while (re)indexing, so progress is kept as it goes;
#: each round is one transaction, and at 256 files their commits took a sixth of a build.
ROUND = 1024
#: What has been read is indexed (and recorded) once it holds this many bytes, before more is
#: read: indexing holds some 15 to 17 times the text in memory at its peak (16 MiB of prose in
#: one file or in 256 took 250 to 270 MiB), and a sync holds two such rounds (one indexed while
#: the next is read).
ROUND_BYTES = 16 * 1024 * 1024
#: Auto-indexed files larger than this are not indexed (``WorkspaceSearch(max_file_bytes=...)``):
#: skipped with a warning and counted as ``too_large`` by :meth:`WorkspaceSearch.sync`. The
#: limit holds on the file read, whatever size its listing showed (on local disk no more than a
#: byte past it is read).
MAX_INDEX_FILE_BYTES = 16 * 1024 * 1024
#: A persistent index of at least this many documents gets a checkpoint when it is closed
#: after a change (see ``_checkpoint.py``); below it, loading from DuckDB is quick anyway.
CHECKPOINT_MIN_DOCS = 2000
#: A sync that indexed at least this many files writes the checkpoint at once.
CHECKPOINT_AFTER_FILES = 1000





def parse_bm25_config(value: Any) -> tuple[float, float, TokenizeOptions | None] | None:
    """``True``, ``{"k1", "b"}`` or ``{"bm25": {...}, "tokenize": {...}}`` -> (k1, b, options);
    None/False -> None.

    Raises
    ------
    ValueError
        An unknown key or a value of the wrong type, named.
    """
    if value is None or value is False:
        return None
    if value is True:
        return 1.5, 0.75, None
    if not isinstance(value, Mapping):
        raise ValueError(f"bm25 must be True or a mapping, got {type(value).__name__}")
    params: Mapping[str, Any] = value
    tokenize: Any = None
    if "bm25" in value or "tokenize" in value:
        unknown = set(value) - {"bm25", "tokenize"}
        if unknown:
            raise ValueError(
                f"bm25: unknown key {sorted(unknown)[0]!r} (expected 'bm25' and 'tokenize')"
            )
        params = value.get("bm25") or {}
        tokenize = value.get("tokenize")
        if not isinstance(params, Mapping):
            raise ValueError(f"bm25.bm25 must be a mapping, got {type(params).__name__}")
    unknown = set(params) - {"k1", "b"}
    if unknown:
        raise ValueError(f"bm25: unknown parameter {sorted(unknown)[0]!r} (expected 'k1' and 'b')")
    k1, b = params.get("k1", 1.5), params.get("b", 0.75)
    for name, number in (("k1", k1), ("b", b)):
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"bm25 {name} must be a number, got {number!r}")
    options = TokenizeOptions.from_value(tokenize) if tokenize is not None else None
    return float(k1), float(b), options


def parse_index_options(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """``search_index_options`` with defaults: ``storage_options``, ``cache_dir``,
    ``refresh_interval``, ``cache_grace`` (seconds a cached segment no manifest in use
    names is kept) and ``max_segment_bytes`` (the largest segment fetched).

    Raises
    ------
    ValueError
        An unknown key or a value of the wrong type, named.
    """
    from ..vfs import default_cache_dir

    options = dict(value or {})
    unknown = set(options) - {"storage_options", "cache_dir", "refresh_interval", "cache_grace", "max_segment_bytes"}
    if unknown:
        raise ValueError(
            f"search_index_options: unknown key {sorted(unknown)[0]!r} (expected "
            "'storage_options', 'cache_dir', 'refresh_interval', 'cache_grace' and 'max_segment_bytes')"
        )
    storage = options.get("storage_options") or {}
    if not isinstance(storage, Mapping):
        raise ValueError(
            f"search_index_options storage_options must be a mapping, got {type(storage).__name__}"
        )
    cache_dir = options.get("cache_dir")
    if cache_dir is None:
        cache_dir = os.path.join(default_cache_dir(), "index-segments")
    elif not isinstance(cache_dir, str | os.PathLike):
        raise ValueError(f"search_index_options cache_dir must be a path, got {cache_dir!r}")
    seconds: dict[str, float] = {}
    for key, default in (("refresh_interval", 30.0), ("cache_grace", 24 * 3600.0)):
        value = options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(f"search_index_options {key} must be a number of seconds >= 0, got {value!r}")
        seconds[key] = float(value)
    from ._bulk import MAX_SEGMENT_BYTES

    largest = options.get("max_segment_bytes", MAX_SEGMENT_BYTES)
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 1:
        raise ValueError(f"search_index_options max_segment_bytes must be a number of bytes >= 1, got {largest!r}")
    return {
        "storage_options": dict(storage), "cache_dir": os.fspath(cache_dir), **seconds,
        "max_segment_bytes": largest,
    }  # fmt: skip


@dataclass(frozen=True)
class _Signature:
    size: int
    mtime_ns: int
    etag: str | None

    @classmethod
    def of(cls, stat: Any) -> _Signature:
        modified = getattr(stat, "modified_at", None)
        mtime = int(modified.timestamp() * 1e9) if modified is not None else 0
        return cls(int(getattr(stat, "size", 0) or 0), mtime, getattr(stat, "etag", None))


@dataclass
class _Source:
    signature: _Signature
    digest: str
    chunks: int


def _from_bytes(blob: bytes) -> list[float]:
    """A vector kept as little-endian float64 bytes."""
    values: list[float] = np.frombuffer(blob, dtype="<f8").tolist()
    return values


def _objects(values: list[Any]) -> npt.NDArray[np.object_]:
    """``values`` as a one-dimensional object array (``np.array`` would make bytes of one
    length a fixed-width byte string array)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _relative(result: SearchResult) -> SearchResult:
    """A published hit (``/docs/a.md``, chunks' ``source_file`` too) named without its root."""
    if not result.id.startswith("/"):
        return result
    id, metadata = relative_names(result.id, result.metadata)
    return dataclasses.replace(result, id=id, metadata=metadata)


#: What indexes and records a round of files read: ``(engine, docs, sources, replacing)`` ->
#: how many files were indexed.
_Commit = Callable[[SearchEngine, list[Document], dict[str, _Source], list[str]], Awaitable[int]]


class _Commits:
    """Rounds of a (re)index committed one at a time, in order, each in the background of the
    reading and chunking of the next (`WorkspaceSearch.sync`): at most two rounds are held.

    `submit` waits for the round before to be done, starts this one and returns 0; `wait`
    waits for the last. What a round indexes is added to `indexed`; an error of a round is
    raised by the next `submit` or `wait`.
    """

    def __init__(
        self,
        commit: _Commit,
        group: anyio.abc.TaskGroup,
    ) -> None:
        self._commit = commit
        self._group = group
        self._done: anyio.Event | None = None
        self._error: Exception | None = None
        self.indexed = 0

    async def submit(
        self, engine: SearchEngine, docs: list[Document], sources: dict[str, _Source], replacing: list[str]
    ) -> int:
        await self.wait()
        if not docs and not sources and not replacing:
            return 0
        done = self._done = anyio.Event()
        self._group.start_soon(self._run, engine, docs, sources, replacing, done)
        return 0

    async def _run(
        self,
        engine: SearchEngine,
        docs: list[Document],
        sources: dict[str, _Source],
        replacing: list[str],
        done: anyio.Event,
    ) -> None:
        try:
            self.indexed += await self._commit(engine, docs, sources, replacing)
        except Exception as exc:
            self._error = exc
        finally:
            done.set()

    async def wait(self) -> None:
        if self._done is not None:
            await self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_documents(path: str, raw: bytes) -> list[Document]:
    """The documents a file's bytes are indexed as: the whole file, or its chunks
    ``<path>#chunk-<i>`` (metadata ``source_file``, start lines kept) when it is long.

    Bytes that are not UTF-8 become U+FFFD, as a UTF-8 read does in the reference: such files
    are indexed too, not skipped. Every builder of an index (a workspace's own, and segments
    built elsewhere) goes through here, so the same file is the same documents everywhere.
    """
    text = raw.decode("utf-8", "replace")
    chunks = split_into_chunks(text)
    if len(chunks) == 1:
        return [Document(path, text)]
    return [
        Document(f"{path}#chunk-{i}", chunk.content, {"source_file": path}, chunk.start_line)
        for i, chunk in enumerate(chunks)
    ]


def open_private_dir(path: str) -> int:
    """Make (or find) the directory ``path`` and return a descriptor of it, never following a
    link in its last component: what someone else planted there (a symlink to a directory of
    theirs, a file) is moved aside with a warning and a fresh directory made.

    The parent of ``path`` is trusted (it is configuration: a sandbox's working directory);
    the index is then opened through ``/proc/self/fd/N`` of the returned descriptor, so a
    rename or swap afterwards cannot redirect it.

    Raises
    ------
    OSError
        The parent does not exist or the directory cannot be made.
    """
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    parent_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(8):
            try:
                return os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
                )
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=parent_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                aside = f"{name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
                _log.warning(
                    "%s is not a directory of its own (a link or a file someone put there): moved "
                    "it to %s and made a fresh index directory",
                    os.path.join(parent, name), aside,
                )  # fmt: skip
                os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        raise OSError(errno.EAGAIN, "the index directory kept changing while it was opened", path)
    finally:
        os.close(parent_fd)


def _clear_planted(dir_fd: int, shown: str, names: Sequence[str]) -> None:
    """Move aside the symlinks among ``names`` in the directory ``dir_fd``: the index opens
    them by name, and a link there would send its writes wherever it points."""
    for name in names:
        try:
            planted = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            continue
        if planted:
            aside = f"{name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            _log.warning("%s is a symlink someone put there: moved it to %s", os.path.join(shown, name), aside)
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class WorkspaceSearch:
    """The search side of a workspace (see the module documentation).

    Parameters
    ----------
    bm25 : config
        As ``Workspace(bm25=...)``.
    vector_store, embedder, index_name, fusion
        As ``SearchEngine``.
    index_dir : str, optional
        Where the index persists; None keeps it in memory.
    private_dir : bool
        ``index_dir`` lies where someone else may write (a sandbox's working directory): its
        last component is made and opened without following links, and the index is used
        through that descriptor only (see :func:`open_private_dir`).
    max_file_bytes : int
        Files larger than this are not indexed (default :data:`MAX_INDEX_FILE_BYTES`, 16 MiB).
    index_url : str, optional
        A published index (``build_index``) to search together with this one, which then holds
        only the local changes (see ``_shared.py``).
    index_options : mapping, optional
        For ``index_url``: ``storage_options`` (fsspec), ``cache_dir`` (where its segments are
        kept; default ``<cache>/index-segments``), ``refresh_interval`` (seconds, default 30),
        ``cache_grace`` (seconds before a cached segment of an older manifest is deleted,
        default a day) and ``max_segment_bytes`` (the largest segment fetched, default 1 GiB).

    Attributes
    ----------
    max_file_bytes : int
        As the parameter; may be changed at any time.
    """

    def __init__(
        self,
        *,
        bm25: Any = None,
        vector_store: Any = None,
        embedder: Callable[..., Any] | None = None,
        index_name: str | None = None,
        index_dir: str | os.PathLike[str] | None = None,
        fusion: Fusion = "linear",
        private_dir: bool = False,
        max_file_bytes: int = MAX_INDEX_FILE_BYTES,
        index_url: str | None = None,
        index_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be a positive number of bytes, got {max_file_bytes!r}")
        self.max_file_bytes = max_file_bytes
        self._bm25_config = parse_bm25_config(bm25)
        self._vector_store = vector_store
        self._embedder = embedder
        self._index_name = index_name
        self._fusion: Fusion = fusion
        self.index_dir = os.fspath(index_dir) if index_dir is not None else None
        self._private_dir = private_dir
        self._dir_fd = -1
        self._engine: SearchEngine | None = None
        self._open_lock = anyio.Lock()
        self.index_url = index_url
        self._index_options = parse_index_options(index_options)
        self._relative_ids = False
        if index_url is not None and self._bm25_config is None:
            raise ValueError(
                "search_index_url needs bm25: the published index is searched with BM25 (set "
                "bm25=True, or the tokenize options it was built with)"
            )
        self.shared: SharedIndex | None = None
        # In-memory state when there is no DuckDB file to keep it in.
        self._sources: dict[str, _Source] = {}
        self._tombstones: set[str] = set()
        self._embeddings: dict[tuple[str, str], list[float]] = {}

    def attach(self, url: str, options: Mapping[str, Any] | None = None, *, relative_ids: bool = False) -> None:
        """Search the published index at ``url`` beside this one (before the index is opened).
        With ``relative_ids``, its hits' ids (``/docs/a.md``) are shown without the leading
        ``/`` (``docs/a.md``), as a workspace of relative paths names its own.

        Raises
        ------
        ValueError
            No BM25 here, a bad option, or the index is open already.
        """
        if self._bm25_config is None:
            raise ValueError("a published index is searched with BM25: configure bm25 first")
        if self._engine is not None:
            raise ValueError("attach a published index before the search index is opened")
        self._index_options = parse_index_options(options)
        self.index_url = url
        self._relative_ids = relative_ids

    @property
    def can_bm25(self) -> bool:
        return self._bm25_config is not None

    @property
    def can_vector(self) -> bool:
        return self._vector_store is not None and self._embedder is not None

    @property
    def enabled(self) -> bool:
        return self.can_bm25 or self.can_vector

    @property
    def path(self) -> str | None:
        """The DuckDB file of a persistent index."""
        return os.path.join(self.index_dir, INDEX_FILE) if self.index_dir else None

    # -- opening ---------------------------------------------------------------------------------

    async def engine(self) -> SearchEngine:
        """The engine, opening the index on first use.

        Raises
        ------
        SearchIndexError
            The file in ``index_dir`` is not a usable index (its reason and the way out are
            in the message); nothing was deleted.
        """
        if self._engine is not None:
            return self._engine
        async with self._open_lock:
            if self._engine is None:
                self._engine = await anyio.to_thread.run_sync(self._open)
        return self._engine

    def _where(self) -> str | None:
        """The directory to open files in: ``index_dir``, or the descriptor path of it when
        it is private (made and held here, see :func:`open_private_dir`)."""
        if self.index_dir is None:
            return None
        if not self._private_dir:
            os.makedirs(self.index_dir, exist_ok=True)
            return self.index_dir
        if self._dir_fd < 0:
            self._dir_fd = open_private_dir(self.index_dir)
            _clear_planted(
                self._dir_fd,
                self.index_dir,
                (INDEX_FILE, f"{INDEX_FILE}.wal", INDEX_FILE + CHECKPOINT_SUFFIX, "vectors"),
            )
        return f"/proc/self/fd/{self._dir_fd}"

    def prepare_private_dir(self) -> str | None:
        """Make the private index directory now (before a sandbox starts commands that could
        plant something there); its path, or None when the index is not private."""
        if self.index_dir is None or not self._private_dir:
            return None
        os.close(open_private_dir(self.index_dir))
        return self.index_dir

    def _open(self) -> SearchEngine:
        where = self._where()
        path = os.path.join(where, INDEX_FILE) if where is not None else None
        if where is not None:
            adopt = getattr(self._vector_store, "adopt_directory", None)
            if callable(adopt):
                # An in-memory HnswVectorStore would forget the vectors the persistent file
                # records say exist: keep them beside the BM25 index instead.
                self._owns_vectors = bool(adopt(os.path.join(where, "vectors")))
        bm25: BM25Index | None = None
        if self._bm25_config is not None or path is not None:
            k1, b, options = self._bm25_config or (1.5, 0.75, None)
            try:
                bm25 = BM25Index(path, k1=k1, b=b, tokenize=options)
            except (ValueError, BM25FileError) as exc:
                raise SearchIndexError(
                    f"The search index {path} cannot be used: {exc}. Move it away or delete it to "
                    "build a new index from the files (nothing was changed)."
                ) from exc
            self._create_tables(bm25)
        # Without BM25 the DuckDB file still keeps the file records and embedding cache.
        self._store = bm25
        shared = self._attach(bm25) if self.index_url is not None and bm25 is not None else None
        return SearchEngine(
            bm25=bm25 if self._bm25_config is not None else None,
            vector_store=self._vector_store,
            embedder=self._embedder,
            index_name=self._index_name,
            fusion=self._fusion,
            cache=self,
            shared=shared,
        )

    def _attach(self, bm25: BM25Index) -> SharedIndex:
        """Fetch the published index and hide what this agent changed: the documents of its
        own index and the files it removed."""
        from ._shared import SharedIndex  # its segments module builds on this one

        assert self.index_url is not None
        options = self._index_options
        shared = SharedIndex(
            self.index_url,
            cache_dir=options["cache_dir"],
            tokenize=bm25.tokenizer_options(),
            storage_options=options["storage_options"],
            refresh_interval=options["refresh_interval"],
            cache_grace=options["cache_grace"],
            embedder=embedder_id(self._embedder) if self.can_vector else None,
            relative_ids=self._relative_ids,
            # Searched as the workspace's own store would search them all.
            exact_limit=getattr(self._vector_store, "exact_limit", None),
            ef_search=getattr(self._vector_store, "ef_search", None),
            max_segment_bytes=options["max_segment_bytes"],
        )
        try:
            shared.load()
        except SearchIndexError:
            raise
        except Exception as exc:
            raise SearchIndexError(
                f"The search index {self.index_url} cannot be attached: {exc}"
            ) from exc
        if self.can_vector and shared.manifest.segments and not shared.has_vectors:
            _log.warning(
                "search index %s has no vectors of the embedder %s: its documents are found by BM25 "
                "only (build it with build_index(..., embedder=...) to search them by vector)",
                self.index_url, embedder_id(self._embedder),
            )
        self._tombstones = self._load_tombstones()
        shared.hide([*bm25.ids(), *self._tombstones])
        self.shared = shared
        return shared

    _store: BM25Index | None = None
    _owns_vectors = False

    @staticmethod
    def _create_tables(bm25: BM25Index) -> None:
        with bm25.transaction() as cur:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS agentvfs_sources ("
                " path VARCHAR PRIMARY KEY, size BIGINT, mtime_ns BIGINT, etag VARCHAR,"
                " digest VARCHAR, chunks INTEGER)"
            )
            # Vectors as little-endian float64 bytes: DuckDB converts a Python list to a
            # DOUBLE[] value by value (13 ms a 384-float vector), bytes at once.
            cur.execute(
                "CREATE TABLE IF NOT EXISTS agentvfs_vectors ("
                " digest VARCHAR, model VARCHAR, vector BLOB, PRIMARY KEY (digest, model))"
            )
            cur.execute(
                "CREATE TABLE IF NOT EXISTS agentvfs_meta (key VARCHAR PRIMARY KEY, value VARCHAR)"
            )
            # Files of an attached published index that were removed here.
            cur.execute("CREATE TABLE IF NOT EXISTS agentvfs_tombstones (path VARCHAR PRIMARY KEY)")

    # -- state ----------------------------------------------------------------------------------------

    def _load_sources(self) -> dict[str, _Source]:
        store = self._store
        if store is None:
            return dict(self._sources)
        with store.transaction() as cur:
            # By column: tuples of 24k rows cost more than reading them.
            columns = cur.execute(
                "SELECT path, size, mtime_ns, etag, digest, chunks FROM agentvfs_sources"
            ).fetchnumpy()
        # (A masked column's tolist() gives None for NULL, as fetchall would.)
        rows = zip(
            *(columns[name].tolist() for name in ("path", "size", "mtime_ns", "etag", "digest", "chunks")),
            strict=True,
        )
        return {
            path: _Source(_Signature(size, mtime, etag), digest, chunks)
            for path, size, mtime, etag, digest, chunks in rows
        }

    def _save_sources(self, changes: Mapping[str, _Source | None]) -> None:
        """Record (or, for None, forget) the sources of many paths in one transaction: a
        transaction per file made indexing a tree several times slower than the index itself."""
        store = self._store
        if store is None:
            for path, source in changes.items():
                if source is None:
                    self._sources.pop(path, None)
                else:
                    self._sources[path] = source
            return
        if not changes:
            return
        kept = [(p, s) for p, s in changes.items() if s is not None]
        # Whole columns in two statements: DuckDB runs executemany as one statement per row,
        # which made recording a round of files slower than indexing it.
        rows = {
            "path": np.array([p for p, _ in kept], dtype=object),
            "size": np.array([s.signature.size for _, s in kept], dtype=np.int64),
            "mtime_ns": np.array([s.signature.mtime_ns for _, s in kept], dtype=np.int64),
            "etag": np.array([s.signature.etag or "" for _, s in kept], dtype=object),
            "has_etag": np.array([s.signature.etag is not None for _, s in kept], dtype=np.bool_),
            "digest": np.array([s.digest for _, s in kept], dtype=object),
            "chunks": np.array([s.chunks for _, s in kept], dtype=np.int32),
        }
        with store.transaction() as cur:
            cur.execute(
                "DELETE FROM agentvfs_sources WHERE path IN (SELECT unnest($paths::VARCHAR[]))",
                {"paths": list(changes)},
            )
            if kept:
                with registered(cur, "agentvfs_new_sources", rows):
                    cur.execute(
                        "INSERT INTO agentvfs_sources SELECT path, size, mtime_ns,"
                        " CASE WHEN has_etag THEN etag END, digest, chunks"
                        " FROM agentvfs_new_sources"
                    )

    def _load_tombstones(self) -> set[str]:
        store = self._store
        if store is None:
            return set(self._tombstones)
        with store.transaction() as cur:
            return {row[0] for row in cur.execute("SELECT path FROM agentvfs_tombstones").fetchall()}

    def _add_tombstones(self, paths: Sequence[str]) -> None:
        """Record that the shared files ``paths`` (as the index names them) were removed here,
        so they stay hidden."""
        fresh = [p for p in paths if p not in self._tombstones]
        if not fresh:
            return
        self._tombstones.update(fresh)
        store = self._store
        if store is not None:
            with store.transaction() as cur:
                cur.execute(
                    "INSERT OR IGNORE INTO agentvfs_tombstones"
                    " SELECT unnest($paths::VARCHAR[])",
                    {"paths": fresh},
                )

    def _meta(self, key: str) -> str | None:
        store = self._store
        if store is None:
            return None
        with store.transaction() as cur:
            row = cur.execute("SELECT value FROM agentvfs_meta WHERE key = ?", [key]).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        store = self._store
        if store is None:
            return
        with store.transaction() as cur:
            cur.execute("INSERT OR REPLACE INTO agentvfs_meta VALUES (?, ?)", [key, value])

    # -- embedding cache (used by the engine) -----------------------------------------------

    def get_embeddings(self, model: str, digests: Sequence[str]) -> dict[str, list[float]]:
        """Cached vectors of ``digests`` for ``model``."""
        store = self._store
        if store is None:
            return {
                d: self._embeddings[(d, model)] for d in digests if (d, model) in self._embeddings
            }
        wanted = list(dict.fromkeys(digests))
        out: dict[str, list[float]] = {}
        with store.transaction() as cur, no_pandas_lookups():
            # (An index written before vectors were kept as bytes has them in agentvfs_embeddings.)
            tables: list[tuple[str, Callable[[Any], list[float]]]] = [("agentvfs_vectors", _from_bytes)]
            if "agentvfs_embeddings" in table_names(cur):
                tables.append(("agentvfs_embeddings", lambda values: list(values)))
            for table, decode in tables:
                missing = [d for d in wanted if d not in out]
                for start in range(0, len(missing), 500):
                    part = missing[start : start + 500]
                    marks = ", ".join("?" for _ in part)
                    rows = cur.execute(
                        f"SELECT digest, vector FROM {table} WHERE model = ? AND digest IN ({marks})",
                        [model, *part],
                    ).fetchall()
                    out.update({r[0]: decode(r[1]) for r in rows})
        return out

    def put_embeddings(self, model: str, vectors: Mapping[str, Sequence[float]]) -> None:
        """Remember vectors by content digest for ``model``."""
        store = self._store
        if store is None:
            for digest, vector in vectors.items():
                self._embeddings[(digest, model)] = list(vector)
            return
        if not vectors:
            return
        columns = {
            "digest": np.array(list(vectors), dtype=object),
            "model": np.array([model] * len(vectors), dtype=object),
            "vector": _objects([np.asarray(v, dtype="<f8").tobytes() for v in vectors.values()]),
        }
        with store.transaction() as cur, no_pandas_lookups(), registered(cur, "agentvfs_new_vectors", columns):
            cur.execute("INSERT OR REPLACE INTO agentvfs_vectors SELECT digest, model, vector FROM agentvfs_new_vectors")

    # -- the API's operations ---------------------------------------------------------------------

    async def index(
        self,
        path: str,
        content: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        start_line_offset: int | None = None,
    ) -> None:
        """Index one document under ``path`` (replacing it)."""
        engine = await self.engine()
        await engine.index(Document(path, content, metadata, start_line_offset))

    async def search(self, query: str, **options: Any) -> list[SearchResult]:
        engine = await self.engine()
        results = await engine.search(query, **options)
        if self._relative_ids and engine.shared is not None:
            results = [_relative(result) for result in results]
        return results

    async def clear(self) -> None:
        """Empty BM25 and forget the file records (the vector store is left as it is)."""
        engine = await self.engine()
        await engine.clear()
        store = self._store
        self._tombstones.clear()
        if store is None:
            self._sources.clear()
        else:
            with store.transaction() as cur:
                cur.execute("DELETE FROM agentvfs_sources")
                cur.execute("DELETE FROM agentvfs_tombstones")

    async def shutdown(self) -> None:
        """Release the index at ``destroy()``: an in-memory one is emptied, a persistent one
        closed (never deleted)."""
        if self._engine is None:
            return
        if self.index_dir is None:
            await self.clear()
        await self.close()

    async def close(self) -> None:
        store = self._store
        if store is not None and self._engine is not None:
            await anyio.to_thread.run_sync(self._checkpoint, store)
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.close()
        if self._owns_vectors:
            # Graphs are written at close: the next Workspace on this index_dir finds them.
            await self._vector_store.close()
        self._store = None
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    # -- files ------------------------------------------------------------------------------------------

    @staticmethod
    def _checkpoint(store: BM25Index) -> None:
        """Write the index's checkpoint when it changed since the last one (and is large
        enough for loading it to matter), so the next Workspace on it searches at once."""
        try:
            if store.path is None or store.read_only or len(store) < CHECKPOINT_MIN_DOCS:
                return
            if store.checkpoint_version == store.version:
                return
            started = time.monotonic()
            store.write_checkpoint()
            _log.debug("search index checkpoint written in %.2f s", time.monotonic() - started)
        except Exception as exc:  # only an accelerator: the index itself is whole
            _log.warning("search index %s: no checkpoint written: %s", store.path, exc)

    async def rebuild(self, fs: WorkspaceFilesystem, patterns: Sequence[str]) -> dict[str, Any]:
        """Clear the index and index every file ``patterns`` name (the reference's rebuild);
        the counts of :meth:`sync`."""
        await self.clear()
        return await self.sync(fs, patterns, prune=False)

    async def sync(
        self, fs: WorkspaceFilesystem, patterns: Sequence[str], *, prune: bool = True
    ) -> dict[str, Any]:
        """Bring the index in step with the files ``patterns`` name: index new and changed
        files, drop removed ones (``prune``); unchanged files cost one listing, no read.

        Only a listing that proves a file gone removes it: below a path whose listing failed
        otherwise (storage down, a timeout, a permission) the index keeps what it had, and the
        failure is logged as a warning.

        Returns counts: ``indexed``, ``unchanged``, ``removed``, ``failed`` and ``too_large``
        (larger than :attr:`max_file_bytes`: not indexed, and dropped from the index if they
        were in it; each is logged as a warning), and ``unlisted``: the paths whose listing
        failed, ``[]`` when every listing answered.
        """
        engine = await self.engine()
        self._check_model()
        known = await anyio.to_thread.run_sync(self._load_sources)
        files, unlisted, listed = await scan_files_with_stats(fs, patterns)
        signatures = {path: _Signature.of(stat) for path, stat in listed.items()}
        # Files named by a pattern directly: one listing of their directory each.
        signatures.update(await _signatures(fs, [p for p in files if p not in signatures]))
        counts: dict[str, Any] = {
            "indexed": 0, "unchanged": 0, "removed": 0, "failed": 0, "too_large": 0, "unlisted": unlisted,
        }
        todo: list[str] = []
        same = [
            path
            for path in files
            if (old := known.get(path)) is not None and old.signature == signatures.get(path)
        ]
        # Files a published index holds as they are now stay there, not indexed here.
        shared = engine.shared.records() if engine.shared is not None else {}
        published = {
            path
            for path in files
            if path not in known
            and (key := shared_path(path)) not in self._tombstones
            and (record := shared.get(key)) is not None
            and _same_version(record, signatures.get(path))
        }
        # The records say these are indexed: check BM25 holds them too (a crash between the two
        # leaves them to be re-indexed), in one pass.
        complete = await self._complete_many(engine, [(path, known[path]) for path in same])
        for path in files:
            if path in complete or path in published:
                counts["unchanged"] += 1
            else:
                todo.append(path)
        # Each round is read and prepared while the one before is indexed (on a worker
        # thread: tokenising, compressing, DuckDB), one round indexing at a time, in order.
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            commits = _Commits(self._commit, group)
            try:
                for start in range(0, len(todo), ROUND):
                    batch = todo[start : start + ROUND]
                    _, too_large = await self._index_files(
                        engine, fs, batch, known, signatures, commit=commits.submit
                    )
                    counts["too_large"] += too_large
                    counts["failed"] += len(batch) - too_large
                await commits.wait()
            except Exception as exc:  # raised as itself once the round in progress is done
                failure = exc
        if failure is not None:
            raise failure
        counts["indexed"] = commits.indexed
        counts["failed"] -= commits.indexed
        store = self._store
        if store is not None and counts["indexed"] >= CHECKPOINT_AFTER_FILES:
            # A bulk (re)index ends with its checkpoint: this session's searches take hits'
            # text from it too, and a process killed before close reopens fast all the same.
            await anyio.to_thread.run_sync(self._checkpoint, store)
        if prune:
            wanted = set(files)
            for path in sorted(set(known) - wanted):
                if _below_any(path, unlisted):
                    continue  # unknown, not gone
                await self._drop(engine, path)
                counts["removed"] += 1
            # Published files gone from the storage below the patterns: hidden from now on.
            # (Below plain paths only: what a glob pattern would have matched is not decided.)
            roots = [p for p in patterns if not is_glob_pattern(p)]
            present = {shared_path(p) for p in (*wanted, *known)}
            gone = [
                key
                for key in sorted(set(shared) - present - self._tombstones)
                if _below_any(key.lstrip("/"), [r.lstrip("/") for r in roots])
                and not _below_any(key.lstrip("/"), [u.lstrip("/") for u in unlisted])
            ]
            if gone:
                await engine.remove_sources(gone)
                await anyio.to_thread.run_sync(self._add_tombstones, gone)
                counts["removed"] += len(gone)
        return counts

    @staticmethod
    async def _complete_many(
        engine: SearchEngine, sources: Sequence[tuple[str, _Source]]
    ) -> set[str]:
        """The paths of ``sources`` whose first document BM25 holds (see `_complete`)."""
        bm25 = engine.bm25
        if bm25 is None:
            return {path for path, _ in sources}
        firsts = {_first_id(path, source): path for path, source in sources}
        held = await anyio.to_thread.run_sync(bm25.contains_many, firsts)
        return {firsts[first] for first in held}

    @staticmethod
    def _complete(engine: SearchEngine, path: str, source: _Source) -> bool:
        """The records say the file is indexed: check BM25 holds it too (a crash between the
        two leaves it to be re-indexed)."""
        bm25 = engine.bm25
        if bm25 is None:
            return True
        return _first_id(path, source) in bm25

    def _check_model(self) -> None:
        """A different embedding model than the one the index was built with: forget every
        file record so all are embedded again."""
        if not self.can_vector or self._store is None:
            return
        model = embedder_id(self._embedder)
        recorded = self._meta("embedding_model")
        if recorded is not None and recorded != model:
            _log.warning(
                "embedding model changed (%s -> %s): re-embedding every file", recorded, model
            )
            with self._store.transaction() as cur:
                cur.execute("DELETE FROM agentvfs_sources")
        if recorded != model:
            self._set_meta("embedding_model", model)

    async def _index_files(
        self,
        engine: SearchEngine,
        fs: WorkspaceFilesystem,
        paths: Sequence[str],
        known: Mapping[str, _Source],
        signatures: Mapping[str, _Signature],
        commit: _Commit | None = None,
    ) -> tuple[int, int]:
        """Index ``paths``: how many were indexed, and how many were too large.

        Files are read :data:`READ_CONCURRENCY` at a time, none past :attr:`max_file_bytes`
        (those listed larger are not read at all), and what was read is indexed whenever it
        reaches :data:`ROUND_BYTES`, so memory stays bounded by those, not by the files.
        ``commit`` indexes and records what was read (by default `_commit`, awaited: a
        `_Commits` returns at once and counts what it indexes itself).
        """
        commit = commit or self._commit
        cap = self.max_file_bytes
        indexed = too_large = 0
        docs: list[Document] = []
        sources: dict[str, _Source] = {}
        replacing: list[str] = []
        held = 0
        for start in range(0, len(paths), READ_CONCURRENCY):
            part: list[str] = []
            for path in paths[start : start + READ_CONCURRENCY]:
                listed = signatures.get(path)
                if listed is not None and listed.size > cap:
                    too_large += 1
                    await self._too_large(engine, known, path)
                else:
                    part.append(path)
            data = await read_many(fs, part, concurrency=READ_CONCURRENCY, max_bytes=cap)
            for path in part:
                raw = data.get(path)
                if isinstance(raw, FileTooLarge):
                    too_large += 1
                    await self._too_large(engine, known, path)
                    continue
                if not isinstance(raw, bytes):
                    _log.debug("skipping %s for search: %s", path, raw)
                    continue
                held += await self._prepare(
                    engine, path, raw, known, signatures, docs, sources, replacing
                )
            del data
            if held >= ROUND_BYTES:
                indexed += await commit(engine, docs, sources, replacing)
                docs, sources, replacing, held = [], {}, [], 0
        indexed += await commit(engine, docs, sources, replacing)
        return indexed, too_large

    async def _too_large(self, engine: SearchEngine, known: Mapping[str, _Source], path: str) -> None:
        _log.warning(
            'Not indexing "%s" for search: it is larger than %d bytes (max_file_bytes of the search '
            "index); split it, or raise max_file_bytes to index it",
            path, self.max_file_bytes,
        )  # fmt: skip
        if self._indexed(engine, known, path):
            await self._drop(engine, path)  # what it held before is no longer its content

    async def _prepare(
        self,
        engine: SearchEngine,
        path: str,
        raw: bytes,
        known: Mapping[str, _Source],
        signatures: Mapping[str, _Signature],
        docs: list[Document],
        sources: dict[str, _Source],
        replacing: list[str],
    ) -> int:
        """Add the documents of one file read to ``docs``, its record to ``sources`` and, when
        it may have documents indexed already, its path to ``replacing``; the bytes of text
        that adds."""
        digest = _digest(raw)
        sig = signatures.get(path) or _Signature(len(raw), 0, None)
        old = known.get(path)
        if old is not None and old.digest == digest and self._complete(engine, path, old):
            sources[path] = _Source(sig, digest, old.chunks)  # touched, not changed
            return 0
        documents = file_documents(path, raw)
        if old is not None or len(documents) > 1:
            replacing.append(path)
        docs.extend(documents)
        sources[path] = _Source(sig, digest, len(documents))
        return len(raw)

    async def _commit(
        self,
        engine: SearchEngine,
        docs: list[Document],
        sources: dict[str, _Source],
        replacing: list[str],
    ) -> int:
        """Index ``docs`` in place of what ``replacing`` had, and record ``sources``: how many
        files were indexed."""
        failed: dict[str, str] = {}
        if docs or replacing:
            try:
                failed = await engine.index_many(
                    docs, stop_on_error=False, replace_sources=replacing
                )
            except Exception as exc:
                for path in sources:
                    _log.warning('Failed to index file "%s" for search: %s', path, exc)
                return 0
        bad_sources = {doc_id.split("#chunk-")[0] for doc_id in failed}
        for path in bad_sources:
            _log.warning(
                'Failed to index file "%s" for search: %s',
                path,
                failed.get(path, "embedding failed"),
            )
        good = {p: src for p, src in sources.items() if p not in bad_sources}
        await anyio.to_thread.run_sync(self._save_sources, good)
        return len(sources) - len(bad_sources)

    async def refresh_path(self, fs: WorkspaceFilesystem, path: str) -> bool:
        """Re-index ``path`` if it is indexed (after a write through the tools); True if it was."""
        engine = await self.engine()
        known = await anyio.to_thread.run_sync(self._load_sources)
        if not self._indexed(engine, known, path):
            return False
        try:
            stat = await fs.stat(path)
        except FileNotFoundError:
            await self._drop(engine, path)
            return True
        await self._index_files(engine, fs, [path], known, {path: _Signature.of(stat)})
        return True

    async def forget_path(self, path: str) -> bool:
        """Drop ``path`` from the index (after a delete); True if it was indexed."""
        engine = await self.engine()
        known = await anyio.to_thread.run_sync(self._load_sources)
        if not self._indexed(engine, known, path):
            return False
        await self._drop(engine, path)
        return True

    async def _drop(self, engine: SearchEngine, path: str) -> None:
        await engine.remove_source(path)
        await anyio.to_thread.run_sync(self._save_sources, {path: None})
        key = shared_path(path)
        if self.shared is not None and key in self.shared.records():
            await anyio.to_thread.run_sync(self._add_tombstones, [key])

    @staticmethod
    def _indexed(engine: SearchEngine, known: Mapping[str, _Source], path: str) -> bool:
        if path in known:
            return True
        if engine.shared is not None and shared_path(path) in engine.shared.records():
            return True
        bm25 = engine.bm25
        return bm25 is not None and (path in bm25 or f"{path}#chunk-0" in bm25)

    def describe(self) -> dict[str, Any]:
        """Where the index is and what it holds (for ``get_info``)."""
        engine = self._engine
        out: dict[str, Any] = {
            "index_dir": self.index_dir,
            "bm25": self.can_bm25,
            "vector": self.can_vector,
        }
        if engine is not None:
            out["documents"] = len(engine.ids())
        if self.shared is not None:
            out["shared_index"] = self.shared.describe()
        return out


# -- which files ---------------------------------------------------------------------------------------


def _join(directory: str, name: str) -> str:
    if directory in ("", "."):
        return name
    return posixpath.join(directory, name)


class Unlisted(Exception):
    """A listing failed for another reason than the path not being there: what is below the
    path is unknown (storage down, a permission, a timeout), so nothing below it may be
    taken as removed."""

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"cannot list {path or '/'}: {cause}")
        self.path = path


def _absent(exc: BaseException) -> bool:
    """The error proves the path is not a directory there (missing, or a file)."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError))


async def _is_dir(fs: WorkspaceFilesystem, path: str) -> bool:
    try:
        await fs.readdir(path)
    except Exception as exc:
        if _absent(exc):
            return False
        raise Unlisted(path, exc) from exc
    return True


async def _files_below(fs: WorkspaceFilesystem, directory: str) -> list[tuple[str, FileStat]]:
    """Every file below ``directory`` (symlinked directories not followed, as the reference)
    with its metadata: one listing of the tree where the filesystem can."""
    try:
        found = await walk_stats(fs, directory, max_depth=MAX_DEPTH)
    except Exception as exc:
        if _absent(exc):
            return []  # gone since the pattern matched it: its files were removed
        raise Unlisted(directory, exc) from exc
    return [(_join(directory, name), stat) for name, stat in found]


async def resolve_path_pattern(fs: WorkspaceFilesystem, pattern: str) -> list[tuple[str, str]]:
    """The reference's ``resolvePathPattern``: a plain path -> itself as file or directory; a
    glob -> every file and directory below its base that matches."""
    if pattern.endswith("/") and len(pattern) > 1:
        pattern = pattern[:-1]
    if not is_glob_pattern(pattern):
        return [(pattern, "directory" if await _is_dir(fs, pattern) else "file")]
    base = extract_glob_base(pattern)
    matcher = create_glob_matcher(pattern)
    try:
        entries = await walk(fs, base, max_depth=MAX_DEPTH)
    except Exception as exc:
        if _absent(exc):
            return []
        raise Unlisted(base, exc) from exc
    out: list[tuple[str, str]] = []
    for entry in entries:
        full = _join(base, entry.name)
        if matcher(full):
            out.append((full, entry.type))
    return out


async def scan_files(fs: WorkspaceFilesystem, patterns: Sequence[str]) -> tuple[list[str], list[str]]:
    """Every file ``patterns`` name, in order, once (directory matches walked, minus those
    under a directory already walked), and the paths whose listing failed for another reason
    than not being there (below them, the files are unknown, not gone; each is logged as a
    warning). A malformed pattern is skipped, as the reference does."""
    files, unlisted, _ = await scan_files_with_stats(fs, patterns)
    return files, unlisted


async def scan_files_with_stats(
    fs: WorkspaceFilesystem, patterns: Sequence[str]
) -> tuple[list[str], list[str], dict[str, FileStat]]:
    """As :func:`scan_files`, with the metadata the listings gave of the files found below
    directories (a file a pattern names directly has none here)."""
    stats: dict[str, FileStat] = {}
    files: list[str] = []
    seen: set[str] = set()
    unlisted: list[str] = []

    def failed(exc: Unlisted) -> None:
        _log.warning("search index: %s; the files indexed below it are kept", exc)
        if exc.path not in unlisted:
            unlisted.append(exc.path)

    for pattern in patterns:
        try:
            matches = await resolve_path_pattern(fs, pattern)
        except Unlisted as exc:
            failed(exc)
            continue
        except Exception as exc:  # a malformed pattern is skipped, as the reference does
            _log.debug("search pattern %r failed: %s", pattern, exc)
            continue
        directories = [p for p, kind in matches if kind == "directory"]
        walked: list[str] = []
        for d in sorted(directories, key=len):
            if any(d == w or d.startswith(w.rstrip("/") + "/") for w in walked):
                continue
            walked.append(d)
        for path, kind in matches:
            if kind == "file" and path not in seen:
                seen.add(path)
                files.append(path)
        for directory in walked:
            try:
                below = await _files_below(fs, directory)
            except Unlisted as exc:
                failed(exc)
                continue
            for path, listed in below:
                if path not in seen:
                    seen.add(path)
                    files.append(path)
                    stats[path] = listed
    return files, unlisted, stats


def _first_id(path: str, source: _Source) -> str:
    """The id of the first document the record ``source`` says ``path`` was indexed as."""
    return path if source.chunks <= 1 else f"{path}#chunk-0"


def _same_version(record: Any, signature: _Signature | None) -> bool:
    """Whether a published index's record of a file describes the file listed now: the same
    size, and the same ETag where both have one, else the same modification time."""
    if signature is None or record.size != signature.size:
        return False
    if record.etag is not None and signature.etag is not None:
        return bool(record.etag == signature.etag)
    return bool(record.mtime_ns == signature.mtime_ns)


def _below_any(path: str, directories: Sequence[str]) -> bool:
    for d in directories:
        d = d.strip("/")
        if d in ("", ".") or path == d or path.startswith(d + "/"):
            return True
    return False


async def _signatures(fs: WorkspaceFilesystem, files: Sequence[str]) -> dict[str, _Signature]:
    """Size, modification time and ETag of ``files``: one listing per directory."""
    by_dir: dict[str, list[str]] = {}
    for path in files:
        by_dir.setdefault(posixpath.dirname(path), []).append(path)
    out: dict[str, _Signature] = {}
    limiter = anyio.Semaphore(READ_CONCURRENCY)

    async def one(directory: str, members: list[str]) -> None:
        async with limiter:
            try:
                stats = await list_stats(fs, directory or ".")
            except Exception:
                stats = []
        named = {posixpath.basename(str(s.path).rstrip("/")) or s.name: s for s in stats}
        for path in members:
            stat = named.get(posixpath.basename(path))
            if stat is not None:
                out[path] = _Signature.of(stat)

    async with anyio.create_task_group() as tg:
        for directory, members in by_dir.items():
            tg.start_soon(one, directory, members)
    return out
