"""Published skill versions in a content-addressed store, and a skill source serving them.

A :class:`SkillStore` lives on any filesystem (an S3 prefix, a local directory, memory); its
blobs are a :class:`~agentvfs.vfs.BlobStore`, the layout workspace snapshots share::

    <prefix>/blobs/<h[:2]>/<h>                      file contents, named by their SHA-256
    <prefix>/skills/<name>/versions/<version>.json  manifest: path -> hash, size, MIME type

A version id is the SHA-256 of the manifest's canonical listing, so publishing the same files
twice gives the same version and writes nothing: blobs already present are not written again,
and nor is a manifest. Every blob is checked against its hash when read (a blob that does not
match is refused, never served), and every manifest against its version id.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio

from ..errors import (
    BlobIntegrityError,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    InvalidSkillError,
    IsDirectory,
    NotDirectory,
)
from ..vfs import (
    BlobStore,
    FileEntry,
    FileStat,
    FsspecFilesystem,
    WorkspaceFilesystem,
    get_mime_type,
    is_digest,
    sha256_hex,
)
from ._parse import MAX_SKILL_FILE_BYTES, parse_skill_md, too_large_message
from ._sources import SkillSource, norm_path, read_files, walk_source

__all__ = ["BlobRef", "SkillStore", "SkillVersion", "VersionedSkillSource", "publish_skill"]

_log = logging.getLogger("agentvfs.skills")

#: Depth walked below a skill directory when publishing it.
PUBLISH_DEPTH = 24
MANIFEST_FORMAT = 1
#: Verified blob contents kept in memory by a VersionedSkillSource (bytes).
BLOB_CACHE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BlobRef:
    """One file of a version: the hash naming its blob, its size and MIME type."""

    hash: str
    size: int
    mime_type: str | None = None


@dataclass(frozen=True, slots=True)
class SkillVersion:
    """A published version of one skill: its files (path relative to the skill directory ->
    blob) and when it was first published."""

    name: str
    version: str
    files: Mapping[str, BlobRef]
    created_at: datetime

    @staticmethod
    def version_id(name: str, files: Mapping[str, BlobRef]) -> str:
        """The content address of a version: SHA-256 of its name and sorted file listing."""
        listing = {p: [b.hash, b.size, b.mime_type] for p, b in sorted(files.items())}
        canonical = json.dumps(
            {"name": name, "files": listing}, sort_keys=True, separators=(",", ":")
        )
        return sha256_hex(canonical.encode("utf-8"))

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "name": self.name,
                "version": self.version,
                "created_at": self.created_at.isoformat(),
                "files": {
                    p: {"hash": b.hash, "size": b.size, "mime_type": b.mime_type}
                    for p, b in sorted(self.files.items())
                },
            },
            indent=1,
            sort_keys=True,
        ).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SkillVersion:
        """Read a manifest, refusing one that is malformed or does not match its version id.

        Raises
        ------
        BlobIntegrityError
            The manifest is not what its version id says.
        """
        try:
            raw = json.loads(data)
            files: dict[str, BlobRef] = {}
            for path, ref in raw["files"].items():
                _check_manifest_path(path, where)
                digest = str(ref["hash"])
                if not is_digest(digest):
                    raise ValueError(f"bad hash {digest!r} for {path}")
                files[path] = BlobRef(digest, int(ref["size"]), ref.get("mime_type"))
            version = cls(
                str(raw["name"]),
                str(raw["version"]),
                files,
                datetime.fromisoformat(raw["created_at"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BlobIntegrityError(f"Malformed skill version manifest {where}: {exc}") from None
        if cls.version_id(version.name, files) != version.version:
            raise BlobIntegrityError(
                f"Skill version manifest {where} does not match its version id {version.version}; refusing it"
            )
        return version


def _key(path: str) -> str:
    """A path of a versioned source: relative to its root, ``/`` also meaning the root."""
    return norm_path(path.lstrip("/"))


def _check_manifest_path(path: str, where: str) -> None:
    segments = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or any(s in ("", ".", "..") for s in segments)
    ):
        raise ValueError(f"invalid file path {path!r} in {where}")


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\\" in name:
        raise ValueError(f"invalid skill name {name!r}")


class SkillStore:
    """Published skill versions, content-addressed, on any filesystem (see the module notes).

    Parameters
    ----------
    fs : WorkspaceFilesystem, fsspec.AbstractFileSystem or str
        Where the store lives: a workspace filesystem, an fsspec instance, or a URL such as
        ``s3://bucket/skills-store``.
    prefix : str
        A directory inside ``fs`` holding the store.
    """

    def __init__(self, fs: WorkspaceFilesystem | Any, *, prefix: str = "") -> None:
        self.fs: WorkspaceFilesystem = (
            fs if isinstance(fs, WorkspaceFilesystem) else FsspecFilesystem(fs)
        )
        self.prefix = norm_path(prefix)
        #: The file contents, in the layout every content-addressed store of agentvfs shares.
        self.blobs = BlobStore(self.fs, self.prefix)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.prefix, *parts) if self.prefix else posixpath.join(*parts)

    def blob_path(self, digest: str) -> str:
        """Where the blob named ``digest`` is kept."""
        return self.blobs.path(digest)

    def manifest_path(self, name: str, version: str) -> str:
        """Where the manifest of ``name`` at ``version`` is kept."""
        _check_name(name)
        if not is_digest(version):
            raise ValueError(f"not a version id: {version!r}")
        return self._path("skills", name, "versions", f"{version}.json")

    async def has_blob(self, digest: str) -> bool:
        """Tell whether the blob is stored."""
        return await self.blobs.has(digest)

    async def put_blob(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its hash unless it is there already; return the hash and
        whether it was written."""
        return await self.blobs.put(data)

    async def get_blob(self, digest: str, *, name: str | None = None) -> bytes:
        """The content of a blob, checked against its hash.

        Raises
        ------
        FileNotFound
            No such blob.
        BlobIntegrityError
            The stored content does not hash to ``digest`` (it is not returned).
        """
        return await self.blobs.get(digest, name=name)

    async def get_version(self, name: str, version: str) -> SkillVersion:
        """Load and check a version's manifest.

        Raises
        ------
        FileNotFound
            No such version.
        BlobIntegrityError
            The manifest is malformed or not what its id says.
        """
        path = self.manifest_path(name, version)
        data = await self.fs.read_file(path)
        loaded = SkillVersion.from_json(data if isinstance(data, bytes) else data.encode(), path)
        if loaded.name != name or loaded.version != version:
            raise BlobIntegrityError(
                f"Skill version manifest {path} names {loaded.name}@{loaded.version}; refusing it"
            )
        return loaded

    async def list_versions(self, name: str) -> list[SkillVersion]:
        """Every published version of a skill, oldest first (none: an empty list)."""
        _check_name(name)
        try:
            entries = await self.fs.readdir(self._path("skills", name, "versions"))
        except FileNotFoundError:
            return []
        ids = [
            e.name.removesuffix(".json")
            for e in entries
            if e.type == "file" and e.name.endswith(".json")
        ]
        versions = [await self.get_version(name, v) for v in ids if is_digest(v)]
        return sorted(versions, key=lambda v: (v.created_at, v.version))

    async def latest_version(self, name: str) -> SkillVersion | None:
        """The most recently published version of a skill, or None."""
        versions = await self.list_versions(name)
        return versions[-1] if versions else None

    async def put_version(self, version: SkillVersion) -> tuple[SkillVersion, bool]:
        """Store a manifest unless that version exists; return the stored version (the first
        publication's, with its ``created_at``) and whether it was written."""
        path = self.manifest_path(version.name, version.version)
        if await self.fs.exists(path):
            return await self.get_version(version.name, version.version), False
        try:
            await self.fs.write_file(path, version.to_json(), overwrite=False)
        except FileExists:
            return await self.get_version(version.name, version.version), False
        return version, True

    def __repr__(self) -> str:
        return f"SkillStore(fs={self.fs!r}, prefix={self.prefix!r})"


