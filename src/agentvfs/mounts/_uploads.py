"""Streamed uploads: a file written in order from empty is uploaded in parts while it grows.

The staged copy on local disk stays the source of truth: a stream that breaks (the file is
overwritten below what was sent, truncated, renamed) or fails only means the file is
uploaded whole when it is closed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from ..vfs import SupportsStreamingUpload, UploadStream, WorkspaceFilesystem
from ._nodes import Node
from ._options import MountOptions

__all__ = ["Uploads"]

_log = logging.getLogger("agentvfs.mounts")


class _Stream:
    """A streamed upload of a file being written in order: a pump sends the staged bytes in
    parts while the writer goes on; the staged copy stays the source of truth, so a broken
    stream only means the file is uploaded whole at close instead."""

    __slots__ = ("broken", "closing", "lock", "read_to", "sent", "ticketed", "upload", "wake")

    def __init__(self, upload: UploadStream) -> None:
        self.upload = upload
        self.sent = 0
        #: End of the staged bytes read for sending, sent or still in flight: a write below
        #: it changes bytes the upload already holds.
        self.read_to = 0
        self.broken = False
        self.closing = False
        #: The upload was named in the journal (it exists in storage until completed).
        self.ticketed = False
        self.lock = trio.Lock()
        self.wake = trio.Event()


def _stream_done(stream: _Stream) -> bool:
    return stream.broken or stream.closing


class Uploads:
    """The streamed uploads of one mount (one per file being written in order).

    Parameters
    ----------
    filesystem : WorkspaceFilesystem
        Where files go; streams start only where it can (``SupportsStreamingUpload``).
    options : MountOptions
        ``stream_threshold`` and ``stream_part_size``.
    nursery : callable
        Returns the mount's nursery, where the pumps run.
    path_of, shown : callable
        A node's path in the filesystem, and how messages name it.
    journal : callable, optional
        Told ``(node, ticket)`` once a stream exists in storage, and ``(node, None)`` once it
        is completed or aborted, so that a mount killed in between has it aborted later.
    attributes : callable, optional
        A node's :class:`~agentvfs.vfs.PosixAttributes`, where the filesystem keeps them as
        object metadata: a streamed object carries them from its start.
    """

    def __init__(
        self,
        filesystem: WorkspaceFilesystem,
        options: MountOptions,
        nursery: Callable[[], trio.Nursery | None],
        path_of: Callable[[Node], str],
        shown: Callable[[Node], str],
        journal: Callable[[Node, dict[str, str] | None], None] | None = None,
        *,
        attributes: Callable[[Node], Any] | None = None,
    ) -> None:
        self.fs = filesystem
        self.attributes = attributes
        self.options = options
        self.nursery = nursery
        self.path_of = path_of
        self.shown = shown
        self.journal = journal

    def _sent(self, node: Node, stream: _Stream) -> None:
        """After a part went out: name the upload in the journal once storage has it."""
        if stream.ticketed or self.journal is None:
            return
        ticket = getattr(stream.upload, "ticket", None)
        named = ticket() if callable(ticket) else None
        if named:
            stream.ticketed = True
            self.journal(node, named)

    def _ended(self, node: Node, stream: _Stream) -> None:
        if stream.ticketed and self.journal is not None:
            stream.ticketed = False
            self.journal(node, None)

    async def maybe_start(self, node: Node) -> None:
        """Start uploading a file that is being written from empty, in order, once it has
        grown past ``stream_threshold``."""
        if (
            not node.fresh
            or node.size < self.options.stream_threshold
            or len(node.links) != 1
            or not isinstance(self.fs, SupportsStreamingUpload)
            or (nursery := self.nursery()) is None
        ):
            return
        node.fresh = False  # one attempt per fresh write
        path = self.path_of(node)
        extra: dict[str, Any] = {}
        if self.attributes is not None:
            # The object carries the attributes the file has now (object metadata stores).
            node.stream_attrs = self.attributes(node)
            extra = {"attributes": node.stream_attrs, "keep": node.keep}
        try:
            upload = await self.fs.open_upload(path, part_size=self.options.stream_part_size, **extra)
        except Exception as exc:
            _log.warning("streamed upload of /%s not started (%s); it is uploaded at close", path, exc)
            return
        if upload is None:
            return
        stream = _Stream(upload)
        node.stream = stream
        nursery.start_soon(self._pump, node, stream)

    async def _pump(self, node: Node, stream: _Stream) -> None:
        part = self.options.stream_part_size
        try:
            while not stream.broken and not stream.closing:
                if node.size - stream.sent >= part and node.stage is not None:
                    async with stream.lock:
                        if _stream_done(stream):
                            break  # closed or broken while this waited for the lock
                        stream.read_to = stream.sent + part  # before the read: a write may race it
                        data = await trio.to_thread.run_sync(os.pread, node.stage_fd, part, stream.sent)
                        await stream.upload.write(data)
                        stream.sent += len(data)
                        self._sent(node, stream)
                else:
                    stream.wake = trio.Event()
                    await stream.wake.wait()
        except Exception as exc:
            stream.broken = True
            _log.warning("streamed upload of %s failed (%s); it is uploaded whole at close", self.shown(node), exc)

    async def finish(self, node: Node) -> bool:
        """Send what is left and complete the streamed upload; False if the file must be
        uploaded whole instead (the stream broke, or completing it failed)."""
        stream = node.stream
        node.stream = None
        assert isinstance(stream, _Stream)
        stream.closing = True
        stream.wake.set()
        part = self.options.stream_part_size
        async with stream.lock:
            if not stream.broken and node.stage is not None:
                try:
                    while stream.sent < node.size:
                        size = min(part, node.size - stream.sent)
                        stream.read_to = stream.sent + size
                        data = await trio.to_thread.run_sync(os.pread, node.stage_fd, size, stream.sent)
                        await stream.upload.write(data)
                        stream.sent += len(data)
                        self._sent(node, stream)
                    await stream.upload.commit()
                    self._ended(node, stream)
                    return True
                except Exception as exc:
                    _log.warning("streamed upload of %s failed at close (%s); uploading it whole", self.shown(node), exc)
            await stream.upload.abort()
            self._ended(node, stream)
        return False

    def drop(self, node: Node) -> None:
        """The file stopped being a plain in-order write (overwrite, truncate, rename...):
        drop the streamed upload; the staged copy is uploaded whole instead."""
        node.fresh = False
        stream = node.stream
        if stream is None:
            return
        node.stream = None
        assert isinstance(stream, _Stream)
        stream.broken = True
        stream.wake.set()

        async def abort() -> None:
            async with stream.lock:
                await stream.upload.abort()
                self._ended(node, stream)

        nursery = self.nursery()
        if nursery is not None:
            nursery.start_soon(abort)
