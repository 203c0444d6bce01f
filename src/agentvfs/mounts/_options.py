"""Mount options: one typed record, parsed from a mapping or ``-o key=value`` strings."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkspaceError

__all__ = ["MountOptions", "parse_option_strings"]

_MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MountOptions:
    """How a mount behaves; every field has a default that suits an agent's workspace.

    Parameters
    ----------
    metadata_ttl : float
        Seconds the kernel and the mount trust cached attributes, directory listings and
        negative lookups before asking the backend again. Changes made through the mount or
        through the same filesystem object in this process are seen at once whatever this is;
        it bounds how long a change made directly in the storage can go unseen.
    part_size : int
        Bytes per ranged read of a remote file (the prefetch unit).
    prefetch_parts : int
        Parts read ahead (in parallel) once a handle reads sequentially.
    read_cache_bytes : int
        Memory shared by all read-ahead buffers and random-read windows of the mount.
    random_read_size : int
        Bytes fetched, aligned, around a random read of a remote file and kept for the same
        handle's next reads (a few more bytes per request, far fewer requests).
    staging_dir : str or None
        Directory for staged copies of files being written (default: a private temporary
        directory, removed at unmount).
    staging_limit : int
        Bytes of local disk the staged copies may take together; a write beyond it fails with
        ``ENOSPC``.
    state_dir : str or None
        Where the mount keeps the journal of its staged copies and the recovery area of what
        it could not publish (default: ``$AGENTVFS_STATE_DIR``, ``$XDG_STATE_HOME/agentvfs``
        or ``~/.local/state/agentvfs``). Staged copies of remote files live there too unless
        ``staging_dir`` is given. See ``agentvfs recover``.
    stop_timeout : float
        Seconds an unmount waits for files still open for writing to be closed; what is open
        after that is kept in the recovery area, not published.
    stream_threshold : int
        A file written from empty, in order, is uploaded while it is written (a multipart
        upload, parts of ``stream_part_size``) once it grows beyond this many bytes, where the
        storage supports it (object stores); smaller files go up in one request at close.
    stream_part_size : int
        Bytes per part of a streamed upload (S3 needs at least 5 MiB).
    rename_dir_limit : int
        Most entries a directory may hold to be renamed on a backend without atomic rename
        (copy then delete per file); beyond it rename returns ``EXDEV`` and tools such as
        ``mv`` fall back to copying.
    uid, gid : int
        Owner of files the backend keeps no owner for (default: the mounting process).
    file_mode, dir_mode : int
        Permission bits of files and directories the backend keeps none for.
    metadata : bool
        Keep modes, owners, times, symbolic links and FIFOs in storage, so that the next
        mount shows them: on local disk in the files themselves, on S3 and GCS in object
        metadata with the names s3fs-fuse, rclone and gcsfuse read (see
        ``docs/mount-semantics.md``). ``-o metadata=off`` writes no metadata headers: those
        then live as long as the mount, and symbolic links and FIFOs are refused with
        ``EPERM``. Stores that keep no metadata (memory) behave as ``off``.
    suid : bool
        Honour set-user-ID and set-group-ID bits of programs run from the mount. Off by
        default (``nosuid``): modes come from storage, where anyone who can write the bucket
        can set them; the bits are still kept and shown.
    allow_other : bool
        Let other users (processes of another uid) use the mount. Off by default: the
        mounting user (and the commands of a bubblewrap sandbox it starts, which are that
        user to the kernel) can use it; ``-o allow_other`` as root opens it to everyone.
    nonempty : bool
        Mount over a directory that has entries (they are hidden while mounted). Refused by
        default: a mistyped mount point would otherwise hide a project's files.
    writeback_cache : bool
        Let the kernel gather small writes into large ones. Off by default: the kernel then
        holds written data until the file is closed (no upload can stream while it is being
        written), may send pages out of order, and on local disk the page cache would hold
        every byte twice. Worth it for workloads of many tiny writes to remote storage.
        The kernel allows no passthrough with it.
    passthrough : bool
        On a local-directory filesystem, let the kernel read and write open files directly
        on disk (FUSE passthrough) where this installation and the kernel support it (see
        ``docs/mount-semantics.md``): reads and writes then cost what they cost on the disk.
    read_ahead_kb : int
        Kernel read-ahead of the mount, set through sysfs when permitted (0 keeps the kernel's).
    max_background : int
        Kernel limit of concurrent background requests, set through fusectl when permitted.
    cache : bool
        Keep the files read from remote storage (S3, GCS) in a persistent cache on local
        disk, shared with later mounts and other processes (see
        :class:`~agentvfs.vfs.ContentCache`): a file read again, in this mount or the next,
        is served from local disk while its version in storage is unchanged (checked at open,
        within ``metadata_ttl``). The small files of a directory being read one after another
        are fetched ahead, several at a time. Off by default; ``cache_dir`` turns it on.
    cache_dir : str or None
        The cache's directory (default: ``$AGENTVFS_CACHE_DIR``, ``$XDG_CACHE_HOME/agentvfs``
        or ``~/.cache/agentvfs``); giving one turns the cache on.
    cache_bytes : int
        The most local disk the cache may take; least recently used files go first.
    max_tasks : int
        Most FUSE requests served concurrently.
    fsname : str
        Name shown as the mount's source in ``mount`` and ``df``.
    debug : bool
        Log every FUSE request.
    """

    metadata_ttl: float = 5.0
    part_size: int = 16 * _MiB
    prefetch_parts: int = 6
    read_cache_bytes: int = 256 * _MiB
    random_read_size: int = _MiB
    staging_dir: str | None = None
    staging_limit: int = 8 * 1024 * _MiB
    state_dir: str | None = None
    stop_timeout: float = 10.0
    stream_threshold: int = 320 * _MiB
    stream_part_size: int = 64 * _MiB
    rename_dir_limit: int = 1000
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    file_mode: int = 0o644
    dir_mode: int = 0o755
    metadata: bool = True
    suid: bool = False
    allow_other: bool = False
    nonempty: bool = False
    writeback_cache: bool = False
    passthrough: bool = True
    read_ahead_kb: int = 1024
    max_background: int = 64
    cache: bool = False
    cache_dir: str | None = None
    cache_bytes: int = 4 * 1024 * _MiB
    max_tasks: int = 64
    fsname: str = "agentvfs"
    debug: bool = False

    @classmethod
    def from_value(cls, value: MountOptions | Mapping[str, Any] | None) -> MountOptions:
        """Build options from ``None``, a mapping of field names, or options themselves.

        Raises
        ------
        WorkspaceError
            ``INVALID_CONFIG``: an unknown name or a value of the wrong kind.
        """
        if value is None:
            return cls()
        if isinstance(value, MountOptions):
            return value
        if not isinstance(value, Mapping):
            raise WorkspaceError(f"mount options must be a mapping, not {type(value).__name__}", "INVALID_CONFIG")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in value.items():
            name = str(key).replace("-", "_")
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise WorkspaceError(
                    f"Unknown mount option {key!r}{hint}; known: {', '.join(sorted(known))}", "INVALID_CONFIG"
                )
            kwargs[name] = _coerce(name, raw, cls.__dataclass_fields__[name].type)
        return cls(**kwargs)


_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    """An integer as ``-o`` gives it: ``4096``, ``0x1000``, ``0o755``, or a size with a binary
    unit (``64MiB``, ``64M``, ``2GiB``, ``512k``)."""
    cleaned = text.strip().replace("_", "")
    lowered = cleaned.lower().removesuffix("ib").removesuffix("b")
    if lowered and lowered[-1] in _UNITS and lowered[:-1].strip().isdigit():
        return int(lowered[:-1]) * _UNITS[lowered[-1]]
    return int(cleaned, 0)


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    kind = str(annotation)
    try:
        if kind == "bool":
            if isinstance(raw, str):
                lowered = raw.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(raw)
                return lowered in ("1", "true", "yes", "on")
            if not isinstance(raw, bool):
                raise ValueError(raw)
            return raw
        if kind == "int":
            if isinstance(raw, bool):
                raise ValueError(raw)
            value = _size(raw) if isinstance(raw, str) else int(raw)
            if value < 0:
                raise ValueError(raw)
            return value
        if kind == "float":
            value_f = float(raw)
            if value_f < 0:
                raise ValueError(raw)
            return value_f
        if kind == "str | None":
            return None if raw is None else str(raw)
        if kind == "bool | None":
            return None if raw is None else _coerce(name, raw, "bool")
        return str(raw)
    except (TypeError, ValueError):
        raise WorkspaceError(
            f"Invalid value {raw!r} for mount option {name!r} (expected {kind}, not negative)", "INVALID_CONFIG"
        ) from None


def parse_option_strings(items: Iterable[str]) -> dict[str, str]:
    """Turn ``["a=1", "b=x,c=2"]`` (``-o`` arguments) into a mapping; a bare ``flag`` means
    ``flag=true``."""
    out: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            out[key.strip()] = value.strip() if sep else "true"
    return out
