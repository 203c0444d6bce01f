"""``CompositeFilesystem``: several filesystems mounted at directories of one tree."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import FileExists, FileNotFound, IsDirectory, NoMountError, PermissionDenied
from ._base import (
    SupportsGrep,
    WorkspaceFilesystem,
    drop_hidden,
    filter_extension,
    new_id,
    read_file_beneath,
    read_many,
    read_range,
    read_range_into,
    walk,
    walk_stats,
    walk_stats_by_listing,
)
from ._records import FileEntry, FileStat, GrepFileResult, MountInfo

if TYPE_CHECKING:
    from .._context import RequestContext

__all__ = ["CompositeFilesystem", "normalize_mount_path"]

logger = logging.getLogger("agentvfs")


def normalize_mount_path(path: str) -> str:
    """Canonical mount-table form: leading ``/``, no trailing ``/``, ``""``/``.`` -> ``/``."""
    norm = posixpath.normpath("/" + path.strip().lstrip("/")) if path.strip() not in ("", ".") else "/"
    return "/" if norm in ("//", "/.") else norm


class CompositeFilesystem(WorkspaceFilesystem):
    """Route each path to the filesystem mounted at its longest matching mount path.

    ``/local/doc.txt``, ``local/doc.txt`` and ``./local/doc.txt`` name the same file; the
    mounted filesystem receives the remainder without a leading slash. Directories above
    mount points are synthetic: they exist, list their mount points and cannot be written.

    Parameters
    ----------
    mounts : mapping of str to WorkspaceFilesystem
        Mount path -> filesystem. Nested mount paths are refused.
    default_mount : str, optional
        A mount path that also serves paths no mount matches (``notes.txt`` is then
        ``/workspace/notes.txt``), for a tool user who does not write the prefix. Synthetic
        directories (the root) still list the mount points. None (the default, as the
        reference): such a path is a ``NoMountError``.

    Raises
    ------
    ValueError
        No mounts, or a mount path nested under another.
    """

    name = "CompositeFilesystem"
    provider = "composite"

    def __init__(
        self, mounts: Mapping[str, WorkspaceFilesystem], *, id: str | None = None, default_mount: str | None = None
    ) -> None:
        super().__init__(id=id or new_id("cfs").rsplit("-", 1)[0])
        if not mounts:
            raise ValueError("CompositeFilesystem requires at least one mount")
        table: dict[str, WorkspaceFilesystem] = {}
        for raw, fs in mounts.items():
            table[normalize_mount_path(raw)] = fs
        for a in table:
            for b in table:
                if a != b and (b == "/" or a.startswith(b.rstrip("/") + "/")):
                    raise ValueError(f'Nested mount paths are not supported: "{a}" is nested under "{b}"')
        self._mounts = table
        # Longest first, so the first prefix that matches is the longest.
        self._order = sorted(table, key=len, reverse=True)
        self.default_mount = default_mount
        self.read_only = all(fs.read_only for fs in table.values())
        self.status = "ready"

    # -- routing ------------------------------------------------------------------------------------

    @property
    def mounts(self) -> Mapping[str, WorkspaceFilesystem]:
        """The mount table (read-only view)."""
        return MappingProxyType(self._mounts)

    @property
    def default_mount(self) -> str | None:
        """The mount that serves paths no mount matches, or None; see the class."""
        return self._default

    @default_mount.setter
    def default_mount(self, value: str | None) -> None:
        if value is not None:
            value = normalize_mount_path(value)
            if value not in self._mounts:
                raise ValueError(f"default_mount {value!r} is not one of the mount paths: {', '.join(self._mounts)}")
        self._default = value

    @property
    def mount_paths(self) -> list[str]:
        """The mount paths, in the order given."""
        return list(self._mounts)

    def _resolve(self, path: str) -> tuple[str, WorkspaceFilesystem, str] | None:
        norm = normalize_mount_path(path)
        for mount in self._order:
            if norm == mount:
                return mount, self._mounts[mount], ""
            if mount == "/" or norm.startswith(mount + "/"):
                return mount, self._mounts[mount], norm[len(mount) :].lstrip("/")
        if self._default is not None and self._virtual_children(path) is None:
            return self._default, self._mounts[self._default], norm.lstrip("/")
        return None

    def _route(self, path: str, kind: str = "path") -> tuple[str, WorkspaceFilesystem, str]:
        found = self._resolve(path)
        if found is None:
            raise NoMountError(path, kind)
        return found

    def get_filesystem_for_path(self, path: str) -> WorkspaceFilesystem | None:
        """Return the filesystem that serves ``path``, or None."""
        found = self._resolve(path)
        return found[1] if found else None

    def get_mount_path_for_path(self, path: str) -> str | None:
        """Return the mount path that serves ``path``, or None."""
        found = self._resolve(path)
        return found[0] if found else None

    def _virtual_children(self, path: str) -> list[str] | None:
        """Names of mount segments directly below a synthetic directory (None if not one)."""
        norm = normalize_mount_path(path)
        head = "/" if norm == "/" else norm + "/"
        names: list[str] = []
        for mount in self._mounts:
            if mount != norm and mount.startswith(head):
                name = mount[len(head) :].split("/", 1)[0]
                if name not in names:
                    names.append(name)
        return names or None

    def _writable_mount(self, path: str, operation: str, kind: str = "path") -> tuple[WorkspaceFilesystem, str]:
        _, fs, rest = self._route(path, kind)
        if fs.read_only:
            raise PermissionDenied(path, f"{operation} (filesystem is read-only)")
        return fs, rest

    @staticmethod
    def _mount_info(fs: WorkspaceFilesystem) -> MountInfo:
        return MountInfo(
            provider=fs.provider,
            icon=fs.icon,
            display_name=fs.display_name,
            description=fs.description,
            status=fs.status,
            error=fs.error,
        )

    def _synthetic(self, path: str) -> FileStat:
        norm = normalize_mount_path(path)
        now = datetime.now(UTC)
        return FileStat(
            name=posixpath.basename(norm), path=norm, type="directory", size=0,
            created_at=now, modified_at=now,
        )

    # -- operations ----------------------------------------------------------------------------------

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """Read through the owning mount."""
        found = self._resolve(path)
        if found is None:
            if self._virtual_children(path) is not None:
                raise IsDirectory(path)
            raise NoMountError(path)
        return await found[1].read_file(found[2], encoding=encoding)

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        recursive: bool = True,
        overwrite: bool = True,
        mime_type: str | None = None,
        expected_mtime: datetime | FileStat | None = None,
    ) -> None:
        """Write through the owning mount (refused on a read-only mount)."""
        fs, rest = self._writable_mount(path, "write_file")
        await fs.write_file(
            rest, content, recursive=recursive, overwrite=overwrite, mime_type=mime_type,
            expected_mtime=expected_mtime,
        )

    async def append_file(self, path: str, content: str | bytes) -> None:
        """Append through the owning mount."""
        fs, rest = self._writable_mount(path, "append_file")
        await fs.append_file(rest, content)

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        """Delete through the owning mount."""
        fs, rest = self._writable_mount(path, "delete_file")
        await fs.delete_file(rest, force=force)

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Create a directory in the owning mount; synthetic directories already exist."""
        if self._resolve(path) is None and self._virtual_children(path) is not None:
            return
        fs, rest = self._writable_mount(path, "mkdir")
        await fs.mkdir(rest, recursive=recursive)

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Remove a directory in the owning mount; mount points cannot be removed."""
        _, fs, rest = self._route(path)
        if not rest:
            raise PermissionDenied(path, "rmdir (a mount point cannot be removed)")
        if fs.read_only:
            raise PermissionDenied(path, "rmdir (filesystem is read-only)")
        await fs.rmdir(rest, recursive=recursive, force=force)

    async def copy_file(
        self, src: str, dest: str, *, overwrite: bool = True, recursive: bool = False
    ) -> None:
        """Copy within a mount natively, or across mounts by reading and writing."""
        _, sfs, srest = self._route(src, "source")
        dfs, drest = self._writable_mount(dest, "copy_file", "dest")
        if sfs is dfs:
            await sfs.copy_file(srest, drest, overwrite=overwrite, recursive=recursive)
            return
        info = await sfs.stat(srest)
        if info.type == "directory":
            if not recursive:
                raise IsDirectory(src)
            await self._copy_tree(src, dest, overwrite=overwrite)
            return
        await dfs.write_file(drest, await sfs.read_file(srest), overwrite=overwrite)

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        """Move within a mount natively, or across mounts as copy then delete."""
        _, sfs, srest = self._route(src, "source")
        if sfs.read_only:
            raise PermissionDenied(src, "move_file (filesystem is read-only)")
        dfs, drest = self._writable_mount(dest, "move_file", "dest")
        if sfs is dfs:
            await sfs.move_file(srest, drest, overwrite=overwrite)
            return
        info = await sfs.stat(srest)
        if info.type == "directory":
            # A tree copy without overwrite skips existing files; deleting the source after
            # it would lose them, so an existing destination is refused first.
            if not overwrite and await dfs.exists(drest):
                raise FileExists(dest)
            await self.copy_file(src, dest, overwrite=True, recursive=True)
            await sfs.rmdir(srest, recursive=True)
            return
        await dfs.write_file(drest, await sfs.read_file(srest), overwrite=overwrite)
        await sfs.delete_file(srest)

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        """List a mount's directory, or the mount points below a synthetic directory."""
        found = self._resolve(path)
        if found is not None:
            return await found[1].readdir(found[2], recursive=recursive, extension=extension, max_depth=max_depth)
        names = self._virtual_children(path)
        if names is None:
            raise NoMountError(path)
        norm = normalize_mount_path(path)
        out: list[FileEntry] = []
        for name in sorted(names):
            child = posixpath.join(norm, name)
            fs = self._mounts.get(child)
            out.append(FileEntry(name=name, type="directory", mount=self._mount_info(fs) if fs else None))
            depth = max_depth or 100
            if recursive and depth > 1:
                for entry in await self.readdir(child, recursive=True, max_depth=depth - 1):
                    out.append(
                        FileEntry(
                            name=f"{name}/{entry.name}", type=entry.type, size=entry.size,
                            is_symlink=entry.is_symlink, symlink_target=entry.symlink_target,
                            mount=entry.mount,
                        )
                    )
        return filter_extension(out, extension)

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """Walk the mount that owns ``path`` natively, or every mount below a synthetic dir."""
        found = self._resolve(path)
        if found is not None:
            return await walk(found[1], found[2], max_depth=max_depth, include_hidden=include_hidden)
        entries = await self.readdir(path, recursive=True, max_depth=max_depth)
        return entries if include_hidden else drop_hidden(entries)

    async def walk_stats(self, path: str = "", *, max_depth: int | None = None) -> list[tuple[str, FileStat]]:
        """The files below ``path`` with their metadata: from the owning mount's own listing,
        or mount by mount below a synthetic directory."""
        found = self._resolve(path)
        if found is not None:
            return await walk_stats(found[1], found[2], max_depth=max_depth)
        return await walk_stats_by_listing(self, path, max_depth=max_depth)

    async def grep(
        self,
        pattern: str,
        path: str = "",
        *,
        case_sensitive: bool = True,
        include_hidden: bool = False,
        max_count_per_file: int | None = None,
        max_total_matches: int | None = None,
        context_lines: int = 0,
    ) -> list[GrepFileResult]:
        """Grep each mount involved; result paths are relative to the composite root."""
        found = self._resolve(path)
        targets: list[tuple[str, WorkspaceFilesystem, str]]
        if found is not None:
            targets = [found]
        else:
            norm = normalize_mount_path(path)
            if self._virtual_children(path) is None:
                raise NoMountError(path)
            head = "/" if norm == "/" else norm + "/"
            targets = [(m, fs, "") for m, fs in self._mounts.items() if m.startswith(head)]
        results: list[GrepFileResult] = []
        budget = max_total_matches
        for mount, fs, rest in targets:
            if not isinstance(fs, SupportsGrep):
                continue
            found_here = await fs.grep(
                pattern, rest, case_sensitive=case_sensitive, include_hidden=include_hidden,
                max_count_per_file=max_count_per_file, max_total_matches=budget,
                context_lines=context_lines,
            )
            for item in found_here:
                results.append(GrepFileResult(path=posixpath.join(mount, item.path).lstrip("/"), matches=item.matches))
                if budget is not None:
                    budget -= len(item.matches)
            if budget is not None and budget <= 0:
                break
        return results

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Read part of a file through the owning mount (whole-file read where it cannot)."""
        _, fs, rest = self._route(path)
        return await read_range(fs, rest, start, end)

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read part of a file into ``buffer`` through the owning mount."""
        _, fs, rest = self._route(path)
        return await read_range_into(fs, rest, start, buffer)

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Read many files, each mount's share in one batch."""
        groups: dict[int, tuple[WorkspaceFilesystem, dict[str, str]]] = {}
        out: dict[str, bytes | OSError] = {}
        for path in paths:
            found = self._resolve(path)
            if found is None:
                out[path] = NoMountError(path)
                continue
            groups.setdefault(id(found[1]), (found[1], {}))[1][path] = found[2]
        for fs, members in groups.values():
            got = await read_many(fs, list(members.values()), max_bytes=max_bytes)
            for path, rest in members.items():
                out[path] = got[rest]
        return out

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read ``path`` below ``directory`` without leaving it, through the mount that holds
        ``directory`` (see :func:`agentvfs.vfs.read_file_beneath`)."""
        _, fs, rest = self._route(directory)
        return await read_file_beneath(fs, rest, path, max_bytes=max_bytes)

    async def exists(self, path: str) -> bool:
        """Synthetic directories and mount points always exist."""
        found = self._resolve(path)
        if found is None:
            return self._virtual_children(path) is not None
        if not found[2]:
            return True
        return await found[1].exists(found[2])

    async def stat(self, path: str) -> FileStat:
        """Stat through the owning mount; synthetic directories and mount points are size 0."""
        found = self._resolve(path)
        if found is None:
            if self._virtual_children(path) is not None:
                return self._synthetic(path)
            raise FileNotFound(path)
        if not found[2]:
            return self._synthetic(path)
        return await found[1].stat(found[2])

    async def is_file(self, path: str) -> bool:
        """Tell whether ``path`` is a file."""
        try:
            return (await self.stat(path)).type == "file"
        except FileNotFoundError:
            return False

    async def is_directory(self, path: str) -> bool:
        """Tell whether ``path`` is a directory (synthetic ones included)."""
        try:
            return (await self.stat(path)).type == "directory"
        except FileNotFoundError:
            return False

    # -- lifecycle and description ----------------------------------------------------------------------

    async def init(self) -> None:
        """Initialise every mount; a failing mount is logged, not fatal."""
        for mount, fs in self._mounts.items():
            try:
                await fs.init()
            except Exception as exc:
                logger.warning("Failed to initialise filesystem mounted at %s: %s", mount, exc)
        self.status = "ready"

    async def destroy(self) -> None:
        """Destroy every mount; raise an ``ExceptionGroup`` if any failed."""
        errors: list[Exception] = []
        for fs in self._mounts.values():
            try:
                await fs.destroy()
            except Exception as exc:
                errors.append(exc)
        self.status = "destroyed"
        if errors:
            raise ExceptionGroup("Some filesystems failed to destroy", errors)

    def get_instructions(self, *, request_context: RequestContext | None = None) -> str:
        """List the mount points with their provider (or display name) and access mode."""
        lines = ["Filesystem mount points:"]
        for mount, fs in self._mounts.items():
            label = fs.display_name or fs.provider
            lines.append(f"- {mount}: {label} ({'read-only' if fs.read_only else 'read-write'})")
        return "\n".join(lines)

    def resolve_absolute_path(self, path: str) -> str | None:
        """Delegate to the owning mount, if it can tell."""
        found = self._resolve(path)
        if found is None:
            return None
        resolver = getattr(found[1], "resolve_absolute_path", None)
        return resolver(found[2]) if resolver else None

    def metadata(self) -> dict[str, Any]:
        """The mount table: path -> provider and access mode."""
        return {
            "mounts": {
                m: {"id": fs.id, "provider": fs.provider, "read_only": fs.read_only, **fs.metadata()}
                for m, fs in self._mounts.items()
            }
        }

    async def get_info(self) -> dict[str, Any]:
        """Describe the composite and each mount."""
        info = await super().get_info()
        info["metadata"]["mount_info"] = {m: await fs.get_info() for m, fs in self._mounts.items()}
        return info

    def get_mount_config(self) -> dict[str, Any] | None:
        """A composite is mounted mount by mount, not as a whole."""
        return None