async def publish_skill(source_fs: SkillSource, skill_path: str, store: SkillStore) -> SkillVersion:
    """Publish the skill directory ``skill_path`` of ``source_fs`` as a version in ``store``.

    Every file below the directory is stored as a blob named by its hash (only blobs the
    store lacks are written) and a manifest lists them; publishing unchanged files again
    writes nothing and returns the existing version.

    Raises
    ------
    InvalidSkillError
        No SKILL.md, or one that breaks the Agent Skills rules (the skill's name must equal
        the directory's).
    FileNotFoundError, NotADirectoryError
        ``skill_path`` is not a directory.
    """
    entries = await walk_source(source_fs, skill_path, PUBLISH_DEPTH)
    linked = [e.name + "/" for e in entries if e.type == "directory" and e.is_symlink]
    paths = sorted(
        e.name
        for e in entries
        if e.type == "file" and not any(e.name.startswith(d) for d in linked)
    )
    if "SKILL.md" not in paths:
        raise InvalidSkillError(f"SKILL.md not found in {skill_path}")
    base = skill_path.rstrip("/")
    full = {p: f"{base}/{p}" if base not in ("", ".") else p for p in paths}
    data = await read_files(source_fs, list(full.values()))
    contents: dict[str, bytes] = {}
    for rel, path in full.items():
        got = data.get(path)
        if not isinstance(got, bytes):
            raise got if isinstance(got, OSError) else FileNotFound(path)
        contents[rel] = got
    skill_md = contents["SKILL.md"]
    if len(skill_md) > MAX_SKILL_FILE_BYTES:
        raise InvalidSkillError(too_large_message(full["SKILL.md"], len(skill_md)))
    dir_name = posixpath.basename(norm_path(skill_path))
    parsed = parse_skill_md(skill_md, file_path=full["SKILL.md"], dir_name=dir_name or None)
    name = str(parsed.front_matter["name"])
    files: dict[str, BlobRef] = {}
    written = 0
    limiter = anyio.Semaphore(16)

    async def put(rel: str, content: bytes) -> None:
        nonlocal written
        async with limiter:
            digest, fresh = await store.put_blob(content)
        files[rel] = BlobRef(digest, len(content), get_mime_type(posixpath.basename(rel)))
        written += fresh

    async with anyio.create_task_group() as tg:
        for rel, content in contents.items():
            tg.start_soon(put, rel, content)
    version = SkillVersion(
        name, SkillVersion.version_id(name, files), dict(sorted(files.items())), datetime.now(UTC)
    )
    stored, fresh_manifest = await store.put_version(version)
    _log.info(
        "published skill %s version %s: %d files, %d new blobs%s",
        name,
        stored.version[:12],
        len(files),
        written,
        "" if fresh_manifest else " (version already published)",
    )
    return stored


