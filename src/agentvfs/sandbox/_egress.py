"""Network egress by allow-list: an HTTP(S) proxy on the host, reached from inside bubblewrap.

With ``native_sandbox={"allowed_hosts": [...]}`` a command still runs in a network namespace
of its own (no route anywhere, only its own loopback), and the only way out is this proxy:

* **host side** (:class:`EgressProxy`): a small HTTP proxy serving connections that reach it
  over a socket pair of its own, never through a path: it accepts ``CONNECT host:port``
  (HTTPS and any other TLS or TCP protocol a client tunnels) and plain HTTP requests in
  absolute form (``GET http://host/path``), checks the host against the allow-list, and
  either connects to it (the host's own resolver picks the address) or answers
  ``403 Forbidden`` with a body that says which host was refused and what is allowed.
* **sandbox side**: each command inherits the other end of the pair (a ``SOCK_SEQPACKET``
  socket), and before the command starts a forwarder (this Python, standard library only)
  listens on ``127.0.0.1:3128`` inside the namespace; for each connection it makes a socket
  pair and hands one end to the proxy over the inherited socket (``SCM_RIGHTS``), then relays
  between the two. ``HTTP_PROXY``, ``HTTPS_PROXY``, ``http_proxy`` and ``https_proxy`` point
  at it; ``NO_PROXY``/``no_proxy`` keep the sandbox's own loopback direct. Tools that honour
  these variables (curl, pip, git, npm, Python's urllib and requests...) work unchanged;
  anything that connects directly finds no network.

Nothing of the proxy is on the host's filesystem: no other sandbox can find, replace or
connect to it, whatever paths it may write. Only the processes of the sandbox's own commands
hold its end (the command inherits it too, and may hand the proxy connections itself: the
same reach it has through ``127.0.0.1:3128``). The proxy takes only unix stream sockets from
that end and serves at most 64 connections at a time.

A plain HTTP request goes upstream as one request: its ``Host`` header is the authority of
the URL that was checked (whatever ``Host`` the client sent is dropped, so a virtual host
behind an allowed address cannot be named), its body is framed by the proxy
(``Content-Length`` or chunked, re-chunked canonically; a request with both, or with a framing
the proxy cannot read, gets ``400``), and the connection ends with the response: a second
request pipelined on it is never forwarded (clients retry it on a new connection, as
HTTP/1.1 lets them). A ``CONNECT`` tunnel carries bytes the proxy does not read: the name a
TLS client sends inside (SNI) and the ``Host`` of requests inside the tunnel are not
checked, so a client can ask the allowed host:port for any other name the server there
answers to (virtual hosts, a CDN's other customers). The allow-list decides which address
and port are reached, not which site on them.

Patterns: ``example.org`` matches that name only; ``*.example.org`` matches every name below
it (not ``example.org`` itself); either may end in ``:port`` to allow that port only (any
port otherwise). IP addresses match only when listed literally (``127.0.0.1``, ``[::1]``).
Names are compared case-insensitively, without a trailing dot. The check is on the name the
client asked for: an allowed name that resolves to a private address is still reached.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import re
import selectors
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "FORWARDER_SCRIPT",
    "EgressProxy",
    "HostPattern",
    "host_allowed",
    "parse_host_patterns",
    "proxy_environment",
]

_log = logging.getLogger("agentvfs.sandbox")

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_HEAD_LIMIT = 64 * 1024
_CONNECT_TIMEOUT = 10.0
_CLIENT_TIMEOUT = 30.0
_MAX_CONNECTIONS = 64
# Descriptors taken from one message of the socket pair (a forwarder sends one).
_FDS_PER_MESSAGE = 4
_CHUNK = 64 * 1024

# Headers that belong to the hop between client and proxy, not to the origin server (plus the
# client's Host, which the proxy writes itself from the URL it checked). An upgrade (a
# WebSocket over plain HTTP) is not passed on: the connection carries one request only.
_HOP_HEADERS = frozenset(
    {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "trailer", "upgrade", "host"}
)
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_VERSION = re.compile(r"^HTTP/[0-9]\.[0-9]$")
_CHUNK_LINE_LIMIT = 4096


class _Refused(Exception):
    """A request the proxy does not forward: ``reply`` is the answer to the client."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply)
        self.reply = reply


