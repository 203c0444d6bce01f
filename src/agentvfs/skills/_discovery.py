"""Finding skills below the configured paths (reference §17.2) and noticing when that
would find something different (the staleness check behind ``maybe_refresh``).

Discovery lists before it reads: one walk of each configured directory (two levels deep on
disk; the whole tree on object stores, where a listing costs the same at any depth) tells
which subdirectories hold a SKILL.md, how big it is and which ``references/``, ``scripts/``
and ``assets/`` directories exist. Only then are the SKILL.md files read, many at once, each
with the 1 MiB limit enforced on the file read (a listed size may be missing, for a symlink,
or stale).

The staleness check repeats the listings and compares them (names, types, sizes) with the
ones discovery saw; it never reads a SKILL.md. Object stores have no directory modification
times, so comparing listings is what works everywhere.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import FileTooLarge, InvalidSkillError
from ..vfs import FileEntry, create_glob_matcher, extract_glob_base, is_glob_pattern, read_many
from ._parse import MAX_SKILL_FILE_BYTES, parse_skill_md, too_large_message
from ._records import ContentSource, Skill
from ._sources import READ_CONCURRENCY, SkillSource, Tree, TreeCache, is_flat, join_path

__all__ = [
    "Discovery",
    "Planned",
    "determine_source",
    "discover",
    "is_skill_file_path",
    "load_skill",
    "signatures",
    "strip_trailing_slash",
]

_log = logging.getLogger("agentvfs.skills")

SKILL_FILE = "SKILL.md"
SUBDIRS = ("references", "scripts", "assets")
#: Levels below a glob's base that a glob matches: the reference walks with ``maxDepth: 4``,
#: descending while the depth (0 for the base's entries) is below it, so five levels.
GLOB_DEPTH = 5
#: Levels walked below a ``references/``, ``scripts/`` or ``assets/`` directory.
SUBDIR_DEPTH = 20
#: A skills root, one of its skill directories, and what is directly in that: what the
#: staleness check lists on disk (as much as the reference's directory times tell).
SCAN_DEPTH = 2
#: Discovery on disk also lists one level into ``references/`` and the like, so skills
#: whose subdirectories hold only files need no listing of their own.
DISCOVERY_DEPTH = SCAN_DEPTH + 1
#: On object stores: the skill directory's subdirectories as deep as they are listed.
FLAT_DEPTH = SCAN_DEPTH + 1 + SUBDIR_DEPTH
#: Directory listings in flight at once.
LIST_CONCURRENCY = 16


def strip_trailing_slash(path: str) -> str:
    return path[:-1] if len(path) > 1 and path.endswith("/") else path


def is_skill_file_path(path: str) -> bool:
    """True for ``SKILL.md`` and ``.../SKILL.md``."""
    return path == SKILL_FILE or path.endswith("/" + SKILL_FILE)


def parent_path(path: str) -> str:
    return posixpath.dirname(path)


def dir_name_of(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) or path


def determine_source(skills_path: str) -> ContentSource:
    """``external`` under a ``node_modules`` segment, ``managed`` under ``.mastra/skills``,
    else ``local``."""
    normalized = skills_path.replace("\\", "/")
    if "node_modules" in [s for s in normalized.split("/") if s]:
        return ContentSource("external", skills_path)
    if "/.mastra/skills" in normalized or normalized.startswith(".mastra/skills"):
        return ContentSource("managed", skills_path)
    return ContentSource("local", skills_path)


@dataclass
class Planned:
    """A SKILL.md found by listing, not yet read."""

    skill_file: str
    skill_dir: str
    dir_name: str
    source: ContentSource
    size: int | None
    #: The skill directory's walk, when it reaches into the subdirectories.
    tree: Tree | None = None


@dataclass
class Discovery:
    """What one discovery found: skills by name (same-named candidates in discovery order),
    the listings it saw (for staleness checks) and the SKILL.md files it read."""

    skills: dict[str, list[Skill]] = field(default_factory=dict)
    signatures: dict[str, Any] = field(default_factory=dict)
    skill_files: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)


def add_skill(
    target: dict[str, list[Skill]], skill: Skill, candidates: list[Skill] | None = None
) -> None:
    """Add a candidate, replacing one at the same path (in ``candidates``, a copy of the
    current list, when given: the result is stored as a new list)."""
    if candidates is None:
        candidates = target.setdefault(skill.name, [])
    else:
        target[skill.name] = candidates
    for i, existing in enumerate(candidates):
        if existing.path == skill.path:
            candidates[i] = skill
            return
    candidates.append(skill)


def _depth(flat: bool) -> int:
    return FLAT_DEPTH if flat else DISCOVERY_DEPTH


def _signature(tree: Tree | None, flat: bool) -> Any:
    return None if tree is None else tree.signature(None if flat else SCAN_DEPTH)


def _plan_directory(path: str, tree: Tree, source: ContentSource, out: list[Planned]) -> None:
    """A directory holding SKILL.md is one skill; otherwise each child directory holding one is."""
    if tree.is_file(SKILL_FILE):
        out.append(
            Planned(
                join_path(path, SKILL_FILE),
                path,
                dir_name_of(path),
                source,
                tree.entries[SKILL_FILE].size,
                tree,
            )
        )
        return
    for child in tree.child_dirs():
        if tree.is_file(f"{child}/{SKILL_FILE}"):
            skill_dir = join_path(path, child)
            out.append(
                Planned(
                    join_path(skill_dir, SKILL_FILE),
                    skill_dir,
                    child,
                    source,
                    tree.entries[f"{child}/{SKILL_FILE}"].size,
                    tree.sub(child),
                )
            )


async def _glob_matches(
    cache: TreeCache, pattern: str, flat: bool
) -> tuple[list[tuple[str, FileEntry]], Tree | None]:
    """What a glob names (as the reference's ``resolvePathPattern`` with ``dot`` and a depth
    of 4, five levels): ``(path, entry)`` pairs, and the walk of the glob's base."""
    base = extract_glob_base(pattern)
    tree = await cache.tree(base, GLOB_DEPTH + (FLAT_DEPTH if flat else 0))
    if tree is None:
        return [], None
    matcher = create_glob_matcher(pattern, dot=True)
    matches = [
        (join_path(base, name), entry)
        for name, entry in tree.entries.items()
        if name.count("/") < GLOB_DEPTH and matcher(join_path(base, name))
    ]
    return matches, tree


