"""Checkpoints and undo (``tools={"checkpoints": True}``).

Before each *batch* of write-tool calls the workspace takes a snapshot, a checkpoint;
``mastra_workspace_undo`` restores the newest one and forgets it. A batch is a run of
filesystem write-tool calls (``write_file``, ``edit_file``, ``delete``, ``mkdir``) with no
other tool call in between and no pause longer than ``quiet_ms`` (default 30 s) between two
of them: the first write after a read, a search, a command or an undo, or after a quiet
period, starts a new batch. Calls running at once (a model's parallel tool calls) share the
batch of the first.

Undo restores only the paths the batch's calls named (and what is below them), so changes
made elsewhere are kept; a path that changed again after the batch wrote it (by someone
else, or by a command) is a conflict: left as it is and named in the tool's answer.

A shell command (``execute_command``, unless ``checkpoints.commands`` is False) is a batch
of its own: a checkpoint is taken before it, and once it has run, every path that differs
from that checkpoint is what it touched. Undo takes those back like a batch's. A process
started in the background changes files after its call has returned; it is not covered.
The comparison costs one listing of the workspace after each command, plus reading the
files whose size or time changed.

The newest ``keep`` checkpoints (default 20) are kept. The snapshot of one dropped past
that, or undone, is deleted from the store (its manifest: a full listing of the workspace,
some 200 bytes a file), so a long session does not pile manifests up in storage.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from ..vfs import WorkspaceFilesystem
from ._core import ToolCall, ToolFailure, ToolSpec
from ._names import WORKSPACE_TOOLS

if TYPE_CHECKING:
    from ._host import ToolHost

__all__ = ["UNDO", "Checkpoints", "checkpoints_of"]

_STATE_KEY = "checkpoints"

_log = logging.getLogger("agentvfs.tools")

#: Seconds a checkpoint waits for a garbage collection of the snapshot store under way.
LOCK_WAIT = 10.0

#: What a path looked like: (type, etag, size, mtime), or None when nothing is there.
_Seen = tuple[str, str | None, int, float] | None


async def _seen(fs: WorkspaceFilesystem, path: str) -> _Seen:
    try:
        stat = await fs.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.type == "directory":
        return ("directory", None, 0, 0.0)  # its times change with what is put in it
    return (stat.type, stat.etag, stat.size, stat.modified_at.timestamp())


@dataclass
class _Checkpoint:
    snapshot_id: str
    calls: int = 0
    #: Each path a write tool named in the batch, as the batch left it (for a command: each
    #: path that differed from the checkpoint once it had run).
    touched: dict[str, _Seen] = field(default_factory=dict)
    #: What the batch was: "write" tool calls or a shell "command".
    kind: str = "write"


class Checkpoints:
    """One workspace's checkpoint stack and the state of its current batch."""

    def __init__(self) -> None:
        self.stack: list[_Checkpoint] = []
        self._open = False  # the last tool call was a write of the current batch
        self._last_write = 0.0
        self._lock = anyio.Lock()

    def note_other_call(self) -> None:
        """A tool call that is not a filesystem write: the next write starts a new batch."""
        self._open = False

    async def before_write(self, host: ToolHost, quiet_ms: float, keep: int) -> _Checkpoint:
        """Take a checkpoint if this write starts a batch (dropping the oldest past ``keep``);
        return the batch's checkpoint."""
        async with self._lock:
            now = time.monotonic()
            fresh = not self._open or not self.stack or (now - self._last_write) * 1000 > quiet_ms
            if fresh:
                try:
                    snapshot = await host.snapshot("checkpoint", lock_wait=LOCK_WAIT)
                except TimeoutError as exc:
                    # A write is not held up for long by a collection of the store: it fails,
                    # saying why, and the agent may try again.
                    raise TimeoutError(f"no checkpoint could be taken before this write: {exc}") from None
                self.stack.append(_Checkpoint(snapshot.id))
                while len(self.stack) > keep:
                    await forget(host, self.stack.pop(0))
            self._open = True
            self._last_write = now
            current = self.stack[-1]
            current.calls += 1
            return current

    async def before_command(self, host: ToolHost, keep: int) -> _Checkpoint:
        """Take the checkpoint of a shell command: a batch of its own (the next write starts
        another)."""
        async with self._lock:
            try:
                snapshot = await host.snapshot("checkpoint", lock_wait=LOCK_WAIT)
            except TimeoutError as exc:
                raise TimeoutError(f"no checkpoint could be taken before this command: {exc}") from None
            checkpoint = _Checkpoint(snapshot.id, calls=1, kind="command")
            self.stack.append(checkpoint)
            while len(self.stack) > keep:
                await forget(host, self.stack.pop(0))
            self._open = False
            return checkpoint

    async def after_command(self, checkpoint: _Checkpoint, host: ToolHost) -> None:
        """Record what the command changed: each path that differs from its checkpoint, as
        the command left it. Should that comparison fail, the command's result still stands:
        the checkpoint then undoes nothing, and the log says why."""
        fs = host.filesystem
        if fs is None:  # pragma: no cover - checkpoints need a static filesystem
            return
        try:
            diff = await host.diff(checkpoint.snapshot_id, None, patches=False)
            for change in diff.changes:
                checkpoint.touched[change.path] = await _seen(fs, change.path)
        except Exception as exc:
            _log.warning("what a command changed is unknown, so undo cannot take it back: %s", exc)
        self._open = False

    async def new_parent(self, fs: WorkspaceFilesystem, path: str) -> str | None:
        """The topmost missing directory above ``path`` (a write may make it), if any."""
        parts = [p for p in path.strip("/").split("/") if p][:-1]
        for i in range(1, len(parts) + 1):
            above = "/".join(parts[:i])
            if await _seen(fs, above) is None:
                return above
        return None

    async def after_write(
        self, checkpoint: _Checkpoint, fs: WorkspaceFilesystem, path: str, made: str | None = None
    ) -> None:
        for touched in (made, path):
            if touched is not None:
                checkpoint.touched[touched] = await _seen(fs, touched)
        self._last_write = time.monotonic()

    def pop(self) -> _Checkpoint | None:
        self._open = False
        return self.stack.pop() if self.stack else None