class _RequestBody:
    """The body of one plain HTTP request in the client's byte stream (RFC 9112, section 6).

    :meth:`feed` takes whatever the client sends and returns the bytes to send upstream: the
    body's own (chunks re-encoded as ``<hex size>\\r\\n<data>\\r\\n``, extensions and trailers
    dropped, so the upstream reads exactly the framing this parser read), nothing after its
    end. A request with neither ``Content-Length`` nor ``Transfer-Encoding`` has no body.
    """

    def __init__(self, length: int, *, chunked: bool) -> None:
        self.chunked = chunked
        self._left = length  # bytes of the current chunk (or of the whole body) still due
        self._state = "size" if chunked else ("data" if length else "done")
        self._line = b""

    @property
    def done(self) -> bool:
        """The whole body went by; whatever the client sends now is not forwarded."""
        return self._state == "done"

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` that belongs upstream.

        Raises
        ------
        ValueError
            The chunked framing is malformed (a size that is not hex, a chunk not followed by
            CRLF, a line over 4 KiB).
        """
        out = bytearray()
        while data and not self.done:
            if self._state == "data":
                piece, data = data[: self._left], data[self._left :]
                self._left -= len(piece)
                if self.chunked:
                    out += piece
                    if not self._left:
                        self._state = "crlf"
                        out += b"\r\n"
                else:
                    out += piece
                    if not self._left:
                        self._state = "done"
                continue
            # A line: a chunk size, the CRLF after a chunk's data, or a trailer.
            end = data.find(b"\n")
            if end < 0:
                self._line += data
                data = b""
                if len(self._line) > _CHUNK_LINE_LIMIT:
                    raise ValueError("a chunk line over 4 KiB")
                continue
            line, data = self._line + data[: end + 1], data[end + 1 :]
            self._line = b""
            if not line.endswith(b"\r\n"):
                raise ValueError("a chunk line not ended by CRLF")
            line = line[:-2]
            if self._state == "crlf":
                if line:
                    raise ValueError("chunk data longer than its size")
                self._state = "size"
            elif self._state == "size":
                size_text = line.split(b";", 1)[0].rstrip(b" \t")  # BWS before an extension
                if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                    raise ValueError(f"a chunk size that is not hex: {size_text[:40]!r}")
                size = int(size_text, 16)
                if size:
                    out += f"{size:x}\r\n".encode()
                    self._left, self._state = size, "data"
                else:
                    self._state = "trailer"
            elif not line:  # the blank line after the (dropped) trailers
                out += b"0\r\n\r\n"
                self._state = "done"
        return bytes(out)


def _request_body(headers: Sequence[tuple[str, str]]) -> _RequestBody:
    """How the body of a request with ``headers`` ends (raises :class:`_Refused`)."""
    lengths = {value.strip() for name, value in headers if name == "content-length"}
    codings = [value for name, value in headers if name == "transfer-encoding"]
    if codings:
        if lengths:
            # Two framings: the one the upstream picks need not be this proxy's.
            raise _Refused(_answer("400 Bad Request", "agentvfs sandbox proxy: both Content-Length and Transfer-Encoding\n"))
        final = ",".join(codings).split(",")[-1].strip().lower()
        if final != "chunked":
            raise _Refused(_answer("400 Bad Request", "agentvfs sandbox proxy: a request's last transfer coding must be chunked\n"))
        return _RequestBody(0, chunked=True)
    if not lengths:
        return _RequestBody(0, chunked=False)
    values = {part.strip() for value in lengths for part in value.split(",")}
    if len(values) != 1 or not next(iter(values)).isdigit():
        raise _Refused(_answer("400 Bad Request", "agentvfs sandbox proxy: an invalid Content-Length\n"))
    return _RequestBody(int(next(iter(values))), chunked=False)


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One entry of ``allowed_hosts``.

    Attributes
    ----------
    host : str
        A lowercase name, an address, or a domain for a ``*.`` pattern (without the ``*.``).
    wildcard : bool
        Whether every name below ``host`` matches (and ``host`` itself does not).
    port : int or None
        The only port allowed; None for any.
    """

    host: str
    wildcard: bool = False
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        """Whether a connection to ``host:port`` (``host`` normalised) is allowed."""
        if self.port is not None and port != self.port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        name = f"*.{self.host}" if self.wildcard else (f"[{self.host}]" if ":" in self.host else self.host)
        return f"{name}:{self.port}" if self.port is not None else name


def _normal_host(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def _split_port(text: str) -> tuple[str, str | None]:
    """``host[:port]`` or ``[v6][:port]`` -> (host, port text or None)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return text, None
        rest = text[end + 1 :]
        return text[: end + 1], (rest[1:] if rest.startswith(":") else (rest or None))
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, None


def _parse_port(text: str) -> int | None:
    if not text.isdigit() or not 0 < int(text) < 65536:
        return None
    return int(text)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_host_patterns(value: object) -> tuple[HostPattern, ...] | None:
    """Check ``native_sandbox["allowed_hosts"]``: None, or a list of host patterns.

    Raises
    ------
    ValueError
        Not a list of strings, or an entry that is not a host name, ``*.domain`` or address
        (optionally with ``:port``); the message names the entry and the accepted forms.
    """
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(
            f"native_sandbox['allowed_hosts'] must be a list of host patterns such as "
            f"['example.org', '*.internal'], got {value!r}"
        )
    patterns: list[HostPattern] = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"native_sandbox['allowed_hosts'] entries must be strings, got {item!r}")
        patterns.append(_parse_pattern(item))
    return tuple(patterns)


def _parse_pattern(item: str) -> HostPattern:
    forms = "a host name (example.org), a domain wildcard (*.example.org) or an IP address, optionally with :port"
    text = item.strip().lower()
    if "://" in text or "/" in text:
        raise ValueError(f"native_sandbox['allowed_hosts'] entry {item!r} is a URL; give the host only: {forms}")
    host_text, port_text = _split_port(text)
    port = None
    if port_text is not None:
        port = _parse_port(port_text)
        if port is None:
            raise ValueError(f"native_sandbox['allowed_hosts'] entry {item!r} has an invalid port; expected {forms}")
    wildcard = host_text.startswith("*.")
    host = _normal_host(host_text[2:] if wildcard else host_text)
    if _is_address(host):
        if wildcard:
            raise ValueError(f"native_sandbox['allowed_hosts'] entry {item!r}: '*.' does not apply to an address")
        return HostPattern(str(ipaddress.ip_address(host)), False, port)
    labels = host.split(".")
    if not host or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"native_sandbox['allowed_hosts'] entry {item!r} is not {forms}")
    return HostPattern(host, wildcard, port)


def host_allowed(patterns: Sequence[HostPattern], host: str, port: int) -> bool:
    """Whether ``host:port`` is allowed by ``patterns`` (``host`` as the client wrote it)."""
    name = _normal_host(host)
    if _is_address(name):
        name = str(ipaddress.ip_address(name))
    return any(p.matches(name, port) for p in patterns)


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send a command's HTTP(S) clients to the forwarder on ``port``."""
    url = f"http://127.0.0.1:{port}"
    direct = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": direct,
        "no_proxy": direct,
    }


#: The in-sandbox forwarder: ``python -I -S -c FORWARDER_SCRIPT <descriptor> <port>``, where
#: the descriptor is the command's end of the proxy's socket pair. It binds the port, then
#: forks: the parent's exit says the port is ready, the child relays every connection through
#: a socket pair of its own, whose other end it hands to the proxy, until the sandbox's PID
#: namespace ends.
FORWARDER_SCRIPT = r"""
import os, socket, sys, threading
control, port = socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2])
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("127.0.0.1", port))
except OSError as exc:
    sys.stderr.write("agentvfs: the egress forwarder cannot listen on 127.0.0.1:%d: %s\n" % (port, exc.strerror))
    sys.exit(125)
server.listen(64)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass

def relay(client):
    upstream, theirs = socket.socketpair()
    try:
        socket.send_fds(control, [b"c"], [theirs.fileno()])
    except OSError:
        client.close()
        upstream.close()
        return
    finally:
        theirs.close()
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()

while True:
    try:
        client, _ = server.accept()
    except OSError:
        continue
    threading.Thread(target=relay, args=(client,), daemon=True).start()
"""


# -- the host-side proxy ---------------------------------------------------------------------------


def _answer(status: str, body: str, extra: str = "") -> bytes:
    payload = body.encode("utf-8")
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + payload


def _read_head(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """Read up to the blank line: ``(head, bytes after it)``, or None (closed, too long)."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > _HEAD_LIMIT:
            return None
        data = sock.recv(_CHUNK)
        if not data:
            return None
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def _relay(client: socket.socket, upstream: socket.socket, body: _RequestBody | None = None) -> None:
    """Copy bytes both ways until both directions are closed; with ``body`` (a plain HTTP
    request), what the client sends goes through it, so nothing past the request's end
    reaches the upstream."""
    selector = selectors.DefaultSelector()
    peers = {client: upstream, upstream: client}
    for sock in peers:
        sock.setblocking(True)
        sock.settimeout(None)
        selector.register(sock, selectors.EVENT_READ)
    try:
        while selector.get_map():
            for key, _ in selector.select():
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                dst = peers[src]
                try:
                    data = src.recv(_CHUNK)
                except OSError:
                    data = b""
                if data:
                    if src is client and body is not None:
                        try:
                            data = body.feed(data)
                        except ValueError:
                            # The body cannot be framed: the upstream must not guess either.
                            return
                        if not data:
                            continue
                    try:
                        dst.sendall(data)
                        continue
                    except OSError:
                        pass
                selector.unregister(src)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
    finally:
        selector.close()


class EgressProxy:
    """The host side of the egress allow-list for one sandbox.

    The proxy is reached only through its socket pair (see the module): a command inherits
    :attr:`descriptor`, and :meth:`connect` opens a connection the same way from this process.

    Parameters
    ----------
    patterns : sequence of HostPattern
        What may be reached (see the module).
    name : str
        The sandbox's id, for log lines.
    """

    def __init__(self, patterns: Sequence[HostPattern], *, name: str = "") -> None:
        self.patterns = tuple(patterns)
        self.name = name
        self._control: socket.socket | None = None
        self._sandbox_end: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        self._closed = threading.Event()

    @property
    def descriptor(self) -> int:
        """The sandbox's end of the socket pair: what a command's forwarder inherits (pass a
        duplicate; this one stays open until :meth:`close`).

        Raises
        ------
        RuntimeError
            The proxy is not started.
        """
        if self._sandbox_end is None:
            raise RuntimeError("the egress proxy is not started")
        return self._sandbox_end.fileno()

    def start(self) -> None:
        """Make the socket pair and serve it in a daemon thread (nothing if started).

        Raises
        ------
        OSError
            The socket pair cannot be made.
        """
        if self._control is not None:
            return
        # Sequenced packets: each connection handed over is one message, whatever several
        # forwarders of the sandbox's commands send at once.
        self._control, self._sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._closed.clear()
        self._thread = threading.Thread(target=self._receive, name=f"agentvfs-egress {self.name}", daemon=True)
        self._thread.start()

    def connect(self) -> socket.socket:
        """A connection to the proxy, handed over as a command's forwarder does it.

        Raises
        ------
        OSError
            The proxy is closed, or the connection cannot be handed over.
        """
        if self._sandbox_end is None:
            raise OSError(errno.ENOTCONN, "the egress proxy is not started")
        mine, theirs = socket.socketpair()
        try:
            socket.send_fds(self._sandbox_end, [b"c"], [theirs.fileno()])
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    def close(self) -> None:
        """Stop serving and cut every open connection; a command's forwarder can hand over
        nothing more."""
        control, self._control = self._control, None
        sandbox_end, self._sandbox_end = self._sandbox_end, None
        if control is None:
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            control.shutdown(socket.SHUT_RDWR)
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        control.close()
        if sandbox_end is not None:
            sandbox_end.close()

    def _receive(self) -> None:
        control = self._control
        while control is not None and not self._closed.is_set():
            try:
                _data, fds, _flags, _address = socket.recv_fds(control, 16, _FDS_PER_MESSAGE)
            except OSError:
                return
            # An empty message is also what recv gives once the pair is shut down; a command
            # may send empty ones too, so only the closed flag ends the loop.
            for fd in fds:
                self._admit(fd)

    def _admit(self, fd: int) -> None:
        """Serve a descriptor handed over by a forwarder: a unix stream socket, or nothing."""
        try:
            client = socket.socket(fileno=fd)
        except OSError:
            # Not a socket at all (a command may send any descriptor).
            os.close(fd)
            return
        if client.family != socket.AF_UNIX or client.type != socket.SOCK_STREAM:
            client.close()
            return
        with self._lock:
            busy = len(self._clients) >= _MAX_CONNECTIONS
            if not busy:
                self._clients.add(client)
        if busy:
            # Never blocking: this thread serves every handover of the sandbox.
            client.setblocking(False)
            with contextlib.suppress(OSError):
                client.send(_answer("503 Service Unavailable", "agentvfs sandbox proxy: too many connections\n"))
            client.close()
            return
        threading.Thread(target=self._serve, args=(client,), name=f"agentvfs-egress {self.name}", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(_CLIENT_TIMEOUT)
            read = _read_head(client)
            if read is None:
                return
            head, rest = read
            try:
                upstream, reply, forward, body = self._open(head)
            except _Refused as refused:
                client.sendall(refused.reply)
                return
            with self._lock:
                self._clients.add(upstream)
            if reply:
                client.sendall(reply)
            if body is not None:
                try:
                    rest = body.feed(rest)
                except ValueError as exc:
                    # Nothing went upstream yet: the client can still be told why.
                    client.sendall(_answer("400 Bad Request", f"agentvfs sandbox proxy: a malformed chunked body: {exc}\n"))
                    return
            if forward or rest:
                upstream.sendall(forward + rest)
            _relay(client, upstream, body)
        except OSError:
            pass
        finally:
            with self._lock:
                self._clients.discard(client)
                if upstream is not None:
                    self._clients.discard(upstream)
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()

    def _refuse(self, host: str, port: int) -> bytes:
        allowed = ", ".join(str(p) for p in self.patterns) or "none"
        _log.info("sandbox %s: egress to %s:%d refused (not in allowed_hosts)", self.name, host, port)
        return _answer(
            "403 Forbidden",
            f"agentvfs sandbox: connections to {host}:{port} are not allowed. "
            f"Allowed hosts: {allowed}. Add the host to native_sandbox['allowed_hosts'] to allow it.\n",
            "X-Agentvfs-Refused: not-in-allowed-hosts\r\n",
        )

    def _open(self, head: bytes) -> tuple[socket.socket, bytes, bytes, _RequestBody | None]:
        """Decide on a request head: ``(upstream, reply to the client, bytes for upstream,
        the body's framing)``; the framing is None for a tunnel.

        Raises
        ------
        _Refused
            The request is malformed or its host is not allowed; the refusal says why.
        """
        text = head.decode("latin-1")
        lines = text.split("\r\n")
        if _CONTROL.search(text.replace("\r\n", "")):
            # A bare CR or LF that this proxy kept inside a line, the upstream may end it at.
            raise _Refused(_answer("400 Bad Request", "agentvfs sandbox proxy: control characters in the request head\n"))
        parts = lines[0].split(" ")
        if len(parts) != 3 or not _VERSION.match(parts[2]):
            raise _Refused(_answer("400 Bad Request", "agentvfs sandbox proxy: malformed request line\n"))
        method, target, version = parts
        body: _RequestBody | None = None
        if method.upper() == "CONNECT":
            host, port_text = _split_port(target)
            port = _parse_port(port_text or "")
            if not host or port is None:
                raise _Refused(_answer("400 Bad Request", f"agentvfs sandbox proxy: CONNECT needs host:port, got {target!r}\n"))
            forward = b""
            reply = b"HTTP/1.1 200 Connection Established\r\n\r\n"
        else:
            match = re.match(r"^http://([^/?#]+)(.*)$", target, re.IGNORECASE)
            if match is None:
                raise _Refused(
                    _answer(
                        "400 Bad Request",
                        "agentvfs sandbox proxy: expected an absolute http:// URL or CONNECT "
                        f"(https goes through CONNECT), got {target!r}\n",
                    )
                )
            authority, path = match.group(1), match.group(2) or "/"
            if "@" in authority:
                authority = authority.rsplit("@", 1)[1]
            host, port_text = _split_port(authority)
            port = _parse_port(port_text) if port_text else 80
            if not host or port is None:
                raise _Refused(_answer("400 Bad Request", f"agentvfs sandbox proxy: bad host in {target!r}\n"))
            headers = _parse_headers(lines[1:])
            body = _request_body(headers)
            # Headers the client's Connection header names are this hop's too (RFC 9110 7.6.1).
            named = {token.strip().lower() for name, value in headers if name == "connection" for token in value.split(",")}
            kept = [line for line, (name, _value) in zip(lines[1:], headers, strict=True) if name not in _HOP_HEADERS | named]
            # The Host the upstream sees is the authority that was checked, never the client's.
            forward_lines = [f"{method} {path} {version}", f"Host: {authority}", *kept, "Connection: close", "", ""]
            forward = "\r\n".join(forward_lines).encode("latin-1")
            reply = b""
        name = _normal_host(host)
        if not host_allowed(self.patterns, name, port):
            raise _Refused(self._refuse(name, port))
        try:
            upstream = socket.create_connection((name, port), timeout=_CONNECT_TIMEOUT)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise _Refused(
                _answer("502 Bad Gateway", f"agentvfs sandbox proxy: cannot connect to {name}:{port}: {reason}\n")
            ) from exc
        return upstream, reply, forward, body


def _parse_headers(lines: Sequence[str]) -> list[tuple[str, str]]:
    """``(lowercase name, value)`` of each header line (raises :class:`_Refused` for a line
    the proxy and the upstream might read differently: folded, nameless, or with space
    before the colon)."""
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not _HEADER_NAME.match(name):
            # Also a folded line (obs-fold, starting with whitespace): RFC 9112 lets a proxy
            # refuse it, and whether the upstream joins it to the line before is its choice.
            raise _Refused(_answer("400 Bad Request", f"agentvfs sandbox proxy: malformed header line {line[:80]!r}\n"))
        headers.append((name.lower(), value.strip()))
    return headers
