"""``WorkspaceSkills``: the skills of a workspace (reference §17.4-§17.5).

Skills are discovered on first use and kept as one catalog that a refresh rebuilds off to
the side and swaps in whole, so readers see the old catalog or the new one, never half of
each. With search configured, each skill's instructions and references are documents of the
workspace's index (``skill:<path>:SKILL.md``, ``skill:<path>:<reference>``); a refresh
re-indexes only what changed and never touches documents that are not skills'.

When the skills paths come from a function of the request, :meth:`get_scoped` gives each
distinct set of paths its own view: its documents carry a ``skill-scope:<ns>:`` id prefix and
``skill_scope`` metadata, so concurrent requests never see each other's skills, and
workspace-level search never returns them.
"""

from __future__ import annotations

import builtins
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import quote

import anyio

from .._aio import maybe_await
from .._context import RequestContext
from ..errors import FileTooLarge, InvalidSkillPathError, NotRegularFile, SkillConflictError
from ..vfs import SupportsReadBeneath, WorkspaceFilesystem, read_many
from ._discovery import (
    Discovery,
    add_skill,
    determine_source,
    discover,
    load_skill,
    signatures,
    strip_trailing_slash,
)
from ._records import (
    Skill,
    SkillMetadata,
    SkillSearchResult,
)
from ._sources import (
    READ_CONCURRENCY,
    LocalSkillSource,
    SkillSource,
    join_path,
    norm_path,
)

if TYPE_CHECKING:
    from ..search import SearchResult, WorkspaceSearch

__all__ = ["SkillIndex", "SkillsConfig", "WorkspaceSkills", "create_workspace_skills"]

_log = logging.getLogger("agentvfs.skills")

SkillsConfig = Sequence[str] | Callable[[RequestContext], Any]

#: Seconds after a discovery during which ``maybe_refresh`` does no I/O at all.
STALENESS_CHECK_COOLDOWN = 30.0
_SOURCE_PRIORITY = {"local": 0, "managed": 1, "external": 2}
#: Resolved filesystems whose skills are kept when the workspace filesystem is a resolver.
RESOLVED_SOURCES = 16
#: References larger than this are not searched without a search index (with one, its
#: ``max_file_bytes`` decides, by default the same): skipped with a warning.
MAX_REFERENCE_BYTES = 16 * 1024 * 1024
#: Bytes of references read before they are indexed, so indexing many never holds them all.
INDEX_ROUND_BYTES = 16 * 1024 * 1024


class SkillIndex:
    """The search index skills are documents of: the workspace's search, shared with its
    files (``index_many``, ``remove``, ``search``)."""

    def __init__(self, search: WorkspaceSearch) -> None:
        self._search = search

    @property
    def max_file_bytes(self) -> int:
        """References larger than this are not indexed: the search's own limit for files."""
        limit: int = getattr(self._search, "max_file_bytes", MAX_REFERENCE_BYTES)
        return limit

    async def index_many(self, docs: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """Index ``(id, content, metadata)`` documents in one batch."""
        from ..search import Document

        engine = await self._search.engine()
        await engine.index_many([Document(i, c, m) for i, c, m in docs])

    async def remove(self, id: str) -> None:
        engine = await self._search.engine()
        await engine.remove(id)

    async def contains(self, id: str) -> bool | None:
        """Whether ``id`` is indexed (None when the index cannot tell cheaply)."""
        engine = await self._search.engine()
        if engine.bm25 is None:
            return None
        bm25 = engine.bm25
        return await anyio.to_thread.run_sync(bm25.__contains__, id)

    async def search(
        self, query: str, *, top_k: int, min_score: float | None, mode: str | None
    ) -> list[SearchResult]:
        return await self._search.search(query, top_k=top_k, min_score=min_score, mode=mode)


@dataclass
class _Catalog:
    """One discovery's skills, and what it saw."""

    skills: dict[str, list[Skill]]
    found: Discovery
    paths: tuple[str, ...]
    at_wall: float
    at_monotonic: float
    canonical: dict[str, str] = field(default_factory=dict)
    #: Names whose same-named candidates were already reported (once per discovery).
    warned: set[str] = field(default_factory=set)


class _Pending:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: Exception | None = None
        self.finished = False


def _assert_relative(path: str, label: str) -> str:
    normalized = path.replace("\\", "/")
    segments = [s for s in normalized.split("/") if s and s != "."]
    if normalized.startswith("/") or ".." in segments:
        raise InvalidSkillPathError(f"Invalid {label} path: {path}")
    return "/".join(segments)


def _strip_skill_md(path: str) -> str:
    return path.removesuffix("/SKILL.md")


class WorkspaceSkills:
    """The skills of a workspace: discovery, lookup, files, search (all methods async).

    Usually reached as ``workspace.skills``.

    Parameters
    ----------
    source : SkillSource
        Where skills are read from (a workspace filesystem, ``LocalSkillSource``,
        ``VersionedSkillSource``...).
    skills : sequence of str or callable
        Skills paths (directories of skills, skill directories, ``.../SKILL.md`` files, globs),
        or ``fn(request_context) -> paths`` (may be async).
    search : SkillIndex, optional
        The index skills are documents of; without one, :meth:`search` matches substrings.
    validate_on_load : bool
        Skip skills that break the Agent Skills rules (logged).
    check_skill_file_mtime : bool
        The staleness check also compares each SKILL.md's modification time with the last
        discovery (catches in-place edits that keep the size; one stat per skill).
    staleness_cooldown : float
        Seconds after a discovery during which :meth:`maybe_refresh` checks nothing.
    assert_available : callable, optional
        Called first by every method (the workspace raises once it is torn down).

    Attributes
    ----------
    check_skill_file_mtime, staleness_cooldown
        As the parameters; may be changed at any time.
    """

    def __init__(
        self,
        source: SkillSource,
        skills: SkillsConfig,
        *,
        search: SkillIndex | None = None,
        validate_on_load: bool = True,
        check_skill_file_mtime: bool = False,
        staleness_cooldown: float = STALENESS_CHECK_COOLDOWN,
        assert_available: Callable[[], None] | None = None,
        _namespace: str | None = None,
        _shared_ids: set[str] | None = None,
    ) -> None:
        if not callable(skills) and (
            isinstance(skills, str) or not all(isinstance(p, str) for p in skills)
        ):
            raise TypeError("skills must be a list of paths (str) or a function returning one")
        self.source = source
        self._config = skills if callable(skills) else tuple(skills)
        self._search = search
        self.validate_on_load = validate_on_load
        self.check_skill_file_mtime = check_skill_file_mtime
        self.staleness_cooldown = staleness_cooldown
        self._assert_available = assert_available
        self._namespace = _namespace
        # Document ids of every view sharing the index (the workspace's own skills and the
        # request-scoped views), to size over-fetching in search.
        self._shared_ids: set[str] = _shared_ids if _shared_ids is not None else set()
        self._indexed: dict[str, builtins.list[str]] = {}
        self._paths: tuple[str, ...] | None = None
        self._catalog: _Catalog | None = None
        self._aliases: dict[str, str] = {}
        self._lock = anyio.Lock()
        self._requested = 0
        self._served = 0
        self._maybe: _Pending | None = None
        self._by_context: weakref.WeakKeyDictionary[RequestContext, WorkspaceSkills] = (
            weakref.WeakKeyDictionary()
        )
        self._by_paths: dict[str, WorkspaceSkills] = {}

    # -- paths and views ----------------------------------------------------------------------

    @property
    def is_dynamic(self) -> bool:
        """The skills paths come from a function of the request."""
        return callable(self._config)

    async def _resolve_paths(
        self, request_context: RequestContext | None = None
    ) -> tuple[str, ...]:
        config = self._config
        if not callable(config):
            return config
        value = await maybe_await(config(request_context if request_context is not None else RequestContext()))
        if (
            isinstance(value, str)
            or not isinstance(value, Sequence)
            or not all(isinstance(p, str) for p in value)
        ):
            raise TypeError(f"the skills function must return a list of paths (str), not {value!r}")
        return tuple(value)

    async def get_scoped(self, request_context: RequestContext | None = None) -> WorkspaceSkills:
        """The skills of one request: this object when the paths are static, else a view of
        the paths the function gives for ``request_context`` (one per request context, and
        one per distinct set of paths), whose search documents are kept apart."""
        self._check()
        if not self.is_dynamic:
            return self
        if request_context is not None:
            cached = self._by_context.get(request_context)
            if cached is not None:
                return cached
        paths = await self._resolve_paths(request_context)
        key = "\n".join(sorted(paths))
        view = self._by_paths.get(key)
        if view is None:
            namespace = quote(key, safe="")
            if self._namespace is not None:
                namespace = f"{self._namespace}/{namespace}"
            view = WorkspaceSkills(
                self.source,
                list(paths),
                search=self._search,
                validate_on_load=self.validate_on_load,
                check_skill_file_mtime=self.check_skill_file_mtime,
                staleness_cooldown=self.staleness_cooldown,
                assert_available=self._assert_available,
                _namespace=namespace,
                _shared_ids=self._shared_ids,
            )
            self._by_paths[key] = view
        if request_context is not None:
            self._by_context[request_context] = view
        return view

    def _check(self) -> None:
        if self._assert_available is not None:
            self._assert_available()

    # -- discovery -------------------------------------------------------------------------------

    async def _ready(self) -> _Catalog:
        self._check()
        catalog = self._catalog
        if catalog is None:
            await self.refresh()
            catalog = self._catalog
            assert catalog is not None
        return catalog

    async def refresh(self) -> None:
        """Discover every skill again and swap the new catalog in whole, re-indexing what
        changed. Concurrent calls share one rebuild when they can."""
        self._check()
        self._requested += 1
        ticket = self._requested
        async with self._lock:
            if self._served >= ticket:
                return  # a rebuild that started after this call was made has finished
            upto = self._requested
            await self._rebuild()
            self._served = upto

    async def _rebuild(self) -> None:
        if self._paths is None:
            self._paths = await self._resolve_paths()
        while True:
            paths = self._paths
            started = time.time(), time.monotonic()
            found = await discover(self.source, paths, validate=self.validate_on_load)
            old = self._catalog
            self._catalog = _Catalog(found.skills, found, paths, started[0], started[1])
            await self._reconcile(old.skills if old is not None else {}, found.skills)
            if self._paths == paths:
                return

    async def maybe_refresh(self, request_context: RequestContext | None = None) -> None:
        """Refresh if the skills paths changed (a function of the request) or what they hold
        did; within ``staleness_cooldown`` seconds of a discovery nothing is checked.

        The check lists the skills directories again and compares the listings with what
        discovery saw (names, sizes); no SKILL.md is read unless something changed.
        Overlapping calls share one check.
        """
        await self._ready()
        while True:
            shared = self._maybe
            if shared is None:
                break
            await shared.done.wait()
            if shared.finished:
                if shared.error is not None:
                    raise shared.error
                return
        pending = self._maybe = _Pending()
        try:
            await self._maybe_refresh(request_context)
            pending.finished = True
        except Exception as exc:
            pending.error = exc
            pending.finished = True
            raise
        finally:
            self._maybe = None
            pending.done.set()

    async def _maybe_refresh(self, request_context: RequestContext | None) -> None:
        current = await self._resolve_paths(request_context)
        if sorted(current) != sorted(self._paths or ()):
            self._paths = current
            await self.refresh()
            return
        if await self._is_stale():
            await self.refresh()

    async def _is_stale(self) -> bool:
        catalog = self._catalog
        if catalog is None:
            return True
        if time.monotonic() - catalog.at_monotonic < self.staleness_cooldown:
            return False
        now = await signatures(self.source, catalog.paths)
        if now != catalog.found.signatures:
            return True
        if self.check_skill_file_mtime:
            for path in catalog.found.skill_files:
                try:
                    stat = await self.source.stat(path)
                except OSError:
                    return True
                if stat.modified_at.timestamp() > catalog.at_wall:
                    return True
        return False

    def _touch(self) -> None:
        catalog = self._catalog
        if catalog is not None:
            catalog.at_wall, catalog.at_monotonic = time.time(), time.monotonic()

    # -- lookup ------------------------------------------------------------------------------------

    async def list(self) -> builtins.list[SkillMetadata]:
        """Every skill, same-named ones from different places included (two paths to one
        directory count once), in discovery order."""
        catalog = await self._ready()
        out: builtins.list[SkillMetadata] = []
        for candidates in builtins.list(catalog.skills.values()):
            for skill in await self._dedupe(catalog, candidates):
                out.append(skill.to_metadata())
        return out

    async def get(self, name: str) -> Skill | None:
        """A skill by name (same-named skills: local before managed before external), else
        by path (``skills/pdf-tools``, with or without ``/SKILL.md``), else by a registered
        location alias; None if nothing matches.

        Raises
        ------
        SkillConflictError
            Two distinct skills of that name come from the same kind of source.
        """
        catalog = await self._ready()
        return (
            await self._by_name(catalog, name)
            or self._by_path(catalog, name)
            or self._by_alias(catalog, name)
        )

    async def has(self, name: str) -> bool:
        """Tell whether :meth:`get` would find a skill."""
        return await self.get(name) is not None

    def register_location_alias(self, location: str, skill_path: str) -> None:
        """Let ``location`` (with or without ``/SKILL.md``) name the skill at ``skill_path``."""
        self._aliases[location] = skill_path
        stripped = _strip_skill_md(location)
        if stripped != location:
            self._aliases[stripped] = skill_path

    async def _canonical(self, catalog: _Catalog, path: str) -> str:
        known = catalog.canonical.get(path)
        if known is not None:
            return known
        realpath = getattr(self.source, "realpath", None)
        canonical = path
        if callable(realpath):
            try:
                canonical = norm_path(await realpath(path))
            except OSError:
                canonical = path
        catalog.canonical[path] = canonical
        return canonical

    async def _dedupe(
        self, catalog: _Catalog, candidates: builtins.list[Skill]
    ) -> builtins.list[Skill]:
        """One skill per real directory (symlinked aliases collapse to the preferred one)."""
        if len(candidates) == 1:
            return candidates
        groups: dict[str, builtins.list[Skill]] = {}
        for skill in candidates:
            groups.setdefault(await self._canonical(catalog, skill.path), []).append(skill)
        return [min(group, key=_preference) for group in groups.values()]

    async def _by_name(self, catalog: _Catalog, name: str) -> Skill | None:
        candidates = catalog.skills.get(name)
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        ranked = sorted(await self._dedupe(catalog, candidates), key=_preference)
        if len(ranked) == 1:
            return ranked[0]
        winner, runner_up = ranked[0], ranked[1]
        if winner.source.type == runner_up.source.type:
            paths = ", ".join(f'"{s.path}"' for s in ranked if s.source.type == winner.source.type)
            raise SkillConflictError(
                f'[WorkspaceSkills] Cannot resolve skill "{winner.name}": multiple '
                f"{winner.source.type} skills found at {paths}. Rename one or move it to a "
                "different source type."
            )
        if name in catalog.warned:
            return winner
        catalog.warned.add(name)
        others = ", ".join(f'"{s.path}" ({s.source.type})' for s in ranked[1:])
        _log.warning(
            '[WorkspaceSkills] Multiple skills named "%s" found. Using "%s" (source: %s). Other candidates: %s',
            winner.name,
            winner.path,
            winner.source.type,
            others,
        )
        return winner

    @staticmethod
    def _by_path(catalog: _Catalog, path: str) -> Skill | None:
        wanted = _strip_skill_md(path)
        normal = norm_path(wanted)
        fallback = None
        for candidates in catalog.skills.values():
            for skill in candidates:
                if skill.path == wanted:
                    return skill
                if fallback is None and normal and norm_path(skill.path) == normal:
                    fallback = skill
        return fallback

    def _by_alias(self, catalog: _Catalog, location: str) -> Skill | None:
        target = self._aliases.get(location) or self._aliases.get(_strip_skill_md(location))
        return self._by_path(catalog, target) if target else None

    async def _lookup(self, name: str) -> Skill | None:
        catalog = await self._ready()
        return await self._by_name(catalog, name) or self._by_path(catalog, name)

    # -- files ------------------------------------------------------------------------------------

    async def _read(
        self, skill: Skill, path: str, label: str, max_bytes: int | None = None
    ) -> bytes | None:
        """A file of ``skill`` by its path relative to the skill directory; None if missing.

        Raises
        ------
        InvalidSkillPathError
            The path is absolute, has ``..``, or leads (through a link) out of the skill.
        FileTooLarge
            The file is larger than ``max_bytes`` (checked on what is read, not on an
            earlier ``stat``: on local disk no more than a byte past it is read).
        """
        relative = _assert_relative(path, label)
        if not relative:
            return None
        if isinstance(self.source, SupportsReadBeneath):
            # Resolved beneath the skill directory in one go: a link that leads out, even one
            # swapped in during the read, is refused instead of followed.
            try:
                found = await self.source.read_file_beneath(skill.path, relative, max_bytes=max_bytes)
            except PermissionError:
                raise InvalidSkillPathError(
                    f"Invalid {label} path: {path} (it leads outside the skill)"
                ) from None
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotRegularFile):
                return None
            return found
        target = join_path(skill.path, relative)
        realpath = getattr(self.source, "realpath", None)
        if callable(realpath):
            try:
                real_dir = norm_path(await realpath(skill.path))
                real_file = norm_path(await realpath(target))
            except FileNotFoundError:
                return None
            inside = (
                real_file == real_dir
                or real_file.startswith(real_dir + "/")
                or (real_dir == "" and not real_file.startswith("/"))
            )
            if not inside:
                raise InvalidSkillPathError(
                    f"Invalid {label} path: {path} (it leads outside the skill)"
                )
        got = (await read_many(self.source, [target], max_bytes=max_bytes))[target]
        if isinstance(got, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return None
        if isinstance(got, OSError):
            raise got
        return got

    async def read_skill_file(
        self, skill: Skill, path: str, *, max_bytes: int | None = None
    ) -> bytes | None:
        """The bytes of a file of ``skill`` (as :meth:`get` returned it) by its path relative
        to the skill directory; None if missing.

        Parameters
        ----------
        skill : Skill
            The skill, as :meth:`get` returned it.
        path : str
            Relative to the skill directory (``references/api.md``).
        max_bytes : int, optional
            Read no file larger than this: it raises instead, whatever size a listing or
            ``stat`` showed before (on local disk no more than a byte past it is read).

        Raises
        ------
        InvalidSkillPathError
            ``Invalid asset path: <path>`` for absolute paths, ``..``, or a link leading out.
        FileTooLarge
            The file is larger than ``max_bytes`` (``EFBIG``).
        """
        self._check()
        return await self._read(skill, path, "asset", max_bytes)

    async def get_reference(self, skill_name: str, reference_path: str) -> str | None:
        """A file of a skill as text, by its path relative to the skill directory
        (``references/api.md``); None if the skill or file does not exist.

        Raises
        ------
        InvalidSkillPathError
            ``Invalid reference path: <path>`` for absolute paths and ``..``.
        """
        data = await self._fetch(skill_name, reference_path, "reference")
        return None if data is None else data.decode("utf-8", "replace")

    async def get_script(self, skill_name: str, script_path: str) -> str | None:
        """As :meth:`get_reference` (``scripts/run.sh``); ``Invalid script path: ...``."""
        data = await self._fetch(skill_name, script_path, "script")
        return None if data is None else data.decode("utf-8", "replace")

    async def get_asset(self, skill_name: str, asset_path: str) -> bytes | None:
        """As :meth:`get_reference` but the bytes (``assets/logo.png``); ``Invalid asset path: ...``."""
        return await self._fetch(skill_name, asset_path, "asset")

    async def _fetch(self, skill_name: str, path: str, kind: str) -> bytes | None:
        # A bad path is refused even when the skill is unknown.
        skill = await self._lookup(skill_name)
        if skill is None:
            _assert_relative(path, kind)
            return None
        return await self._read(skill, path, kind)

    async def list_references(self, skill_name: str) -> builtins.list[str]:
        """Files below the skill's ``references/`` (relative to it)."""
        skill = await self._lookup(skill_name)
        return list(skill.references) if skill is not None else []

    async def list_scripts(self, skill_name: str) -> builtins.list[str]:
        """Files below the skill's ``scripts/`` (relative to it)."""
        skill = await self._lookup(skill_name)
        return list(skill.scripts) if skill is not None else []

    async def list_assets(self, skill_name: str) -> builtins.list[str]:
        """Files below the skill's ``assets/`` (relative to it)."""
        skill = await self._lookup(skill_name)
        return list(skill.assets) if skill is not None else []

    # -- changes ------------------------------------------------------------------------------------

    async def add_skill(self, skill_path: str) -> None:
        """Load (or reload) the skill at ``skill_path`` (its directory or its SKILL.md) and
        index it, without a full discovery.

        Raises
        ------
        InvalidSkillError
            The SKILL.md breaks the rules.
        FileNotFoundError
            There is no SKILL.md.
        """
        catalog = await self._ready()
        skill = await load_skill(
            self.source, skill_path, self._infer_source(skill_path), validate=self.validate_on_load
        )
        async with self._lock:
            catalog = self._catalog or catalog
            # Candidate lists are replaced, never changed in place: a reader iterating one
            # across an await keeps a consistent list.
            candidates = builtins.list(catalog.skills.get(skill.name, []))
            old = next((s for s in candidates if s.path == skill.path), None)
            if old is not None:
                await self._unindex(old)
            add_skill(catalog.skills, skill, candidates)
            catalog.canonical.pop(skill.path, None)
            catalog.warned.discard(skill.name)
            await self._index([skill])
            self._touch()

    async def remove_skill(self, skill_name: str) -> None:
        """Forget a skill (by name, else by path) and drop its documents from the index; a
        later refresh finds it again if its files are still there."""
        catalog = await self._ready()
        skill = await self._by_name(catalog, skill_name) or self._by_path(catalog, skill_name)
        if skill is None:
            return
        async with self._lock:
            catalog = self._catalog or catalog
            await self._unindex(skill)
            candidates = catalog.skills.get(skill.name, [])
            catalog.skills[skill.name] = [s for s in candidates if s.path != skill.path]
            if not catalog.skills[skill.name]:
                del catalog.skills[skill.name]
            self._touch()

    def _infer_source(self, skill_path: str) -> Any:
        for configured in self._paths or ():
            root = strip_trailing_slash(configured)
            if skill_path == root or skill_path.startswith(root + "/"):
                return determine_source(root)
        return determine_source(skill_path)

    # -- search index -------------------------------------------------------------------------------

    def _doc_id(self, skill_path: str, source: str) -> str:
        doc = f"skill:{skill_path}:{source}"
        return f"skill-scope:{self._namespace}:{doc}" if self._namespace is not None else doc

    def _doc_metadata(self, skill_path: str, source: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"skill_path": skill_path, "source": source}
        if self._namespace is not None:
            meta["skill_scope"] = self._namespace
        return meta

    async def _reconcile(
        self, old: dict[str, builtins.list[Skill]], new: dict[str, builtins.list[Skill]]
    ) -> None:
        if self._search is None:
            return
        old_by_path = {s.path: s for c in old.values() for s in c}
        new_by_path = {s.path: s for c in new.values() for s in c}
        for path, skill in old_by_path.items():
            if path not in new_by_path:
                await self._unindex(skill)
        todo: builtins.list[Skill] = []
        for path, skill in new_by_path.items():
            before = old_by_path.get(path)
            if (
                before is not None
                and path in self._indexed
                and before.instructions == skill.instructions
                and before.references == skill.references
            ):
                continue
            if before is not None:
                await self._unindex(before)
            todo.append(skill)
        await self._index(todo)

    async def _unindex(self, skill: Skill) -> None:
        if self._search is None:
            return
        for doc in self._indexed.pop(skill.path, []):
            try:
                await self._search.remove(doc)
            except Exception as exc:  # best effort: the entry may be gone already
                _log.debug("removing %s from the index failed: %s", doc, exc)
            self._shared_ids.discard(doc)

    async def _index(self, skills: Sequence[Skill]) -> None:
        """Index the instructions and references of ``skills``: references are read
        :data:`READ_CONCURRENCY` at a time, none past the index's ``max_file_bytes`` (larger
        ones are skipped with a warning), and what was read is indexed whenever it reaches
        :data:`INDEX_ROUND_BYTES`, so memory stays bounded whatever the references hold."""
        if self._search is None or not skills:
            return
        search = self._search
        cap: int = getattr(search, "max_file_bytes", MAX_REFERENCE_BYTES)
        docs: builtins.list[tuple[str, str, dict[str, Any]]] = []
        owners: builtins.list[str] = []  # the skill path of each of ``docs``
        held = 0
        recorded: set[str] = set()

        async def commit() -> None:
            # Recorded as indexed only once in the index (a failure leaves the rest to do).
            nonlocal docs, owners, held
            if docs:
                await search.index_many(docs)
            for skill_path, (doc, _, _) in zip(owners, docs, strict=True):
                if skill_path not in recorded:
                    recorded.add(skill_path)
                    self._indexed[skill_path] = []
                self._indexed[skill_path].append(doc)
                self._shared_ids.add(doc)
            docs, owners, held = [], [], 0

        for skill in skills:
            docs.append(
                (
                    self._doc_id(skill.path, "SKILL.md"),
                    skill.instructions,
                    self._doc_metadata(skill.path, "SKILL.md"),
                )
            )
            owners.append(skill.path)
        refs = [
            (join_path(skill.path, f"references/{ref}"), skill, ref)
            for skill in skills
            for ref in skill.references
        ]
        for start in range(0, len(refs), READ_CONCURRENCY):
            part = refs[start : start + READ_CONCURRENCY]
            contents = await self._read_references(part, cap)
            for path, skill, ref in part:
                data = contents.get(path)
                if isinstance(data, FileTooLarge):
                    _log.warning(
                        "skill search does not index %s: it is larger than %d bytes (max_file_bytes "
                        "of the search index)",
                        path, cap,
                    )  # fmt: skip
                    continue
                if not isinstance(data, bytes):
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # binary: nothing to search
                docs.append(
                    (
                        self._doc_id(skill.path, ref),
                        text,
                        self._doc_metadata(skill.path, f"references/{ref}"),
                    )
                )
                owners.append(skill.path)
                held += len(data)
            del contents
            if held >= INDEX_ROUND_BYTES:
                await commit()
        await commit()

    async def _read_references(
        self, refs: Sequence[tuple[str, Skill, str]], max_bytes: int
    ) -> dict[str, bytes | OSError]:
        """The bytes of each reference (by its full path), read without leaving its skill
        where the source can (a link out of the skill is skipped, not indexed); one larger
        than ``max_bytes`` maps to ``FileTooLarge``."""
        if not isinstance(self.source, SupportsReadBeneath):
            paths = [path for path, _, _ in refs]
            return await read_many(self.source, paths, concurrency=READ_CONCURRENCY, max_bytes=max_bytes)
        source = self.source
        out: dict[str, bytes | OSError] = {}
        limiter = anyio.Semaphore(READ_CONCURRENCY)

        async def one(path: str, skill: Skill, ref: str) -> None:
            async with limiter:
                try:
                    out[path] = await source.read_file_beneath(
                        skill.path, f"references/{ref}", max_bytes=max_bytes
                    )
                except OSError as exc:
                    out[path] = exc

        async with anyio.create_task_group() as group:
            for path, skill, ref in refs:
                group.start_soon(one, path, skill, ref)
        return out

    async def _heal_index(self, catalog: _Catalog) -> None:
        """Index again if the documents are gone (``rebuild_search_index`` clears the index,
        skills' documents included)."""
        if self._search is None or not self._indexed:
            return
        probe = next(iter(self._indexed.values()))[0]
        if await self._search.contains(probe) is False:
            self._indexed.clear()
            async with self._lock:
                await self._index([s for c in catalog.skills.values() for s in c])

    # -- search ---------------------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        top_k: int = 5,
        min_score: float | None = None,
        mode: Literal["bm25", "vector", "hybrid"] | None = None,
        skill_names: Sequence[str] | None = None,
        include_references: bool = True,
    ) -> builtins.list[SkillSearchResult]:
        """Search skills' instructions and references.

        With the workspace's search configured, the index answers (``mode`` as
        ``Workspace.search``); otherwise a case-insensitive substring match (score 1 in
        instructions, 0.8 in references).

        Parameters
        ----------
        query : str
            What to look for.
        top_k : int
            At most this many results.
        min_score : float, optional
            Leave out weaker results (index search only).
        mode : {"bm25", "vector", "hybrid"}, optional
            The search mode (default: the best configured).
        skill_names : sequence of str, optional
            Only these skills.
        include_references : bool
            Also search the files below ``references/``.
        """
        catalog = await self._ready()
        names = set(skill_names) if skill_names is not None else None
        if self._search is None:
            return await self._simple_search(catalog, query, top_k, names, include_references)
        await self._heal_index(catalog)
        if self._namespace is not None:
            total = len(self._shared_ids)
        else:
            total = sum(1 + len(s.references) for c in catalog.skills.values() for s in c)
        want = max(top_k * 3 if names is not None else top_k, total, 1)
        while True:
            hits = await self._search.search(query, top_k=want, min_score=min_score, mode=mode)
            results = await self._collect(catalog, hits, top_k, names, include_references)
            # Non-skill documents share the index: ask for more while they crowd skills out.
            if len(results) >= top_k or len(hits) < want:
                return results
            want *= 4

    async def _collect(
        self,
        catalog: _Catalog,
        hits: Sequence[SearchResult],
        top_k: int,
        names: set[str] | None,
        include_references: bool,
    ) -> builtins.list[SkillSearchResult]:
        results: builtins.list[SkillSearchResult] = []
        seen: set[str] = set()
        for hit in hits:
            meta = hit.metadata or {}
            skill_path, source = meta.get("skill_path"), meta.get("source")
            if not isinstance(skill_path, str) or not isinstance(source, str):
                continue
            if meta.get("skill_scope") != self._namespace:
                continue
            matched = self._by_path(catalog, skill_path)
            if matched is None:
                continue
            try:
                skill = await self._by_name(catalog, matched.name) or matched
            except SkillConflictError:
                skill = matched
            if names is not None and skill.name not in names:
                continue
            if not include_references and source != "SKILL.md":
                continue
            key = f"{skill.path}:{source}"
            if key in seen:
                continue
            seen.add(key)
            results.append(
                SkillSearchResult(
                    skill.name,
                    skill.path,
                    source,
                    hit.content,
                    hit.score,
                    hit.line_range,
                    dict(hit.score_details),
                )
            )
            if len(results) >= top_k:
                break
        return results

    async def _simple_search(
        self,
        catalog: _Catalog,
        query: str,
        top_k: int,
        names: set[str] | None,
        include_references: bool,
    ) -> builtins.list[SkillSearchResult]:
        needle = query.lower()
        results: builtins.list[SkillSearchResult] = []
        for candidates in list(catalog.skills.values()):
            try:
                winners = [w] if (w := await self._by_name(catalog, candidates[0].name)) else []
            except SkillConflictError:
                winners = await self._dedupe(catalog, candidates)
            for skill in winners:
                if names is not None and skill.name not in names:
                    continue
                if needle in skill.instructions.lower():
                    results.append(
                        SkillSearchResult(
                            skill.name, skill.path, "SKILL.md", skill.instructions[:200], 1.0
                        )
                    )
                if include_references:
                    for ref in skill.references:
                        if len(results) >= top_k:
                            break
                        try:
                            data = await self._read(
                                skill, f"references/{ref}", "reference", MAX_REFERENCE_BYTES
                            )
                        except (InvalidSkillPathError, FileTooLarge) as exc:
                            # One bad reference must not break the search of every skill.
                            _log.warning("skill search skipped %s: %s", skill.path, exc)
                            continue
                        text = data.decode("utf-8", "replace") if data is not None else None
                        if text and needle in text.lower():
                            results.append(
                                SkillSearchResult(
                                    skill.name, skill.path, f"references/{ref}", text[:200], 0.8
                                )
                            )
            if len(results) >= top_k:
                break
        return results[:top_k]

    def __repr__(self) -> str:
        paths = "<function>" if self.is_dynamic else list(self._config)  # type: ignore[arg-type]
        return f"WorkspaceSkills(source={self.source!r}, skills={paths!r})"


def _preference(skill: Skill) -> tuple[int, str, str]:
    return (_SOURCE_PRIORITY.get(skill.source.type, 99), skill.path.casefold(), skill.path)


class _ResolvedSourceSkills(WorkspaceSkills):
    """Skills of a workspace whose filesystem is a resolver: each request's skills come from
    the filesystem resolved for it (the last 16 kept), never from the host's disk."""

    def __init__(
        self,
        resolve: Callable[[RequestContext], Awaitable[SkillSource | None]],
        skills: SkillsConfig,
        **options: Any,
    ) -> None:
        super().__init__(LocalSkillSource(), skills, **options)
        self._resolve = resolve
        self._options = options
        self._sources: OrderedDict[int, tuple[SkillSource, WorkspaceSkills]] = OrderedDict()
        self._counter = 0

    async def get_scoped(self, request_context: RequestContext | None = None) -> WorkspaceSkills:
        """The skills of the filesystem resolved for ``request_context`` (and of the paths
        the skills function gives for it)."""
        self._check()
        ctx = request_context if request_context is not None else RequestContext()
        source = await self._resolve(ctx)
        if source is None:
            raise FileNotFoundError(
                "the filesystem resolver returned no filesystem to read skills from"
            )
        key = id(source)
        held = self._sources.get(key)
        if held is None or held[0] is not source:
            self._counter += 1
            base = WorkspaceSkills(
                source,
                self._config,
                search=self._search,
                validate_on_load=self.validate_on_load,
                check_skill_file_mtime=self.check_skill_file_mtime,
                staleness_cooldown=self.staleness_cooldown,
                assert_available=self._assert_available,
                _namespace=f"source-{self._counter}",
                _shared_ids=self._shared_ids,
            )
            held = (source, base)
            self._sources[key] = held
            while len(self._sources) > RESOLVED_SOURCES:
                self._sources.popitem(last=False)
        self._sources.move_to_end(key)
        return await held[1].get_scoped(ctx)

    async def refresh(self) -> None:
        await (await self.get_scoped()).refresh()

    async def maybe_refresh(self, request_context: RequestContext | None = None) -> None:
        await (await self.get_scoped(request_context)).maybe_refresh(request_context)

    async def list(self) -> builtins.list[SkillMetadata]:
        return await (await self.get_scoped()).list()

    async def get(self, name: str) -> Skill | None:
        return await (await self.get_scoped()).get(name)

    async def has(self, name: str) -> bool:
        return await (await self.get_scoped()).has(name)

    async def get_reference(self, skill_name: str, reference_path: str) -> str | None:
        return await (await self.get_scoped()).get_reference(skill_name, reference_path)

    async def get_script(self, skill_name: str, script_path: str) -> str | None:
        return await (await self.get_scoped()).get_script(skill_name, script_path)

    async def get_asset(self, skill_name: str, asset_path: str) -> bytes | None:
        return await (await self.get_scoped()).get_asset(skill_name, asset_path)

    async def read_skill_file(
        self, skill: Skill, path: str, *, max_bytes: int | None = None
    ) -> bytes | None:
        return await (await self.get_scoped()).read_skill_file(skill, path, max_bytes=max_bytes)

    async def list_references(self, skill_name: str) -> builtins.list[str]:
        return await (await self.get_scoped()).list_references(skill_name)

    async def list_scripts(self, skill_name: str) -> builtins.list[str]:
        return await (await self.get_scoped()).list_scripts(skill_name)

    async def list_assets(self, skill_name: str) -> builtins.list[str]:
        return await (await self.get_scoped()).list_assets(skill_name)

    async def add_skill(self, skill_path: str) -> None:
        await (await self.get_scoped()).add_skill(skill_path)

    async def remove_skill(self, skill_name: str) -> None:
        await (await self.get_scoped()).remove_skill(skill_name)

    async def search(
        self,
        query: str,
        *,
        top_k: int = 5,
        min_score: float | None = None,
        mode: Literal["bm25", "vector", "hybrid"] | None = None,
        skill_names: Sequence[str] | None = None,
        include_references: bool = True,
    ) -> builtins.list[SkillSearchResult]:
        return await (await self.get_scoped()).search(
            query,
            top_k=top_k,
            min_score=min_score,
            mode=mode,
            skill_names=skill_names,
            include_references=include_references,
        )


