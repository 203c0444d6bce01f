"""Network egress by allow-list: an HTTP(S) proxy on the host, reached from inside bubblewrap.

With ``native_sandbox={"allowed_hosts": [...]}`` a command still runs in a network namespace
of its own (no route anywhere, only its own loopback), and the only way out is this proxy:

* **host side** (:class:`EgressProxy`): a small HTTP proxy listening on a unix socket in the
  sandbox's private state directory. It accepts ``CONNECT host:port`` (HTTPS and any other
  TLS or TCP protocol a client tunnels) and plain HTTP requests in absolute form
  (``GET http://host/path``), checks the host against the allow-list, and either connects
  to it (the host's own resolver picks the address) or answers ``403 Forbidden`` with a body
  that says which host was refused and what is allowed.
* **sandbox side**: the socket's directory is bound read-only at
  :data:`~._isolation.PROXY_DIRECTORY`, and before the command starts a forwarder (this
  Python, standard library only) listens on ``127.0.0.1:3128`` inside the namespace and
  relays each connection to the socket. ``HTTP_PROXY``, ``HTTPS_PROXY``, ``http_proxy`` and
  ``https_proxy`` point at it; ``NO_PROXY``/``no_proxy`` keep the sandbox's own loopback
  direct. Tools that honour these variables (curl, pip, git, npm, Python's urllib and
  requests...) work unchanged; anything that connects directly finds no network.

Patterns: ``example.org`` matches that name only; ``*.example.org`` matches every name below
it (not ``example.org`` itself); either may end in ``:port`` to allow that port only (any
port otherwise). IP addresses match only when listed literally (``127.0.0.1``, ``[::1]``).
Names are compared case-insensitively, without a trailing dot. The check is on the name the
client asked for: an allowed name that resolves to a private address is still reached.
"""

from __future__ import annotations

import contextlib
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
_CHUNK = 64 * 1024

# Headers that belong to the hop between client and proxy, not to the origin server.
_HOP_HEADERS = frozenset({"proxy-connection", "proxy-authorization", "connection", "keep-alive"})


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


#: The in-sandbox forwarder: ``python -I -S -c FORWARDER_SCRIPT <socket> <port>``. It binds
#: the port, then forks: the parent's exit says the port is ready, the child relays every
#: connection to the socket until the sandbox's PID namespace ends.
FORWARDER_SCRIPT = r"""
import os, socket, sys, threading
path, port = sys.argv[1], int(sys.argv[2])
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
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
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


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions are closed."""
    selector = selectors.DefaultSelector()
    peers = {a: b, b: a}
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

    Parameters
    ----------
    directory : str
        A private directory (mode 0700) for the socket; it is bound into the sandbox.
    patterns : sequence of HostPattern
        What may be reached (see the module).
    name : str
        The sandbox's id, for log lines.
    """

    #: The socket's file name in ``directory``.
    SOCKET_NAME = "proxy.sock"

    def __init__(self, directory: str, patterns: Sequence[HostPattern], *, name: str = "") -> None:
        self.directory = directory
        self.patterns = tuple(patterns)
        self.name = name
        self.socket_path = os.path.join(directory, self.SOCKET_NAME)
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        self._closed = threading.Event()

    def start(self) -> None:
        """Listen on the socket (replacing a stale one) and serve in a daemon thread.

        Raises
        ------
        OSError
            The socket cannot be created.
        """
        if self._server is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.socket_path)
            # The sandbox's user (another uid inside, the same or root's outside) must be
            # able to connect; the directory's mode keeps everyone else out.
            os.chmod(self.socket_path, 0o666)
            server.listen(64)
        except OSError:
            server.close()
            raise
        self._closed.clear()
        self._server = server
        self._thread = threading.Thread(target=self._accept, name=f"agentvfs-egress {self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, cut every open connection, remove the socket."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _accept(self) -> None:
        server = self._server
        while server is not None and not self._closed.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            with self._lock:
                busy = len(self._clients) >= _MAX_CONNECTIONS
                if not busy:
                    self._clients.add(client)
            if busy:
                with contextlib.suppress(OSError):
                    client.sendall(_answer("503 Service Unavailable", "agentvfs sandbox proxy: too many connections\n"))
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), name=f"agentvfs-egress {self.name}", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(_CLIENT_TIMEOUT)
            read = _read_head(client)
            if read is None:
                return
            head, rest = read
            upstream, reply, forward = self._open(head)
            if upstream is None:
                client.sendall(reply)
                return
            with self._lock:
                self._clients.add(upstream)
            if reply:
                client.sendall(reply)
            if forward or rest:
                upstream.sendall(forward + rest)
            _relay(client, upstream)
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

    def _open(self, head: bytes) -> tuple[socket.socket | None, bytes, bytes]:
        """Decide on a request head: ``(upstream, reply to the client, bytes for upstream)``;
        no upstream means ``reply`` is the refusal."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return None, _answer("400 Bad Request", "agentvfs sandbox proxy: malformed request line\n"), b""
        method, target, version = parts
        if method.upper() == "CONNECT":
            host, port_text = _split_port(target)
            port = _parse_port(port_text or "")
            if not host or port is None:
                return None, _answer("400 Bad Request", f"agentvfs sandbox proxy: CONNECT needs host:port, got {target!r}\n"), b""
            forward = b""
            reply = b"HTTP/1.1 200 Connection Established\r\n\r\n"
        else:
            match = re.match(r"^http://([^/?#]+)(.*)$", target, re.IGNORECASE)
            if match is None:
                return (
                    None,
                    _answer(
                        "400 Bad Request",
                        "agentvfs sandbox proxy: expected an absolute http:// URL or CONNECT "
                        f"(https goes through CONNECT), got {target!r}\n",
                    ),
                    b"",
                )
            authority, path = match.group(1), match.group(2) or "/"
            if "@" in authority:
                authority = authority.rsplit("@", 1)[1]
            host, port_text = _split_port(authority)
            port = _parse_port(port_text) if port_text else 80
            if not host or port is None:
                return None, _answer("400 Bad Request", f"agentvfs sandbox proxy: bad host in {target!r}\n"), b""
            headers = [line for line in lines[1:] if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
            forward = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")
            reply = b""
        name = _normal_host(host)
        if not host_allowed(self.patterns, name, port):
            return None, self._refuse(name, port), b""
        try:
            upstream = socket.create_connection((name, port), timeout=_CONNECT_TIMEOUT)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            return None, _answer("502 Bad Gateway", f"agentvfs sandbox proxy: cannot connect to {name}:{port}: {reason}\n"), b""
        return upstream, reply, forward
