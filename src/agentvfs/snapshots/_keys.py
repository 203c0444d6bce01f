"""The key a host signs its snapshot manifests, listing records and locks with.

A store the agent can write (the default, ``.agentvfs/snapshots`` of the workspace itself)
can be handed any manifest: its id is only the hash of its bytes, which anyone can compute.
What tells the host's own records from the rest is an HMAC-SHA256 under a secret the agent
cannot read: by default a per-user key file beside the mounts' journals
(``$AGENTVFS_STATE_DIR``, ``$XDG_STATE_HOME/agentvfs`` or ``~/.local/state/agentvfs``),
made on first use with mode 0600, which no sandbox binds. Every process of that user (a
program, the ``agentvfs`` command) finds the same file; hosts sharing a store on another
machine need a copy of it (or ``AGENTVFS_SNAPSHOT_KEY_FILE`` naming one).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import pwd
import secrets
import stat as stat_module
from typing import Literal

__all__ = ["KEY_FILE_ENV", "SnapshotKey", "default_key_file"]

#: The environment variable naming the key file (default: :func:`default_key_file`).
KEY_FILE_ENV = "AGENTVFS_SNAPSHOT_KEY_FILE"
_KEY_FILE_NAME = "snapshot.key"
_KEY_BYTES = 32
#: The shortest key accepted, in bytes.
_MIN_KEY_BYTES = 16

#: What a MAC authenticates: the same bytes signed for one purpose never pass for another.
Purpose = Literal["manifest", "index", "lock"]


def default_key_file() -> str:
    """``$AGENTVFS_SNAPSHOT_KEY_FILE``, else ``snapshot.key`` in the per-user state directory
    (``$AGENTVFS_STATE_DIR``, ``$XDG_STATE_HOME/agentvfs``, else ``~/.local/state/agentvfs``:
    where mounts keep their journals)."""
    explicit = os.environ.get(KEY_FILE_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    state = os.environ.get("AGENTVFS_STATE_DIR")
    if state:
        return os.path.join(os.path.abspath(state), _KEY_FILE_NAME)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return os.path.join(os.path.abspath(xdg), "agentvfs", _KEY_FILE_NAME)
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return os.path.join(home, ".local", "state", "agentvfs", _KEY_FILE_NAME)


class SnapshotKey:
    """A secret that signs snapshot manifests, listing records and locks (HMAC-SHA256).

    Parameters
    ----------
    secret : bytes
        At least 16 bytes, random.
    source : str
        Where it came from, for messages (a key file's path).

    Raises
    ------
    ValueError
        ``secret`` is shorter than 16 bytes.
    """

    __slots__ = ("_secret", "id", "source")

    def __init__(self, secret: bytes, *, source: str = "a key given by the program") -> None:
        if not isinstance(secret, bytes) or len(secret) < _MIN_KEY_BYTES:
            raise ValueError(f"a snapshot key is at least {_MIN_KEY_BYTES} random bytes")
        self._secret = secret
        self.source = source
        #: A fingerprint that names the key in manifests and messages (not the secret).
        self.id = hashlib.sha256(b"agentvfs snapshot key id\0" + secret).hexdigest()[:16]

    @classmethod
    def generate(cls) -> SnapshotKey:
        """A new random key (kept in memory only: for a store used by one process)."""
        return cls(secrets.token_bytes(_KEY_BYTES), source="a key made for this process")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None, *, create: bool = True) -> SnapshotKey:
        """The key of the file ``path`` (default :func:`default_key_file`), made there with
        mode 0600 (in a directory of mode 0700) when it is missing and ``create`` is set.

        The file holds the key in hexadecimal. It must be a regular file owned by this user
        (or root) that no other user may read or write: a key others can read signs
        anything they like.

        Raises
        ------
        FileNotFoundError
            It is missing and ``create`` is False.
        PermissionError
            Others may read or write it, it is not this user's, or it cannot be made.
        ValueError
            It does not hold a key.
        """
        where = os.path.abspath(os.fspath(path)) if path is not None else default_key_file()
        try:
            fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(
                    errno.ENOENT, f"no snapshot key at {where} (the key that signs this host's snapshots)", where
                ) from None
            return cls._create(where)
        try:
            return cls._read(fd, where)
        finally:
            os.close(fd)

    @classmethod
    def _read(cls, fd: int, where: str) -> SnapshotKey:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise PermissionError(errno.EACCES, f"the snapshot key {where} is not a regular file", where)
        if st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(
                errno.EACCES,
                f"the snapshot key {where} belongs to uid {st.st_uid}, not this user ({os.geteuid()}): "
                "anyone who can write it can sign snapshots; use a key file of your own",
                where,
            )
        if st.st_mode & 0o077:
            raise PermissionError(
                errno.EACCES,
                f"the snapshot key {where} may be read or written by other users (mode "
                f"{stat_module.S_IMODE(st.st_mode):04o}): anyone who can read it can sign snapshots; "
                f"`chmod 600 {where}` (and make a new key if others may have read it)",
                where,
            )
        raw = b""
        while chunk := os.read(fd, 4096):
            raw += chunk
            if len(raw) > 4096:
                break
        try:
            secret = bytes.fromhex(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            secret = b""
        if len(secret) < _MIN_KEY_BYTES:
            raise ValueError(
                f"the snapshot key {where} does not hold a key (at least {2 * _MIN_KEY_BYTES} hexadecimal digits); "
                "remove it to have a new one made (snapshots signed with the old key are then refused)"
            )
        return cls(secret, source=where)

    @classmethod
    def _create(cls, where: str) -> SnapshotKey:
        """Make a key file at ``where``; of processes making it at once, every one ends up with
        the key of the first (linked into place, never replaced)."""
        directory = os.path.dirname(where)
        secret = secrets.token_bytes(_KEY_BYTES)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            tmp = os.path.join(directory, f".{os.path.basename(where)}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, secret.hex().encode("ascii") + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, where)
            except FileExistsError:
                return cls.from_file(where, create=False)  # made by another process meanwhile
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        except OSError as exc:
            raise PermissionError(
                exc.errno or errno.EACCES,
                f"the key that signs this host's snapshots cannot be made at {where} ({exc.strerror or exc}); set "
                f"{KEY_FILE_ENV} to a file only this user can read, or give SnapshotStore(key=...)",
                where,
            ) from exc
        return cls(secret, source=where)

    def sign(self, purpose: Purpose, data: bytes) -> str:
        """The MAC of ``data`` for ``purpose`` (hexadecimal)."""
        return hmac.new(self._secret, purpose.encode() + b"\0" + data, hashlib.sha256).hexdigest()

    def verify(self, purpose: Purpose, data: bytes, mac: object) -> bool:
        """Whether ``mac`` is the MAC of ``data`` for ``purpose`` under this key."""
        return isinstance(mac, str) and hmac.compare_digest(self.sign(purpose, data), mac)

    def __repr__(self) -> str:
        return f"SnapshotKey(id={self.id!r}, source={self.source!r})"
