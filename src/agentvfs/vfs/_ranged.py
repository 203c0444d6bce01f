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

The same connections answer ``HEAD`` requests where the store signs them (S3): an S3
listing carries no object metadata, so a mount looks up each file new to it, and one HEAD
through s3fs costs about five times the CPU of a plain one.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
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

#: ``sign(backend_path, fresh) -> (url, headers)``: where to GET a file, and the headers that
#: authorise it; ``fresh`` after the last answer was refused (sign the slow, sure way).
Signer = Callable[[str, bool], tuple[str, dict[str, str]]]
#: ``pin(version) -> (headers, query)``: what a GET adds to read only that version of a file.
Pin = Callable[[str], tuple[dict[str, str], str]]


class SignedRangeReader:
    """Ranged GETs of signed URLs on a pool of blocking HTTP connections to one endpoint.

    Parameters
    ----------
    sign : callable
        ``sign(backend_path, fresh) -> (url, headers)``: a URL and the headers that authorise
        a GET of it (none for a signed URL, a bearer token for a store that takes one);
        ``fresh`` is true when the last URL for the path was refused.
    reuse : float
        Seconds one answer of ``sign`` for a path is used again (0: ask each time).
    timeout : float
        Seconds for a connection or a read to make progress.
    ssl_context : ssl.SSLContext, optional
        For ``https`` URLs.
    pin : callable, optional
        ``pin(version) -> (headers, query)``: how a GET reads only one version of a file
        (None: this store's reads cannot be pinned).
    sign_head : callable, optional
        As ``sign``, for a ``HEAD`` of the path (None: :meth:`head` always answers None).
    """

    def __init__(
        self,
        sign: Signer,
        *,
        reuse: float = 0.0,
        timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        pin: Pin | None = None,
        sign_head: Signer | None = None,
    ) -> None:
        self._sign = sign
        self._sign_head = sign_head
        self._pin = pin
        self._reuse = reuse
        self._timeout = timeout
        self._ssl = ssl_context
        self._lock = threading.Lock()
        #: Signed URLs by (method, path), with the time until which each is used again.
        self._urls: OrderedDict[tuple[str, str], tuple[tuple[str, dict[str, str]], float]] = OrderedDict()
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._failures = 0
        self._resting_until = 0.0
        #: ``sign_list(bucket, params)``: a signed listing URL of the store (S3), or None.
        self.sign_list: Callable[[str, Mapping[str, str]], str | None] | None = None

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

    def read_whole_with_headers(self, path: str, *, version: str | None = None) -> tuple[bytes, dict[str, str]] | None:
        """All of ``path`` in one GET and the answer's headers (names in lower case): what a
        ``HEAD`` would tell comes with the bytes. ``None`` and ``version`` as for :meth:`read`."""
        headers: dict[str, str] = {}
        data = self._fetch(path, 0, None, None, version, headers)
        assert not isinstance(data, int)
        return None if data is None else (data, headers)

    def read_into(self, path: str, start: int, buffer: memoryview, *, version: str | None = None) -> int | None:
        """Read bytes from ``start`` of ``path`` into ``buffer`` (as many as it holds, fewer
        at the end of the file); the count, or ``None`` as :meth:`read`. On ``None`` the
        buffer may hold part of the range. ``version`` as for :meth:`read`."""
        count = self._fetch(path, start, start + len(buffer), buffer, version)
        assert not isinstance(count, bytes)
        return count

    def _fetch(
        self,
        path: str,
        start: int,
        end: int | None,
        into: memoryview | None,
        version: str | None = None,
        answer: dict[str, str] | None = None,
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
                return self._get(url, auth, start, end, into, pinned=version is not None, answer=answer)
            except _Refused:
                continue  # signed again, once
            except _VersionGone:
                raise StaleFileError(path, None, None) from None
        return None

    def head(self, path: str) -> dict[str, str] | None:
        """The response headers of a ``HEAD`` of ``path`` (names in lower case), or ``None``
        when this way cannot tell (the caller then asks through fsspec).

        Raises
        ------
        FileNotFoundError
            No object is at ``path`` (404).
        """
        if self._sign_head is None or time.monotonic() < self._resting_until:
            return None
        for fresh_url in (False, True):
            try:
                url, auth = self._url(path, fresh_url, "HEAD")
            except Exception:
                return None  # signing failed: fsspec will tell why
            try:
                return self._head(url, auth, path)
            except _Refused:
                continue  # signed again, once
        return None

    def get_document(self, url: str, *, limit: int = 16 * 1024 * 1024) -> tuple[int, bytes] | None:
        """The status and body of a GET of ``url`` (a request the caller signed, such as a
        listing), on this reader's connections; None when it could not be made or the body
        is over ``limit`` bytes (the caller then asks through fsspec)."""
        if time.monotonic() < self._resting_until:
            return None
        got = self._exchange(url, "GET", {"Accept-Encoding": "identity"}, limit)
        return None if got is None else (got[0].status, got[1])

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- internals ---------------------------------------------------------------------------

    def _url(self, path: str, fresh: bool, method: str = "GET") -> tuple[str, dict[str, str]]:
        sign = self._sign if method == "GET" else self._sign_head
        assert sign is not None
        if self._reuse <= 0:
            return sign(path, fresh)
        now = time.monotonic()
        key = (method, path)
        with self._lock:
            cached = self._urls.get(key)
            if cached is not None and not fresh and cached[1] > now:
                self._urls.move_to_end(key)
                return cached[0]
        url = sign(path, fresh)
        with self._lock:
            self._urls[key] = (url, now + self._reuse)
            self._urls.move_to_end(key)
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
        answer: dict[str, str] | None = None,
    ) -> bytes | int | None:
        where = _where(url)
        if where is None:
            return None
        origin, target = where
        headers = {**auth, "Accept-Encoding": "identity"}
        if end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        # A pooled connection the server closed meanwhile fails at once; one fresh try then.
        for attempt in range(2):
            conn, reused = self._connection(origin)
            try:
                conn.request("GET", target, headers=headers)
                response = conn.getresponse()
                if answer is not None:
                    answer.update((name.lower(), value) for name, value in response.getheaders())
                data, clean = self._body(response, start, end, into, pinned, _Socket(conn.sock, self._timeout))
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

    def _head(self, url: str, auth: dict[str, str], path: str) -> dict[str, str] | None:
        got = self._exchange(url, "HEAD", auth, 0)  # nothing: the answer to a HEAD has no body
        if got is None:
            return None
        response = got[0]
        status = response.status
        if status in (401, 403):
            raise _Refused(status)
        if status == 404:
            raise FileNotFoundError(path)
        if status != 200:
            return None  # a redirect, a throttle, a server error: fsspec retries it
        return {name.lower(): value for name, value in response.getheaders()}

    def _exchange(
        self, url: str, method: str, headers: dict[str, str], limit: int
    ) -> tuple[http.client.HTTPResponse, bytes] | None:
        """One request on a pooled connection (once more on a fresh one when a kept one
        failed) and its whole body of at most ``limit`` bytes; None when it could not be
        made or the body is longer."""
        where = _where(url)
        if where is None:
            return None
        origin, target = where
        for attempt in range(2):
            conn, reused = self._connection(origin)
            try:
                conn.request(method, target, headers=headers)
                response = conn.getresponse()
                if response.length is not None and response.length > limit:
                    conn.close()
                    return None
                body = response.read(limit + 1)
            except (OSError, http.client.HTTPException):
                conn.close()
                if reused and attempt == 0:
                    continue
                self._failed()
                return None
            if len(body) > limit:
                conn.close()
                return None
            if response.will_close:
                conn.close()
            else:
                self._release(origin, conn)
            self._failures = 0
            return response, body
        return None  # pragma: no cover - the loop returns

    @staticmethod
    def _body(
        response: http.client.HTTPResponse,
        start: int,
        end: int | None,
        into: memoryview | None,
        pinned: bool = False,
        sock: _Socket | None = None,
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
            return _read_exactly(response, length, into, sock), True
        if end is not None and status == 206 and length is not None and stored:
            match = _CONTENT_RANGE.fullmatch((response.getheader("Content-Range") or "").strip())
            # Fewer bytes than asked for at the end of the file; anything else is not the range
            # asked for, and fsspec reads it.
            if match is not None and int(match[1]) == start and int(match[2]) - start + 1 == length <= end - start:
                return _read_exactly(response, length, into, sock), True
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


def _where(url: str) -> tuple[tuple[str, str, int], str] | None:
    """The origin (scheme, host, port) and request target of ``url``; None where it is not
    plain HTTP(S)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.scheme, parts.hostname, port), parts.path + (f"?{parts.query}" if parts.query else "")


class _Socket(NamedTuple):
    """The connection's socket, for bodies read straight from it, and the reader's timeout."""

    sock: Any
    timeout: float


#: Bodies from this size on are read into their buffer by the socket itself (see
#: :func:`_recv_body`); smaller ones through ``http.client``.
_DIRECT_BODY = 256 * 1024


def _read_exactly(
    response: http.client.HTTPResponse, length: int, into: memoryview | None, sock: _Socket | None = None
) -> bytes | int:
    """The ``length`` bytes of the body (or their count, read ``into`` the buffer)."""
    if into is not None:
        view = into[:length]
        if sock is not None and length >= _DIRECT_BODY and type(sock.sock) is socket.socket:
            count = _recv_body(response, view, sock)
        else:
            count = response.readinto(view)
        if count != length:
            raise http.client.IncompleteRead(b"", length - count)
        return count
    data = response.read(length)
    if len(data) != length:
        raise http.client.IncompleteRead(data, length - len(data))
    return data


def _recv_body(response: http.client.HTTPResponse, view: memoryview, sock: _Socket) -> int:
    """Read the body of ``response`` into ``view`` (its length) straight from the socket; the
    count (less at an early end of the stream).

    ``http.client`` reads a body through a socket with a timeout: each step is a ``poll`` and
    a ``recv`` of what has arrived (about 64 KiB), and the interpreter lock taken back in
    between, thousands of times per 256 MiB. Here the socket blocks, and one ``recv`` asks the
    kernel for all the bytes (``MSG_WAITALL``): it fills the buffer as they arrive and returns
    once, with the lock released throughout. While more than ``_WAKE_EVERY`` bytes are still
    to come after them, the thread is woken only when that many have arrived
    (``SO_RCVLOWAT``), not for every packet; the last ones are read with the default. The
    reader's timeout is the socket's ``SO_RCVTIMEO``: a call returns what it has read once
    that long has passed, and fails with ``EAGAIN`` if that is nothing.
    """
    fp = response.fp
    assert fp is not None
    # What the header parser read ahead of the body is in the response's buffer: taken first.
    buffered = min(len(fp.peek(1)), len(view))
    count = fp.readinto(view[:buffered]) if buffered else 0
    raw = sock.sock
    kept = raw.gettimeout()
    seconds = max(sock.timeout, 0.001)
    raw.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_RCVTIMEO,
        struct.pack("ll", int(seconds), int((seconds - int(seconds)) * 1_000_000)),
    )
    raw.settimeout(None)
    try:
        # Up to the last _WAKE_EVERY bytes, woken every _WAKE_EVERY bytes: the bytes after
        # the ones asked for always make up the count that wakes the thread.
        bulk = len(view) - _WAKE_EVERY
        if bulk - count > _WAKE_EVERY:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, _WAKE_EVERY)
            try:
                count = _recv_all(raw, view, count, bulk)
            finally:
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        count = _recv_all(raw, view, count, len(view))
    finally:
        raw.settimeout(kept)
    if count == len(view):
        # The whole body is read: the response is complete, and the connection free for the
        # next request.
        response.length = 0
        response.read()
    return count


#: Bytes a large body's reading thread is woken for (see :func:`_recv_body`).
_WAKE_EVERY = 512 * 1024


def _recv_all(raw: socket.socket, view: memoryview, count: int, end: int) -> int:
    """Receive into ``view`` from ``count`` up to ``end``; where it got (less at an early end
    of the stream)."""
    while count < end:
        got = raw.recv_into(view[count:end], end - count, socket.MSG_WAITALL)
        if not got:
            break  # the server closed the connection early
        count += got
    return count


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
    reader = SignedRangeReader(
        way.sign, reuse=way.reuse, timeout=way.timeout, ssl_context=context, pin=way.pin, sign_head=way.sign_head
    )
    reader.sign_list = way.sign_list
    return reader


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
    #: As ``sign``, for a HEAD (None: metadata is asked for through fsspec).
    sign_head: Signer | None = None
    #: ``sign_list(bucket, params) -> url or None``: a signed ``ListObjectsV2`` (S3).
    sign_list: Callable[[str, Mapping[str, str]], str | None] | None = None


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

    signer = _S3Signer(fs)

    def sign(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        return signer.url(path, "GET", fresh=fresh), {}

    def pin(version: str) -> tuple[dict[str, str], str]:
        return {"If-Match": f'"{version}"'}, ""  # not a signed header: the URL stays valid

    def sign_head(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
        # A signature names its method: a URL signed for GET is refused to a HEAD.
        return signer.url(path, "HEAD", fresh=fresh), {}

    timeout = float(config.get("read_timeout") or 60.0)
    return _Way(sign, _EXPIRES / 2, endpoint, verify, timeout, pin, sign_head, signer.list_url)


class _S3Signer:
    """Presigned S3 URLs, signed here with botocore's own query signers.

    ``s3fs.url`` (botocore's ``generate_presigned_url``) resolves the endpoint rules and
    serializes a request for every URL: about 0.6 ms of CPU through s3fs, as much as the
    request it signs. Only the key changes from one URL of a bucket to the next, so the first
    URL of each bucket and method is asked of s3fs as a template (its scheme, host, path
    prefix, signature version and region), and the next ones are built on it and signed with
    the client's current credentials (0.1 ms). Where the template is not one this can
    rebuild exactly (another signer, a key spelled differently, a versioned path), and
    after a few URLs signed here were refused, every URL comes from s3fs again.
    """

    #: Refusals of URLs signed here after which only s3fs signs.
    _REFUSALS = 3
    #: Seconds the frozen credentials are used before asking the client again.
    _CREDENTIALS_TTL = 60.0

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._lock = threading.Lock()
        #: (bucket, method) -> the template, or None where s3fs signs each URL.
        self._templates: dict[tuple[str, str], _Template | None] = {}
        self._credentials: Any = None
        self._credentials_until = 0.0
        self._refusals = 0

    def url(self, path: str, method: str, *, fresh: bool = False) -> str:
        """A URL that ``method`` (GET or HEAD) of the object ``path`` is allowed with; with
        ``fresh`` (the last one was refused), one from s3fs itself."""
        client_method = "get_object" if method == "GET" else "head_object"
        if fresh:
            with self._lock:
                self._refusals += 1
                self._credentials = None
        bucket, _, key = path.partition("/")
        template = self._templates.get((bucket, method), _UNSET)
        if fresh or template is None or self._refusals >= self._REFUSALS or not key:
            return str(self._fs.url(path, expires=_EXPIRES, client_method=client_method))
        if template is _UNSET:
            url = str(self._fs.url(path, expires=_EXPIRES, client_method=client_method))
            self._templates[(bucket, method)] = _Template.of(url, bucket, key)
            return url
        assert isinstance(template, _Template)
        try:
            credentials = None if template.version == "none" else self._frozen_credentials()
            return template.sign(method, key, credentials)
        except Exception:
            self._templates[(bucket, method)] = None  # cannot sign here after all
            return str(self._fs.url(path, expires=_EXPIRES, client_method=client_method))

    def list_url(self, bucket: str, params: Mapping[str, str]) -> str | None:
        """A URL that lists ``bucket`` (``ListObjectsV2`` with ``params``), signed here on the
        template of the bucket's GETs (SigV4 query signing, whatever the template's own
        version); None where there is no template to build on."""
        template = self._templates.get((bucket, "GET"), _UNSET)
        if template is _UNSET:
            self.url(f"{bucket}/agentvfs-listing", "GET")  # makes the template (no request)
            template = self._templates.get((bucket, "GET"))
        if not isinstance(template, _Template) or self._refusals >= self._REFUSALS:
            return None
        try:
            credentials = None if template.version == "none" else self._frozen_credentials()
            region = template.region or getattr(self._fs.s3.meta, "region_name", None) or "us-east-1"
            return template.sign_list(params, credentials, region)
        except Exception:
            return None

    def _frozen_credentials(self) -> Any:
        now = time.monotonic()
        with self._lock:
            if self._credentials is not None and now < self._credentials_until:
                return self._credentials
        from fsspec.asyn import sync

        signer = self._fs.s3._request_signer
        credentials = signer._credentials
        frozen = sync(self._fs.loop, credentials.get_frozen_credentials)  # refreshed as it expires
        with self._lock:
            self._credentials, self._credentials_until = frozen, now + self._CREDENTIALS_TTL
        return frozen


class _Template(NamedTuple):
    """What every presigned URL of one bucket and method shares, read from one s3fs made."""

    #: ``scheme://host``.
    origin: str
    #: The path before the quoted key ("/bucket/" path-style, "/" virtual-hosted).
    prefix: str
    bucket: str
    #: "v4", "v2" or "none" (an anonymous filesystem: unsigned URLs).
    version: str
    region: str
    service: str

    @classmethod
    def of(cls, url: str, bucket: str, key: str) -> _Template | None:
        """The template of ``url`` (the URL s3fs signed for ``key``), or None where a URL
        rebuilt from it might not be the one s3fs would make."""
        parts = urllib.parse.urlsplit(url)
        quoted = _quote_key(key)
        if not parts.path.endswith(quoted) or parts.fragment:
            return None
        prefix = parts.path[: len(parts.path) - len(quoted)]
        if prefix not in ("/", f"/{_quote_key(bucket)}/"):
            return None
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        names = set(query)
        origin = f"{parts.scheme}://{parts.netloc}"
        if not names:
            return cls(origin, prefix, bucket, "none", "", "")
        if names == {"AWSAccessKeyId", "Signature", "Expires"} or names == {
            "AWSAccessKeyId", "Signature", "Expires", "x-amz-security-token"
        }:  # fmt: skip
            return cls(origin, prefix, bucket, "v2", "", "")
        v4 = {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
              "X-Amz-Signature"}  # fmt: skip
        if names - {"X-Amz-Security-Token"} == v4 and query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]:
            if query["X-Amz-SignedHeaders"] != ["host"]:
                return None
            scope = query["X-Amz-Credential"][0].split("/")
            if len(scope) != 5 or scope[4] != "aws4_request":
                return None
            return cls(origin, prefix, bucket, "v4", scope[2], scope[3])
        return None

    def sign_list(self, params: Mapping[str, str], credentials: Any, region: str) -> str:
        """A ``ListObjectsV2`` URL of the bucket with ``params``, signed (SigV4) with
        ``credentials`` (frozen) for ``region``."""
        from botocore.auth import S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest

        path = self.prefix[:-1] if self.prefix != "/" else "/"
        query = urllib.parse.urlencode(sorted(params.items()), quote_via=urllib.parse.quote, safe="-_.~")
        url = f"{self.origin}{path}?{query}"
        if self.version == "none":
            return url
        if credentials is None:
            raise ValueError("no credentials to sign with")
        request = AWSRequest(method="GET", url=url, headers={})
        S3SigV4QueryAuth(credentials, self.service or "s3", region, expires=_EXPIRES).add_auth(request)
        return str(request.prepare().url)

    def sign(self, method: str, key: str, credentials: Any) -> str:
        """The URL for ``method`` of ``key``, signed with ``credentials`` (frozen)."""
        from botocore.auth import HmacV1QueryAuth, S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest

        quoted = _quote_key(key)
        url = f"{self.origin}{self.prefix}{quoted}"
        if self.version == "none":
            return url
        if credentials is None:
            raise ValueError("no credentials to sign with")
        request = AWSRequest(method=method, url=url, headers={})
        if self.version == "v2":
            # The string signed names the bucket whichever way the URL does.
            request.auth_path = f"/{_quote_key(self.bucket)}/{quoted}"
            HmacV1QueryAuth(credentials, expires=_EXPIRES).add_auth(request)
        else:
            S3SigV4QueryAuth(credentials, self.service, self.region, expires=_EXPIRES).add_auth(request)
        return str(request.prepare().url)


#: Not looked at yet (``_S3Signer._templates``).
_UNSET: Any = object()


def _quote_key(key: str) -> str:
    """A key as botocore puts it in a URL path."""
    return urllib.parse.quote(key, safe="/~")


def _gcs_way(fs: Any) -> _Way | None:
    """gcsfs: the object's media URL with the filesystem's own bearer token (refreshed by its
    credentials object as it expires), asked for at each read."""
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None or not isinstance(fs, gcsfs.GCSFileSystem) or type(fs).url is not gcsfs.GCSFileSystem.url:
        return None
    if fs.requester_pays or getattr(fs, "session_kwargs", None) or getattr(fs, "_use_client_cert", False):
        return None  # a billed project, a custom session or a client certificate
    location = fs._location

    def sign(path: str, fresh: bool) -> tuple[str, dict[str, str]]:
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
