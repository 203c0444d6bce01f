"""The manifest of a snapshot: what it records of each path, and its canonical bytes.

A manifest is JSON in one canonical form (sorted keys, no spaces, UTF-8), and a snapshot's
id is the SHA-256 of those bytes: a manifest changed in storage no longer hashes to the id
it is filed under, and is refused when loaded. Anyone who can write the store can file a
manifest of their own under its true id, though, so a manifest (format 2) also carries an
HMAC of its document under the host's :class:`~agentvfs.snapshots.SnapshotKey` (and that
key's id): one the agent wrote does not verify and is refused. Format 1 is the unsigned
manifest of earlier versions, read only when asked for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..errors import BlobIntegrityError
from ..vfs import is_digest, normalize_path, sha256_hex
from ._keys import KEY_FILE_ENV, SnapshotKey

__all__ = [
    "RESERVED_DIR",
    "FileRecord",
    "Snapshot",
    "SnapshotInfo",
    "is_reserved",
]

#: The directory of a workspace's root that agentvfs keeps its own data in (snapshots below
#: ``.agentvfs/snapshots``). Snapshots, diffs and restores never include or touch it.
RESERVED_DIR = ".agentvfs"

#: Signed manifests; :data:`UNSIGNED_FORMAT` is that of earlier versions, without a MAC.
MANIFEST_FORMAT = 2
UNSIGNED_FORMAT = 1
#: The environment variable that, set to 1, reads unsigned (format 1) manifests as
#: ``SnapshotStore(accept_unsigned=True)`` does.
ACCEPT_UNSIGNED_ENV = "AGENTVFS_SNAPSHOT_ACCEPT_UNSIGNED"

#: Where a snapshot's file contents are held: blobs of its store, S3 object versions
#: (``VersionId``) or GCS object generations of the workspace's own bucket.
ContentKind = Literal["blobs", "s3-versions", "gcs-generations"]
_KINDS = ("blobs", "s3-versions", "gcs-generations")


def is_reserved(path: str) -> bool:
    """Whether the normalised ``path`` is agentvfs's own data (:data:`RESERVED_DIR` or below)."""
    return path == RESERVED_DIR or path.startswith(RESERVED_DIR + "/")


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file as a snapshot saw it.

    Attributes
    ----------
    path : str
        Relative to the workspace root.
    size : int
        Bytes.
    modified_at : datetime
        Its modification time then.
    etag : str or None
        The version token storage gave it then (S3 ETag, GCS generation, ...), the one a
        guarded write compares; None where storage has none.
    sha256 : str
        The SHA-256 of its content: every snapshot's uniform content hash.
    version : str or None
        The storage's own version of the object that holds the content (S3 ``VersionId``,
        GCS generation) where the snapshot pinned it there; None where a blob of the
        snapshot's store holds it (named by ``sha256``).
    """

    path: str
    size: int
    modified_at: datetime
    etag: str | None
    sha256: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a listing of snapshots tells of each (without loading its manifest)."""

    id: str
    name: str | None
    created_at: datetime
    files: int
    directories: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-friendly dict (ISO-8601 time)."""
        return {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at.isoformat(),
            "files": self.files,
            "directories": self.directories,
            "bytes": self.bytes,
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable record of a workspace's files, directories and symbolic links.

    Attributes
    ----------
    id : str
        The SHA-256 of the manifest's canonical bytes.
    name : str or None
        The name it was given.
    created_at : datetime
        When it was taken (UTC).
    storage : str or None
        Where the workspace's storage is (its ``location``), as the snapshot saw it.
    root : str or None
        The storage path of the workspace root, where the content is pinned to versions of
        its objects (the keys those versions belong to).
    content : str
        ``blobs``, ``s3-versions`` or ``gcs-generations``: where unpinned and pinned
        contents are (a file whose ``version`` is None is always a blob).
    files : mapping of str to FileRecord
        By path.
    directories : frozenset of str
        Every directory, empty ones included (not the root).
    links : mapping of str to str
        Each symbolic link's target, where the filesystem shows links.
    """

    id: str
    name: str | None
    created_at: datetime
    storage: str | None
    root: str | None
    content: ContentKind
    files: Mapping[str, FileRecord]
    directories: frozenset[str]
    links: Mapping[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """The size of every file together."""
        return sum(f.size for f in self.files.values())

    def info(self) -> SnapshotInfo:
        """The listing record of this snapshot."""
        return SnapshotInfo(
            self.id, self.name, self.created_at, len(self.files), len(self.directories), self.total_bytes
        )

    @staticmethod
    def encode(
        *,
        name: str | None,
        created_at: datetime,
        storage: str | None,
        root: str | None,
        content: ContentKind,
        files: Mapping[str, FileRecord],
        directories: frozenset[str] | set[str],
        links: Mapping[str, str],
        key: SnapshotKey | None = None,
    ) -> bytes:
        """The canonical manifest bytes of a snapshot with these contents (its id is their
        SHA-256), signed with ``key`` (format 2), or unsigned (format 1) without one."""
        document: dict[str, Any] = {
            "format": MANIFEST_FORMAT if key is not None else UNSIGNED_FORMAT,
            "kind": "agentvfs-snapshot",
            "name": name,
            "created_at": created_at.isoformat(),
            "storage": storage,
            "root": root,
            "content": content,
            "files": {
                p: {
                    "size": f.size,
                    "mtime": f.modified_at.isoformat(),
                    "etag": f.etag,
                    "sha256": f.sha256,
                    "version": f.version,
                }
                for p, f in sorted(files.items())
            },
            "directories": sorted(directories),
            "links": dict(sorted(links.items())),
        }
        if key is not None:
            document["key"] = key.id
            document["mac"] = key.sign("manifest", canonical_json(document))
        return canonical_json(document)

    @classmethod
    def create(
        cls,
        *,
        name: str | None,
        created_at: datetime,
        storage: str | None,
        root: str | None,
        content: ContentKind,
        files: Mapping[str, FileRecord],
        directories: frozenset[str] | set[str],
        links: Mapping[str, str],
        key: SnapshotKey | None = None,
    ) -> tuple[Snapshot, bytes]:
        """A new snapshot and its manifest bytes (signed with ``key``, see :meth:`encode`)."""
        data = cls.encode(
            name=name, created_at=created_at, storage=storage, root=root, content=content,
            files=files, directories=directories, links=links, key=key,
        )  # fmt: skip
        snapshot = cls(
            sha256_hex(data), name, created_at, storage, root, content,
            dict(sorted(files.items())), frozenset(directories), dict(sorted(links.items())),
        )  # fmt: skip
        return snapshot, data

    @classmethod
    def decode(
        cls, data: bytes, expected_id: str, where: str, *, key: SnapshotKey | None = None, accept_unsigned: bool = False
    ) -> Snapshot:
        """Read manifest bytes, refusing any that do not hash to ``expected_id`` or are not
        a well-formed manifest; with ``key``, also any not signed with it (an unsigned one
        of an earlier version only with ``accept_unsigned``). Without ``key`` the signature
        is not looked at: what a manifest names, whoever wrote it (garbage collection keeps
        the blobs of every manifest it finds).

        Raises
        ------
        BlobIntegrityError
            The bytes are not the manifest ``expected_id`` names, not a manifest, or not
            signed with ``key``.
        """
        return cls.decode_signed(data, expected_id, where, key=key, accept_unsigned=accept_unsigned)[0]

    @classmethod
    def decode_signed(
        cls, data: bytes, expected_id: str, where: str, *, key: SnapshotKey | None = None, accept_unsigned: bool = False
    ) -> tuple[Snapshot, bool]:
        """:meth:`decode`, and whether the manifest is signed with ``key`` (False for an
        unsigned one accepted, and always without ``key``).

        Raises
        ------
        BlobIntegrityError
            As :meth:`decode`.
        """
        actual = sha256_hex(data)
        if actual != expected_id:
            raise BlobIntegrityError(
                f"Snapshot manifest {where} does not match its id {expected_id} (it hashes to {actual}): "
                "it was changed in storage; refusing it"
            )
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("kind") != "agentvfs-snapshot":
                raise ValueError("not a snapshot manifest")
            if raw.get("format") not in (MANIFEST_FORMAT, UNSIGNED_FORMAT):
                raise ValueError(f"not a snapshot manifest of format {UNSIGNED_FORMAT} or {MANIFEST_FORMAT}")
        except (ValueError, TypeError) as exc:
            raise BlobIntegrityError(f"Malformed snapshot manifest {where}: {exc}") from None
        signed = key is not None and _authenticate(raw, key, where, accept_unsigned)
        try:
            content = raw["content"]
            if content not in _KINDS:
                raise ValueError(f"unknown content kind {content!r}")
            files: dict[str, FileRecord] = {}
            for path, f in raw["files"].items():
                _check_path(path)
                digest = str(f["sha256"])
                if not is_digest(digest):
                    raise ValueError(f"bad hash {digest!r} for {path}")
                version = f.get("version")
                files[path] = FileRecord(
                    path,
                    int(f["size"]),
                    datetime.fromisoformat(f["mtime"]),
                    None if f.get("etag") is None else str(f["etag"]),
                    digest,
                    None if version is None else str(version),
                )
            directories = frozenset(str(d) for d in raw["directories"])
            for d in directories:
                _check_path(d)
            links = {str(p): str(t) for p, t in raw.get("links", {}).items()}
            for p in links:
                _check_path(p)
            name = raw.get("name")
            root = raw.get("root")
            storage = raw.get("storage")
            snapshot = cls(
                expected_id,
                None if name is None else str(name),
                datetime.fromisoformat(raw["created_at"]),
                None if storage is None else str(storage),
                None if root is None else str(root),
                content,
                files,
                directories,
                links,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BlobIntegrityError(f"Malformed snapshot manifest {where}: {exc}") from None
        return snapshot, signed


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The one byte form of a JSON document that ids and MACs are taken of."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _authenticate(raw: dict[str, Any], key: SnapshotKey, where: str, accept_unsigned: bool) -> bool:
    """Refuse a manifest document not signed with ``key`` (an unsigned one unless
    ``accept_unsigned``); whether it is signed."""
    if raw.get("format") == UNSIGNED_FORMAT:
        if accept_unsigned:
            return False
        raise BlobIntegrityError(
            f"Snapshot manifest {where} is not signed (written by an agentvfs from before manifests were signed, "
            "or by someone else into the store): refusing it. If nothing but this host could ever have written "
            f"that store, read it with SnapshotStore(accept_unsigned=True) or {ACCEPT_UNSIGNED_ENV}=1"
        )
    body = {k: v for k, v in raw.items() if k != "mac"}
    if key.verify("manifest", canonical_json(body), raw.get("mac")):
        return True
    named = raw.get("key")
    other = f" (it names key {named})" if isinstance(named, str) and named != key.id else ""
    raise BlobIntegrityError(
        f"Snapshot manifest {where} is not signed with this host's snapshot key {key.id} ({key.source}){other}: "
        "it was written by someone else into the store (where the agent can write the store, by the agent) or "
        "by a host whose key this one lacks; refusing it. To trust the snapshots of another host, use its key "
        f"(copy its key file, then {KEY_FILE_ENV}=PATH or SnapshotStore(key=PATH)); to drop this one, delete it "
        "by its id"
    )


def _check_path(path: str) -> None:
    """Refuse a manifest path that is not a normalised relative path of the workspace (a
    manifest must never lead a restore outside the root, or into agentvfs's own data)."""
    try:
        normal = normalize_path(path) if isinstance(path, str) else None
    except OSError:  # ".." above the root, a NUL byte, a name too long
        normal = None
    if not path or normal != path or is_reserved(path):
        raise ValueError(f"invalid path {path!r}")
