"""POSIX attributes of a file kept in storage: natively on local disk, as object metadata on
object stores.

An object store has no modes, owners, symbolic links or FIFOs; a mount keeps them in each
object's user metadata under the names the other FUSE mounts of those stores read, so that
a bucket looks the same through any of them:

============  ===========================================  ===================================
key           value                                        read by
============  ===========================================  ===================================
``mode``      ``st_mode`` in decimal, file-type bits too   s3fs-fuse
``uid``       owner, decimal                               s3fs-fuse
``gid``       group, decimal                               s3fs-fuse
``mtime``     seconds since the epoch (``1700000000.5``)   s3fs-fuse, rclone (S3); RFC 3339 on
                                                           GCS, as rclone writes it there
``atime``     the same, access time                        s3fs-fuse
``ctime``     the same, status-change time                 s3fs-fuse
============  ===========================================  ===================================

On GCS a file's modification time also goes to ``gcsfuse_mtime`` and a symbolic link's target
to ``gcsfuse_symlink_target`` (gcsfuse's names). A symbolic link is an object whose content
is its target and whose ``mode`` has ``S_IFLNK`` (s3fs-fuse's form); a FIFO, socket or device
node is an empty object whose ``mode`` says which. Every other metadata key is someone
else's and is carried over unchanged by every rewrite.
"""

from __future__ import annotations

import dataclasses
import stat as stat_module
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._records import FileStat

__all__ = [
    "OWN_KEYS",
    "PosixAttributes",
    "attributes_from_metadata",
    "foreign_metadata",
    "metadata_for",
    "with_posix_attributes",
]

#: How a store spells its metadata: the s3fs-fuse names, or those with gcsfuse's on GCS.
MetadataStyle = Literal["s3", "gcs"]

_SYMLINK_KEY = "gcsfuse_symlink_target"
_GCSFUSE_MTIME = "gcsfuse_mtime"
#: Every key this module writes (and so replaces on a rewrite).
OWN_KEYS = frozenset(
    {"mode", "uid", "gid", "rdev", "mtime", "atime", "ctime", _GCSFUSE_MTIME, _SYMLINK_KEY}
)
#: Longest symbolic-link target kept (PATH_MAX; s3fs-fuse keeps it in the content too).
_TARGET_MAX = 4096


@dataclass(frozen=True, slots=True)
class PosixAttributes:
    """What ``stat(2)`` shows of a file beyond its size and content.

    Attributes
    ----------
    mode : int
        ``st_mode``: the file-type bits (``S_IFREG``, ``S_IFLNK``, ``S_IFIFO``...) and the
        permission bits.
    uid, gid : int, optional
        Owner and group.
    atime_ns, mtime_ns, ctime_ns : int, optional
        Access, modification and status-change times in nanoseconds since the epoch.
    target : str, optional
        A symbolic link's target.
    rdev : int
        A device node's device number.
    """

    mode: int
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    target: str | None = None
    rdev: int = 0

    @property
    def kind(self) -> int:
        """The file-type bits of :attr:`mode` (``S_IFREG`` where none are set)."""
        return stat_module.S_IFMT(self.mode) or stat_module.S_IFREG

    @property
    def perm(self) -> int:
        """The permission bits of :attr:`mode`."""
        return stat_module.S_IMODE(self.mode)

    @property
    def owner(self) -> tuple[int, int] | None:
        """``(uid, gid)`` for ``chown(2)`` (-1 for the one not given), None for neither."""
        if self.uid is None and self.gid is None:
            return None
        return (-1 if self.uid is None else self.uid, -1 if self.gid is None else self.gid)

    @property
    def times_ns(self) -> tuple[int, int] | None:
        """``(atime_ns, mtime_ns)`` for ``utime(2)`` when both are given, else None."""
        if self.atime_ns is None or self.mtime_ns is None:
            return None
        return (self.atime_ns, self.mtime_ns)


def _seconds(ns: int) -> str:
    whole, frac = divmod(ns, 1_000_000_000)
    # Nine digits always: s3fs-fuse reads the part after the point as nanoseconds.
    return str(whole) if not frac else f"{whole}.{frac:09d}"


def _rfc3339(ns: int) -> str:
    whole, frac = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{moment}.{frac:09d}Z" if frac else f"{moment}Z"


def _parse_time(text: str) -> int | None:
    """Nanoseconds of ``1700000000``, ``1700000000.25`` (s3fs-fuse, rclone on S3) or an
    RFC 3339 time (rclone on GCS, gcsfuse); None for anything else."""
    text = text.strip()
    if not text or len(text) > 64 or not text.isascii():
        return None
    whole, dot, frac = text.partition(".")
    if whole.lstrip("-").isdigit() and (not dot or frac.isdigit()) and not (whole.startswith("-") and frac):
        value = int(whole) * 1_000_000_000 + (int(frac[:9].ljust(9, "0")) if frac else 0)
        return value if -_NS_MAX <= value <= _NS_MAX else None
    try:
        base, _, rest = text.partition(".")
        nanos = 0
        if rest:
            digits = "".join(c for c in rest if c.isdigit())
            zone = rest[len(digits) :]
            nanos = int(digits[:9].ljust(9, "0")) if digits else 0
            text = base + zone
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    value = int(moment.timestamp()) * 1_000_000_000 + nanos
    return value if -_NS_MAX <= value <= _NS_MAX else None


