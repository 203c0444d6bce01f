"""Content a bucket keeps by version: S3 object versions, GCS object generations.

Where a workspace's bucket keeps every version of an object (S3 bucket versioning
``Enabled``; GCS object versioning), a snapshot copies no data: it records the version of
each object (``VersionId``, generation) and reads that version back later. Everything here
is a storage request of the bucket's own API through the fsspec instance under the
workspace (s3fs, gcsfs).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import FileNotFound
from ..vfs import (
    FsspecFilesystem,
    GcsBackend,
    S3Backend,
    WorkspaceFilesystem,
    WrapperFilesystem,
    run_sync,
)
from ._manifest import ContentKind, is_reserved

__all__ = ["Listed", "PinnedContent", "pinned_content", "pinned_reader", "unwrapped"]

_log = logging.getLogger("agentvfs.snapshots")


@dataclass(frozen=True, slots=True)
class Listed:
    """One current object below the workspace root, as one listing record shows it (its
    version, ETag, size and time belong to one and the same version)."""

    path: str
    version: str
    etag: str | None
    size: int
    modified_at: datetime


def unwrapped(fs: WorkspaceFilesystem) -> WorkspaceFilesystem:
    """``fs`` without the wrappers around it (a timeout wrapper)."""
    while isinstance(fs, WrapperFilesystem):
        fs = fs.inner
    return fs


class PinnedContent(ABC):
    """Objects of one bucket below a root, read by version.

    Parameters
    ----------
    fs : Any
        The fsspec instance (s3fs, gcsfs).
    root : str
        The storage path of the workspace root (``bucket/prefix``).
    """

    kind: ContentKind

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root.strip("/")

    def key_of(self, path: str) -> str:
        """The storage path of the workspace path ``path``."""
        return f"{self.root}/{path}" if path else self.root

    @abstractmethod
    async def enabled(self) -> bool:
        """Whether the bucket keeps earlier versions of its objects now."""

    @abstractmethod
    async def current(self) -> dict[str, Listed]:
        """Every current object below the root but directory markers and agentvfs's own
        data, by workspace path, from one (paginated) listing."""

    @abstractmethod
    async def read(self, path: str, version: str) -> bytes:
        """The content of ``version`` of the object of ``path``.

        Raises
        ------
        FileNotFound
            The bucket no longer has that version (deleted, or expired by a lifecycle rule).
        """

    def _relative(self, storage_path: str) -> str | None:
        head = self.root + "/"
        if not storage_path.startswith(head):
            return None
        rel = storage_path[len(head) :]
        if not rel or rel.endswith("/") or is_reserved(rel):
            return None
        return rel


class S3Versions(PinnedContent):
    """S3 object versions (``VersionId``) of a bucket with versioning enabled."""

    kind: ContentKind = "s3-versions"

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.root.partition("/")
        return bucket, key

    async def enabled(self) -> bool:
        bucket, _ = self._bucket_key()
        try:
            out = await run_sync(lambda: self.fs.call_s3("get_bucket_versioning", Bucket=bucket))
        except Exception as exc:  # no permission to ask: treat as unversioned (copies blobs)
            _log.info("cannot tell whether bucket %s keeps versions (%s): contents are copied", bucket, exc)
            return False
        # "Suspended" keeps old versions but overwrites the "null" one: not a place to pin.
        return bool(out.get("Status") == "Enabled")

    async def current(self) -> dict[str, Listed]:
        bucket, key = self._bucket_key()
        prefix = f"{key}/" if key else ""

        def listing() -> dict[str, Listed]:
            found: dict[str, Listed] = {}
            markers: dict[str, str] = {}
            while True:
                out = self.fs.call_s3("list_object_versions", Bucket=bucket, Prefix=prefix, **markers)
                for v in out.get("Versions", []):
                    if not v.get("IsLatest"):
                        continue
                    rel = self._relative(f"{bucket}/{v['Key']}")
                    if rel is None:
                        continue
                    modified = v.get("LastModified")
                    found[rel] = Listed(
                        rel,
                        str(v["VersionId"]),
                        str(v["ETag"]).strip('"') if v.get("ETag") else None,
                        int(v.get("Size") or 0),
                        modified if isinstance(modified, datetime) else datetime.now(UTC),
                    )
                if not out.get("IsTruncated"):
                    return found
                markers = {"KeyMarker": out["NextKeyMarker"], "VersionIdMarker": out["NextVersionIdMarker"]}

        return await run_sync(listing)

    async def read(self, path: str, version: str) -> bytes:
        key = self.key_of(path)
        try:
            data = await run_sync(lambda: self.fs.cat_file(key, version_id=version, max_concurrency=1))
        except (FileNotFoundError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or "NoSuchVersion" in str(exc) or "InvalidArgument" in str(exc):
                raise FileNotFound(f"{path} (version {version} of s3://{key} is gone)") from exc
            raise
        return bytes(data)


class GcsGenerations(PinnedContent):
    """GCS object generations of a bucket with object versioning enabled."""

    kind: ContentKind = "gcs-generations"

    async def enabled(self) -> bool:
        bucket = self.root.partition("/")[0]
        try:
            out = await run_sync(lambda: self.fs.call("GET", "b/{}", bucket, json_out=True))
        except Exception as exc:
            _log.info("cannot tell whether bucket %s keeps versions (%s): contents are copied", bucket, exc)
            return False
        return bool(isinstance(out, dict) and (out.get("versioning") or {}).get("enabled"))

    async def current(self) -> dict[str, Listed]:
        def listing() -> dict[str, Listed]:
            self.fs.invalidate_cache(self.root)
            found: dict[str, Listed] = {}
            for name, info in self.fs.find(self.root, detail=True, withdirs=False).items():
                rel = self._relative(name)
                if rel is None or info.get("generation") is None:
                    continue
                updated = info.get("updated") or info.get("mtime")
                modified = (
                    updated if isinstance(updated, datetime)
                    else datetime.fromisoformat(str(updated).replace("Z", "+00:00")) if updated
                    else datetime.now(UTC)
                )  # fmt: skip
                generation = str(info["generation"])
                found[rel] = Listed(rel, generation, generation, int(info.get("size") or 0), modified)
            return found

        return await run_sync(listing)

    async def read(self, path: str, version: str) -> bytes:
        key = self.key_of(path)
        try:
            data = await run_sync(lambda: self.fs.cat_file(key, generation=version))
        except FileNotFoundError as exc:
            raise FileNotFound(f"{path} (generation {version} of gs://{key} is gone)") from exc
        return bytes(data)


def _kind_of(fs: WorkspaceFilesystem) -> tuple[type[PinnedContent], FsspecFilesystem] | None:
    inner = unwrapped(fs)
    if not isinstance(inner, FsspecFilesystem):
        return None
    if isinstance(inner.backend, S3Backend):
        return S3Versions, inner
    if isinstance(inner.backend, GcsBackend):
        return GcsGenerations, inner
    return None


async def pinned_content(fs: WorkspaceFilesystem) -> PinnedContent | None:
    """The versions of the bucket under ``fs`` where it keeps them (S3 versioning enabled,
    GCS object versioning), else None: contents must then be copied to be kept."""
    found = _kind_of(fs)
    if found is None:
        return None
    cls, inner = found
    source = cls(inner.fs, inner.root)
    return source if await source.enabled() else None


def pinned_reader(fs: WorkspaceFilesystem, kind: ContentKind, root: str | None) -> PinnedContent:
    """A reader of the versions a snapshot of kind ``kind`` pinned below ``root``, through
    the bucket ``fs`` is on.

    Raises
    ------
    ValueError
        ``fs`` is not on the kind of bucket the snapshot's versions are in.
    """
    found = _kind_of(fs)
    if found is None or found[0].kind != kind or root is None:
        store = "an S3 bucket" if kind == "s3-versions" else "a GCS bucket"
        raise ValueError(
            f"this snapshot keeps its contents as object versions of {store} ({root}); "
            f"read it through a filesystem on that bucket, not {type(unwrapped(fs)).__name__}"
        )
    cls, inner = found
    return cls(inner.fs, root)
