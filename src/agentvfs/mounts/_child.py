"""A FUSE mount served by a child process.

pyfuse3 serves one mount per process, and a FUSE server in the process that also runs the
agent competes with it for the GIL. A filesystem that can be rebuilt from a description
(a local directory, or an fsspec filesystem whose options serialise) is therefore served by
a child process: ``ProcessMount`` starts ``python -m agentvfs.mounts._child``, sends it the
description over a pipe (credentials never appear on a command line), and keeps the pipe
open for the life of the mount:

* parent -> child, one JSON object per line: the mount request, then ``forget`` messages
  when the Workspace API changes paths (acknowledged, so the change is visible in the mount
  when the API call returns), then ``close``;
* child -> parent: ``ready`` or ``error``, ``ack``, and ``closed`` with the uploads that
  failed.

The child unmounts when the pipe closes, so a parent that dies, even by ``kill -9``, takes
its mounts with it (``auto_unmount`` removes the mount if the child itself is killed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import IO, Any

from ..errors import MountError
from ..vfs import SupportsContentCache, WorkspaceFilesystem
from ._options import MountOptions
from ._server import Mount, cleanup_stale_mount, prepare_mountpoint

__all__ = ["ProcessMount", "rebuild", "recipe_for"]

_log = logging.getLogger("agentvfs.mounts")

#: Seconds a child may take to mount (it proves the storage answers first).
START_TIMEOUT = 120.0
#: Seconds an API change may wait for the child to drop its cached state.
FORGET_TIMEOUT = 30.0
#: How often the child checks that the process that started it is alive (seconds).
PARENT_POLL = 0.5


def recipe_for(fs: WorkspaceFilesystem) -> dict[str, Any] | None:
    """How a child process can rebuild ``fs``, or None if it cannot (in-memory storage,
    options that do not serialise, a filesystem of another kind)."""
    from ..vfs import FsspecFilesystem, LocalFilesystem

    if isinstance(fs, LocalFilesystem):
        return {
            "kind": "local",
            "base_path": fs.base_path,
            "contained": fs.contained,
            "read_only": fs.read_only,
            "id": fs.id,
        }
    if isinstance(fs, FsspecFilesystem) and fs.provider != "memory":
        try:
            described = fs.fs.to_json()
            json.loads(described)
        except Exception:
            return None
        return {"kind": "fsspec", "fs": described, "root": fs.root, "read_only": fs.read_only, "id": fs.id}
    return None


def rebuild(recipe: Mapping[str, Any]) -> WorkspaceFilesystem:
    """The filesystem a :func:`recipe_for` description names.

    Raises
    ------
    ValueError
        The description is of an unknown kind.
    """
    from fsspec import AbstractFileSystem

    from ..vfs import FsspecFilesystem, LocalFilesystem

    if recipe.get("kind") == "local":
        return LocalFilesystem(
            recipe["base_path"], contained=recipe["contained"], read_only=recipe["read_only"], id=recipe["id"]
        )
    if recipe.get("kind") == "fsspec":
        raw = AbstractFileSystem.from_json(recipe["fs"])
        return FsspecFilesystem(raw, root=recipe["root"], read_only=recipe["read_only"], id=recipe["id"])
    raise ValueError(f"unknown filesystem description kind: {recipe.get('kind')!r}")


class ProcessMount:
    """A filesystem FUSE-mounted at a directory by a child process.

    Same interface as :class:`~agentvfs.mounts.Mount`: ``start()`` returns once the mount
    answers, ``close()`` uploads what is pending and unmounts, changes made through the
    filesystem object in this process are visible in the mount when the call returns.

    Parameters
    ----------
    filesystem : WorkspaceFilesystem
        What to mount; :func:`recipe_for` must describe it.
    mountpoint : str
        An existing directory.
    read_only : bool, optional
        Mount read-only; defaults to the filesystem's own ``read_only``.
    options : MountOptions or mapping, optional
        See :class:`MountOptions`.

    Raises
    ------
    MountError
        The filesystem cannot be rebuilt by a child, FUSE is unavailable, the mount point
        is busy, or the child could not mount (its reason is in the message).
    """

    def __init__(
        self,
        filesystem: WorkspaceFilesystem,
        mountpoint: str | os.PathLike[str],
        *,
        read_only: bool | None = None,
        options: MountOptions | Mapping[str, Any] | None = None,
    ) -> None:
        recipe = recipe_for(filesystem)
        if recipe is None:
            raise MountError(f"Filesystem {filesystem.id} cannot be served by a child process")
        if read_only is False and filesystem.read_only:
            raise MountError(f"Filesystem {filesystem.id} is read-only and cannot be mounted read-write")
        self.filesystem = filesystem
        self.mountpoint = os.path.abspath(os.fspath(mountpoint))
        self.read_only = filesystem.read_only if read_only is None else bool(read_only)
        self.options = MountOptions.from_value(options)
        cache = filesystem.cache if isinstance(filesystem, SupportsContentCache) else None
        if cache is not None and not (self.options.cache or self.options.cache_dir):
            # A filesystem reading through a cache is served through the same one.
            self.options = dataclasses.replace(self.options, cache_dir=cache.directory, cache_bytes=cache.max_bytes)
        self.pending_failures: dict[str, str] = {}
        self._recipe = recipe
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._serial = 0
        self._ready = False
        self._unwatch: Any = None

    @property
    def mounted(self) -> bool:
        return self._ready and self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> ProcessMount:
        """Start the child and return once the mount answers.

        Raises
        ------
        MountError
            See the class.
        """
        prepare_mountpoint(self.mountpoint, nonempty=self.options.nonempty)
        options = {name: getattr(self.options, name) for name in self.options.__dataclass_fields__}
        request = {"recipe": self._recipe, "mountpoint": self.mountpoint, "read_only": self.read_only, "options": options}
        self._proc = subprocess.Popen(
            # Not ``-m agentvfs.mounts._child``: the package imports this module, and runpy
            # warns on stderr about running a module that is already imported.
            [sys.executable, "-c", "import sys; from agentvfs.mounts._child import main; sys.exit(main())"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"agentvfs-mount-child {self.mountpoint}", daemon=True)
        self._reader.start()
        try:
            self._send(request)
            reply = self._reply(START_TIMEOUT)
            if reply is None or not reply.get("ready"):
                why = (reply or {}).get("error") or "the mount process exited"
                raise MountError(f"Mounting at {self.mountpoint} failed: {why}")
            self._ready = True
            self._unwatch = self.filesystem.watch(self._on_change)
        except BaseException:
            self._kill()
            raise
        return self

    # -- pipe ------------------------------------------------------------------------------------

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                _log.warning("mount process for %s said: %r", self.mountpoint, line[:200])
        self._replies.put(None)  # the child has gone

    def _send(self, message: Mapping[str, Any]) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    def _reply(self, timeout: float | None) -> dict[str, Any] | None:
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise MountError(f"The mount process for {self.mountpoint} did not answer in {timeout} s") from None
        if reply is None:
            self._replies.put(None)  # the child has gone: every later reader must see it too
        return reply

    def _on_change(self, fs: WorkspaceFilesystem, operation: str, paths: tuple[str, ...]) -> None:
        """A change made through the filesystem object in this process: have the child drop
        what it and the kernel cached about ``paths`` before the API call returns."""
        with self._lock:
            if not self.mounted:
                return
            self._serial += 1
            serial = self._serial
            try:
                self._send({"op": "forget", "paths": list(paths), "n": serial})
                while True:
                    reply = self._reply(FORGET_TIMEOUT)
                    if reply is None or reply.get("ack") == serial:
                        return
            except (OSError, MountError) as exc:
                _log.warning("mount at %s did not take a change to %s: %s", self.mountpoint, list(paths), exc)

    # -- teardown --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Upload pending writes, then unmount and end the child.

        Raises
        ------
        MountError
            Some files could not be uploaded (the child logged them; their staged copies
            are kept and named).
        """
        proc = self._proc
        if proc is None:
            return
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        reply: dict[str, Any] | None = None
        with self._lock:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    self._send({"op": "close"})
                    assert proc.stdin is not None
                    proc.stdin.close()
                # Uploads of everything still pending happen now: no time limit but the
                # child's own (it ends when they are done or have failed).
                while True:
                    reply = self._reply(None)
                    if reply is None or reply.get("closed"):
                        break
            self._ready = False
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._kill()
        self._proc = None
        if os.path.ismount(self.mountpoint) or _listed(self.mountpoint):
            with contextlib.suppress(MountError):
                cleanup_stale_mount(self.mountpoint)
        failures = dict((reply or {}).get("failures") or {})
        self.pending_failures = failures
        if failures:
            listed = "; ".join(f"{path}: {why}" for path, why in sorted(failures.items()))
            details = {key: (reply or {}).get(key) for key in ("kept", "recovery_dir", "staging_dir")}
            raise MountError(
                f"Unmounted {self.mountpoint} without publishing {len(failures)} file(s), kept in "
                f"{details['recovery_dir']} (agentvfs recover --list): {listed}",
                {"failed": failures, **details},
            )

    def _kill(self) -> None:
        proc = self._proc
        self._ready = False
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None
        with contextlib.suppress(MountError, OSError):
            cleanup_stale_mount(self.mountpoint)

    def __enter__(self) -> ProcessMount:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"mounted by process {self.pid}" if self.mounted else "not mounted"
        mode = "ro" if self.read_only else "rw"
        return f"<ProcessMount {self.filesystem.id} at {self.mountpoint} ({mode}, {state})>"