#: The file types a ``mode`` may name; anything else reads as a regular file.
_KINDS = frozenset({
    stat_module.S_IFREG, stat_module.S_IFDIR, stat_module.S_IFLNK, stat_module.S_IFIFO,
    stat_module.S_IFSOCK, stat_module.S_IFCHR, stat_module.S_IFBLK,
})  # fmt: skip
_ID_MAX = 2**32 - 2  # (uid_t)-1 means "none"
_NS_MAX = 2**63 - 1


def _parse_int(text: str | None, limit: int) -> int | None:
    """A decimal in 0..``limit`` (metadata is written by anyone with access to the bucket:
    anything else counts as absent)."""
    if text is None:
        return None
    text = text.strip()
    # ASCII digits only: str.isdigit() takes "²", which int() refuses.
    if text.isascii() and text.isdigit() and len(text) <= 20 and int(text) <= limit:
        return int(text)
    return None


def _parse_mode(text: str | None) -> int | None:
    mode = _parse_int(text, 0o177777)
    if mode is None:
        return None
    if stat_module.S_IFMT(mode) and stat_module.S_IFMT(mode) not in _KINDS:
        return stat_module.S_IFREG | stat_module.S_IMODE(mode)
    return mode


def metadata_for(
    attrs: PosixAttributes, style: MetadataStyle, keep: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The object metadata that holds ``attrs`` on a store of ``style``, with the foreign
    keys of ``keep`` (another tool's) carried over."""
    out = {k: v for k, v in (keep or {}).items() if k not in OWN_KEYS}
    out["mode"] = str(attrs.mode)
    if attrs.uid is not None:
        out["uid"] = str(attrs.uid)
    if attrs.gid is not None:
        out["gid"] = str(attrs.gid)
    if attrs.rdev:
        out["rdev"] = str(attrs.rdev)  # s3fs-fuse's name
    when = _rfc3339 if style == "gcs" else _seconds
    for key, value in (
        ("mtime", attrs.mtime_ns),
        ("atime", attrs.atime_ns),
        ("ctime", attrs.ctime_ns),
    ):
        if value is not None:
            out[key] = when(value)
    if style == "gcs":
        if attrs.mtime_ns is not None:
            out[_GCSFUSE_MTIME] = _rfc3339(attrs.mtime_ns)
        if attrs.kind == stat_module.S_IFLNK and attrs.target is not None:
            out[_SYMLINK_KEY] = attrs.target
    return out


def foreign_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The keys of ``metadata`` this module does not own."""
    return {k: v for k, v in (metadata or {}).items() if k not in OWN_KEYS}


def attributes_from_metadata(
    metadata: Mapping[str, str] | None, content: bytes | None = None
) -> PosixAttributes | None:
    """The attributes an object's metadata holds (any peer's names), or None where it holds
    none. ``mode`` 0 or unparsable counts as absent; a symbolic link's target comes from
    gcsfuse's key, else from ``content`` where given (s3fs-fuse keeps it there)."""
    if not metadata:
        return None
    meta = {k.lower(): v for k, v in metadata.items()}
    mode = _parse_mode(meta.get("mode"))
    target = meta.get(_SYMLINK_KEY)
    if target is not None:
        mode = stat_module.S_IFLNK | (stat_module.S_IMODE(mode) if mode else 0o777)
    mtime = _parse_time(meta["mtime"]) if "mtime" in meta else None
    if mtime is None and _GCSFUSE_MTIME in meta:
        mtime = _parse_time(meta[_GCSFUSE_MTIME])
    atime = _parse_time(meta["atime"]) if "atime" in meta else None
    ctime = _parse_time(meta["ctime"]) if "ctime" in meta else None
    uid, gid = _parse_int(meta.get("uid"), _ID_MAX), _parse_int(meta.get("gid"), _ID_MAX)
    rdev = _parse_int(meta.get("rdev"), 2**64 - 1) or 0
    if target is not None and (not target or len(target.encode("utf-8", "surrogateescape")) >= _TARGET_MAX):
        target = None  # no link has an empty target or one longer than PATH_MAX
    if not mode and mtime is None and uid is None and gid is None:
        return None
    if (
        mode is not None
        and stat_module.S_IFMT(mode) == stat_module.S_IFLNK
        and target is None
        and content is not None
    ):
        target = content[:_TARGET_MAX].decode("utf-8", "surrogateescape")
    return PosixAttributes(
        mode=mode or 0,
        uid=uid,
        gid=gid,
        atime_ns=atime,
        mtime_ns=mtime,
        ctime_ns=ctime,
        target=target,
        rdev=rdev,
    )


def with_posix_attributes(stat: FileStat, attrs: PosixAttributes | None) -> FileStat:
    """``stat`` with the attributes ``attrs`` in its POSIX fields (unchanged for None). A
    file-type that does not fit the entry (a directory's bits on an object) is left out."""
    if attrs is None:
        return stat
    kind = attrs.kind
    special = None
    if stat.type == "file" and kind not in (stat_module.S_IFREG, stat_module.S_IFDIR):
        special = kind
    return dataclasses.replace(
        stat,
        mode=attrs.perm if attrs.mode else stat.mode,
        uid=attrs.uid if attrs.uid is not None else stat.uid,
        gid=attrs.gid if attrs.gid is not None else stat.gid,
        atime_ns=attrs.atime_ns if attrs.atime_ns is not None else stat.atime_ns,
        mtime_ns=attrs.mtime_ns if attrs.mtime_ns is not None else stat.mtime_ns,
        ctime_ns=attrs.ctime_ns if attrs.ctime_ns is not None else stat.ctime_ns,
        file_kind=special,
        link_target=attrs.target if special == stat_module.S_IFLNK else None,
        rdev=attrs.rdev or None,
    )