def _is_source(value: Any) -> bool:
    return all(
        callable(getattr(value, m, None)) for m in ("exists", "stat", "read_file", "readdir")
    )


class SkillsHost(Protocol):
    """What skills need of the workspace they belong to (:class:`agentvfs.Workspace` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def filesystem(self) -> WorkspaceFilesystem | None: ...

    def has_filesystem_config(self) -> bool: ...

    async def resolve_filesystem(
        self, *, request_context: RequestContext | None = None
    ) -> WorkspaceFilesystem | None: ...


def create_workspace_skills(
    workspace: SkillsHost,
    skills: SkillsConfig,
    skill_source: Any,
    *,
    search: WorkspaceSearch | None = None,
    torn_down: Callable[[], bool] = lambda: False,
) -> WorkspaceSkills:
    """The ``skills`` of a workspace: read from ``skill_source`` if given, else from the
    filesystem resolved per request (a filesystem resolver), else the static filesystem, else
    the current directory (``LocalSkillSource``), sharing the workspace's search index.

    Parameters
    ----------
    workspace : SkillsHost
        The workspace the skills belong to.
    skills, skill_source
        The workspace's ``skills`` and ``skill_source`` configuration.
    search : WorkspaceSearch, optional
        The workspace's search index, which skill search shares.
    torn_down : callable
        True once the workspace's teardown started: every skills call then fails.

    Raises
    ------
    WorkspaceError
        ``skill_source`` lacks the read operations (``INVALID_CONFIG``).
    """
    from ..errors import WorkspaceError, WorkspaceNotReadyError

    index = SkillIndex(search) if search is not None else None

    def assert_available() -> None:
        if torn_down():
            raise WorkspaceNotReadyError(workspace.id, workspace.status)

    options: dict[str, Any] = {"search": index, "assert_available": assert_available}
    if skill_source is not None:
        if not _is_source(skill_source):
            raise WorkspaceError(
                "skill_source must provide exists, stat, read_file and readdir "
                f"(a SkillSource or a WorkspaceFilesystem), not {type(skill_source).__name__}",
                "INVALID_CONFIG",
                workspace.id,
            )
        return WorkspaceSkills(skill_source, skills, **options)
    if workspace.filesystem is None and workspace.has_filesystem_config():

        async def resolve(ctx: RequestContext) -> SkillSource | None:
            return await workspace.resolve_filesystem(request_context=ctx)

        return _ResolvedSourceSkills(resolve, skills, **options)
    if workspace.filesystem is not None:
        return WorkspaceSkills(workspace.filesystem, skills, **options)
    return WorkspaceSkills(LocalSkillSource(), skills, **options)