class VersionedSkillSource:
    """A read-only skill source serving published versions from a :class:`SkillStore`.

    Each version appears as the directory named after its skill (``pdf-tools/SKILL.md``,
    ``pdf-tools/references/api.md``), so ``skills=["."]`` finds them all. Contents are
    checked against their hashes before they are served and then kept in memory (they can
    never change).

    Parameters
    ----------
    store : SkillStore
        Where the blobs are.
    versions : iterable of SkillVersion
        The versions to serve, at most one per skill name.
    """

    read_only = True

    def __init__(self, store: SkillStore, versions: Iterable[SkillVersion]) -> None:
        self.store = store
        self.versions: dict[str, SkillVersion] = {}
        for version in versions:
            _check_name(version.name)
            if version.name in self.versions:
                raise ValueError(f"two versions of skill {version.name!r} given; serve one")
            self.versions[version.name] = version
        self._files: dict[str, BlobRef] = {}
        self._dirs: set[str] = {""}
        self._created: dict[str, datetime] = {}
        for version in self.versions.values():
            self._dirs.add(version.name)
            for rel, ref in version.files.items():
                path = f"{version.name}/{rel}"
                self._files[path] = ref
                self._created[path] = version.created_at
                parent = posixpath.dirname(path)
                while parent:
                    self._dirs.add(parent)
                    self._created.setdefault(parent, version.created_at)
                    parent = posixpath.dirname(parent)
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached_bytes = 0

    @classmethod
    async def from_store(
        cls, store: SkillStore, versions: Mapping[str, str | None]
    ) -> VersionedSkillSource:
        """Serve ``{skill name: version id}`` from ``store``; a None version means the latest.

        Raises
        ------
        FileNotFoundError
            A skill or version that was never published.
        """
        loaded = []
        for name, version in versions.items():
            if version is None:
                latest = await store.latest_version(name)
                if latest is None:
                    raise FileNotFound(f"skills/{name}")
                loaded.append(latest)
            else:
                loaded.append(await store.get_version(name, version))
        return cls(store, loaded)

    def _created_at(self, path: str) -> datetime:
        return self._created.get(path) or min(
            (v.created_at for v in self.versions.values()), default=datetime.fromtimestamp(0, UTC)
        )

    async def exists(self, path: str) -> bool:
        """Tell whether a file or directory of a served version is at ``path``."""
        key = _key(path)
        return key in self._files or key in self._dirs

    async def stat(self, path: str) -> FileStat:
        """Metadata from the manifest (times are the version's publication time; the etag
        is the content hash).

        Raises
        ------
        FileNotFound
            ``ENOENT``.
        """
        key = _key(path)
        created = self._created_at(key)
        name = posixpath.basename(key)
        ref = self._files.get(key)
        if ref is not None:
            return FileStat(name, key, "file", ref.size, created, created, ref.mime_type, ref.hash)
        if key in self._dirs:
            return FileStat(name, key, "directory", 0, created, created)
        raise FileNotFound(path)

    async def read_file(self, path: str) -> bytes:
        """The content of a file, checked against its hash.

        Raises
        ------
        FileNotFound, IsDirectory
            ``ENOENT``, ``EISDIR``.
        BlobIntegrityError
            The stored blob does not match its hash (nothing is served).
        """
        key = _key(path)
        ref = self._files.get(key)
        if ref is None:
            raise IsDirectory(path) if key in self._dirs else FileNotFound(path)
        cached = self._cache.get(ref.hash)
        if cached is not None:
            self._cache.move_to_end(ref.hash)
            return cached
        data = await self.store.get_blob(ref.hash, name=key)
        if len(data) != ref.size:
            raise BlobIntegrityError(
                f"Blob {ref.hash} of {key} has {len(data)} bytes, the manifest says {ref.size}"
            )
        if len(data) <= BLOB_CACHE_BYTES // 8:
            self._cache[ref.hash] = data
            self._cached_bytes += len(data)
            while self._cached_bytes > BLOB_CACHE_BYTES:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= len(dropped)
        return data

    async def readdir(self, path: str) -> list[FileEntry]:
        """The entries of a directory, sorted by name.

        Raises
        ------
        DirectoryNotFound, NotDirectory
            ``ENOENT``, ``ENOTDIR``.
        """
        return await self.walk(path, max_depth=1)

    async def walk(self, path: str, *, max_depth: int | None = None) -> list[FileEntry]:
        """Everything below ``path`` (to ``max_depth`` levels), from the manifests alone."""
        key = _key(path)
        if key in self._files:
            raise NotDirectory(path)
        if key not in self._dirs:
            raise DirectoryNotFound(path)
        head = key + "/" if key else ""
        limit = max_depth if max_depth is not None else 100
        out: dict[str, FileEntry] = {}
        for d in self._dirs:
            if d.startswith(head) and d != key:
                rel = d[len(head) :]
                if rel.count("/") < limit:
                    out[rel] = FileEntry(rel, "directory")
        for f, ref in self._files.items():
            if f.startswith(head):
                rel = f[len(head) :]
                if rel.count("/") < limit:
                    out[rel] = FileEntry(rel, "file", ref.size)
        return [out[n] for n in _tree_order(out)]

    async def realpath(self, path: str) -> str:
        """The path itself, normalised (a version has no links)."""
        return _key(path)

    def __repr__(self) -> str:
        listed = ", ".join(f"{n}@{v.version[:12]}" for n, v in sorted(self.versions.items()))
        return f"VersionedSkillSource({listed})"


def _tree_order(entries: Mapping[str, FileEntry]) -> list[str]:
    children: dict[str, list[str]] = {}
    for rel in entries:
        children.setdefault(posixpath.dirname(rel), []).append(rel)
    out: list[str] = []

    def visit(parent: str) -> None:
        for rel in sorted(children.get(parent, ())):
            out.append(rel)
            visit(rel)

    visit("")
    return out
