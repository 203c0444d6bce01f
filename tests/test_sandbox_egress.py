"""Network egress by allow-list: the host patterns, the host-side proxy (CONNECT and plain HTTP,
403 refusals), and real sandboxes where an allowed name is reached through the proxy, others
are refused and a direct connection finds no network."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.sandbox import LocalSandbox
from agentvfs.sandbox._egress import EgressProxy, HostPattern, host_allowed, parse_host_patterns
from agentvfs.sandbox._isolation import detect_isolation, normalize_native_sandbox

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")


# -- patterns -------------------------------------------------------------------------------------


def test_patterns() -> None:
    patterns = parse_host_patterns(["Example.org", "*.internal", "api.test:8443", "10.0.0.1", "[::1]:443"])
    assert patterns == (
        HostPattern("example.org"),
        HostPattern("internal", wildcard=True),
        HostPattern("api.test", port=8443),
        HostPattern("10.0.0.1"),
        HostPattern("::1", port=443),
    )
    assert patterns is not None
    assert [str(p) for p in patterns] == ["example.org", "*.internal", "api.test:8443", "10.0.0.1", "[::1]:443"]
    assert host_allowed(patterns, "example.org", 443)
    assert host_allowed(patterns, "EXAMPLE.ORG.", 80)
    assert not host_allowed(patterns, "www.example.org", 443)
    assert host_allowed(patterns, "a.b.internal", 80)
    assert not host_allowed(patterns, "internal", 80)
    assert not host_allowed(patterns, "evilinternal", 80)
    assert host_allowed(patterns, "api.test", 8443)
    assert not host_allowed(patterns, "api.test", 443)
    assert host_allowed(patterns, "10.0.0.1", 22)
    assert host_allowed(patterns, "[::1]", 443) and not host_allowed(patterns, "::1", 80)
    assert parse_host_patterns(None) is None
    assert parse_host_patterns([]) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("example.org", "must be a list of host patterns"),
        (["https://example.org"], "is a URL; give the host only"),
        (["example.org/path"], "is a URL"),
        (["exa mple.org"], "is not a host name"),
        (["example.org:99999"], "invalid port"),
        (["*.10.0.0.1"], "'\\*\\.' does not apply to an address"),
        ([3], "entries must be strings"),
    ],
)
def test_bad_patterns_are_refused_by_name(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_host_patterns(value)


def test_option_conflicts() -> None:
    with pytest.raises(ValueError, match="allow_network=True gives the whole network"):
        normalize_native_sandbox({"allowed_hosts": ["a.test"], "allow_network": True})
    with pytest.raises(ValueError, match="custom bwrap_args replace"):
        normalize_native_sandbox({"allowed_hosts": ["a.test"], "bwrap_args": ["--ro-bind", "/", "/"]})
    with pytest.raises(ValueError, match="needs isolation='bwrap'"):
        LocalSandbox(native_sandbox={"allowed_hosts": ["a.test"]})


# -- the proxy on its own -----------------------------------------------------------------------


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the host {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[tuple[str, int]]:
    """An HTTP server on the host's loopback, and a name of this machine that resolves to it."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    if not address.startswith("127."):
        pytest.skip(f"this machine's name resolves to {address}, not to a loopback address")
    server = http.server.ThreadingHTTPServer((address, 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield name, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(host_server: tuple[str, int]) -> Iterator[EgressProxy]:
    directory = tempfile.mkdtemp(prefix="agentvfs-egress-test-")
    patterns = parse_host_patterns([host_server[0]])
    assert patterns is not None
    egress = EgressProxy(directory, patterns, name="test")
    egress.start()
    yield egress
    egress.close()
    shutil.rmtree(directory, ignore_errors=True)


def ask(proxy: EgressProxy, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(proxy.socket_path)
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            if len(chunks) == 1 and chunks[0].startswith(b"HTTP/1.1 200 Connection Established"):
                # The tunnel is open: speak HTTP through it.
                sock.sendall(b"GET /tunnel HTTP/1.0\r\n\r\n")
        return b"".join(chunks)


def test_proxy_plain_http_connect_and_refusals(proxy: EgressProxy, host_server: tuple[str, int]) -> None:
    name, port = host_server
    answer = ask(proxy, f"GET http://{name}:{port}/plain HTTP/1.1\r\nHost: {name}\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"hello from the host /plain\n"), answer
    answer = ask(proxy, f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\n")
    assert answer.endswith(b"hello from the host /tunnel\n"), answer
    for request in (
        f"GET http://example.com:{port}/ HTTP/1.1\r\n\r\n",
        "CONNECT example.com:443 HTTP/1.1\r\n\r\n",
        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n",  # the address is not the allowed name
    ):
        answer = ask(proxy, request.encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
        assert b"are not allowed. Allowed hosts: " + name.encode() in answer
        assert b"native_sandbox['allowed_hosts']" in answer
    assert ask(proxy, b"GET /relative HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert ask(proxy, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400")


# -- real sandboxes -----------------------------------------------------------------------------


CURL = shutil.which("curl")
GET = "import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().strip())"
DIRECT = (
    "import socket,sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    print('connected')\n"
    "except OSError as exc:\n"
    "    print('refused', type(exc).__name__)\n"
)


@needs_bwrap
async def test_allowed_name_is_reached_others_refused_direct_impossible(
    tmp_path: Path, host_server: tuple[str, int]
) -> None:
    name, port = host_server
    (tmp_path / "get.py").write_text(GET)
    (tmp_path / "direct.py").write_text(DIRECT)
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"allowed_hosts": [name]})
    try:
        # Python's urllib honours the proxy variables.
        allowed = await box.execute_command(f"{sys.executable} get.py http://{name}:{port}/py")
        assert (allowed.exit_code, allowed.stdout) == (0, "hello from the host /py\n"), allowed
        refused = await box.execute_command(f"{sys.executable} get.py http://localhost.localdomain:{port}/")
        assert refused.exit_code != 0 and "403" in refused.stderr, refused
        # No route anywhere but the sandbox's own loopback.
        direct = await box.execute_command(f"{sys.executable} direct.py 127.0.0.1 {port}; {sys.executable} direct.py {name} {port}")
        assert direct.stdout.split("\n")[:2] == ["refused ConnectionRefusedError", "refused ConnectionRefusedError"], direct
        if CURL is not None:
            tunnel = await box.execute_command(f"curl -sS --proxytunnel http://{name}:{port}/curl")
            assert tunnel.stdout == "hello from the host /curl\n", tunnel
            blocked = await box.execute_command("curl -sS https://example.com/ ; echo rc=$?")
            assert "rc=56" in blocked.stdout and "403" in blocked.stderr, blocked
            body = await box.execute_command("curl -sS http://example.com/")
            assert "connections to example.com:80 are not allowed" in body.stdout
    finally:
        await box.destroy()
    # The proxy and its socket are gone with the sandbox.
    assert box._launcher.proxy is None


@needs_bwrap
async def test_an_empty_allow_list_refuses_everything(tmp_path: Path, host_server: tuple[str, int]) -> None:
    name, port = host_server
    (tmp_path / "get.py").write_text(GET)
    box = LocalSandbox(working_directory=str(tmp_path), isolation="bwrap", native_sandbox={"allowed_hosts": []})
    try:
        result = await box.execute_command(f"{sys.executable} get.py http://{name}:{port}/")
    finally:
        await box.destroy()
    assert result.exit_code != 0 and "403" in result.stderr
    assert os.path.exists(str(tmp_path))