async def _plan(
    cache: TreeCache, paths: Sequence[str], flat: bool, found: Discovery
) -> list[Planned]:
    out: list[Planned] = []
    for raw in paths:
        path = strip_trailing_slash(raw)
        source = determine_source(path)
        if is_glob_pattern(path):
            matches, tree = await _glob_matches(cache, path, flat)
            found.signatures[raw] = tree.signature() if tree is not None else None
            for match, entry in matches:
                if entry.type == "file":
                    if is_skill_file_path(match):
                        skill_dir = parent_path(match)
                        out.append(
                            Planned(match, skill_dir, dir_name_of(skill_dir), source, entry.size)
                        )
                    continue
                sub = await cache.tree(match, _depth(flat))
                if sub is not None:
                    _plan_directory(match, sub, source, out)
        elif is_skill_file_path(path):
            skill_dir = parent_path(path)
            try:
                stat = await cache.source.stat(path)
            except FileNotFoundError:
                found.signatures[raw] = None
                continue  # a direct reference to nothing: no scan below it
            except OSError as exc:
                _log.warning('[WorkspaceSkills] Cannot access skills path "%s": %s', path, exc)
                found.signatures[raw] = None
                continue
            found.signatures[raw] = (stat.size, stat.modified_at, stat.etag)
            out.append(
                Planned(
                    path, skill_dir, dir_name_of(skill_dir) if skill_dir else "", source, stat.size
                )
            )
        else:
            tree = await cache.tree(path, _depth(flat))
            found.signatures[raw] = _signature(tree, flat)
            if tree is not None:
                _plan_directory(path, tree, source, out)
    return out


async def _subdir_files(cache: TreeCache, planned: Planned) -> dict[str, tuple[str, ...]]:
    """The files below ``references/``, ``scripts/`` and ``assets/`` of a skill."""
    out: dict[str, tuple[str, ...]] = {}
    tree = planned.tree
    for sub in SUBDIRS:
        if tree is not None:
            below = tree.sub(sub)
            if below is None:
                out[sub] = ()
                continue
            if below.complete() or tree.depth >= 1 + SUBDIR_DEPTH:
                out[sub] = tuple(tree.files_below(sub))
                continue
        walked = await cache.tree(join_path(planned.skill_dir, sub), SUBDIR_DEPTH)
        if walked is None:
            out[sub] = ()
            continue
        linked = [
            n + "/" for n, e in walked.entries.items() if e.type == "directory" and e.is_symlink
        ]
        out[sub] = tuple(
            n
            for n, e in walked.entries.items()
            if e.type == "file" and not any(n.startswith(d) for d in linked)
        )
    return out


async def _all_subdir_files(
    cache: TreeCache, planned: Sequence[Planned]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """:func:`_subdir_files` of many skills, several listings at a time."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    limiter = anyio.Semaphore(LIST_CONCURRENCY)

    async def one(item: Planned) -> None:
        async with limiter:
            out[item.skill_file] = await _subdir_files(cache, item)

    async with anyio.create_task_group() as tg:
        for item in planned:
            tg.start_soon(one, item)
    return out


def build_skill(
    planned: Planned, content: bytes, files: dict[str, tuple[str, ...]], *, validate: bool
) -> Skill:
    """Parse a SKILL.md into a :class:`Skill` (warnings are logged).

    Raises
    ------
    InvalidSkillError
        As :func:`parse_skill_md`.
    """
    parsed = parse_skill_md(
        content, file_path=planned.skill_file, dir_name=planned.dir_name, validate=validate
    )
    front = parsed.front_matter
    for warning in parsed.warnings:
        _log.warning("[WorkspaceSkills] %s: %s", front.get("name"), warning)
    metadata = front.get("metadata")
    return Skill(
        name=front.get("name"),  # type: ignore[arg-type]  # validated unless validate=False
        path=planned.skill_dir,
        description=front.get("description"),  # type: ignore[arg-type]
        license=front.get("license"),
        compatibility=front.get("compatibility"),
        user_invocable=front.get("user-invocable"),
        metadata=dict(metadata) if isinstance(metadata, dict) else metadata,
        instructions=parsed.instructions,
        source=planned.source,
        references=files.get("references", ()),
        scripts=files.get("scripts", ()),
        assets=files.get("assets", ()),
    )


async def discover(
    source: SkillSource, paths: Sequence[str], *, validate: bool = True
) -> Discovery:
    """Find and load every skill below ``paths``; invalid skills are skipped and logged.

    Parameters
    ----------
    source : SkillSource
        Where to look.
    paths : sequence of str
        Skills directories, skill directories, ``.../SKILL.md`` files and globs.
    validate : bool
        Apply the Agent Skills rules (else anything with front matter loads).
    """
    found = Discovery()
    flat = is_flat(source)
    cache = TreeCache(source)
    planned = await _plan(cache, paths, flat, found)
    readable: list[Planned] = []
    for item in planned:
        if item.size is not None and item.size > MAX_SKILL_FILE_BYTES:
            _fail(found, item.skill_file, too_large_message(item.skill_file, item.size))
        else:
            readable.append(item)
    contents = await _read_skill_files(source, list(dict.fromkeys(p.skill_file for p in readable)))
    files = await _all_subdir_files(
        cache, [p for p in readable if isinstance(contents.get(p.skill_file), bytes)]
    )
    for item in readable:
        data = contents.get(item.skill_file)
        if isinstance(data, FileTooLarge):
            _fail(found, item.skill_file, _too_large(item.skill_file))
            continue
        if not isinstance(data, bytes):
            _fail(found, item.skill_file, str(data) if data is not None else "not readable")
            continue
        try:
            skill = build_skill(item, data, files[item.skill_file], validate=validate)
        except InvalidSkillError as exc:
            _fail(found, item.skill_file, str(exc))
            continue
        add_skill(found.skills, skill)
        found.skill_files.append(item.skill_file)
    return found


async def _read_skill_files(source: SkillSource, paths: list[str]) -> dict[str, bytes | OSError]:
    """Read SKILL.md files, none past :data:`MAX_SKILL_FILE_BYTES` whatever size the listing
    showed: a symlinked SKILL.md lists without a size, and a file may be swapped for a larger
    one after its listing (on local disk no more than a byte past the limit is read); such a
    file maps to ``FileTooLarge``."""
    return await read_many(source, paths, concurrency=READ_CONCURRENCY, max_bytes=MAX_SKILL_FILE_BYTES)


def _too_large(path: str) -> str:
    return (
        f"{path} is too large to load as a skill (more than {MAX_SKILL_FILE_BYTES} bytes, the limit). "
        "Move content to references/."
    )


def _fail(found: Discovery, path: str, message: str) -> None:
    _log.error("[WorkspaceSkills] Failed to load skill from %s: %s", path, message)
    found.failures.append((path, message))


async def load_skill(
    source: SkillSource, path: str, content_source: ContentSource, *, validate: bool = True
) -> Skill:
    """Load one skill from its directory or its SKILL.md (for ``add_skill``).

    Raises
    ------
    InvalidSkillError
        The SKILL.md breaks the rules, or is too large.
    FileNotFoundError
        No SKILL.md there.
    """
    path = strip_trailing_slash(path)
    if is_skill_file_path(path):
        skill_file, skill_dir = path, parent_path(path)
    else:
        skill_file, skill_dir = join_path(path, SKILL_FILE), path
    stat = await source.stat(skill_file)
    planned = Planned(
        skill_file,
        skill_dir,
        dir_name_of(skill_dir) if skill_dir else "",
        content_source,
        stat.size,
    )
    if stat.size > MAX_SKILL_FILE_BYTES:
        raise InvalidSkillError(too_large_message(skill_file, stat.size))
    content = (await _read_skill_files(source, [skill_file]))[skill_file]
    if isinstance(content, FileTooLarge):
        raise InvalidSkillError(_too_large(skill_file))
    if isinstance(content, OSError):
        raise content
    cache = TreeCache(source)
    planned.tree = await cache.tree(skill_dir, 1 + (SUBDIR_DEPTH if is_flat(source) else 1))
    return build_skill(planned, content, await _subdir_files(cache, planned), validate=validate)


async def signatures(source: SkillSource, paths: Sequence[str]) -> dict[str, Any]:
    """The listings discovery of ``paths`` would see now (compare with
    ``Discovery.signatures``); reads no file."""
    found = Discovery()
    flat = is_flat(source)
    cache = TreeCache(source)
    for raw in paths:
        path = strip_trailing_slash(raw)
        if is_glob_pattern(path):
            _, tree = await _glob_matches(cache, path, flat)
            found.signatures[raw] = tree.signature() if tree is not None else None
        elif is_skill_file_path(path):
            try:
                stat = await source.stat(path)
            except OSError:
                found.signatures[raw] = None
                continue
            found.signatures[raw] = (stat.size, stat.modified_at, stat.etag)
        else:
            tree = await cache.tree(path, FLAT_DEPTH if flat else SCAN_DEPTH)
            found.signatures[raw] = _signature(tree, flat)
    return found.signatures
