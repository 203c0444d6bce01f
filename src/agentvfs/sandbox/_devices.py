"""The device nodes of a sandbox whose user is the host's root, and where they are kept.

When this process is root, the sandbox's user is the host's root to the kernel (see
:mod:`._isolation`), and so the owner of the host's device nodes that bubblewrap binds into
``/dev``: ``chmod 0 /dev/null`` inside would change the host's. Each such sandbox gets nodes
of its own instead (null, zero, full, random, urandom, tty: the host's device numbers), owned
by nobody, so a command can use them and change neither them nor the host's.

No sandbox can reach another's nodes (or its own), whatever paths it may write: ``/tmp``,
``$TMPDIR``, ``/``, the home directory, the parent of the place they are kept...

* They are kept in ``<temporary directory>/.agentvfs-devices-0``, a directory owned by
  nobody with mode 0711, in a directory of each sandbox's own, also nobody's with mode 0711
  (named by this process's id, its start time and 16 random hex digits). A sandbox's user,
  the host's root without capabilities, may pass through them but neither list them nor
  create, rename, change or delete anything in them. Nor can it make a directory or a node
  owned by nobody, so whatever it might put in their place is told apart.
* That directory is hidden (an empty read-only directory over it) in every sandbox that would
  see it through a bind (:func:`~._isolation.hidden_covers`): no sandbox can move it either.
* Before each command the launcher checks the whole path again (:meth:`DeviceNodes.verify`):
  the very directories and nodes it made, still nobody's, with their modes; character
  devices with the host's numbers. When anything else is found the nodes are made anew and a
  warning says what was found.
* Inside the sandbox, before anything of the command runs, the shell checks that each node
  in ``/dev`` is the file the launcher holds a descriptor of
  (:func:`~._isolation.device_check`): a node changed between the launcher's check and
  bubblewrap's bind stops the command (status 126) instead of being used.

Where the temporary directory's filesystem refuses device nodes (``nodev``), none are made
and the launcher says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import tempfile

from .._procs import pid_alive, start_time

__all__ = ["DEVICE_NAMES", "NOBODY", "DeviceNodes", "NoDeviceNodes", "devices_root"]

#: The device nodes bubblewrap's ``--dev`` binds from the host, which a sandbox gets its own of.
DEVICE_NAMES = ("null", "zero", "full", "random", "urandom", "tty")

#: The owner of the nodes and of their directories: the kernel's overflow uid, mapped to
#: nothing in a sandbox's user namespace, so that the sandbox's user is not their owner.
NOBODY = 65534

_DIRECTORY_MODE = 0o711
_NODE_MODE = 0o666
_SANDBOX_DIRECTORY = re.compile(r"^(\d+)-(\d+)-[0-9a-f]{16}$")


class NoDeviceNodes(OSError):
    """The filesystem of the temporary directory refuses device nodes (mounted ``nodev``)."""


def devices_root() -> str:
    """Where this user's sandboxes keep their device nodes (see the module)."""
    return os.path.join(tempfile.gettempdir(), f".agentvfs-devices-{os.geteuid()}")


def _directory_problem(info: os.stat_result) -> str | None:
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != NOBODY or info.st_gid != NOBODY:
        return f"is owned by {info.st_uid}:{info.st_gid}, not by nobody ({NOBODY}:{NOBODY})"
    if stat.S_IMODE(info.st_mode) != _DIRECTORY_MODE:
        return f"has mode {stat.S_IMODE(info.st_mode):o}, not {_DIRECTORY_MODE:o}"
    return None


def _node_problem(info: os.stat_result, rdev: int) -> str | None:
    if not stat.S_ISCHR(info.st_mode):
        return f"is not a character device ({stat.filemode(info.st_mode)})"
    if info.st_rdev != rdev:
        return f"is the device {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}, not {os.major(rdev)}:{os.minor(rdev)}"
    if info.st_uid != NOBODY or info.st_gid != NOBODY:
        return f"is owned by {info.st_uid}:{info.st_gid}, not by nobody ({NOBODY}:{NOBODY})"
    if stat.S_IMODE(info.st_mode) != _NODE_MODE:
        return f"has mode {stat.S_IMODE(info.st_mode):o}, not {_NODE_MODE:o}"
    return None


