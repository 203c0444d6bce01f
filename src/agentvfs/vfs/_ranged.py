"""Ranged reads of object-store files over plain HTTP, through signed URLs.

fsspec's object stores read through aiohttp on fsspec's one event-loop thread: every ranged
read of every worker thread hands its bytes through that thread in small flow-control steps
and joins them at the end, which on a two-core machine costs as much CPU as the server
sending them. A signed URL is a plain HTTP resource: a blocking ``http.client`` connection
in the calling worker thread reads the response straight into one ``bytes`` object (one copy
out of the socket) with the GIL released while it waits.

Only what can be mirrored exactly takes this way: s3fs (a presigned URL from its ``url``) and
gcsfs (the object's media URL with the filesystem's own bearer token), without request
settings that a plain GET would not carry (requester pays, extra request arguments, proxies,
a custom session or client certificate). Any answer but the range asked for, and any transport error,
returns ``None`` and the caller reads through fsspec as before: its retries, and the errors it
translates, stay the source of truth.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import StaleFileError

__all__ = ["SignedRangeReader", "signed_range_reader"]

#: Lifetime asked for each signed URL; one is reused for half of it.
_EXPIRES = 3600
#: Signed URLs kept (one per file read recently).
_URL_CACHE = 4096
#: Idle connections kept per reader (a mount runs up to 16 fetches at once).
_IDLE_CONNECTIONS = 32
#: After this many transport failures in a row the reader rests for _REST seconds.
_FAILURES_BEFORE_REST = 3
_REST = 30.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

#: ``sign(backend_path) -> (url, headers)``: where to GET a file, and the headers that
#: authorise it.
Signer = Callable[[str], tuple[str, dict[str, str]]]
#: ``pin(version) -> (headers, query)``: what a GET adds to read only that version of a file.
Pin = Callable[[str], tuple[dict[str, str], str]]


class SignedRangeReader:
    """Ranged GETs of signed URLs on a pool of blocking HTTP connections to one endpoint.

    Parameters
    ----------
    sign : callable
        ``sign(backend_path) -> (url, headers)``: a URL and the headers that authorise a GET
        of it (none for a signed URL, a bearer token for a store that takes one).
    reuse : float
        Seconds one answer of ``sign`` for a path is used again (0: ask each time).
    timeout : float
        Seconds for a connection or a read to make progress.
    ssl_context : ssl.SSLContext, optional
        For ``https`` URLs.
    pin : callable, optional
        ``pin(version) -> (headers, query)``: how a GET reads only one version of a file
        (None: this store's reads cannot be pinned).
    """

    def __init__(
        self,
        sign: Signer,
        *,
        reuse: float = 0.0,
        timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        pin: Pin | None = None,
    ) -> None:
        self._sign = sign
        self._pin = pin
        self._reuse = reuse
        self._timeout = timeout
        self._ssl = ssl_context
        self._lock = threading.Lock()
        self._urls: OrderedDict[str, tuple[tuple[str, dict[str, str]], float]] = OrderedDict()
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._failures = 0
        self._resting_until = 0.0

    def read(self, path: str, start: int, end: int, *, version: str | None = None) -> bytes | None:
        """Bytes ``start`` to ``end`` (exclusive) of ``path``, fewer at the end of the file;
        ``None`` when this way cannot tell (the caller then reads through fsspec).

        With ``version`` (an ETag, a generation) only of that version of the file.

        Raises
        ------
        StaleFileError
            ``version`` is not the file's version any more, or the file is gone.
        """
        data = self._fetch(path, start, end, None, version)
        assert not isinstance(data, int)
        return data

    def read_whole(self, path: str) -> bytes | None:
        """All of ``path`` in one GET (no ``Range``), or ``None`` as :meth:`read`."""
        data = self._fetch(path, 0, None, None)
        assert not isinstance(data, int)
        return data

    def read_into(self, path: str, start: int, buffer: memoryview, *, version: str | None = None) -> int | None:
        """Read bytes from ``start`` of ``path`` into ``buffer`` (as many as it holds, fewer
        at the end of the file); the count, or ``None`` as :meth:`read`. On ``None`` the
        buffer may hold part of the range. ``version`` as for :meth:`read`."""
        count = self._fetch(path, start, start + len(buffer), buffer, version)
        assert not isinstance(count, bytes)
        return count

    def _fetch(
        self, path: str, start: int, end: int | None, into: memoryview | None, version: str | None = None
    ) -> bytes | int | None:
        """One GET of ``start`` to ``end``, or of the whole file when ``end`` is None."""
        if (end is not None and end <= start) or time.monotonic() < self._resting_until:
            return None
        if version is not None and self._pin is None:
            return None  # this store's URLs cannot name a version: fsspec reads it
        for fresh_url in (False, True):
            try:
                url, auth = self._url(path, fresh_url)
            except Exception:
                return None  # signing failed: fsspec will tell why
            if version is not None:
                assert self._pin is not None
                extra, query = self._pin(version)
                auth = {**auth, **extra}
                if query:
                    url += ("&" if "?" in url else "?") + query
            try:
                return self._get(url, auth, start, end, into, pinned=version is not None)
            except _Refused:
                continue  # signed again, once
            except _VersionGone:
                raise StaleFileError(path, None, None) from None
        return None

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- internals ---------------------------------------------------------------------------

    def _url(self, path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        if self._reuse <= 0:
            return self._sign(path)
        now = time.monotonic()
        with self._lock:
            cached = self._urls.get(path)
            if cached is not None and not fresh and cached[1] > now:
                self._urls.move_to_end(path)
                return cached[0]
        url = self._sign(path)
        with self._lock:
            self._urls[path] = (url, now + self._reuse)
            self._urls.move_to_end(path)
            while len(self._urls) > _URL_CACHE:
                self._urls.popitem(last=False)
        return url

    def _get(
        self,
        url: str,
        auth: dict[str, str],
        start: int,
        end: int | None,
        into: memoryview | None,
        *,
        pinned: bool = False,
    ) -> bytes | int | None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
        origin = (parts.scheme, parts.hostname, port)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        headers = {**auth, "Accept-Encoding": "identity"}
        if end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        # A pooled connection the server closed meanwhile fails at once; one fresh try then.
        for attempt in range(2):
            conn, reused = self._connection(origin)
            try:
                conn.request("GET", target, headers=headers)
                response = conn.getresponse()
                data, clean = self._body(response, start, end, into, pinned)
            except (_Refused, _VersionGone):
                conn.close()
                raise
            except (OSError, http.client.HTTPException):
                conn.close()
                if reused and attempt == 0:
                    continue
                self._failed()
                return None
            if clean and not response.will_close:
                self._release(origin, conn)
            else:
                conn.close()
            self._failures = 0
            return data
        return None  # pragma: no cover - the loop returns

    @staticmethod
    def _body(
        response: http.client.HTTPResponse, start: int, end: int | None, into: memoryview | None, pinned: bool = False
    ) -> tuple[bytes | int | None, bool]:
        """What the response gives (its bytes, or their count once read ``into`` the
        buffer), and whether it was read to its end (the connection can carry the next
        request).

        Raises
        ------
        _Refused
            On 401 and 403: the URL or token may have expired (or the credentials behind it
            rotated), so it is worth signing again once.
        """
        status = response.status
        length = response.length
        # Bytes as stored only: a store that transcodes (GCS serves gzip-encoded objects
        # decompressed, whole) is left to fsspec.
        stored = (response.getheader("Content-Encoding") or "identity").strip().lower() == "identity"
        if end is None and status == 200 and length is not None and stored:
            return _read_exactly(response, length, into), True
        if end is not None and status == 206 and length is not None and stored:
            match = _CONTENT_RANGE.fullmatch((response.getheader("Content-Range") or "").strip())
            # Fewer bytes than asked for at the end of the file; anything else is not the range
            # asked for, and fsspec reads it.
            if match is not None and int(match[1]) == start and int(match[2]) - start + 1 == length <= end - start:
                return _read_exactly(response, length, into), True
        if status not in (200, 206) and length is not None and length <= 64 * 1024:
            response.read()  # a small error body, drained so the connection can be kept
            clean = True
        else:
            clean = False
        if status in (401, 403):
            raise _Refused(status)
        if pinned and status in (404, 412):
            # Not that version any more: replaced (412), or renamed or deleted (404).
            raise _VersionGone(status)
        return None, clean

    def _connection(self, origin: tuple[str, str, int]) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(origin)
            if idle:
                return idle.pop(), True
        scheme, host, port = origin
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=self._timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self._timeout)
        return conn, False

    def _release(self, origin: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < _IDLE_CONNECTIONS:
                idle.append(conn)
                return
        conn.close()

    def _failed(self) -> None:
        self._failures += 1
        if self._failures >= _FAILURES_BEFORE_REST:
            self._failures = 0
            self._resting_until = time.monotonic() + _REST


def _read_exactly(response: http.client.HTTPResponse, length: int, into: memoryview | None) -> bytes | int:
    """The ``length`` bytes of the body (or their count, read ``into`` the buffer)."""
    if into is not None:
        count = response.readinto(into[:length])
        if count != length:
            raise http.client.IncompleteRead(b"", length - count)
        return count
    data = response.read(length)
    if len(data) != length:
        raise http.client.IncompleteRead(data, length - len(data))
    return data


class _Refused(Exception):
    """The server refused the URL or its headers (401, 403)."""


class _VersionGone(Exception):
    """The version a read was pinned to is not there any more (412, 404)."""


def signed_range_reader(fs: Any) -> SignedRangeReader | None:
    """A :class:`SignedRangeReader` for the fsspec filesystem ``fs``, or None where its reads
    must go through fsspec (not a store that signs URLs, or settings a URL cannot carry)."""
    way = _s3_way(fs) or _gcs_way(fs)
    if way is None or _proxied(way.endpoint):
        return None
    try:
        if way.verify is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif isinstance(way.verify, str):
            context = ssl.create_default_context(cafile=way.verify)
        else:
            import certifi  # what botocore and aiohttp's users verify against

            context = ssl.create_default_context(cafile=certifi.where())
    except (OSError, ssl.SSLError, ImportError):
        return None
    return SignedRangeReader(way.sign, reuse=way.reuse, timeout=way.timeout, ssl_context=context, pin=way.pin)


class _Way(NamedTuple):
    """How to read one store's files through URLs."""

    sign: Signer
    #: Seconds one signature is used again.
    reuse: float
    #: The store's endpoint, for the proxy check.
    endpoint: str
    #: TLS verification as the store's client does it: False, a CA bundle, or None (default).
    verify: Any
    timeout: float
    #: ``pin(version) -> (headers, query)``: what makes a GET read only that version.
    pin: Pin | None = None


def _s3_way(fs: Any) -> _Way | None:
    """s3fs: presigned URLs, each used for half its life."""
    s3fs = sys.modules.get("s3fs")  # not imported: ``fs`` cannot be one of its filesystems
    if s3fs is None or not isinstance(fs, s3fs.S3FileSystem) or type(fs).url is not s3fs.S3FileSystem.url:
        return None
    if fs.s3_additional_kwargs or fs.req_kw:
        return None  # SSE-C keys, requester pays ...: headers a plain GET would not send
    client_kwargs = dict(fs.client_kwargs or {})
    config = dict(fs.config_kwargs or {})
    if config.get("proxies"):
        return None
    endpoint = fs.endpoint_url or client_kwargs.get("endpoint_url") or "https://s3.amazonaws.com"
    verify = client_kwargs.get("verify", os.environ.get("AWS_CA_BUNDLE") or None)

    def sign(path: str) -> tuple[str, dict[str, str]]:
        url: str = fs.url(path, expires=_EXPIRES)
        return url, {}

    def pin(version: str) -> tuple[dict[str, str], str]:
        return {"If-Match": f'"{version}"'}, ""  # not a signed header: the URL stays valid

    return _Way(sign, _EXPIRES / 2, endpoint, verify, float(config.get("read_timeout") or 60.0), pin)


def _gcs_way(fs: Any) -> _Way | None:
    """gcsfs: the object's media URL with the filesystem's own bearer token (refreshed by its
    credentials object as it expires), asked for at each read."""
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None or not isinstance(fs, gcsfs.GCSFileSystem) or type(fs).url is not gcsfs.GCSFileSystem.url:
        return None
    if fs.requester_pays or getattr(fs, "session_kwargs", None) or getattr(fs, "_use_client_cert", False):
        return None  # a billed project, a custom session or a client certificate
    location = fs._location

    def sign(path: str) -> tuple[str, dict[str, str]]:
        headers: dict[str, str] = {}
        fs.credentials.apply(headers)
        url: str = fs.url(path)
        return url, headers

    def pin(version: str) -> tuple[dict[str, str], str]:
        # That generation itself: served while the bucket keeps it (versioned buckets keep
        # replaced ones), 404 once it is gone.
        return {}, f"generation={urllib.parse.quote(version)}"

    return _Way(sign, 0.0, location, None, 60.0, pin)


def _proxied(url: str) -> bool:
    """True when the environment routes requests to ``url`` through a proxy."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")