def _listed(path: str) -> bool:
    from ._server import is_mounted

    return is_mounted(path)


# -- the child ------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """End this process (SIGTERM: unmount after uploading) once its parent process is gone.

    The closed request pipe already ends the serving loop when the parent dies; this covers a
    pipe held open by some other process. Linux's ``PR_SET_PDEATHSIG`` would fire when the
    parent *thread* exits, and the thread that starts a mount is often a short-lived worker
    (an anyio worker thread ends with its event loop or when idle), which would take the
    mount down under a live parent. So the parent process is watched instead: once it dies,
    this process is re-parented and ``getppid`` changes.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="agentvfs-mount-parent-watch", daemon=True).start()


class _Stop:
    """SIGTERM for the serving loop: it interrupts a wait for the parent's next message, and
    anywhere else is only noted, to be acted on when the work at hand is done.

    Raising from the handler at any point could land in the middle of a change the mount was
    applying, with one of its locks held, and its ``close`` would then wait on that lock for
    good; a signal during ``close`` would cut the publishing of staged files short.
    """

    def __init__(self) -> None:
        self.requested = False
        self._waiting = False

    def on_signal(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self._waiting:
            self._waiting = False
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Let a signal interrupt the block (a blocking read of the next request)."""
        if self.requested:
            raise KeyboardInterrupt
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False


_stop = _Stop()


def _serve(requests: IO[bytes], replies: IO[bytes]) -> int:
    def reply(message: Mapping[str, Any]) -> None:
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    with _stop.interruptible():
        line = requests.readline()
    if not line:
        return 0
    request = json.loads(line)
    try:
        # Nothing is published yet: a signal may cut a start that hangs (storage unreachable).
        with _stop.interruptible():
            fs = rebuild(request["recipe"])
            handle = Mount(fs, request["mountpoint"], read_only=request["read_only"], options=request["options"])
            handle.start()
    except BaseException as exc:
        reply({"error": str(exc)})
        return 1
    reply({"ready": True})
    closed: dict[str, Any] = {"closed": True, "failures": {}}
    try:
        while not _stop.requested:
            with _stop.interruptible():
                line = requests.readline()
            if not line:
                break
            message = json.loads(line)
            if message.get("op") == "forget":
                handle._on_change(fs, "api", tuple(message["paths"]))
                reply({"ack": message["n"]})
            elif message.get("op") == "close":
                break
    finally:
        try:
            handle.close()
        except MountError as exc:
            closed["failures"] = exc.details.get("failed", {})
            for key in ("kept", "recovery_dir", "staging_dir"):
                closed[key] = exc.details.get(key)
            _log.error("%s", exc)
        with contextlib.suppress(OSError):
            reply(closed)
    return 0


def main() -> int:
    """Serve one mount as described on stdin (see the module documentation)."""
    logging.basicConfig(level=logging.WARNING, format="agentvfs mount: %(levelname)s %(message)s")
    # The protocol owns stdout; anything a library prints goes to stderr instead.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer

    signal.signal(signal.SIGTERM, _stop.on_signal)
    _die_with_parent()
    try:
        return _serve(requests, replies)
    except KeyboardInterrupt:
        return 0
    finally:
        # Ignored, not left to the handler: the interpreter's shutdown puts back the default
        # action of a signal it handled, and a late SIGTERM would turn a clean exit into a kill.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