def _open_root(path: str) -> int:
    """A descriptor of ``path``, made or adopted as nobody's with mode 0711.

    Raises
    ------
    PermissionError
        ``path`` is a symlink, not a directory, or someone else's; the message says which.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(errno.EACCES, f"{path} is a symlink or not a directory") from exc
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and stat.S_ISDIR(info.st_mode) and not os.listdir(fd):
            # Just made, or made empty by another process of this user (a sandbox's user is
            # this user too): once nobody's, no such process can put anything in it.
            os.fchown(fd, NOBODY, NOBODY)
            os.fchmod(fd, _DIRECTORY_MODE)
            info = os.fstat(fd)
        problem = _directory_problem(info)
        if problem is not None:
            raise PermissionError(errno.EACCES, f"{path} {problem}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_stale(root: int) -> None:
    """Remove the directories of sandboxes whose process is gone (a crash)."""
    for name in os.listdir(root):
        match = _SANDBOX_DIRECTORY.match(name)
        if match is None:
            continue
        pid, started = int(match.group(1)), int(match.group(2))
        if pid_alive(pid) and start_time(pid) == started:
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(name, dir_fd=root)


class DeviceNodes:
    """One sandbox's device nodes (see the module), made by :meth:`make`.

    Attributes
    ----------
    root : str
        The directory that holds every sandbox's nodes (hidden from every sandbox).
    directory : str
        This sandbox's directory in it.
    paths : dict
        Device name -> the node's path (what bubblewrap binds).
    descriptors : dict
        Device name -> an ``O_PATH`` descriptor of the node (what a command checks its
        ``/dev`` against); closed by :meth:`close`.
    """

    def __init__(self, root: str, directory: str, root_fd: int) -> None:
        self.root = root
        self.directory = directory
        self.paths: dict[str, str] = {}
        self.descriptors: dict[str, int] = {}
        self._root_fd = root_fd
        # Path -> (st_dev, st_ino) as made; and, for the nodes, the host's device number.
        self._identities: dict[str, tuple[int, int]] = {}
        self._devices: dict[str, int] = {}

    @classmethod
    def make(cls, root: str | None = None) -> DeviceNodes:
        """Make the nodes of a new sandbox in ``root`` (:func:`devices_root` by default).

        Raises
        ------
        NoDeviceNodes
            The filesystem refuses device nodes (nothing is left behind).
        PermissionError
            ``root`` is not nobody's own directory (see the module).
        OSError
            The nodes cannot be made.
        """
        root = root or devices_root()
        root_fd = _open_root(root)
        made: DeviceNodes | None = None
        try:
            _remove_stale(root_fd)
            name = f"{os.getpid()}-{start_time(os.getpid()) or 0}-{secrets.token_hex(8)}"
            os.mkdir(name, 0o700, dir_fd=root_fd)
            directory = os.path.join(root, name)
            made = cls(root, directory, root_fd)
            own = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            try:
                os.fchown(own, NOBODY, NOBODY)
                os.fchmod(own, _DIRECTORY_MODE)
                made._identities[root] = _identity(os.fstat(root_fd))
                made._identities[directory] = _identity(os.fstat(own))
                for device in DEVICE_NAMES:
                    made._add(own, device)
            finally:
                os.close(own)
            if "null" in made.descriptors:
                # A node on a nodev filesystem exists but cannot be opened: try the harmless one.
                try:
                    os.close(os.open(f"/proc/self/fd/{made.descriptors['null']}", os.O_WRONLY | os.O_CLOEXEC))
                except PermissionError as exc:
                    raise NoDeviceNodes(exc.errno, f"{root} refuses device nodes (nodev)") from exc
        except BaseException:
            if made is not None:
                made.close()
            else:
                os.close(root_fd)
            raise
        return made

    def _add(self, directory: int, device: str) -> None:
        try:
            host = os.stat(f"/dev/{device}")
        except OSError:
            return
        if not stat.S_ISCHR(host.st_mode):
            return
        os.mknod(device, stat.S_IFCHR | 0o600, host.st_rdev, dir_fd=directory)
        fd = os.open(device, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        self.descriptors[device] = fd
        # Through the descriptor: the node just made, whatever its name now points to.
        os.chown(f"/proc/self/fd/{fd}", NOBODY, NOBODY)
        os.chmod(f"/proc/self/fd/{fd}", _NODE_MODE)
        info = os.fstat(fd)
        problem = _node_problem(info, host.st_rdev)
        if problem is not None:
            raise PermissionError(errno.EACCES, f"the new node {device} {problem}")
        path = os.path.join(self.directory, device)
        self.paths[device] = path
        self._identities[path] = _identity(info)
        self._devices[path] = host.st_rdev

    def verify(self) -> str | None:
        """Check, by path as bubblewrap will reach them, that the directories and nodes are
        still the ones made, with the same owner and mode.

        Returns
        -------
        str or None
            What differs (the first thing found), or None when nothing does.
        """
        for path, identity in self._identities.items():
            try:
                info = os.lstat(path)
            except OSError as exc:
                return f"{path} cannot be read ({exc.strerror})"
            if _identity(info) != identity:
                return f"{path} was replaced"
            rdev = self._devices.get(path)
            problem = _directory_problem(info) if rdev is None else _node_problem(info, rdev)
            if problem is not None:
                return f"{path} {problem}"
        return None

    def close(self) -> None:
        """Close the descriptors and remove this sandbox's directory (idempotent)."""
        descriptors, self.descriptors = self.descriptors, {}
        for fd in descriptors.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        root_fd, self._root_fd = self._root_fd, -1
        if root_fd < 0:
            return
        with contextlib.suppress(OSError):
            shutil.rmtree(os.path.basename(self.directory), dir_fd=root_fd)
        os.close(root_fd)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino
