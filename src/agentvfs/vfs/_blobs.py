"""Content-addressed blobs on any workspace filesystem.

A :class:`BlobStore` keeps file contents under a directory of a filesystem, each named by
the SHA-256 of its bytes::

    <prefix>/blobs/<h[:2]>/<h>

Storing the same bytes twice writes nothing; a blob is never replaced (it is written only
where nothing is), and every read is checked against the name, so a blob changed in storage
is refused, never served. Published skill versions and workspace snapshots keep their
contents this way, in the same layout.
"""

from __future__ import annotations

import hashlib
import re

from ..errors import BlobIntegrityError, FileExists
from . import _paths
from ._base import WorkspaceFilesystem, put_new, walk

__all__ = ["BlobStore", "is_digest", "sha256_hex"]

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 of ``data`` as 64 lowercase hex digits: the name of its blob."""
    return hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    """Whether ``text`` is a SHA-256 hex digest (64 lowercase hex digits)."""
    return bool(_DIGEST.match(text))


class BlobStore:
    """Blobs named by their SHA-256 under ``<prefix>/blobs`` of ``fs``.

    Parameters
    ----------
    fs : WorkspaceFilesystem
        Where the blobs are kept.
    prefix : str
        The directory of ``fs`` holding ``blobs/`` (``""``: its root).
    """

    def __init__(self, fs: WorkspaceFilesystem, prefix: str = "") -> None:
        self.fs = fs
        self.prefix = _paths.normalize(prefix)

    def path(self, digest: str) -> str:
        """Where the blob named ``digest`` is kept.

        Raises
        ------
        ValueError
            ``digest`` is not a SHA-256 hex digest.
        """
        if not is_digest(digest):
            raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
        return _paths.join(self.prefix, f"blobs/{digest[:2]}/{digest}")

    async def has(self, digest: str) -> bool:
        """Whether the blob ``digest`` is stored (one ``stat``)."""
        return await self.fs.exists(self.path(digest))

    async def digests(self) -> set[str]:
        """Every stored blob's name, from one listing of the tree (none: an empty set)."""
        root = _paths.join(self.prefix, "blobs")
        try:
            entries = await walk(self.fs, root, max_depth=2)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {
            e.name.rsplit("/", 1)[-1]
            for e in entries
            if e.type == "file" and is_digest(e.name.rsplit("/", 1)[-1])
        }

    async def put(self, data: bytes, *, digest: str | None = None, absent: bool = False) -> tuple[str, bool]:
        """Store ``data`` under its hash unless a blob of that name is there; return the hash
        and whether it was written.

        ``digest``, when the caller has hashed ``data`` already, saves hashing it again (it
        must be the hash of ``data``). ``absent`` says the caller found no such blob (in
        :meth:`digests`): the write is then not preceded by a ``stat`` of its own (the
        write itself still refuses to replace one that appeared since)."""
        name = digest if digest is not None else sha256_hex(data)
        path = self.path(name)
        if not absent and await self.fs.exists(path):
            return name, False
        try:
            # Nothing but blobs is written below blobs/: one create-only PUT on object stores,
            # with no listing of a parent whose kept listing expired.
            await put_new(self.fs, path, bytes(data))
        except FileExists:
            return name, False  # a concurrent writer stored the same bytes
        return name, True

    async def get(self, digest: str, *, name: str | None = None) -> bytes:
        """The content of the blob ``digest``, checked against it.

        Parameters
        ----------
        digest : str
            The blob's name.
        name : str, optional
            What the blob is the content of, for the error message.

        Raises
        ------
        FileNotFound
            No such blob.
        BlobIntegrityError
            The stored bytes do not hash to ``digest`` (they are not returned).
        """
        data = await self.fs.read_file(self.path(digest))
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        actual = sha256_hex(raw)
        if actual != digest:
            what = f" (file: {name})" if name else ""
            raise BlobIntegrityError(
                f"Blob content does not match hash {digest}{what}: it hashes to {actual}; refusing to serve it"
            )
        return raw

    def __repr__(self) -> str:
        return f"BlobStore(fs={self.fs!r}, prefix={self.prefix!r})"
