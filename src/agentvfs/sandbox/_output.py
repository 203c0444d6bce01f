"""What a sandbox keeps of a command's output: the newest bytes of each stream, bounded."""

from __future__ import annotations

import codecs
import math
from collections import deque

__all__ = ["DEFAULT_MAX_RETAINED_BYTES", "RetainedOutputBuffer", "check_max_retained_bytes"]


#: Output kept per stream of a spawned process unless ``max_retained_bytes`` says otherwise.
DEFAULT_MAX_RETAINED_BYTES = 1 << 20


def check_max_retained_bytes(value: object, name: str = "max_retained_bytes") -> int | float:
    """Return ``value`` if it is a valid retention limit: a non-negative integer or ``math.inf``.

    Raises
    ------
    ValueError
        ``value`` is negative, fractional, NaN, a bool or not a number; the message names
        ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a non-negative integer or math.inf, got {value!r}")
    if isinstance(value, float):
        if value == math.inf:
            return value
        if math.isnan(value) or not value.is_integer():
            raise ValueError(f"{name} must be a non-negative integer or math.inf, got {value!r}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer or math.inf, got {value!r}")
    return value


def _utf8_len(text: str) -> int:
    # str.isascii() is O(1) for CPython's compact ASCII strings: the common case costs nothing.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class RetainedOutputBuffer:
    """The newest ``max_bytes`` UTF-8 bytes of a stream of output.

    Bytes are decoded incrementally, so a character split across two reads is decoded
    whole (invalid UTF-8 becomes U+FFFD). When the text grows past ``max_bytes``, whole
    code points are dropped from the front; ``dropped_bytes`` counts them and
    ``truncated`` says whether any were. ``math.inf`` keeps everything.

    Not thread-safe: the owner serialises access.

    Parameters
    ----------
    max_bytes : int or math.inf
        How many UTF-8 bytes to keep.

    Raises
    ------
    ValueError
        ``max_bytes`` is not a non-negative integer or ``math.inf``.
    """

    __slots__ = ("_chunks", "_decoder", "_size", "_sizes", "dropped_bytes", "max_bytes")

    def __init__(self, max_bytes: int | float = DEFAULT_MAX_RETAINED_BYTES) -> None:
        self.max_bytes = check_max_retained_bytes(max_bytes, "max_bytes")
        self._chunks: deque[str] = deque()
        self._sizes: deque[int] = deque()
        self._size = 0
        self.dropped_bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def truncated(self) -> bool:
        """Whether output was dropped from the front."""
        return self.dropped_bytes > 0

    @property
    def retained_bytes(self) -> int:
        """UTF-8 bytes currently kept."""
        return self._size

    @property
    def text(self) -> str:
        """The retained text."""
        if len(self._chunks) > 1:
            # Join once and keep the result, so repeated reads cost nothing.
            joined = "".join(self._chunks)
            self._chunks.clear()
            self._sizes.clear()
            self._chunks.append(joined)
            self._sizes.append(self._size)
        return self._chunks[0] if self._chunks else ""

    def write(self, data: bytes) -> str:
        """Decode ``data`` (continuing any character split by the previous write), retain it,
        and return the decoded text (empty while a character is incomplete)."""
        text = self._decoder.decode(data)
        self.append(text)
        return text

    def flush(self) -> str:
        """End the byte stream: an incomplete trailing character becomes U+FFFD, which is
        retained and returned."""
        text = self._decoder.decode(b"", final=True)
        self.append(text)
        return text

    def append(self, text: str) -> None:
        """Retain already-decoded text."""
        if not text:
            return
        size = _utf8_len(text)
        self._chunks.append(text)
        self._sizes.append(size)
        self._size += size
        if self._size > self.max_bytes:
            self._trim()

    def _trim(self) -> None:
        excess = self._size - self.max_bytes
        while excess > 0:
            first = self._sizes[0]
            if first <= excess:
                self._chunks.popleft()
                self._sizes.popleft()
                self._size -= first
                self.dropped_bytes += first
                excess -= first
                continue
            chunk = self._chunks[0]
            cut = int(excess)
            if chunk.isascii():
                rest = chunk[cut:]
            else:
                raw = chunk.encode("utf-8", "surrogatepass")
                # Never split a character: move the cut forward past continuation bytes.
                while cut < len(raw) and raw[cut] & 0xC0 == 0x80:
                    cut += 1
                rest = raw[cut:].decode("utf-8", "surrogatepass")
            self._chunks[0] = rest
            self._sizes[0] = first - cut
            self._size -= cut
            self.dropped_bytes += cut
            return

    def __repr__(self) -> str:
        return f"RetainedOutputBuffer(max_bytes={self.max_bytes}, retained={self._size}, dropped={self.dropped_bytes})"
