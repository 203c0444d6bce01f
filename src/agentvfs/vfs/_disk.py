"""Local disk reached only through directory descriptors: containment that survives races.

Checking a path with ``realpath()`` and then opening it again by name leaves a window in which
whoever can write inside the root (an agent running commands in its sandbox) swaps a directory
for a symlink, and the second walk leaves the root. :class:`Disk` never walks a path twice:
it opens the root directory, resolves the rest beneath that descriptor, and does the operation
on what it found, through descriptors:

* where the kernel has ``openat2`` (Linux >= 5.6), one call with ``RESOLVE_BENEATH |
  RESOLVE_NO_MAGICLINKS`` opens the target, or its parent directory, and refuses anything that
  would step out of the root (including through ``/proc/self/fd`` links);
* otherwise, and whenever ``openat2`` refuses (an absolute symlink, a ``..`` above the root,
  a link into another root), a walk in user space opens one component at a time with
  ``O_NOFOLLOW`` from the descriptor of the previous one, reads each symlink it meets and
  follows it only while it stays under one of the roots, and keeps ``..`` on the descriptors
  it came through, so a rename during the walk cannot take it elsewhere.

The operation then acts on a (directory descriptor, name) pair with ``O_NOFOLLOW``,
``unlinkat``, ``renameat``, ``mkdirat``: if the name was swapped for a symlink after the walk,
the operation fails with ``ELOOP`` and is walked again (a few times) instead of following it.
Writes are staged in the parent's descriptor and renamed into place there. Only regular files
are ever opened for reading or writing: FIFOs, devices and sockets are refused after a
non-blocking open, so neither a FIFO nor ``/dev/zero`` can hang or flood a reader.

Everything here is synchronous and speaks host paths (absolute, normalised); the filesystem
classes above translate the errors.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import secrets
import stat as stat_module
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "TMP_MARK",
    "ContainmentError",
    "Disk",
    "DiskEntry",
    "NotRegularFileError",
    "TooLargeError",
    "file_kind",
]

#: Staged writes use a hidden sibling with this marker in its name; listings hide such names.
TMP_MARK = ".agentvfs-tmp-"

# How many times an operation whose name was swapped under it (ELOOP from O_NOFOLLOW, or a
# directory replaced during the walk) is walked again before it gives up with that error.
_RETRIES = 8
# The user-space walk looks at a component again when it changed between two steps; past this
# many times in one walk it gives up (EAGAIN).
_WALK_RETRIES = 32
_MAX_LINKS = 40
_COPY_CHUNK = 1 << 20

_O_PATH = getattr(os, "O_PATH", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# openat2(2): struct open_how and its resolve flags (linux/openat2.h).
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
# The syscall number is the same on every architecture (it was added after the tables merged).
_SYS_OPENAT2 = 437
# renameat2(2) is older, so its number differs per architecture.
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276}.get(os.uname().machine)
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class ContainmentError(PermissionError):
    """A path leads outside every root (through ``..`` or a symlink)."""

    def __init__(self, target: str) -> None:
        super().__init__(errno.EACCES, "path leads outside the root", target)


class TooLargeError(OSError):
    """A file is larger than the ``max_bytes`` a read allowed (``EFBIG``)."""

    def __init__(self, target: str, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", target)
        self.limit = limit


class NotRegularFileError(OSError):
    """A FIFO, device or socket was about to be opened for reading or writing.

    Attributes
    ----------
    kind : str
        ``FIFO``, ``character device``, ``block device`` or ``socket``.
    """

    def __init__(self, target: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", target)
        self.kind = kind


def file_kind(mode: int) -> str:
    """Name the kind of file ``mode`` describes (``regular file``, ``FIFO`` ...)."""
    if stat_module.S_ISREG(mode):
        return "regular file"
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISFIFO(mode):
        return "FIFO"
    if stat_module.S_ISCHR(mode):
        return "character device"
    if stat_module.S_ISBLK(mode):
        return "block device"
    if stat_module.S_ISSOCK(mode):
        return "socket"
    if stat_module.S_ISLNK(mode):
        return "symbolic link"
    return "special file"


# -- kernel calls ctypes has to reach ------------------------------------------------------------

_libc: ctypes.CDLL | None = None
_openat2_works = sys.platform.startswith("linux")
_renameat2_works = sys.platform.startswith("linux") and _SYS_RENAMEAT2 is not None
_libc_lock = threading.Lock()


def _load_libc() -> ctypes.CDLL | None:
    global _libc, _openat2_works, _renameat2_works
    with _libc_lock:
        if _libc is None:
            try:
                _libc = ctypes.CDLL(None, use_errno=True)
                _libc.syscall.restype = ctypes.c_long
            except OSError:
                _openat2_works = _renameat2_works = False
        return _libc


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    """``openat2(2)``; raises OSError (ENOSYS where the kernel or a seccomp policy lacks it)."""
    libc = _load_libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "openat2 is not available")
    # The kernel refuses a mode unless the call may create (O_TMPFILE includes O_DIRECTORY's bit).
    tmpfile = getattr(os, "O_TMPFILE", 0)
    creates = flags & os.O_CREAT or (tmpfile and flags & tmpfile == tmpfile)
    how = _OpenHow(flags, mode if creates else 0, resolve)
    fd = libc.syscall(
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), os.fsencode(path),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )  # fmt: skip
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    libc = _load_libc()
    if libc is None or _SYS_RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    result = libc.syscall(
        ctypes.c_long(_SYS_RENAMEAT2), ctypes.c_int(src_dir), os.fsencode(src),
        ctypes.c_int(dst_dir), os.fsencode(dst), ctypes.c_uint(flags),
    )  # fmt: skip
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), dst)


# -- the pieces of a resolved path -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Root:
    path: str  # as configured (absolute, normalised)
    real: str  # with the symlinks of the path resolved, when it was configured

    def names(self) -> tuple[str, str]:
        return (self.path, self.real)


@dataclass(frozen=True, slots=True)
class DiskEntry:
    """One entry of a directory listing.

    Attributes
    ----------
    name : str
        The entry's name (or its path below the listed directory, in a walk).
    lstat : os.stat_result
        The entry itself (a symlink is not followed).
    stat : os.stat_result or None
        What it names: ``lstat`` for anything but a symlink; for a symlink, its target's when
        the target exists inside a root, else None (broken, or leading out).
    link : str or None
        A symlink's target text.
    """

    name: str
    lstat: os.stat_result
    stat: os.stat_result | None
    link: str | None

    @property
    def is_dir(self) -> bool:
        """A directory, or a symlink to a directory inside the roots."""
        return self.stat is not None and stat_module.S_ISDIR(self.stat.st_mode)


def _split(rest: str) -> tuple[str, str]:
    parent, _, name = rest.rpartition("/")
    return parent, name


def _components(path: str) -> list[str]:
    # "" and "." are no-ops anywhere in a path; ".." is not (it climbs physically), so it stays.
    return [part for part in path.split("/") if part not in ("", ".")]


class Disk:
    """Files under one or more root directories of this machine, reached only through
    descriptors (see the module docstring).

    Parameters
    ----------
    roots : sequence of str
        Absolute directories. A path must lie lexically under one of them, and every symlink
        met on the way must lead under one of them (a link may lead from one root into
        another). ``["/"]`` confines nothing: every host path is reachable.

    Notes
    -----
    Methods take absolute host paths, already normalised (no ``.`` or ``..`` segments; the
    filesystem layer does that). They raise the builtin ``OSError`` subclasses, plus
    :class:`ContainmentError` for a path that leads out and :class:`NotRegularFileError` for a
    FIFO, device or socket met where file contents were expected.
    """

    def __init__(self, roots: Sequence[str]) -> None:
        if not roots:
            raise ValueError("Disk needs at least one root directory")
        paths: list[str] = []
        for root in roots:
            if not root.startswith("/"):
                raise ValueError(f"Disk roots must be absolute paths, got {root!r}")
            path = posixpath.normpath(root)
            paths.append("/" if path in ("/", "//") else path)
        made: list[_Root] = []
        # Shortest first, so that a root lying inside another finds that one already made.
        for path in sorted(set(paths), key=len):
            outer = next((r for r in reversed(made) if r.path != "/" and path.startswith(r.path + "/")), None)
            # Inside another root, where whoever writes there could have put a symlink, a root
            # must physically be where it lies in that root, never where a link leads.
            real = os.path.realpath(path) if outer is None else outer.real + path[len(outer.path) :]
            made.append(_Root(path, real))
        # Longest first: a root nested in another owns what lies below it.
        self._roots = sorted(made, key=lambda r: -len(r.path))
        self.unconfined = any(r.path == "/" for r in self._roots)

    @property
    def roots(self) -> list[str]:
        """The root directories, as configured."""
        return [r.path for r in self._roots]

    # -- resolution ---------------------------------------------------------------------------

    def _root_of(self, target: str) -> tuple[_Root, str]:
        """The root ``target`` lies under (lexically, by its configured or real path) and the
        rest of the path below it."""
        best: tuple[_Root, str] | None = None
        for root in self._roots:
            for name in root.names():
                if name == "/":
                    rest = target.lstrip("/")
                elif target == name:
                    rest = ""
                elif target.startswith(name + "/"):
                    rest = target[len(name) + 1 :]
                else:
                    continue
                if best is None or len(rest) < len(best[1]):
                    best = (root, rest)
        if best is None:
            raise ContainmentError(target)
        return best

    def _anchor(self, components: list[str], target: str) -> tuple[_Root, list[str]]:
        """Find the root an absolute path (as components, ``..`` kept) starts with."""
        for root in self._roots:
            for name in root.names():
                head = _components(name)
                if components[: len(head)] == head:
                    return root, components[len(head) :]
        raise ContainmentError(target)

    @staticmethod
    def _open_root(root: _Root) -> int:
        # The root's path is configuration and followed as it is, but what it opens must be
        # the directory it named when configured: had a component been swapped for a symlink
        # since (by someone writing in a parent, or in an outer root), this is elsewhere.
        # (Keeping a verified descriptor would save one readlink a call, about 5 µs, at the
        # price of descriptors held for the object's life.)
        fd = os.open(root.path, _O_PATH | _O_DIRECTORY | _O_CLOEXEC)
        if root.path == "/":
            return fd
        try:
            now = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return fd  # no /proc: nothing to compare with
        if now != root.real:
            os.close(fd)
            raise ContainmentError(f"{root.path} (the root now leads to {now}, not {root.real})")
        return fd

    def _walk(self, target: str, *, follow: bool, create: bool = False) -> tuple[int, str]:
        """Resolve ``target`` in user space: ``(directory fd, name)`` of its last component
        (``name`` is ``""`` when the fd is the target itself). The caller closes the fd.

        ``follow`` follows a symlink in the last place too (the name returned is then never
        a symlink, or missing); ``create`` makes missing directories on the way, the last one
        included.
        """
        root, rest = self._root_of(target)
        pending = deque(_components(rest))
        stack = [self._open_root(root)]
        hops = retries = 0
        try:
            while pending:
                name = pending.popleft()
                top = stack[-1]
                if name == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                        continue
                    # Above this root: carry on from its physical parent, which must lead
                    # into a root again.
                    absolute = _components(posixpath.dirname(root.real)) + list(pending)
                    root, remaining = self._anchor(absolute, target)
                    self._reset(stack, root)
                    pending = deque(remaining)
                    continue
                last = not pending
                if last and not follow and not create:
                    return stack.pop(), name
                try:
                    info = os.stat(name, dir_fd=top, follow_symlinks=False)
                except FileNotFoundError:
                    if not create:
                        if last:
                            return stack.pop(), name
                        raise
                    with contextlib.suppress(FileExistsError):  # made by someone else meanwhile
                        os.mkdir(name, 0o777, dir_fd=top)
                    pending.appendleft(name)
                    continue
                if stat_module.S_ISLNK(info.st_mode):
                    hops += 1
                    if hops > _MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), target)
                    try:
                        link = os.readlink(name, dir_fd=top)
                    except OSError as exc:
                        # No longer a link (swapped back meanwhile): look at it again.
                        retries = self._retry(retries, exc, target)
                        pending.appendleft(name)
                        continue
                    if link.startswith("/"):
                        root, remaining = self._anchor(_components(link) + list(pending), target)
                        self._reset(stack, root)
                        pending = deque(remaining)
                    else:
                        pending.extendleft(reversed(_components(link)))
                    continue
                if last and not create:
                    return stack.pop(), name
                if not stat_module.S_ISDIR(info.st_mode):
                    if create:
                        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target)
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target)
                try:
                    child = os.open(name, _O_PATH | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=top)
                except OSError as exc:
                    # Replaced by a link or a file since the stat: look at it again.
                    retries = self._retry(retries, exc, target)
                    pending.appendleft(name)
                    continue
                stack.append(child)
            return stack.pop(), ""
        finally:
            for fd in stack:
                os.close(fd)

    def _reset(self, stack: list[int], root: _Root) -> None:
        fresh = self._open_root(root)
        for fd in stack:
            os.close(fd)
        stack[:] = [fresh]

    @staticmethod
    def _retry(retries: int, exc: OSError, target: str) -> int:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EINVAL):
            raise exc
        if retries >= _WALK_RETRIES:
            # Someone keeps swapping the path (an attack, or a very busy tree): refuse rather
            # than guess, and say that trying again may work.
            raise OSError(errno.EAGAIN, "the path kept changing while it was resolved; try again", target)
        return retries + 1

    def _fast(self, target: str, flags: int, mode: int) -> int | None:
        """One ``openat2`` beneath the root, or None when the user-space walk must decide."""
        global _openat2_works
        if not _openat2_works:
            return None
        root, rest = self._root_of(target)
        resolve = 0 if root.path == "/" else _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
        rootfd = self._open_root(root)
        try:
            for _ in range(_RETRIES):
                try:
                    return _openat2(rootfd, rest or ".", flags | _O_CLOEXEC, mode, resolve)
                except OSError as exc:
                    if exc.errno == errno.EAGAIN:
                        continue  # a rename raced a ".." lookup: the kernel asks to retry
                    if exc.errno == errno.ENOSYS:
                        _openat2_works = False
                        return None
                    if exc.errno == errno.EXDEV or (exc.errno == errno.ELOOP and not flags & _O_NOFOLLOW):
                        return None  # left the root, or an absolute link: the walk decides
                    if exc.errno in (errno.EPERM, errno.E2BIG, errno.EINVAL) and not _probe_openat2():
                        _openat2_works = False
                        return None
                    raise
            return None
        finally:
            os.close(rootfd)

    def open(self, target: str, flags: int, mode: int = 0o666) -> int:
        """Open ``target`` with ``flags`` (``O_NOFOLLOW`` refuses a symlink in the last place;
        without it a contained one is followed). Returns a new descriptor.

        Raises
        ------
        ContainmentError
            The path, or a link on it, leads out of the roots.
        """
        fd = self._fast(target, flags, mode)
        if fd is not None:
            return fd
        follow = not flags & _O_NOFOLLOW
        for attempt in range(_RETRIES + 1):
            dirfd, name = self._walk(target, follow=follow)
            try:
                return os.open(name or ".", flags | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=dirfd)
            except OSError as exc:
                # A symlink put in place of the name since the walk: walk again.
                if exc.errno != errno.ELOOP or not follow or attempt == _RETRIES:
                    raise
            finally:
                os.close(dirfd)
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def place(
        self, target: str, *, follow: bool = False, create_parents: bool = False
    ) -> Iterator[tuple[int, str]]:
        """Yield ``(directory fd, name)`` of ``target``'s last component, for operations on
        the name itself (``mkdirat``, ``unlinkat``, ``renameat``, creating a file).

        With ``follow``, a symlink in the last place is followed (while it stays inside) and
        the place of its target is given. ``create_parents`` makes missing directories on the
        way. The fd is closed afterwards.

        Raises
        ------
        ContainmentError
            ``target`` or its parent leads out of the roots (a root has no place of its own,
            unless it lies inside another root).
        IsADirectoryError
            With ``follow``, the symlink leads to a root directory.
        """
        parent, name = _split(target)
        if not target.startswith("/") or name in ("", ".", ".."):
            raise ValueError(f"not a normalised absolute path: {target!r}")
        self._root_of(target)
        parent = parent or "/"
        dirfd = self._make_dirs(parent) if create_parents else self.open(parent, _O_PATH | _O_DIRECTORY)
        try:
            if follow:
                try:
                    is_link = stat_module.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
                except FileNotFoundError:
                    is_link = False
                if is_link:
                    os.close(dirfd)
                    dirfd = -1
                    dirfd, name = self._walk(target, follow=True)
                    if not name:
                        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
            yield dirfd, name
        finally:
            if dirfd >= 0:
                os.close(dirfd)

    def _make_dirs(self, target: str) -> int:
        """Create ``target`` and its missing parents; return an O_PATH fd of it."""
        root, rest = self._root_of(target)
        if not rest:
            return self._open_root(root)
        try:
            fd = self._fast(target, _O_PATH | _O_DIRECTORY, 0)
        except FileNotFoundError:
            fd = None  # something on the way is missing: the walk makes it
        if fd is not None:
            return fd
        dirfd, name = self._walk(target, follow=True, create=True)
        if name:  # pragma: no cover - create walks always end on the directory itself
            os.close(dirfd)
            raise OSError(errno.EIO, "directory walk ended on a name", target)
        return dirfd

    # -- metadata -------------------------------------------------------------------------------

    def stat(self, target: str) -> os.stat_result:
        """The status of what ``target`` names (a contained symlink in the last place followed)."""
        fd = self.open(target, _O_PATH)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def contains(self, target: str) -> bool:
        """Whether ``target`` lies lexically under a root (symlinks on it are not looked at)."""
        try:
            self._root_of(target)
        except ContainmentError:
            return False
        return True

    def lstat(self, target: str) -> os.stat_result:
        """The status of ``target`` itself (a symlink is not followed)."""
        # O_PATH with O_NOFOLLOW opens a symlink itself: one resolution, then fstat.
        fd = self.open(target, _O_PATH | _O_NOFOLLOW)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def readlink(self, target: str) -> str:
        """The text of the symlink at ``target``."""
        with self.place(target) as (dirfd, name):
            return os.readlink(name, dir_fd=dirfd)

    def realpath(self, target: str) -> str:
        """The physical path of what ``target`` names, links followed (inside the roots)."""
        fd = self.open(target, _O_PATH)
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def exists(self, target: str) -> bool:
        """Whether ``target`` names something (a broken link does not); containment still raises."""
        try:
            self.stat(target)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    # -- listings ------------------------------------------------------------------------------

    def listdir(self, target: str) -> list[DiskEntry]:
        """The entries of the directory ``target``, in directory order.

        Raises
        ------
        FileNotFoundError, NotADirectoryError, ContainmentError
        """
        fd = self.open(target, os.O_RDONLY | _O_DIRECTORY)
        try:
            return self._entries(fd, target, "")
        finally:
            os.close(fd)

    def _entries(self, fd: int, directory: str, prefix: str) -> list[DiskEntry]:
        out: list[DiskEntry] = []
        with os.scandir(fd) as it:
            for item in it:
                try:
                    own = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while listed
                link: str | None = None
                seen: os.stat_result | None = own
                if stat_module.S_ISLNK(own.st_mode):
                    try:
                        link = os.readlink(item.name, dir_fd=fd)
                    except OSError:
                        continue  # replaced while listed
                    seen = self._follow(posixpath.join(directory, item.name))
                out.append(DiskEntry(prefix + item.name, own, seen, link))
        return out

    def _follow(self, target: str) -> os.stat_result | None:
        """The status of a symlink's target inside the roots, or None (broken, or leads out)."""
        try:
            return self.stat(target)
        except (OSError, ValueError):
            return None

    def walk(
        self,
        target: str,
        *,
        max_depth: int,
        skip: Callable[[str], bool] = lambda name: False,
        stop: Callable[[], bool] = lambda: False,
    ) -> list[DiskEntry]:
        """Everything below the directory ``target``, depth first, names relative to it,
        each directory's entries sorted by name; ``max_depth`` 1 lists ``target`` only.

        Symlinked directories are followed while they stay inside the roots, into a directory
        not entered yet in the whole walk: a link into one already walked (a cycle, or one of
        many links to one directory, which would make the walk exponential) is listed, not
        entered again. Names for which ``skip(name)`` is true are left out, with what lies
        below them. When ``stop()`` turns true (its caller gave up) the walk ends, with what it
        had, at the next directory.
        """
        fd = self.open(target, os.O_RDONLY | _O_DIRECTORY)
        out: list[DiskEntry] = []
        try:
            top = os.fstat(fd)
            entered = {(top.st_dev, top.st_ino)}
            self._visit(fd, target, "", 1, max_depth, entered, skip, stop, out)
        finally:
            os.close(fd)
        return out

    def _visit(
        self,
        fd: int,
        directory: str,
        prefix: str,
        depth: int,
        max_depth: int,
        entered: set[tuple[int, int]],
        skip: Callable[[str], bool],
        stop: Callable[[], bool],
        out: list[DiskEntry],
    ) -> None:
        if stop():
            return
        try:
            entries = sorted(self._entries(fd, directory, prefix), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            short = entry.name[len(prefix) :]
            if skip(short):
                continue
            out.append(entry)
            if not entry.is_dir or depth >= max_depth:
                continue
            assert entry.stat is not None
            key = (entry.stat.st_dev, entry.stat.st_ino)
            # A real directory is reached once, through its parent: always entered. A link is
            # entered only into a directory not entered yet (no cycle, no exponential DAG).
            if entry.link is not None and key in entered:
                continue
            entered.add(key)
            child_path = posixpath.join(directory, short)
            try:
                if entry.link is None:
                    child = os.open(short, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
                else:
                    child = self.open(child_path, os.O_RDONLY | _O_DIRECTORY)
            except OSError:
                continue  # gone, swapped, or (a link) leading out since it was listed
            try:
                self._visit(child, child_path, entry.name + "/", depth + 1, max_depth, entered, skip, stop, out)
            finally:
                os.close(child)

    # -- contents --------------------------------------------------------------------------------

    def open_regular(self, target: str, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
        """Open ``target`` for its contents, refusing anything but a regular file.

        The open is non-blocking, so a FIFO cannot hang it; the descriptor returned is
        blocking again.

        Raises
        ------
        IsADirectoryError
            ``target`` is a directory.
        NotRegularFileError
            A FIFO, device or socket.
        """
        try:
            fd = self.open(target, flags | _O_NONBLOCK, mode)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing alone)
                info = self._follow(target)
                raise NotRegularFileError(target, file_kind(info.st_mode) if info else "socket") from None
            raise
        try:
            info = os.fstat(fd)
            if stat_module.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
            if not stat_module.S_ISREG(info.st_mode):
                raise NotRegularFileError(target, file_kind(info.st_mode))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(
        self, target: str, start: int | None = None, end: int | None = None, *, max_bytes: int | None = None
    ) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive; None: from the start, to the end) of a file.

        With ``max_bytes`` a whole-file read reads at most that many bytes and one more from
        the descriptor it opened, and raises :class:`TooLargeError` if that one more exists:
        the bound holds whatever size a listing showed before (the file may have been swapped
        for a larger one since).
        """
        fd = self.open_regular(target)
        try:
            return _read_fd(fd, target, start, end, max_bytes)
        finally:
            os.close(fd)

    def read_into(self, target: str, start: int, buffer: memoryview) -> int:
        """Read from ``start`` into ``buffer``; returns the bytes read (short only at EOF)."""
        fd = self.open_regular(target)
        try:
            done = 0
            while done < len(buffer):
                count = os.preadv(fd, [buffer[done:]], start + done)
                if count == 0:
                    break
                done += count
            return done
        finally:
            os.close(fd)

    def read_beneath(self, directory: str, rest: str, *, max_bytes: int | None = None) -> bytes:
        """Read the file ``rest`` (a relative path) below ``directory`` without leaving that
        directory: symlinks are followed only while they stay below it.

        ``directory`` is resolved inside the roots and held by descriptor; the rest is
        resolved beneath that descriptor, so neither a link nor a swap during the call leads
        elsewhere (a skill's ``references/`` cannot reach the rest of the workspace).

        Raises
        ------
        ContainmentError
            ``rest`` leads out of ``directory`` (or ``directory`` out of the roots).
        """
        if rest.startswith("/"):
            raise ContainmentError(rest)
        fd = self.open(directory, _O_PATH | _O_DIRECTORY)
        try:
            anchor = f"/proc/self/fd/{fd}"
            inner = Disk([anchor])
            target = posixpath.join(anchor, *_components(rest)) if _components(rest) else anchor
            if ".." in _components(rest):
                # Lexically above the directory: refused before anything is opened.
                depth = 0
                for part in _components(rest):
                    depth += -1 if part == ".." else 1
                    if depth < 0:
                        raise ContainmentError(rest)
            return inner.read(target, max_bytes=max_bytes)
        finally:
            os.close(fd)

    def copy_out(self, target: str, host_path: str) -> None:
        """Copy the file ``target`` to ``host_path`` (a path of the caller's, not confined)."""
        src = self.open_regular(target)
        try:
            # O_NOFOLLOW: the destination's own name is not followed if someone swapped it.
            out = os.open(host_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_NOFOLLOW | _O_CLOEXEC, 0o666)
            try:
                copy_fd(src, out)
            finally:
                os.close(out)
        finally:
            os.close(src)

    def append(self, target: str, data: bytes) -> None:
        """Append ``data`` to a file, creating it (not its parents); cut back to its old length
        if the append fails part way."""
        fd = self.open_regular(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def publish(
        self,
        target: str,
        fill: Callable[[int, str], None],
        *,
        overwrite: bool,
        proceed: Callable[[], bool] = lambda: True,
        settle: Callable[[int, str], None] | None = None,
    ) -> None:
        """Replace (or, without ``overwrite``, create) the file ``target`` in one step.

        ``fill(dirfd, name)`` puts the new content at ``name`` in the directory ``dirfd`` (a
        hidden sibling of the target); it is then renamed over the target, or without
        ``overwrite`` linked there only if nothing is. A symlink in the target's place is
        written through to its (contained) target, and an existing file keeps its permission
        bits, as an in-place write would, unless ``settle(dirfd, name)``, called next, sets
        attributes of its own. When ``proceed()`` is false after the content is staged,
        nothing is published.

        Raises
        ------
        IsADirectoryError
            A directory is at ``target``.
        FileExistsError
            Without ``overwrite``, something is at ``target``.
        """
        with self.place(target, follow=True) as (dirfd, name):
            try:
                old = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and stat_module.S_ISDIR(old.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
            tmp = staged_name(name)
            try:
                fill(dirfd, tmp)
                if old is not None and stat_module.S_ISREG(old.st_mode):
                    _chmod_at(dirfd, tmp, stat_module.S_IMODE(old.st_mode))
                if settle is not None:
                    settle(dirfd, tmp)
                if not proceed():
                    raise _Abandoned
                if overwrite:
                    os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                    if _lexists_at(dirfd, tmp):
                        # rename(2) of two links to one inode does nothing: the staged copy
                        # was already the file (a hard-linked publish of unchanged content).
                        os.unlink(tmp, dir_fd=dirfd)
                else:
                    _rename_noreplace(dirfd, tmp, dirfd, name, target)
            except _Abandoned:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dirfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dirfd)
                raise

    # -- names -----------------------------------------------------------------------------------

    def makedirs(self, target: str) -> None:
        """``mkdir -p``: create ``target`` and its missing parents (following contained links).

        Raises
        ------
        FileExistsError, NotADirectoryError
            A file is in the way.
        """
        os.close(self._make_dirs(target))

    def mkdir(self, target: str, mode: int = 0o777) -> None:
        """Create the directory ``target`` (its parent must exist)."""
        with self.place(target) as (dirfd, name):
            os.mkdir(name, mode, dir_fd=dirfd)

    def unlink(self, target: str) -> None:
        """Remove the name ``target`` (a symlink itself, never what it points to)."""
        with self.place(target) as (dirfd, name):
            os.unlink(name, dir_fd=dirfd)

    def rmdir(self, target: str) -> None:
        """Remove the empty directory ``target``."""
        with self.place(target) as (dirfd, name):
            os.rmdir(name, dir_fd=dirfd)

    def rmtree(self, target: str) -> None:
        """Remove the directory ``target`` and everything below it, through descriptors (a
        symlink inside is removed, never followed; a symlink at ``target`` is refused)."""
        with self.place(target) as (dirfd, name):
            info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if not stat_module.S_ISDIR(info.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target)
            _rmtree_at(dirfd, name)

    def rename(self, src: str, dest: str, *, replace: bool = True) -> None:
        """Move the name ``src`` to ``dest`` in one step (``replace=False``: only if ``dest``
        is free, where the kernel can tell atomically)."""
        with self.place(src) as (src_dir, src_name), self.place(dest) as (dest_dir, dest_name):
            if replace:
                os.rename(src_name, dest_name, src_dir_fd=src_dir, dst_dir_fd=dest_dir)
            else:
                _rename_noreplace(src_dir, src_name, dest_dir, dest_name, dest)

    def symlink(self, link_target: str, target: str) -> None:
        """Create the symlink ``target`` pointing to ``link_target`` (the text, unchecked)."""
        with self.place(target) as (dirfd, name):
            os.symlink(link_target, name, dir_fd=dirfd)

    def chmod(self, target: str, mode: int) -> None:
        """Set the permission bits of ``target`` (a contained symlink is followed)."""
        fd = self.open(target, _O_PATH)
        try:
            # fchmod refuses O_PATH descriptors; the /proc link of one works and stays on it.
            os.chmod(f"/proc/self/fd/{fd}", mode)
        finally:
            os.close(fd)


class _Abandoned(Exception):
    """Internal: the caller withdrew a staged publish."""


def staged_name(name: str) -> str:
    """A hidden sibling name for staging ``name``'s new content (at most 255 bytes)."""
    short = name.encode()[:120].decode("utf-8", "ignore")
    return f".{short}{TMP_MARK}{secrets.token_hex(6)}"


def _lexists_at(dirfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read_fd(fd: int, target: str, start: int | None, end: int | None, max_bytes: int | None) -> bytes:
    """Read ``start`` to ``end`` of the open file ``fd`` (see :meth:`Disk.read`)."""
    first = max(0, start or 0)
    if end is None:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size - first > max_bytes:
            # Too large already: refuse before reading up to the limit (a sparse file made to
            # be just over a cap would otherwise cost the cap in memory on every call).
            raise TooLargeError(target, max_bytes)
        wanted = max(size - first, 0) + 1  # one more than the size: a file still growing shows
        if max_bytes is not None:
            wanted = min(wanted, max_bytes + 1)
        chunks: list[bytes] = []
        got = 0
        position = first
        while True:
            ask = wanted - got if got < wanted else _COPY_CHUNK
            if max_bytes is not None:
                ask = min(ask, max_bytes + 1 - got)
                if ask <= 0:
                    raise TooLargeError(target, max_bytes)
            chunk = os.pread(fd, ask, position)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            got += len(chunk)
            position += len(chunk)
            if max_bytes is not None and got > max_bytes:
                raise TooLargeError(target, max_bytes)
    wanted = max(end - first, 0)
    if max_bytes is not None and wanted > max_bytes:
        raise TooLargeError(target, max_bytes)
    parts = []
    while wanted > 0:
        chunk = os.pread(fd, wanted, first)
        if not chunk:
            break
        parts.append(chunk)
        first += len(chunk)
        wanted -= len(chunk)
    return b"".join(parts)


def _chmod_at(dirfd: int, name: str, mode: int) -> None:
    # Permission bits only: set-user-ID and set-group-ID bits are never carried over to a
    # file this process writes (a sandboxed command's setuid file rewritten by the host
    # would otherwise become setuid to the host's user).
    mode &= 0o777
    # fchmodat cannot refuse to follow a link everywhere; an O_NOFOLLOW open can.
    with contextlib.suppress(OSError):
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dirfd)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _rename_noreplace(src_dir: int, src: str, dest_dir: int, dest: str, display: str) -> None:
    """Move ``src`` to ``dest`` only if ``dest`` is free: ``renameat2(RENAME_NOREPLACE)``, or
    for files a hard link (which refuses an existing name) and an unlink."""
    global _renameat2_works
    if _renameat2_works:
        try:
            _renameat2(src_dir, src, dest_dir, dest, _RENAME_NOREPLACE)
            return
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), display) from None
            if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
                raise
            if exc.errno == errno.ENOSYS:
                _renameat2_works = False
    try:
        os.link(src, dest, src_dir_fd=src_dir, dst_dir_fd=dest_dir, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), display) from None
    os.unlink(src, dir_fd=src_dir)


def _rmtree_at(dirfd: int, name: str) -> None:
    """Remove the directory ``name`` of ``dirfd`` with everything in it, never following a
    link: each directory is opened with O_NOFOLLOW from its parent's descriptor."""
    fd = os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dirfd)
    try:
        with os.scandir(fd) as it:
            children = [(item.name, item.is_dir(follow_symlinks=False)) for item in it]
        for child, is_dir in children:
            if is_dir:
                try:
                    _rmtree_at(fd, child)
                except NotADirectoryError:
                    os.unlink(child, dir_fd=fd)  # swapped for a link or file meanwhile
            else:
                try:
                    os.unlink(child, dir_fd=fd)
                except IsADirectoryError:
                    _rmtree_at(fd, child)  # swapped for a directory meanwhile
                except FileNotFoundError:
                    pass
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dirfd)


def copy_fd(src: int, dest: int) -> None:
    """Copy all of ``src`` (from its start, its position untouched) to ``dest`` (at its
    position): in the kernel where it can."""
    offset = 0
    try:
        while True:
            count = os.copy_file_range(src, dest, 1 << 30, offset)
            if count == 0:
                return
            offset += count
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
            raise
    while True:
        chunk = os.pread(src, _COPY_CHUNK, offset)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(dest, view) :]
        offset += len(chunk)


def copy_into(src_fd: int) -> Callable[[int, str], None]:
    """A ``fill`` for :meth:`Disk.publish` that copies the open file ``src_fd``."""

    def fill(dirfd: int, name: str) -> None:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o666, dir_fd=dirfd)
        try:
            copy_fd(src_fd, out)
        finally:
            os.close(out)

    return fill


def write_into(data: bytes | memoryview) -> Callable[[int, str], None]:
    """A ``fill`` for :meth:`Disk.publish` that writes ``data``."""

    def fill(dirfd: int, name: str) -> None:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o666, dir_fd=dirfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)

    return fill


def set_attributes_at(
    dirfd: int,
    name: str,
    *,
    mode: int | None = None,
    owner: tuple[int, int] | None = None,
    times_ns: tuple[int, int] | None = None,
) -> None:
    """Set what is given of the permission bits, owner (``(uid, gid)``, -1 keeps one) and
    access and modification times of the entry ``name`` in the directory ``dirfd`` itself
    (a symbolic link there is not followed: its own owner and times are set)."""
    # O_PATH: no open of the file itself (a FIFO or device node is not opened, a mode of 0000
    # is no obstacle).
    fd = os.open(name, _O_PATH | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dirfd)
    try:
        if stat_module.S_ISLNK(os.fstat(fd).st_mode):
            # Linux gives a symbolic link no mode of its own (always 0777).
            if owner is not None:
                os.chown(name, *owner, dir_fd=dirfd, follow_symlinks=False)
            if times_ns is not None:
                os.utime(name, ns=times_ns, dir_fd=dirfd, follow_symlinks=False)
            return
        set_attributes_of(fd, mode=mode, owner=owner, times_ns=times_ns)
    finally:
        os.close(fd)