async def forget(host: ToolHost, checkpoint: _Checkpoint) -> None:
    """Delete the snapshot of a checkpoint no undo will use. A failure is logged: the
    manifest is left behind, which costs storage, never a write."""
    try:
        await host.delete_snapshot(checkpoint.snapshot_id)
    except Exception as exc:
        _log.warning("checkpoint %s was not deleted: %s", checkpoint.snapshot_id[:12], exc)


def checkpoints_of(host: ToolHost) -> Checkpoints:
    """The workspace's checkpoints (made on first use, kept as long as the workspace)."""
    state = host._tool_state
    found = state.get(_STATE_KEY)
    if found is None:
        found = state[_STATE_KEY] = Checkpoints()
    assert isinstance(found, Checkpoints)
    return found


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


async def _undo(call: ToolCall) -> str:
    host = call.workspace
    fs = host.filesystem
    checkpoints = checkpoints_of(host)
    checkpoint = checkpoints.pop()
    if checkpoint is None:
        return ToolFailure("Nothing to undo: no checkpoint is left (one is taken before each batch of file changes)")
    if fs is None:  # pragma: no cover - checkpoints need a static filesystem (checked when tools are built)
        return ToolFailure("Nothing to undo: the workspace has no filesystem")
    conflicts: list[str] = []
    paths: list[str] = []
    for path, seen in checkpoint.touched.items():
        if await _seen(fs, path) != seen:
            conflicts.append(f"  {path}: changed since the undone calls wrote it")
        else:
            paths.append(path)
    restored: tuple[str, ...] = ()
    if paths:
        result = await host.restore(checkpoint.snapshot_id, paths, force=True)
        restored = result.restored
        conflicts += [f"  {c.path}: {c.reason}" for c in result.conflicts]
        if checkpoints.stack:
            # The batch before saw these paths as the restore left them: keep its guards true.
            below = checkpoints.stack[-1].touched
            for path in below:
                if any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths):
                    below[path] = await _seen(fs, path)
    what = _plural(checkpoint.calls, "write tool call" if checkpoint.kind == "write" else "command")
    lines = [f"Undid {what}: restored {_plural(len(restored), 'path')} to checkpoint {checkpoint.snapshot_id[:12]}"]
    lines += [f"  {p}" for p in restored]
    if conflicts:
        lines.append(f"Kept {_plural(len(conflicts), 'path')} that changed since (not restored):")
        lines += conflicts
    lines.append(f"{_plural(len(checkpoints.stack), 'checkpoint')} left")
    await forget(host, checkpoint)
    return "\n".join(lines)


UNDO = ToolSpec(
    name=WORKSPACE_TOOLS.CHECKPOINTS.UNDO,
    description=(
        "Undo the last batch of file changes made with the workspace file tools (write, edit, "
        "delete, mkdir), or by the last shell command: the files and directories they changed "
        "are restored to the checkpoint taken before. Call it again to undo the batch before. "
        "Changes made since by anyone else are kept and reported. Processes started in the "
        "background are not covered."
    ),
    schema={"type": "object", "properties": {}, "additionalProperties": False},
    run=_undo,
    needs="workspace",
    enabled_by_default=False,
)