def set_attributes_of(
    fd: int,
    *,
    mode: int | None = None,
    owner: tuple[int, int] | None = None,
    times_ns: tuple[int, int] | None = None,
) -> None:
    """:func:`set_attributes_at` for what the descriptor ``fd`` (``O_PATH`` will do) is, not
    a symbolic link."""
    at = f"/proc/self/fd/{fd}"  # stays on that inode whatever is renamed meanwhile
    if owner is not None:
        os.chown(at, *owner)
    if mode is not None:
        os.chmod(at, mode & 0o7777)  # after chown, which clears set-ID bits
    if times_ns is not None:
        os.utime(at, ns=times_ns)


def link_or_copy_from(host_path: str) -> Callable[[int, str], None]:
    """A ``fill`` for :meth:`Disk.publish` taking the caller's own file ``host_path``: a hard
    link when it is on the same device (no copy at all), else a kernel-side copy."""

    def fill(dirfd: int, name: str) -> None:
        try:
            os.link(host_path, name, dst_dir_fd=dirfd, follow_symlinks=False)
            return
        except OSError:
            pass
        src = os.open(host_path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        try:
            copy_into(src)(dirfd, name)
        finally:
            os.close(src)

    return fill


_probe_lock = threading.Lock()
_probed: bool | None = None


def _probe_openat2() -> bool:
    """Whether ``openat2`` itself works here (a seccomp policy may refuse it with EPERM)."""
    global _probed
    with _probe_lock:
        if _probed is None:
            try:
                os.close(_openat2(_AT_FDCWD, "/", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, 0, 0))
                _probed = True
            except OSError:
                _probed = False
        return _probed
